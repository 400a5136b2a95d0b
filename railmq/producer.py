"""`Producer`: send records to a railmq cluster; each send returns a future of (partition, offset).

What happens to a record (Kafka's producer design):

1. `send` picks the partition — the key's murmur2 hash modulo the partition count, exactly as
   Kafka does, so one key always lands on one partition and keeps its order; keyless records
   stick to one partition per batch (KIP-480) — and appends the record to that partition's open
   batch, in the caller's thread. No socket is touched.
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
import random
import threading
import time
from typing import Any, Callable, NamedTuple

from actors.errors import ErrorCode, RailmqError
from actors.messages import RefreshMetadata, SendBatch, TopicMetadata
from actors.producer_client import ProducerClient, ProducerSettings
from railmq.partitioner import KeyPartitioner, StickyPartitioner
from transport.client_engine import ClientEngine

RECORD_OVERHEAD_BYTES = 24  # msgpack framing of one record, roughly; used for batch sizing only


class BufferFull(RailmqError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.BUSY, message)


class ProducerClosed(RailmqError):
    def __init__(self) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, "the producer is closed")


class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    offset: int  # -1 with acks=0
    timestamp_ms: int


class _Batch:
    __slots__ = ("batch_id", "topic", "partition", "records", "size_bytes", "first_timestamp_ms",
                 "max_timestamp_ms", "created_ns", "event", "base_offset", "error", "callbacks")

    def __init__(self, batch_id: int, topic: str, partition: int, timestamp_ms: int, now_ns: int) -> None:
        self.batch_id = batch_id
        self.topic = topic
        self.partition = partition
        self.records: list = []
        self.size_bytes = 0
        self.first_timestamp_ms = timestamp_ms
        self.max_timestamp_ms = timestamp_ms
        self.created_ns = now_ns
        self.event = threading.Event()
        self.base_offset = -1
        self.error: BaseException | None = None
        self.callbacks: list | None = None


class SendFuture:
    """The outcome of one `send`: `result()` gives its RecordMetadata or raises its error."""

    __slots__ = ("_batch", "_index", "_timestamp_ms")

    def __init__(self, batch: _Batch, index: int, timestamp_ms: int) -> None:
        self._batch = batch
        self._index = index
        self._timestamp_ms = timestamp_ms

    def done(self) -> bool:
        return self._batch.event.is_set()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        batch = self._batch
        if not batch.event.wait(timeout):
            raise TimeoutError(f"no acknowledgement within {timeout} s (the send is still in progress)")
        if batch.error is not None:
            raise batch.error
        offset = -1 if batch.base_offset < 0 else batch.base_offset + self._index
        return RecordMetadata(batch.topic, batch.partition, offset, self._timestamp_ms)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._batch.event.wait(timeout):
            raise TimeoutError(f"no acknowledgement within {timeout} s")
        return self._batch.error

    def add_done_callback(self, callback: Callable[["SendFuture"], None]) -> None:
        """Call `callback(future)` when done (in the producer's I/O thread, or now if done)."""
        batch = self._batch
        with _callback_lock:
            if not batch.event.is_set():
                if batch.callbacks is None:
                    batch.callbacks = []
                batch.callbacks.append((callback, self))
                return
        callback(self)


_callback_lock = threading.Lock()


def _as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"keys and values must be bytes, str or None, not {type(value).__name__}")


