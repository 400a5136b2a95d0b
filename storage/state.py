"""Durable small state for the coordinator: a key-value map kept as an append-only journal.

The file starts with two 32-byte header slots, then records:

    length u32 | crc32(body) u32 | body = msgpack [op, key, value]

with op PUT (value), DELETE (no value) or PUT_MANY (key unused, value = [[key, value], ...], so a
group of changes survives a crash all together or not at all). Replaying the records in order
rebuilds the map. The file is created whole (header included) by an atomic rename, and each
later header write touches one slot, so a file shorter than its header or with neither slot
readable is damage: open raises `CorruptState` rather than start an empty map. A record whose CRC
checks out but whose content is not a well-formed operation (a key that is not a string, a
PUT_MANY that is not a list of pairs) is treated like one whose CRC fails.

Recovery follows the partition log's rules. Each flush writes, in the same fdatasync as the new
records, a header slot (alternating, with a sequence number and CRC) saying how long the journal
was at the *previous* flush: that prefix is certainly durable, so a record failing its checks
inside it is corruption and open raises `CorruptState` (logged loudly) rather than silently
dropping committed state. Past it, the first torn or failing record and everything after it is
truncated and reported. (The records of the very last flush are therefore CRC-checked like a
tail: a torn write there is indistinguishable from a crash before the sync.)

With `confirm=True` a flush closes that window: once the records are synced, the other slot is
written with the journal's new length and synced too (a second fdatasync, ~1 ms here). A crash
between the two leaves the previous slot, whose flush had not returned, so nothing acknowledged
depends on those records; after the second sync, bit rot anywhere in the journal is corruption.
The coordinator confirms (its records are leader epochs: losing the last one could hand the same
epoch to two leaders); the group coordinator does not (losing its last flush to bit rot re-delivers
records — offsets move back — which at-least-once allows).

The journal is compacted, once it holds more than max(compact_min_records, 4 x live keys)
records, by writing the live keys to a temporary file, fsyncing it, renaming it over the journal
and fsyncing the directory; a crash at any point leaves either the old journal or the new one.
Values are what `msgspec.msgpack` encodes; `get` returns them as they decode (tuples come back as
lists, before and after a restart alike). Callers must not mutate returned values in place.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from typing import Any, Iterable

import msgspec
from sortedcontainers import SortedDict

from storage.errors import CorruptState, FsyncFailed, LogClosed, StorageFull
from storage.fs import FileHandle, FileSystem, OsFileSystem
from storage.journal_frames import RECORD, RECORD_BYTES_MAX, count_records

logger = logging.getLogger("railmq.storage")

PUT, DELETE, PUT_MANY = 0, 1, 2
_SLOT = struct.Struct("<IQQ")  # magic, sequence, durable journal length
_CRC = struct.Struct("<I")
_RECORD = RECORD  # storage/journal_frames.py
_MAGIC = 0x44535431  # "DST1"
SLOT_BYTES = 32
HEADER_BYTES = 2 * SLOT_BYTES

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


class StateRecoveryReport(msgspec.Struct):
    truncated_bytes: int = 0
    truncated_records: int = 0  # records (the last possibly torn) cut from the tail
    records: int = 0  # records replayed
    seconds: float = 0.0


class RecordTooLarge(ValueError):
    """A put whose encoded record exceeds RECORD_BYTES_MAX (a caller bug: nothing was written)."""


def encode_record(op: int, key: str | None, value: Any) -> bytes:
    body = _encoder.encode([op, key, value])
    if len(body) > RECORD_BYTES_MAX:
        raise RecordTooLarge(f"state record of {len(body)} bytes exceeds {RECORD_BYTES_MAX}")
    return _RECORD.pack(len(body), zlib.crc32(body)) + body


def _encode_slot(sequence: int, durable_length: int) -> bytes:
    body = _SLOT.pack(_MAGIC, sequence, durable_length)
    return (body + _CRC.pack(zlib.crc32(body))).ljust(SLOT_BYTES, b"\0")


def _decode_slots(data: bytes) -> tuple[int, int] | None:
    """(sequence, durable length) from the newest valid slot, or None when neither is valid."""
    best = None
    for slot in range(2):
        raw = data[slot * SLOT_BYTES: slot * SLOT_BYTES + _SLOT.size + _CRC.size]
        if len(raw) < _SLOT.size + _CRC.size or _CRC.unpack_from(raw, _SLOT.size)[0] != zlib.crc32(raw[:_SLOT.size]):
            continue
        magic, sequence, length = _SLOT.unpack_from(raw)
        if magic == _MAGIC and (best is None or sequence > best[0]):
            best = (sequence, length)
    return best


def _open_journal(fs: FileSystem, path: str) -> tuple[FileHandle, bytes]:
    """The journal's handle and content; a path that cannot be opened or read as a file (a
    directory in its place, no permission, EIO) is a `CorruptState` naming it, so the owner
    refuses to start instead of crashing."""
    try:
        handle = fs.open(path)
    except OSError as error:
        message = f"{path}: cannot be opened as the state journal ({error.strerror or error})"
        logger.critical(message)
        raise CorruptState(message) from None
    try:
        return handle, handle.read_at(0, handle.size)
    except OSError as error:
        handle.close()
        message = f"{path}: cannot be read ({error.strerror or error})"
        logger.critical(message)
        raise CorruptState(message) from None


class DurableState:
    def __init__(self, fs: FileSystem, path: str, compact_min_records: int, confirm: bool = False) -> None:
        self._fs = fs
        self._path = path
        self._compact_min_records = compact_min_records
        self._confirm = confirm
        self._data: SortedDict = SortedDict()
        self._records = 0
        self._sequence = 0
        self._flushed_length = HEADER_BYTES  # journal length covered by the last successful flush
        self._handle: FileHandle | None = None
        self._closed_reason: str | None = None
        self._compact_retry_records = 0  # after a compaction the disk had no room for: wait until this many
        self.recovery = StateRecoveryReport()

    @classmethod
    def open(cls, path: str, *, fs: FileSystem | None = None, compact_min_records: int = 1000,
             confirm: bool = False) -> "DurableState":
        fs = fs if fs is not None else OsFileSystem()
        state = cls(fs, path, compact_min_records, confirm)
        state._recover()
        return state

    @classmethod
    def read(cls, path: str, *, fs: FileSystem | None = None, confirm: bool = False) -> list[tuple[str, Any]]:
        """The items the journal at `path` holds, as `open` would recover them, writing nothing
        (no tail cut, no header created): for reading a file another process owns, such as the
        single coordinator's state a new quorum starts from. Damage is `CorruptState` as in open."""
        state = cls(fs if fs is not None else OsFileSystem(), path, compact_min_records=0, confirm=confirm)
        try:
            data = state._fs.read_file(path)
        except OSError as error:
            raise CorruptState(f"{path}: cannot be read as a state journal ({error.strerror or error})") from None
        state._replay(data, state._header(data)[1])
        return items_with_prefix(state._data, "")

    # -- recovery ---------------------------------------------------------------------------
    def _recover(self) -> None:
        started = time.perf_counter()
        directory = os.path.dirname(self._path) or "."
        self._fs.make_directory(directory)
        if not self._fs.exists(self._path):  # created whole or not at all: never a file shorter than its header
            self._fs.write_file_atomic(self._path, _encode_slot(0, HEADER_BYTES) * 2)
        handle, data = _open_journal(self._fs, self._path)
        try:
            self._sequence, durable_length = self._header(data)
        except CorruptState:
            handle.close()
            raise
        end = self._replay(data, durable_length)
        if end < len(data):
            self.recovery.truncated_bytes = len(data) - end
            self.recovery.truncated_records = count_records(data, end)
            logger.warning("%s: cut %d bytes (%d records) of torn or corrupt journal tail", self._path,
                           self.recovery.truncated_bytes, self.recovery.truncated_records)
            handle.truncate(end)
            handle.sync()
        self._handle = handle
        self._flushed_length = end
        self.recovery.seconds = time.perf_counter() - started

    def _header(self, data: bytes) -> tuple[int, int]:
        """(sequence, durable length) of the journal `data`, or CorruptState."""
        slots = _decode_slots(data) if len(data) >= HEADER_BYTES else None
        if slots is None:
            # Every writer leaves a whole header with at least one readable slot (in-place writes
            # touch one slot at a time), so a file without one is damage, never a new journal:
            # refuse it rather than read its records as an unconfirmed tail and cut them all, or
            # append records over a header that is not there.
            message = (f"{self._path}: no whole, readable header slot ({len(data)} bytes); refusing to treat "
                       "the journal as empty")
            logger.critical(message)
            raise CorruptState(message)
        return slots

    def _replay(self, data: bytes, durable_length: int) -> int:
        """Apply records in order; return where the valid journal ends."""
        position = HEADER_BYTES
        view = memoryview(data)
        while position < len(data):
            try:
                body_end, record = _parse_record(view, position)
            except ValueError as error:
                if position < durable_length:
                    message = (f"{self._path}: record at byte {position} fails its checks inside the flushed "
                               f"region (up to byte {durable_length}): {error}")
                    logger.critical(message)
                    raise CorruptState(message) from None
                break
            self._apply(*record)
            position = body_end
        if position < durable_length:
            message = f"{self._path}: journal ends at byte {position}, but {durable_length} bytes were flushed"
            logger.critical(message)
            raise CorruptState(message)
        self.recovery.records = self._records
        return position

    def _apply(self, op: int, key: str | None, value: Any) -> None:
        if op == PUT:
            self._data[key] = value
        elif op == DELETE:
            self._data.pop(key, None)
        else:
            for item_key, item_value in value:
                self._data[item_key] = item_value
        self._records += 1

    # -- the API ----------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        self._check_open()
        return self._data.get(key, default)

    def items(self, prefix: str = "") -> list[tuple[str, Any]]:
        """(key, value) pairs whose key starts with `prefix`, sorted by key."""
        self._check_open()
        return items_with_prefix(self._data, prefix)

    def __len__(self) -> int:
        return len(self._data)

    def put(self, key: str, value: Any) -> None:
        self._write(PUT, key, value)

    def put_many(self, items: Iterable[tuple[str, Any]]) -> None:
        """Several puts in one record: after a crash either all of them are there or none."""
        pairs = [[key, value] for key, value in items]
        for key, _ in pairs:
            _check_key(key)
        if pairs:
            self._write(PUT_MANY, None, pairs)

    def delete(self, key: str) -> None:
        self._check_open()
        if key in self._data:
            self._write(DELETE, key, None)

    def _write(self, op: int, key: str | None, value: Any) -> None:
        self._check_open()
        if op != PUT_MANY:
            _check_key(key)
        record = encode_record(op, key, value)
        self._handle.append(record)  # StorageFull leaves the journal as it was: the fs rolls back
        _, decoded_key, decoded_value = _decoder.decode(memoryview(record)[_RECORD.size:])
        self._apply(op, decoded_key, decoded_value)  # keep what a restart would read back
        if self._records > max(self._compact_min_records, 4 * len(self._data), self._compact_retry_records):
            self._compact_after_write()

    def _compact_after_write(self) -> None:
        """Compact, as part of a write that has already happened: a full disk must not make the
        caller believe that write failed (it is in the journal and in the map). The journal is
        left as it was; the next attempt waits until it has grown by as many records again, so a
        full disk does not cost a rewrite of the whole map on every put."""
        try:
            self.compact()
        except StorageFull as error:
            self._compact_retry_records = 2 * self._records
            logger.warning("%s: compaction postponed to %d records: %s", self._path, self._compact_retry_records, error)

    def flush(self) -> None:
        """fdatasync: every put before this call survives a crash once it returns."""
        self._check_open()
        if self._handle.size == self._flushed_length:
            return
        length = self._handle.size
        with _FailOnFsync(self):
            # Each slot's sequence is taken only once it is written: a write refused by a full disk
            # and retried goes to the same (older) slot, never over the one naming the newest length.
            self._write_slot(self._flushed_length)
            if self._confirm:  # the records are durable: say so, in the other slot
                self._write_slot(length)
        self._flushed_length = length

    def _write_slot(self, durable_length: int) -> None:
        sequence = self._sequence + 1
        self._handle.write_at((sequence % 2) * SLOT_BYTES, _encode_slot(sequence, durable_length))
        self._handle.sync()
        self._sequence = sequence

    def compact(self) -> None:
        """Rewrite the journal as one put per live key (temporary file, fsync, rename, fsync dir)."""
        self._check_open()
        records = [encode_record(PUT, key, value) for key, value in self._data.items()]
        length = HEADER_BYTES + sum(len(record) for record in records)
        # Sequence 1 lives in slot 1, so the next flush (sequence 2) writes slot 0, not this one.
        content = _encode_slot(0, HEADER_BYTES) + _encode_slot(1, length) + b"".join(records)
        with _FailOnFsync(self):
            self._fs.write_file_atomic(self._path, content)
        self._handle.close()
        self._handle = self._fs.open(self._path)
        self._records = len(records)
        self._sequence = 1
        self._flushed_length = length
        self._compact_retry_records = 0

    def close(self) -> None:
        if self._closed_reason == _CLOSED:
            return
        try:
            if self._closed_reason is None:
                self.flush()
        finally:
            self._closed_reason = _CLOSED
            if self._handle is not None:
                self._handle.close()

    def _check_open(self) -> None:
        if self._closed_reason is not None:
            raise LogClosed(f"{self._path}: {self._closed_reason}")


