"""A voter whose disk was lost comes back empty (docs/raft.md §7): it must not vote until a leader
has caught it up, or its vote can elect a leader that lacks committed entries.

The story of each test: entries commit on voters 1 and 2 while voter 3 is cut off; voter 1 (the
leader) dies and voter 2 loses its disk. Voter 3, behind, campaigns and asks the empty voter 2.
"""

from __future__ import annotations

import pytest

from actors.raft import Role
from actors.raft_messages import RaftAppendResponse
from storage.memory import MemoryFileSystem
from tests.unit.raft_harness import Net


def committed_without_voter_3() -> Net:
    net = Net(3, pre_vote=True, check_quorum=False)
    net.campaign(1)
    net.deliver()
    assert net.nodes[1].role is Role.LEADER
    net.isolate(3)
    for index in range(3):
        net.propose(1, b"acknowledged-%d" % index)
        net.deliver()
    assert net.nodes[1].commit_index == net.nodes[2].commit_index == 4  # the no-op and three commands
    net.crash(1)
    net.crash(2)
    net.fs[2] = MemoryFileSystem()  # voter 2's disk is gone
    net.heal()
    return net


def test_a_wiped_voter_refuses_its_vote_to_a_candidate_that_lacks_committed_entries():
    net = committed_without_voter_3()
    net.restart(2, rejoining=True)
    net.campaign(3)
    net.deliver()
    net.campaign(3)
    net.deliver()
    assert net.nodes[3].role is not Role.LEADER, "elected with the vote of a voter that forgot its log"
    assert net.nodes[2].counters.get("votes_refused_rejoining", 0) >= 1


def test_without_the_rule_the_same_story_loses_committed_entries():
    net = committed_without_voter_3()
    net.restart(2)  # as a brand-new voter: the unsafe case the rule exists for
    with pytest.raises(AssertionError, match="leader completeness"):  # the harness's SafetyChecker
        net.campaign(3)
        net.deliver()
        net.campaign(3)
        net.deliver()
        net.propose(3, b"new")
        net.deliver()
        net.restart(1)
        net.run_for(2_000)


def test_a_wiped_voter_never_campaigns_while_it_waits():
    net = committed_without_voter_3()
    net.restart(2, rejoining=True)
    net.run_for(2_000)  # nobody else is up to date enough to lead; voter 2's timer fires again and again
    assert net.nodes[2].role is Role.FOLLOWER and net.nodes[2].term == 0
    assert net.nodes[2].counters.get("campaigns_skipped_rejoining", 0) >= 2


def test_a_wiped_voter_votes_again_once_a_leader_has_caught_it_up():
    net = committed_without_voter_3()
    net.restart(2, rejoining=True)
    net.restart(1)
    net.run_for(3_000)  # voter 1 (complete) wins with voter 3's vote and catches voter 2 up
    assert net.nodes[1].role is Role.LEADER
    assert not net.nodes[2].rejoining and net.nodes[2].counters.get("rejoined") == 1
    assert net.commands(2)[:3] == [b"acknowledged-%d" % index for index in range(3)]


def test_a_leader_repairs_a_follower_that_lost_what_it_had_acknowledged():
    """The leader still believes the wiped voter holds everything it acknowledged (its match
    index): the voter's refusals say its log was lost, and the leader sends it everything again."""
    net = Net(3, pre_vote=True)
    net.campaign(1)
    net.deliver()
    for index in range(3):
        net.propose(1, b"acknowledged-%d" % index)
        net.deliver()
    assert net.nodes[1].progress[2].match_index == 4
    net.crash(2)
    net.fs[2] = MemoryFileSystem()
    net.restart(2, rejoining=True)
    net.run_for(1_000)
    assert net.nodes[1].counters.get("follower_logs_lost", 0) >= 1
    assert not net.nodes[2].rejoining, "the wiped voter was never caught up"
    assert net.commands(2)[:3] == [b"acknowledged-%d" % index for index in range(3)]
    assert net.nodes[2].counters.get("protocol_violation_committed_entry_disputed", 0) == 0


