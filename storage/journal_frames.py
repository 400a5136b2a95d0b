"""The framing two journals share — the coordinators' durable state (storage/state.py) and the
controller's raft log (storage/raft_records.py): each record is `length u32 | crc32(body) u32 |
body`, a record claiming more than `RECORD_BYTES_MAX` is corruption, not a record."""

from __future__ import annotations

import struct

RECORD = struct.Struct("<II")  # body length, body CRC
# Why: both journals hold metadata (a topic, a group's offsets, a Raft command); anything near this
# size is a bug upstream.
RECORD_BYTES_MAX = 16 * 1024 * 1024


def count_records(data: bytes | memoryview, position: int) -> int:
    """Records from `position` on as far as their lengths parse (the last may be torn)."""
    count = 0
    while position < len(data):
        count += 1
        if len(data) - position < RECORD.size:
            break
        length, _ = RECORD.unpack_from(data, position)
        if length == 0 or length > RECORD_BYTES_MAX:
            break
        position += RECORD.size + length
    return count
