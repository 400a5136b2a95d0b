"""The on-disk formats of the Raft log (storage/raft_log.py): records, header slots, snapshots.

A journal record is `length u32 | crc32(body) u32 | body`, body = the msgpack of one `RaftEntry`
(array-like); a header slot is 64 bytes: magic, sequence, journal length, base index, term, vote,
commit, snapshot index, then a CRC of those. The magic also says whether the voter is *rejoining*
(its log was lost while its quorum had formed, so it holds no vote it can trust: docs/raft.md §7),
so that mark is lost only with the journal itself, and a lost journal is marked again. A snapshot
file is `magic u32 | crc32 u32 | length u64 | body`, body = msgpack [index, term, voters, data].
Every decoder here checks lengths and CRCs before it believes anything, and says what is wrong in
a ValueError (records: the caller decides whether that is a torn tail or damage) or a
`CorruptRaftSnapshot`.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

import msgspec

from storage.checksum import crc32
from storage.errors import StorageError
from storage.journal_frames import RECORD, RECORD_BYTES_MAX, count_records  # noqa: F401 (re-exported)

LOG_NAME = "raft.log"
SNAPSHOT_NAME = "raft.snapshot"

ENTRY_COMMAND = 0  # an opaque command for the state machine
ENTRY_NOOP = 1  # appended by each new leader (Raft §5.4.2, §8): commits the entries of earlier terms

_MAGIC = 0x52414654  # "RAFT"
_MAGIC_REJOINING = 0x5241464A  # "RAFJ": the same slot, of a voter that must not vote until caught up
_SNAPSHOT_MAGIC = 0x52534E31  # "RSN1"
# magic, sequence, journal length, base index, term, vote, commit, snapshot index
_SLOT = struct.Struct("<IQQQQqQQ")
_CRC = struct.Struct("<I")
SLOT_BYTES = 64
HEADER_BYTES = 2 * SLOT_BYTES
assert _SLOT.size + _CRC.size <= SLOT_BYTES
_RECORD = RECORD  # storage/journal_frames.py: the framing the coordinators' state uses too
_SNAPSHOT_HEADER = struct.Struct("<IIQ")  # magic, body CRC, body length
SNAPSHOT_BYTES_MAX = 256 * 1024 * 1024
SNAPSHOT_FILE_BYTES_MAX = _SNAPSHOT_HEADER.size + SNAPSHOT_BYTES_MAX  # what is read of the file at most


class RaftEntry(msgspec.Struct, array_like=True, frozen=True):
    """One log entry. It is the journal's record and travels on the wire unchanged."""

    index: int
    term: int
    kind: int = ENTRY_COMMAND
    data: bytes = b""


class SnapshotMeta(msgspec.Struct, array_like=True, frozen=True):
    """What a snapshot covers: every entry up to `index` (whose term is `term`), applied."""

    index: int
    term: int
    voters: list[int] = []


class HardState(NamedTuple):
    term: int
    vote: int  # 0: no vote in this term
    commit: int


class RaftLogRecovery(msgspec.Struct):
    truncated_bytes: int = 0  # torn or unreadable tail cut on open
    truncated_records: int = 0
    replayed_records: int = 0
    rewritten: bool = False  # a newer snapshot than the journal knew was adopted on open
    header_repaired: bool = False  # the file ended inside slot B; slot A was written whole again


class CorruptRaftLog(StorageError):
    """The journal is damaged inside what a completed flush made durable (or has no readable
    header). Nothing is dropped: the file is left as it is for an operator, and this node must
    not vote or lead until it is repaired (a vote it forgot could be cast twice)."""


class CorruptRaftSnapshot(StorageError):
    """The snapshot file fails its checks, or is missing while the journal relies on it."""


_entry_encoder = msgspec.msgpack.Encoder()
_entry_decoder = msgspec.msgpack.Decoder(RaftEntry)
_snapshot_decoder = msgspec.msgpack.Decoder(tuple[int, int, list[int], bytes])


def encode_entry_record(entry: RaftEntry) -> bytes:
    body = _entry_encoder.encode(entry)
    if len(body) > RECORD_BYTES_MAX:
        raise ValueError(f"raft entry of {len(body)} bytes exceeds {RECORD_BYTES_MAX}")
    return _RECORD.pack(len(body), crc32(body)) + body


class Slot(NamedTuple):
    sequence: int
    length: int
    base_index: int
    term: int
    vote: int
    commit: int
    snapshot_index: int
    rejoining: bool = False


