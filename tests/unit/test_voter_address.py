"""A voter's Raft messages come from its own host (transport/voter_address.py): the rule alone,
and a runtime on loopback taking a message from the right address and dropping it from another."""

from __future__ import annotations

import time

import pytest
import zmq

from actors.raft_messages import RaftAppendRequest
from tests.unit.test_codec_runtime import Recorder
from transport.codec import Codec
from transport.runtime import Runtime
from transport.voter_address import VoterAddresses, endpoint_host, normal_address, raft_address_check

VOTERS = {1: "tcp://10.0.0.1:7411", 2: "tcp://node2:7411", 3: "tcp://[fd00::3]:7411"}


class FakeDns:
    def __init__(self, names: dict[str, set[str]]) -> None:
        self.names = names
        self.lookups = 0

    def __call__(self, host: str) -> frozenset[str]:
        self.lookups += 1
        return frozenset(self.names.get(host, {host} if host[0].isdigit() or ":" in host else set()))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_voter_is_heard_from_its_host_and_refused_from_any_other_address():
    addresses = VoterAddresses(VOTERS, resolver=FakeDns({"node2": {"10.0.0.2"}}), clock=FakeClock())

    assert addresses.allows(1, "10.0.0.1") and addresses.allows(2, "10.0.0.2") and addresses.allows(3, "fd00::3")
    assert not addresses.allows(2, "10.0.0.9"), "a second process posing as voter 2"
    assert not addresses.allows(1, "10.0.0.2"), "voter 2 posing as voter 1"
    assert not addresses.allows(2, ""), "no address is no proof"
    assert addresses.refused == 3


def test_an_ipv4_peer_seen_through_a_dual_stack_socket_is_its_plain_address():
    addresses = VoterAddresses(VOTERS, resolver=FakeDns({}), clock=FakeClock())

    assert normal_address("::ffff:10.0.0.1") == "10.0.0.1" and normal_address("[fd00::3]") == "fd00::3"
    assert addresses.allows(1, "::ffff:10.0.0.1")
    assert endpoint_host("tcp://[fd00::3]:7411") == "fd00::3"


def test_an_address_literal_is_never_looked_up_again_however_many_messages_come_from_elsewhere():
    dns, clock = FakeDns({}), FakeClock()
    addresses = VoterAddresses(VOTERS, resolver=dns, clock=clock)
    assert addresses.allows(1, "10.0.0.1")
    lookups = dns.lookups
    for _ in range(3):
        clock.now += 2.0
        assert not addresses.allows(1, "10.0.0.9")
    assert dns.lookups == lookups


def test_a_voter_outside_the_quorum_is_left_to_the_actor():
    addresses = VoterAddresses(VOTERS, resolver=FakeDns({}), clock=FakeClock())

    assert addresses.allows(7, "10.9.9.9")


def test_a_host_name_that_moved_is_looked_up_again_at_most_once_a_second():
    """A voter's host comes back under a new address (a container rescheduled): its messages are
    taken once the name resolves to it, and a stream of refused messages costs one lookup a second."""
    dns, clock = FakeDns({"node2": {"10.0.0.2"}}), FakeClock()
    addresses = VoterAddresses(VOTERS, resolver=dns, clock=clock)
    assert addresses.allows(2, "10.0.0.2")

    dns.names["node2"] = {"10.0.0.22"}
    assert not addresses.allows(2, "10.0.0.22"), "the name was looked up less than a second ago"
    clock.now += 1.0
    first = addresses.allows(2, "10.0.0.22")  # the old answer is a second old: looked up again
    lookups = dns.lookups
    for _ in range(100):
        addresses.allows(2, "10.0.0.99")
    assert first and dns.lookups == lookups, "refusals within the second looked nothing up"
    clock.now += 1.0
    assert not addresses.allows(2, "10.0.0.99") and dns.lookups == lookups + 1


def _append(source: int) -> RaftAppendRequest:
    return RaftAppendRequest(source=source, destination=1, term=5, prev_log_index=0, prev_log_term=0, leader_commit=0)


@pytest.mark.timeout(30)
def test_a_runtime_takes_a_voters_message_from_its_address_and_drops_it_from_another(zmq_context):
    context = zmq_context
    """On loopback, with voter 2 configured at 127.0.0.2: the same signed append is handed to the
    actor when it comes from 127.0.0.2 and dropped, unanswered and counted, from 127.0.0.1."""
    journal: list = []
    runtime = Runtime(Recorder(journal, on_message=lambda message, sender: []), identity="voter-1", context=context)
    runtime.peer_check = raft_address_check({1: "tcp://127.0.0.1:1", 2: "tcp://127.0.0.2:1"})
    endpoint = runtime.bind()
    port = endpoint.rpartition(":")[2]
    peers = []
    try:
        for source in ("127.0.0.1", "127.0.0.2"):
            peer = context.socket(zmq.DEALER)
            peer.setsockopt(zmq.LINGER, 0)
            peer.connect(f"tcp://{source}:0;127.0.0.1:{port}")
            peers.append(peer)
            peer.send_multipart(Codec().encode(_append(source=2)))
            deadline = time.monotonic() + 5
            seen = len(journal), runtime.counters.get("rejected_wrong_address", 0)
            while (len(journal), runtime.counters.get("rejected_wrong_address", 0)) == seen \
                    and time.monotonic() < deadline:
                runtime.step()
        handled = [entry[1] for entry in journal if entry[0] == "handle"]
        assert handled == ["RaftAppendRequest"], "exactly the one from voter 2's address reached the actor"
        assert runtime.counters["rejected_wrong_address"] == 1
        assert not peers[0].poll(200), "the one posing as voter 2 got no answer"
    finally:
        for peer in peers:
            peer.close(linger=0)
        runtime.close()
