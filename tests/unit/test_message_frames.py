"""Messages of many frames (transport/frames.py): what one costs a runtime before anything reads it.

libzmq bounds each frame of a message (ZMQ_MAXMSGSIZE) and counts its queues in whole messages,
but not the frames of one message: an empty frame is 2 bytes on the wire, and a message of a
million of them (2 MB) is one message. Read whole, each frame became a Python object of ~190
bytes (200,000 frames: 38 MB) and the read alone took the actor's only thread seconds, during
which it sent no heartbeat and fired no timer. No railmq message has more than
`MESSAGE_FRAMES_MAX` frames: past them a runtime keeps nothing, closes the sender's connection,
and reads the rest a bounded number of frames per wake-up.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest
import zmq

from actors.limits import MESSAGE_FRAMES_MAX, Limits
from actors.messages import MetadataRequest, wire_message_types
from tests.helpers import closed_by_peer, idle_zmtp_connection
from tests.unit.test_codec_runtime import Recorder
from transport.codec import Codec

EMPTY_FRAME_MORE, EMPTY_FRAME_LAST = b"\x01\x00", b"\x00\x00"  # ZMTP 3: flags, size 0


def many_frames(endpoint: str, frames: int):
    """A plain connection that sends one message of `frames` empty frames (2 bytes each)."""
    connection = idle_zmtp_connection(endpoint)
    connection.sendall(EMPTY_FRAME_MORE * (frames - 1) + EMPTY_FRAME_LAST)
    return connection


def stepped_peak(runtime, done, deadline: float) -> int:
    """Step `runtime` until `done()` (or `deadline`): the most memory allocated at once in one step
    (tracemalloc running)."""
    peak = 0
    while not done() and time.monotonic() < deadline:
        tracemalloc.reset_peak()
        runtime.step_until(time.monotonic_ns() + 20_000_000)
        peak = max(peak, tracemalloc.get_traced_memory()[1])
    return peak


def test_every_message_of_the_protocol_fits_the_frame_bound_with_its_tag_and_routing_id():
    most = max(len(cls.PAYLOAD_FIELDS) for cls in wire_message_types())
    assert 1 + 1 + most + 1 <= MESSAGE_FRAMES_MAX  # routing id, header, payloads, tag


@pytest.mark.timeout(120)
def test_a_message_of_many_empty_frames_is_read_a_bounded_slice_per_wake_up_and_keeps_nothing(zmq_context):
    """One 400 KB message of 200,000 empty frames: before, one wake-up read all of it into
    200,000 frame objects (38 MB at once) before anything else ran. Now a wake-up reads at most
    `runtime_batch_frames_max` frames of it, keeps none, the sender's connection is closed, and a
    client's request behind it is handled."""
    from transport.runtime import Runtime

    journal: list = []
    limits = Limits()
    runtime = Runtime(Recorder(journal), identity="frames", context=zmq_context, limits=limits)
    endpoint = runtime.bind()
    attacker = many_frames(endpoint, 200_000)
    client = zmq_context.socket(zmq.DEALER)
    try:
        deadline = time.monotonic() + 30
        resend_at = time.monotonic() + 5
        while not runtime._router.poll(100) and time.monotonic() < deadline:
            if time.monotonic() > resend_at:
                attacker.close()  # the raw connection did not get its message through (closed, its
                attacker, resend_at = many_frames(endpoint, 200_000), time.monotonic() + 5  # part goes)
        runtime._watch.touched(runtime._router)  # this poll took the socket's signal from the runtime
        client.connect(endpoint)
        client.send_multipart(Codec().encode(MetadataRequest(correlation_id=7)))
        served = lambda: any(entry[1] == "MetadataRequest" for entry in journal)  # noqa: E731
        reads: list[int] = []  # frames dropped at each wake-up (the client's request may come first)
        peak = 0
        tracemalloc.start()
        try:
            def dropped() -> bool:
                return bool(runtime.counters.get("messages_over_frames_max")) and not runtime.reading_overlong
            resend_at = time.monotonic() + 5
            while time.monotonic() < deadline and not (served() and dropped()):
                if not runtime.counters.get("messages_over_frames_max") and time.monotonic() > resend_at:
                    attacker.close()  # the harness's raw connection did not get its message through
                    attacker, resend_at = many_frames(endpoint, 200_000), time.monotonic() + 5
                before = runtime.counters.get("message_frames_discarded", 0)
                tracemalloc.reset_peak()
                runtime.step_until(time.monotonic_ns() + 20_000_000)
                peak = max(peak, tracemalloc.get_traced_memory()[1])
                reads.append(runtime.counters.get("message_frames_discarded", 0) - before)
        finally:
            tracemalloc.stop()

        assert peak < 2 << 20, f"{peak} bytes allocated at once for one message of 200,000 empty frames"
        most = max(reads)
        assert 0 < most <= limits.runtime_batch_frames_max, f"one wake-up read {most} of its frames"
        assert any(entry[1] == "MetadataRequest" for entry in journal), "the client behind it was not served"
        assert runtime.counters["messages_over_frames_max"] == 1
        # 200,001 frames with the routing id: all but the first MESSAGE_FRAMES_MAX dropped.
        assert runtime.counters["message_frames_discarded"] == 200_001 - MESSAGE_FRAMES_MAX
        deadline = time.monotonic() + 5
        while not closed_by_peer(attacker) and time.monotonic() < deadline:
            runtime.step_until(time.monotonic_ns() + 20_000_000)
        assert closed_by_peer(attacker), "the connection that sent it is still open"
    finally:
        attacker.close()
        client.close(linger=0)
        runtime.close()


