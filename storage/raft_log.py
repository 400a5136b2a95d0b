"""The durable Raft log of one controller: entries, hard state (term, vote, commit) and a snapshot.

What it owns: two files in one directory.

- `raft.log`, an append-only journal: two 64-byte header slots, then records
  `length u32 | crc32(body) u32 | body = msgpack RaftEntry`. Records are never rewritten in place:
  removing a divergent suffix (Raft's conflict truncation) is an entry whose index is at or below
  the last one, and replay drops everything from that index on before appending it. The file is
  rewritten whole (temporary file, fsync, rename, directory fsync) only when a snapshot lets the
  prefix go.
- `raft.snapshot`, replaced atomically the same way: `magic u32 | crc32 u32 | length u64 | body`
  with body = msgpack [index, term, voters, data].

The hard state lives in the header slots beside the journal length it covers, and so does the
*rejoining* mark of a voter that lost its log (docs/raft.md §7): it is created with the journal
that replaces a lost one, and lost only with it. `flush()` writes the new records and slot A in
one fdatasync, then slot B (a copy of A) in a second one, so on open: both slots equal means that
flush completed and every byte below its length is durable; A one sequence ahead of B means a
flush was cut short, and B (the last completed flush) is the truth while the bytes past B's length
are an unconfirmed tail; one slot unreadable means the other one stands (a torn slot write, or one
rotten sector). A record failing its checks below the confirmed
length is damage and raises `CorruptRaftLog`; past it, the first bad record and everything after
are cut (a torn tail) and counted in `recovery`. Nothing flushed is ever silently dropped.

Invariants: entries are contiguous from `first_index` to `last_index`; an index at or below the
commit index is never replaced; the snapshot, when there is one, agrees with the log at its index
(same term); `needs_flush` is true whenever the term, the vote, an entry or the rejoining mark
changed since the last flush (the commit index rides along with the next flush but never asks for
one, as etcd's HardState.Commit does not: it can be recomputed from a leader).
"""

from __future__ import annotations

import posixpath
from typing import Iterable

from storage.errors import FsyncFailed, LogClosed
from storage.fs import FileHandle, FileSystem, OsFileSystem
from storage.raft_log_opening import RaftLogOpening
from storage.raft_records import (  # noqa: F401 (the names callers use come from here)
    ENTRY_COMMAND, ENTRY_NOOP, HEADER_BYTES, LOG_NAME, SLOT_BYTES, SNAPSHOT_FILE_BYTES_MAX, SNAPSHOT_NAME,
    CorruptRaftLog, CorruptRaftSnapshot,
    HardState, RaftEntry, RaftLogRecovery, SnapshotMeta, Slot, choose_slot, count_records, decode_snapshot,
    encode_entry_record, encode_slot, encode_snapshot, parse_record, rejoining_on_disk,
)


