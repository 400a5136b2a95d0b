"""Unit tests of every PartitionLog API, on the memory twin and (where it matters) real files."""

from __future__ import annotations

import pytest

from storage.batch import HEADER_SIZE, encode_batch, iter_batches, stamp
from storage.errors import (BatchTooLarge, CorruptBatch, CorruptLog, FsyncFailed, LogClosed, OffsetOutOfRange,
                            OutOfOrderBatch, StaleLeaderEpoch, StorageFull)
from storage.fs import OsFileSystem
from storage.log import FlushPolicy, LogConfig, PartitionLog
from storage.memory import MemoryFileSystem, open_memory_log

from .storage_helpers import make_batch, offsets_of


@pytest.fixture(params=["memory", "os"])
def log_factory(request, tmp_path):
    """open(config, now_ms=0) on a fresh store; every log opened is closed afterwards."""
    fs = MemoryFileSystem() if request.param == "memory" else OsFileSystem()
    directory = "/log" if request.param == "memory" else str(tmp_path / "log")
    opened = []

    def open_log(config=LogConfig(segment_bytes=1024, index_interval_bytes=128, retention_ms=None), now_ms=0):
        log = PartitionLog.open(directory, config, fs=fs, now_ms=now_ms)
        opened.append(log)
        return log

    open_log.fs = fs
    yield open_log
    for log in opened:
        try:
            log.close()
        except Exception:
            pass


def fill(log, count, records=3, epoch=0, first_timestamp_ms=1_000):
    return [log.append_producer_batch(make_batch(records, tag=index, timestamp_ms=first_timestamp_ms + index),
                                      epoch, first_timestamp_ms + index) for index in range(count)]


# -- appends ------------------------------------------------------------------------------
def test_producer_append_assigns_contiguous_offsets_and_stamps(log_factory):
    log = log_factory()
    results = fill(log, 3, records=4, epoch=2)
    assert [(r.base_offset, r.last_offset, r.log_end_offset) for r in results] == [(0, 3, 4), (4, 7, 8), (8, 11, 12)]
    headers = [header for _, header in iter_batches(log.read(0, 1 << 20))]
    assert [(h.base_offset, h.leader_epoch) for h in headers] == [(0, 2), (4, 2), (8, 2)]
    assert log.log_end_offset == 12 and log.log_start_offset == 0


def test_producer_append_does_not_mutate_the_callers_buffer(log_factory):
    log = log_factory()
    log.append_producer_batch(make_batch(), 0, 0)
    batch = make_batch()
    before = bytes(batch)
    log.append_producer_batch(batch, 0, 0)
    assert bytes(batch) == before


@pytest.mark.parametrize("damage", ["crc", "truncated_header", "truncated_payload", "trailing", "absurd_length"])
def test_bad_producer_batches_are_refused_and_nothing_is_written(log_factory, damage):
    log = log_factory()
    fill(log, 1)
    size_before = log.size_bytes
    batch = make_batch(2)
    if damage == "crc":
        batch[-1] ^= 0x01
    elif damage == "truncated_header":
        batch = batch[: HEADER_SIZE - 1]
    elif damage == "truncated_payload":
        batch = batch[:-1]
    elif damage == "trailing":
        batch += b"\0"
    else:
        batch[20:24] = (0xFFFFFFF0).to_bytes(4, "little")
    with pytest.raises((CorruptBatch, BatchTooLarge)):
        log.append_producer_batch(batch, 0, 0)
    assert log.size_bytes == size_before and log.log_end_offset == 3


def test_batch_larger_than_limit_is_refused(log_factory):
    log = log_factory(LogConfig(batch_bytes_max=200, retention_ms=None))
    with pytest.raises(BatchTooLarge):
        log.append_producer_batch(make_batch(1, value_bytes=500), 0, 0)
    assert log.size_bytes == 0


def test_producer_epochs_enter_the_checkpoint_and_stale_epochs_are_refused(log_factory):
    log = log_factory()
    fill(log, 2, epoch=1)
    log.append_producer_batch(make_batch(), 3, 0)
    assert log.epoch_entries() == [(1, 0), (3, 6)]
    assert log.latest_epoch() == 3
    with pytest.raises(StaleLeaderEpoch):
        log.append_producer_batch(make_batch(), 2, 0)
    assert log.log_end_offset == 7


