"""Raft elections through the pure API, in the style of etcd-io/raft's tests: a small network of
RaftNodes (tests/unit/raft_harness.py), messages delivered by the test, timers fired by the test.
The safety checker of the simulation runs after every step of every story."""

from __future__ import annotations

import msgspec
import pytest

from actors.actor import IllegalTransition
from actors.effects import SetTimer
from actors.messages import Stop
from actors.raft import NotController, ProposalRefused, Proposed, RaftConfig, RaftConfigError, Role
from actors.raft.roles import ELECTION_TIMER
from actors.raft_messages import (
    RaftAppendRequest, RaftAppendResponse, RaftVoteRequest, RaftVoteResponse, RaftWireMessage,
)
from storage.raft_log import ENTRY_NOOP, RaftEntry
from tests.unit.raft_harness import MS, Net, endpoint

TIMEOUT_MS = 300  # RaftConfig's default election timeout


def roles(net: Net) -> dict[int, str]:
    return {node: raft.role.value for node, raft in sorted(net.nodes.items())}


# ----------------------------------------------------------------------------- elections


def test_a_follower_whose_timeout_expires_is_elected_by_a_majority():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    assert roles(net) == {1: "leader", 2: "follower", 3: "follower"}
    assert {raft.term for raft in net.nodes.values()} == {1}
    assert {raft.leader_id for raft in net.nodes.values()} == {1}


def test_the_new_leader_appends_a_no_op_of_its_term_and_commits_it():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    leader = net.nodes[1]
    assert leader.log.entry(1) == RaftEntry(index=1, term=1, kind=ENTRY_NOOP)
    assert [raft.commit_index for raft in net.nodes.values()] == [1, 1, 1]


@pytest.mark.parametrize("size, reachable, elected", [
    (3, {1, 2}, True), (3, {1}, False), (5, {1, 2, 3}, True), (5, {1, 2}, False),
])
def test_an_election_needs_a_majority_of_the_voters(size, reachable, elected):
    net = Net(size)
    for node in set(net.voters) - reachable:
        net.isolate(node)
    net.campaign(1)
    net.deliver()
    assert (net.nodes[1].role is Role.LEADER) is elected


def test_election_timeouts_are_randomized_in_one_to_two_timeouts_and_set_as_timer_effects():
    net = Net(5)
    deadlines = [net.timers[node][ELECTION_TIMER] - net.now_ns for node in net.voters]
    assert all(TIMEOUT_MS * MS <= deadline < 2 * TIMEOUT_MS * MS for deadline in deadlines)
    assert len(set(deadlines)) > 1


def test_a_split_vote_elects_nobody_and_randomized_timeouts_then_elect_one_leader():
    net = Net(4, pre_vote=False)
    net.cut.update({(2, 3), (1, 4)})  # node 3 hears only candidate 1, node 4 only candidate 2
    net.campaign(1)
    net.campaign(2)
    net.deliver()
    assert roles(net) == {1: "candidate", 2: "candidate", 3: "follower", 4: "follower"}
    assert {net.nodes[1].term, net.nodes[2].term} == {1}
    net.heal()
    net.run_for(4 * TIMEOUT_MS)
    leaders = [node for node, role in roles(net).items() if role == "leader"]
    assert len(leaders) == 1 and net.nodes[leaders[0]].term >= 2
    assert {raft.leader_id for raft in net.nodes.values()} == set(leaders)


def test_a_voter_grants_one_vote_per_term_and_remembers_it_across_a_restart():
    net = Net(3, pre_vote=False)
    ask = dict(term=1, last_log_index=0, last_log_term=0)
    net.step(3, RaftVoteRequest(source=1, destination=3, **ask))
    net.step(3, RaftVoteRequest(source=2, destination=3, **ask))
    answers = net.take(RaftVoteResponse)
    assert [(answer.destination, answer.granted) for answer in answers] == [(1, True), (2, False)]
    net.crash(3)
    net.restart(3)
    net.step(3, RaftVoteRequest(source=2, destination=3, **ask))
    assert [answer.granted for answer in net.take(RaftVoteResponse)] == [False]
    net.step(3, RaftVoteRequest(source=1, destination=3, **ask))  # the same candidate asking again
    assert [answer.granted for answer in net.take(RaftVoteResponse)] == [True]


def test_a_candidate_whose_log_is_behind_gets_no_vote():
    net = Net(3, pre_vote=False, logs={1: [1, 1], 2: [1, 2], 3: [1, 1, 1]})
    net.step(2, RaftVoteRequest(source=1, destination=2, term=3, last_log_index=2, last_log_term=1))
    net.step(3, RaftVoteRequest(source=1, destination=3, term=3, last_log_index=2, last_log_term=1))
    assert [answer.granted for answer in net.take(RaftVoteResponse)] == [False, False]  # older term; shorter


