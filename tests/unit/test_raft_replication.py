"""Log replication through the pure API: repairing divergent followers (the paper's Figure 7),
the commit rule of §5.4.2 (Figure 8), snapshots for followers that fell behind compaction, and
appends that arrive late, twice or out of order."""

from __future__ import annotations

import pytest

from actors.raft import Role
from actors.raft.replication import LeaderRules
from actors.raft.roles import HEARTBEAT_TIMER
from actors.raft_messages import RaftAppendRequest, RaftAppendResponse, RaftSnapshotRequest
from storage.raft_log import RaftEntry
from tests.unit.raft_harness import Net

# Figure 7 of the Raft paper: the leader of term 8, and followers (a)-(f) as it finds them.
LEADER_LOG = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
FOLLOWER_LOGS = {
    "a: missing entries": [1, 1, 1, 4, 4, 5, 5, 6, 6],
    "b: missing many": [1, 1, 1, 4],
    "c: an extra entry": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
    "d: extra entries of a later term": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e: missing, then divergent": [1, 1, 1, 4, 4, 4, 4],
    "f: divergent terms 2 and 3": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
}


def terms(raft) -> list[int]:
    return [raft.log.term_at(index) for index in range(raft.log.first_index, raft.log.last_index + 1)]


def deliver_until_node_3_matched_2(net: Net) -> None:
    leader = net.nodes[1]
    while leader.role is not Role.LEADER or leader.progress[3].match_index < 2:
        net.deliver_one()


@pytest.mark.parametrize("case", sorted(FOLLOWER_LOGS))
def test_a_divergent_follower_is_repaired_to_the_leaders_log(case):
    # Node 1 leads with Figure 7's log; node 3 holds the same log (so node 1 can win), node 2 is the case.
    net = Net(3, logs={1: LEADER_LOG, 2: FOLLOWER_LOGS[case], 3: LEADER_LOG}, terms={1: 7, 2: 7, 3: 7})
    net.campaign(1)
    net.deliver()
    leader, follower = net.nodes[1], net.nodes[2]
    assert leader.role is Role.LEADER and leader.term == 8
    assert terms(follower) == terms(leader) == LEADER_LOG + [8]
    assert follower.commit_index == leader.commit_index == 11
    # Fast backtracking: at most one refusal per divergent term, never one per entry.
    assert follower.counters.get("appends_refused", 0) <= 2


def test_figure_8_an_entry_of_an_earlier_term_on_a_majority_is_not_committed_by_counting():
    # (a)-(b): node 1 led term 2 and wrote (2, t2) alone; node 2 led term 3 and wrote (2, t3) alone.
    net = Net(3, append_entries_max=1, logs={1: [1, 2], 2: [1, 3], 3: [1]}, terms={1: 3, 2: 3, 3: 3})
    net.isolate(2)
    net.campaign(1)  # (c): node 1 leads term 4 with node 3's vote and brings node 3 up to (2, t2)
    deliver_until_node_3_matched_2(net)
    leader = net.nodes[1]
    assert leader.role is Role.LEADER and leader.term == 4
    assert leader.progress[3].match_index == 2  # (2, t2) is on a majority (nodes 1 and 3) ...
    assert leader.commit_index == 0  # ... and still not committed: it is not of term 4
    net.take()  # (d): node 1 fails before its no-op of term 4 reaches node 3
    net.crash(1)
    net.heal()
    net.run_for(3000)  # node 3's lease runs out; only node 2 can win (its log ends in a later term)
    assert net.nodes[2].role is Role.LEADER  # node 2 may lead (its log ends in term 3, after 3's term 2) ...
    assert net.nodes[3].log.term_at(2) == 3  # ... and replaces (2, t2), which nobody ever applied
    assert net.commands(3) == [b"i1-t1", b"i2-t3"]


def test_figure_8_the_no_op_of_the_current_term_commits_the_earlier_entry_with_it():
    net = Net(3, append_entries_max=1, logs={1: [1, 2], 2: [1, 3], 3: [1]}, terms={1: 3, 2: 3, 3: 3})
    net.isolate(2)
    net.campaign(1)
    net.deliver()
    assert net.nodes[1].commit_index == net.nodes[3].commit_index == 3  # (e): the no-op at 3 commits 1..3
    assert [net.nodes[3].log.term_at(index) for index in (1, 2, 3)] == [1, 2, 4]