def leader_batches(first_offset, counts, epoch):
    """What a leader would send: stamped batches, concatenated."""
    data = bytearray()
    offset = first_offset
    for index, count in enumerate(counts):
        data += stamp(make_batch(count, tag=index), offset, epoch)
        offset += count
    return bytes(data)


def test_replicated_append_keeps_leader_offsets_and_epochs(log_factory):
    log = log_factory()
    result = log.append_replicated_batches(leader_batches(0, [2, 3], epoch=4), now_ms=0)
    assert result == (0, 4, 5)
    log.append_replicated_batches(leader_batches(5, [1], epoch=6), now_ms=0)
    assert log.epoch_entries() == [(4, 0), (6, 5)]
    assert offsets_of(log.read(0, 1 << 20)) == [(0, 1), (2, 4), (5, 5)]


@pytest.mark.parametrize("first_offset", [3, 7])
def test_replicated_gap_or_overlap_is_refused_whole(log_factory, first_offset):
    log = log_factory()
    log.append_replicated_batches(leader_batches(0, [5], epoch=1), now_ms=0)
    with pytest.raises(OutOfOrderBatch) as raised:
        log.append_replicated_batches(leader_batches(first_offset, [1], epoch=1), now_ms=0)
    assert raised.value.expected_offset == 5
    assert log.log_end_offset == 5


def test_replicated_batches_are_all_checked_before_any_is_written(log_factory):
    log = log_factory()
    good = leader_batches(0, [2, 2], epoch=1)
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0x10
    with pytest.raises(CorruptBatch):
        log.append_replicated_batches(bad_crc, now_ms=0)
    discontinuous = good + stamp(make_batch(1), 9, 1)
    with pytest.raises(OutOfOrderBatch):
        log.append_replicated_batches(discontinuous, now_ms=0)
    with pytest.raises(CorruptBatch):
        log.append_replicated_batches(good[:-3], now_ms=0)
    assert log.size_bytes == 0 and log.log_end_offset == 0 and log.epoch_entries() == []


def test_replicated_stale_epoch_is_refused(log_factory):
    log = log_factory()
    log.append_replicated_batches(leader_batches(0, [1], epoch=5), now_ms=0)
    with pytest.raises(StaleLeaderEpoch):
        log.append_replicated_batches(leader_batches(1, [1], epoch=4), now_ms=0)


def test_replicated_batches_of_an_older_epoch_replace_an_epoch_led_without_a_batch(log_factory):
    log = log_factory()
    log.append_replicated_batches(leader_batches(0, [2], epoch=3), now_ms=0)
    log.assign_epoch(5, 2)  # led epoch 5, wrote nothing; the next leader never had epoch 5
    log.append_replicated_batches(leader_batches(2, [1], epoch=3), now_ms=0)
    assert log.epoch_entries() == [(3, 0)]
    log.append_replicated_batches(leader_batches(3, [1], epoch=6), now_ms=0)
    assert log.epoch_entries() == [(3, 0), (6, 3)]
    with pytest.raises(StaleLeaderEpoch):  # an epoch with batches is never replaced
        log.append_replicated_batches(leader_batches(4, [1], epoch=3), now_ms=0)


def test_replicated_append_spanning_rolls_lands_in_several_segments(log_factory):
    log = log_factory(LogConfig(segment_bytes=300, retention_ms=None))
    log.append_replicated_batches(leader_batches(0, [1] * 12, epoch=0), now_ms=0)
    assert len(log.segment_base_offsets) > 2
    assert offsets_of(log.read(0, 1 << 20)) == [(offset, offset) for offset in range(12)]


# -- rolling ------------------------------------------------------------------------------
def test_segments_roll_on_size_and_on_age(log_factory):
    log = log_factory(LogConfig(segment_bytes=500, segment_ms=1_000, retention_ms=None))
    batch_size = len(make_batch(3))
    per_segment = 500 // batch_size
    fill(log, per_segment + 1)
    assert log.segment_base_offsets == [0, 3 * per_segment]
    log.append_producer_batch(make_batch(), 0, now_ms=5_000)  # the active segment is old now
    assert len(log.segment_base_offsets) == 3
    oversized = make_batch(1, value_bytes=900)
    log.append_producer_batch(oversized, 0, now_ms=5_000)  # a batch bigger than a segment gets its own
    assert len(log.segment_base_offsets) == 4


