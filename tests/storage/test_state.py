"""DurableState: the coordinator's journal of small state, under the same crash rules as the log."""

from __future__ import annotations

import pytest

from storage.errors import CorruptState, FsyncFailed, LogClosed, StorageFull
from storage.memory import MemoryFileSystem
from storage.state import HEADER_BYTES, DurableState, RecordTooLarge

PATH = "/coordinator/state"


@pytest.fixture
def fs():
    return MemoryFileSystem()


def test_put_get_delete_items(fs):
    state = DurableState.open(PATH, fs=fs)
    state.put("topic/b", {"partitions": 3})
    state.put("topic/a", [1, 2])
    state.put("offset/g/t/0", 17)
    state.delete("offset/g/t/0")
    state.delete("never-there")
    assert state.get("topic/b") == {"partitions": 3}
    assert state.get("missing", "default") == "default"
    assert state.items("topic/") == [("topic/a", [1, 2]), ("topic/b", {"partitions": 3})]
    assert state.items() == state.items("topic/")
    assert len(state) == 2


def test_values_read_back_the_same_before_and_after_a_restart(fs):
    state = DurableState.open(PATH, fs=fs)
    state.put("tuple", (1, "two", b"3", None))
    assert state.get("tuple") == [1, "two", b"3", None]
    state.close()
    assert DurableState.open(PATH, fs=fs).get("tuple") == [1, "two", b"3", None]


def test_flushed_puts_survive_a_crash_and_unflushed_ones_do_not(fs):
    state = DurableState.open(PATH, fs=fs)
    state.put("kept", 1)
    state.put_many([("group/a", 1), ("group/b", 2)])
    state.flush()
    state.put("lost", 2)
    state.delete("kept")
    fs.crash()
    recovered = DurableState.open(PATH, fs=fs)
    assert recovered.items() == [("group/a", 1), ("group/b", 2), ("kept", 1)]


def test_reopen_after_close_keeps_everything(fs):
    state = DurableState.open(PATH, fs=fs)
    for index in range(50):
        state.put(f"k{index % 7}", index)
    state.close()
    with pytest.raises(LogClosed):
        state.put("x", 1)
    reopened = DurableState.open(PATH, fs=fs)
    assert reopened.items() == [(f"k{i}", max(v for v in range(50) if v % 7 == i)) for i in range(7)]
    assert reopened.recovery.truncated_bytes == 0


def test_torn_tail_is_truncated_at_every_byte(fs):
    state = DurableState.open(PATH, fs=fs)
    state.put("a", 1)
    state.flush()
    flushed_length = len(fs.read_file(PATH))
    state.put("b", "x" * 40)
    state.close()
    whole_length = len(fs.read_file(PATH))
    for length in range(flushed_length, whole_length):
        twin = fs.clone()
        twin.cut(PATH, length)
        recovered = DurableState.open(PATH, fs=twin)
        assert recovered.items() == [("a", 1)]
        assert recovered.recovery.truncated_bytes == length - flushed_length
        assert recovered.recovery.truncated_records == (1 if length > flushed_length else 0)
        assert len(twin.read_file(PATH)) == flushed_length
    assert DurableState.open(PATH, fs=fs).items() == [("a", 1), ("b", "x" * 40)]


def test_corrupt_tail_record_is_cut_with_everything_after_it(fs):
    state = DurableState.open(PATH, fs=fs)
    state.put("a", 1)
    state.flush()
    record_b_at = len(fs.read_file(PATH))
    state.put("b", 2)
    state.put("c", 3)
    fs.corrupt(PATH, record_b_at + 9)  # inside record "b"
    recovered = DurableState.open(PATH, fs=fs)
    assert recovered.items() == [("a", 1)]
    assert recovered.recovery.truncated_records == 2


def test_corruption_inside_the_flushed_region_is_refused(fs):
    state = DurableState.open(PATH, fs=fs)
    state.put("a", 1)
    state.flush()
    state.put("b", 2)
    state.flush()  # now the header says record "a" is certainly durable
    state.close()
    fs.corrupt(PATH, HEADER_BYTES + 9)
    with pytest.raises(CorruptState):
        DurableState.open(PATH, fs=fs)