_CLOSED = "the state is closed"


def items_with_prefix(data: SortedDict, prefix: str) -> list[tuple[str, Any]]:
    """(key, value) pairs of a sorted map whose key starts with `prefix`, sorted by key (the
    replicated map of actors/replicated_state.py reads the same way)."""
    found = []
    for key in data.irange(minimum=prefix):
        if not key.startswith(prefix):
            break
        found.append((key, data[key]))
    return found


class _FailOnFsync:
    def __init__(self, state: DurableState) -> None:
        self._state = state

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: object) -> bool:
        if kind is not None and issubclass(kind, FsyncFailed):
            self._state._closed_reason = "an fsync failed; the state must be reopened (crash recovery)"
            logger.critical("%s: fsync failed (%s); refusing further work", self._state._path, error)
        return False


def _check_key(key: object) -> None:
    if not isinstance(key, str):
        raise TypeError(f"state keys are str, got {type(key).__name__}")


def _parse_record(view: memoryview, position: int) -> tuple[int, tuple[int, str | None, Any]]:
    """(end position, (op, key, value)) of the record at `position`; ValueError when it is bad."""
    if len(view) - position < _RECORD.size:
        raise ValueError(f"truncated record header ({len(view) - position} bytes)")
    length, crc = _RECORD.unpack_from(view, position)
    body_start = position + _RECORD.size
    if length == 0 or length > RECORD_BYTES_MAX:
        raise ValueError(f"absurd record length {length}")
    if body_start + length > len(view):
        raise ValueError(f"torn record: {length} bytes promised, {len(view) - body_start} present")
    body = view[body_start: body_start + length]
    if zlib.crc32(body) != crc:
        raise ValueError("record CRC mismatch")
    try:
        op, key, value = _decoder.decode(body)
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError) as error:
        raise ValueError(f"record does not decode: {type(error).__name__}: {error}"[:200]) from None
    _check_operation(op, key, value)
    return body_start + length, (op, key, value)


def _check_operation(op: object, key: object, value: object) -> None:
    """ValueError unless (op, key, value) is what `_write` could have written."""
    if type(op) is not int or op not in (PUT, DELETE, PUT_MANY):
        raise ValueError(f"unknown record op {op!r:.40}")
    if op != PUT_MANY:
        if not isinstance(key, str):
            raise ValueError(f"record key is a {type(key).__name__}, not a str")
        return
    if not isinstance(value, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) for pair in value):
        raise ValueError("PUT_MANY record is not a list of [str key, value] pairs")
