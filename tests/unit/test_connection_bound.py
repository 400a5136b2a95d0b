"""The bounds on connections from processes that are not the cluster's (transport/connections.py).

An attacker's cheapest weapon against a leader is connections: a 64-byte greeting each, kept open
forever. Without a bound, two local processes took a leader to its open-files limit and no new
client could connect; with a message left unfinished on each, 20 of them held 1.2 GB. Here: the
table's rules, routing ids no one can guess, then a real runtime under a flood of idle
connections and of unfinished messages, and the cluster processes' connections that the rules
must never close.
"""

from __future__ import annotations

import os
import resource
import socket
import threading
import time
from contextlib import contextmanager

import pytest
import zmq

from actors.limits import Limits
from actors.effects import Send
from actors.messages import MetadataRequest, PeerDisconnected
from tests.helpers import closed_by_peer, idle_zmtp_connection, unfinished_message, wait_for
from tests.unit.test_codec_runtime import Recorder
from transport.codec import Codec
from transport.connections import (
    ROUTING_ID_BYTES_MAX, ConnectionTable, client_connections_bound, raise_open_files_limit, routing_id, shut_down,
)
from transport.rpc import RequestTimeout, RpcClient
from transport.runtime import Runtime

SECRET = b"s" * 32


def test_the_least_recently_active_untrusted_connections_are_the_ones_past_the_bound():
    table = ConnectionTable(untrusted_max=2)
    for fd in (10, 11, 12, 13):
        table.accepted(fd, ("127.0.0.1", fd))
    table.active(10)  # 10 spoke last: now 11, 12, 13, 10 from the quietest
    table.trust(11)  # a cluster process: never closed, not counted against the bound

    assert table.excess() == [(12, ("127.0.0.1", 12))]
    assert table.excess() == []
    assert (len(table), table.untrusted) == (3, 2)


def test_a_trusted_connection_is_never_closed_even_when_it_is_the_quietest():
    table = ConnectionTable(untrusted_max=1)
    table.accepted(5, "member")
    table.trust(5)
    for fd in (6, 7, 8):
        table.accepted(fd, f"client-{fd}")

    assert [fd for fd, _ in table.excess()] == [6, 7]
    assert table.untrusted == 1


def test_a_reused_descriptor_is_a_new_untrusted_connection_and_a_closed_one_is_forgotten():
    table = ConnectionTable(untrusted_max=10)
    table.accepted(5, "member")
    table.trust(5)
    table.accepted(5, "stranger")  # libzmq closed the member's connection and reused the number
    table.accepted(6, "client")
    table.gone(6)
    table.gone(99)  # never seen: nothing happens

    assert (len(table), table.untrusted) == (1, 1)


def test_trust_on_a_descriptor_not_reported_yet_says_so_so_the_runtime_reads_the_reports_first():
    table = ConnectionTable(untrusted_max=1)

    assert table.trust(7) is False  # the message came before the monitor's report of its connection
    table.accepted(7, "member")
    assert table.trust(7) is True
    table.accepted(8, "client")
    table.accepted(9, "client")
    assert [fd for fd, _ in table.excess()] == [8]


def test_routing_ids_start_with_the_name_fit_libzmqs_bound_and_cannot_be_guessed():
    short = [routing_id("replica/orders/0/n2") for _ in range(2)]
    long = routing_id("replica/" + "t" * 300 + "/0/n2")

    parts = [each.rsplit(b"|", 3) for each in short]

    assert [name for name, *_ in parts] == [b"replica/orders/0/n2"] * 2
    assert {pid for _, pid, _, _ in parts} == {str(os.getpid()).encode()}
    assert parts[0][2] != parts[1][2]  # a number per socket
    assert all(len(bytes.fromhex(token.decode())) == 8 for *_, token in parts)
    assert parts[0][3] != parts[1][3]
    assert len(long) == ROUTING_ID_BYTES_MAX and long.startswith(b"replica/ttt")
    socket = zmq.Context.instance().socket(zmq.DEALER)
    try:
        socket.setsockopt(zmq.ROUTING_ID, long)
    finally:
        socket.close(linger=0)


