"""A Raft node's roles and the names of its timers (shared by the rule modules of actors/raft/)."""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"  # asking whether it could win, without raising its term
    CANDIDATE = "candidate"
    LEADER = "leader"  # the active controller


# Timer names all start with "raft/", so a controller embedding a RaftNode routes by prefix.
ELECTION_TIMER = "raft/election"  # followers and candidates: campaign when it fires past the deadline
HEARTBEAT_TIMER = "raft/heartbeat"  # the leader: heartbeats, retransmits, transfer timeout
QUORUM_TIMER = "raft/check-quorum"  # the leader: step down unless a majority answered since the last one
TIMERS = (ELECTION_TIMER, HEARTBEAT_TIMER, QUORUM_TIMER)
