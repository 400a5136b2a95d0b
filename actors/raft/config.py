"""A controller's Raft configuration: who the voters are, its timeouts and its bounds.

The voter set is fixed from configuration (every controller is given the same `voters` map);
membership changes (Raft §6, joint consensus or one-at-a-time) are not supported yet, so a voter
can be replaced only by stopping the quorum. Every bound says why it has its value, units last,
as in actors/limits.py.
"""

from __future__ import annotations

import msgspec


class RaftConfigError(ValueError):
    """A configuration that cannot run safely (an even quorum is allowed but said so in docs)."""


class RaftConfig(msgspec.Struct, frozen=True, kw_only=True):
    node_id: int
    voters: dict[int, str]  # voter id -> endpoint (the same map on every voter)

    # --- time -----------------------------------------------------------------------------
    # A follower that hears nothing from a leader for a random time in [T, 2T) campaigns. With
    # T = 300 ms a killed controller is replaced in ~0.3-0.7 s, inside the 1 s target for
    # "first metadata change accepted again", and a loaded 2-core machine (tens of ms of
    # scheduling jitter) does not see false elections.
    election_timeout_ms: int = 300
    # Six heartbeats per minimum election timeout: one or two lost ones never start an election.
    heartbeat_interval_ms: int = 50
    # A quiet leader (every follower holds every entry and knows the commit index, for three
    # heartbeats in a row) heartbeats this often instead; 0 keeps it at heartbeat_interval_ms.
    # Every append names the interval until the next one (`heartbeat_ms`), and a follower waits
    # that long plus its usual slack before campaigning, so a quiet quorum costs a message per
    # voter per this interval, not per heartbeat. A proposal makes the leader fast at once. What
    # it costs: a leader that vanishes without closing its connections (a host lost, a cable cut)
    # is replaced up to this much later; one whose process dies is replaced sooner than before,
    # since the dropped connection (`PeerDisconnected`) makes its followers campaign at once.
    idle_heartbeat_interval_ms: int = 0

    # --- safety features (both on; off only to show what they prevent) --------------------
    pre_vote: bool = True  # thesis §9.6: a node that cannot win does not raise its term
    # A brand-new quorum (every log empty, term 0) would wait a whole election timeout before its
    # first election; with this, its lowest voter campaigns as soon as it starts (the others keep
    # their random timeouts, so a lowest voter that is not up yet costs nothing). Safety does not
    # depend on who campaigns when.
    campaign_at_first_start: bool = False
    check_quorum: bool = True  # a leader that cannot hear a majority steps down; followers keep a lease

    # --- bounds ---------------------------------------------------------------------------
    # One append carries at most this many entries and about this many bytes, so one slow
    # follower cannot make the leader build a message of the whole log.
    append_entries_max: int = 256
    append_bytes_max: int = 1024 * 1024
    # Appends with entries in flight to one follower before the leader waits for an answer
    # (etcd-io/raft's MaxInflightMsgs): pipelining on a good link, bounded memory on a bad one.
    inflight_appends_max: int = 16
    # Entries past the commit index the leader accepts before refusing proposals with BUSY
    # (etcd-io/raft's MaxUncommittedEntriesSize): a leader that cannot commit does not grow forever.
    uncommitted_entries_max: int = 4096
    # And bytes (etcd-io/raft's MaxUncommittedEntriesSize): 4,096 entries may be 4 GiB. A proposal
    # with nothing uncommitted goes whatever its size, as in etcd, or a step that large never could.
    uncommitted_bytes_max: int = 64 * 1024 * 1024
    # One metadata change is small; a proposal this large is a bug upstream.
    entry_bytes_max: int = 1024 * 1024
    # A snapshot is taken when this many entries were applied since the last one; the log then
    # keeps this many trailing entries so a follower slightly behind gets entries, not a snapshot.
    snapshot_interval_entries: int = 1024
    snapshot_trailing_entries: int = 128
    # ... or when the entries applied since the last one hold this many bytes, or as many as that
    # snapshot did, whichever is more (KRaft's metadata.log.max.record.bytes.between.snapshots,
    # 20 MiB): 1,024 entries of up to 1 MiB each let a voter hold ~1 GiB of log in memory and in
    # its journal. Growing with the snapshot keeps the cost of writing snapshots at most about
    # that of the log itself; what the log holds stays at most about the state's own size.
    snapshot_interval_bytes: int = 20 * 1024 * 1024
    snapshot_trailing_bytes: int = 4 * 1024 * 1024  # trailing entries stop at this many bytes too
    # A snapshot travels in chunks of this size (each one message, well within the codec's frame
    # limit), so its size is bounded only by what a voter holds in memory anyway: every state the
    # group coordinator's byte budgets admit (offsets, members, share groups) fits. A snapshot
    # that had to fit one message (16 MiB) left a larger state never compacted, and the journal
    # growing for as long as the state stayed that large.
    snapshot_chunk_bytes: int = 1024 * 1024
    snapshot_bytes_max: int = 1024 * 1024 * 1024

    def check(self) -> "RaftConfig":
        """Raise RaftConfigError naming the first thing that is wrong; return self."""
        if not self.voters:
            raise RaftConfigError("a quorum needs at least one voter")
        if any(voter < 1 for voter in self.voters):
            raise RaftConfigError(f"voter ids are >= 1 (0 means 'none'), got {sorted(self.voters)}")
        if self.node_id not in self.voters:
            raise RaftConfigError(f"node {self.node_id} is not one of the voters {sorted(self.voters)}")
        if self.heartbeat_interval_ms <= 0 or self.election_timeout_ms <= 2 * self.heartbeat_interval_ms:
            raise RaftConfigError(f"election_timeout_ms ({self.election_timeout_ms}) must exceed two heartbeat "
                                  f"intervals ({self.heartbeat_interval_ms} ms)")
        if self.idle_heartbeat_interval_ms and self.idle_heartbeat_interval_ms < self.heartbeat_interval_ms:
            raise RaftConfigError(f"idle_heartbeat_interval_ms ({self.idle_heartbeat_interval_ms}) must be 0 or at "
                                  f"least heartbeat_interval_ms ({self.heartbeat_interval_ms})")
        for name in ("append_entries_max", "append_bytes_max", "inflight_appends_max", "uncommitted_entries_max",
                     "uncommitted_bytes_max", "entry_bytes_max", "snapshot_interval_entries",
                     "snapshot_interval_bytes", "snapshot_chunk_bytes", "snapshot_bytes_max"):
            if getattr(self, name) < 1:
                raise RaftConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.snapshot_trailing_entries <= self.snapshot_interval_entries:
            raise RaftConfigError("snapshot_trailing_entries must be in [0, snapshot_interval_entries]")
        if not 0 <= self.snapshot_trailing_bytes <= self.snapshot_interval_bytes:
            raise RaftConfigError("snapshot_trailing_bytes must be in [0, snapshot_interval_bytes]")
        return self

    @property
    def slowest_heartbeat_ms(self) -> int:
        """The longest interval a leader of this configuration may announce."""
        return max(self.heartbeat_interval_ms, self.idle_heartbeat_interval_ms)

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    @property
    def peers(self) -> list[int]:
        """The other voters, in id order (never a set: iteration order must not depend on hashing)."""
        return sorted(voter for voter in self.voters if voter != self.node_id)
