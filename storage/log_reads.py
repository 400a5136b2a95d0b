"""What a partition log answers about what it holds: reads, the scrubber's walk, batch headers
and timestamps.

A mixin of `PartitionLog` (storage/log.py), kept apart because none of it changes the log: each
method checks the log is open, then looks through the segments. The rules of a read (whole
batches, CRC-checked, never stepping over a refused range) are storage/reader.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from storage.batch import BatchHeader, iter_batches, parse_header, record_timestamps
from storage.errors import CorruptLog, OffsetOutOfRange
from storage.reader import gather, locate, refuse_rest, refusing_damage

if TYPE_CHECKING:
    from storage.log import PartitionLog


class ReadOperations:
    def read(self: "PartitionLog", offset: int, max_bytes: int, *, max_offset: int | None = None) -> bytes:
        """Whole batches from the one holding `offset`; see storage/reader.py for the rules."""
        self._check_open()
        end = self.log_end_offset
        if offset < self._log_start or offset > end:
            raise OffsetOutOfRange(offset, self._log_start, end)
        if offset == end or (max_offset is not None and offset >= max_offset):
            return b""
        found = locate(self._segments, self._bases, offset)
        if found is None:
            return b""
        index, position, header = found
        return gather(self._segments, index, position, header, max_bytes, max_offset)

    def scrub(self: "PartitionLog", offset: int, max_bytes: int) -> int:
        """Read (and so CRC-check) whole batches from `offset`, about `max_bytes` of them, and
        return the offset to continue from. Bit rot found is refused like any read's
        (`CorruptLog` when it is at `offset`); nothing is returned to anyone. The two fields the
        CRC does not cover — the stamped base offset and leader epoch — are checked too: offsets
        must follow each other and each epoch must be the one the epoch checkpoint has for it."""
        data = self.read(offset, max_bytes)
        if not data:
            return self.log_end_offset
        expected: int | None = None
        for _, header in iter_batches(data, verify=False, batch_bytes_max=self._config.batch_bytes_max):
            placed = header.base_offset <= offset < header.next_offset if expected is None \
                else header.base_offset == expected
            epoch = self._epochs.epoch_at(header.base_offset) if placed else None
            if not placed or (epoch is not None and epoch != header.leader_epoch):
                first = offset if expected is None else expected
                raise refuse_rest(self._segments[self._segment_index(first)], first,
                                  "a stamped header field (base offset or leader epoch) changed on disk")
            expected = header.next_offset
        return expected

    def iter_headers(self: "PartitionLog", from_offset: int) -> Iterator[BatchHeader]:
        """Headers from the batch holding `from_offset` to the end, stepping over refused ranges.
        A header that fails its checks on the way (damaged since the log was opened) is refused
        as a read refuses it, and `CorruptLog` raised. The log must not change while the iterator
        is in use."""
        self._check_open()
        end = self.log_end_offset
        if from_offset < self._log_start or from_offset > end:
            raise OffsetOutOfRange(from_offset, self._log_start, end)
        index = self._segment_index(from_offset)
        segment = self._segments[index]
        refused = segment.refused_range_at(from_offset)
        position = refused.end_position if refused else segment.index.floor_position(from_offset)
        for segment in self._segments[index:]:
            with refusing_damage(segment):
                for _, header in segment.batches_from(position):
                    if header.next_offset > from_offset:
                        yield header
            position = 0

    def offset_for_timestamp(self: "PartitionLog", timestamp_ms: int) -> int | None:
        """First offset of the first batch whose max_timestamp_ms >= timestamp_ms (ListOffsets).
        Raises `CorruptLog` for a damaged header on the way, as `iter_headers` does."""
        self._check_open()
        for segment in self._segments:
            if segment.max_timestamp_ms < timestamp_ms or segment.next_offset <= self._log_start:
                continue
            min_position = 0
            with refusing_damage(segment):
                if segment.base_offset < self._log_start:
                    found = segment.find_batch(self._log_start)
                    min_position = found[0] if found is not None else segment.size_bytes
                found = segment.find_timestamp(timestamp_ms, min_position)
            if found is not None:
                return max(found[1].base_offset, self._log_start)
        return None

    def first_record_at_or_after(self: "PartitionLog", offset: int,
                                 timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record from `offset` on, in the batch holding it, whose
        time is `timestamp_ms` or later; None when there is none there. Reads that one batch (its
        CRC checked), and decodes its records' times only."""
        data = self.read(offset, 1)
        if not data:
            return None
        header = parse_header(data)
        for index, timestamp in enumerate(record_timestamps(data, header)):
            if timestamp >= timestamp_ms and header.base_offset + index >= offset:
                return header.base_offset + index, timestamp
        return None

    def batch_timestamp(self: "PartitionLog", offset: int) -> int | None:
        """first_timestamp_ms of the batch holding `offset` (None outside the log or refused)."""
        self._check_open()
        if not self._log_start <= offset < self.log_end_offset:
            return None
        try:
            found = locate(self._segments, self._bases, offset)
        except CorruptLog:
            return None
        if found is None or found[2].base_offset > offset:
            return None
        return found[2].first_timestamp_ms
