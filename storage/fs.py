"""The file-system seam: the few file operations the storage layer needs, and nothing more.

Everything in `storage/` touches disk only through a `FileSystem`, so the very same log and state
code runs on real files (`OsFileSystem`, here) and on the in-memory twin with a crash model
(`storage.memory.MemoryFileSystem`), the way TigerBeetle's simulator swaps its storage.

What this module owns and keeps:
- A handle knows its own size, so an append is one `pwrite`/`pwritev` at that size and never a
  `fstat`; per-call overhead stays a few microseconds beside a 1 MiB write.
- A write either happens whole or not at all: if the disk is full (ENOSPC/EDQUOT, or the injected
  quota runs out) the file is cut back to its previous length before `StorageFull` is raised.
- An fsync that fails raises `FsyncFailed`. The caller must treat its process as crashed and never
  retry (after a failed fsync Linux may have dropped the dirty pages: "fsyncgate", PostgreSQL 2018).
- Every create, rename and unlink is followed by an fsync of the directory, so a name that a call
  returned with survives a crash.
- Faults can be switched on at run time (`FaultInjector`) for real files as well as memory ones.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Protocol, Sequence

from storage.errors import FsyncFailed, StorageFull, StorageUnwritable

Buffer = bytes | bytearray | memoryview

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_REFUSED_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)  # read-only, no permission


class FaultInjector:
    """Faults that a test or the chaos harness switches on while the storage is in use.

    `write_quota_bytes` is how many more bytes may be written (None: no limit); a write that does
    not fit raises `StorageFull` after rolling back whatever part of it reached the file. Bytes
    that are later truncated or deleted are not credited back: it models a disk filling up.
    """

    def __init__(self) -> None:
        self.write_quota_bytes: int | None = None
        self.fsync_failures_armed = 0

    def set_write_quota(self, quota_bytes: int | None) -> None:
        if quota_bytes is not None and quota_bytes < 0:
            raise ValueError(f"write quota must be >= 0, got {quota_bytes}")
        self.write_quota_bytes = quota_bytes

    def fail_next_fsync(self, count: int = 1) -> None:
        """Make the next `count` fsync calls raise `FsyncFailed`."""
        self.fsync_failures_armed += count

    def clear(self) -> None:
        self.write_quota_bytes = None
        self.fsync_failures_armed = 0

    def allowed_bytes(self, wanted_bytes: int) -> int:
        """How many of `wanted_bytes` fit the quota (all of them when there is none)."""
        if self.write_quota_bytes is None:
            return wanted_bytes
        return min(wanted_bytes, self.write_quota_bytes)

    def allows_growth(self, growth_bytes: int) -> bool:
        """Whether a write may make a file `growth_bytes` longer (the simulator's full disk)."""
        return True

    def charge(self, written_bytes: int) -> None:
        if self.write_quota_bytes is not None:
            self.write_quota_bytes -= written_bytes

    def take_fsync_failure(self) -> bool:
        if self.fsync_failures_armed > 0:
            self.fsync_failures_armed -= 1
            return True
        return False


class FileHandle(Protocol):
    """An open file that is read at positions and written at its end (or at a position)."""

    path: str
    size: int  # current length in bytes, kept by the handle

    def append(self, data: Buffer) -> None: ...
    def append_parts(self, parts: Sequence[Buffer]) -> None: ...
    def write_at(self, position: int, data: Buffer) -> None: ...
    def read_at(self, position: int, length: int) -> bytes: ...
    def truncate(self, length: int) -> None: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...


class FileSystem(Protocol):
    faults: FaultInjector

    def open(self, path: str, *, create: bool = False) -> FileHandle: ...
    def read_file(self, path: str, bytes_max: int | None = None) -> bytes: ...
    def write_file_atomic(self, path: str, data: Buffer) -> None: ...
    def exists(self, path: str) -> bool: ...
    def list_directory(self, directory: str) -> list[str]: ...
    def make_directory(self, directory: str) -> None: ...
    def remove(self, path: str) -> None: ...
    def rename(self, source: str, target: str) -> None: ...
    def sync_directory(self, directory: str) -> None: ...


def temporary_path(path: str) -> str:
    """The name a file is written under before it is renamed into place."""
    return path + ".tmp"


class OsFileHandle:
    """A real file opened read-write; appends go to `size` with pwrite (never O_APPEND, which
    on Linux makes pwrite ignore its position)."""

    __slots__ = ("path", "size", "_fd", "_faults")

    def __init__(self, path: str, fd: int, size: int, faults: FaultInjector) -> None:
        self.path = path
        self.size = size
        self._fd = fd
        self._faults = faults

    def append(self, data: Buffer) -> None:
        self.write_at(self.size, data)

    def append_parts(self, parts: Sequence[Buffer]) -> None:
        """Append several buffers with one pwritev: the leader stamps a batch by writing a new
        12-byte prefix and the caller's untouched remainder, with no copy of the payload."""
        total = sum(len(part) for part in parts)
        if self._faults.allowed_bytes(total) < total:
            self.write_at(self.size, b"".join(parts))  # takes the quota path and raises StorageFull
            return
        start = self.size
        try:
            written = os.pwritev(self._fd, parts, start)
            if written < total:
                remainder = memoryview(b"".join(parts))[written:]
                self._write_fully(remainder, start + written)
        except OSError as error:
            self._fail_write(error, start)
        self.size = max(self.size, start + total)
        self._faults.charge(total)

    def write_at(self, position: int, data: Buffer) -> None:
        length = len(data)
        allowed = self._faults.allowed_bytes(length)
        previous_size = self.size
        try:
            if allowed < length:
                # Write what fits, as a full disk would, then undo it: nothing partial may remain.
                self._write_fully(memoryview(data)[:allowed], position)
                raise OSError(errno.ENOSPC, f"write quota exhausted ({allowed} of {length} bytes fit)")
            self._write_fully(data, position)
        except OSError as error:
            self._fail_write(error, previous_size)
        self.size = max(self.size, position + length)
        self._faults.charge(length)

    def _write_fully(self, data: Buffer, position: int) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, position)
            view = view[written:]
            position += written

    def _fail_write(self, error: OSError, previous_size: int) -> None:
        if error.errno not in _FULL_ERRNOS + _REFUSED_ERRNOS:
            raise error
        try:
            os.ftruncate(self._fd, previous_size)
        except OSError:
            if error.errno in _FULL_ERRNOS:
                raise
            # A file system gone read-only takes no cut either; it took none of the write.
        self.size = previous_size
        kind = StorageFull if error.errno in _FULL_ERRNOS else StorageUnwritable
        raise kind(f"{self.path}: {error.strerror}; write rolled back to {previous_size} bytes") from None

    def read_at(self, position: int, length: int) -> bytes:
        return os.pread(self._fd, length, position)

    def truncate(self, length: int) -> None:
        os.ftruncate(self._fd, length)
        self.size = length

    def sync(self) -> None:
        if self._faults.take_fsync_failure():
            raise FsyncFailed(f"{self.path}: injected fdatasync failure")
        try:
            os.fdatasync(self._fd)
        except OSError as error:
            raise FsyncFailed(f"{self.path}: fdatasync failed: {error.strerror}") from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _open_for_writing(path: str, flags: int) -> int:
    """`os.open`, with a directory that refuses new files (read-only, no permission) or has no room
    for one told apart from a bug: `StorageUnwritable` / `StorageFull`, nothing created."""
    try:
        return os.open(path, flags, 0o644)
    except OSError as error:
        if error.errno in _REFUSED_ERRNOS:
            raise StorageUnwritable(f"{path}: {error.strerror}: cannot be opened for writing") from None
        if error.errno in _FULL_ERRNOS:
            raise StorageFull(f"{path}: {error.strerror}: the file cannot be created") from None
        raise


