"""Opening a controller's Raft log (storage/raft_log.py): recovery from its two files.

A mixin of `RaftLog`, which owns the file system, the paths, the entries and the hard state. On
open: the header slot that stands (choose_slot), the snapshot it relies on, the journal's
records replayed (a record failing its checks inside the flushed region is damage, past it a torn
tail that is cut and counted), and a snapshot newer than the journal applied by Raft's rule and
the journal rewritten, so disk and memory agree. Refusals name the file: `CorruptRaftLog`,
`CorruptRaftSnapshot`. Nothing flushed is ever silently dropped.
"""

from __future__ import annotations

from storage.fs import FileHandle
from storage.raft_records import (
    HEADER_BYTES, SNAPSHOT_FILE_BYTES_MAX, CorruptRaftLog, CorruptRaftSnapshot, RaftEntry, Slot, choose_slot,
    count_records, decode_snapshot, encode_slot, parse_record,
)


class RaftLogOpening:
    def _recover(self, rejoining_if_created: bool) -> None:
        try:
            self._fs.make_directory(self.directory)
        except OSError as error:  # a file in its place, no permission: refused naming it, not retried
            raise CorruptRaftLog(f"{self.directory}: cannot be used as the raft directory "
                                 f"({error.strerror or error})") from None
        if not self._fs.exists(self._log_path):
            if self._fs.exists(self._snapshot_path):
                raise CorruptRaftLog(f"{self._log_path}: missing beside a snapshot; the term and vote it "
                                     "held are lost, so this node must not vote again as the same voter")
            initial = Slot(0, HEADER_BYTES, 1, 0, 0, 0, 0, rejoining=rejoining_if_created)
            self._fs.write_file_atomic(self._log_path, encode_slot(initial) * 2)
        handle, data = self._open_journal()
        slot, confirmed = choose_slot(data, self._log_path)
        self._sequence = slot.sequence
        self._rejoining = slot.rejoining
        self._base = slot.base_index
        self._term, self._vote, self._commit = slot.term, slot.vote, slot.commit
        self._flushed_commit = slot.commit
        self._read_snapshot(slot.snapshot_index)
        end = self._replay(data, confirmed)
        if end < len(data):
            handle.truncate(end)
            handle.sync()
        elif len(data) < HEADER_BYTES:
            # Cut inside slot B with slot A whole (and confirming no records): A holds the truth.
            # Put the header back whole before anything is appended, or the next records would
            # land where the next flush writes slot B.
            handle.write_at(0, encode_slot(slot) * 2)
            handle.sync()
            self.recovery.header_repaired = True
        self._handle = handle
        self._reconcile_snapshot()
        if self._commit > self.last_index:
            raise CorruptRaftLog(f"{self._log_path}: commit index {self._commit} is past the last entry "
                                 f"{self.last_index}")
        self.written_from = self._base

    def _open_journal(self) -> tuple[FileHandle, bytes]:
        """The journal's handle and content; a file that cannot be opened or read (a directory in
        its place, EIO) is `CorruptRaftLog` naming it."""
        try:
            handle = self._fs.open(self._log_path)
        except OSError as error:
            raise CorruptRaftLog(f"{self._log_path}: cannot be opened as the raft journal "
                                 f"({error.strerror or error})") from None
        try:
            return handle, handle.read_at(0, handle.size)
        except OSError as error:
            handle.close()
            raise CorruptRaftLog(f"{self._log_path}: cannot be read ({error.strerror or error})") from None

    def _replay(self, data: bytes, confirmed: int) -> int:
        """Rebuild the entries; return where the valid journal ends."""
        view = memoryview(data)
        position = HEADER_BYTES
        while position < len(data):
            try:
                end, entry = parse_record(view, position)
                self._replay_entry(entry)
            except ValueError as error:
                if position < confirmed:
                    raise CorruptRaftLog(f"{self._log_path}: record at byte {position} fails its checks inside "
                                         f"the flushed region (up to byte {confirmed}): {error}") from None
                self.recovery.truncated_bytes = len(data) - position
                self.recovery.truncated_records = count_records(view, position)
                break
            position = end
            self.recovery.replayed_records += 1
        if position < confirmed:
            raise CorruptRaftLog(f"{self._log_path}: journal ends at byte {position}, but {confirmed} bytes "
                                 f"were flushed")
        return position

    def _replay_entry(self, entry: RaftEntry) -> None:
        last = self.last_index
        if not self._base <= entry.index <= last + 1:
            raise ValueError(f"entry index {entry.index} outside [{self._base}, {last + 1}]")
        previous_term = self.term_at(entry.index - 1)
        if previous_term is not None and entry.term < previous_term:
            raise ValueError(f"entry {entry.index} has term {entry.term} below its predecessor's {previous_term}")
        self._truncate_from(entry.index - self._base)
        self._extend([entry])

    def _read_snapshot(self, expected_index: int) -> None:
        if self._fs.exists(self._snapshot_path):
            try:
                raw = self._fs.read_file(self._snapshot_path, SNAPSHOT_FILE_BYTES_MAX)
            except OSError as error:
                raise CorruptRaftSnapshot(f"{self._snapshot_path}: cannot be read ({error.strerror or error})") from None
            meta, data = decode_snapshot(raw, self._snapshot_path)
        elif expected_index:
            raise CorruptRaftSnapshot(f"{self._snapshot_path}: missing, but the journal starts after "
                                      f"snapshot index {expected_index}")
        else:
            return
        if meta.index < expected_index:
            raise CorruptRaftSnapshot(f"{self._snapshot_path}: covers index {meta.index}, but the journal "
                                      f"relies on a snapshot at {expected_index}")
        if meta.index == expected_index:
            self.snapshot, self._snapshot_data = meta, data
        else:
            self._pending_snapshot = (meta, data)

    def _reconcile_snapshot(self) -> None:
        pending = self._pending_snapshot
        if pending is None:
            meta = self.snapshot
            if meta is None:
                if self._base != 1:
                    raise CorruptRaftLog(f"{self._log_path}: starts at entry {self._base} with no snapshot before it")
                return
            if self._base > meta.index + 1:
                raise CorruptRaftLog(f"{self._log_path}: starts at entry {self._base}, after a gap past the "
                                     f"snapshot at {meta.index}")
            held = self.term_at(meta.index)
            if self._base <= meta.index and held != meta.term:
                raise CorruptRaftLog(f"{self._log_path}: entry {meta.index} has term {held}, the snapshot "
                                     f"says {meta.term}")
            return
        # A snapshot newer than the journal knows: the crash came between installing it and
        # rewriting the journal. Apply Raft's rule now and rewrite, so disk and memory agree.
        meta, data = pending
        self._pending_snapshot = None
        held = self.term_at(meta.index)
        if meta.index <= self._commit and held is not None and held != meta.term:
            # Committed entries are the same on every voter, so a snapshot that disagrees with one
            # is not this quorum's: refuse it before the rewrite below would drop the journal.
            raise CorruptRaftSnapshot(f"{self._snapshot_path}: covers index {meta.index} with term {meta.term}, "
                                      f"but the journal's committed entry there has term {held}")
        self._adopt_snapshot(meta)
        if self._commit > self.last_index:
            raise CorruptRaftLog(f"{self._log_path}: commit index {self._commit} is past the last entry "
                                 f"{self.last_index} beside the snapshot at {meta.index}")
        self.snapshot, self._snapshot_data = meta, data
        self._rewrite()
        self.recovery.rewritten = True
