"""The read path of a partition log: find the batch holding an offset, gather whole batches.

Reads return concatenated whole batches, the first one holding the requested offset, and never
a batch that runs past `max_bytes` (except the first: a reader must always make progress) or that
ends at or past `max_offset` (the high watermark bound). They may span segments.

Every returned batch's CRC is checked here, right after reading it (STYLE rule 7). The price is
one zlib pass over bytes already in cache (zlib's CRC-32 runs at ~3 GB/s, above what a fetch
needs); the gain is that a replica never serves bit rot that a header walk cannot see. A batch
that fails is registered as a refused range of its segment and logged; a read that meets one
first raises `CorruptLog`, a read that meets one later stops before it. Reads never step over a
refused range: that would hide a hole from the consumer.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from contextlib import contextmanager
from typing import Iterator

from storage.batch import FORMAT_VERSION, HEADER_SIZE, BatchHeader, compute_crc, parse_header
from storage.errors import BatchTooLarge, CorruptBatch, CorruptLog
from storage.segment import RefusedRange, Segment

logger = logging.getLogger("railmq.storage")
VERSION_AT = 16  # where the header's version byte is (storage/batch.py): a batch may start 16 bytes before one
VERSION = bytes([FORMAT_VERSION])


def locate(segments: list[Segment], bases: list[int], offset: int) -> tuple[int, int, BatchHeader] | None:
    """(segment index, position, header) of the batch holding `offset` or the first after it.

    Raises `CorruptLog` when `offset` is inside a refused range; None when nothing is at or after it.
    """
    index = max(0, bisect_right(bases, offset) - 1)
    while index < len(segments):
        segment = segments[index]
        refused = segment.refused_range_at(offset)
        if refused is not None:
            raise CorruptLog(f"offsets {refused.first_offset}..{refused.last_offset} of segment "
                             f"{segment.base_offset} failed their checks and are refused",
                             refused.first_offset, refused.last_offset)
        try:
            found = segment.find_batch(offset)
        except (CorruptBatch, BatchTooLarge) as error:
            raise refuse_rest(segment, offset, str(error)) from None
        if found is not None:
            return index, found[0], found[1]
        index += 1
    return None


def gather(segments: list[Segment], index: int, position: int, first: BatchHeader, max_bytes: int,
           max_offset: int | None) -> bytes:
    """Whole batches from `position` of segment `index` (where `first` is), within the bounds."""
    if max_offset is not None and first.last_offset >= max_offset:
        return b""
    pieces: list[bytes] = []
    budget = max(max_bytes, first.size)
    next_offset = first.base_offset
    while index < len(segments) and budget >= HEADER_SIZE:
        segment = segments[index]
        limit = segment.readable_end(position)
        if position >= limit:
            if limit < segment.size_bytes or _refused_at_end(segment):
                break  # a refused range follows: the next read starts there and raises
            index, position = index + 1, 0
            continue
        chunk = segment.handle.read_at(position, min(limit - position, budget))
        used, next_offset, stop = _whole_batches(segment, chunk, position, next_offset, max_offset, not pieces)
        if used:
            pieces.append(chunk if used == len(chunk) else chunk[:used])
        budget -= used
        position += used
        if stop or position < limit:
            break
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _whole_batches(segment: Segment, chunk: bytes, chunk_position: int, next_offset: int,
                   max_offset: int | None, first_read: bool) -> tuple[int, int, bool]:
    """How many leading bytes of `chunk` are whole, in-bound, CRC-valid batches.

    Returns (bytes used, the offset after them, whether the read must stop here).
    """
    used = 0
    readable = segment.readable_end(chunk_position) - chunk_position
    while used + HEADER_SIZE <= len(chunk):
        try:
            header = parse_header(chunk, used, batch_bytes_max=segment.batch_bytes_max, available=readable - used)
        except (CorruptBatch, BatchTooLarge) as error:
            refused = refuse_rest(segment, next_offset, str(error))
            if first_read and used == 0:
                raise refused from None
            return used, next_offset, True
        if used + header.size > len(chunk):
            return used, next_offset, False
        if max_offset is not None and header.last_offset >= max_offset:
            return used, next_offset, True
        if compute_crc(chunk, used, header) != header.crc:
            refused = _refuse_batch(segment, chunk_position + used, header, next_offset)
            if first_read and used == 0:
                raise refused
            return used, next_offset, True
        used += header.size
        next_offset = header.next_offset
    return used, next_offset, False


def _refused_at_end(segment: Segment) -> bool:
    return any(refused.start_position >= segment.size_bytes for refused in segment.refused)


def _refuse_batch(segment: Segment, position: int, header: BatchHeader, expected_offset: int) -> CorruptLog:
    """Refuse a batch whose CRC fails. Its header is a claim, and a damaged one: the record count
    or length it gives may be the flipped bits. The offsets refused are the ones the log knows:
    from where this batch had to start to before the next batch that parses (or the segment's end
    as written) — never past it, or the log end would jump over offsets that never existed. The
    bytes refused end at the first intact batch inside the claimed span, if there is one."""
    first = expected_offset
    last = segment.next_offset - 1
    intact = find_intact_batch(segment, position, position + header.size, first, last)
    following = intact[0] if intact is not None else position + header.size
    if following + HEADER_SIZE <= segment.size_bytes:
        try:
            after = parse_header(segment.handle.read_at(following, HEADER_SIZE), 0,
                                 batch_bytes_max=segment.batch_bytes_max, available=segment.size_bytes - following)
        except (CorruptBatch, BatchTooLarge):
            after = None
        if after is not None and first < after.base_offset <= last:
            last = after.base_offset - 1
    last = max(first, min(last, header.last_offset if header.base_offset == first else last))
    refused = RefusedRange(first, last, position, following)
    segment.refuse(refused)
    return _report(segment, refused, "CRC mismatch found by a read")


def find_intact_batch(segment: Segment, start: int, end: int, first: int, last: int) -> tuple[int, BatchHeader] | None:
    """(position, header) of the first intact batch in bytes (start, end) of `segment`, if any. A
    damaged length or record count claims the bytes of the batches after it; with no other copy
    they would be unreadable. Intact means a header that parses at a version byte, offsets in
    (first, last] that the log wrote, and a CRC that matches: what a header walk cannot fake. The
    batch at `start` was at most `batch_bytes_max` long, so the search reads no further."""
    end = min(end, segment.size_bytes, start + segment.batch_bytes_max)
    if end - start <= HEADER_SIZE:
        return None
    span = segment.handle.read_at(start, min(end + HEADER_SIZE, segment.size_bytes) - start)
    candidate = span.find(VERSION, HEADER_SIZE + VERSION_AT, end - start + VERSION_AT)
    while candidate >= 0:
        at = candidate - VERSION_AT
        try:
            header = parse_header(span, at, batch_bytes_max=segment.batch_bytes_max,
                                  available=segment.size_bytes - start - at)
        except (CorruptBatch, BatchTooLarge):
            header = None
        if header is not None and first < header.base_offset <= last and compute_crc(
                segment.handle.read_at(start + at, header.size), 0, header) == header.crc:
            return start + at, header
        candidate = span.find(VERSION, candidate + 1, end - start + VERSION_AT)
    return None


@contextmanager
def refusing_damage(segment: Segment) -> Iterator[None]:
    """Turn a header that fails its checks during a walk of `segment` into a refused range and
    `CorruptLog`, as a read does: a header walk (a ListOffsets by time, a waiting fetch's count, a
    truncation finding its cut) is a read too, and a bare `CorruptBatch` ended the replica's step.
    The damaged batch is the first one a walk from the segment's start fails at."""
    try:
        yield
    except (CorruptBatch, BatchTooLarge) as error:
        raise refuse_rest(segment, _first_damaged_offset(segment), str(error)) from None


