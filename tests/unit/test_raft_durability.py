"""Durability through the pure API: term, vote and entries are on disk before any message
reveals them (`AfterFlush`), a restart resumes from exactly what the disk kept, and a damaged raft
log stops the node with a typed error instead of letting it vote with a forgotten past."""

from __future__ import annotations

import pytest

from actors.effects import AfterFlush, Send
from actors.raft import Role
from actors.raft_messages import RaftAppendRequest, RaftAppendResponse, RaftVoteRequest, RaftVoteResponse
from storage.raft_log import HEADER_BYTES, LOG_NAME, CorruptRaftLog, RaftEntry, RaftLog
from tests.unit.raft_harness import DIRECTORY, Net


def naked_sends(effects: list) -> list:
    return [effect.message for effect in effects if isinstance(effect, Send)]


def guarded_sends(effects: list) -> list:
    return [inner.message for effect in effects if isinstance(effect, AfterFlush)
            for inner in effect.effects if isinstance(inner, Send)]


def test_a_vote_is_answered_only_behind_the_flush_of_the_term_and_vote():
    net = Net(3, pre_vote=False)
    voter = net.nodes[2]
    effects = voter.handle(RaftVoteRequest(source=1, destination=2, term=1, last_log_index=0, last_log_term=0),
                           b"", net.now_ns)
    assert naked_sends(effects) == []
    [answer] = guarded_sends(effects)
    assert isinstance(answer, RaftVoteResponse) and answer.granted
    [flush] = [effect for effect in effects if isinstance(effect, AfterFlush)]
    assert flush.store is voter.log and voter.log.needs_flush


def test_a_vote_lost_with_its_flush_was_never_revealed_and_is_not_remembered():
    net = Net(3, pre_vote=False)
    net.hold_flushes(2)
    net.step(2, RaftVoteRequest(source=1, destination=2, term=1, last_log_index=0, last_log_term=0))
    assert net.take(RaftVoteResponse) == []  # the answer waits for node 2's disk
    net.crash(2)  # ... which never confirms
    net.restart(2)
    assert (net.nodes[2].term, net.nodes[2].voted_for) == (0, 0)


def test_a_vote_whose_flush_completes_goes_out_and_survives_a_crash():
    net = Net(3, pre_vote=False)
    net.hold_flushes(2)
    net.step(2, RaftVoteRequest(source=1, destination=2, term=1, last_log_index=0, last_log_term=0))
    net.flush(2)
    assert [answer.granted for answer in net.take(RaftVoteResponse)] == [True]
    net.crash(2)
    net.restart(2)
    assert (net.nodes[2].term, net.nodes[2].voted_for) == (1, 1)


def test_a_refusal_that_changes_nothing_on_disk_needs_no_flush():
    net = Net(3, pre_vote=False)
    net.step(2, RaftVoteRequest(source=1, destination=2, term=1, last_log_index=0, last_log_term=0))
    net.take()
    effects = net.nodes[2].handle(RaftVoteRequest(source=3, destination=2, term=1, last_log_index=0,
                                                  last_log_term=0), b"", net.now_ns)
    assert [message.granted for message in naked_sends(effects)] == [False] and guarded_sends(effects) == []


def test_a_pre_vote_changes_nothing_durable_and_is_answered_at_once():
    net = Net(3)
    effects = net.nodes[2].handle(RaftVoteRequest(source=1, destination=2, term=1, last_log_index=0,
                                                  last_log_term=0, pre_vote=True), b"", net.now_ns)
    assert [message.granted for message in naked_sends(effects)] == [True]
    assert (net.nodes[2].term, net.nodes[2].voted_for) == (0, 0)


def test_an_append_is_acknowledged_only_behind_the_flush_of_its_entries():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    follower = net.nodes[2]
    effects = follower.handle(RaftAppendRequest(source=1, destination=2, term=1, prev_log_index=1, prev_log_term=1,
                                                entries=[RaftEntry(index=2, term=1, data=b"x")], leader_commit=1),
                              b"", net.now_ns)
    assert naked_sends(effects) == []
    [answer] = guarded_sends(effects)
    assert isinstance(answer, RaftAppendResponse) and answer.match_index == 2


def test_a_leader_sends_its_entries_only_behind_its_own_flush():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    result = net.nodes[1].propose(b"x", net.now_ns)
    assert naked_sends(result.effects) == []
    assert [type(message) for message in guarded_sends(result.effects)] == [RaftAppendRequest, RaftAppendRequest]


def test_a_follower_that_loses_an_unflushed_entry_never_acknowledged_it():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    net.hold_flushes(3)
    net.propose(1, b"c0")
    net.deliver()  # node 2 acknowledges, the entry commits; node 3's answer waits for its disk
    assert net.nodes[1].progress[3].match_index == 1
    net.crash(3)
    restarted = net.restart(3)
    assert restarted.log.last_index == 1  # the entry it never acknowledged is gone ...
    net.run_for(300)
    assert net.commands(3) == [b"c0"]  # ... and is simply sent again


def test_every_voter_restarts_from_what_its_disk_kept():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    for number in range(10):
        net.propose(1, b"c%d" % number)
    net.deliver()
    before = {node: (raft.term, raft.voted_for, raft.log.last_index, raft.commit_index)
              for node, raft in net.nodes.items()}
    for node in list(net.nodes):
        net.crash(node)
    for node in net.voters:
        net.restart(node)
    after = {node: (raft.term, raft.voted_for, raft.log.last_index) for node, raft in net.nodes.items()}
    assert after == {node: state[:3] for node, state in before.items()}
    for node, raft in net.nodes.items():
        assert raft.role is Role.FOLLOWER and raft.applied_index == raft.commit_index >= 1
    net.run_for(1500)
    leaders = [raft for raft in net.nodes.values() if raft.role is Role.LEADER]
    assert len(leaders) == 1 and leaders[0].term == 2
    expected = [b"c%d" % number for number in range(10)]
    assert all(net.commands(node) == expected for node in net.voters)  # applied again, once, in order


def test_a_restart_restores_the_snapshot_then_applies_only_what_follows_it():
    net = Net(3, snapshot_interval_entries=4, snapshot_trailing_entries=0)
    net.campaign(1)
    net.deliver()
    for number in range(6):
        net.propose(1, b"c%d" % number)
    net.deliver()
    snapshot_index = net.nodes[2].log.snapshot.index
    net.crash(2)
    restarted = net.restart(2)
    machine = net.machines[2]
    assert machine.commands == [b"c%d" % number for number in range(6)]
    assert restarted.applied_index == restarted.commit_index >= snapshot_index > 0


def test_a_damaged_raft_log_stops_the_node_with_a_typed_error():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    net.propose(1, b"c0")
    net.deliver()
    net.crash(2)
    net.fs[2].corrupt(f"{DIRECTORY}/{LOG_NAME}", HEADER_BYTES + 5)
    with pytest.raises(CorruptRaftLog):
        net.restart(2)


def test_a_wiped_header_is_a_typed_error_not_a_fresh_voter_with_no_vote():
    net = Net(3, pre_vote=False)
    net.step(2, RaftVoteRequest(source=1, destination=2, term=1, last_log_index=0, last_log_term=0))
    net.crash(2)
    path = f"{DIRECTORY}/{LOG_NAME}"
    net.fs[2].set_content(path, bytes(HEADER_BYTES) + net.fs[2].read_file(path)[HEADER_BYTES:])
    with pytest.raises(CorruptRaftLog, match="neither header slot"):
        RaftLog.open(DIRECTORY, fs=net.fs[2])