def test_figure_8_with_the_rule_broken_the_checker_sees_a_committed_entry_lost(monkeypatch):
    monkeypatch.setattr(LeaderRules, "_may_commit", lambda self, index: True)
    net = Net(3, append_entries_max=1, logs={1: [1, 2], 2: [1, 3], 3: [1]}, terms={1: 3, 2: 3, 3: 3})
    net.isolate(2)
    net.campaign(1)
    deliver_until_node_3_matched_2(net)
    assert net.nodes[1].commit_index == 2  # counted on a majority, committed: the broken rule
    net.take()
    net.crash(1)
    net.heal()
    with pytest.raises(AssertionError, match="leader completeness|committed"):
        net.run_for(3000)


def test_a_follower_that_fell_behind_compaction_gets_the_snapshot():
    net = Net(3, snapshot_interval_entries=5, snapshot_trailing_entries=0)
    net.campaign(1)
    net.deliver()
    net.isolate(3)
    for number in range(12):
        net.propose(1, b"c%d" % number)
    net.deliver()
    leader = net.nodes[1]
    assert leader.log.snapshot is not None and leader.log.first_index > 2  # entries 1..2 are gone
    net.heal()
    net.run_for(200)
    follower = net.nodes[3]
    assert follower.counters["snapshots_installed"] == 1
    assert net.commands(3) == net.commands(1) == [b"c%d" % number for number in range(12)]
    assert follower.log.snapshot.index == leader.log.snapshot.index or follower.log.snapshot.index >= 5


def fall_behind_a_snapshot(net: Net, commands: list[bytes]) -> None:
    """Node 1 leads; node 3, cut off, misses `commands`, which node 1 compacts into a snapshot."""
    net.campaign(1)
    net.deliver()
    net.isolate(3)
    for command in commands:
        net.propose(1, command)
    net.deliver()
    assert net.nodes[1].log.snapshot is not None and net.nodes[1].log.first_index > 2


def test_a_snapshot_larger_than_a_chunk_reaches_the_follower_in_chunks_of_at_most_that_size():
    net = Net(3, snapshot_interval_entries=5, snapshot_trailing_entries=0, snapshot_chunk_bytes=32)
    fall_behind_a_snapshot(net, [b"command-%02d" % number for number in range(12)])
    net.heal()
    net.run_for(500)

    chunks = [message for _, message in net.sent if isinstance(message, RaftSnapshotRequest)]
    snapshot = net.nodes[1].log.snapshot_data
    assert len(snapshot) > 3 * 32 and len(chunks) >= len(snapshot) // 32
    assert all(len(chunk.data) <= 32 for chunk in chunks)
    assert net.nodes[3].counters["snapshots_installed"] == 1
    assert net.commands(3) == net.commands(1) == [b"command-%02d" % number for number in range(12)]


def test_a_chunk_that_does_not_follow_what_the_follower_holds_is_answered_with_what_it_holds():
    net = Net(3, snapshot_interval_entries=5, snapshot_trailing_entries=0, snapshot_chunk_bytes=64)
    fall_behind_a_snapshot(net, [b"command-%02d" % number for number in range(12)])
    follower = net.nodes[3]
    net.heal()
    net.take()

    net.step(3, RaftSnapshotRequest(source=1, destination=3, term=1, snapshot_index=12, snapshot_term=1,
                                    voters=[1, 2, 3], data=b"x" * 64, offset=128, done=False))
    [answer] = net.take(RaftAppendResponse)

    assert (answer.snapshot_index, answer.snapshot_offset) == (12, 0), "it holds nothing of that snapshot"
    assert follower.counters.get("snapshots_installed", 0) == 0


def test_a_repeated_answer_to_a_chunk_sends_the_next_chunk_once():
    """A duplicated answer (the network repeats messages) must not send every later chunk twice."""
    net = Net(3, snapshot_interval_entries=5, snapshot_trailing_entries=0, snapshot_chunk_bytes=32)
    fall_behind_a_snapshot(net, [b"command-%02d" % number for number in range(12)])
    net.heal()
    net.fire(1, HEARTBEAT_TIMER)
    [first] = [message for message in net.take(RaftSnapshotRequest) if message.destination == 3]
    net.take()
    net.step(3, first)
    [answer] = net.take(RaftAppendResponse)

    net.step(1, answer)
    net.step(1, answer)

    chunks = net.take(RaftSnapshotRequest)
    assert (answer.snapshot_offset, [chunk.offset for chunk in chunks]) == (32, [32])
    assert net.nodes[1].counters["stale_snapshot_chunk_answers"] == 1