def _first_damaged_offset(segment: Segment) -> int:
    """The offset the first batch that fails a header walk of `segment` would start at."""
    expected = segment.base_offset
    try:
        for _, header in segment.batches_from(0):
            expected = header.next_offset
    except (CorruptBatch, BatchTooLarge):
        pass
    return expected


def refuse_rest(segment: Segment, first_offset: int, reason: str) -> CorruptLog:
    """A header failed where the log wrote a good one: refuse up to the next known boundary."""
    start = _position_of_offset(segment, first_offset)
    end = segment.readable_end(start)
    later = [refused.first_offset for refused in segment.refused if refused.start_position >= end]
    last = (min(later) if later and end < segment.size_bytes else segment.next_offset) - 1
    intact = find_intact_batch(segment, start, end, first_offset, last)
    if intact is not None:
        end, last = intact[0], intact[1].base_offset - 1
    refused = RefusedRange(first_offset, max(first_offset, last), start, end)
    segment.refuse(refused)
    return _report(segment, refused, reason)


def _position_of_offset(segment: Segment, offset: int) -> int:
    position = segment.index.floor_position(offset)
    try:
        for batch_position, header in segment.batches_from(position):
            if header.next_offset > offset:
                return batch_position
            position = batch_position + header.size
    except (CorruptBatch, BatchTooLarge):
        pass
    return position


def _report(segment: Segment, refused: RefusedRange, reason: str) -> CorruptLog:
    message = (f"CORRUPTION in segment {segment.base_offset}: offsets {refused.first_offset}.."
               f"{refused.last_offset} (bytes {refused.start_position}..{refused.end_position}) are refused: {reason}")
    logger.error("%s: %s", segment.handle.path, message)
    return CorruptLog(message, refused.first_offset, refused.last_offset)