# -- reads --------------------------------------------------------------------------------
def test_read_starts_at_the_batch_holding_the_offset_and_respects_bounds(log_factory):
    log = log_factory()
    fill(log, 10, records=3)
    batch_size = len(make_batch(3))
    assert offsets_of(log.read(4, 1 << 20))[0] == (3, 5)
    assert offsets_of(log.read(4, 2 * batch_size)) == [(3, 5), (6, 8)]
    assert offsets_of(log.read(4, 2 * batch_size - 1)) == [(3, 5)]
    assert offsets_of(log.read(4, 1)) == [(3, 5)]  # always one whole batch
    assert offsets_of(log.read(0, 1 << 20, max_offset=9)) == [(0, 2), (3, 5), (6, 8)]
    assert log.read(3, 1 << 20, max_offset=5) == b""  # the batch would end past the bound
    assert log.read(9, 1 << 20, max_offset=9) == b""
    assert log.read(30, 1 << 20) == b""


def test_read_spans_segments(log_factory):
    log = log_factory(LogConfig(segment_bytes=300, retention_ms=None))
    fill(log, 20, records=1)
    assert len(log.segment_base_offsets) > 3
    assert offsets_of(log.read(0, 1 << 20)) == [(offset, offset) for offset in range(20)]


def test_read_out_of_range_carries_the_valid_range(log_factory):
    log = log_factory()
    fill(log, 2)
    with pytest.raises(OffsetOutOfRange) as raised:
        log.read(7, 100)
    assert (raised.value.log_start_offset, raised.value.log_end_offset) == (0, 6)
    log.delete_records_before(3)
    with pytest.raises(OffsetOutOfRange) as raised:
        log.read(2, 100)
    assert raised.value.requested_offset == 2 and raised.value.log_start_offset == 3


def test_iter_headers_and_batch_timestamp(log_factory):
    log = log_factory(LogConfig(segment_bytes=300, retention_ms=None))
    fill(log, 8, records=2, first_timestamp_ms=500)
    assert [header.base_offset for header in log.iter_headers(5)] == [4, 6, 8, 10, 12, 14]
    assert list(log.iter_headers(16)) == []
    assert log.batch_timestamp(5) == 502
    assert log.batch_timestamp(16) is None


def test_offset_for_timestamp_uses_batch_max_timestamps(log_factory):
    log = log_factory(LogConfig(segment_bytes=400, index_interval_bytes=64, retention_ms=None))
    timestamps = [100, 300, 200, 400, 400, 900]
    for index, timestamp in enumerate(timestamps):
        log.append_producer_batch(make_batch(2, tag=index, timestamp_ms=timestamp), 0, 0)
    assert log.offset_for_timestamp(50) == 0
    assert log.offset_for_timestamp(250) == 2  # the batch at 300 is the first whose max >= 250
    assert log.offset_for_timestamp(400) == 6
    assert log.offset_for_timestamp(901) == 10  # record deltas: max is first + 1
    assert log.offset_for_timestamp(902) is None
    log.delete_records_before(3)
    assert log.offset_for_timestamp(50) == 3


# -- truncation, reset ----------------------------------------------------------------------
def test_truncate_to_removes_whole_batches_and_epochs(log_factory):
    log = log_factory(LogConfig(segment_bytes=300, retention_ms=None))
    fill(log, 4, records=3, epoch=1)
    log.append_producer_batch(make_batch(3), 2, 0)
    log.append_producer_batch(make_batch(3), 2, 0)
    assert log.epoch_entries() == [(1, 0), (2, 12)]
    log.truncate_to(13)  # inside the batch 12..14: it goes whole
    assert log.log_end_offset == 12
    assert log.epoch_entries() == [(1, 0)]
    assert offsets_of(log.read(0, 1 << 20))[-1] == (9, 11)
    log.truncate_to(3)
    assert log.log_end_offset == 3 and log.segment_base_offsets[-1] <= 3
    log.truncate_to(50)  # past the end: nothing to do
    assert log.log_end_offset == 3
    assert log.append_producer_batch(make_batch(), 3, 0).base_offset == 3
    log.delete_records_before(2)
    with pytest.raises(ValueError):
        log.truncate_to(1)  # below the log start


