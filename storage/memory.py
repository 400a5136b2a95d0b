"""The in-memory twin of the file system, with a crash model, for unit tests and the simulator.

`MemoryFileSystem` implements the `storage.fs.FileSystem` protocol, so the production
`PartitionLog` and `DurableState` run on it unchanged (no second copy of the logic).

The crash model, after the Linux page cache:
- each file has its current content and its durable content, the bytes the last successful
  fsync of that file covered; a file that was never fsynced has empty durable content;
- each name has a durable namespace entry only once its directory was fsynced after the
  create/rename/unlink (the real implementation and this one both do that on every name change);
- `crash()` reverts every file to its durable content, drops names that were never made durable,
  restores durable names that were removed but not synced, and invalidates every open handle.
A failed (injected) fsync leaves the durable content where it was: the data may be gone.
"""

from __future__ import annotations

import errno
import posixpath
from typing import Sequence

from storage.errors import FsyncFailed, StorageFull
from storage.fs import Buffer, FaultInjector, temporary_path
from storage.log import LogConfig, PartitionLog


class _MemoryFile:
    """A file's current bytes and its durable bytes. `dirty` lists the [start, end) ranges written
    since the last sync (merged into one when there are many), so a sync copies what changed, not
    the whole file: the simulator syncs growing logs and journals thousands of times a run."""

    __slots__ = ("content", "durable", "dirty")

    DIRTY_RANGES_MAX = 8

    def __init__(self) -> None:
        self.content = bytearray()
        self.durable = bytearray()
        self.dirty: list[tuple[int, int]] = []

    def touch(self, start: int, end: int) -> None:
        dirty = self.dirty
        if dirty and dirty[-1][1] == start:  # an append right after the last write: one range
            dirty[-1] = (dirty[-1][0], end)
            return
        dirty.append((start, end))
        if len(dirty) > self.DIRTY_RANGES_MAX:
            self.dirty = [(min(low for low, _ in dirty), max(high for _, high in dirty))]

    def make_durable(self) -> None:
        """What fdatasync does: the durable bytes become the current ones."""
        content, durable = self.content, self.durable
        length = len(content)
        if len(durable) > length:
            del durable[length:]
        elif len(durable) < length:
            durable.extend(bytes(length - len(durable)))  # every byte past the old end is dirty
        for start, end in self.dirty:
            end = min(end, length)
            if start < end:
                durable[start:end] = content[start:end]
        self.dirty = []

    def revert(self) -> None:
        """What a crash does: the current bytes become the durable ones."""
        self.content = bytearray(self.durable)
        self.dirty = []


class MemoryFileHandle:
    __slots__ = ("path", "_file", "_system", "_generation")

    def __init__(self, path: str, file: _MemoryFile, system: "MemoryFileSystem") -> None:
        self.path = path
        self._file = file
        self._system = system
        self._generation = system.generation

    @property
    def size(self) -> int:
        self._check_alive()
        return len(self._file.content)

    def _check_alive(self) -> None:
        if self._generation != self._system.generation:
            raise RuntimeError(f"{self.path}: handle opened before a crash is used after it")

    def append(self, data: Buffer) -> None:
        self.write_at(len(self._file.content), data)

    def append_parts(self, parts: Sequence[Buffer]) -> None:
        self.append(b"".join(parts))

    def write_at(self, position: int, data: Buffer) -> None:
        self._check_alive()
        content = self._file.content
        length = len(data)
        faults = self._system.faults
        if (faults.allowed_bytes(length) < length
                or not faults.allows_growth(position + length - len(content))):
            raise StorageFull(f"{self.path}: write quota exhausted; nothing of {length} bytes written")
        start = position
        if position > len(content):
            start = len(content)  # the gap is written with zeros
            content.extend(bytes(position - len(content)))
        content[position: position + length] = data
        self._file.touch(start, position + length)
        faults.charge(length)

    def read_at(self, position: int, length: int) -> bytes:
        self._check_alive()
        return bytes(self._file.content[position: position + length])

    def truncate(self, length: int) -> None:
        self._check_alive()
        content = self._file.content
        if length <= len(content):
            del content[length:]
        else:
            self._file.touch(len(content), length)
            content.extend(bytes(length - len(content)))

    def sync(self) -> None:
        self._check_alive()
        if self._system.faults.take_fsync_failure():
            raise FsyncFailed(f"{self.path}: injected fdatasync failure")
        self._file.make_durable()
        self._system.fsync_count += 1

    def close(self) -> None:
        pass