def _require_regular_file(fd: int, path: str) -> None:
    """Every file railmq keeps is a regular file; a device, pipe or socket in its place (a symlink to
    /dev/zero) is refused naming it: /dev/zero read whole never ends, and writes to it vanish."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file (a directory, a device, a pipe or a socket)", path)


def _too_large(path: str, bytes_max: int) -> OSError:
    return OSError(errno.EFBIG, f"larger than the {bytes_max} bytes such a file may hold", path)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # left as its `.tmp` name: the next write of the file truncates and reuses it


class OsFileSystem:
    """Real files. Paths are plain strings; directories are synced after every name change."""

    def __init__(self, faults: FaultInjector | None = None) -> None:
        self.faults = faults if faults is not None else FaultInjector()

    def open(self, path: str, *, create: bool = False) -> OsFileHandle:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        existed = not create or os.path.exists(path)
        fd = _open_for_writing(path, flags)
        try:
            _require_regular_file(fd, path)
        except OSError:
            os.close(fd)
            raise
        size = os.lseek(fd, 0, os.SEEK_END)
        if not existed:
            self.sync_directory(os.path.dirname(path) or ".")
        return OsFileHandle(path, fd, size, self.faults)

    def read_file(self, path: str, bytes_max: int | None = None) -> bytes:
        """The whole file; a file that is not a regular one, or holds more than `bytes_max`, is an
        OSError naming it (EINVAL, EFBIG), found before it is read."""
        # O_NONBLOCK: a pipe in its place must not hold the open until some process writes to it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            _require_regular_file(fd, path)
        except OSError:
            os.close(fd)
            raise
        with open(fd, "rb") as handle:
            if bytes_max is None:
                return handle.read()
            if os.fstat(handle.fileno()).st_size > bytes_max:
                raise _too_large(path, bytes_max)
            data = handle.read(bytes_max + 1)
        if len(data) > bytes_max:
            raise _too_large(path, bytes_max)
        return data

    def write_file_atomic(self, path: str, data: Buffer) -> None:
        """Write to a temporary name, fsync it, rename it over `path`, fsync the directory."""
        temporary = temporary_path(path)
        fd = _open_for_writing(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        handle = OsFileHandle(temporary, fd, 0, self.faults)
        try:
            handle.append(data)
            handle.sync()
        except BaseException:
            _unlink_quietly(temporary)  # the write's own error is the one to tell
            raise
        finally:
            handle.close()
        try:
            os.rename(temporary, path)
        except OSError as error:
            _unlink_quietly(temporary)
            if error.errno in _REFUSED_ERRNOS:
                raise StorageUnwritable(f"{path}: {error.strerror}: it cannot be replaced") from None
            raise
        self.sync_directory(os.path.dirname(path) or ".")

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list_directory(self, directory: str) -> list[str]:
        return sorted(os.listdir(directory))

    def make_directory(self, directory: str) -> None:
        if not os.path.isdir(directory):
            os.makedirs(directory, exist_ok=True)
            self.sync_directory(os.path.dirname(os.path.abspath(directory)))

    def remove(self, path: str) -> None:
        os.unlink(path)
        self.sync_directory(os.path.dirname(path) or ".")

    def rename(self, source: str, target: str) -> None:
        os.rename(source, target)
        self.sync_directory(os.path.dirname(target) or ".")

    def sync_directory(self, directory: str) -> None:
        if self.faults.take_fsync_failure():
            raise FsyncFailed(f"{directory}: injected directory fsync failure")
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        except OSError as error:
            raise FsyncFailed(f"{directory}: directory fsync failed: {error.strerror}") from None
        finally:
            os.close(fd)