def test_reset_to_restarts_the_log_empty(log_factory):
    log = log_factory()
    fill(log, 3, epoch=1)
    log.reset_to(100)
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (100, 100, 0)
    assert log.epoch_entries() == []
    assert log.append_producer_batch(make_batch(), 2, 0).base_offset == 100
    with pytest.raises(OffsetOutOfRange):
        log.read(99, 10)


# -- retention and delete-records -----------------------------------------------------------
def test_retention_by_time_deletes_whole_old_segments_never_the_active(log_factory):
    log = log_factory(LogConfig(segment_bytes=300, retention_ms=1_000))
    fill(log, 10, records=1, first_timestamp_ms=0)
    segments = log.segment_base_offsets
    assert log.apply_retention(now_ms=1_000) == 0  # the oldest batch is exactly 1 000 ms old
    deleted = log.apply_retention(now_ms=10_000)
    assert deleted == len(segments) - 1
    assert log.segment_base_offsets == segments[-1:]
    assert log.log_start_offset == segments[-1]


def test_retention_by_size(log_factory):
    log = log_factory(LogConfig(segment_bytes=300, retention_ms=None, retention_bytes=700))
    fill(log, 20, records=1)
    log.apply_retention(now_ms=0)
    assert log.size_bytes <= 700
    assert log.log_start_offset == log.segment_base_offsets[0]
    assert offsets_of(log.read(log.log_start_offset, 1 << 20))[-1] == (19, 19)


def test_delete_records_before_moves_log_start_and_deletes_whole_segments(log_factory):
    log = log_factory(LogConfig(segment_bytes=300, retention_ms=None))
    fill(log, 10, records=1)
    second = log.segment_base_offsets[1]
    log.delete_records_before(second + 1)
    assert log.log_start_offset == second + 1
    assert log.segment_base_offsets[0] == second
    with pytest.raises(OffsetOutOfRange):
        log.delete_records_before(11)


def test_log_start_from_delete_records_survives_reopen(log_factory):
    log = log_factory()
    fill(log, 3)
    log.delete_records_before(4)
    log.close()
    assert log_factory().log_start_offset == 4


# -- epochs -----------------------------------------------------------------------------------
def test_epoch_checkpoint_api(log_factory):
    log = log_factory()
    assert log.latest_epoch() == -1 and log.end_offset_for_epoch(3) == (-1, -1)
    log.assign_epoch(1, 0)
    log.assign_epoch(1, 0)  # idempotent
    fill(log, 2, epoch=1)
    log.assign_epoch(3, 6)
    fill(log, 1, epoch=3)
    assert log.epoch_entries() == [(1, 0), (3, 6)]
    assert log.end_offset_for_epoch(1) == (1, 6)
    assert log.end_offset_for_epoch(2) == (1, 6)
    assert log.end_offset_for_epoch(3) == (3, 9)
    assert log.end_offset_for_epoch(0) == (-1, -1)
    with pytest.raises(ValueError):
        log.assign_epoch(2, 9)  # epochs strictly increase
    with pytest.raises(ValueError):
        log.assign_epoch(4, 5)  # below the log end
    log.close()
    assert log_factory().epoch_entries() == [(1, 0), (3, 6)]


# -- durability, flushing, closing -------------------------------------------------------------
def test_flush_policies_advance_the_flushed_offset(log_factory):
    log = log_factory(LogConfig(flush_policy=FlushPolicy.EVERY_BATCH, retention_ms=None))
    fill(log, 2)
    assert log.flushed_offset == 6


