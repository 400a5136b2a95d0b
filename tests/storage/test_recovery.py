"""Crash recovery: torn and corrupt tails are cut to the valid prefix; corruption inside the
flushed region is detected, reported and refused, never truncated away."""

from __future__ import annotations

import random
import shutil

import pytest

from storage.batch import iter_batches
from storage.checkpoint import RECOVERY_POINT_NAME
from storage.epochs import EPOCH_CHECKPOINT_NAME
from storage.errors import CorruptLog
from storage.fs import OsFileSystem
from storage.log import FlushPolicy, LogConfig, PartitionLog
from storage.memory import MemoryFileSystem, open_memory_log
from storage.segment import segment_file_name

from .storage_helpers import make_batch, offsets_of

CONFIG = LogConfig(segment_bytes=700, index_interval_bytes=100, retention_ms=None)


def segment_path(base_offset: int, directory: str = "/log") -> str:
    return f"{directory}/{segment_file_name(base_offset)}"


def build(batches: int, flushed_batches: int, *, config: LogConfig = CONFIG, records: int = 2):
    """A memory log with `batches` batches of which the first `flushed_batches` were flushed.
    Returns (fs, positions) where positions lists (segment base, position, size, base offset)."""
    fs = MemoryFileSystem()
    log = open_memory_log(config, fs=fs)
    epoch = 0
    for index in range(batches):
        if index == batches // 2:
            epoch = 3  # an epoch change in the middle, so epoch checks have two entries to use
        log.append_producer_batch(make_batch(records, value_bytes=20, tag=index, timestamp_ms=index), epoch, index)
        if index + 1 == flushed_batches:
            log.flush()
    positions = []
    for base in log.segment_base_offsets:
        data = fs.read_file(segment_path(base))
        positions += [(base, position, header.size, header.base_offset) for position, header in iter_batches(data)]
    everything = log.read(0, 1 << 30)
    return fs, positions, everything


def prefix_bytes(everything: bytes, end_offset: int) -> bytes:
    kept = [header.size for _, header in iter_batches(everything) if header.next_offset <= end_offset]
    return everything[: sum(kept)]


def read_all(log) -> bytes:
    return log.read(log.log_start_offset, 1 << 30) if log.log_end_offset > log.log_start_offset else b""


# -- the torn tail --------------------------------------------------------------------------
def test_cutting_the_last_batch_at_every_byte_recovers_exactly_the_valid_prefix():
    fs, positions, everything = build(batches=12, flushed_batches=8)
    base, position, size, last_base = positions[-1]
    for kept in range(size + 1):
        twin = fs.clone()
        twin.cut(segment_path(base), position + kept)
        log = open_memory_log(CONFIG, fs=twin)
        whole = kept == size
        assert log.log_end_offset == (last_base + 2 if whole else last_base), kept
        assert log.recovery.truncated_bytes == (0 if whole else kept)
        assert log.recovery.truncated_batches == (1 if 0 < kept < size else 0)
        assert log.recovery.corrupt_ranges == []
        assert read_all(log) == prefix_bytes(everything, log.log_end_offset)


def test_cutting_on_real_files_recovers_the_valid_prefix(tmp_path):
    config = CONFIG
    source = tmp_path / "source"
    log = PartitionLog.open(str(source), config, fs=OsFileSystem(), now_ms=0)
    for index in range(6):
        log.append_producer_batch(make_batch(2, tag=index), 1, 0)
        if index == 3:
            log.flush()
    everything = log.read(0, 1 << 30)
    last_base = log.segment_base_offsets[-1]
    shutil.copytree(source, tmp_path / "copy")  # the crash image: the tail is unflushed
    log.close()
    path = tmp_path / "copy" / segment_file_name(last_base)
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    recovered = PartitionLog.open(str(tmp_path / "copy"), config, fs=OsFileSystem(), now_ms=0)
    try:
        assert recovered.log_end_offset == 10
        assert recovered.recovery.truncated_batches == 1
        assert recovered.recovery.truncated_bytes == len(make_batch(2)) - 7
        assert read_all(recovered) == prefix_bytes(everything, 10)
        assert path.stat().st_size == len(data) - len(make_batch(2))
    finally:
        recovered.close()


