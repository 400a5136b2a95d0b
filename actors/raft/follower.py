"""The follower's side of replication: accepting appends and snapshots from the current leader.

Rules (Raft §5.3, §7):

- An append is accepted only if the follower's log holds `prev_log_index` with `prev_log_term`
  (the consistency check that gives the Log Matching property). Otherwise it is refused with a
  hint: the largest index at or below the refused one whose term is at most the leader's
  `prev_log_term`, with that term, so the leader skips a whole divergent term at once.
- Entries the log already holds with the same term are left alone (a late or duplicated append
  must never cut entries a newer append brought); from the first entry whose term differs, the
  follower's suffix is replaced. A committed entry is never replaced: an append reaching below
  the commit index is answered with the commit index and changes nothing, and a leader whose
  entry at the commit index differs from ours breaks Raft's guarantees: refused, counted, traced.
- The follower's commit index moves to min(leader_commit, last index of this append), never past
  what this leader has shown it to hold.
- A snapshot replaces the log (and the state machine) unless the log already holds its last
  entry with the same term, in which case only the commit index moves and later entries stay.
  It comes in chunks: each must continue what this follower holds of the same snapshot from the
  same leader and term (else it is answered with how much it holds, and the leader goes on from
  there); the snapshot is installed once its last chunk arrived, and never grows past
  `snapshot_bytes_max` in memory.
"""

from __future__ import annotations

from actors.actor import MS
from actors.effects import Trace
from actors.raft.config import RaftConfig
from actors.raft.roles import Role
from actors.raft_messages import RaftAppendRequest, RaftAppendResponse, RaftSnapshotRequest
from storage.raft_log import SnapshotMeta


class FollowerRules:
    """Mixed into RaftNode; called for appends and snapshots of the node's current term."""

    config: RaftConfig

    def _follow(self, leader: int, now_ns: int, heartbeat_ms: int = 0) -> bool:
        """Accept `leader` as this term's leader; False when this node leads the same term
        itself (two leaders in one term: a peer broke Raft; never obey it). `heartbeat_ms` is
        when the leader said its next append comes: the election deadline and the lease stretch
        by whatever that exceeds the configured heartbeat interval, and never by more than this
        node's own configuration allows."""
        if self.role is Role.LEADER:
            self._count("protocol_violation_two_leaders")
            self._early.append(Trace("raft_protocol_violation", {
                "node": self.id, "term": self.term, "other_leader": leader}))
            return False
        if self.role is not Role.FOLLOWER or self.leader_id != leader:
            self._become_follower(self.term, leader, now_ns)
        config = self.config
        announced = min(heartbeat_ms, config.slowest_heartbeat_ms) if heartbeat_ms else config.heartbeat_interval_ms
        self._lease_extra_ns = max(0, announced - config.heartbeat_interval_ms) * MS
        self.last_leader_contact_ns = now_ns
        self._reset_election_deadline(now_ns, self._lease_extra_ns)
        return True

    def _on_append_request(self, request: RaftAppendRequest, now_ns: int) -> None:
        if not self._follow(request.source, now_ns, request.heartbeat_ms):
            return
        if request.prev_log_index < self.commit_index:
            # An old append (reordered or duplicated): all it could say is already committed here.
            self._answer_append(request, success=True, match_index=self.commit_index)
            return
        if self.log.term_at(request.prev_log_index) != request.prev_log_term:
            self._refuse_append(request)
            return
        entries = request.entries
        for position, entry in enumerate(entries):  # all past prev_log_index >= commit_index
            if self.log.term_at(entry.index) != entry.term:
                self.log.append(entries[position:])
                break
        last_new = request.prev_log_index + len(entries)
        commit = min(request.leader_commit, last_new)
        if commit > self.commit_index:
            self._commit_to(commit)
        self._answer_append(request, success=True, match_index=last_new)

    def _refuse_append(self, request: RaftAppendRequest) -> None:
        if request.prev_log_index <= self.commit_index and not self.rejoining:
            # The leader's entry at our commit index differs from the one we committed.
            self._count("protocol_violation_committed_entry_disputed")
            self._early.append(Trace("raft_protocol_violation", {
                "node": self.id, "term": self.term, "leader": request.source, "index": request.prev_log_index}))
        index = min(request.prev_log_index, self.log.last_index)
        # Entries at or below the commit index match every leader's (Leader Completeness), so the
        # walk back stops there; the known terms stop at the snapshot anyway.
        while index > self.commit_index:
            held = self.log.term_at(index)
            if held is None or held <= request.prev_log_term:
                break
            index -= 1
        self._count("appends_refused")
        self._answer_append(request, success=False, reject_index=request.prev_log_index,
                            hint_index=index, hint_term=self.log.term_at(index) or 0, log_lost=self.rejoining)

    def _assemble_snapshot(self, request: RaftSnapshotRequest) -> bytes | None:
        """The whole snapshot once `request` brought its last chunk; None until then (the chunk
        is kept if it continues what is held, and answered with how much is held)."""
        if request.offset == 0 and request.done:
            self._snapshot_chunks = None
            return bytes(request.data)
        which = (request.source, request.term, request.snapshot_index, request.snapshot_term)
        held = self._snapshot_chunks
        if request.offset == 0:
            held = self._snapshot_chunks = (which, bytearray())
        if held is None or held[0] != which or request.offset != len(held[1]):
            self._count("snapshot_chunks_out_of_place")
            self._answer_append(request, snapshot_index=request.snapshot_index,
                                snapshot_offset=len(held[1]) if held is not None and held[0] == which else 0)
            return None
        held[1].extend(request.data)
        if not request.done:
            self._answer_append(request, snapshot_index=request.snapshot_index, snapshot_offset=len(held[1]))
            return None
        self._snapshot_chunks = None
        return bytes(held[1])

    def _answer_append(self, request: RaftAppendRequest | RaftSnapshotRequest, **fields) -> None:
        leader = request.source
        self._send(leader, RaftAppendResponse(source=self.id, destination=leader, term=self.term,
                                              sequence=request.sequence, **fields))

    def _on_snapshot_request(self, request: RaftSnapshotRequest, now_ns: int) -> None:
        if not self._follow(request.source, now_ns):
            return
        index = request.snapshot_index
        if index <= self.commit_index:
            self._answer_append(request, success=True, match_index=self.commit_index)
            return
        if self.log.term_at(index) == request.snapshot_term:
            self._commit_to(index)
            self._answer_append(request, success=True, match_index=index)
            return
        if sorted(request.voters) != sorted(self.config.voters):
            self._count("dropped_snapshot_of_other_voters")
            return
        data = self._assemble_snapshot(request)
        if data is None:
            return
        meta = SnapshotMeta(index=index, term=request.snapshot_term, voters=sorted(request.voters))
        self.log.install_snapshot(meta, data)
        self.state_machine.restore(data, index)
        self.commit_index = self.applied_index = index
        self.applied_bytes = 0
        self._count("snapshots_installed")
        self._early.append(Trace("raft_snapshot_installed", {"node": self.id, "index": index,
                                                             "term": request.snapshot_term}))
        self._answer_append(request, success=True, match_index=index)