def test_a_state_larger_than_one_message_is_still_compacted():
    """A snapshot used to travel in one message, so a state past 16 MiB was never snapshotted and
    the journal grew for as long as the state stayed that large."""
    net = Net(3, snapshot_interval_entries=5, snapshot_trailing_entries=0)
    fall_behind_a_snapshot(net, [bytes([number]) * 1_000_000 for number in range(25)])
    net.heal()
    net.run_for(2000)

    assert len(net.nodes[1].log.snapshot_data) > 16 * 2**20
    assert net.nodes[1].counters.get("snapshots_too_large", 0) == 0
    assert net.nodes[3].counters["snapshots_installed"] == 1
    assert net.commands(3) == net.commands(1)


def test_a_snapshot_the_follower_already_covers_only_moves_its_commit_index():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    for number in range(3):
        net.propose(1, b"c%d" % number)
    net.deliver()
    follower = net.nodes[2]
    net.step(2, RaftSnapshotRequest(source=1, destination=2, term=1, snapshot_index=2, snapshot_term=1,
                                    voters=[1, 2, 3], data=b"never restored"))
    assert follower.counters.get("snapshots_installed", 0) == 0
    assert [answer.match_index for answer in net.take(RaftAppendResponse)] == [follower.commit_index]


def test_late_duplicated_and_reordered_appends_never_cut_what_a_newer_append_brought():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    for number in range(3):
        net.propose(1, b"c%d" % number)
    appends = [message for message in net.take(RaftAppendRequest) if message.destination == 2]
    net.take()
    assert [message.prev_log_index for message in appends] == [1, 2, 3]  # pipelined, one entry each
    follower = net.nodes[2]
    net.step(2, appends[1])  # overtakes the first: refused, nothing cut
    assert follower.log.last_index == 1
    for message in (appends[0], appends[1], appends[2], appends[0], appends[1]):  # in order, then late copies
        net.step(2, message)
    assert [follower.log.entry(index).data for index in (2, 3, 4)] == [b"c0", b"c1", b"c2"]
    assert [answer.success for answer in net.take(RaftAppendResponse)] == [False, True, True, True, True, True]


def test_a_leader_that_asks_to_replace_a_committed_entry_is_never_obeyed():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    net.propose(1, b"c0")
    net.deliver()
    follower = net.nodes[2]
    assert follower.commit_index == 2
    below = RaftAppendRequest(source=3, destination=2, term=2, prev_log_index=1, prev_log_term=1,
                              entries=[RaftEntry(index=2, term=2, data=b"other")], leader_commit=2)
    follower.handle(below, b"", net.now_ns)  # a leader of term 2 that lacks committed entry 2: a broken peer
    disputed = RaftAppendRequest(source=3, destination=2, term=2, prev_log_index=2, prev_log_term=2,
                                 entries=[RaftEntry(index=3, term=2, data=b"other")], leader_commit=3)
    follower.handle(disputed, b"", net.now_ns)
    assert follower.log.entry(2).data == b"c0" and follower.log.last_index == 2 and follower.commit_index == 2
    assert follower.counters["protocol_violation_committed_entry_disputed"] == 1


def test_an_append_past_the_followers_log_is_refused_with_a_hint_at_its_end():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    net.step(2, RaftAppendRequest(source=1, destination=2, term=1, prev_log_index=9, prev_log_term=1))
    [answer] = net.take(RaftAppendResponse)
    assert (answer.success, answer.reject_index, answer.hint_index, answer.hint_term) == (False, 9, 1, 1)


def test_lost_appends_are_sent_again_after_a_heartbeat_interval():
    net = Net(3)
    net.campaign(1)
    net.deliver()
    for number in range(4):
        net.propose(1, b"c%d" % number)
    lost = [message for message in net.take(RaftAppendRequest) if message.destination == 3]
    assert lost
    net.run_for(300)
    assert net.commands(3) == [b"c%d" % number for number in range(4)]
    assert net.nodes[1].counters["appends_presumed_lost"] >= 1