def test_a_new_leader_that_lags_its_predecessors_commit_cannot_let_a_wiped_voter_back_short_of_it():
    """Voter 3 leads term 1 and commits entry 3 with voter 1's acknowledgement (voter 2 is cut
    off), but dies before voter 1 hears that entry 3 committed, and loses its disk. Voter 1 wins
    term 2 with voter 2's vote, believing the commit index is 2. Were voter 3 a full voter again
    once its commit index reached that 2, it would lack entry 3; with voter 1 dead, voters 2 and 3
    would elect a leader without it. It must wait for an entry of voter 1's own term to commit."""
    net = Net(3, pre_vote=True, check_quorum=False, append_entries_max=1)
    net.campaign(3)
    net.deliver()
    assert net.nodes[3].role is Role.LEADER
    net.cut.update({(2, 1), (1, 2), (2, 3), (3, 2)})
    net.propose(3, b"acknowledged-0")
    net.deliver()
    net.propose(3, b"acknowledged-1")
    while not (net.queue and isinstance(net.queue[0][2], RaftAppendResponse)):
        net.deliver_one()
    net.deliver_one()  # voter 1's acknowledgement: voter 3 commits entry 3 ...
    net.take()  # ... and dies before anything it says next arrives
    assert (net.nodes[3].commit_index, net.nodes[1].commit_index) == (3, 2)
    net.crash(3)
    net.fs[3] = MemoryFileSystem()
    net.heal()
    net.campaign(1)
    while net.nodes[1].role is not Role.LEADER:
        net.deliver_one()
    net.take()  # its first appends to voter 2 are lost, and voter 2 is cut off again
    net.cut.update({(2, 1), (1, 2)})
    net.restart(3, rejoining=True)
    while net.nodes[3].commit_index < 2:
        net.fire(1, "raft/heartbeat")
        while net.queue and net.nodes[3].commit_index < 2:
            net.deliver_one()
    assert net.nodes[3].rejoining, "back as a full voter at the new leader's lagging commit index"
    net.deliver()  # voter 1's term-2 entry commits with voter 3's acknowledgement: now it may vote
    assert not net.nodes[3].rejoining and net.nodes[3].log.last_index >= 3
    net.crash(1)
    net.heal()
    net.run_for(2_000)  # voters 2 and 3 elect one of them; the harness checks leader completeness
    assert b"acknowledged-1" in net.commands(2) and b"acknowledged-1" in net.commands(3)


def test_an_acknowledgement_sent_before_the_disk_was_lost_counts_for_nothing_once_the_leader_knows():
    """Voter 3 acknowledges entry 2 and loses its disk before the leader reads that answer; the
    leader hears first from the new, empty voter 3 (its log is lost), then the old answer arrives.
    Counted, it would commit entry 2 on the leader alone."""
    net = Net(3, pre_vote=True, check_quorum=False)
    net.campaign(1)
    net.deliver()
    net.cut.update({(2, 1), (1, 2)})  # voter 2 hears nothing more
    net.propose(1, b"held-only-by-the-leader")
    while not any(isinstance(message, RaftAppendResponse) for _, _, message in net.queue):
        net.deliver_one()  # the append reaches voter 3 ...
    stale = net.take(RaftAppendResponse)  # ... and its acknowledgement is slow
    assert [answer.match_index for answer in stale if answer.success] == [2]
    net.crash(3)
    net.fs[3] = MemoryFileSystem()
    net.restart(3, rejoining=True)
    net.fire(1, "raft/heartbeat")
    net.deliver()
    assert net.nodes[1].counters.get("follower_logs_lost", 0) >= 1
    assert net.nodes[1].commit_index == 1 and net.nodes[1].progress[3].match_index <= net.nodes[3].log.last_index
    match_before = net.nodes[1].progress[3].match_index
    for answer in stale:
        net.step(1, answer)  # the answer of voter 3's lost log, late
    assert net.nodes[1].progress[3].match_index == match_before, "a lost log's acknowledgement counted"
    assert net.nodes[1].commit_index == 1, "committed on the leader alone"
    assert net.nodes[1].counters.get("acks_void_after_log_lost", 0) == len(stale)
