"""Raft for the controller quorum: a pure state machine (node.py) split by idea into election,
leader-side replication, follower-side replication and inbound checks, over the durable log of
storage/raft_log.py. docs/raft.md tells the whole story."""

from actors.raft.config import RaftConfig, RaftConfigError
from actors.raft.node import RaftNode
from actors.raft.roles import Role
from actors.raft.state_machine import NotController, ProposalRefused, Proposed, StateMachine

__all__ = ["RaftConfig", "RaftConfigError", "RaftNode", "Role", "NotController", "ProposalRefused", "Proposed",
           "StateMachine"]