def _two_flushes(fs, *, confirm: bool) -> int:
    """Record "a", flushed; record "b", flushed (the last flush); returns where "b" starts."""
    state = DurableState.open(PATH, fs=fs, confirm=confirm)
    state.put("a", 1)
    state.flush()
    record_b_at = len(fs.read_file(PATH))
    state.put("b", 2)
    state.flush()
    fs.crash()
    return record_b_at


def test_without_confirm_bit_rot_in_the_last_flush_looks_like_a_torn_tail(fs):
    fs.corrupt(PATH, _two_flushes(fs, confirm=False) + 9)
    recovered = DurableState.open(PATH, fs=fs)
    assert recovered.items() == [("a", 1)] and recovered.recovery.truncated_records == 1  # the window


def test_with_confirm_bit_rot_in_the_last_flush_is_corruption_not_a_tail(fs):
    fs.corrupt(PATH, _two_flushes(fs, confirm=True) + 9)
    with pytest.raises(CorruptState):
        DurableState.open(PATH, fs=fs, confirm=True)


def test_with_confirm_a_crash_between_the_two_syncs_keeps_or_cuts_the_tail_but_never_refuses(fs):
    # What the disk holds then: the records synced, the slot still naming the previous length
    # (exactly what a flush without confirm leaves).
    record_b_at = _two_flushes(fs, confirm=False)
    whole = len(fs.read_file(PATH))
    assert DurableState.open(PATH, fs=fs.clone(), confirm=True).items() == [("a", 1), ("b", 2)]
    for length in range(record_b_at, whole):  # and were the unconfirmed records torn after all
        twin = fs.clone()
        twin.cut(PATH, length)
        assert DurableState.open(PATH, fs=twin, confirm=True).items() == [("a", 1)]


def test_compaction_is_automatic_and_keeps_live_keys(fs):
    state = DurableState.open(PATH, fs=fs, compact_min_records=20)
    for index in range(100):
        state.put(f"key{index % 3}", index)
    state.delete("key0")
    assert len(fs.read_file(PATH)) < HEADER_BYTES + 25 * 20  # rewritten: never more than ~20 records
    state.flush()
    fs.crash()
    recovered = DurableState.open(PATH, fs=fs)
    assert recovered.get("key1") == 97 and recovered.get("key2") == 98


def test_explicit_compaction_then_crash_at_any_moment_keeps_old_or_new(fs):
    state = DurableState.open(PATH, fs=fs)
    state.put_many((f"k{index}", index) for index in range(10))
    state.flush()
    state.compact()
    state.put("after", 1)
    fs.crash()
    assert DurableState.open(PATH, fs=fs).items() == sorted((f"k{index}", index) for index in range(10))


def test_storage_full_writes_nothing(fs):
    state = DurableState.open(PATH, fs=fs)
    state.put("a", 1)
    fs.faults.set_write_quota(3)
    with pytest.raises(StorageFull):
        state.put("b", 2)
    fs.faults.set_write_quota(None)
    assert state.get("b") is None
    state.close()
    assert DurableState.open(PATH, fs=fs).items() == [("a", 1)]


def test_failed_fsync_refuses_further_work(fs):
    state = DurableState.open(PATH, fs=fs)
    state.put("a", 1)
    fs.faults.fail_next_fsync()
    with pytest.raises(FsyncFailed):
        state.flush()
    with pytest.raises(LogClosed):
        state.put("b", 1)


def test_bad_keys_and_oversized_records_are_refused(fs):
    state = DurableState.open(PATH, fs=fs)
    with pytest.raises(TypeError):
        state.put(7, "x")
    with pytest.raises(TypeError):
        state.put_many([("ok", 1), (8, 2)])
    with pytest.raises(RecordTooLarge):
        state.put("huge", b"x" * (17 * 1024 * 1024))
    assert state.items() == []


def test_on_real_files(tmp_path):
    path = str(tmp_path / "meta" / "state")
    state = DurableState.open(path)
    state.put("a", {"x": 1})
    state.close()
    reopened = DurableState.open(path)
    try:
        assert reopened.get("a") == {"x": 1}
    finally:
        reopened.close()
