"""Reading the actors' trace file while they write it: follow it across rotations, and scan the
rotated files for the events of one partition.

Every actor appends JSON lines to `<data dir>/trace.jsonl`; whichever actor sees it past 64 MiB
renames it to `.1` (older ones move to `.2`, `.3`; transport/actor_main.py's `TraceFile`). A
follower therefore keeps its file open: after a rotation the open handle still reads the renamed
file, so it drains that to the end before it opens the new `trace.jsonl`, and no line written
before the rename is skipped. A line is used only once its newline is there (a writer may be
half-way through it); a line that does not parse (an actor killed mid-write) is counted and
skipped.

What is gone is said, never guessed: `TraceCoverage` names the earliest event still on disk, so
a question about an earlier time can answer "the traces from before T were rotated away".
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Callable, Iterator, NamedTuple

# A follower that starts on a big file reads only its last this many bytes (the timeline needs
# the recent past; the explain view scans the files on demand).
TAIL_START_BYTES_MAX = 4 * 1024 * 1024
# One poll reads at most this much, so a burst of trace lines cannot stall the console.
READ_CHUNK_BYTES_MAX = 8 * 1024 * 1024
ROTATED_FILES_MAX = 3  # TraceFile keeps trace.jsonl.1 .. .3
# The longest line the console reads. Actors write one event per line (the largest, a dead-letter
# report, is far below this); a line without its newline was kept whole, 8 MiB more each poll, so
# a gigabyte of line held a gigabyte. A longer line is skipped to its newline and counted as torn.
TRACE_LINE_BYTES_MAX = 4 * 1024 * 1024


def trace_files(path: str) -> list[str]:
    """The trace files that exist, oldest first: trace.jsonl.3 .. .1, trace.jsonl."""
    candidates = [f"{path}.{index}" for index in range(ROTATED_FILES_MAX, 0, -1)] + [path]
    return [candidate for candidate in candidates if os.path.exists(candidate)]


def open_trace(name: str) -> Any:
    """A trace file opened for reading, or None when it is gone or cannot be read. Only a regular
    file is one: a FIFO in its place held the open for ever (at start, or in an explain thread)
    and /dev/zero never ended; opened non-blocking, either is refused. An open that fails for
    another reason (out of descriptors) is also None: the follower tries again at its next poll."""
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        return None
    return open(descriptor, "rb")


def parse_line(raw: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(event, dict) or not isinstance(event.get("time_ns"), int) or "event" not in event:
        return None
    return event


def bounded_lines(handle: Any) -> Iterator[bytes]:
    """The lines of a binary file, each at most `TRACE_LINE_BYTES_MAX` bytes: a longer one is read
    past in bounded pieces and given as b"" (which parses as no event)."""
    while True:
        raw = handle.readline(TRACE_LINE_BYTES_MAX + 1)
        if not raw:
            return
        if len(raw) <= TRACE_LINE_BYTES_MAX or raw.endswith(b"\n"):
            yield raw
            continue
        while raw and not raw.endswith(b"\n"):  # the rest of the oversized line, dropped
            raw = handle.readline(TRACE_LINE_BYTES_MAX)
        yield b""


class TraceTail:
    """Follows one trace file. `poll()` returns the complete new lines as events."""

    def __init__(
        self, path: str, *, from_start: bool = False, start_bytes_max: int = TAIL_START_BYTES_MAX
    ) -> None:
        self.path = path
        self.torn_lines = 0
        self.started_at_offset = 0  # where in the file the console began reading (0: its beginning)
        self._handle: Any = None
        self._retired: Any = None  # the renamed file, read once more: other writers add one last line
        self._retired_partial = b""
        self._inode = -1
        self._partial: bytes | None = b""  # None: inside an oversized line, dropped to its newline
        self._open(from_start=from_start, start_bytes_max=start_bytes_max)

    def _open(self, *, from_start: bool, start_bytes_max: int = TAIL_START_BYTES_MAX) -> None:
        handle = open_trace(self.path)
        if handle is None:
            return
        size = os.fstat(handle.fileno()).st_size
        if not from_start and size > start_bytes_max:
            handle.seek(size - start_bytes_max)
            handle.readline()  # skip the partial first line
            self.started_at_offset = handle.tell()
        self._handle, self._inode, self._partial = handle, os.fstat(handle.fileno()).st_ino, b""

    def close(self) -> None:
        for handle in (self._handle, self._retired):
            if handle is not None:
                handle.close()
        self._handle = self._retired = None

    def poll(self) -> list[dict[str, Any]]:
        events = self._drain_retired()
        if self._handle is None:
            self._open(from_start=True)
            if self._handle is None:
                return events
        events += self._drain()
        if self._rotated():
            events += self._drain()  # the rest of the renamed file, then the new one
            self._retired, self._retired_partial = self._handle, self._partial
            self._handle = None
            self._open(from_start=True)
            if self._handle is not None:
                events += self._drain()
        return events

    def _drain_retired(self) -> list[dict[str, Any]]:
        if self._retired is None:
            return []
        current, current_partial = self._handle, self._partial
        self._handle, self._partial = self._retired, self._retired_partial
        try:
            return self._drain()
        finally:
            self._retired.close()
            self._retired = None
            self._handle, self._partial = current, current_partial

    def _rotated(self) -> bool:
        try:
            return os.stat(self.path).st_ino != self._inode
        except FileNotFoundError:
            return False  # renamed and not yet recreated: keep reading the old one

    def _drain(self) -> list[dict[str, Any]]:
        data = self._handle.read(READ_CHUNK_BYTES_MAX)
        if self._partial is None:  # the rest of an oversized line: dropped up to its newline
            newline = data.find(b"\n")
            if newline < 0:
                return []
            data, self._partial = data[newline + 1 :], b""
        data = self._partial + data
        cut = data.rfind(b"\n")
        complete, self._partial = (b"", data) if cut < 0 else (data[:cut], data[cut + 1 :])
        if len(self._partial) > TRACE_LINE_BYTES_MAX:
            self._partial = None
            self.torn_lines += 1
        events = []
        for raw in complete.split(b"\n"):
            if not raw.strip():
                continue
            event = parse_line(raw) if len(raw) <= TRACE_LINE_BYTES_MAX else None
            if event is None:
                self.torn_lines += 1
            else:
                events.append(event)
        return events


class TraceCoverage(NamedTuple):
    files: list[str]
    earliest_ns: int | None  # the first event still on disk; None when there is none


def coverage(path: str) -> TraceCoverage:
    files = trace_files(path)
    for name in files:
        handle = open_trace(name)
        if handle is None:
            continue
        with handle:
            for raw in bounded_lines(handle):
                event = parse_line(raw)
                if event is not None:
                    return TraceCoverage(files, event["time_ns"])
    return TraceCoverage(files, None)


def scan(
    path: str, keep: Callable[[dict[str, Any]], bool], *, needles: tuple[bytes, ...] = ()
) -> Iterator[dict[str, Any]]:
    """Every event of every trace file, oldest first, that `keep` accepts. `needles`: byte strings
    a line must all contain to be parsed at all (a cheap filter over hundreds of MiB)."""
    for name in trace_files(path):
        handle = open_trace(name)
        if handle is None:
            continue  # rotated away between listing and opening, or no file to read
        with handle:
            for raw in bounded_lines(handle):
                if needles and not all(needle in raw for needle in needles):
                    continue
                event = parse_line(raw)
                if event is not None and keep(event):
                    yield event


def partition_needles(topic: str, partition: int) -> tuple[bytes, ...]:
    """Bytes every trace line about this partition contains (json.dumps' spelling)."""
    return (json.dumps(topic).encode(), f'"partition": {partition}'.encode())
