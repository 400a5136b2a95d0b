"""The bytes of a ring segment: where each header word sits, how a record is framed, and the
errors every part of the ring raises (transport/ring.py, transport/ring_end.py).

Segment layout. Header fields are aligned u64 words, one cache line per owner:

    word 0-4    magic, layout version, capacity in bytes, flags (bit 0: payload CRC),   fixed
                the ring's key (random, from its creator: who can map the segment knows it)
    word 8-12   write position, writer pid, writer start ms, writer closed, writer wants doorbell
    word 16-20  read position,  reader pid, reader start ms, reader closed, reader wants doorbell
    byte 256    the writer's doorbell endpoint (64 bytes, NUL padded); byte 320: the reader's
    byte 512    the data area, `capacity` bytes

Positions are byte counters that only grow (index = position % capacity). A record is a 24-byte
header (payload length u32, CRC-32 of the payload or 0, the record's own position u64, CRC-32
of those 16 bytes u32, 4 bytes padding; CRCs from storage.checksum, which uses ISA-L when it is
installed) and the payload, padded to 8 bytes, wrapping around the end of the data area when it
must (split copy). The position stamp makes a stale record from an earlier lap, or a torn
header, fail the check instead of being delivered.

This module only describes and checks the layout; it never waits, rings a doorbell or moves a
position. A segment whose fixed header or positions fail their check is `RingCorrupt`, never
used: the magic is written last when a segment is made, so whoever sees it sees the rest.
"""

from __future__ import annotations

import secrets
import struct
from multiprocessing.shared_memory import SharedMemory
from typing import NamedTuple

from transport.shm import ProcessIdentity

RING_MAGIC = int.from_bytes(b"RLMQRING", "little")
LAYOUT_VERSION = 1
FLAG_PAYLOAD_CRC = 1
HEADER_BYTES = 512
RECORD_HEADER = struct.Struct("<IIQI4x")  # payload length, payload CRC, position stamp, header CRC
RECORD_HEADER_BYTES = RECORD_HEADER.size
RECORD_CHECKED = struct.Struct("<IIQ")  # the part of the record header its CRC covers
RECORD_ALIGN_BYTES = 8
ENDPOINT_BYTES_MAX = 64

_MAGIC, _VERSION, _CAPACITY, _FLAGS, _KEY = 0, 1, 2, 3, 4


class EndWords(NamedTuple):
    """The header words (and the endpoint's byte offset) one end of the ring owns."""

    position: int
    pid: int
    start_time_ms: int
    closed: int
    wants_doorbell: int
    endpoint_offset: int


WRITER_WORDS = EndWords(8, 9, 10, 11, 12, 256)
READER_WORDS = EndWords(16, 17, 18, 19, 20, 320)
WRITE_POSITION, READ_POSITION = WRITER_WORDS.position, READER_WORDS.position  # the hot words, as plain ints


class RingError(Exception):
    """Base class of every error the ring raises on purpose."""


class RecordTooLarge(RingError):
    """The record would not fit even an empty ring."""

    def __init__(self, payload_bytes: int, record_bytes_max: int) -> None:
        super().__init__(f"record of {payload_bytes} bytes exceeds the ring's maximum of {record_bytes_max}")
        self.payload_bytes = payload_bytes
        self.record_bytes_max = record_bytes_max


class RingFull(RingError):
    """No room for the record before the deadline: the reader is behind (backpressure)."""


class RingKeyMismatch(RingError):
    """An end was to be held only by whoever knows the ring's key, and the key given is not it."""


class RingCorrupt(RingError):
    """The segment's header or a record fails its check; the ring must be recreated."""


class RingClosed(RingError):
    """The peer closed its end cleanly (for a reader: and every record has been read)."""


class RingBusy(RingError):
    """Another live process already holds this end of the ring."""


class PeerGone(RingError):
    """The process holding the other end died without closing it."""

    def __init__(self, role: str, identity: ProcessIdentity) -> None:
        super().__init__(f"the {role} (pid {identity.pid}) is gone")
        self.role = role
        self.identity = identity


def record_footprint(payload_bytes: int) -> int:
    """Bytes a record of `payload_bytes` occupies in the ring: header and payload, padded."""
    unpadded = RECORD_HEADER_BYTES + payload_bytes
    return (unpadded + RECORD_ALIGN_BYTES - 1) // RECORD_ALIGN_BYTES * RECORD_ALIGN_BYTES


def write_layout(segment: SharedMemory, capacity_bytes: int, payload_crc: bool) -> None:
    """Write the fixed header of a new segment; the magic goes last."""
    words = segment.buf[:HEADER_BYTES].cast("Q")
    words[_VERSION] = LAYOUT_VERSION
    words[_CAPACITY] = capacity_bytes
    words[_FLAGS] = FLAG_PAYLOAD_CRC if payload_crc else 0
    words[_KEY] = secrets.randbits(63) + 1
    words[_MAGIC] = RING_MAGIC  # last: whoever sees the magic sees the rest
    words.release()


def read_layout(name: str, segment: SharedMemory) -> tuple[int, bool, int]:
    """Check the fixed header and the positions; returns (capacity_bytes, payload_crc, key)."""
    words = segment.buf[:HEADER_BYTES].cast("Q") if segment.size >= HEADER_BYTES else None
    try:
        if words is None or words[_MAGIC] != RING_MAGIC or words[_VERSION] != LAYOUT_VERSION:
            raise RingCorrupt(f"segment {name} is not a ring of layout version {LAYOUT_VERSION}")
        capacity_bytes = words[_CAPACITY]
        if capacity_bytes % RECORD_ALIGN_BYTES or HEADER_BYTES + capacity_bytes > segment.size:
            raise RingCorrupt(f"segment {name} declares {capacity_bytes} bytes of capacity it lacks")
        if not 0 <= words[WRITER_WORDS.position] - words[READER_WORDS.position] <= capacity_bytes:
            raise RingCorrupt(f"segment {name} has positions out of order")
        return capacity_bytes, bool(words[_FLAGS] & FLAG_PAYLOAD_CRC), words[_KEY]
    finally:
        if words is not None:
            words.release()
