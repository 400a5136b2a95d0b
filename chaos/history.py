"""Reading and writing chaos histories: JSON Lines, one object per line (see docs/history.md).

This module owns the file format and nothing else: it turns lines into dicts, dicts into typed
lines (`SendLine`, `PollLine`, ...), and lines back into bytes. It never judges what a history
says (that is `chaos.checker`).

Reading is strict. Every line must be one JSON object with a string `type` and an integer
`time_ns`; a blank line, a torn last line or a non-object is a `MalformedHistory` naming the
line number, so a checker verdict is never built on a history it only half understood.
`typed_line` then checks the fields its kind needs (`MalformedHistory` again, naming the field);
fields it does not know are ignored, so newer writers stay readable.

`HistoryWriter` is the recorder's end. Invariants it keeps:
- lines appear in the file in the order `write`/`record` returned, and a line is never split or
  interleaved with another, whatever the number of writing threads;
- `record` stamps `time_ns` under the same lock that orders the lines, so stamps never go
  backwards down the file;
- buffered bytes never exceed `buffer_bytes_max` (a full buffer is written out by the caller) and
  nothing stays buffered longer than about `flush_interval_ms` (a background thread flushes);
- after `close()` nothing more is written, and every accepted line is in the file, or else a
  write failed (a full disk) and `HistoryError` says so at the next call and at `close()`.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import msgspec

# A chaos run's recorder sees at most tens of thousands of operations per second; 1 MiB holds
# several thousand lines, so a flush happens on the timer far more often than on size.
HISTORY_BUFFER_BYTES_MAX = 1 << 20
# A crash of the harness loses at most this much history; short enough that a watcher tailing
# the file (`tail -f`) sees operations almost live, long enough that flushing costs nothing.
HISTORY_FLUSH_INTERVAL_MS = 200
# The longest line a reader takes: a final read lists a whole partition (~40 bytes a record, so
# millions of records fit); what is longer is no history (an endless stream), refused by line.
HISTORY_LINE_BYTES_MAX = 512 * 1024 * 1024


class HistoryError(Exception):
    """Base class of every error about a history file."""


class MalformedHistory(HistoryError):
    """A line (or a field inside it) does not follow docs/history.md."""

    def __init__(self, line_number: int, reason: str) -> None:
        super().__init__(f"line {line_number}: {reason}")
        self.line_number = line_number
        self.reason = reason


class UnreadableHistory(HistoryError):
    """The history file could not be opened or read at all."""


class HistoryWriterClosed(HistoryError):
    """A line was offered to a writer that was already closed."""


Key = str | int | None
Value = str | int
OPERATION_TYPES = ("invoke", "ok", "fail", "info")


class HistoryLine(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """Fields every line has. Subclasses are the line kinds of docs/history.md."""

    type: str
    time_ns: int


class SendLine(HistoryLine, kw_only=True, omit_defaults=True, gc=False):
    f: str
    process: str
    topic: str
    key: Key = None
    value: Value | None = None  # optional on completions, which then pair by (process, key)
    partition: int | None = None
    offset: int | None = None
    error: str | None = None


class PollLine(HistoryLine, kw_only=True, omit_defaults=True, gc=False):
    f: str
    process: str
    group: str
    topic: str
    records: list[tuple[int, int, Key, Value]]  # [partition, offset, key, value] in returned order
    member: str | None = None
    generation: int | None = None


class CommitLine(HistoryLine, kw_only=True, omit_defaults=True, gc=False):
    f: str
    process: str
    group: str
    topic: str
    offsets: dict[int, int] = {}  # partition -> next offset to read (Kafka's convention)
    member: str | None = None
    generation: int | None = None
    error: str | None = None


class AssignLine(HistoryLine, kw_only=True, omit_defaults=True, gc=False):
    f: str
    process: str
    group: str
    topic: str
    partitions: list[int] = []
    member: str | None = None
    generation: int | None = None


class FaultLine(HistoryLine, kw_only=True, omit_defaults=True, gc=False):
    nemesis: str | None = None
    target: str | None = None
    role: str | None = None
    topic: str | None = None
    partition: int | None = None
    phase: str = "start"


class HealLine(HistoryLine, kw_only=True, omit_defaults=True, gc=False):
    pass


class FinalReadLine(HistoryLine, kw_only=True, omit_defaults=True, gc=False):
    topic: str
    partition: int
    entries: list[tuple[int, Key, Value]]  # [offset, key, value] in offset order


class ReplicaLogLine(HistoryLine, kw_only=True, omit_defaults=True, gc=False):
    topic: str
    partition: int
    replica: str
    high_watermark: int
    entries: list[tuple[int, Key, Value]]
    log_start_offset: int | None = None  # defaults to the first entry's offset


class HygieneLine(HistoryLine, kw_only=True, omit_defaults=True, gc=False):
    leftover_processes: list[Any] = []
    leftover_shm: list[Any] = []


class ConfigLine(HistoryLine, kw_only=True, omit_defaults=True, gc=False):
    scenario: str | None = None
    seed: int | None = None
    expect_loss: bool = False


_OPERATION_KINDS: dict[str, type[HistoryLine]] = {
    "send": SendLine,
    "poll": PollLine,
    "commit": CommitLine,
    "assign": AssignLine,
}
_EVENT_KINDS: dict[str, type[HistoryLine]] = {
    "fault": FaultLine,
    "heal": HealLine,
    "final-read": FinalReadLine,
    "replica-log": ReplicaLogLine,
    "hygiene": HygieneLine,
    "config": ConfigLine,
}


class _LineHeader(msgspec.Struct, gc=False):
    """The fields that say which kind a line is; decoding only these skips the rest cheaply."""

    type: str
    time_ns: int
    f: str | None = None


_header_decoder = msgspec.json.Decoder(_LineHeader)
_typed_decoders = {
    kind: msgspec.json.Decoder(kind) for kind in (*_OPERATION_KINDS.values(), *_EVENT_KINDS.values())
}
_dict_decoder = msgspec.json.Decoder()


def _kind_of(kind: str, operation: Any, line_number: int) -> type[HistoryLine] | None:
    """Which line class a (type, f) pair names; None for kinds this format version does not define.

    Operations on unknown `f` values and unknown event types are skipped rather than refused, so
    a history with extra kinds of lines (a newer workload) still checks.
    """
    if kind in OPERATION_TYPES:
        if not isinstance(operation, str):
            raise MalformedHistory(line_number, f"{kind} line without a string field 'f'")
        return _OPERATION_KINDS.get(operation)
    return _EVENT_KINDS.get(kind)


def _described(kind: str, operation: Any) -> str:
    return f"{kind} {operation}" if kind in OPERATION_TYPES else kind


def typed_line(line: dict[str, Any] | HistoryLine, line_number: int) -> HistoryLine | None:
    """The typed form of one decoded line (a typed line passes through as it is)."""
    if isinstance(line, HistoryLine):
        return line
    if not isinstance(line, dict):
        raise MalformedHistory(line_number, f"expected a JSON object, got {type(line).__name__}")
    kind = line.get("type")
    if not isinstance(kind, str):
        raise MalformedHistory(line_number, "missing string field 'type'")
    line_type = _kind_of(kind, line.get("f"), line_number)
    if line_type is None:
        return None
    try:
        return msgspec.convert(line, line_type, str_keys=True)
    except msgspec.ValidationError as error:
        raise MalformedHistory(line_number, f"{_described(kind, line.get('f'))} line: {error}") from None


def decode_typed_line(raw: bytes, line_number: int) -> HistoryLine | None:
    """Decode one line of a file straight into its typed form (no intermediate dict)."""
    header = _decode(_header_decoder, raw, line_number)
    line_type = _kind_of(header.type, header.f, line_number)
    if line_type is None:
        return None
    try:
        return _typed_decoders[line_type].decode(raw)
    except msgspec.ValidationError as error:
        raise MalformedHistory(line_number, f"{_described(header.type, header.f)} line: {error}") from None


def parse_line(raw: bytes | str, line_number: int) -> dict[str, Any]:
    """Decode one line of a file into a dict, checking the two fields every line has."""
    _decode(_header_decoder, raw, line_number)
    return _decode(_dict_decoder, raw, line_number)


def _decode(decoder: msgspec.json.Decoder, raw: bytes | str, line_number: int) -> Any:
    if not raw.strip():
        raise MalformedHistory(line_number, "blank line (every line must be one JSON object)")
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as error:
        reason = f"every line needs a string 'type' and an integer 'time_ns': {error}"
        raise MalformedHistory(line_number, reason) from None
    except msgspec.DecodeError as error:
        raise MalformedHistory(line_number, f"not valid JSON ({error})") from None


def _open(path: str | Path) -> Any:
    """Open eagerly, so a missing file fails at the call and not at some later `next()`. A file or
    a pipe (`<(...)`) is a history; a device is not (/dev/zero was one endless line)."""
    try:
        handle = open(path, "rb")
    except OSError as error:
        raise UnreadableHistory(f"cannot open {path}: {error.strerror or error}") from None
    mode = os.fstat(handle.fileno()).st_mode
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        handle.close()
        raise UnreadableHistory(f"{path} is a device, not a history file")
    return handle


def _lines(handle: Any) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of an open history, each read at most HISTORY_LINE_BYTES_MAX at a time."""
    line_number = 0
    while raw := handle.readline(HISTORY_LINE_BYTES_MAX + 1):
        line_number += 1
        if len(raw) > HISTORY_LINE_BYTES_MAX:
            raise MalformedHistory(line_number, f"longer than {HISTORY_LINE_BYTES_MAX:,} bytes: no line of a "
                                                "history is (an endless stream is not a history)")
        yield line_number, raw