def test_interval_flush(log_factory):
    log = log_factory(LogConfig(flush_policy=FlushPolicy.INTERVAL, flush_interval_ms=100, retention_ms=None))
    fill(log, 2)
    assert log.flushed_offset == 0
    assert log.maybe_flush(50) is False
    assert log.maybe_flush(100) is True and log.flushed_offset == 6
    assert log.maybe_flush(300) is False  # nothing new


def test_never_policy_only_flushes_on_request(log_factory):
    log = log_factory()
    fill(log, 2)
    assert log.maybe_flush(10**9) is False and log.flushed_offset == 0
    log.flush()
    assert log.flushed_offset == 6


def test_closed_log_refuses_work(log_factory):
    log = log_factory()
    log.close()
    log.close()
    for call in (lambda: log.read(0, 10), lambda: log.append_producer_batch(make_batch(), 0, 0),
                 lambda: log.flush(), lambda: log.truncate_to(0)):
        with pytest.raises(LogClosed):
            call()


def test_failed_fsync_makes_the_log_refuse_all_further_work(log_factory):
    log = log_factory(LogConfig(flush_policy=FlushPolicy.EVERY_BATCH, retention_ms=None))
    fill(log, 1)
    log_factory.fs.faults.fail_next_fsync()
    with pytest.raises(FsyncFailed):
        log.append_producer_batch(make_batch(), 0, 0)
    with pytest.raises(LogClosed):
        log.append_producer_batch(make_batch(), 0, 0)
    with pytest.raises(LogClosed):
        log.flush()
    log.close()
    reopened = log_factory()
    assert reopened.log_end_offset in (3, 4)  # the batch whose fsync failed may or may not be there


def test_storage_full_rolls_back_a_producer_append(log_factory):
    log = log_factory()
    fill(log, 2)
    log_factory.fs.faults.set_write_quota(10)
    with pytest.raises(StorageFull):
        log.append_producer_batch(make_batch(3), 0, 0)
    log_factory.fs.faults.set_write_quota(None)
    assert log.log_end_offset == 6
    assert log.append_producer_batch(make_batch(3), 0, 0).base_offset == 6
    assert offsets_of(log.read(0, 1 << 20)) == [(0, 2), (3, 5), (6, 8)]


