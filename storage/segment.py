"""One segment of a partition log: a `<base offset, 20 digits>.log` file of whole batches, its
in-memory sparse index, and the ranges of it that failed their checks and are refused.

A segment never knows about its neighbours; the log decides when to roll and what to delete.
Invariants it keeps:
- the file holds whole batches back to back from position 0, base offsets contiguous from
  `base_offset` up to `next_offset`, except inside `refused` ranges (bytes whose structure or CRC
  failed inside the flushed region: they stay on disk and are never served);
- the index only points at batch boundaries outside refused ranges;
- `synced_bytes` never exceeds the file size: bytes below it were covered by an fsync.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

from storage.batch import HEADER_SIZE, BatchHeader, compute_crc, parse_header
from storage.errors import CorruptBatch
from storage.fs import Buffer, FileHandle
from storage.index import NO_TIMESTAMP, SparseIndex

LOG_SUFFIX = ".log"
OFFSET_DIGITS = 20
# Header walks read this much at a time: a few index intervals, one pread for most lookups.
WALK_WINDOW_BYTES = 64 * 1024
# CRC scans read this much at a time: large enough that pread overhead vanishes beside zlib.
SCAN_WINDOW_BYTES = 4 * 1024 * 1024


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:0{OFFSET_DIGITS}d}{LOG_SUFFIX}"


def parse_segment_file_name(name: str) -> int | None:
    """The base offset a segment file name encodes, or None when it is not a segment name."""
    stem, suffix = name[: -len(LOG_SUFFIX)], name[-len(LOG_SUFFIX):]
    if suffix != LOG_SUFFIX or len(stem) != OFFSET_DIGITS or not stem.isdigit():
        return None
    return int(stem)


class RefusedRange(NamedTuple):
    """Offsets [first_offset, last_offset] stored at bytes [start_position, end_position)."""

    first_offset: int
    last_offset: int
    start_position: int
    end_position: int


def iter_batches_in_file(handle: FileHandle, start_position: int, end_position: int, *, verify: bool,
                         batch_bytes_max: int, window_bytes: int = WALK_WINDOW_BYTES
                         ) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of the batches in [start_position, end_position) of a file.

    Headers are validated (lengths, counts, version, no batch running past `end_position`);
    with `verify` the CRC of every batch is checked too. Raises `CorruptBatch` at the first batch
    that fails; the failing position is the last yielded position plus that batch's size.
    """
    position = start_position
    chunk = b""
    chunk_start = start_position
    while position < end_position:
        in_chunk = position - chunk_start
        if in_chunk + HEADER_SIZE > len(chunk):
            chunk = handle.read_at(position, min(window_bytes, end_position - position))
            chunk_start, in_chunk = position, 0
        header = parse_header(chunk, in_chunk, batch_bytes_max=batch_bytes_max, available=end_position - position)
        if verify:
            if in_chunk + header.size > len(chunk):
                chunk = handle.read_at(position, max(window_bytes, header.size))
                chunk_start, in_chunk = position, 0
            actual = compute_crc(chunk, in_chunk, header)
            if actual != header.crc:
                raise CorruptBatch(f"CRC mismatch at position {position}: header says {header.crc:#010x}, "
                                   f"bytes give {actual:#010x}")
        yield position, header
        position += header.size



RECENT_STARTS_MAX = 256  # batch starts remembered per segment for reads at the tail


