"""The recovery-point checkpoint: how far the log is known to be durable, and its log start.

Everything below `recovery_offset` was covered by an fsync when the checkpoint was written, so on
open that region only gets a header walk and any failure in it is corruption to refuse, never a
torn tail to cut. The checkpoint also holds the byte position of the recovery point inside its
segment (so a scan can resume there after a refused range) and the log start offset (moved by
DeleteRecords, which would otherwise be forgotten on restart), the high watermark the replica had
seen committed with the leader epoch it learned it in (a follower never truncates below it on a
leader's word alone), and whether the last close was clean: `close()` writes `clean`, and the
first checkpoint after open clears it, so a crash is always told apart from a clean stop
(Kafka's clean-shutdown file, KIP-966's unclean-shutdown detection).

Format: two fixed 64-byte slots, written alternately in place with a sequence number and a CRC,
then fdatasync'ed, like a file-system superblock pair. A torn slot write fails its CRC and the
other slot, one flush older, still stands; no rename or directory fsync is needed per flush.

The CRC of a slot (format RPC3) is seeded with its owner (cluster, topic, topic id, partition,
node), so another replica's checkpoint copied in its place fails its check like a damaged one:
taken as this replica's, its higher log start hid acknowledged records below it with no word.
Slots of the earlier formats, which name no owner, are still read (they are rewritten as RPC3
at the first checkpoint after open).
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from storage.fs import FileHandle, FileSystem

RECOVERY_POINT_NAME = "recovery-point-checkpoint"
_MAGIC = 0x52504333  # "RPC3": the CRC is seeded with the owner
_MAGIC_V2 = 0x52504332  # "RPC2": the same slot, no owner
_MAGIC_V1 = 0x52504331  # "RPC1": no high watermark, never clean
# magic, sequence, recovery offset, segment base, position, log start, high watermark,
# high-watermark epoch, flags (bit 0: written by a clean close)
_SLOT = struct.Struct("<IQqqqqqiB")
_SLOT_V1 = struct.Struct("<IQqqqq")
_CLEAN = 1
_CRC = struct.Struct("<I")
SLOT_BYTES = 64
assert _SLOT.size + _CRC.size <= SLOT_BYTES


class RecoveryPoint(NamedTuple):
    recovery_offset: int  # every offset below is durable
    segment_base_offset: int  # the segment holding the recovery point
    position: int  # byte position of the recovery point in that segment
    log_start_offset: int
    high_watermark: int = 0  # the committed end this replica had seen when writing the point
    high_watermark_epoch: int = -1  # the leader epoch in which it learned that high watermark
    clean: bool = False  # written by a clean close, nothing appended since


class RecoveryPointFile:
    def __init__(self, fs: FileSystem, path: str, owner: bytes = b"") -> None:
        self._handle: FileHandle = fs.open(path, create=True)
        self._seed = zlib.crc32(owner)
        self._sequence = 0
        self.point: RecoveryPoint | None = None
        self._load()

    def _load(self) -> None:
        data = self._handle.read_at(0, 2 * SLOT_BYTES)
        best: tuple[int, RecoveryPoint] | None = None
        for slot in range(2):
            decoded = _decode_slot(data[slot * SLOT_BYTES: (slot + 1) * SLOT_BYTES], self._seed)
            if decoded is not None and (best is None or decoded[0] > best[0]):
                best = decoded
        if best is not None:
            self._sequence, self.point = best

    def store(self, point: RecoveryPoint) -> None:
        """Write `point` into the older slot and fdatasync; raises FsyncFailed like any sync."""
        if point == self.point:
            return
        # The sequence moves only once the slot is written: a store refused by a full disk and
        # retried must write the older slot again, never the one holding the newest point.
        sequence = self._sequence + 1
        *fields, clean = point
        body = _SLOT.pack(_MAGIC, sequence, *fields, _CLEAN if clean else 0)
        slot = body + _CRC.pack(zlib.crc32(body, self._seed))
        self._handle.write_at((sequence % 2) * SLOT_BYTES, slot.ljust(SLOT_BYTES, b"\0"))
        self._handle.sync()
        self._sequence = sequence
        self.point = point

    def close(self) -> None:
        self._handle.close()


def _decode_slot(data: bytes, seed: int) -> tuple[int, RecoveryPoint] | None:
    for layout in (_SLOT, _SLOT_V1):
        if len(data) < layout.size + _CRC.size:
            continue
        (crc,) = _CRC.unpack_from(data, layout.size)
        magic, sequence, *fields = layout.unpack_from(data)
        if crc != zlib.crc32(data[: layout.size], seed if magic == _MAGIC else 0):
            continue
        if layout is _SLOT and magic in (_MAGIC, _MAGIC_V2):
            *values, flags = fields
            return sequence, RecoveryPoint(*values, clean=bool(flags & _CLEAN))
        if layout is _SLOT_V1 and magic == _MAGIC_V1:
            return sequence, RecoveryPoint(*fields)
    return None
