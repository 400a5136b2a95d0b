"""A voter of `railmq node` that starts with an empty log asks the other voters whether its quorum
formed without it (railmq/quorum_formed.py).

Its log may be a lost one: a node whose disk was replaced comes back empty, and voting as a new
voter it could elect a candidate without the entries its lost log had helped commit (an entry
committed on nodes 1 and 3, node 3 wiped and started while 1 and 2 were down, then 2 back: 2 and 3
elect 2, and the entry, a topic or a committed offset, is gone though one disk was lost). Silence
used to mean "never formed" after one second per voter; now only answers decide: one voter with
any term or entry says the quorum formed, and voters with empty logs that are a majority with
this one say it never did. Until then it waits, answering for itself that its log is empty, so
that voters of a new cluster started together decide.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import zmq

from actors.messages import ControllerStatusResponse
from railmq.node import ClusterNode, NodeConfigError
from railmq.quorum_formed import EmptyLogAnswers, FormedCheck, QuorumUndecided, empty_answers_needed, judge

pytestmark = pytest.mark.timeout(60)


def status(term: int = 0, commit: int = 0, last: int = 0) -> ControllerStatusResponse:
    return ControllerStatusResponse(correlation_id=1, term=term, commit_index=commit, last_index=last)


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for each in sockets:
            each.bind(("127.0.0.1", 0))
        return [each.getsockname()[1] for each in sockets]
    finally:
        for each in sockets:
            each.close()


@pytest.mark.parametrize("voters, needed", [(3, 1), (5, 2), (7, 3)])
def test_empty_answers_must_make_a_majority_with_this_voter(voters, needed):
    assert empty_answers_needed(voters) == needed


def test_one_voter_with_a_term_or_an_entry_says_the_quorum_formed():
    assert judge({2: status(term=3, commit=5)}, voters=3) is True
    assert judge({2: status(term=1)}, voters=3) is True, "it voted in an election"
    assert judge({2: status(last=4)}, voters=3) is True, "it holds entries, committed or not"


def test_silence_decides_nothing():
    """The hole: with voters 1 and 2 down, a wiped voter 3 heard nobody and voted as new."""
    assert judge({}, voters=3) is None
    assert judge({2: status()}, voters=5) is None, "voters 3 to 5 may hold what this one lost"


def test_empty_logs_that_are_a_majority_with_this_voter_say_it_never_formed():
    """A new cluster forms with a majority of its voters; the others join later."""
    assert judge({2: status()}, voters=3) is False
    assert judge({2: status(), 3: status()}, voters=5) is False


def test_a_wiped_voter_whose_peers_are_down_waits_instead_of_voting_as_new(tmp_path):
    own, other_one, other_two = free_ports(3)
    stop = threading.Event()
    check = FormedCheck(f"tcp://127.0.0.1:{own}", {1: f"tcp://127.0.0.1:{other_one}",
                                                   2: f"tcp://127.0.0.1:{other_two}"}, voters=3)
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(_run(check, stop)))
    thread.start()
    thread.join(3.0)
    still_waiting = thread.is_alive()
    stop.set()
    thread.join(10.0)

    assert still_waiting, f"decided {outcome} with no voter answering"
    assert outcome and isinstance(outcome[0], QuorumUndecided)


def test_the_voters_of_a_new_cluster_started_together_decide_it_never_formed():
    """Each waits for the others' answers; each answers for itself meanwhile, so nobody waits for
    a voter that is itself waiting. A voter that decided goes on answering, as the voter it then
    starts on the same address does (its log is empty too): the two that decided first used to
    close their addresses, and a third that had asked before they listened waited for good."""
    ports = free_ports(3)
    endpoints = {node: f"tcp://127.0.0.1:{port}" for node, port in zip((1, 2, 3), ports)}
    stop = threading.Event()
    outcomes: dict[int, object] = {}

    def voter(node: int) -> None:
        others = {other: endpoint for other, endpoint in endpoints.items() if other != node}
        outcomes[node] = _run(FormedCheck(endpoints[node], others, voters=3), stop)
        context = zmq.Context()
        started = EmptyLogAnswers(context, endpoints[node])  # the voter's own status answers, empty log
        try:
            stop.wait(30.0)
        finally:
            started.close()
            context.destroy(linger=0)

    threads = [threading.Thread(target=voter, args=(node,)) for node in endpoints]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30.0
    while len(outcomes) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(10.0)

    assert outcomes == {1: False, 2: False, 3: False}


def _run(check: FormedCheck, stop: threading.Event) -> object:
    try:
        return check.run(stop)
    except QuorumUndecided as error:
        return error


def test_a_voter_address_another_process_holds_is_a_typed_error_not_a_traceback(tmp_path):
    (port,) = free_ports(1)
    taken = socket.socket()
    taken.bind(("127.0.0.1", port))
    taken.listen()
    node = ClusterNode(3, voters={1: "127.0.0.1", 2: "127.0.0.1", 3: "127.0.0.1"}, data_dir=str(tmp_path),
                       port=port)
    try:
        with pytest.raises(NodeConfigError, match="in use"):
            node._formed_elsewhere("controller", node.controller_endpoints, port, threading.Event())
    finally:
        taken.close()


def test_a_message_of_many_frames_to_a_deciding_voter_is_dropped_without_holding_its_frames():
    """While a voter decides, any local process reaches its status answers. One message of 500,000
    empty frames (1 MB on the wire) was read whole: a list of 500,000 frames, 4 MB at once. Now
    at most `MESSAGE_FRAMES_MAX` are kept, the rest are read into one scratch byte, and the next
    status request is answered."""
    import tracemalloc

    from actors.messages import ControllerStatusRequest
    from transport.codec import Codec

    (port,) = free_ports(1)
    endpoint = f"tcp://127.0.0.1:{port}"
    context = zmq.Context()
    answering = EmptyLogAnswers(context, endpoint)
    attacker = context.socket(zmq.DEALER)  # one connection: its request is read after its attack
    attacker.setsockopt(zmq.LINGER, 0)
    attacker.connect(endpoint)
    tracemalloc.start()
    try:
        for _ in range(500_000 - 1):
            attacker.send(b"", zmq.SNDMORE)
        tracemalloc.reset_peak()
        attacker.send(b"")
        attacker.send_multipart(Codec().encode(ControllerStatusRequest(correlation_id=9)))
        assert attacker.poll(20_000), "the status request behind it was not answered"
        answer = Codec().decode(attacker.recv_multipart())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        attacker.close()
        answering.close()
        context.destroy(linger=0)
    assert isinstance(answer, ControllerStatusResponse) and answer.correlation_id == 9
    assert peak < 1 << 20, f"{peak} bytes allocated at once for one message of 500,000 empty frames"