def test_pre_vote_keeps_an_isolated_node_from_raising_its_term_and_deposing_the_leader():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    net.isolate(3)
    net.run_for(10 * TIMEOUT_MS)
    assert net.nodes[3].term == 1  # it asked (pre-vote) and nobody answered: no term was spent
    net.heal()
    net.run_for(4 * TIMEOUT_MS)
    assert net.nodes[1].role is Role.LEADER and {raft.term for raft in net.nodes.values()} == {1}


def test_without_pre_vote_and_check_quorum_the_rejoining_node_does_depose_the_leader():
    net = Net(3, pre_vote=False, check_quorum=False)
    net.campaign(1)
    net.deliver()
    net.isolate(3)
    net.run_for(10 * TIMEOUT_MS)
    assert net.nodes[3].term > 1
    net.heal()
    net.run_for(4 * TIMEOUT_MS)
    assert net.nodes[1].term > 1  # the old leader had to step down: what pre-vote prevents


def test_a_follower_in_its_leader_lease_ignores_a_vote_request_of_a_higher_term():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    net.step(2, RaftVoteRequest(source=3, destination=2, term=9, last_log_index=5, last_log_term=5))
    assert net.take() == [] and net.nodes[2].term == 1
    assert net.nodes[2].counters["votes_ignored_in_lease"] == 1
    net.advance(TIMEOUT_MS)  # the lease is over: the leader has been silent a whole timeout
    net.step(2, RaftVoteRequest(source=3, destination=2, term=9, last_log_index=5, last_log_term=5))
    assert [answer.granted for answer in net.take(RaftVoteResponse)] == [True] and net.nodes[2].term == 9


def test_check_quorum_makes_a_leader_cut_off_from_the_majority_step_down():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    net.isolate(1)
    net.run_for(3 * TIMEOUT_MS)
    assert net.nodes[1].role is Role.FOLLOWER and net.nodes[1].counters["check_quorum_step_downs"] == 1
    assert isinstance(net.nodes[1].propose(b"x", net.now_ns), NotController)
    assert [net.nodes[node].role for node in (2, 3)].count(Role.LEADER) == 1


def test_a_leader_that_hears_a_higher_term_in_an_answer_steps_down():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    net.step(1, RaftAppendResponse(source=3, destination=1, term=4))  # a node stranded at a higher term
    assert net.nodes[1].role is Role.FOLLOWER and net.nodes[1].term == 4


def test_leadership_transfer_hands_over_without_waiting_for_a_timeout():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    effects = net.nodes[1].transfer_leadership(2, net.now_ns)
    refused = net.nodes[1].propose(b"x", net.now_ns)
    assert isinstance(refused, ProposalRefused) and refused.reason == "BUSY"
    net.apply(1, effects)
    net.deliver()
    assert net.nodes[2].role is Role.LEADER and net.nodes[2].term == 2
    with pytest.raises(ValueError):
        net.nodes[2].transfer_leadership(7, net.now_ns)


# ----------------------------------------------------------------------------- the proposal API


def test_a_follower_answers_a_proposal_with_not_controller_and_the_leaders_address():
    net = Net(3)
    assert net.nodes[2].propose(b"x", net.now_ns) == NotController(0, "", 0)  # no leader known yet
    net.campaign(1)
    net.deliver()
    assert net.nodes[2].propose(b"x", net.now_ns) == NotController(1, endpoint(1), 1)


def test_proposals_are_applied_in_order_exactly_once_on_every_voter():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    results = [net.propose(1, b"command-%d" % number) for number in range(5)]
    assert all(isinstance(result, Proposed) for result in results)
    assert [result.index for result in results] == [2, 3, 4, 5, 6]
    net.deliver()
    expected = [b"command-%d" % number for number in range(5)]
    assert all(net.commands(node) == expected for node in net.voters)
    assert [machine.applied_index for machine in net.machines.values()] == [6, 6, 6]


def test_a_leader_refuses_a_proposal_too_large_or_past_the_uncommitted_bound():
    net = Net(3, uncommitted_entries_max=2, entry_bytes_max=8)
    net.campaign(1)
    net.deliver()
    assert net.propose(1, b"x" * 9).reason == "TOO_LARGE"
    net.isolate(1)
    assert isinstance(net.propose(1, b"a"), Proposed) and isinstance(net.propose(1, b"b"), Proposed)
    assert net.propose(1, b"c").reason == "BUSY"


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("message, reason", [
    (RaftVoteRequest(source=9, destination=2, term=5, last_log_index=0, last_log_term=0), "unknown_source"),
    (RaftVoteRequest(source=2, destination=2, term=5, last_log_index=0, last_log_term=0), "from_self"),
    (RaftVoteRequest(source=1, destination=3, term=5, last_log_index=0, last_log_term=0), "wrong_destination"),
    (RaftAppendRequest(source=1, destination=2, term=5, prev_log_index=0, prev_log_term=0,
                       entries=[RaftEntry(index=2, term=5)]), "append_entries_not_contiguous"),
    (RaftAppendRequest(source=1, destination=2, term=5, prev_log_index=0, prev_log_term=0,
                       entries=[RaftEntry(index=1, term=6)]), "append_entry_term_out_of_order"),
    (RaftAppendRequest(source=1, destination=2, term=5, prev_log_index=0, prev_log_term=0,
                       entries=[RaftEntry(index=1, term=5, kind=7)]), "append_entry_unknown_kind"),
])
def test_a_message_no_correct_peer_could_send_is_dropped_and_counted(message, reason):
    net = Net(3)
    node = net.nodes[2]
    before = (node.term, node.voted_for, node.log.last_index)
    assert [effect for effect in node.handle(message, b"peer", net.now_ns) if not isinstance(effect, SetTimer)] == []
    assert node.counters == {f"dropped_{reason}": 1}
    assert (node.term, node.voted_for, node.log.last_index) == before


