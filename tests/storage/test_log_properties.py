"""Property tests: random appends, reads, rolls, truncations, retention, reopens and crashes of a
PartitionLog (on the memory twin, tiny segments) against a plain list of batches."""

from __future__ import annotations

from bisect import bisect_right

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from storage.batch import stamp
from storage.log import LogConfig
from storage.memory import MemoryFileSystem, open_memory_log

from .storage_helpers import make_batch

RETENTION_BYTES = 1500


class ModelBatch:
    __slots__ = ("base", "next", "data", "max_timestamp_ms")

    def __init__(self, base: int, count: int, data: bytes, max_timestamp_ms: int) -> None:
        self.base, self.next, self.data, self.max_timestamp_ms = base, base + count, data, max_timestamp_ms


class LogMachine(RuleBasedStateMachine):
    @initialize(segment_bytes=st.integers(200, 700), index_interval_bytes=st.sampled_from([1, 64, 400]))
    def open_log(self, segment_bytes, index_interval_bytes):
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes,
                                retention_ms=None, retention_bytes=RETENTION_BYTES)
        self.fs = MemoryFileSystem()
        self.log = open_memory_log(self.config, fs=self.fs)
        self.batches: list[ModelBatch] = []
        self.start = 0
        self.empty_end = 0  # the end when there are no batches (after reset or deleting them all)
        self.flushed = 0
        self.epochs: list[tuple[int, int]] = []
        self.tag = 0

    # -- the model's view --------------------------------------------------------------------
    @property
    def end(self) -> int:
        return self.batches[-1].next if self.batches else self.empty_end

    def latest_epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else -1

    def expected_read(self, offset: int, max_bytes: int, max_offset: int | None) -> bytes:
        if offset == self.end or (max_offset is not None and offset >= max_offset):
            return b""
        first = bisect_right([batch.next for batch in self.batches], offset)
        taken: list[bytes] = []
        total = 0
        for batch in self.batches[first:]:
            if max_offset is not None and batch.next - 1 >= max_offset:
                break
            if taken and total + len(batch.data) > max_bytes:
                break
            taken.append(batch.data)
            total += len(batch.data)
        return b"".join(taken)

    def new_batch(self, records: int, timestamp_ms: int) -> bytearray:
        self.tag += 1
        return make_batch(records, value_bytes=self.tag % 40, timestamp_ms=timestamp_ms, tag=self.tag)

    def _add(self, base: int, count: int, data: bytes, max_timestamp_ms: int, epoch: int) -> None:
        if epoch > self.latest_epoch():
            self.epochs.append((epoch, base))
        self.batches.append(ModelBatch(base, count, data, max_timestamp_ms))

    def _drop_from(self, new_end: int) -> None:
        self.batches = [batch for batch in self.batches if batch.next <= new_end]
        self.epochs = [entry for entry in self.epochs if entry[1] < new_end]
        self.flushed = min(self.flushed, new_end)
        self.empty_end = new_end

    # -- rules ----------------------------------------------------------------------------------
    @rule(records=st.integers(1, 4), timestamp_ms=st.integers(0, 10_000), epoch_step=st.integers(0, 1))
    def append_producer(self, records, timestamp_ms, epoch_step):
        epoch = max(0, self.latest_epoch() + epoch_step)
        batch = self.new_batch(records, timestamp_ms)
        result = self.log.append_producer_batch(batch, epoch, now_ms=0)
        assert result.base_offset == self.end
        self._add(self.end, records, stamp(batch, self.end, epoch), timestamp_ms + records - 1, epoch)

    @rule(counts=st.lists(st.integers(1, 3), min_size=1, max_size=5), timestamp_ms=st.integers(0, 10_000),
          epoch_step=st.integers(0, 2))
    def append_replicated(self, counts, timestamp_ms, epoch_step):
        epoch = max(0, self.latest_epoch() + epoch_step)
        payload = bytearray()
        offset = self.end
        pieces = []
        for count in counts:
            data = stamp(self.new_batch(count, timestamp_ms), offset, epoch)
            pieces.append((offset, count, data))
            payload += data
            offset += count
        self.log.append_replicated_batches(bytes(payload), now_ms=0)
        for base, count, data in pieces:
            self._add(base, count, data, timestamp_ms + count - 1, epoch)

    @rule(data=st.data(), max_bytes=st.integers(0, 2000), bounded=st.booleans())
    def read(self, data, max_bytes, bounded):
        offset = data.draw(st.integers(self.start, self.end))
        max_offset = data.draw(st.integers(self.start, self.end + 2)) if bounded else None
        assert self.log.read(offset, max_bytes, max_offset=max_offset) == self.expected_read(offset, max_bytes,
                                                                                               max_offset)

    @rule(data=st.data())
    def truncate(self, data):
        offset = data.draw(st.integers(self.start, self.end))
        self.log.truncate_to(offset)
        containing = [batch for batch in self.batches if batch.base < offset < batch.next]
        new_end = containing[0].base if containing else min(offset, self.end)
        if new_end < self.start:  # the batch holding the log start went: the log restarts empty there
            self.batches, self.epochs, self.empty_end = [], [], self.start
            self.flushed = self.start
        elif new_end < self.end:
            self._drop_from(new_end)
            self.flushed = new_end  # a truncation leaves the kept prefix durable

    @rule()
    def retention(self):
        segments_before = self.log.segment_base_offsets
        deleted = self.log.apply_retention(now_ms=0)
        assert self.log.segment_base_offsets == segments_before[deleted:]
        assert self.log.size_bytes <= RETENTION_BYTES or len(self.log.segment_base_offsets) == 1
        self.start = max(self.start, self.log.segment_base_offsets[0])
        if deleted:
            self.epochs = _epochs_from_start(self.epochs, self.start)

    @rule(data=st.data())
    def delete_records(self, data):
        offset = data.draw(st.integers(self.start, self.end))
        self.log.delete_records_before(offset)
        if offset > self.start:
            self.start = offset
            self.epochs = _epochs_from_start(self.epochs, self.start)

    @rule(offset=st.integers(0, 5))
    def reset(self, offset):
        target = self.end + offset
        self.log.reset_to(target)
        self.batches, self.epochs, self.start, self.empty_end, self.flushed = [], [], target, target, target

    @rule()
    def flush(self):
        self.log.flush()
        self.flushed = self.end

    @rule()
    def reopen(self):
        self.log.close()
        self.flushed = self.end
        self.log = open_memory_log(self.config, fs=self.fs)
        assert self.log.recovery.truncated_bytes == 0 and self.log.recovery.corrupt_ranges == []

    @rule()
    def crash(self):
        first_segment = self.log.segment_base_offsets[0]
        self.epochs_before_crash = list(self.epochs)
        self.fs.crash()
        self.log = open_memory_log(self.config, fs=self.fs)
        assert self.log.recovery.corrupt_ranges == []
        new_end = max(self.flushed, first_segment)
        if new_end < self.end:
            self._drop_from(new_end)
            self.epochs = [entry for entry in self.epochs_before_crash if entry[1] <= new_end]
        self.start = max(first_segment, min(self.start, new_end))
        self.epochs = _epochs_from_start(self.epochs, self.start)

    @rule(timestamp_ms=st.integers(0, 10_100))
    def offset_for_timestamp(self, timestamp_ms):
        expected = None
        for batch in self.batches:
            if batch.next > self.start and batch.max_timestamp_ms >= timestamp_ms:
                expected = max(batch.base, self.start)
                break
        assert self.log.offset_for_timestamp(timestamp_ms) == expected

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def positions_match(self):
        assert (self.log.log_start_offset, self.log.log_end_offset) == (self.start, self.end)
        assert self.log.flushed_offset <= self.log.log_end_offset

    @invariant()
    def content_matches(self):
        assert self.log.read(self.start, 1 << 30) == self.expected_read(self.start, 1 << 30, None)

    @invariant()
    def epochs_match(self):
        assert self.log.epoch_entries() == self.epochs


def _epochs_from_start(entries: list[tuple[int, int]], start: int) -> list[tuple[int, int]]:
    kept = [entry for entry in entries if entry[1] >= start]
    below = [entry for entry in entries if entry[1] < start]
    if below and (not kept or kept[0][1] > start):
        kept.insert(0, (below[-1][0], start))
    return kept


LogMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])
test_partition_log_matches_the_model = LogMachine.TestCase
