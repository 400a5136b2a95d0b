"""A log's segment files, opened on demand and at most `open_max` at a time.

Each segment used to keep its file open, a descriptor each: a topic created with a tiny
`segment_bytes` starts a segment per batch, and under a limit of 256 descriptors the 250th append
failed with EMFILE, an untyped error that stopped the replica, whose restart could not open the
segments either. Large logs meet the same limit more slowly (64 MiB segments: 64 GB per 1,024
descriptors). Now a segment's `SegmentFile` opens its file when it is read or written and keeps
it open while it is among the `open_max` most recently used; the least recently used is closed
first. The active segment, written at every append, stays open.

Closing loses nothing: the bytes written are the file's, in the page cache (or the memory file
system's file), and `sync()` on a file opened again makes them durable as `fdatasync` on any
descriptor of the file does. A segment's size is kept here while its file is closed: nothing else
writes a segment file. A file that cannot be opened again (deleted under the running replica)
raises its OSError as a read of a failing disk (EIO) does: the replica stops, and its recovery
finds what is missing.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Sequence

from storage.fs import Buffer, FileHandle, FileSystem


class SegmentFiles:
    """Opens segment files for one log and closes the least recently used past `open_max`."""

    def __init__(self, fs: FileSystem, open_max: int) -> None:
        if open_max < 1:
            raise ValueError("a log keeps at least one segment file open")
        self.fs = fs
        self.open_max = open_max
        self._open: OrderedDict[SegmentFile, None] = OrderedDict()  # least recently used first
        self.reopened = 0  # files opened again after being closed here (a figure for tests)

    def open(self, path: str, *, create: bool = False) -> "SegmentFile":
        file = SegmentFile(self, path, self.fs.open(path, create=create))
        self.used(file)
        return file

    def used(self, file: "SegmentFile") -> None:
        self._open[file] = None
        self._open.move_to_end(file)
        while len(self._open) > self.open_max:
            oldest, _ = self._open.popitem(last=False)
            oldest.release()

    def forget(self, file: "SegmentFile") -> None:
        self._open.pop(file, None)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def __getattr__(self, name: str) -> Any:
        """Everything but `open` is the file system's (listing, removing: recovery's other needs)."""
        return getattr(self.fs, name)


class SegmentFile:
    """A FileHandle whose file is open only while it is in use (see the module docstring)."""

    __slots__ = ("path", "_size", "_files", "_handle")

    def __init__(self, files: SegmentFiles, path: str, handle: FileHandle) -> None:
        self.path = path
        self._files = files
        self._handle: FileHandle | None = handle
        self._size = handle.size

    def __hash__(self) -> int:
        return id(self)

    @property
    def size(self) -> int:
        return self._size

    def _file(self) -> FileHandle:
        handle = self._handle
        if handle is None:
            handle = self._handle = self._files.fs.open(self.path)
            self._files.reopened += 1
        self._files.used(self)
        return handle

    def release(self) -> None:
        """Close the file until it is used again (the least recently used of too many)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def _write(self, write: Callable[[FileHandle], None]) -> None:
        """A change to the file; the size kept here follows it, also when it fails (a full disk
        rolls a write back)."""
        handle = self._file()
        try:
            write(handle)
        finally:
            self._size = handle.size

    def append(self, data: Buffer) -> None:
        self._write(lambda handle: handle.append(data))

    def append_parts(self, parts: Sequence[Buffer]) -> None:
        self._write(lambda handle: handle.append_parts(parts))

    def write_at(self, position: int, data: Buffer) -> None:
        self._write(lambda handle: handle.write_at(position, data))

    def truncate(self, length: int) -> None:
        self._write(lambda handle: handle.truncate(length))

    def read_at(self, position: int, length: int) -> bytes:
        return self._file().read_at(position, length)

    def sync(self) -> None:
        self._file().sync()

    def close(self) -> None:
        self.release()
        self._files.forget(self)
