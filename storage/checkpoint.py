"""The recovery-point checkpoint: how far the log is known to be durable, and its log start.

Everything below `recovery_offset` was covered by an fsync when the checkpoint was written, so on
open that region only gets a header walk and any failure in it is corruption to refuse, never a
torn tail to cut. The checkpoint also holds the byte position of the recovery point inside its
segment (so a scan can resume there after a refused range) and the log start offset (moved by
DeleteRecords, which would otherwise be forgotten on restart).

Format: two fixed 64-byte slots, written alternately in place with a sequence number and a CRC,
then fdatasync'ed, like a file-system superblock pair. A torn slot write fails its CRC and the
other slot, one flush older, still stands; no rename or directory fsync is needed per flush.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from storage.fs import FileHandle, FileSystem

RECOVERY_POINT_NAME = "recovery-point-checkpoint"
_MAGIC = 0x52504331  # "RPC1"
_SLOT = struct.Struct("<IQqqqq")  # magic, sequence, recovery offset, segment base, position, log start
_CRC = struct.Struct("<I")
SLOT_BYTES = 64
assert _SLOT.size + _CRC.size <= SLOT_BYTES


class RecoveryPoint(NamedTuple):
    recovery_offset: int  # every offset below is durable
    segment_base_offset: int  # the segment holding the recovery point
    position: int  # byte position of the recovery point in that segment
    log_start_offset: int


class RecoveryPointFile:
    def __init__(self, fs: FileSystem, path: str) -> None:
        self._handle: FileHandle = fs.open(path, create=True)
        self._sequence = 0
        self.point: RecoveryPoint | None = None
        self._load()

    def _load(self) -> None:
        data = self._handle.read_at(0, 2 * SLOT_BYTES)
        best: tuple[int, RecoveryPoint] | None = None
        for slot in range(2):
            decoded = _decode_slot(data[slot * SLOT_BYTES: (slot + 1) * SLOT_BYTES])
            if decoded is not None and (best is None or decoded[0] > best[0]):
                best = decoded
        if best is not None:
            self._sequence, self.point = best

    def store(self, point: RecoveryPoint) -> None:
        """Write `point` into the older slot and fdatasync; raises FsyncFailed like any sync."""
        if point == self.point:
            return
        self._sequence += 1
        body = _SLOT.pack(_MAGIC, self._sequence, *point)
        slot = body + _CRC.pack(zlib.crc32(body))
        self._handle.write_at((self._sequence % 2) * SLOT_BYTES, slot.ljust(SLOT_BYTES, b"\0"))
        self._handle.sync()
        self.point = point

    def close(self) -> None:
        self._handle.close()


def _decode_slot(data: bytes) -> tuple[int, RecoveryPoint] | None:
    if len(data) < _SLOT.size + _CRC.size:
        return None
    (crc,) = _CRC.unpack_from(data, _SLOT.size)
    if crc != zlib.crc32(data[: _SLOT.size]):
        return None
    magic, sequence, *fields = _SLOT.unpack_from(data)
    if magic != _MAGIC:
        return None
    return sequence, RecoveryPoint(*fields)
