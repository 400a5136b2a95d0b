"""A quiet quorum costs almost nothing, and a dead leader is still replaced at once.

With `idle_heartbeat_interval_ms`, a leader whose followers hold every entry and know the commit
index slows its heartbeats to that interval, and every append says when the next one will come
(`heartbeat_ms`): a follower waits that long plus the usual slack before it campaigns, and its
lease lasts as long, so check-quorum and pre-vote keep their meaning. A proposal, or a follower
that needs entries, makes the leader fast again at once. What the slow heartbeats would cost in
failover is won back from the transport: a dropped connection to the leader's process
(`PeerDisconnected`, which the kernel causes at once when a process dies) makes a follower
campaign within half an election timeout instead of waiting.

The attacks: an announced interval beyond the configured one (a voter's claim is capped by the
follower's own configuration), a disconnect while the leader is alive (pre-vote refuses it: no
term moves), a disconnect from a voter that does not lead (ignored), and a quiet leader cut off
from its followers (check-quorum still makes it step down).
"""

from __future__ import annotations

import pytest

from actors.messages import PeerDisconnected
from actors.raft import RaftConfig, RaftConfigError, Role
from actors.raft.roles import ELECTION_TIMER, HEARTBEAT_TIMER
from actors.raft_messages import RaftAppendRequest
from tests.unit.raft_harness import MS, Net, endpoint

TIMEOUT_MS = 300
HEARTBEAT_MS = 50
IDLE_MS = 1000


def quiet_net(**fields) -> Net:
    net = Net(3, election_timeout_ms=TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_MS,
              idle_heartbeat_interval_ms=IDLE_MS, **fields)
    net.campaign(1)
    net.run_for(2 * IDLE_MS)  # elected, the no-op committed everywhere, then quiet
    assert net.nodes[1].role is Role.LEADER
    return net


def appends_sent(net: Net, by: int = 1) -> int:
    return sum(1 for sender, message in net.sent if sender == by and isinstance(message, RaftAppendRequest))