def encode_slot(slot: Slot) -> bytes:
    body = _SLOT.pack(_MAGIC_REJOINING if slot.rejoining else _MAGIC, *slot[:-1])
    return (body + _CRC.pack(crc32(body))).ljust(SLOT_BYTES, b"\0")


def decode_slot(raw: bytes) -> Slot | None:
    if len(raw) < _SLOT.size + _CRC.size:
        return None
    (crc,) = _CRC.unpack_from(raw, _SLOT.size)
    if crc != crc32(raw[: _SLOT.size]):
        return None
    magic, *fields = _SLOT.unpack_from(raw)
    if magic != _MAGIC and magic != _MAGIC_REJOINING:
        return None
    return Slot(*fields, rejoining=magic == _MAGIC_REJOINING)


def choose_slot(data: bytes, path: str) -> tuple[Slot, int]:
    """The slot of the last completed flush in a journal's first bytes, and the length it confirms."""
    a = decode_slot(data[:SLOT_BYTES])
    b = decode_slot(data[SLOT_BYTES:HEADER_BYTES])
    if a is None and b is None:
        raise CorruptRaftLog(f"{path}: neither header slot is readable ({len(data)} bytes)")
    if a is None or b is None:
        only = a if b is None else b
        return only, only.length
    if a.sequence == b.sequence:
        return b, b.length
    if a.sequence == b.sequence + 1:
        return b, b.length  # the flush writing A never finished: B is the last one that did
    raise CorruptRaftLog(f"{path}: header slots disagree (sequences {a.sequence} and {b.sequence})")


def rejoining_on_disk(directory: str) -> bool:
    """Whether the journal in `directory`, as its last completed flush left it, carries the
    rejoining mark (for operators and tests watching a voter from outside its process)."""
    path = os.path.join(directory, LOG_NAME)
    with open(path, "rb") as handle:
        return choose_slot(handle.read(HEADER_BYTES), path)[0].rejoining


def parse_record(view: memoryview, position: int) -> tuple[int, RaftEntry]:
    """(end position, entry) of the record at `position`; ValueError when it is bad."""
    if len(view) - position < _RECORD.size:
        raise ValueError(f"truncated record header ({len(view) - position} bytes)")
    length, crc = _RECORD.unpack_from(view, position)
    start = position + _RECORD.size
    if length == 0 or length > RECORD_BYTES_MAX:
        raise ValueError(f"absurd record length {length}")
    if start + length > len(view):
        raise ValueError(f"torn record: {length} bytes promised, {len(view) - start} present")
    body = view[start: start + length]
    if crc32(body) != crc:
        raise ValueError("record CRC mismatch")
    try:
        entry = _entry_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise ValueError(f"record does not decode: {error}") from None
    if entry.kind not in (ENTRY_COMMAND, ENTRY_NOOP) or entry.index < 1 or entry.term < 0:
        # What the wire refuses (actors/raft/inbound.py) the disk must not slip in: an unknown
        # kind would be applied as a no-op, its command silently skipped.
        raise ValueError(f"record holds an impossible entry (index {entry.index}, term {entry.term}, "
                         f"kind {entry.kind})")
    return start + length, entry


def encode_snapshot(meta: SnapshotMeta, data: bytes) -> bytes:
    body = _entry_encoder.encode((meta.index, meta.term, list(meta.voters), bytes(data)))
    return _SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, crc32(body), len(body)) + body


def decode_snapshot(raw: bytes, path: str = SNAPSHOT_NAME) -> tuple[SnapshotMeta, bytes]:
    if len(raw) < _SNAPSHOT_HEADER.size:
        raise CorruptRaftSnapshot(f"{path}: {len(raw)} bytes, shorter than its header")
    magic, crc, length = _SNAPSHOT_HEADER.unpack_from(raw)
    body = memoryview(raw)[_SNAPSHOT_HEADER.size:]
    if magic != _SNAPSHOT_MAGIC or length != len(body) or length > SNAPSHOT_BYTES_MAX:
        raise CorruptRaftSnapshot(f"{path}: bad header (magic {magic:#x}, length {length} of {len(body)})")
    if crc32(body) != crc:
        raise CorruptRaftSnapshot(f"{path}: CRC mismatch")
    try:
        index, term, voters, data = _snapshot_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise CorruptRaftSnapshot(f"{path}: body does not decode: {error}") from None
    return SnapshotMeta(index=index, term=term, voters=voters), data
