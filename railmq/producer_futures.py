"""What a producer hands its callers: the futures of `send` and `send_batch`, and the batch they
wait on (railmq/producer.py fills it in the caller's thread; the I/O thread completes it).

A batch's `event` is set once it has an outcome — `base_offset` (-1 with acks=0) or `error` —
and every future over it answers from then on; callbacks run in the I/O thread when it completes
(or at once, for a batch already done), under `callback_lock`.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, NamedTuple


class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    offset: int  # -1 with acks=0
    timestamp_ms: int


class Batch:
    __slots__ = ("batch_id", "topic", "partition", "records", "size_bytes", "bytes_max", "first_timestamp_ms",
                 "max_timestamp_ms", "created_ns", "event", "base_offset", "error", "callbacks")

    def __init__(self, batch_id: int, topic: str, partition: int, timestamp_ms: int, now_ns: int,
                 bytes_max: int = 1 << 62) -> None:
        self.batch_id = batch_id
        self.topic = topic
        self.partition = partition
        self.records: list = []
        self.size_bytes = 0
        self.bytes_max = bytes_max  # the records' bytes it takes: the producer's limit, or its topic's
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

    def __init__(self, batch: Batch, index: int, timestamp_ms: int) -> None:
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
        with callback_lock:
            if not batch.event.is_set():
                if batch.callbacks is None:
                    batch.callbacks = []
                batch.callbacks.append((callback, self))
                return
        callback(self)


callback_lock = threading.Lock()


class BatchSendFuture:
    """The outcome of one `send_batch`: done when every record has an outcome. Its spans are
    (batch, index of the first record in it, how many, the records' timestamp)."""

    __slots__ = ("_spans",)

    def __init__(self, spans: list[tuple]) -> None:
        self._spans = spans

    def done(self) -> bool:
        return all(batch.event.is_set() for batch, *_ in self._spans)

    def result(self, timeout: float | None = None) -> list[RecordMetadata]:
        """RecordMetadata per record, in the order given; raises the first error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[RecordMetadata] = []
        for batch, first, count, timestamp_ms in self._spans:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not batch.event.wait(remaining):
                raise TimeoutError(f"no acknowledgement within {timeout} s (the send is still in progress)")
            if batch.error is not None:
                raise batch.error
            base = batch.base_offset
            out.extend(RecordMetadata(batch.topic, batch.partition, -1 if base < 0 else base + first + i,
                                      timestamp_ms) for i in range(count))
        return out