def test_negative_numbers_never_reach_a_node():
    frame = msgspec.msgpack.encode({"type": "RaftVoteRequest", "source": 1, "destination": 2, "term": -1,
                                    "last_log_index": 0, "last_log_term": 0})
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.Decoder(RaftWireMessage).decode(frame)


def test_a_message_that_is_not_raft_is_an_illegal_transition():
    with pytest.raises(IllegalTransition, match="Stop"):
        Net(3).nodes[1].handle(Stop(), b"", 0)


@pytest.mark.parametrize("fields, problem", [
    (dict(node_id=4, voters={1: "a", 2: "b"}), "not one of the voters"),
    (dict(node_id=0, voters={0: "a"}), ">= 1"),
    (dict(node_id=1, voters={1: "a"}, election_timeout_ms=100, heartbeat_interval_ms=50), "must exceed"),
    (dict(node_id=1, voters={1: "a"}, inflight_appends_max=0), "inflight_appends_max"),
])
def test_a_configuration_that_cannot_run_safely_is_refused(fields, problem):
    with pytest.raises(RaftConfigError, match=problem):
        RaftConfig(**fields).check()


def test_a_single_voter_elects_itself_and_commits_alone():
    net = Net(1)
    net.campaign(1)
    assert net.nodes[1].role is Role.LEADER
    net.propose(1, b"alone")
    assert net.commands(1) == [b"alone"]


def test_a_brand_new_quorum_elects_its_lowest_voter_without_waiting_an_election_timeout():
    net = Net(3, campaign_at_first_start=True)
    started = net.now_ns
    net.run_for(20)  # far less than the 300 ms election timeout
    assert net.nodes[1].role is Role.LEADER and net.nodes[1].term == 1
    assert net.now_ns - started <= 20 * 1_000_000


def test_a_restarted_voter_never_campaigns_at_once():
    net = Net(3, campaign_at_first_start=True)
    net.run_for(20)
    net.crash(1)
    net.restart(1)
    assert net.nodes[1].election_deadline_ns > net.now_ns, "only a brand-new quorum skips the timeout"


def test_a_step_proposed_in_parts_is_appended_whole_or_refused_whole():
    net = Net(3, uncommitted_entries_max=3, entry_bytes_max=8)
    net.campaign(1)
    net.deliver()
    net.isolate(1)
    before = net.nodes[1].log.last_index

    assert net.nodes[1].propose_many([b"a", b"b", b"x" * 9], net.now_ns).reason == "TOO_LARGE"
    assert net.nodes[1].propose_many([b"a", b"b", b"c", b"d"], net.now_ns).reason == "BUSY"
    assert net.nodes[1].log.last_index == before, "part of a refused step was appended"
    result = net.nodes[1].propose_many([b"a", b"b", b"c"], net.now_ns)
    assert isinstance(result, Proposed) and result.index == before + 3
    net.apply(1, result.effects)
    net.heal()
    net.run_for(200)
    assert all(net.commands(node) == [b"a", b"b", b"c"] for node in net.voters)


def test_uncommitted_entries_are_bounded_in_bytes_but_one_step_alone_always_goes():
    """A leader that cannot commit takes proposals until `uncommitted_bytes_max` bytes wait
    (etcd-io/raft's MaxUncommittedEntriesSize), not 4,096 entries of up to 1 MiB each. One
    proposal with nothing uncommitted goes whatever its size, or a step that large could never
    be proposed."""
    net = Net(3, uncommitted_bytes_max=100, entry_bytes_max=80)
    net.campaign(1)
    net.deliver()
    net.isolate(1)

    assert isinstance(net.propose(1, b"x" * 60), Proposed)
    assert isinstance(net.propose(1, b"x" * 40), Proposed)
    assert net.propose(1, b"x").reason == "BUSY"
    net.heal()
    net.run_for(200)
    assert isinstance(net.nodes[1].propose_many([b"y" * 80, b"y" * 80], net.now_ns), Proposed)
