"""The partition log: everything one partition replica keeps on disk, behind one small API.

A directory of segments (`<base offset>.log`, see storage/segment.py), a recovery-point checkpoint
(storage/checkpoint.py) and a leader-epoch checkpoint (storage/epochs.py). It knows nothing of
sockets, actors or clocks: time comes in as `now_ms`, the disk as a `FileSystem`, so the same
code runs on real files and on the crash-modelling `MemoryFileSystem`.

Invariants:
- Offsets are contiguous from `log_start_offset` to `log_end_offset`, batch after batch; a batch
  is written whole or not at all (bad input is refused before the first byte is written; a full
  disk rolls the write back).
- Everything below `flushed_offset` was covered by an fsync. The checkpointed recovery point is
  persisted by `flush()`, `maybe_flush()`, truncation and `close()`; with FlushPolicy.EVERY_BATCH
  appends fsync their data but leave the checkpoint to those calls, so a crash can only make the
  open-time scan CRC-check more than strictly needed, never trust less than was durable.
- Leader epochs never go back along the log; every epoch change is persisted before its batch.
- After an fsync fails the log refuses all work (`LogClosed`): the owner must crash and reopen.
"""

from __future__ import annotations

from bisect import bisect_right

import msgspec

from storage.batch import STAMP, BatchHeader, iter_batches, validate_producer_batch, verify_batch
from storage.checkpoint import RECOVERY_POINT_NAME, RecoveryPoint, RecoveryPointFile
from storage.config import AppendResult, FlushPolicy, LogConfig, RecoveryReport
from storage.epochs import EPOCH_CHECKPOINT_NAME, EpochCheckpointCorrupt, LeaderEpochCache
from storage.errors import (BatchTooLarge, CorruptBatch, FsyncFailed, LogClosed, OutOfOrderBatch,
                            StaleLeaderEpoch, StorageError, StorageFull)
from storage.fs import Buffer, FileSystem, OsFileSystem
from storage.log_reads import ReadOperations
from storage.recovery import logger, recover
from storage.segment import Segment, segment_file_name
from storage.segment_files import SegmentFiles
from storage.truncation import ShrinkOperations

__all__ = ["AppendResult", "FlushPolicy", "LogConfig", "PartitionLog", "RecoveryReport"]


