"""The producer's I/O-thread side: what the producer actor's engine does with the state
`Producer.send` fills in the caller's thread.

A mixin of `Producer` (railmq/producer.py), which owns the lock, the open and sealed batches, the
batches in flight and the topics' metadata. Here: handing sealed batches (and open ones whose
`linger_ms` has passed) to the producer actor (actors/producer_client.py), completing each batch's
futures when its outcome comes back, failing what was never handed over when the I/O thread
stops, and taking in metadata: each topic's partition count and its batch limit.
"""

from __future__ import annotations

from typing import Any

from actors.errors import ErrorCode, RailmqError
from actors.messages import SendBatch, TopicMetadata
from railmq.producer_futures import callback_lock
from storage.batch import HEADER_SIZE

# What a batch adds to its records' bytes: its header and the payload's array header.
BATCH_FRAMING_BYTES = HEADER_SIZE + 8


class EngineSide:
    def _pump(self, now_ns: int) -> int | None:
        """Hand sealed batches, and open ones that are due, to the producer actor."""
        actor = self._actor
        next_deadline = None
        with self._lock:
            for (topic, partition), batch in list(self._open.items()):
                if not batch.records:
                    continue  # opened by a sender that is waiting for buffer space: not ready
                due = batch.created_ns + self.linger_ns
                if self._flush_all or (due <= now_ns and actor.in_flight_count.get((topic, partition), 0)
                                       < actor.settings.max_in_flight):
                    self._seal(batch)
                elif due > now_ns and (next_deadline is None or due < next_deadline):
                    next_deadline = due
            if not any(batch.records for batch in self._open.values()):
                self._flush_all = False
            sealed, self._sealed = self._sealed, []
        runtime = self._engine.runtime
        for batch in sealed:
            message = SendBatch(batch_id=batch.batch_id, topic=batch.topic, partition=batch.partition,
                                records=batch.records, first_timestamp_ms=batch.first_timestamp_ms,
                                max_timestamp_ms=batch.max_timestamp_ms, deadline_ns=now_ns + self.delivery_timeout_ns)
            runtime.apply(actor.handle(message, b"", now_ns))
        return next_deadline

    def _fail_unsent(self) -> None:
        """The I/O thread stopped: fail the batches it was never handed (a close that did not wait
        for them), as the actor failed those it had, so no future waits for ever."""
        with self._lock:
            left = list(self._open.values()) + self._sealed
            self._open.clear()
            self._sealed = []
            for batch in left:
                self._in_flight[batch.batch_id] = batch
        for batch in left:
            error = RailmqError(ErrorCode.REQUEST_TIMED_OUT, "the producer closed before delivery")
            self._batch_done(batch.batch_id, batch.partition, -1, error)

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
        with callback_lock:
            batch.event.set()
            callbacks = batch.callbacks or []
        for callback, future in callbacks:
            try:
                callback(future)
            # A user's callback must not end the I/O thread, not even by sys.exit() (a BaseException):
            # every later send would then wait for ever.
            except BaseException:  # noqa: BLE001
                pass

    def _forget_sticky_choice_past(self, topic: str, count: int) -> None:
        """A topic made again under its name with fewer partitions: `send` takes the sticky choice
        as it is, so one the topic no longer has goes, and the next keyless record chooses again
        (kept, its records waited for a leader partition `count` or past never gets, and failed
        REQUEST_TIMED_OUT)."""
        with self._lock:
            if self._sticky_choice.get(topic, -1) >= count:
                del self._sticky_choice[topic]

    def _metadata(self, topics: list[TopicMetadata]) -> None:
        with self._metadata_arrived:
            for topic in topics:
                if topic.error == ErrorCode.NONE and topic.partitions:  # a count of 0 partitions nothing
                    self._partition_counts[topic.name] = len(topic.partitions)
                    self._forget_sticky_choice_past(topic.name, len(topic.partitions))
                    limit = topic.config.batch_bytes_max - BATCH_FRAMING_BYTES
                    if limit < self.batch_bytes_max:
                        self._batch_limits[topic.name] = max(1, limit)
                    else:
                        self._batch_limits.pop(topic.name, None)
                elif topic.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    self._topic_errors[topic.name] = RailmqError(topic.error, topic.error_message)
            self._metadata_arrived.notify_all()
