"""Group coordination that survives the loss of a node: a quorum of group-coordinator voters.

Each node runs one `group-coordinator/<node>`: a Raft voter (actors/raft/) whose replicated state
machine is the group coordinator's key map — group membership and generations, committed offsets,
share-partition state and dead-letter bookkeeping — and which, only while it is the active voter,
runs an unchanged `GroupCoordinator` over that map. It is `Controller`'s machinery (actors/controller.py)
with another decider: a commit is acknowledged once the entry holding it is committed on a
majority of nodes, so losing any one node's processes and disk loses no acknowledged commit.

Why a quorum of its own, and not the controllers' log or Kafka's `__consumer_offsets` topic: the
controllers must stay off the message path (a share group's acquires and acknowledgements are
per-record traffic, which would slow the metadata quorum's heartbeats); an internal topic would
make group failover depend on partition leadership and on replaying a log into memory on each
failover. A separate small quorum reuses the one replication mechanism already proven here
(the same Raft code, the same simulator checks), fails over in an election timeout, and its
snapshot bounds recovery. The price is that all groups share one active voter; sharding groups
over several quorums (Kafka's per-partition coordinators) is left for later (docs/architecture.md).

A voter that is not active answers group requests `NOT_COORDINATOR` (Kafka's code: members then
find the group coordinator again through metadata), naming the active voter it knows of. The
active voter announces itself to the controller (`ServiceHeartbeat`), so metadata names it.
"""

from __future__ import annotations

from typing import Any

from actors.controller import Controller
from actors.errors import ErrorCode
from actors.messages import (
    DeleteGroupRequest, JoinGroupRequest, LeaveGroupRequest, OffsetCommitRequest, OffsetDeleteRequest,
    ShareAcknowledgeRequest, ShareAcquireRequest, ShareGroupHeartbeatRequest, SyncGroupRequest,
)
from actors.raft_messages import RaftMessage


class GroupQuorumVoter(Controller):
    REFUSAL = ErrorCode.NOT_COORDINATOR
    SERVES = "group coordination"
    # As for metadata: what the group coordinator answers from its working map (heartbeats, offset
    # fetches, share acquisitions) waits behind its last uncommitted proposal, so no member reads a
    # commit or a generation the quorum may yet lose. An answer whose proposal dies with this
    # voter's leadership is refused with NOT_COORDINATOR (Controller._refusals): the member asks
    # the next leader at once instead of waiting out its request timeout.
    HOLDS_READS = True

    # Members' requests that write, each an entry: BUSY past their share of the uncommitted log
    # (`controller_client_uncommitted_percent`), as the controller's clients' decisions are, so a
    # burst of commits never makes a proposal refused (that rebuilt the group coordinator and
    # answered every member NOT_COORDINATOR). Heartbeats of members already in are never refused
    # (their sessions would lapse), nor a follower's sync (it writes nothing): a member's write
    # refused BUSY is tried again after a backoff, the leader's sync in the same generation.
    CLIENT_WRITES = (OffsetCommitRequest, JoinGroupRequest, LeaveGroupRequest, DeleteGroupRequest,
                     OffsetDeleteRequest, ShareAcquireRequest, ShareAcknowledgeRequest)

    def client_write(self, message: Any) -> bool:
        if isinstance(message, SyncGroupRequest):
            return bool(message.assignments)  # the leader's: the generation's assignment is stored
        if isinstance(message, ShareGroupHeartbeatRequest):
            return not message.member_id  # a join
        return isinstance(message, self.CLIENT_WRITES)

    def needs_authentication(self, message: Any) -> bool:
        from actors.group_coordinator import CLUSTER_ANSWERS

        return isinstance(message, (RaftMessage, *CLUSTER_ANSWERS))
