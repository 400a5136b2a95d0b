"""`Producer`: send records to a railmq cluster; each send returns a future of (partition, offset).

What happens to a record (Kafka's producer design):

1. `send` picks the partition — the key's murmur2 hash modulo the partition count, exactly as
   Kafka does, so one key always lands on one partition and keeps its order; keyless records
   stick to one partition per batch (KIP-480) — and appends the record to that partition's open
   batch, in the caller's thread. No socket is touched. A batch holds each record's time as a
   distance of 0..~24.8 days from its first record's: a record earlier than that, or later,
   seals the open batch and starts the next (records keep any timestamps in any order, as Kafka's).
   A batch is filled only up to its topic's `batch_bytes_max` too, when the topic's metadata says
   a limit below the producer's own (a batch past it is refused whole, MESSAGE_TOO_LARGE).
2. A batch is sealed when it reaches `batch_bytes_max`, when `linger_ms` has passed and the
   partition has room in flight, or on `flush()`. Sealed batches go to the producer actor
   (actors/producer_client.py), running in a background I/O thread, which encodes, sends,
   retries and reports back.
3. Memory is bounded: records waiting or in flight may hold at most `buffer_bytes_max`. A send
   that would exceed it blocks up to `max_block_ms`, then raises `BufferFull` — backpressure,
   never an unbounded queue.

Delivery: acks=0 (fire and forget), 1 (the leader wrote it) or "all"/-1 (every in-sync replica
has it). Retries can duplicate a record unless `idempotent=True` (docs/delivery.md).
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from itertools import accumulate
import random
import threading
import time
from time import time_ns
from typing import Any

from actors.errors import ErrorCode, RailmqError
from actors.messages import RefreshMetadata
from actors.producer_client import ProducerClient, ProducerSettings
from railmq.partitioner import KeyPartitioner, StickyPartitioner
from railmq.producer_engine_side import EngineSide
from railmq.producer_futures import Batch, BatchSendFuture, RecordMetadata, SendFuture
from railmq.producer_arguments import as_bytes, checked_headers, checked_partition, checked_timestamp, checked_topic
from storage.batch import TIMESTAMP_DELTA_MAX
from transport.client_engine import ClientEngine

__all__ = ["BatchSendFuture", "BufferFull", "Producer", "ProducerClosed", "RecordMetadata", "SendFuture"]

RECORD_OVERHEAD_BYTES = 24  # msgpack framing of one record, roughly; used for batch sizing only


def takes_time(batch: Batch, timestamp_ms: int) -> bool:
    """Can `batch` hold a record of `timestamp_ms` (0..TIMESTAMP_DELTA_MAX past its first one)?
    One with no records yet (opened by a sender still waiting for buffer space) starts there."""
    if 0 <= timestamp_ms - batch.first_timestamp_ms <= TIMESTAMP_DELTA_MAX:
        return True
    if batch.records:
        return False
    batch.first_timestamp_ms = batch.max_timestamp_ms = timestamp_ms
    return True


class BufferFull(RailmqError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.BUSY, message)


class ProducerClosed(RailmqError):
    def __init__(self) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, "the producer is closed")


class Producer(EngineSide):
    def __init__(self, bootstrap: str, *, acks: int | str = 1, linger_ms: int = 0,
                 batch_bytes_max: int = 1024 * 1024, buffer_bytes_max: int = 64 * 1024 * 1024,
                 max_block_ms: int = 60_000, request_timeout_ms: int = 30_000,
                 delivery_timeout_ms: int = 120_000, retry_backoff_ms: int = 100, max_in_flight: int = 5,
                 idempotent: bool = False, client_id: str = "producer", seed: int | None = None) -> None:
        if acks not in (0, 1, -1, "0", "1", "-1", "all"):
            raise ValueError(f"acks must be 0, 1, -1 or 'all', not {acks!r}")
        acks = -1 if acks == "all" else int(acks)
        if not 1 <= max_in_flight <= 5 and idempotent:
            raise ValueError("an idempotent producer keeps 1..5 requests in flight per partition")
        for name, value in {"batch_bytes_max": batch_bytes_max, "buffer_bytes_max": buffer_bytes_max,
                            "delivery_timeout_ms": delivery_timeout_ms, "max_in_flight": max_in_flight,
                            "request_timeout_ms": request_timeout_ms}.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        for name, value in {"linger_ms": linger_ms, "max_block_ms": max_block_ms,
                            "retry_backoff_ms": retry_backoff_ms}.items():
            if value < 0:
                raise ValueError(f"{name} must be 0 or more, got {value}")
        self.bootstrap = bootstrap
        self.linger_ns = linger_ms * 1_000_000
        self.batch_bytes_max = batch_bytes_max
        self.buffer_bytes_max = buffer_bytes_max
        self.max_block_s = max_block_ms / 1000
        self.delivery_timeout_ns = delivery_timeout_ms * 1_000_000
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._metadata_arrived = threading.Condition(threading.Lock())
        self._partition_counts: dict[str, int] = {}
        # Each topic's batch limit (its batch_bytes_max, from its metadata) as records' bytes, when
        # below the producer's own: a batch past it is refused whole (MESSAGE_TOO_LARGE).
        self._batch_limits: dict[str, int] = {}
        self._topic_errors: dict[str, RailmqError] = {}
        self._open: dict[tuple[str, int], Batch] = {}
        self._sealed: list[Batch] = []
        self._in_flight: dict[int, Batch] = {}
        self._buffered_bytes = 0
        self._batch_ids = itertools.count(1)
        self._flush_all = False
        self._closed = False
        self._keys = KeyPartitioner()
        self._sticky = StickyPartitioner(random.Random(seed))
        self._sticky_choice: dict[str, int] = {}
        settings = ProducerSettings(acks=acks, request_timeout_ms=request_timeout_ms,
                                    retry_backoff_ms=retry_backoff_ms, max_in_flight=max_in_flight,
                                    idempotent=idempotent)
        self._actor = ProducerClient(bootstrap=bootstrap, settings=settings, name=client_id)
        self._engine = ClientEngine(self._actor, name=client_id, on_notify=self._on_notify, pump=self._pump,
                                    has_work=lambda: bool(self._sealed) or self._flush_all,
                                    on_stopped=self._fail_unsent)
        self._engine.start()

    # ------------------------------------------------------------------ user thread

    def send(self, topic: str, value: Any = None, key: Any = None, headers: list[tuple[str, bytes]] | None = None,
             partition: int | None = None, timestamp_ms: int | None = None) -> SendFuture:
        # This is the per-record hot path: it is written for speed (no helper calls when the
        # key and value are already bytes, one lock, one tuple per record).
        if self._closed:
            raise ProducerClosed()
        if self._engine.failure is not None:  # nothing would ever complete this send's future
            self._check_engine()
        if topic.__class__ is not str:
            checked_topic(topic)
        timestamp = time_ns() // 1_000_000 if timestamp_ms is None else checked_timestamp(timestamp_ms)
        if value.__class__ is not bytes and value is not None:
            value = as_bytes(value)
        if key.__class__ is not bytes and key is not None:
            key = as_bytes(key)
        size = RECORD_OVERHEAD_BYTES + (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
        if headers:
            headers = checked_headers(headers)
            size += sum(len(name) + len(data) + 8 for name, data in headers)
        if size > self.batch_bytes_max:
            raise RailmqError(ErrorCode.MESSAGE_TOO_LARGE,
                              f"a record of {size} bytes does not fit batch_bytes_max={self.batch_bytes_max}")
        if partition is None:
            if key is not None:
                count = self._partition_counts.get(topic) or self._wait_for_topic(topic)
                partition = self._keys.partition(key, count)
            else:
                partition = self._sticky_choice.get(topic)
                if partition is None:
                    partition = self._choose_sticky(topic)
        else:
            count = self._partition_counts.get(topic) or self._wait_for_topic(topic)
            if partition.__class__ is not int or not 0 <= partition < count:
                checked_partition(partition, count, topic)
        wake = False
        with self._lock:
            if self._buffered_bytes + size > self.buffer_bytes_max:
                self._wait_for_space(size)
            self._buffered_bytes += size
            batch = self._open.get((topic, partition))
            if batch is not None:
                delta = timestamp - batch.first_timestamp_ms
                # Two comparisons per record; the rare record past either bound is looked at closely.
                if batch.size_bytes + size > batch.bytes_max or not 0 <= delta <= TIMESTAMP_DELTA_MAX:
                    if batch.size_bytes and batch.size_bytes + size > batch.bytes_max \
                            or not takes_time(batch, timestamp):
                        self._seal(batch)
                        batch = None
                        wake = True
                    else:
                        delta = timestamp - batch.first_timestamp_ms  # an empty batch starts at this record
            if batch is None:
                batch = Batch(next(self._batch_ids), topic, partition, timestamp, time_ns(),
                              self._batch_limits.get(topic, self.batch_bytes_max))
                self._open[(topic, partition)] = batch
                delta = 0
                wake = True
            records = batch.records
            records.append((delta, key, value, headers))
            batch.size_bytes += size
            if timestamp > batch.max_timestamp_ms:
                batch.max_timestamp_ms = timestamp
        if wake:
            self._engine.wake()
        return SendFuture(batch, len(records) - 1, timestamp)

    def send_batch(self, topic: str, values: list[Any], *, keys: list[Any] | None = None,
                   partition: int | None = None, timestamp_ms: int | None = None) -> BatchSendFuture:
        """Send many records in one call: the same semantics as calling `send` for each, in order,
        for a fraction of the per-record cost (no future per record). Records with keys go to
        their keys' partitions; keyless ones to `partition` or the sticky partition."""
        if self._closed:
            raise ProducerClosed()
        self._check_engine()
        checked_topic(topic)
        values = [v if v.__class__ is bytes or v is None else as_bytes(v) for v in values]
        timestamp = time_ns() // 1_000_000 if timestamp_ms is None else checked_timestamp(timestamp_ms)
        count = self._partition_counts.get(topic) or self._wait_for_topic(topic)
        if partition is not None:
            checked_partition(partition, count, topic)
        groups: dict[int, list[tuple]] = {}
        if keys is not None:
            if len(keys) != len(values):
                raise ValueError("keys and values must have the same length")
            choose = self._keys.partition
            for key, value in zip(keys, values):
                key = key if key.__class__ is bytes or key is None else as_bytes(key)
                target = partition if partition is not None else (
                    choose(key, count) if key is not None else self._sticky_choice.get(topic, None))
                if target is None:
                    target = self._choose_sticky(topic)
                groups.setdefault(target, []).append((key, value))
        else:
            target = partition if partition is not None else self._sticky_choice.get(topic)
            if target is None:
                target = self._choose_sticky(topic)
            groups[target] = [(None, value) for value in values]
        parts = []
        for target, pairs in groups.items():
            parts += self._append_many(topic, target, pairs, timestamp)
        self._engine.wake()
        return BatchSendFuture(parts)

    def _append_many(self, topic: str, partition: int, pairs: list[tuple], timestamp: int) -> list[tuple]:
        """Append (key, value) pairs to a partition, sealing batches as they fill, with the
        per-record work done by comprehensions. Returns (batch, first index, count) spans."""
        if not pairs:
            return []  # an empty send_batch: nothing to send, done at once
        sizes = [RECORD_OVERHEAD_BYTES + (len(v) if v is not None else 0) + (len(k) if k is not None else 0)
                 for k, v in pairs]
        largest = max(sizes)
        if largest > self.batch_bytes_max:
            raise RailmqError(ErrorCode.MESSAGE_TOO_LARGE, f"a record of {largest} bytes does not fit "
                                                           f"batch_bytes_max={self.batch_bytes_max}")
        limit = self._batch_limits.get(topic, self.batch_bytes_max)
        cumulative = list(accumulate(sizes))
        spans: list[tuple] = []
        index, total = 0, len(pairs)
        while index < total:
            with self._lock:
                batch = self._open.get((topic, partition))
                if batch is not None and not takes_time(batch, timestamp):
                    self._seal(batch)  # a batch cannot hold these records' time: the next round opens one
                    continue
                if batch is None:
                    batch = Batch(next(self._batch_ids), topic, partition, timestamp, time_ns(), limit)
                    self._open[(topic, partition)] = batch
                before = cumulative[index - 1] if index else 0
                end = bisect_right(cumulative, before + batch.bytes_max - batch.size_bytes, lo=index)
                if end == index and not batch.size_bytes:
                    end = index + 1  # one record past the topic's limit: alone, the leader refuses it alone
                if end == index:
                    self._seal(batch)  # full: the next round opens a new batch
                    continue
                taken = cumulative[end - 1] - before
                if self._buffered_bytes + taken > self.buffer_bytes_max:
                    self._wait_for_space(taken)
                    continue
                delta = timestamp - batch.first_timestamp_ms
                records = batch.records
                first = len(records)
                records.extend([(delta, key, value, None) for key, value in pairs[index:end]])
                self._buffered_bytes += taken
                batch.size_bytes += taken
                if timestamp > batch.max_timestamp_ms:
                    batch.max_timestamp_ms = timestamp
                spans.append((batch, first, end - index, timestamp))
                index = end
                if index < total:
                    self._seal(batch)
        return spans

    def _choose_sticky(self, topic: str) -> int:
        count = self._partition_counts.get(topic) or self._wait_for_topic(topic)
        if self._engine.failure is not None:
            raise RuntimeError("the producer's I/O thread failed") from self._engine.failure
        with self._lock:
            partition = self._sticky.partition(topic, count)
            self._sticky_choice[topic] = partition
        return partition

    def _wait_for_space(self, size: int) -> None:
        deadline = time.monotonic() + self.max_block_s
        while self._buffered_bytes + size > self.buffer_bytes_max:
            self._engine.wake(force=True)
            remaining = deadline - time.monotonic()
            self._check_engine()
            if remaining <= 0:
                raise BufferFull(
                    f"{self._buffered_bytes} bytes are waiting to be sent (buffer_bytes_max={self.buffer_bytes_max}) "
                    f"and none freed within max_block_ms={int(self.max_block_s * 1000)}")
            self._space.wait(min(remaining, 0.05))

    def _seal(self, batch: Batch) -> None:
        """Move an open batch to the sealed list (caller holds the lock)."""
        del self._open[(batch.topic, batch.partition)]
        self._sealed.append(batch)
        self._in_flight[batch.batch_id] = batch
        count = self._partition_counts.get(batch.topic)
        if count and self._sticky_choice.get(batch.topic) == batch.partition:
            self._sticky_choice[batch.topic] = self._sticky.on_batch_sent(batch.topic, batch.partition, count)

    def _wait_for_topic(self, topic: str) -> int:
        deadline = time.monotonic() + self.max_block_s
        with self._metadata_arrived:
            self._topic_errors.pop(topic, None)
            self._engine.submit(RefreshMetadata(topics=[topic]))
            while topic not in self._partition_counts:
                if topic in self._topic_errors:
                    raise self._topic_errors[topic]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RailmqError(ErrorCode.REQUEST_TIMED_OUT,
                                      f"no metadata for topic {topic!r} within max_block_ms")
                self._metadata_arrived.wait(min(remaining, 0.5))
                if topic not in self._partition_counts:
                    self._engine.submit(RefreshMetadata(topics=[topic]))
            return self._partition_counts[topic]

    def partitions_for(self, topic: str) -> int:
        return self._partition_counts.get(checked_topic(topic)) or self._wait_for_topic(topic)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until every send so far has an outcome.
        Refused inside a send callback (as Kafka's flush is): the callback runs in the I/O thread,
        which would then wait for itself for ever."""
        if self._engine.on_io_thread():
            raise RailmqError(ErrorCode.INVALID_REQUEST,
                              "flush inside a send callback would wait for ever for its own I/O thread")
        with self._lock:
            self._flush_all = True
            waiting = list(self._in_flight.values()) + list(self._open.values())
        self._engine.wake(force=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        for batch in waiting:
            while not batch.event.wait(0.1):
                self._check_engine()
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"flush did not finish within {timeout} s")

    def _check_engine(self) -> None:
        """A dead I/O thread completes nothing: say so instead of waiting for it."""
        if self._engine.failure is not None:
            raise RuntimeError("the producer's I/O thread failed") from self._engine.failure

    def close(self, timeout: float | None = 30.0) -> None:
        if self._closed:
            return
        if self._engine.on_io_thread():  # inside a send callback: Kafka's close(0), nothing waited for
            self._closed = True
            self._engine.stop()
            return
        try:
            self.flush(timeout)
        finally:
            self._closed = True
            self._engine.stop()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