class Producer:
    def __init__(self, bootstrap: str, *, acks: int | str = 1, linger_ms: int = 0,
                 batch_bytes_max: int = 1024 * 1024, buffer_bytes_max: int = 64 * 1024 * 1024,
                 max_block_ms: int = 60_000, request_timeout_ms: int = 30_000,
                 delivery_timeout_ms: int = 120_000, retry_backoff_ms: int = 100, max_in_flight: int = 5,
                 idempotent: bool = False, client_id: str = "producer", seed: int | None = None) -> None:
        acks = -1 if acks == "all" else int(acks)
        if acks not in (0, 1, -1):
            raise ValueError(f"acks must be 0, 1, -1 or 'all', not {acks!r}")
        if not 1 <= max_in_flight <= 5 and idempotent:
            raise ValueError("an idempotent producer keeps 1..5 requests in flight per partition")
        for name, value in {"batch_bytes_max": batch_bytes_max, "buffer_bytes_max": buffer_bytes_max,
                            "delivery_timeout_ms": delivery_timeout_ms, "max_in_flight": max_in_flight}.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
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
        self._topic_errors: dict[str, RailmqError] = {}
        self._open: dict[tuple[str, int], _Batch] = {}
        self._sealed: list[_Batch] = []
        self._in_flight: dict[int, _Batch] = {}
        self._buffered_bytes = 0
        self._batch_ids = itertools.count(1)
        self._flush_all = False
        self._closed = False
        self._keys = KeyPartitioner()
        self._sticky = StickyPartitioner(random.Random(seed))
        settings = ProducerSettings(acks=acks, request_timeout_ms=request_timeout_ms,
                                    retry_backoff_ms=retry_backoff_ms, max_in_flight=max_in_flight,
                                    idempotent=idempotent)
        self._actor = ProducerClient(bootstrap=bootstrap, settings=settings, name=client_id)
        self._engine = ClientEngine(self._actor, name=client_id, on_notify=self._on_notify, pump=self._pump)
        self._engine.start()

    # ------------------------------------------------------------------ user thread

    def send(self, topic: str, value: Any = None, key: Any = None, headers: list[tuple[str, bytes]] | None = None,
             partition: int | None = None, timestamp_ms: int | None = None) -> SendFuture:
        if self._closed:
            raise ProducerClosed()
        if self._engine.failure is not None:
            raise RuntimeError("the producer's I/O thread failed") from self._engine.failure
        key_bytes, value_bytes = _as_bytes(key), _as_bytes(value)
        size = RECORD_OVERHEAD_BYTES + (len(value_bytes) if value_bytes else 0) + (len(key_bytes) if key_bytes else 0)
        if headers:
            headers = [(str(name), _as_bytes(data) or b"") for name, data in headers]
            size += sum(len(name) + len(data) + 8 for name, data in headers)
        if size > self.batch_bytes_max:
            raise RailmqError(ErrorCode.MESSAGE_TOO_LARGE,
                              f"a record of {size} bytes does not fit batch_bytes_max={self.batch_bytes_max}")
        count = self._partition_counts.get(topic) or self._wait_for_topic(topic)
        if partition is None:
            partition = (self._keys.partition(key_bytes, count) if key_bytes is not None
                         else self._sticky.partition(topic, count))
        elif not 0 <= partition < count:
            raise RailmqError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has partitions 0..{count - 1}, not {partition}")
        timestamp = int(timestamp_ms if timestamp_ms is not None else time.time_ns() // 1_000_000)
        wake = False
        with self._lock:
            if self._buffered_bytes + size > self.buffer_bytes_max:
                self._wait_for_space(size)
            self._buffered_bytes += size
            batch = self._open.get((topic, partition))
            if batch is not None and batch.size_bytes + size > self.batch_bytes_max:
                self._seal(batch)
                batch = None
                wake = True
            if batch is None:
                batch = _Batch(next(self._batch_ids), topic, partition, timestamp, time.time_ns())
                self._open[(topic, partition)] = batch
                wake = True
            index = len(batch.records)
            batch.records.append((timestamp - batch.first_timestamp_ms, key_bytes, value_bytes, headers))
            batch.size_bytes += size
            if timestamp > batch.max_timestamp_ms:
                batch.max_timestamp_ms = timestamp
        if wake:
            self._engine.wake()
        return SendFuture(batch, index, timestamp)

    def _wait_for_space(self, size: int) -> None:
        deadline = time.monotonic() + self.max_block_s
        while self._buffered_bytes + size > self.buffer_bytes_max:
            self._engine.wake(force=True)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._engine.failure is not None:
                raise BufferFull(
                    f"{self._buffered_bytes} bytes are waiting to be sent (buffer_bytes_max={self.buffer_bytes_max}) "
                    f"and none freed within max_block_ms={int(self.max_block_s * 1000)}")
            self._space.wait(min(remaining, 0.05))

    def _seal(self, batch: _Batch) -> None:
        """Move an open batch to the sealed list (caller holds the lock)."""
        del self._open[(batch.topic, batch.partition)]
        self._sealed.append(batch)
        self._in_flight[batch.batch_id] = batch
        count = self._partition_counts.get(batch.topic)
        if count:
            self._sticky.on_batch_sent(batch.topic, batch.partition, count)

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
        return self._partition_counts.get(topic) or self._wait_for_topic(topic)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until every send so far has an outcome."""
        with self._lock:
            self._flush_all = True
            waiting = list(self._in_flight.values()) + list(self._open.values())
        self._engine.wake(force=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        for batch in waiting:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not batch.event.wait(remaining):
                raise TimeoutError(f"flush did not finish within {timeout} s")

    def close(self, timeout: float | None = 30.0) -> None:
        if self._closed:
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

    # ------------------------------------------------------------------ engine thread

    def _pump(self, now_ns: int) -> int | None:
        """Hand sealed batches, and open ones that are due, to the producer actor."""
        actor = self._actor
        next_deadline = None
        with self._lock:
            for (topic, partition), batch in list(self._open.items()):
                due = batch.created_ns + self.linger_ns
                if self._flush_all or (due <= now_ns and actor.in_flight_count.get((topic, partition), 0)
                                       < actor.settings.max_in_flight):
                    self._seal(batch)
                elif due > now_ns and (next_deadline is None or due < next_deadline):
                    next_deadline = due
            if not self._open:
                self._flush_all = False
            sealed, self._sealed = self._sealed, []
        runtime = self._engine.runtime
        for batch in sealed:
            message = SendBatch(batch_id=batch.batch_id, topic=batch.topic, partition=batch.partition,
                                records=batch.records, first_timestamp_ms=batch.first_timestamp_ms,
                                max_timestamp_ms=batch.max_timestamp_ms, deadline_ns=now_ns + self.delivery_timeout_ns)
            runtime.apply(actor.handle(message, b"", now_ns))
        return next_deadline

    def _on_notify(self, kind: str, payload: Any) -> None:
        if kind == "batch-done":
            self._batch_done(*payload)
        elif kind == "metadata":
            self._metadata(payload)

    def _batch_done(self, batch_id: int, partition: int, base_offset: int, error: BaseException | None) -> None:
        with self._lock:
            batch = self._in_flight.pop(batch_id, None)
            if batch is None:
                return
            self._buffered_bytes -= batch.size_bytes
            self._space.notify_all()
        batch.base_offset = base_offset
        batch.error = error
        batch.records = []  # sent or failed: the values need not stay in memory
        with _callback_lock:
            batch.event.set()
            callbacks = batch.callbacks or []
        for callback, future in callbacks:
            try:
                callback(future)
            except Exception:  # a user's callback must not kill the I/O thread
                pass

    def _metadata(self, topics: list[TopicMetadata]) -> None:
        with self._metadata_arrived:
            for topic in topics:
                if topic.error == ErrorCode.NONE:
                    self._partition_counts[topic.name] = len(topic.partitions)
                elif topic.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    self._topic_errors[topic.name] = RailmqError(topic.error, topic.error_message)
            self._metadata_arrived.notify_all()