def many_frames_from_a_peers_port(listener, frames: int) -> None:
    """A process on a port an actor talks to: it takes the DEALER's connection and answers one
    message of `frames` empty frames."""
    connection, _ = listener.accept()
    try:
        greeting = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + bytes(32)
        ready = b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"ROUTER"
        connection.sendall(greeting + bytes([0x04, len(ready)]) + ready)
        # Wait for the DEALER's greeting and READY: until its handshake is done, libzmq takes what
        # comes for a command and refuses a frame.
        heard = b""
        while len(heard) < 66 or len(heard) < 66 + heard[65]:
            heard += connection.recv(1 << 16)
        connection.sendall(EMPTY_FRAME_MORE * (frames - 1) + EMPTY_FRAME_LAST)
        while connection.recv(1 << 16):  # until the actor closes it
            pass
    except OSError:
        pass
    finally:
        connection.close()


@pytest.mark.timeout(120)
def test_a_message_of_many_frames_on_a_peers_connection_is_dropped_and_the_connection_closed(zmq_context):
    """The same from whatever listens on a peer's endpoint (a dead leader's port taken): the
    DEALER's connection is closed and the actor hears that its peer went."""
    import socket
    import threading

    from actors.messages import PeerDisconnected
    from tests.unit.test_connection_bound import Asking
    from transport.runtime import Runtime

    listener = socket.create_server(("127.0.0.1", 0))
    endpoint = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    journal: list = []
    runtime = Runtime(Asking(endpoint, journal), identity="asking", context=zmq_context)
    attacker = threading.Thread(target=many_frames_from_a_peers_port, args=(listener, 100_000), daemon=True)
    attacker.start()
    try:
        runtime.apply(runtime.actor.start(runtime.clock()))
        deadline = time.monotonic() + 30
        told = lambda: any(isinstance(message, PeerDisconnected) for message in journal)  # noqa: E731
        tracemalloc.start()
        try:
            done = lambda: told() and "message_frames_discarded" in runtime.counters  # noqa: E731
            peak = stepped_peak(runtime, done, deadline)
        finally:
            tracemalloc.stop()

        assert peak < 2 << 20, f"{peak} bytes allocated at once for one message of 100,000 empty frames"
        assert runtime.counters.get("messages_over_frames_max") == 1, runtime.counters
        assert runtime.counters.get("connections_closed_over_frames_max") == 1, runtime.counters
        assert told(), "the actor was not told its peer went"
    finally:
        listener.close()
        runtime.close()
        attacker.join(10)