class PartitionLog(ReadOperations, ShrinkOperations):
    def __init__(self, fs: FileSystem, directory: str, config: LogConfig, checkpoint: RecoveryPointFile,
                 epochs: LeaderEpochCache, now_ms: int, files: SegmentFiles) -> None:
        self._fs = fs
        self._files = files  # the segments' files, a bounded number of them open
        self._directory = directory
        self._config = config
        self._checkpoint = checkpoint
        self._epochs = epochs
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._log_start = 0
        self._flushed = 0
        self._last_flush_ms = now_ms
        self._closed_reason: str | None = None
        self._high_watermark = 0
        self._high_watermark_epoch = -1
        self.recovery = RecoveryReport()
        # What the previous owner of the directory left: a clean close (everything flushed, the
        # checkpoint written last), and whether a recovery-point checkpoint existed at all.
        self.clean_shutdown = False
        self.checkpoint_found = False

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def open(cls, directory: str, config: LogConfig, *, fs: FileSystem | None = None, now_ms: int,
             owner: bytes = b"") -> "PartitionLog":
        """Open (creating if needed) the log in `directory`, recovering from any crash first.
        `owner` names whose log this is; a checkpoint written for another owner is not read."""
        fs = fs if fs is not None else OsFileSystem()
        fs.make_directory(directory)
        checkpoint = RecoveryPointFile(fs, f"{directory}/{RECOVERY_POINT_NAME}", owner)
        epochs_path = f"{directory}/{EPOCH_CHECKPOINT_NAME}"
        problem = None
        try:
            epochs = LeaderEpochCache.load(fs, epochs_path)
            trusted = fs.exists(epochs_path)
        except EpochCheckpointCorrupt as error:
            epochs, trusted, problem = LeaderEpochCache(fs, epochs_path), False, str(error)
        files = SegmentFiles(fs, config.open_segments_max)
        try:
            recovered = recover(files, directory, config, checkpoint.point, epochs, epochs_trusted=trusted,
                                now_ms=now_ms)
        except BaseException:
            checkpoint.close()
            raise
        log = cls(fs, directory, config, checkpoint, epochs, now_ms, files)
        log.recovery = recovered.report
        if problem is None and not trusted and epochs.entries:
            problem = "the file was missing"
        if problem is not None:
            log._report_problem(f"leader-epoch checkpoint rebuilt from the batches: {problem}")
        log._segments = recovered.segments
        log._bases = [segment.base_offset for segment in recovered.segments]
        log._log_start = recovered.log_start_offset
        log._flushed = recovered.flushed_offset
        if not log._segments or log._segments[-1].sealed:
            log._roll(recovered.log_end_offset, now_ms)
        changed = epochs.drop_beyond(log.log_end_offset) | epochs.truncate_from_start(log._log_start)
        if changed or not trusted:
            epochs.persist()
        log._adopt_previous_point(checkpoint.point)
        return log

    def _adopt_previous_point(self, point: RecoveryPoint | None) -> None:
        """Take over what the last checkpoint says, then mark the directory as in use: a crash
        from here on is read as an unclean shutdown by the next open."""
        self.checkpoint_found = point is not None
        if point is not None:
            self.clean_shutdown = point.clean and not self.recovery.problems
            if point.high_watermark_epoch >= 0:
                self._high_watermark = min(point.high_watermark, self.log_end_offset)
                self._high_watermark_epoch = point.high_watermark_epoch
        with self._fatal_on_fsync_failure():
            self._store_checkpoint()

    def _report_problem(self, sentence: str) -> None:
        self.recovery.problems.append(sentence)
        logger.error("%s: %s", self._directory, sentence)

    # -- positions --------------------------------------------------------------------------
    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    @property
    def size_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._bases)

    @property
    def refused_count(self) -> int:
        """How many ranges the log refuses (cheap: for noticing that a read refused a new one)."""
        return sum(len(segment.refused) for segment in self._segments)

    @property
    def corrupt_ranges(self) -> list[tuple[int, int]]:
        """Every refused (first_offset, last_offset) range: found by open or by reads since."""
        return [(refused.first_offset, refused.last_offset) for segment in self._segments
                for refused in segment.refused]

    # -- appending --------------------------------------------------------------------------
    def append_producer_batch(self, batch: Buffer, leader_epoch: int, now_ms: int) -> AppendResult:
        """Verify one producer batch, stamp the next offset and `leader_epoch` on it, write it."""
        self._check_open()
        view = memoryview(batch)
        if len(view) > self._config.batch_bytes_max:
            raise BatchTooLarge(f"batch of {len(view)} bytes exceeds the limit of {self._config.batch_bytes_max}")
        header = verify_batch(view, 0, batch_bytes_max=self._config.batch_bytes_max)
        if header.size != len(view):
            raise CorruptBatch(f"{len(view) - header.size} bytes follow the batch; one batch was expected")
        validate_producer_batch(view, header)
        latest = self._epochs.latest_epoch()
        if leader_epoch < latest:
            raise StaleLeaderEpoch(latest, leader_epoch)
        base = self.log_end_offset
        if leader_epoch > latest:
            self._epochs.check_assign(leader_epoch, base, base)
        header = header._replace(base_offset=base, leader_epoch=leader_epoch)
        with self._fatal_on_fsync_failure():
            segment = self._segment_for_append(header.size, now_ms)
            if leader_epoch > latest:
                self._assign_and_persist(leader_epoch, base)
            segment.append([STAMP.pack(base, leader_epoch), view[STAMP.size:]], [header])
            self._after_append()
        return AppendResult(base, header.last_offset, header.next_offset)

    def append_replicated_batches(self, batches: Buffer, now_ms: int) -> AppendResult:
        """Append the leader's batches with their offsets; all are checked before any is written."""
        self._check_open()
        view = memoryview(batches)
        start_end = self.log_end_offset
        if not view:
            return AppendResult(start_end, start_end - 1, start_end)
        superseded = self._empty_epoch_superseded(view, start_end)
        checked, new_epochs = self._check_replicated(view, start_end, superseded)
        entries_before = list(self._epochs.entries)
        with self._fatal_on_fsync_failure():
            try:
                if superseded and self._epochs.truncate_from_end(start_end) and not new_epochs:
                    self._epochs.persist()
                for epoch, start in new_epochs:
                    self._epochs.assign(epoch, start, start_end)
                if new_epochs:
                    self._epochs.persist()
                self._write_runs(view, checked, now_ms)
            except StorageFull:
                self._truncate_internal(start_end)  # undo the segments this call already wrote
                if self._epochs.restore(entries_before):
                    self._epochs.persist()
                raise
            self._after_append()
        return AppendResult(checked[0][1].base_offset, checked[-1][1].last_offset, self.log_end_offset)

    def _empty_epoch_superseded(self, view: memoryview, start_end: int) -> bool:
        """Whether the first batch is older than an epoch whose entry starts at the log end.

        Such an entry is an epoch this replica led without writing a batch (a leader assigns its
        epoch on taking over). The follower fetches with the epoch of its last batch, so the next
        leader, which never had that epoch, may send batches of an older one at that offset: they
        replace the empty epoch, as Kafka's LeaderEpochFileCache.assign drops every entry
        starting at or past a new batch. Refusing them refused every fetch, on every restart."""
        at_end = [epoch for epoch, start in self._epochs.entries if start >= start_end]
        if not at_end:
            return False
        try:
            for _, header in iter_batches(view, verify=False):
                return header.leader_epoch < max(at_end)
        except StorageError:
            return False  # _check_replicated says what is wrong with the batches
        return False

    def _check_replicated(self, view: memoryview, start_end: int, superseded: bool = False
                          ) -> tuple[list[tuple[int, BatchHeader]], list[tuple[int, int]]]:
        checked = []
        new_epochs: list[tuple[int, int]] = []
        latest = self._epochs.latest_epoch()
        if superseded:  # the entries at the log end go (see _empty_epoch_superseded)
            latest = max([epoch for epoch, start in self._epochs.entries if start < start_end], default=-1)
        expected = start_end
        for position, header in iter_batches(view, verify=True, batch_bytes_max=self._config.batch_bytes_max):
            if header.base_offset != expected:
                raise OutOfOrderBatch(expected, header.base_offset)
            if header.leader_epoch < 0:
                raise CorruptBatch(f"replicated batch at offset {header.base_offset} has no leader epoch")
            if header.leader_epoch < latest:
                raise StaleLeaderEpoch(latest, header.leader_epoch)
            if header.leader_epoch > latest:
                new_epochs.append((header.leader_epoch, header.base_offset))
                latest = header.leader_epoch
            checked.append((position, header))
            expected = header.next_offset
        return checked, new_epochs

    def _write_runs(self, view: memoryview, checked: list[tuple[int, BatchHeader]], now_ms: int) -> None:
        """Write consecutive batches with one write per segment they land in."""
        segment = self._segment_for_append(checked[0][1].size, now_ms)
        run_start, run_headers, run_bytes = checked[0][0], [], 0
        for position, header in checked:
            if run_headers and self._needs_roll(segment, run_bytes, header.size, now_ms):
                segment.append([view[run_start: run_start + run_bytes]], run_headers)
                segment = self._roll(self.log_end_offset, now_ms)
                run_start, run_headers, run_bytes = position, [], 0
            run_headers.append(header)
            run_bytes += header.size
        segment.append([view[run_start: run_start + run_bytes]], run_headers)

    def _needs_roll(self, segment: Segment, pending_bytes: int, incoming_bytes: int, now_ms: int) -> bool:
        occupied = segment.size_bytes + pending_bytes
        if segment.sealed:
            return True
        if occupied == 0:
            return False
        return (occupied + incoming_bytes > self._config.segment_bytes
                or now_ms - segment.created_ms >= self._config.segment_ms)

    def _segment_for_append(self, incoming_bytes: int, now_ms: int) -> Segment:
        segment = self._segments[-1]
        if self._needs_roll(segment, 0, incoming_bytes, now_ms):
            return self._roll(self.log_end_offset, now_ms)
        if segment.is_empty:
            segment.created_ms = now_ms  # a segment's age counts from its first batch
        return segment

    def _roll(self, base_offset: int, now_ms: int) -> Segment:
        handle = self._files.open(f"{self._directory}/{segment_file_name(base_offset)}", create=True)
        segment = Segment(base_offset, handle, index_interval_bytes=self._config.index_interval_bytes,
                          created_ms=now_ms, batch_bytes_max=self._config.batch_bytes_max)
        self._segments.append(segment)
        self._bases.append(base_offset)
        return segment

    def _after_append(self) -> None:
        if self._config.flush_policy is FlushPolicy.EVERY_BATCH:
            self._sync_segments()

    # -- durability -------------------------------------------------------------------------
    def flush(self) -> None:
        """Make everything durable, then advance and persist the recovery point."""
        self._check_open()
        with self._fatal_on_fsync_failure():
            self._sync_segments()
            self._store_checkpoint()

    def maybe_flush(self, now_ms: int) -> bool:
        """Apply FlushPolicy.INTERVAL: flush when `flush_interval_ms` passed since the last one."""
        self._check_open()
        if self._config.flush_policy is not FlushPolicy.INTERVAL:
            return False
        if now_ms - self._last_flush_ms < self._config.flush_interval_ms:
            return False
        self._last_flush_ms = now_ms
        if self._flushed == self.log_end_offset and self._checkpoint_current():
            return False
        self.flush()
        return True

    def _sync_segments(self) -> None:
        for segment in self._segments[self._segment_index(self._flushed):]:
            segment.sync()
        self._flushed = self.log_end_offset

    def _checkpoint_current(self) -> bool:
        point = self._checkpoint.point
        return point is not None and point.recovery_offset == self._flushed and point.log_start_offset == self._log_start

    def _store_checkpoint(self, *, clean: bool = False) -> None:
        """Persist the recovery point (`_flushed`, which must be a durable batch boundary)."""
        index = self._segment_index(self._flushed)
        segment = self._segments[index]
        position = segment.size_bytes if self._flushed >= segment.next_offset else self._position_of(segment)
        self._checkpoint.store(RecoveryPoint(
            self._flushed, segment.base_offset, position, self._log_start,
            min(self._high_watermark, self._flushed), self._high_watermark_epoch, clean))

    def set_retention(self, retention_ms: int | None, retention_bytes: int | None) -> None:
        """A topic's retention changed (the only settings a live log takes): the next
        `apply_retention` uses the new bounds."""
        self._config = msgspec.structs.replace(self._config, retention_ms=retention_ms, retention_bytes=retention_bytes)

    # -- the committed end this replica has seen ---------------------------------------------
    @property
    def high_watermark(self) -> int:
        """The high watermark last handed to `note_high_watermark` (or found in the checkpoint)."""
        return self._high_watermark

    @property
    def high_watermark_epoch(self) -> int:
        return self._high_watermark_epoch

    def note_high_watermark(self, high_watermark: int, leader_epoch: int) -> None:
        """Remember the committed end the replica has seen; persisted with the next checkpoint
        (every flush, truncation and the clean close). In memory only until then: a lower bound
        after a crash is all a follower's defence needs."""
        self._high_watermark = high_watermark
        self._high_watermark_epoch = leader_epoch

    def _position_of(self, segment: Segment) -> int:
        found = segment.find_batch(self._flushed)
        return found[0] if found is not None else segment.size_bytes

    def _segment_index(self, offset: int) -> int:
        return max(0, bisect_right(self._bases, offset) - 1)

    def _fatal_on_fsync_failure(self) -> "_FsyncGuard":
        return _FsyncGuard(self)

    def _check_open(self) -> None:
        if self._closed_reason is not None:
            raise LogClosed(f"{self._directory}: {self._closed_reason}")

    # -- leader epochs (KIP-101 / KIP-279) ---------------------------------------------------
    def assign_epoch(self, epoch: int, start_offset: int) -> None:
        self._check_open()
        if self._epochs.check_assign(epoch, start_offset, self.log_end_offset):
            with self._fatal_on_fsync_failure():
                self._assign_and_persist(epoch, start_offset)

    def _assign_and_persist(self, epoch: int, start_offset: int) -> None:
        self._epochs.assign(epoch, start_offset, start_offset)
        self._epochs.persist()

    def epoch_entries(self) -> list[tuple[int, int]]:
        return list(self._epochs.entries)

    def latest_epoch(self) -> int:
        return self._epochs.latest_epoch()

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self._epochs.end_offset_for_epoch(epoch, self.log_end_offset)

    # Reading (read, scrub, iter_headers, offset_for_timestamp, batch_timestamp) is inherited from
    # storage/log_reads.py; shrinking (truncate_to, reset_to, apply_retention, delete_records_before)
    # from storage/truncation.py.

    def close(self) -> None:
        """Flush (unless an fsync already failed) and close; later calls raise LogClosed."""
        if self._closed_reason == _CLOSED:
            return
        try:
            if self._closed_reason is None:
                with self._fatal_on_fsync_failure():
                    self._sync_segments()
                    self._store_checkpoint(clean=True)
        finally:
            self._closed_reason = _CLOSED
            for segment in self._segments:
                segment.handle.close()
            self._checkpoint.close()


_CLOSED = "the log is closed"
_FSYNC_FAILED = "an fsync failed; the log takes no more work and must be reopened (crash recovery)"


class _FsyncGuard:
    """Marks the log failed when an fsync fails inside the block (the owner must crash)."""

    __slots__ = ("_log",)

    def __init__(self, log: PartitionLog) -> None:
        self._log = log

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: object) -> bool:
        if kind is not None and issubclass(kind, FsyncFailed):
            self._log._closed_reason = _FSYNC_FAILED
            logger.critical("%s: %s (%s)", self._log._directory, _FSYNC_FAILED, error)
        return False