def test_the_inbound_budget_counts_what_was_received_but_not_read_as_messages_and_spares_the_cluster():
    table = ConnectionTable(untrusted_max=10, inbound_bytes_max=5_000)
    for fd in (1, 2, 3, 4):
        table.accepted(fd, f"peer-{fd}")
    table.active(1, [bytes(300), bytes(10)])  # 300 + 9, 10 + 2 on the wire
    table.trust(4)
    received = {1: 1024 + 321 + 4_000, 2: 1024 + 3_000, 3: 1024 + 2_500, 4: 10**9}

    # 4,000 + 3,000 + 2,500 held (the trusted connection's billion is not counted): the two
    # largest go, and 2,500 stay within the budget.
    assert table.over_inbound_budget(received.get) == [(1, "peer-1"), (2, "peer-2")]
    assert (table.held_bytes, table.untrusted, len(table)) == (2_500, 1, 2)
    assert table.over_inbound_budget(received.get) == []


def test_the_bound_is_half_the_open_files_limit_when_that_is_lower():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the hard open-files limit here is {hard}")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
        assert client_connections_bound(1024) == 1024
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert client_connections_bound(1024) == 512
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_actor_raises_its_soft_open_files_limit_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 512:
        pytest.skip(f"the hard open-files limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        in_force = raise_open_files_limit()
        assert in_force > 256
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == in_force
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_shut_down_leaves_a_descriptor_alone_unless_it_still_goes_to_the_recorded_peer():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, address = listener.accept()
    try:
        assert not shut_down(server.fileno(), ("127.0.0.1", 1))  # another peer: the number was reused
        assert not closed_by_peer(client)
        assert shut_down(server.fileno(), address)
        assert wait_for(lambda: closed_by_peer(client), timeout_s=5, what="the connection to end")
        with open(__file__, "rb") as not_a_socket:
            assert not shut_down(not_a_socket.fileno(), address)
    finally:
        for each in (client, server, listener):
            each.close()


@pytest.fixture
def bounded(zmq_context):
    """A runtime around a Recorder that keeps at most 4 connections of strangers, with a thread-free
    way to let it run: `settle(predicate)` steps it until the predicate holds."""
    journal: list = []
    runtime = Runtime(Recorder(journal), identity="bounded", context=zmq_context,
                      limits=Limits(client_connections_max=4), secret=SECRET)
    endpoint = runtime.bind()
    opened: list = []

    def settle(predicate, what: str, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            runtime.step_until(time.monotonic_ns() + 20_000_000)

    try:
        yield runtime, endpoint, journal, opened, settle
    finally:
        for each in opened:
            each.close(linger=0) if isinstance(each, zmq.Socket) else each.close()
        runtime.close()


def test_a_flood_of_idle_connections_is_cut_to_the_bound_quietest_first(bounded):
    runtime, endpoint, journal, opened, settle = bounded
    flood = [idle_zmtp_connection(endpoint) for _ in range(12)]
    opened.extend(flood)

    settle(lambda: len(runtime.guard.table) == 4 and sum(map(closed_by_peer, flood)) == 8,
           "the runtime to close all but 4 of 12 idle connections")

    assert [closed_by_peer(each) for each in flood] == [True] * 8 + [False] * 4
    assert runtime.counters["connections_closed_over_limit"] == 8


def test_a_client_that_speaks_gets_in_while_strangers_sit_idle(bounded, zmq_context):
    runtime, endpoint, journal, opened, settle = bounded
    client = zmq_context.socket(zmq.DEALER)
    opened.append(client)
    client.connect(endpoint)
    client.send_multipart(Codec().encode(MetadataRequest(correlation_id=1)))
    settle(lambda: len(journal) == 1, "the client's first request")
    flood = [idle_zmtp_connection(endpoint) for _ in range(6)]
    opened.extend(flood)
    # It spoke before the flood came, so it was the quietest: the first to go, then two strangers.
    settle(lambda: runtime.counters.get("connections_closed_over_limit") == 3, "7 connections cut to 4")
    assert [closed_by_peer(each) for each in flood] == [True] * 2 + [False] * 4
    # Its DEALER reconnects by itself. A request written before it saw the connection end is
    # lost with it, so it asks again after a while, as every railmq client does.
    for correlation_id in range(2, 12):
        client.send_multipart(Codec().encode(MetadataRequest(correlation_id=correlation_id)))
        deadline = time.monotonic() + 0.5
        while len(journal) < 2 and time.monotonic() < deadline:
            runtime.step_until(time.monotonic_ns() + 20_000_000)
        if len(journal) == 2:
            break

    assert len(journal) == 2, "the client never got in again"
    settle(lambda: runtime.counters["connections_closed_over_limit"] == 4, "the bound after the reconnection")
    assert [closed_by_peer(each) for each in flood] == [True] * 3 + [False] * 3
    assert runtime.guard.table.untrusted == 4


def test_a_cluster_process_connection_is_never_closed_by_the_bound(bounded, zmq_context):
    runtime, endpoint, journal, opened, settle = bounded
    member = zmq_context.socket(zmq.DEALER)
    opened.append(member)
    member.connect(endpoint)
    member.send_multipart(Codec(secret=SECRET).encode(MetadataRequest(correlation_id=1)))
    settle(lambda: len(journal) == 1, "the member's tagged request")
    flood = [idle_zmtp_connection(endpoint) for _ in range(10)]
    opened.extend(flood)

    settle(lambda: sum(map(closed_by_peer, flood)) == 6, "the runtime to close 6 of 10 idle connections")
    member.send_multipart(Codec(secret=SECRET).encode(MetadataRequest(correlation_id=2)))
    settle(lambda: len(journal) == 2, "the member's second request")

    assert runtime.counters.get("peer_disconnects", 0) == 0
    assert (len(runtime.guard.table), runtime.guard.table.untrusted) == (5, 4)


def test_connections_holding_unfinished_messages_are_closed_largest_first_past_the_inbound_budget(zmq_context):
    """20 connections each sending 60 MiB of a message they never finished made a leader hold
    1.2 GB. Past `client_inbound_bytes_max`, the connections holding the most are closed, and a
    client whose messages are whole holds nothing and stays."""
    journal: list = []
    runtime = Runtime(Recorder(journal), identity="inbound", context=zmq_context,
                      limits=Limits(client_inbound_bytes_max=64 << 20, client_inbound_check_interval_ms=20))
    endpoint = runtime.bind()
    client = zmq_context.socket(zmq.DEALER)
    client.connect(endpoint)
    opened: list = [client]
    try:
        client.send_multipart(Codec().encode(MetadataRequest(correlation_id=1)))
        for sent in (20 << 20, 30 << 20, 25 << 20):  # 75 MiB together
            opened.append(unfinished_message(endpoint, 60 << 20, sent))
        small, large, middle = opened[1:]
        deadline = time.monotonic() + 10
        while not closed_by_peer(large) and time.monotonic() < deadline:
            runtime.step_until(time.monotonic_ns() + 20_000_000)
        # Counts go on while bytes are held; the kernel may still be taking the last of them.
        while abs(runtime.guard.table.held_bytes - (45 << 20)) > 4096 and time.monotonic() < deadline:
            runtime.step_until(time.monotonic_ns() + 20_000_000)

        assert abs(runtime.guard.table.held_bytes - (45 << 20)) <= 4096  # the greetings and headers apart
        assert [closed_by_peer(each) for each in (small, large, middle)] == [False, True, False]
        assert runtime.counters["connections_closed_over_bytes"] == 1  # nothing else went for 45 MiB
        client.send_multipart(Codec().encode(MetadataRequest(correlation_id=2)))
        deadline = time.monotonic() + 5
        while len(journal) < 2 and time.monotonic() < deadline:
            runtime.step_until(time.monotonic_ns() + 20_000_000)
        assert len(journal) == 2, "the client with whole messages was cut off"
    finally:
        for each in opened:
            each.close(linger=0) if isinstance(each, zmq.Socket) else each.close()
        runtime.close()


def answering_fetches(journal: list, record_bytes: int) -> Recorder:
    """An actor that answers every fetch with `record_bytes` of records."""
    from actors.effects import Send
    from actors.messages import FetchRequest, FetchResponse

    def answer(message, sender):
        if type(message) is not FetchRequest:
            return []
        return [Send(sender, FetchResponse(correlation_id=message.correlation_id, topic=message.topic,
                                           partition=message.partition, records=b"x" * record_bytes))]

    return Recorder(journal, on_message=answer)


NEVER_READING = """
import sys, time, zmq
from actors.messages import FetchRequest
from transport.codec import Codec
endpoint, secret, rounds = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3])
context = zmq.Context()
askers = []
for codec in (Codec(secret=secret), Codec(), Codec()):  # a follower that stalls, two clients
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVHWM, 1)
    dealer.setsockopt(zmq.RCVBUF, 4096)
    dealer.setsockopt(zmq.RECONNECT_IVL, -1)  # a closed connection stays closed
    dealer.connect(endpoint)
    askers.append((codec, dealer))
for index in range(rounds):  # a round at a time: the kernel's buffers take the first answers
    for codec, dealer in askers:
        dealer.send_multipart(codec.encode(FetchRequest(correlation_id=index, topic="t", partition=0,
                                                        offset=0)))
    time.sleep(0.1)
time.sleep(60)
"""


def never_reading(endpoint: str, rounds: int):
    """Three connections that ask and never read, from a process of their own (a libzmq socket
    holding half of a message when its connection ends may abort its process: not the test's)."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", NEVER_READING, endpoint, SECRET.hex(), str(rounds)],
                            stdout=subprocess.DEVNULL, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                                os.path.abspath(__file__)))))


def test_when_clients_that_never_read_hold_the_whole_outbound_budget_the_longest_unread_make_room(
        zmq_context):
    """Two connections that sent fetches and never read held a runtime's whole outbound budget, and
    from then on every client's large answers were BUSY until they read or went. Now a reader past
    the budget is served: the client connection whose answers have waited unread longest, past
    `client_unread_answers_close_ms`, is closed (its queue goes with it), largest first; a
    cluster process's connection holding as much is never closed."""
    from actors.messages import FetchRequest

    journal: list = []
    limits = Limits(peer_outbound_bytes_max=16 << 20, outbound_bytes_max=20 << 20,
                    client_unread_answers_close_ms=1000)
    runtime = Runtime(answering_fetches(journal, 4 << 20), identity="outbound", context=zmq_context,
                      limits=limits, secret=SECRET)
    endpoint = runtime.bind()
    reader = zmq_context.socket(zmq.DEALER)
    reader.connect(endpoint)
    askers = never_reading(endpoint, 8)  # 0.56 s of asking: less than client_unread_answers_close_ms

    def step_while(condition, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while condition() and time.monotonic() < deadline:
            runtime.step_until(time.monotonic_ns() + 20_000_000)

    try:
        # The kernel takes a few MiB of each connection's answers into its socket buffers; the rest
        # waits in libzmq's queue, and fills the budget.
        step_while(lambda: len(journal) < 24, 5)
        time.sleep(0.1)
        runtime.outbound.prune_all()
        assert runtime.outbound.total_bytes + (4 << 20) > 20 << 20, (
            "the three left room for the reader's answer")
        time.sleep(1.1)  # their answers have now waited unread past client_unread_answers_close_ms
        reader.send_multipart(Codec().encode(FetchRequest(correlation_id=1, topic="t", partition=0,
                                                          offset=0)))
        step_while(lambda: not reader.poll(0), 5)
        answer = Codec().decode(reader.recv_multipart()) if reader.poll(0) else None

        assert answer is not None and answer.error == 0 and len(answer.records) == 4 << 20, answer
        assert runtime.counters["connections_closed_unread_answers"] >= 1
        runtime.guard.on_events()
        table = runtime.guard.table
        assert len(table) - table.untrusted == 1, "the cluster process's connection was closed"
    finally:
        askers.kill()
        askers.wait()
        reader.close(linger=0)
        runtime.close()


class Asking:
    """An actor that asks one endpoint something at its start, as every client does first."""

    name = "asking"

    def __init__(self, endpoint: str, journal: list) -> None:
        self.endpoint, self.journal = endpoint, journal

    def start(self, now_ns: int) -> list:
        return [Send(self.endpoint, MetadataRequest(correlation_id=1))]

    def handle(self, message, sender, now_ns: int) -> list:
        self.journal.append(message)
        return []

    def invariants(self) -> None:
        pass


def endless_message(listener: socket.socket, frames_max: int, sent: list) -> None:
    """A process on a port a client talks to: it takes the client's connection and sends one
    message of 1 MiB frames, each marked "more", and never its last frame. libzmq counts its
    receive queue (ZMQ_RCVHWM) in whole messages, and ZMQ_MAXMSGSIZE bounds one frame only."""
    connection, _ = listener.accept()
    try:
        greeting = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + bytes(32)
        connection.sendall(greeting)
        ready = b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"ROUTER"
        connection.sendall(bytes([0x04, len(ready)]) + ready)
        frame = b"\x03" + (1 << 20).to_bytes(8, "big") + bytes(1 << 20)  # MORE | LONG
        for _ in range(frames_max):
            connection.sendall(frame)
            sent[0] += 1
    except OSError:
        pass  # closed by the client
    finally:
        connection.close()


@pytest.mark.timeout(60)
def test_a_peer_sending_one_endless_message_is_cut_off_past_the_peer_inbound_budget(zmq_context):
    """A client's DEALER to a port a hostile process took (a dead leader's, a dead controller's)
    received one message of ever more frames: none of it is a message the runtime can read, so
    it was all held (320 MiB for 320 frames of 1 MiB, and no end but the machine's memory).
    Past `peer_inbound_bytes_max` held by the process's DEALER connections, the one holding the
    most is closed, and the actor hears that its peer went."""
    listener = socket.create_server(("127.0.0.1", 0))
    endpoint = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    journal: list = []
    runtime = Runtime(Asking(endpoint, journal), identity="asking", context=zmq_context,
                      limits=Limits(peer_inbound_bytes_max=64 << 20, client_inbound_check_interval_ms=20))
    sent = [0]
    attacker = threading.Thread(target=endless_message, args=(listener, 320, sent), daemon=True)
    attacker.start()
    try:
        runtime.apply(runtime.actor.start(runtime.clock()))
        deadline = time.monotonic() + 30
        while attacker.is_alive() and time.monotonic() < deadline:
            runtime.step_until(time.monotonic_ns() + 20_000_000)
        held = runtime.peer_inbound.table.held_bytes if runtime.peer_inbound is not None else None
        assert sent[0] < 320, f"all {sent[0]} MiB of the message were taken and held ({held})"
        # The budget, what came within one check interval and what the kernel buffers: 64-90 MiB here.
        assert sent[0] <= 2 * 64, f"{sent[0]} MiB were taken before the connection was closed"
        assert runtime.counters.get("peer_connections_closed_over_bytes") == 1
        deadline = time.monotonic() + 5
        told = lambda: any(isinstance(message, PeerDisconnected) for message in journal)  # noqa: E731
        while not told() and time.monotonic() < deadline:
            runtime.step_until(time.monotonic_ns() + 20_000_000)
        assert told(), "the actor was not told its peer went"
    finally:
        listener.close()
        runtime.close()
        attacker.join(10)


@contextmanager
def endless_rpc_peer(zmq_context):
    """An RpcClient with a 64 MiB budget, and a process's port that answers it one message of 320
    frames of 1 MiB, never finished (the attacker thread, not started yet): (rpc, endpoint,
    attacker, MiB sent so far)."""
    listener = socket.create_server(("127.0.0.1", 0))
    endpoint = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    rpc = RpcClient("asking", context=zmq_context, inbound_bytes_max=64 << 20)
    sent = [0]
    attacker = threading.Thread(target=endless_message, args=(listener, 320, sent), daemon=True)
    try:
        yield rpc, endpoint, attacker, sent
    finally:
        listener.close()
        rpc.close()
        if attacker.is_alive():
            attacker.join(10)


def cut_off_within_twice_the_budget(rpc: RpcClient, sent: list) -> None:
    assert sent[0] < 320, f"all {sent[0]} MiB of the message were taken and held"
    assert sent[0] <= 2 * 64, f"{sent[0]} MiB were taken before the connection was closed"
    assert rpc.counters.get("peer_connections_closed_over_bytes", 0) >= 1, rpc.counters


@pytest.mark.timeout(60)
def test_an_rpc_request_to_a_port_sending_one_endless_message_is_cut_off_past_the_budget(zmq_context):
    """Admin tools and node agents ask over transport/rpc.py's own DEALERs, outside any runtime:
    a process on a dead controller's port answering one message of ever more frames was held
    whole while the request waited (320 MiB for 320 frames). The request looks at what its
    connection holds while it waits, and past the budget shuts it down."""
    with endless_rpc_peer(zmq_context) as (rpc, endpoint, attacker, sent):
        attacker.start()
        with pytest.raises(RequestTimeout):
            rpc.request(endpoint, MetadataRequest(correlation_id=0, topics=[]), timeout_ms=8_000)
        cut_off_within_twice_the_budget(rpc, sent)


@pytest.mark.timeout(60)
def test_a_kept_rpc_socket_is_cut_off_between_requests_by_whoever_watches_its_connections(zmq_context):
    """The node agent keeps its sockets to the controllers between heartbeats: a process that
    took a controller's port after the agent's last request sends one endless message, and
    nobody reads. The agent sleeps on `connection_fds()` and calls `check_inbound()` when they
    stir, as here."""
    with endless_rpc_peer(zmq_context) as (rpc, endpoint, attacker, sent):
        rpc.send(endpoint, MetadataRequest(correlation_id=0, topics=[]))  # a socket kept, no request waiting
        attacker.start()
        deadline = time.monotonic() + 30
        while attacker.is_alive() and time.monotonic() < deadline:
            poller = zmq.Poller()
            for fd in rpc.connection_fds():
                poller.register(fd, zmq.POLLIN)
            poller.poll(100)
            rpc.discard_unasked()
            rpc.check_inbound()
        cut_off_within_twice_the_budget(rpc, sent)