class RaftLog(RaftLogOpening):
    """Open with `RaftLog.open(directory, fs=...)`; see the module docstring for the rules."""

    def __init__(self, fs: FileSystem, directory: str) -> None:
        self._fs = fs
        self.directory = directory
        self._log_path = posixpath.join(directory, LOG_NAME)
        self._snapshot_path = posixpath.join(directory, SNAPSHOT_NAME)
        self._handle: FileHandle | None = None
        self._entries: list[RaftEntry] = []
        # A running total of data bytes through each entry of _entries, so `data_bytes` of any span
        # is one subtraction: a leader counts its uncommitted bytes at every proposal, and summing
        # them entry by entry made a burst of n proposals read n**2 / 2 entries.
        self._data_ends: list[int] = []
        self._base = 1  # the index _entries[0] has (or would have)
        self._term = 0
        self._vote = 0
        self._commit = 0
        self._rejoining = False
        self._sequence = 0
        self._dirty = False
        self._flushed_commit = 0
        self._closed_reason: str | None = None
        self.snapshot: SnapshotMeta | None = None
        self._snapshot_data = b""
        self._pending_snapshot: tuple[SnapshotMeta, bytes] | None = None
        self.recovery = RaftLogRecovery()
        # The lowest index written since an observer last reset it (the simulator checks only
        # what changed); it never affects what is stored.
        self.written_from = 1 << 62

    @classmethod
    def open(cls, directory: str, *, fs: FileSystem | None = None,
             rejoining_if_created: bool = False) -> "RaftLog":
        """The log in `directory`; a journal created now (there was none) carries the rejoining
        mark from its first byte when `rejoining_if_created`, so no crash can leave it unmarked."""
        log = cls(fs if fs is not None else OsFileSystem(), directory)
        log._recover(rejoining_if_created)
        return log

    # ------------------------------------------------------------------ reading

    @property
    def first_index(self) -> int:
        return self._base

    @property
    def last_index(self) -> int:
        return self._base + len(self._entries) - 1

    @property
    def last_term(self) -> int:
        return self.term_at(self.last_index) or 0

    @property
    def hard_state(self) -> HardState:
        return HardState(self._term, self._vote, self._commit)

    @property
    def rejoining(self) -> bool:
        """Whether this voter's log was lost while its quorum had formed and it has not yet been
        caught up: it must neither vote nor campaign (actors/raft/node.py)."""
        return self._rejoining

    def set_rejoining(self, rejoining: bool) -> None:
        """Set or clear the mark; durable with the next flush (until then a restart still finds
        it set, which only keeps the voter waiting longer)."""
        if rejoining != self._rejoining:
            self._check_open()
            self._rejoining = rejoining
            self._dirty = True

    @property
    def needs_flush(self) -> bool:
        return self._dirty

    @property
    def snapshot_data(self) -> bytes:
        return self._snapshot_data

    def term_at(self, index: int) -> int | None:
        """The term of entry `index`; None when it is compacted away or not there."""
        offset = index - self._base
        if 0 <= offset < len(self._entries):
            return self._entries[offset].term
        if index == 0:
            return 0
        snapshot = self.snapshot
        if snapshot is not None and index == snapshot.index:
            return snapshot.term
        return None

    def entry(self, index: int) -> RaftEntry:
        offset = index - self._base
        if not 0 <= offset < len(self._entries):
            raise IndexError(f"entry {index} is outside [{self._base}, {self.last_index}]")
        return self._entries[offset]

    def data_bytes(self, first: int, last: int) -> int:
        """The bytes of data the entries `first`..`last` (those held) carry."""
        low, high = max(first - self._base, 0), min(max(last - self._base + 1, 0), len(self._entries))
        if high <= low:
            return 0
        before = self._data_ends[low - 1] if low else self._data_ends[0] - len(self._entries[0].data)
        return self._data_ends[high - 1] - before

    def _truncate_from(self, position: int) -> None:
        del self._entries[position:]
        del self._data_ends[position:]

    def _extend(self, entries: list[RaftEntry]) -> None:
        total = self._data_ends[-1] if self._data_ends else 0
        for entry in entries:
            total += len(entry.data)
            self._data_ends.append(total)
        self._entries.extend(entries)

    def entries(self, start: int, count_max: int, bytes_max: int) -> list[RaftEntry]:
        """Entries from `start` on: at most `count_max`, and `bytes_max` of data (at least one)."""
        offset = start - self._base
        if offset < 0:
            raise IndexError(f"entry {start} is compacted (the log starts at {self._base})")
        found = self._entries[offset: offset + count_max]
        total = 0
        for position, entry in enumerate(found):
            total += len(entry.data) + 16
            if total > bytes_max and position:
                return found[:position]
        return found

    # ------------------------------------------------------------------ writing

    def append(self, entries: Iterable[RaftEntry]) -> None:
        """Append, first dropping any entries from the first new index on (a divergent suffix)."""
        entries = list(entries)
        if not entries:
            return
        self._check_open()
        first = entries[0].index
        assert self._base <= first <= self.last_index + 1, (
            f"append at {first} outside [{self._base}, {self.last_index + 1}]")
        assert first > self._commit, f"append at {first} would replace committed entries (commit {self._commit})"
        for previous, entry in zip(entries, entries[1:]):
            assert entry.index == previous.index + 1 and entry.term >= previous.term, f"{previous} then {entry}"
        self._handle.append(b"".join(encode_entry_record(entry) for entry in entries))
        self._truncate_from(first - self._base)
        self._extend(entries)
        self._dirty = True
        if first < self.written_from:
            self.written_from = first

    def set_hard_state(self, term: int, vote: int) -> None:
        assert term >= self._term, f"term moves back from {self._term} to {term}"
        if (term, vote) != (self._term, self._vote):
            self._check_open()
            self._term, self._vote = term, vote
            self._dirty = True

    def set_commit(self, commit: int) -> None:
        """Remember the commit index; it is written with the next flush but never needs one."""
        assert self._commit <= commit <= self.last_index, f"commit {commit} outside [{self._commit}, {self.last_index}]"
        self._commit = commit

    def flush(self) -> None:
        """Make every change so far durable: records and slot A in one fdatasync, slot B in a second."""
        self._check_open()
        if not self._dirty and self._commit == self._flushed_commit:
            return
        # The sequence moves only once both slots hold it: a flush refused half way (a full disk)
        # and tried again must leave A at most one ahead of B, the only disagreement open accepts.
        slot = encode_slot(self._current_slot(self._handle.size)._replace(sequence=self._sequence + 1))
        try:
            self._handle.write_at(0, slot)
            self._handle.sync()
            self._handle.write_at(SLOT_BYTES, slot)
            self._handle.sync()
        except FsyncFailed:
            self._closed_reason = "an fsync failed; the raft log must be reopened (crash recovery)"
            raise
        self._sequence += 1
        self._dirty = False
        self._flushed_commit = self._commit

    def save_snapshot(self, meta: SnapshotMeta, data: bytes, keep_from: int) -> None:
        """Store a snapshot of the applied state (durable on return) and drop the entries below
        `keep_from` (at most meta.index + 1: a few trailing entries can stay for slow followers)."""
        self._check_open()
        assert self.term_at(meta.index) == meta.term, f"snapshot {meta} disagrees with the log"
        assert meta.index <= self._commit, f"snapshot at {meta.index} past the commit index {self._commit}"
        assert self._base <= keep_from <= meta.index + 1, (
            f"keep_from {keep_from} outside [{self._base}, {meta.index + 1}]")
        self._write_snapshot(meta, data)
        del self._entries[: keep_from - self._base]
        del self._data_ends[: keep_from - self._base]
        self._base = keep_from
        self._rewrite()

    def install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """A leader's snapshot (durable on return): entries after it stay only if the log agrees
        with it at its index; otherwise the whole log goes (Raft §7)."""
        self._check_open()
        assert meta.index > self._commit, f"installing snapshot {meta.index} at or below commit {self._commit}"
        self._write_snapshot(meta, data)
        self._adopt_snapshot(meta)
        self._rewrite()

    def _write_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        with _FailOnFsync(self):
            self._fs.write_file_atomic(self._snapshot_path, encode_snapshot(meta, data))
        self.snapshot, self._snapshot_data = meta, bytes(data)

    def _adopt_snapshot(self, meta: SnapshotMeta) -> None:
        if self.term_at(meta.index) == meta.term and self._base <= meta.index:
            del self._entries[: meta.index + 1 - self._base]
            del self._data_ends[: meta.index + 1 - self._base]
        else:
            self._entries = []
            self._data_ends = []
        self._base = meta.index + 1
        self._commit = max(self._commit, meta.index)
        self.written_from = min(self.written_from, self._base)

    def _rewrite(self) -> None:
        """The journal rewritten as the entries held now (temporary file, fsync, rename)."""
        records = b"".join(encode_entry_record(entry) for entry in self._entries)
        self._sequence = 1
        slot = encode_slot(self._current_slot(HEADER_BYTES + len(records)))
        # Whatever stops the rewrite (a full disk too), memory is now ahead of the journal on disk
        # (its base moved): appending to the old journal would confirm records replay refuses.
        # The log closes; reopening it finds the snapshot newer than the journal and finishes this.
        with _FailOnFsync(self, any_error=True):
            self._fs.write_file_atomic(self._log_path, slot + slot + records)
        self._handle.close()
        self._handle = self._fs.open(self._log_path)
        self._dirty = False
        self._flushed_commit = self._commit

    def _current_slot(self, length: int) -> Slot:
        snapshot_index = self.snapshot.index if self.snapshot is not None else 0
        return Slot(self._sequence, length, self._base, self._term, self._vote, self._commit, snapshot_index,
                    self._rejoining)

    def close(self) -> None:
        """Flush and close; a log already closed by a failure only gives its file back."""
        try:
            if self._closed_reason is None:
                self.flush()
        finally:
            self._closed_reason = self._closed_reason or "the raft log is closed"
            self._handle.close()

    def _check_open(self) -> None:
        if self._closed_reason is not None:
            raise LogClosed(f"{self._log_path}: {self._closed_reason}")


class _FailOnFsync:
    def __init__(self, log: RaftLog, *, any_error: bool = False) -> None:
        self._log = log
        self._any_error = any_error

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: object) -> bool:
        if kind is not None and issubclass(kind, FsyncFailed):
            self._log._closed_reason = "an fsync failed; the raft log must be reopened (crash recovery)"
        elif kind is not None and self._any_error:
            self._log._closed_reason = f"rewriting the journal failed ({error}); the raft log must be reopened"
        return False