class Segment:
    __slots__ = ("base_offset", "handle", "next_offset", "index", "refused", "synced_bytes", "created_ms",
                 "batch_bytes_max", "recent_starts")

    def __init__(self, base_offset: int, handle: FileHandle, *, index_interval_bytes: int, created_ms: int,
                 batch_bytes_max: int) -> None:
        self.base_offset = base_offset
        self.handle = handle
        self.next_offset = base_offset
        self.index = SparseIndex(index_interval_bytes)
        self.refused: list[RefusedRange] = []
        self.synced_bytes = 0
        self.created_ms = created_ms
        self.batch_bytes_max = batch_bytes_max
        # Readers (followers, consumers, the simulator) ask for the batch that starts where their
        # last read ended, almost always a recent one: remember where the latest batches start so
        # those reads skip the header walk from the sparse index entry.
        self.recent_starts: dict[int, tuple[int, BatchHeader]] = {}

    def __repr__(self) -> str:
        return f"Segment({self.base_offset}..{self.next_offset}, {self.size_bytes} bytes)"

    @property
    def size_bytes(self) -> int:
        return self.handle.size

    @property
    def is_empty(self) -> bool:
        return self.size_bytes == 0

    @property
    def max_timestamp_ms(self) -> int:
        return self.index.max_timestamp_ms

    @property
    def sealed(self) -> bool:
        """A refused range that runs to the end of the file: nothing can follow it here."""
        return bool(self.refused) and self.refused[-1].end_position >= self.size_bytes > 0

    # -- building ---------------------------------------------------------------------------
    def record(self, position: int, header: BatchHeader, *, force_index: bool = False) -> None:
        """Account for a batch already in the file at `position` (in log order)."""
        self.index.add(position, header, force=force_index)
        self.next_offset = header.next_offset

    def refuse(self, refused: RefusedRange) -> None:
        self.refused.append(refused)
        self.refused.sort()
        if refused.last_offset >= self.next_offset:
            self.next_offset = refused.last_offset + 1

    def append(self, parts: Sequence[Buffer], headers: Sequence[BatchHeader]) -> None:
        """Write whole batches at the end (one write call) and index them."""
        position = self.size_bytes
        if len(parts) == 1:
            self.handle.append(parts[0])
        else:
            self.handle.append_parts(parts)
        recent = self.recent_starts
        for header in headers:
            self.index.add(position, header)
            recent[header.base_offset] = (position, header)
            position += header.size
        if len(recent) > RECENT_STARTS_MAX:
            for offset in list(recent)[: len(recent) - RECENT_STARTS_MAX]:
                del recent[offset]
        self.next_offset = headers[-1].next_offset

    # -- lookups ----------------------------------------------------------------------------
    def refused_range_at(self, offset: int) -> RefusedRange | None:
        for refused in self.refused:
            if refused.first_offset <= offset <= refused.last_offset:
                return refused
        return None

    def readable_end(self, position: int) -> int:
        """Where a read starting at `position` must stop: the next refused range or the end."""
        for refused in self.refused:
            if refused.start_position >= position:
                return refused.start_position
        return self.size_bytes

    def batches_from(self, position: int) -> Iterator[tuple[int, BatchHeader]]:
        """Headers from the batch at `position` to the end, stepping over refused ranges."""
        while position < self.size_bytes:
            end = self.readable_end(position)
            yield from iter_batches_in_file(self.handle, position, end, verify=False,
                                            batch_bytes_max=self.batch_bytes_max)
            skipped = [refused.end_position for refused in self.refused if refused.start_position == end]
            if not skipped or skipped[-1] <= end:
                return
            position = skipped[-1]

    def find_batch(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the batch holding `offset`, or the first batch after it; None
        when the segment has nothing at or after `offset` outside refused ranges."""
        recent = self.recent_starts.get(offset)
        if recent is not None and not self.refused:
            return recent
        for position, header in self.batches_from(self.index.floor_position(offset)):
            if header.next_offset > offset:
                return position, header
        return None

    def find_timestamp(self, timestamp_ms: int, min_position: int = 0) -> tuple[int, BatchHeader] | None:
        """The first batch at or after `min_position` (a batch boundary) whose max_timestamp_ms
        >= timestamp_ms (None when none is)."""
        if self.max_timestamp_ms < timestamp_ms:
            return None
        position, _ = self.index.floor_entry_for_timestamp(timestamp_ms)
        for found_position, header in self.batches_from(max(position, min_position)):
            if header.max_timestamp_ms >= timestamp_ms:
                return found_position, header
        return None

    # -- shrinking --------------------------------------------------------------------------
    def tail_before(self, position: int) -> tuple[int, int]:
        """What the index keeps past its last entry below `position`, walking the batches from
        there: (their largest max_timestamp_ms, their bytes). Raises `CorruptBatch` for a header
        damaged on the way, before anything is cut."""
        entry_position, max_timestamp_ms = self.index.floor_entry_for_position(position - 1)
        if position == 0:
            entry_position, max_timestamp_ms = 0, NO_TIMESTAMP
        bytes_since_entry = 0
        for _, header in iter_batches_in_file(self.handle, entry_position, position, verify=False,
                                              batch_bytes_max=self.batch_bytes_max):
            max_timestamp_ms = max(max_timestamp_ms, header.max_timestamp_ms)
            bytes_since_entry += header.size
        return max_timestamp_ms, bytes_since_entry

    def truncate_at(self, position: int, next_offset: int, tail: tuple[int, int]) -> None:
        """Cut the file at `position` (a batch boundary or refused-range start), the index tail
        re-derived as `tail_before(position)` gave it."""
        max_timestamp_ms, bytes_since_entry = tail
        self.handle.truncate(position)
        self.recent_starts = {offset: start for offset, start in self.recent_starts.items() if start[0] < position}
        self.index.truncate(position, max_timestamp_ms, bytes_since_entry)
        self.refused = [refused for refused in self.refused if refused.start_position < position]
        self.synced_bytes = min(self.synced_bytes, position)
        self.next_offset = next_offset

    def sync(self) -> None:
        if self.synced_bytes != self.size_bytes:
            self.handle.sync()
            self.synced_bytes = self.size_bytes
