"""The leader's side of log replication: appends, snapshots, heartbeats, the commit rule.

Rules:

- Commit (Raft §5.3, §5.4.2): an index is committed when a majority's logs match the leader's up
  to it *and* the entry there is of the leader's current term. An entry of an earlier term is
  never committed by counting replicas (Figure 8: a majority can hold it and a later leader still
  overwrite it); it becomes committed only through a later entry of the current term, which is
  why every new leader appends a no-op first.
- The leader's own log counts as matching up to its last index. That is sound because no
  follower can acknowledge an entry before the leader's flush: the appends carrying it are
  released only after the flush, so a majority of acknowledgements implies the leader's copy too.
- Followers are tracked in `Progress` (probe / replicate / snapshot, see progress.py). Refusals
  walk back by term with the follower's hint (fast backtracking): one round trip per divergent
  term, not per entry. A follower that needs compacted entries gets the snapshot.
- Check-quorum: every minimum election timeout the leader counts the followers it heard from
  since the last count; without a majority it steps down, so an isolated leader stops accepting
  proposals it could never commit and the majority side's lease can expire and elect.
- Quiet: with an idle interval configured, a leader whose followers all hold every entry and know
  the commit index for `QUIET_ROUNDS` heartbeats in a row heartbeats at the idle interval; every
  append names the interval until the next (`heartbeat_ms`), and the check-quorum count waits a
  whole idle round more, so it still counts answers. Anything to replicate (a proposal, a
  follower that needs entries or a snapshot, a transfer) makes it fast again first (`_wake`), so
  the appends that carry it announce the fast interval.
"""

from __future__ import annotations

from actors.raft.config import RaftConfig
from actors.raft.progress import Progress, ReplicationState, quorum_index
from actors.raft.roles import HEARTBEAT_TIMER, QUORUM_TIMER, Role
from actors.raft_messages import RaftAppendRequest, RaftAppendResponse, RaftSnapshotRequest

QUIET_ROUNDS = 3  # heartbeats with nothing to replicate before a leader slows down