def iter_history(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield the lines of a history file as dicts, one at a time (constant memory for any size)."""
    return _dicts_of(_open(path))


def _dicts_of(handle: Any) -> Iterator[dict[str, Any]]:
    with handle:
        for line_number, raw in _lines(handle):
            yield parse_line(raw, line_number)


def iter_typed_history(path: str | Path) -> Iterator[tuple[int, HistoryLine]]:
    """Yield (line number, typed line) for each line of a kind this format defines."""
    return _typed_lines_of(_open(path))


def _typed_lines_of(handle: Any) -> Iterator[tuple[int, HistoryLine]]:
    with handle:
        for line_number, raw in _lines(handle):
            typed = decode_typed_line(raw, line_number)
            if typed is not None:
                yield line_number, typed


def load_history(path: str | Path) -> list[dict[str, Any]]:
    """Read a whole history file into a list of dicts."""
    return list(iter_history(path))


class HistoryWriter:
    """Appends history lines to a file cheaply from any number of threads.

    `write(line)` encodes the dict now (so later changes to it do not leak into the file) and
    buffers the bytes; `record(fields)` does the same after stamping `time_ns` from the injected
    clock, measured from the writer's creation. Use it as a context manager or call `close()`.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        flush_interval_ms: int = HISTORY_FLUSH_INTERVAL_MS,
        buffer_bytes_max: int = HISTORY_BUFFER_BYTES_MAX,
    ) -> None:
        if flush_interval_ms <= 0:
            raise ValueError(f"flush_interval_ms must be positive, got {flush_interval_ms}")
        if buffer_bytes_max <= 0:
            raise ValueError(f"buffer_bytes_max must be positive, got {buffer_bytes_max}")
        self._file = open(path, "ab")
        self._clock_ns = clock_ns
        self._start_ns = clock_ns()
        self._buffer_bytes_max = buffer_bytes_max
        self._encoder = msgspec.json.Encoder()
        self._lock = threading.Lock()
        self._buffer: list[bytes] = []
        self._buffered_bytes = 0
        self._lines_written = 0
        self._closed = False
        self._flush_error: BaseException | None = None
        self._stop = threading.Event()
        self._flusher = threading.Thread(
            target=self._flush_periodically,
            args=(flush_interval_ms / 1000,),
            name="history-flusher",
            daemon=True,
        )
        self._flusher.start()

    @property
    def lines_written(self) -> int:
        """Lines accepted so far (buffered or already in the file)."""
        return self._lines_written

    def elapsed_ns(self) -> int:
        """Nanoseconds since the writer was created, on the writer's clock."""
        return self._clock_ns() - self._start_ns

    def write(self, line: dict[str, Any] | HistoryLine) -> None:
        """Append one line as given (a dict or a typed line); it must carry `type` and `time_ns`."""
        encoded = self._encoder.encode(line) + b"\n"
        with self._lock:
            self._append_locked(encoded)

    def record(self, fields: dict[str, Any]) -> int:
        """Append one line stamped with `time_ns` now; returns the stamp."""
        with self._lock:
            stamp = self._clock_ns() - self._start_ns
            self._append_locked(self._encoder.encode({**fields, "time_ns": stamp}) + b"\n")
        return stamp

    def write_many(self, lines: Iterable[dict[str, Any] | HistoryLine]) -> None:
        """Append several lines as given, contiguously."""
        encoded = [self._encoder.encode(line) + b"\n" for line in lines]
        with self._lock:
            for one in encoded:
                self._append_locked(one)

    def flush(self) -> None:
        """Write every buffered line to the file now."""
        with self._lock:
            self._raise_if_unusable()
            self._flush_locked()

    def close(self) -> None:
        """Flush, stop the flusher thread and close the file. Calling it twice is harmless."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._flusher.join()
        with self._lock:
            try:
                self._flush_locked()
                self._file.close()
            except OSError as error:  # a full disk at the last flush: report it like any other
                self._flush_error = self._flush_error or error
            finally:
                if not self._file.closed:
                    self._file.close()
        if self._flush_error is not None:
            raise HistoryError(f"history flush failed: {self._flush_error}") from self._flush_error

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _append_locked(self, encoded: bytes) -> None:
        self._raise_if_unusable()
        self._buffer.append(encoded)
        self._buffered_bytes += len(encoded)
        self._lines_written += 1
        if self._buffered_bytes >= self._buffer_bytes_max:
            self._flush_locked()

    def _raise_if_unusable(self) -> None:
        if self._closed:
            raise HistoryWriterClosed("the history writer is closed")
        if self._flush_error is not None:
            raise HistoryError(f"history flush failed: {self._flush_error}") from self._flush_error

    def _flush_locked(self) -> None:
        if not self._buffer:
            return
        pending = b"".join(self._buffer)
        self._buffer.clear()
        self._buffered_bytes = 0
        self._file.write(pending)
        self._file.flush()

    def _flush_periodically(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            with self._lock:
                if self._closed:
                    return
                try:
                    self._flush_locked()
                except OSError as error:  # a full disk: surface it to the next caller, stop trying
                    self._flush_error = error
                    return