def answer_with_many_frames(server: zmq.Socket, frames: int) -> None:
    """Take one request and answer it with one message of `frames` empty frames."""
    if server.poll(10_000):
        routing_id, *_ = server.recv_multipart()
        server.send(routing_id, zmq.SNDMORE)
        for _ in range(frames - 1):
            server.send(b"", zmq.SNDMORE)
        server.send(b"")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("many", [False, True], ids=["request", "request_many"])
def test_an_answer_of_many_frames_to_a_client_is_refused_without_holding_them(zmq_context, many):
    """The same from a process on a port a client asks (the admin tools, node agents' requests):
    `RpcClient` read every answer whole, so an answer of 200,000 empty frames became 200,000
    frame objects before its decode failed, and the client waited on for its answer. Now nothing
    past `MESSAGE_FRAMES_MAX` is read: the connection is dropped and the request fails at once
    as `PeerDown` (a `RequestTimeout`)."""
    import threading

    from transport.rpc import PeerDown, RpcClient

    server = zmq_context.socket(zmq.ROUTER)
    server.setsockopt(zmq.LINGER, 0)
    endpoint = f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"
    client = RpcClient(identity="frames", context=zmq_context)
    answering = threading.Thread(target=answer_with_many_frames, args=(server, 200_000))
    answering.start()
    try:
        tracemalloc.start()
        try:
            with pytest.raises(PeerDown):
                if many:
                    client.request_many([(endpoint, MetadataRequest(correlation_id=0))], 30_000)
                else:
                    client.request(endpoint, MetadataRequest(correlation_id=0), 30_000)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        answering.join(30)
        client.close()
        server.close(linger=0)
    assert peak < 4 << 20, f"{peak} bytes allocated at once for one answer of 200,000 empty frames"
    assert client.counters.get("messages_over_frames_max") == 1


@pytest.mark.timeout(120)
def test_a_message_of_many_frames_to_a_node_agents_reports_socket_is_dropped_a_slice_at_a_time():
    """The node agent's reports socket is a ROUTER any local process can reach, read by the
    thread that supervises every actor of its node: it read each message whole, so 200,000 empty
    frames were as many objects at once. Now it keeps none of them, reads the rest a bounded
    number per wake-up and closes the sender's connection."""
    import types

    from transport.node_agent import NodeAgent

    limits = Limits()
    supervisor = types.SimpleNamespace(on_exit=None, poll=lambda: None, close_watch=lambda: None)
    agent = NodeAgent(supervisor=supervisor, coordinator="tcp://127.0.0.1:1", nodes=[1],
                      data_dir="/nonexistent", cluster_id="c", limits=limits)
    agent.bind_reports()
    attacker = many_frames(agent.endpoint, 200_000)
    try:
        codec = Codec(limits.frame_bytes_max)
        deadline = time.monotonic() + 30
        reads: list[int] = []  # frames dropped at each wake-up
        tracemalloc.start()
        try:
            resend_at = time.monotonic() + 5
            while time.monotonic() < deadline and (
                    not agent.counters.get("messages_over_frames_max") or agent.reading_overlong):
                if not agent.counters.get("messages_over_frames_max") and time.monotonic() > resend_at:
                    attacker.close()  # the harness's raw connection did not get its message through
                    attacker, resend_at = many_frames(agent.endpoint, 200_000), time.monotonic() + 5
                before = agent.counters.get("message_frames_discarded", 0)
                agent._receive_reports(codec, 100)
                agent._guard.on_events()  # as the agent's loop does after each read (_run)
                reads.append(agent.counters.get("message_frames_discarded", 0) - before)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 2 << 20, f"{peak} bytes allocated at once for one message of 200,000 empty frames"
        assert max(reads) <= limits.runtime_batch_frames_max, f"one wake-up read {max(reads)} of its frames"
        assert agent.counters["messages_over_frames_max"] == 1 and not agent.reading_overlong
        frames_after_kept = 200_000 + 1 - MESSAGE_FRAMES_MAX  # with the routing id
        assert agent.counters.get("message_frames_discarded", 0) == frames_after_kept, "read to its end"
        assert closed_by_peer(attacker), "the sender's connection was closed"
    finally:
        attacker.close()
        agent._guard.close()
        agent._router.close(linger=0)