def test_flipping_any_byte_of_the_unflushed_tail_recovers_the_prefix_before_it():
    fs, positions, everything = build(batches=10, flushed_batches=7)
    rng = random.Random(7)
    tail = positions[7:]
    for base, position, size, batch_base in tail:
        for byte in range(size):
            twin = fs.clone()
            twin.corrupt(segment_path(base), position + byte, rng.randrange(1, 256))
            log = open_memory_log(CONFIG, fs=twin)
            assert log.log_end_offset == batch_base, (batch_base, byte)
            assert log.recovery.corrupt_ranges == []
            if byte not in range(20, 24):  # unless the payload length itself was hit, every batch is counted
                assert log.recovery.truncated_batches == 10 - positions.index((base, position, size, batch_base))
            assert read_all(log) == prefix_bytes(everything, batch_base)


# -- corruption inside the flushed region ----------------------------------------------------
@pytest.mark.parametrize("byte", [0, 3, 9, 16, 21, 37])  # base offset, epoch, version, length, count
def test_header_corruption_in_the_flushed_middle_is_refused_not_truncated(byte):
    """Only the damaged batch is refused: the walk finds the intact batch after it (a header that
    parses, the offsets expected, a CRC that matches) even when a damaged length or record count
    claims its bytes, and every batch after it stays readable."""
    fs, positions, everything = build(batches=14, flushed_batches=14)
    base, position, size, batch_base = positions[3]
    assert base == positions[0][0] and positions[4][0] == base  # a closed segment in the middle of the log
    next_batch = positions[4][3]
    fs.corrupt(segment_path(base), position + byte, 0x40)
    log = open_memory_log(CONFIG, fs=fs)
    assert log.log_end_offset == 28  # nothing cut
    assert log.recovery.truncated_bytes == 0
    assert log.recovery.corrupt_ranges == [(batch_base, next_batch - 1)]
    assert log.corrupt_ranges == [(batch_base, next_batch - 1)]
    with pytest.raises(CorruptLog) as raised:
        log.read(batch_base, 1 << 20)
    assert (raised.value.first_offset, raised.value.last_offset) == (batch_base, next_batch - 1)
    assert read_all(log) == everything[:position]  # a read from before stops before the damage
    assert log.read(next_batch, 1 << 30) == everything[position + size:]
    walked = [header.base_offset for header in log.iter_headers(0)]  # header walks step over it
    assert walked == [entry[3] for entry in positions if entry[3] != batch_base]


def test_payload_corruption_in_the_flushed_middle_is_refused_when_read():
    fs, positions, everything = build(batches=14, flushed_batches=14)
    base, position, size, batch_base = positions[2]
    fs.corrupt(segment_path(base), position + size - 1)
    log = open_memory_log(CONFIG, fs=fs)
    assert log.recovery.corrupt_ranges == []  # a header walk cannot see payload rot
    assert read_all(log) == everything[:position]
    with pytest.raises(CorruptLog):
        log.read(batch_base, 1 << 20)
    assert log.corrupt_ranges == [(batch_base, batch_base + 1)]
    after = log.read(batch_base + 2, 1 << 30)
    assert offsets_of(after)[0] == (batch_base + 2, batch_base + 3)
    assert log.log_end_offset == 28


def test_corruption_in_the_flushed_part_of_the_active_segment_resumes_at_the_recovery_point():
    fs, positions, everything = build(batches=16, flushed_batches=14)
    last_segment = positions[-1][0]
    in_last = [entry for entry in positions if entry[0] == last_segment]
    assert [entry[3] for entry in in_last] == [24, 26, 28, 30]  # 24, 26 flushed; 28, 30 not
    base, position, size, batch_base = in_last[0]
    fs.corrupt(segment_path(base), position + 20, 0x7F)  # payload length field
    fs.corrupt(segment_path(base), in_last[1][1] + in_last[1][2] - 1)  # and the next batch's payload:
    log = open_memory_log(CONFIG, fs=fs)  # no intact batch follows the damage before the recovery point
    assert log.recovery.corrupt_ranges == [(24, 27)]  # refused up to the recovery point
    assert log.log_end_offset == 32  # the tail after the recovery point was verified and kept
    assert offsets_of(log.read(28, 1 << 20)) == [(28, 29), (30, 31)]
    with pytest.raises(CorruptLog):
        log.read(26, 100)
    log.truncate_to(26)  # a follower heals by truncating and fetching again
    assert log.corrupt_ranges == [] and log.log_end_offset == 24
    log.append_producer_batch(make_batch(2), 5, 0)
    assert offsets_of(log.read(24, 1 << 20)) == [(24, 25)]


