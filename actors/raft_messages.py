"""The controller quorum's wire contract: Raft's messages, as msgspec Structs in one tagged union.

They are wire messages like any other (`RaftMessage` derives from `Message`: the `type` field
carries the class name, defaults are omitted, fields are keyword-only), part of the codec's union
and documented in docs/protocol.md. Controllers accept them only with the cluster's
authentication tag (transport/auth.py): a client cannot pose as a voter.

Every message names its sender and receiver by voter id (`source`, `destination`: a message
delivered to the wrong controller is dropped, not obeyed) and carries the sender's term. Numbers
that can never be negative are declared so, and the decoder refuses them before any actor sees
them. Replies echo what they answer (`reject_index`, `match_index`), never a correlation id: Raft
is idempotent per message and every response is judged by its term and indices alone.

Names follow the Raft paper (Ongaro & Ousterhout, 2014) with etcd-io/raft's additions:
pre-vote (`pre_vote`: a vote that changes nobody's term, thesis §9.6), the reject hint of fast
log backtracking, and `RaftTimeoutNow` for leadership transfer (thesis §3.10).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Union

import msgspec

from actors.messages import Message
from actors.wire_bounds import LONG, SHORT
from storage.raft_log import RaftEntry

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
VoterId = Annotated[int, msgspec.Meta(ge=1)]


class RaftMessage(Message, kw_only=True):
    """Base of every Raft message (not itself sent). `PAYLOAD_FIELDS` as in actors/messages.py."""

    ABSTRACT: ClassVar[bool] = True

    source: VoterId
    destination: VoterId
    term: NonNegative


# --------------------------------------------------------------------------- elections


class RaftVoteRequest(RaftMessage, kw_only=True):
    """A candidate asks for a vote (or, with `pre_vote`, whether it would get one at `term`)."""

    last_log_index: NonNegative
    last_log_term: NonNegative
    pre_vote: bool = False
    transfer: bool = False  # asked for by the old leader (RaftTimeoutNow): a leader lease does not apply


class RaftVoteResponse(RaftMessage, kw_only=True):
    """`term` is the request's term when granted, the voter's own term when refused."""

    granted: bool = False
    pre_vote: bool = False


class RaftTimeoutNow(RaftMessage, kw_only=True):
    """Leader -> an up-to-date follower: campaign now, skipping pre-vote (leadership transfer)."""


# --------------------------------------------------------------------------- replication


class RaftAppendRequest(RaftMessage, kw_only=True):
    """Entries after `prev_log_index` (empty: a heartbeat), and the leader's commit index."""

    prev_log_index: NonNegative
    prev_log_term: NonNegative
    entries: Annotated[list[RaftEntry], LONG] = []
    leader_commit: NonNegative = 0
    # The leader's next append comes within this many ms (0: the configured heartbeat interval):
    # longer while the quorum is quiet (RaftConfig.idle_heartbeat_interval_ms). A claim: the
    # follower never waits longer than its own configuration allows.
    heartbeat_ms: NonNegative = 0
    sequence: NonNegative = 0  # the leader's count of requests sent; the answer echoes it


class RaftAppendResponse(RaftMessage, kw_only=True):
    """The answer to an append or a snapshot. Success: the follower's log matches the leader's up
    to `match_index`. Refusal: `reject_index` is the `prev_log_index` refused; the hint is the
    largest index at or below it whose term is at most the leader's `prev_log_term`, with that term
    (etcd-io/raft's findConflictByTerm), so one round trip skips a whole divergent term."""

    success: bool = False
    match_index: NonNegative = 0
    reject_index: NonNegative = 0
    hint_index: NonNegative = 0
    hint_term: NonNegative = 0
    log_lost: bool = False  # a refusal from a voter that lost its log (docs/raft.md §7): forget its match
    sequence: NonNegative = 0  # the request's: the leader discards acknowledgements its lost log sent
    # The answer to a chunk of the snapshot at `snapshot_index` that did not complete it: the
    # follower holds that snapshot's first `snapshot_offset` bytes and wants the rest (0: none).
    snapshot_index: NonNegative = 0
    snapshot_offset: NonNegative = 0


class RaftSnapshotRequest(RaftMessage, kw_only=True):
    """The leader's snapshot, for a follower that needs entries the leader has compacted away,
    in chunks of at most `snapshot_chunk_bytes` (the Raft paper's InstallSnapshot: `data` is the
    snapshot's bytes from `offset`, and `done` says they are its last)."""

    PAYLOAD_FIELDS: ClassVar[tuple[str, ...]] = ("data",)

    snapshot_index: NonNegative
    snapshot_term: NonNegative
    voters: Annotated[list[VoterId], SHORT] = []
    data: bytes = b""
    sequence: NonNegative = 0  # as an append's
    offset: NonNegative = 0
    done: bool = True


RAFT_MESSAGE_TYPES: tuple[type[RaftMessage], ...] = (
    RaftVoteRequest, RaftVoteResponse, RaftTimeoutNow, RaftAppendRequest, RaftAppendResponse, RaftSnapshotRequest,
)
RaftWireMessage = Union[RAFT_MESSAGE_TYPES]  # type: ignore[valid-type]