def test_storage_full_rolls_back_every_replicated_batch_of_the_call(log_factory):
    log = log_factory(LogConfig(segment_bytes=300, retention_ms=None))
    data = leader_batches(0, [1] * 10, epoch=2)
    log_factory.fs.faults.set_write_quota(len(data) // 2)
    with pytest.raises(StorageFull):
        log.append_replicated_batches(data, now_ms=0)
    log_factory.fs.faults.set_write_quota(None)
    assert log.log_end_offset == 0 and log.size_bytes == 0 and log.epoch_entries() == []
    log.append_replicated_batches(data, now_ms=0)
    assert log.log_end_offset == 10


def test_open_memory_log_convenience():
    fs = MemoryFileSystem()
    log = open_memory_log(LogConfig(), now_ms=5, fs=fs)
    log.append_producer_batch(encode_batch([(0, None, b"v", None)], 5), 0, 5)
    log.flush()
    fs.crash()
    assert open_memory_log(LogConfig(), fs=fs).log_end_offset == 1


# ------------------------------------------------------------------ a corrupt header is a claim

RECORD_COUNT_AT = 36  # byte offset of record_count in a batch header (CRC-covered)


def six_flushed_batches():
    """(file system, log, segment path) of a log of six one-record batches, all flushed."""
    fs = MemoryFileSystem()
    log = open_memory_log(LogConfig(), now_ms=0, fs=fs)
    for index in range(6):
        log.append_producer_batch(make_batch(1, tag=index), 0, 1_000)
    log.flush()
    return fs, log, "/log/" + [name for name in fs.list_directory("/log") if name.endswith(".log")][0]


@pytest.mark.parametrize("walk", ["headers", "timestamp"])
def test_a_header_walk_refuses_a_damaged_header_as_a_read_does(walk):
    """`iter_headers` and `offset_for_timestamp` (ListOffsets by time) raised the bare
    CorruptBatch of a header damaged since the log was opened: nothing refused it, and the replica
    calling them ended its step. Now the batch is refused, named, and the rest stays readable."""
    fs = MemoryFileSystem()
    log = open_memory_log(LogConfig(), now_ms=0, fs=fs)
    for index in range(6):
        log.append_producer_batch(make_batch(1, timestamp_ms=1_000 + index, tag=index), 0, 1_000)
    log.flush()
    path = "/log/" + [name for name in fs.list_directory("/log") if name.endswith(".log")][0]
    third = next(position for position, header in _positions(fs.read_file(path)) if header.base_offset == 2)
    for byte in range(4):  # a record count of 4,294,967,294: past any a header may claim
        fs.corrupt(path, third + RECORD_COUNT_AT + byte)

    with pytest.raises(CorruptLog) as refused:
        list(log.iter_headers(0)) if walk == "headers" else log.offset_for_timestamp(1_004)

    assert refused.value.first_offset == 2
    assert log.corrupt_ranges and log.corrupt_ranges[0][0] == 2
    assert [header.base_offset for header in log.iter_headers(3)][0] == 3, "the walk steps over it now"


@pytest.mark.parametrize("read", ["read", "scrub"])
def test_a_refused_batch_never_moves_the_log_end_past_what_was_written(read):
    """Bit rot in a batch's record count (a field the CRC covers) made the header claim offsets
    2..255 in a log of 6: the read refused "2..255" and the log end jumped to 256, so a leader
    would hand out offsets past a gap and a follower would ask for records that never existed.
    The refused range is bounded by what the log knows it wrote."""
    fs, log, path = six_flushed_batches()
    third = next(position for position, header in _positions(fs.read_file(path)) if header.base_offset == 2)
    fs.corrupt(path, third + RECORD_COUNT_AT, 0xFE)  # 1 record -> 255

    with pytest.raises(CorruptLog):
        log.read(2, 1 << 20) if read == "read" else log.scrub(2, 1 << 20)

    assert log.log_end_offset == 6
    assert all(first <= last <= 5 for first, last in log.corrupt_ranges), log.corrupt_ranges
    assert offsets_of(log.read(3, 1 << 20))[0] == (3, 3), "the batches after the damage stay readable"


def _positions(data):
    position = 0
    for header in (h for _, h in iter_batches(data, verify=False)):
        yield position, header
        position += header.size


PAYLOAD_LENGTH_AT = 20  # byte offset of payload_length in a batch header (CRC-covered)


@pytest.mark.parametrize("grown", [128, 256], ids=["within-the-file", "past-its-end"])
@pytest.mark.parametrize("read", ["read", "scrub", "reopen"])
def test_a_refused_batch_whose_length_grew_does_not_refuse_the_good_batches_it_claims(read, grown):
    """Bit rot in a batch's payload length made its header claim the bytes of the next batches
    too: the read refused them all, and on a partition with no other copy the intact batches
    after the damage were unreadable. The good batches inside the claimed span are found again
    (a header that parses, offsets the log wrote, a CRC that matches): only the damaged batch is
    refused. The grown length ends inside the file (the CRC fails) or past its end (the header
    promises bytes that are not there)."""
    fs, log, path = six_flushed_batches()
    positions = dict((header.base_offset, position) for position, header in _positions(fs.read_file(path)))
    size = positions[3] - positions[2]
    claimed_end = positions[2] + size + grown
    assert positions[4] < claimed_end and (claimed_end < len(fs.read_file(path))) == (grown == 128)
    at = positions[2] + PAYLOAD_LENGTH_AT
    length = int.from_bytes(fs.read_file(path)[at: at + 4], "little")
    for index, (old, new) in enumerate(zip(length.to_bytes(4, "little"), (length + grown).to_bytes(4, "little"))):
        if old != new:
            fs.corrupt(path, at + index, old ^ new)

    if read == "reopen":  # found by the recovery walk of the next start
        fs.crash()
        log = open_memory_log(LogConfig(), fs=fs)
    with pytest.raises(CorruptLog):
        log.read(2, 1 << 20) if read != "scrub" else log.scrub(2, 1 << 20)

    assert log.log_end_offset == 6
    assert log.corrupt_ranges == [(2, 2)]
    assert [first for first, _ in offsets_of(log.read(3, 1 << 20))][:3] == [3, 4, 5]