class LeaderRules:
    """Mixed into RaftNode; only called while the node leads."""

    config: RaftConfig
    progress: dict[int, Progress]

    # ------------------------------------------------------------------ sending

    def _broadcast_append(self, now_ns: int) -> None:
        for peer in self.config.peers:
            self._send_append(peer, now_ns)

    def _broadcast_commit(self, now_ns: int) -> None:
        """Tell every follower the new commit index: with its next entries when it has some
        pending; with a heartbeat when it has everything; not at all while appends are in
        flight to it (their answers bring it up to date, see `_tell_commit`)."""
        for peer in self.config.peers:
            progress = self.progress[peer]
            if progress.state is not ReplicationState.REPLICATE or progress.next_index <= self.log.last_index:
                self._send_append(peer, now_ns)
            elif not progress.inflight:
                self._tell_commit(peer, progress, now_ns)

    def _tell_commit(self, peer: int, progress: Progress, now_ns: int) -> None:
        """A heartbeat, if the follower holds committed entries it was not told are committed.
        (Never an append that asks nothing new: its answer would ping-pong.)"""
        if progress.commit_told < min(self.commit_index, progress.match_index):
            self._send_heartbeat(peer, progress, now_ns)

    def _wake(self, now_ns: int) -> None:
        """There is something to replicate: heartbeat at the fast interval again, from now."""
        self._quiet_rounds = 0
        if self.idle:
            self.idle = False
            self._set_timer(HEARTBEAT_TIMER, now_ns + self._heartbeat_ns)

    def _next_sequence(self) -> int:
        """Numbers every append and snapshot this node sends, so an answer says which it answers."""
        self.sequence_sent += 1
        return self.sequence_sent

    def _announced_ms(self) -> int:
        config = self.config
        return config.idle_heartbeat_interval_ms if self.idle else config.heartbeat_interval_ms

    def _send_append(self, peer: int, now_ns: int) -> None:
        """Send what `peer` needs next, unless its progress says to wait or it has everything."""
        progress = self.progress[peer]
        if progress.paused(self.config.inflight_appends_max):
            return
        has_entries = progress.next_index <= self.log.last_index
        if not has_entries and progress.state is ReplicationState.REPLICATE:
            return
        self._wake(now_ns)
        previous = progress.next_index - 1
        previous_term = self.log.term_at(previous)
        if previous_term is None or (has_entries and progress.next_index < self.log.first_index):
            self._send_snapshot(peer, progress, now_ns)
            return
        entries = []
        if has_entries:
            config = self.config
            entries = self.log.entries(progress.next_index, config.append_entries_max, config.append_bytes_max)
        self._send(peer, RaftAppendRequest(source=self.id, destination=peer, term=self.term, prev_log_index=previous,
                                           prev_log_term=previous_term, entries=entries,
                                           leader_commit=self.commit_index, heartbeat_ms=self._announced_ms(),
                                           sequence=self._next_sequence()))
        progress.told(self.commit_index, entries[-1].index if entries else previous)
        if entries:
            progress.sent(entries[-1].index, self.config.inflight_appends_max)
        else:
            progress.probe_sent = True

    def _send_heartbeat(self, peer: int, progress: Progress, now_ns: int) -> None:
        """An empty append at the follower's match index: it carries the commit index and
        proves the leader alive without asking anything the follower may not have yet."""
        previous_term = self.log.term_at(progress.match_index)
        if previous_term is None:
            progress.become_probe()
            self._send_snapshot(peer, progress, now_ns)
            return
        self._send(peer, RaftAppendRequest(source=self.id, destination=peer, term=self.term,
                                           prev_log_index=progress.match_index, prev_log_term=previous_term,
                                           leader_commit=self.commit_index, heartbeat_ms=self._announced_ms(),
                                           sequence=self._next_sequence()))
        progress.told(self.commit_index, progress.match_index)

    def _send_snapshot(self, peer: int, progress: Progress, now_ns: int, offset: int = 0) -> None:
        """The chunk of the snapshot from `offset` (the follower answers each chunk but the last
        with how much it holds, and gets the next)."""
        snapshot = self.log.snapshot
        assert snapshot is not None, f"entry {progress.next_index - 1} is compacted but there is no snapshot"
        self._wake(now_ns)
        progress.become_snapshot(snapshot.index, now_ns)
        data = self.log.snapshot_data
        end = min(len(data), offset + self.config.snapshot_chunk_bytes)
        self._count("snapshots_sent" if offset == 0 else "snapshot_chunks_sent")
        progress.snapshot_sequence = self._next_sequence()
        self._send(peer, RaftSnapshotRequest(source=self.id, destination=peer, term=self.term,
                                             snapshot_index=snapshot.index, snapshot_term=snapshot.term,
                                             voters=list(snapshot.voters), data=data[offset:end],
                                             sequence=progress.snapshot_sequence, offset=offset,
                                             done=end == len(data)))

    def _on_snapshot_chunk_answer(self, peer: int, progress: Progress, response: RaftAppendResponse,
                                  now_ns: int) -> None:
        """The follower holds the first `snapshot_offset` bytes of a snapshot: the next chunk, if
        this answers the last chunk sent (a duplicated or late answer would send a chunk twice)
        of the snapshot it is being sent (else the snapshot was replaced by a newer one: that one
        from its start)."""
        snapshot = self.log.snapshot
        if progress.state is not ReplicationState.SNAPSHOT or snapshot is None \
                or response.snapshot_index != progress.snapshot_index \
                or response.sequence != progress.snapshot_sequence or response.sequence < progress.acks_from:
            self._count("stale_snapshot_chunk_answers")
            return
        if snapshot.index != response.snapshot_index:
            self._send_snapshot(peer, progress, now_ns)
            return
        if response.snapshot_offset >= len(self.log.snapshot_data):
            self._count("stale_snapshot_chunk_answers")
            return
        self._send_snapshot(peer, progress, now_ns, response.snapshot_offset)

    # ------------------------------------------------------------------ answers

    def _on_append_response(self, response: RaftAppendResponse, now_ns: int) -> None:
        if self.role is not Role.LEADER:
            self._count("stale_append_responses")
            return
        peer = response.source
        progress = self.progress[peer]
        progress.recent_active = True
        if response.snapshot_index:
            self._on_snapshot_chunk_answer(peer, progress, response, now_ns)
            return
        if not response.success:
            self._on_append_refused(peer, progress, response, now_ns)
            return
        if response.match_index > self.log.last_index:
            self._count("dropped_match_past_log_end")
            return
        if response.sequence < progress.acks_from:
            self._count("acks_void_after_log_lost")  # sent by the log the follower has since lost
            return
        if progress.matched(response.match_index):
            self._maybe_commit(now_ns)
        self._continue_transfer(peer, now_ns)
        self._send_append(peer, now_ns)
        if progress.state is ReplicationState.REPLICATE and not progress.inflight:
            self._tell_commit(peer, progress, now_ns)

    def _on_append_refused(self, peer: int, progress: Progress, response: RaftAppendResponse, now_ns: int) -> None:
        if response.log_lost and response.reject_index <= progress.match_index:
            # A voter whose disk was wiped: what it acknowledged is gone. Its match index goes
            # back to what it holds (the commit index never does), and it is repaired from there.
            self._count("follower_logs_lost")
            progress.forget_match(response.hint_index, self.sequence_sent + 1)
        if progress.state is ReplicationState.REPLICATE:
            if response.reject_index <= progress.match_index:
                self._count("stale_append_refusals")
                return
            progress.become_probe()
        elif progress.state is ReplicationState.PROBE:
            if response.reject_index != progress.next_index - 1:
                self._count("stale_append_refusals")
                return
        else:
            self._count("stale_append_refusals")
            return
        probe = response.hint_index
        if response.hint_term > 0:
            probe = self._last_index_with_term_at_most(response.hint_index, response.hint_term)
        progress.next_index = max(min(response.reject_index, probe + 1), progress.match_index + 1)
        progress.probe_sent = False
        self._send_append(peer, now_ns)

    def _last_index_with_term_at_most(self, index: int, term: int) -> int:
        """The largest index <= `index` whose entry's term is <= `term` (or where the log's known
        terms end: below that, the follower needs the snapshot)."""
        index = min(index, self.log.last_index)
        while index > 0:
            held = self.log.term_at(index)
            if held is None or held <= term:
                return index
            index -= 1
        return 0

    # ------------------------------------------------------------------ commit

    def _maybe_commit(self, now_ns: int) -> None:
        indices = [self.log.last_index] + [self.progress[peer].match_index for peer in self.config.peers]
        candidate = quorum_index(indices, self.config.quorum)
        if candidate > self.commit_index and self._may_commit(candidate):
            self._commit_to(candidate)
            self._broadcast_commit(now_ns)

    def _may_commit(self, index: int) -> bool:
        """§5.4.2: count replicas only for an entry of the current term."""
        return self.log.term_at(index) == self.term

    # ------------------------------------------------------------------ timers

    def _quiet(self) -> bool:
        """Nothing to replicate: every follower holds every entry and knows the commit index."""
        last, commit = self.log.last_index, self.commit_index
        return not self.transfer_target and all(
            progress.state is ReplicationState.REPLICATE and not progress.inflight
            and progress.match_index == last and progress.commit_told >= commit
            for progress in self.progress.values())

    def _on_heartbeat_timer(self, now_ns: int) -> None:
        if self.transfer_target and now_ns >= self.transfer_deadline_ns:
            self._count("transfers_abandoned")
            self.transfer_target = 0
        if self._idle_heartbeat_ns:
            self._quiet_rounds = self._quiet_rounds + 1 if self._quiet() else 0
            if self._quiet_rounds >= QUIET_ROUNDS and not self.idle:
                self.idle = True
                self._count("quiet_periods")
                # The next check-quorum count covers a whole idle round and its answers.
                self._set_timer(QUORUM_TIMER, now_ns + self._idle_heartbeat_ns + self._election_timeout_ns)
            elif self._quiet_rounds < QUIET_ROUNDS:
                self.idle = False
        for peer in self.config.peers:
            progress = self.progress[peer]
            if progress.state is ReplicationState.REPLICATE and progress.inflight \
                    and progress.match_index == progress.match_at_last_heartbeat:
                self._count("appends_presumed_lost")
                progress.become_probe()
            elif progress.state is ReplicationState.SNAPSHOT \
                    and now_ns - progress.snapshot_sent_ns >= self._election_timeout_ns:
                self._count("snapshots_presumed_lost")
                progress.become_probe()
            progress.match_at_last_heartbeat = progress.match_index
            if progress.state is ReplicationState.PROBE:
                progress.probe_sent = False
                self._send_append(peer, now_ns)
            elif progress.state is ReplicationState.REPLICATE:
                if progress.paused(self.config.inflight_appends_max) or progress.next_index > self.log.last_index:
                    self._send_heartbeat(peer, progress, now_ns)
                else:
                    self._send_append(peer, now_ns)
        self._set_timer(HEARTBEAT_TIMER, now_ns + (self._idle_heartbeat_ns if self.idle else self._heartbeat_ns))

    def _on_quorum_timer(self, now_ns: int) -> None:
        active = 1 + sum(1 for peer in self.config.peers if self.progress[peer].recent_active)
        for peer in self.config.peers:
            self.progress[peer].recent_active = False
        if active < self.config.quorum:
            self._count("check_quorum_step_downs")
            self._become_follower(self.term, 0, now_ns)
            return
        self._set_timer(QUORUM_TIMER, now_ns + self._election_timeout_ns
                        + (self._idle_heartbeat_ns if self.idle else 0))