def test_a_missing_segment_in_the_flushed_region_is_refused():
    fs, positions, everything = build(batches=14, flushed_batches=14)
    bases = sorted({entry[0] for entry in positions})
    fs.remove(segment_path(bases[1]))
    log = open_memory_log(CONFIG, fs=fs)
    assert log.recovery.corrupt_ranges == [(bases[1], bases[2] - 1)]
    with pytest.raises(CorruptLog):
        log.read(bases[1], 100)
    assert log.log_end_offset == 28
    assert log.read(bases[2], 1 << 30) != b""


def test_a_missing_first_segment_is_reported_not_taken_for_a_higher_log_start():
    """The log start is the checkpoint's; a log whose files now begin above it lost them. Taken
    for a log that starts higher, it opened as healthy and, elected, served the rest as if the
    first records had never been written."""
    fs, positions, everything = build(batches=14, flushed_batches=14)
    bases = sorted({entry[0] for entry in positions})
    fs.remove(segment_path(bases[0]))
    log = open_memory_log(CONFIG, fs=fs)
    assert log.recovery.corrupt_ranges == [(0, bases[1] - 1)]
    assert any("no segment holds them" in problem for problem in log.recovery.problems)
    assert log.log_end_offset == 28


def test_retention_followed_by_a_crash_is_not_taken_for_a_lost_segment():
    """Retention moves the checkpoint's log start before it removes the files below it: a crash
    in between leaves files the log no longer holds, never a log start below its first file."""
    config = LogConfig(segment_bytes=700, index_interval_bytes=100, retention_ms=None, retention_bytes=1500)
    fs, positions, everything = build(batches=14, flushed_batches=14, config=config)
    log = open_memory_log(config, fs=fs)
    assert log.apply_retention(now_ms=100) >= 1
    fs.crash()  # nothing flushed after the retention
    again = open_memory_log(config, fs=fs)
    assert again.recovery.corrupt_ranges == [] and again.recovery.problems == []
    assert again.log_start_offset == log.log_start_offset


@pytest.mark.parametrize("tail", [bytes(4096), b"\xff" * 100])
def test_bytes_after_the_last_batch_of_a_sealed_segment_are_cut_and_nothing_is_refused(tail):
    """A file grown without its data (`truncate -s +4096`, a file system that extended it) holds no
    offsets: the next segment begins where its batches end. Taken for damage reaching the next
    segment, it made open refuse the directory as overlapping segments, and the replica was
    restarted for ever."""
    fs, positions, everything = build(batches=14, flushed_batches=14)
    bases = sorted({entry[0] for entry in positions})
    fs.set_content(segment_path(bases[0]), fs.durable_content(segment_path(bases[0])) + tail)
    log = open_memory_log(CONFIG, fs=fs)
    assert log.recovery.corrupt_ranges == []
    assert any("hold no offsets" in problem for problem in log.recovery.problems)
    assert read_all(log) == everything


def test_a_wrong_record_count_in_the_last_batch_of_a_sealed_segment_refuses_that_batch():
    """A record count one higher makes the last batch claim the next segment's first offset. Its
    CRC fails, so that batch is the damage (refused, repaired from the leader), not the next
    segment (open refused the directory as overlapping, for ever)."""
    fs, positions, everything = build(batches=14, flushed_batches=14)
    bases = sorted({entry[0] for entry in positions})
    last = [entry for entry in positions if entry[0] == bases[0]][-1]
    _, position, size, batch_base = last
    data = bytearray(fs.durable_content(segment_path(bases[0])))
    count_at = position + 36  # storage/batch.py: the record count, which the CRC covers
    count = int.from_bytes(data[count_at:count_at + 4], "little")
    data[count_at:count_at + 4] = (count + 1).to_bytes(4, "little")
    fs.set_content(segment_path(bases[0]), bytes(data))
    log = open_memory_log(CONFIG, fs=fs)
    assert log.recovery.corrupt_ranges == [(batch_base, bases[1] - 1)]
    assert log.log_end_offset == 28
    with pytest.raises(CorruptLog):
        log.read(batch_base, 100)
    assert log.read(bases[1], 1 << 30) != b""


