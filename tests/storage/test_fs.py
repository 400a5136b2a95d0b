"""The file-system seam: real files and the memory twin behave alike, faults included."""

from __future__ import annotations

import errno
import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from storage.errors import FsyncFailed, StorageFull
from storage.fs import OsFileSystem
from storage.memory import MemoryFileSystem


@pytest.fixture(params=["os", "memory"])
def fs_and_dir(request, tmp_path):
    if request.param == "os":
        return OsFileSystem(), str(tmp_path)
    fs = MemoryFileSystem()
    fs.make_directory("/data")
    return fs, "/data"


def test_append_read_truncate(fs_and_dir):
    fs, directory = fs_and_dir
    handle = fs.open(f"{directory}/f", create=True)
    handle.append(b"hello ")
    handle.append_parts([b"wor", memoryview(b"ld")])
    assert handle.size == 11
    assert handle.read_at(0, 11) == b"hello world"
    assert handle.read_at(6, 100) == b"world"
    handle.write_at(0, b"J")
    handle.truncate(5)
    assert handle.size == 5 and handle.read_at(0, 100) == b"Jello"
    handle.close()
    assert fs.open(f"{directory}/f").size == 5
    assert fs.list_directory(directory) == ["f"]


def test_open_missing_without_create_raises(fs_and_dir):
    fs, directory = fs_and_dir
    with pytest.raises(FileNotFoundError):
        fs.open(f"{directory}/missing")


def test_write_file_atomic_rename_and_remove(fs_and_dir):
    fs, directory = fs_and_dir
    fs.write_file_atomic(f"{directory}/a", b"one")
    fs.write_file_atomic(f"{directory}/a", b"two")
    assert fs.read_file(f"{directory}/a") == b"two"
    assert fs.list_directory(directory) == ["a"]  # no temporary left behind
    fs.rename(f"{directory}/a", f"{directory}/b")
    assert not fs.exists(f"{directory}/a") and fs.read_file(f"{directory}/b") == b"two"
    fs.remove(f"{directory}/b")
    assert fs.list_directory(directory) == []


def test_quota_rolls_back_and_raises_storage_full(fs_and_dir):
    fs, directory = fs_and_dir
    handle = fs.open(f"{directory}/f", create=True)
    handle.append(b"x" * 10)
    fs.faults.set_write_quota(5)
    with pytest.raises(StorageFull):
        handle.append(b"y" * 8)
    with pytest.raises(StorageFull):
        handle.append_parts([b"y" * 4, b"z" * 4])
    assert handle.size == 10 and handle.read_at(0, 100) == b"x" * 10  # nothing partial remains
    handle.append(b"y" * 5)  # what fits still goes in
    assert fs.faults.write_quota_bytes == 0
    fs.faults.set_write_quota(None)
    handle.append(b"z")
    assert handle.read_at(0, 100) == b"x" * 10 + b"y" * 5 + b"z"


def test_failed_fsync_raises_once(fs_and_dir):
    fs, directory = fs_and_dir
    handle = fs.open(f"{directory}/f", create=True)
    handle.append(b"data")
    fs.faults.fail_next_fsync()
    with pytest.raises(FsyncFailed):
        handle.sync()
    handle.sync()  # the fault was for the next fsync only


def test_os_enospc_becomes_storage_full_with_rollback(tmp_path, monkeypatch):
    fs = OsFileSystem()
    handle = fs.open(str(tmp_path / "f"), create=True)
    handle.append(b"abc")
    real_pwrite = os.pwrite

    def half_then_full(fd, data, position):
        if len(data) > 2:
            real_pwrite(fd, bytes(data[:2]), position)
            return 2
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", half_then_full)
    with pytest.raises(StorageFull):
        handle.append(b"defgh")
    monkeypatch.undo()
    assert handle.size == 3 and os.path.getsize(tmp_path / "f") == 3
    handle.close()


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS])
def test_a_directory_that_refuses_new_files_is_storage_unwritable_not_a_crash(tmp_path, monkeypatch, code):
    """A read-only directory (`chattr +i`, a remount read-only, wrong ownership) failed the next
    segment roll with a raw PermissionError: the replica died and was restarted for ever. It is
    `StorageUnwritable`, a `StorageFull`: callers wait and retry as on a full disk, and nothing
    partial is left (the atomic write's temporary file included)."""
    from storage.errors import StorageUnwritable

    fs = OsFileSystem()
    existing = tmp_path / "kept"
    existing.write_bytes(b"old")
    real_open = os.open

    def refusing(path, flags, *args):
        if flags & os.O_CREAT:
            raise OSError(code, os.strerror(code))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)
    with pytest.raises(StorageUnwritable, match="segment.log"):
        fs.open(str(tmp_path / "segment.log"), create=True)
    with pytest.raises(StorageUnwritable) as caught:
        fs.write_file_atomic(str(existing), b"new")
    assert isinstance(caught.value, StorageFull)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["kept"] and existing.read_bytes() == b"old"


