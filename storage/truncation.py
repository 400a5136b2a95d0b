"""How a partition log shrinks: follower truncation, full reset, retention, DeleteRecords.

A mixin of `PartitionLog` (storage/log.py), kept apart because removing data has its own
ordering rules, each chosen so that a crash in the middle leaves a log that recovery accepts
without refusing good data or resurrecting removed data:
- truncation cuts the data first and fsyncs the cut (so removed batches cannot reappear after a
  crash) and the kept prefix, then moves the recovery point to the new end, then drops epoch
  entries at or past the new end;
- whole segments are removed newest first, so a crash leaves a contiguous prefix;
- only whole segments that are not the active one, and wholly below the high watermark the
  replica passes, are ever deleted by retention; the log start moves to the next segment's
  base offset (or, for DeleteRecords, to the requested offset),
  persisted in the recovery-point checkpoint before any file is removed, so it survives a restart
  and a log start below the first file always means lost files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.checkpoint import RecoveryPoint
from storage.errors import OffsetOutOfRange
from storage.reader import refusing_damage
from storage.segment import Segment

if TYPE_CHECKING:
    from storage.log import PartitionLog


class ShrinkOperations:
    def truncate_to(self: "PartitionLog", offset: int) -> None:
        """Remove every batch with base_offset >= offset; a batch holding `offset` but starting
        below it goes whole, so the new end is the batch boundary at or below `offset`. A header
        damaged since the open met on the way to the cut raises `CorruptLog` (nothing is cut): its
        range is refused from then on, and a truncation into it cuts below it."""
        self._check_open()
        if offset >= self.log_end_offset:
            return
        if offset < self._log_start:
            raise ValueError(f"cannot truncate to {offset}, below the log start {self._log_start}")
        with self._fatal_on_fsync_failure():
            self._truncate_internal(offset)

    def _truncate_internal(self: "PartitionLog", offset: int) -> None:
        index = self._segment_index(offset)
        segment = self._segments[index]
        with refusing_damage(segment):  # a header damaged since the open: CorruptLog, nothing cut
            cut_position, new_end = _cut_point(segment, offset)
            tail = segment.tail_before(cut_position)
        if new_end < self._log_start:
            self._reset_internal(self._log_start)  # nothing at or past the log start remains
            return
        for later in reversed(self._segments[index + 1:]):
            self._remove_segment_file(later)
        del self._segments[index + 1:], self._bases[index + 1:]
        if cut_position < segment.size_bytes or segment.next_offset != new_end:
            segment.truncate_at(cut_position, new_end, tail)
            segment.handle.sync()  # the shorter length must be durable before anything else
            segment.synced_bytes = segment.size_bytes
        # The kept prefix is made durable too, so the recovery point can sit exactly at the new
        # end: a truncation is rare (a failover), and a follower refetches from there anyway.
        self._flushed = min(self._flushed, new_end)
        self._high_watermark = min(self._high_watermark, new_end)
        self._sync_segments()
        self._store_checkpoint()
        if self._epochs.truncate_from_end(new_end):
            self._epochs.persist()

    def reset_to(self: "PartitionLog", offset: int) -> None:
        """Drop everything and restart the log, empty, at `offset`."""
        self._check_open()
        if offset < 0:
            raise ValueError(f"offsets are >= 0, got {offset}")
        with self._fatal_on_fsync_failure():
            self._reset_internal(offset)

    def _reset_internal(self: "PartitionLog", offset: int) -> None:
        for segment in reversed(self._segments):
            self._remove_segment_file(segment)
        self._segments.clear()
        self._bases.clear()
        self._log_start = self._flushed = offset
        self._high_watermark = min(self._high_watermark, offset)
        self._checkpoint.store(RecoveryPoint(offset, offset, 0, offset, self._high_watermark, self._high_watermark_epoch))
        self._roll(offset, self._last_flush_ms)
        if self._epochs.clear():
            self._epochs.persist()

    @property
    def retention_applies(self: "PartitionLog") -> bool:
        """Could `apply_retention` delete anything? Only closed segments go, so not with one segment."""
        return len(self._segments) > 1 and (self._config.retention_ms is not None
                                            or self._config.retention_bytes is not None)

    def apply_retention(self: "PartitionLog", now_ms: int, upper_bound_offset: int | None = None) -> int:
        """Delete whole oldest non-active segments past `retention_ms` (by their largest
        timestamp) or while the log is larger than `retention_bytes`; returns how many.

        Only segments wholly below `upper_bound_offset` may go (a replica passes its high
        watermark; None: the log end). Kafka's rule too (UnifiedLog.deletableSegments): a leader
        that deleted records no follower had fetched sent its followers past them, each counted
        as holding them, and acks=all acknowledged records no replica held or any consumer read."""
        self._check_open()
        config = self._config
        bound = self.log_end_offset if upper_bound_offset is None else upper_bound_offset
        doomed, remaining = 0, self.size_bytes
        while len(self._segments) - doomed > 1 and self._segments[doomed + 1].base_offset <= bound:
            oldest = self._segments[doomed]
            age_ms = now_ms - oldest.max_timestamp_ms
            expired = config.retention_ms is not None and age_ms > config.retention_ms
            oversized = config.retention_bytes is not None and remaining > config.retention_bytes
            if not (expired or oversized):
                break
            remaining -= oldest.size_bytes
            doomed += 1
        if doomed:
            with self._fatal_on_fsync_failure():
                self._log_start = max(self._log_start, self._segments[doomed].base_offset)
                self._delete_oldest(doomed)
                if self._epochs.truncate_from_start(self._log_start):
                    self._epochs.persist()
        return doomed

    def delete_records_before(self: "PartitionLog", offset: int) -> None:
        """Kafka DeleteRecords: move the log start up to `offset` and delete whole segments below."""
        self._check_open()
        end = self.log_end_offset
        if offset < 0 or offset > end:
            raise OffsetOutOfRange(offset, self._log_start, end)
        if offset <= self._log_start:
            return
        with self._fatal_on_fsync_failure():
            self._log_start = offset
            doomed = 0
            while doomed + 1 < len(self._segments) and self._bases[doomed + 1] <= offset:
                doomed += 1
            self._delete_oldest(doomed)
            if self._epochs.truncate_from_start(offset):
                self._epochs.persist()

    def _delete_oldest(self: "PartitionLog", count: int) -> None:
        """Remove the `count` oldest segments, all below the log start. The checkpoint names the
        log start first: a crash between the two leaves files the log no longer holds (below its
        start, left for retention to remove), never a log start below its first file, which recovery reports
        as lost data (storage/recovery.py)."""
        self._store_checkpoint()
        for segment in self._segments[:count]:
            self._remove_segment_file(segment)
        del self._segments[:count], self._bases[:count]

    def _remove_segment_file(self: "PartitionLog", segment: Segment) -> None:
        segment.handle.close()
        self._fs.remove(segment.handle.path)


def _cut_point(segment: Segment, offset: int) -> tuple[int, int]:
    """(byte position, new log end) for truncating `segment` to `offset`."""
    refused = segment.refused_range_at(offset)
    if refused is not None:
        return refused.start_position, refused.first_offset
    found = segment.find_batch(offset)
    if found is None:
        return segment.size_bytes, segment.next_offset
    position, header = found
    return position, header.base_offset