def test_overlapping_segments_are_not_guessed_at():
    fs, positions, everything = build(batches=14, flushed_batches=14)
    bases = sorted({entry[0] for entry in positions})
    fs.rename(segment_path(bases[1]), segment_path(bases[1] - 1))
    with pytest.raises(CorruptLog):
        open_memory_log(CONFIG, fs=fs)


def test_flushed_data_gone_missing_is_reported():
    fs, positions, everything = build(batches=6, flushed_batches=6)
    base, position, size, batch_base = positions[-1]
    fs.cut(segment_path(base), position)
    log = open_memory_log(CONFIG, fs=fs)
    assert log.recovery.corrupt_ranges == [(batch_base, batch_base + 1)]
    assert log.log_end_offset == batch_base


def test_torn_checkpoint_slot_falls_back_to_the_older_one():
    fs, positions, everything = build(batches=8, flushed_batches=8)
    data = bytearray(fs.read_file(f"/log/{RECOVERY_POINT_NAME}"))
    newest = 0 if data[4:12] > data[68:76] else 64  # the slot with the larger sequence number
    fs.corrupt(f"/log/{RECOVERY_POINT_NAME}", newest + 20)
    log = open_memory_log(CONFIG, fs=fs)
    assert log.log_end_offset == 16 and log.recovery.corrupt_ranges == []


def test_corrupt_epoch_checkpoint_is_rebuilt_from_the_batches():
    fs, positions, everything = build(batches=8, flushed_batches=8)
    fs.corrupt(f"/log/{EPOCH_CHECKPOINT_NAME}", 5)
    log = open_memory_log(CONFIG, fs=fs)
    assert log.epoch_entries() == [(0, 0), (3, 8)]
    assert any("epoch" in problem for problem in log.recovery.problems)
    assert open_memory_log(CONFIG, fs=fs).epoch_entries() == [(0, 0), (3, 8)]  # and persisted


# -- the crash model, per flush policy -------------------------------------------------------
@pytest.mark.parametrize("policy", list(FlushPolicy))
def test_crash_loses_exactly_the_unflushed_suffix(policy):
    config = LogConfig(segment_bytes=500, flush_policy=policy, flush_interval_ms=10, retention_ms=None)
    fs = MemoryFileSystem()
    log = open_memory_log(config, fs=fs)
    rng = random.Random(policy.value)
    for index in range(40):
        log.append_producer_batch(make_batch(rng.randint(1, 3), tag=index), index // 10, index * 3)
        if policy is FlushPolicy.INTERVAL:
            log.maybe_flush(index * 3)
        elif policy is FlushPolicy.NEVER and rng.random() < 0.1:
            log.flush()
    flushed = log.flushed_offset
    expected = prefix_bytes(log.read(0, 1 << 30), flushed)
    if policy is FlushPolicy.EVERY_BATCH:
        assert flushed == log.log_end_offset
    fs.crash()
    recovered = open_memory_log(config, fs=fs)
    assert recovered.log_end_offset == flushed
    assert read_all(recovered) == expected
    assert recovered.recovery.corrupt_ranges == []
    recovered.append_producer_batch(make_batch(), 9, 0)  # and the log goes on


def test_missing_epoch_checkpoint_is_rebuilt_and_reported():
    fs, positions, everything = build(batches=8, flushed_batches=8)
    fs.remove(f"/log/{EPOCH_CHECKPOINT_NAME}")
    log = open_memory_log(CONFIG, fs=fs)
    assert log.epoch_entries() == [(0, 0), (3, 8)]
    assert any("missing" in problem for problem in log.recovery.problems)


def test_a_new_log_reports_no_problems():
    log = open_memory_log(CONFIG)
    assert log.recovery.problems == [] and log.recovery.corrupt_ranges == []
    assert (log.log_start_offset, log.log_end_offset, log.flushed_offset) == (0, 0, 0)
