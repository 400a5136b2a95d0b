"""The sparse offset index and time index of one segment, held in memory.

Every `index_interval_bytes` of batches (and always at a segment's first batch) the index records
the batch's base offset, its byte position, and the largest batch timestamp seen *before* it in
the segment. An offset lookup bisects to the entry at or below the offset and the caller walks at
most one interval of headers from there; a timestamp lookup bisects the non-decreasing "largest
timestamp before" column to the last entry where every earlier batch is still older than the target
(Kafka's time index answers ListOffsets the same way).

The index is rebuilt by the open-time header walk, which must read every header of the flushed
region anyway to validate it (storage/recovery.py), so it is never written to disk: a persisted
copy could not save that walk and would be one more file to keep consistent after a crash.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right

from storage.batch import BatchHeader

NO_TIMESTAMP = -(2 ** 63)


class SparseIndex:
    __slots__ = ("offsets", "positions", "prior_max_timestamps", "interval_bytes", "bytes_since_entry",
                 "max_timestamp_ms")

    def __init__(self, interval_bytes: int) -> None:
        self.interval_bytes = interval_bytes
        # int64 columns, not lists: a list holds an int object per value (~112 bytes an entry in
        # all, 2.7% of the data, for every segment a replica keeps); these hold 8 bytes each.
        self.offsets = array("q")
        self.positions = array("q")
        self.prior_max_timestamps = array("q")
        self.bytes_since_entry = 0
        self.max_timestamp_ms = NO_TIMESTAMP  # largest max_timestamp_ms of any batch in the segment

    def add(self, position: int, header: BatchHeader, *, force: bool = False) -> None:
        """Account for the batch at `position` (batches must be added in log order)."""
        if force or not self.offsets or self.bytes_since_entry >= self.interval_bytes:
            self.offsets.append(header.base_offset)
            self.positions.append(position)
            self.prior_max_timestamps.append(self.max_timestamp_ms)
            self.bytes_since_entry = 0
        self.bytes_since_entry += header.size
        if header.max_timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = header.max_timestamp_ms

    def floor_position(self, offset: int) -> int:
        """Byte position of the indexed batch at or below `offset` (0 when none is)."""
        slot = bisect_right(self.offsets, offset) - 1
        return self.positions[slot] if slot >= 0 else 0

    def floor_entry_for_timestamp(self, timestamp_ms: int) -> tuple[int, int]:
        """(position, largest timestamp before it) of the last entry before which every batch is
        older than `timestamp_ms`; the first batch at or after `timestamp_ms` is at or past it."""
        slot = max(0, bisect_left(self.prior_max_timestamps, timestamp_ms) - 1)
        if not self.positions:
            return 0, NO_TIMESTAMP
        return self.positions[slot], self.prior_max_timestamps[slot]

    def floor_entry_for_position(self, position: int) -> tuple[int, int]:
        """(position, largest timestamp before it) of the last entry at or below `position`."""
        slot = bisect_right(self.positions, position) - 1
        if slot < 0:
            return 0, NO_TIMESTAMP
        return self.positions[slot], self.prior_max_timestamps[slot]

    def truncate(self, position: int, max_timestamp_ms: int, bytes_since_entry: int) -> None:
        """Forget entries at or past `position`; the caller walked the kept tail for the rest."""
        keep = bisect_left(self.positions, position)
        del self.offsets[keep:], self.positions[keep:], self.prior_max_timestamps[keep:]
        self.max_timestamp_ms = max_timestamp_ms
        self.bytes_since_entry = bytes_since_entry