class MemoryFileSystem:
    """Files in dictionaries. Paths are POSIX strings; directories are implicit but tracked."""

    def __init__(self, faults: FaultInjector | None = None) -> None:
        self.faults = faults if faults is not None else FaultInjector()
        self.generation = 0
        self.fsync_count = 0
        self._files: dict[str, _MemoryFile] = {}
        self._durable_files: dict[str, _MemoryFile] = {}
        self._directories: set[str] = {"/", "."}

    # -- the crash model -------------------------------------------------------------------
    def crash(self) -> None:
        """Lose everything that was never made durable; open handles stop working."""
        self.generation += 1
        self._files = dict(self._durable_files)
        for file in self._files.values():
            file.revert()

    def process_exit(self) -> None:
        """The process is gone but the machine is not: what it wrote stays (the kernel's page cache
        holds it and writes it back), every name it made included; open handles stop working."""
        self.generation += 1
        for file in self._files.values():
            file.make_durable()
        self._durable_files = dict(self._files)

    def durable_content(self, path: str) -> bytes:
        """What `path` would hold after a crash now (b"" when its name is not durable)."""
        file = self._durable_files.get(path)
        return b"" if file is None else bytes(file.durable)

    def clone(self) -> "MemoryFileSystem":
        """An independent copy (current and durable contents, names, faults off): one starting
        point for many what-if runs."""
        twin = MemoryFileSystem()
        twin._directories = set(self._directories)
        copies: dict[int, _MemoryFile] = {}
        for source, target in ((self._files, twin._files), (self._durable_files, twin._durable_files)):
            for path, file in source.items():
                copy = copies.get(id(file))
                if copy is None:
                    copy = copies[id(file)] = _MemoryFile()
                    copy.content, copy.durable = bytearray(file.content), bytearray(file.durable)
                    copy.dirty = list(file.dirty)
                target[path] = copy
        return twin

    # -- test helpers that reach under the API, like a disk that rots ----------------------
    def corrupt(self, path: str, position: int, xor_mask: int = 0xFF) -> None:
        """Flip bits of one byte in both the current and the durable content of `path`."""
        file = self._files[path]
        file.content[position] ^= xor_mask
        if position < len(file.durable):
            file.durable[position] ^= xor_mask

    def cut(self, path: str, length: int) -> None:
        """Shorten `path` to `length` bytes, current and durable alike (a torn write)."""
        file = self._files[path]
        del file.content[length:]
        del file.durable[length:]

    def destroy(self, path: str) -> None:
        """The disk lost `path` altogether (current and durable): a deleted or unreadable file."""
        path = posixpath.normpath(path)
        self._files.pop(path, None)
        self._durable_files.pop(path, None)

    def durable_paths(self, prefix: str = "/") -> list[str]:
        """Paths that would survive a crash now, under `prefix`."""
        return sorted(path for path in self._durable_files if path.startswith(prefix))

    def set_content(self, path: str, data: bytes) -> None:
        """Replace `path` with `data` as if it had been written and synced (creating it)."""
        file = self._files.get(path)
        if file is None:
            file = self._files[path] = _MemoryFile()
        file.content = bytearray(data)
        file.durable = bytearray(data)
        file.dirty = []
        self._durable_files[path] = file

    # -- the FileSystem protocol -----------------------------------------------------------
    def open(self, path: str, *, create: bool = False) -> MemoryFileHandle:
        path = posixpath.normpath(path)
        file = self._files.get(path)
        if file is None:
            if not create:
                raise FileNotFoundError(path)
            self._require_directory(posixpath.dirname(path))
            file = self._files[path] = _MemoryFile()
            self.sync_directory(posixpath.dirname(path))
        return MemoryFileHandle(path, file, self)

    def read_file(self, path: str, bytes_max: int | None = None) -> bytes:
        file = self._files.get(posixpath.normpath(path))
        if file is None:
            raise FileNotFoundError(path)
        if bytes_max is not None and len(file.content) > bytes_max:
            raise OSError(errno.EFBIG, f"larger than the {bytes_max} bytes such a file may hold", path)
        return bytes(file.content)

    def write_file_atomic(self, path: str, data: Buffer) -> None:
        temporary = temporary_path(posixpath.normpath(path))
        self._files.pop(temporary, None)
        handle = self.open(temporary, create=True)
        handle.append(data)
        handle.sync()
        self.rename(temporary, path)

    def exists(self, path: str) -> bool:
        path = posixpath.normpath(path)
        return path in self._files or path in self._directories

    def list_directory(self, directory: str) -> list[str]:
        directory = posixpath.normpath(directory)
        if directory not in self._directories:
            raise FileNotFoundError(directory)
        return sorted(posixpath.basename(path) for path in self._files if posixpath.dirname(path) == directory)

    def make_directory(self, directory: str) -> None:
        directory = posixpath.normpath(directory)
        while directory not in self._directories:
            self._directories.add(directory)
            directory = posixpath.dirname(directory)

    def remove(self, path: str) -> None:
        path = posixpath.normpath(path)
        if self._files.pop(path, None) is None:
            raise FileNotFoundError(path)
        self.sync_directory(posixpath.dirname(path))

    def rename(self, source: str, target: str) -> None:
        source, target = posixpath.normpath(source), posixpath.normpath(target)
        file = self._files.pop(source, None)
        if file is None:
            raise FileNotFoundError(source)
        self._files[target] = file
        self.sync_directory(posixpath.dirname(source))
        self.sync_directory(posixpath.dirname(target))

    def sync_directory(self, directory: str) -> None:
        """Make the directory's current names durable (what fsync on a directory does)."""
        if self.faults.take_fsync_failure():
            raise FsyncFailed(f"{directory}: injected directory fsync failure")
        directory = posixpath.normpath(directory)
        for path in [path for path in self._durable_files if posixpath.dirname(path) == directory]:
            if self._files.get(path) is not self._durable_files[path]:
                del self._durable_files[path]
        for path, file in self._files.items():
            if posixpath.dirname(path) == directory:
                self._durable_files[path] = file

    def _require_directory(self, directory: str) -> None:
        if posixpath.normpath(directory) not in self._directories:
            raise FileNotFoundError(directory)


def open_memory_log(config: LogConfig, now_ms: int = 0, fs: MemoryFileSystem | None = None,
                    directory: str = "/log") -> PartitionLog:
    """A `PartitionLog` on a `MemoryFileSystem` (a fresh one unless `fs` is given)."""
    return PartitionLog.open(directory, config, fs=fs if fs is not None else MemoryFileSystem(), now_ms=now_ms)