def test_memory_crash_keeps_only_synced_content():
    fs = MemoryFileSystem()
    fs.make_directory("/d")
    synced = fs.open("/d/synced", create=True)
    synced.append(b"durable")
    synced.sync()
    synced.append(b" lost")
    unsynced = fs.open("/d/unsynced", create=True)
    unsynced.append(b"never synced")
    fs.crash()
    assert fs.read_file("/d/synced") == b"durable"
    assert fs.read_file("/d/unsynced") == b""  # the name was durable (directory synced), the bytes not
    with pytest.raises(RuntimeError):
        synced.read_at(0, 1)  # handles from before the crash are dead


def test_memory_failed_fsync_does_not_make_data_durable():
    fs = MemoryFileSystem()
    fs.make_directory("/d")
    handle = fs.open("/d/f", create=True)
    handle.append(b"abc")
    fs.faults.fail_next_fsync()
    with pytest.raises(FsyncFailed):
        handle.sync()
    fs.crash()
    assert fs.read_file("/d/f") == b""


def test_memory_names_not_synced_are_dropped_and_removed_names_restored():
    fs = MemoryFileSystem()
    fs.make_directory("/d")
    handle = fs.open("/d/keep", create=True)
    handle.append(b"k")
    handle.sync()
    # Reach under the API: a name change whose directory fsync never happened.
    fs._files["/d/ghost"] = fs._files.pop("/d/keep")
    fs.crash()
    assert fs.list_directory("/d") == ["keep"]
    assert fs.read_file("/d/keep") == b"k"


# A file's writes, truncations, syncs (some failing), crashes, bit flips and cuts, against the
# plainest model of the crash rule: a sync copies the whole content, a crash restores that copy.
# The memory file system copies only what changed since the last sync (the simulator syncs growing
# logs thousands of times a run), so this is the test that it copies enough.
_FILE_OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 96), st.binary(min_size=1, max_size=24)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=24)),
    st.tuples(st.just("truncate"), st.integers(0, 120)),
    st.tuples(st.just("sync"), st.booleans()),
    st.tuples(st.just("crash")),
    st.tuples(st.just("flip"), st.integers(0, 200)),
    st.tuples(st.just("cut"), st.integers(0, 120)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(_FILE_OPERATIONS)
@example([("append", b"abcdef"), ("sync", False), ("truncate", 2), ("truncate", 6), ("sync", False), ("crash",)])
@example([("append", b"abcdef"), ("sync", False), ("truncate", 1), ("write", 4, b"z"), ("sync", False), ("crash",)])
def test_memory_sync_and_crash_match_a_whole_file_copy(operations):
    fs = MemoryFileSystem()
    fs.make_directory("/d")
    handle = fs.open("/d/f", create=True)
    content, durable = bytearray(), b""
    for operation in operations:
        kind = operation[0]
        if kind == "write":
            _, position, data = operation
            handle.write_at(position, data)
            content.extend(bytes(max(0, position - len(content))))
            content[position:position + len(data)] = data
        elif kind == "append":
            handle.append(operation[1])
            content += operation[1]
        elif kind == "truncate":
            handle.truncate(operation[1])
            del content[operation[1]:]
            content.extend(bytes(operation[1] - len(content)))
        elif kind == "sync":
            if operation[1]:
                fs.faults.fail_next_fsync()
                with pytest.raises(FsyncFailed):
                    handle.sync()
            else:
                handle.sync()
                durable = bytes(content)
        elif kind == "crash":
            fs.crash()
            handle = fs.open("/d/f")
            content = bytearray(durable)
        elif kind == "flip" and operation[1] < len(content):
            fs.corrupt("/d/f", operation[1])  # the disk rots: what is and what would survive alike
            content[operation[1]] ^= 0xFF
            if operation[1] < len(durable):
                durable = durable[:operation[1]] + bytes([durable[operation[1]] ^ 0xFF]) + durable[operation[1] + 1:]
        elif kind == "cut" and operation[1] <= len(content):
            fs.cut("/d/f", operation[1])  # a torn write: both shortened
            del content[operation[1]:]
            durable = durable[:operation[1]]
        assert fs.read_file("/d/f") == bytes(content)
        assert fs.durable_content("/d/f") == durable