def test_a_quiet_leader_heartbeats_at_the_idle_interval_and_nobody_campaigns():
    net = quiet_net()
    assert net.timers[1][HEARTBEAT_TIMER] - net.now_ns > HEARTBEAT_MS * MS
    before, term = appends_sent(net), net.nodes[1].term
    net.run_for(10_000)
    sent = appends_sent(net) - before
    assert sent <= 2 * (10_000 // IDLE_MS + 1), f"{sent} appends in 10 s of quiet"
    assert sent >= 2 * (10_000 // IDLE_MS - 1), "followers are still told the leader is alive"
    assert [raft.role for raft in net.nodes.values()] == [Role.LEADER, Role.FOLLOWER, Role.FOLLOWER]
    assert {raft.term for raft in net.nodes.values()} == {term}
    assert net.nodes[1].counters.get("check_quorum_step_downs", 0) == 0


def test_without_an_idle_interval_the_leader_heartbeats_at_its_interval():
    net = Net(3, election_timeout_ms=TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_MS)
    net.campaign(1)
    net.run_for(2 * IDLE_MS)
    before = appends_sent(net)
    net.run_for(1000)
    assert appends_sent(net) - before >= 2 * (1000 // HEARTBEAT_MS - 1)


def test_every_append_says_when_the_next_comes():
    net = quiet_net()
    net.sent.clear()
    net.run_for(IDLE_MS + 1)
    heartbeats = [message for sender, message in net.sent if isinstance(message, RaftAppendRequest)]
    assert heartbeats and {message.heartbeat_ms for message in heartbeats} == {IDLE_MS}
    net.sent.clear()
    net.propose(1, b"wake")
    net.deliver()
    appends = [message for sender, message in net.sent if isinstance(message, RaftAppendRequest)]
    assert appends and {message.heartbeat_ms for message in appends} == {HEARTBEAT_MS}


def test_a_proposal_wakes_a_quiet_leader_at_once():
    net = quiet_net()
    assert net.propose(1, b"wake").index
    net.deliver()
    assert net.commands(2)[-1] == b"wake" and net.commands(3)[-1] == b"wake"
    assert net.timers[1][HEARTBEAT_TIMER] - net.now_ns <= HEARTBEAT_MS * MS
    for follower in (2, 3):  # back to the fast timeout: a leader that dies now is missed soon
        assert net.nodes[follower].election_deadline_ns - net.now_ns < 2 * TIMEOUT_MS * MS


def test_followers_of_a_silent_quiet_leader_campaign_after_the_announced_interval():
    net = quiet_net()
    net.run_for(IDLE_MS // 2)
    heard = max(net.nodes[follower].last_leader_contact_ns for follower in (2, 3))
    net.crash(1)  # no disconnect: a host that vanished, a cut cable
    net.run_for((heard - net.now_ns) / MS + IDLE_MS + TIMEOUT_MS - HEARTBEAT_MS - 1)
    assert all(net.nodes[follower].leader_id == 1 for follower in (2, 3)), "nobody campaigns early"
    net.run_for(2 * TIMEOUT_MS + 100)
    assert any(net.nodes[follower].role is Role.LEADER for follower in (2, 3))


def test_a_dropped_connection_to_the_leader_elects_a_new_one_within_half_a_timeout():
    net = quiet_net()
    net.crash(1)
    for follower in (2, 3):
        net.step(follower, PeerDisconnected(endpoint=endpoint(1)))
    net.run_for(TIMEOUT_MS / 2 + 10)
    assert any(net.nodes[follower].role is Role.LEADER for follower in (2, 3))
    assert net.nodes[2].counters.get("leader_disconnected") == 1


def test_a_dropped_connection_to_a_live_leader_deposes_nobody():
    net = quiet_net()
    term = net.nodes[1].term
    net.step(2, PeerDisconnected(endpoint=endpoint(1)))  # the connection flapped; the leader is fine
    net.run_for(3 * IDLE_MS)
    assert net.nodes[1].role is Role.LEADER and net.nodes[3].leader_id == 1
    assert {raft.term for raft in net.nodes.values()} == {term}, "pre-vote kept every term"
    assert net.nodes[2].leader_id == 1, "the next heartbeat restored the follower"


def test_a_dropped_connection_to_a_voter_that_does_not_lead_changes_nothing():
    net = quiet_net()
    deadline = net.nodes[2].election_deadline_ns
    net.step(2, PeerDisconnected(endpoint=endpoint(3)))
    net.step(1, PeerDisconnected(endpoint=endpoint(2)))
    net.step(2, PeerDisconnected(endpoint="tcp://somewhere-else"))
    assert net.nodes[2].election_deadline_ns == deadline and net.nodes[2].leader_id == 1
    assert net.nodes[1].role is Role.LEADER
    assert ELECTION_TIMER not in net.timers[1]


def test_a_quiet_leader_cut_off_from_its_followers_steps_down():
    net = quiet_net()
    net.isolate(1)
    net.run_for(2 * (IDLE_MS + TIMEOUT_MS) + HEARTBEAT_MS)
    assert net.nodes[1].role is not Role.LEADER
    assert any(net.nodes[follower].role is Role.LEADER for follower in (2, 3))


def test_an_announced_interval_beyond_the_configured_one_is_capped():
    net = quiet_net()
    leader = net.nodes[1]
    net.step(2, RaftAppendRequest(source=1, destination=2, term=leader.term, prev_log_index=leader.log.last_index,
                                  prev_log_term=leader.log.last_term, leader_commit=leader.commit_index,
                                  heartbeat_ms=10 ** 9))
    assert net.nodes[2].election_deadline_ns - net.now_ns < (IDLE_MS + 2 * TIMEOUT_MS) * MS


def test_an_idle_interval_shorter_than_the_heartbeat_interval_is_refused():
    with pytest.raises(RaftConfigError, match="idle_heartbeat_interval_ms"):
        RaftConfig(node_id=1, voters={1: "a"}, heartbeat_interval_ms=50, idle_heartbeat_interval_ms=40).check()
