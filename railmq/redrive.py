"""Redrive: moving dead letters back to their source topics (or another topic) at a bounded rate.

It owns the move and nothing about the dead-letter format (that is `railmq.dlq`, which still
exports every name here): where each record goes (`redrive_destination`: its source topic and
partition from the railmq.dlq.* headers, or a topic given by the caller), the headers it goes
with (`redriven_headers`), the rate (`TokenBucket`, pure: the caller passes the time and does
the waiting) and the poll -> wait for tokens -> send -> wait for acks -> commit loop.

Invariants: a DLQ offset is committed only after every record before it was acknowledged
(acks=all) at its destination, so a redrive that dies loses nothing and resumes from the group's
commits, repeating at most its last batch; it stops at the high watermark seen when it started;
one redrive per DLQ topic runs at a time (a static member, KIP-345); batches and bursts are
bounded by REDRIVE_BATCH_RECORDS_MAX.
"""

from __future__ import annotations

import time
from typing import Callable

import msgspec

from actors.errors import ErrorCode, RailmqError
from railmq.admin import Admin
from railmq.consumer import Consumer
from railmq.dlq import (
    DEFAULT_REDRIVE_GROUP, HEADER_PREFIX, HEADER_REDRIVEN_FROM, HEADER_SOURCE_PARTITION, HEADER_SOURCE_TOPIC,
    MalformedDeadLetter, decode_header, partition_bounds, split_headers,
)
from railmq.producer import Producer
from railmq.records import ConsumerRecord, TopicPartition

# A redrive commits after each batch: one poll, the sends, one acknowledgement wait. A redrive
# that dies repeats at most one batch, so batches stay small.
REDRIVE_BATCH_RECORDS_MAX = 500
# The token bucket holds this much of the rate: output comes in small, evenly spaced bursts.
REDRIVE_BURST_S = 0.1
POLL_WAIT_MS = 200


class TokenBucket:
    """At most `rate_per_s` units per second on average, in bursts of at most `burst` units.

    Pure: the caller passes the time and does the waiting. `take(count, now_s)` takes the units
    at once and returns how long to wait before using them; the bucket may go into debt, which
    the refill pays back first, so over any span T at most burst + rate × T units pass."""

    def __init__(self, rate_per_s: float, burst: int, now_s: float) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs a positive rate and burst, got {rate_per_s} and {burst}")
        self.rate_per_s = float(rate_per_s)
        self.burst = burst
        self.tokens = float(burst)
        self.updated_s = now_s

    def take(self, count: int, now_s: float) -> float:
        if not 0 < count <= self.burst:
            raise ValueError(f"take 1..{self.burst} units at a time, not {count}")
        elapsed_s = max(0.0, now_s - self.updated_s)
        self.tokens = min(float(self.burst), self.tokens + elapsed_s * self.rate_per_s)
        self.updated_s = max(now_s, self.updated_s)
        self.tokens -= count
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate_per_s


def burst_for(rate_per_s: float) -> int:
    return max(1, min(REDRIVE_BATCH_RECORDS_MAX, int(rate_per_s * REDRIVE_BURST_S)))


class RedriveResult(msgspec.Struct, kw_only=True):
    dlq_topic: str
    moved: int
    by_destination: dict[str, int]
    remaining: int  # records that were in the DLQ when the redrive started and were not moved
    stopped: str  # "caught-up" | "max-messages"
    elapsed_s: float


def redriven_headers(record: ConsumerRecord) -> list[tuple[str, bytes]]:
    """The source record's headers again: railmq.dlq.* removed, a fresh railmq.redriven_from added."""
    kept = [(name, value) for name, value in record.headers or []
            if not name.startswith(HEADER_PREFIX) and name != HEADER_REDRIVEN_FROM]
    return kept + [(HEADER_REDRIVEN_FROM, f"{record.topic}/{record.partition}/{record.offset}".encode())]


def redrive_destination(record: ConsumerRecord, to_topic: str | None) -> tuple[str, int | None]:
    """(topic, partition): `to_topic` with the partition left to the key, or else the source
    topic and partition named in the record's headers."""
    if to_topic is not None:
        return to_topic, None
    found, _ = split_headers(record.headers or [])
    where = f"{record.topic}/{record.partition}@{record.offset}"
    try:
        topic = str(decode_header(found.get(HEADER_SOURCE_TOPIC), str, HEADER_SOURCE_TOPIC))
        partition = int(decode_header(found.get(HEADER_SOURCE_PARTITION), int, HEADER_SOURCE_PARTITION))
    except ValueError as error:
        raise MalformedDeadLetter(
            f"{where} names no source to go back to ({error}); give a destination topic") from None
    if topic == record.topic:
        raise MalformedDeadLetter(f"{where} names its own DLQ topic as its source")
    return topic, partition


class RedriveOptions(msgspec.Struct, frozen=True, kw_only=True):
    dlq_topic: str
    to_topic: str | None = None
    rate_per_s: float = 100.0
    max_messages: int | None = None
    group: str = DEFAULT_REDRIVE_GROUP
    idle_timeout_ms: int = 10_000  # no record for this long while some remain: give up
    request_timeout_ms: int = 10_000


def redrive(bootstrap: str, dlq_topic: str, *, to_topic: str | None = None, rate_per_s: float = 100.0,
            max_messages: int | None = None, group: str = DEFAULT_REDRIVE_GROUP,
            idle_timeout_ms: int = 10_000, request_timeout_ms: int = 10_000,
            on_progress: Callable[[int, int], None] | None = None,
            clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep) -> RedriveResult:
    """Move dead letters back to their source topics (or to `to_topic`), at most `rate_per_s`.

    Like SQS's message move task: the records are copied with their key, value and original
    headers (the railmq.dlq.* headers become one `railmq.redriven_from`), into the source
    partition when moving back to the source. The `group` commits a DLQ offset only after every
    record before it was acknowledged (acks=all) at its destination, so a redrive that dies loses
    nothing and resumes where it was; it may move the last unacknowledged batch twice. It stops at
    the high watermark seen when it started (a record that fails again and returns to the DLQ
    waits for the next redrive), or after `max_messages`. One redrive per DLQ topic runs at a time.
    `on_progress(moved, remaining)` is called after each batch."""
    options = RedriveOptions(dlq_topic=dlq_topic, to_topic=to_topic, rate_per_s=rate_per_s,
                             max_messages=max_messages, group=group, idle_timeout_ms=idle_timeout_ms,
                             request_timeout_ms=request_timeout_ms)
    with Admin(bootstrap, timeout_ms=request_timeout_ms) as admin:
        ends = _check_redrive(admin, options)
    # One static member per DLQ topic (KIP-345): a redrive restarted after a crash takes over its
    # partitions at once instead of waiting out the dead one's session, and a second redrive of
    # the same topic running at the same time fences the first one out (FENCED_INSTANCE_ID).
    consumer = Consumer(bootstrap, group_id=group, group_instance_id=f"redrive:{dlq_topic}",
                        auto_offset_reset="earliest", enable_auto_commit=False,
                        max_poll_records=burst_for(rate_per_s), request_timeout_ms=request_timeout_ms,
                        client_id="railmq-redrive")
    try:
        # A client id of its own: two clients of one process with the same id share socket
        # routing ids, and the coordinator's replies reach only one of them.
        with Producer(bootstrap, acks="all", idempotent=True, max_block_ms=request_timeout_ms,
                      client_id="railmq-redrive-producer") as producer:
            consumer.subscribe([dlq_topic],
                               on_assign=lambda partitions: start_at_committed(consumer, partitions))
            return _Redrive(options, consumer, producer, ends, clock, sleep, on_progress).run()
    finally:
        consumer.close()


def _check_redrive(admin: Admin, options: RedriveOptions) -> dict[int, int]:
    """Validate the request; the high watermark of each DLQ partition (where the redrive stops)."""
    if options.rate_per_s <= 0:
        raise ValueError(f"the rate must be positive, not {options.rate_per_s}")
    if options.max_messages is not None and options.max_messages <= 0:
        raise ValueError(f"max_messages must be positive, not {options.max_messages}")
    if options.to_topic == options.dlq_topic:
        raise ValueError("a redrive moves records out of the DLQ topic, not back into it")
    if options.to_topic is not None:
        admin.describe_topic(options.to_topic)  # UNKNOWN_TOPIC_OR_PARTITION before anything moves
    bounds = partition_bounds(admin, options.dlq_topic)
    return {partition: offsets.high_watermark for partition, offsets in enumerate(bounds)}


def known_position(consumer: Consumer, tp: TopicPartition) -> int | None:
    """The consumer's position for an assigned partition, or None while it is not known yet
    (a partition just assigned gets its position from the group's commit or a reset; a caller
    that waited for it here would hold up the poll that delivers it)."""
    try:
        return consumer.position(tp, timeout=0)
    except RailmqError as error:
        if error.code != ErrorCode.REQUEST_TIMED_OUT:
            raise
        return None


def start_at_committed(consumer: Consumer, partitions: list[TopicPartition]) -> None:
    """Make the group's committed offsets the fetch positions explicitly (as railmq.member_process
    does); partitions without a commit start from auto_offset_reset."""
    if partitions:
        for tp, offset in consumer.committed(partitions).items():
            if offset is not None:
                consumer.seek(tp, offset)


class _Redrive:
    """The poll → wait for tokens → send → wait for acks → commit loop."""

    def __init__(self, options: RedriveOptions, consumer: Consumer, producer: Producer, ends: dict[int, int],
                 clock: Callable[[], float], sleep: Callable[[float], None],
                 on_progress: Callable[[int, int], None] | None) -> None:
        self.options = options
        self.consumer = consumer
        self.producer = producer
        self.ends = ends
        self.clock = clock
        self.sleep = sleep
        self.on_progress = on_progress
        self.moved = 0
        self.by_destination: dict[str, int] = {}
        self.burst = burst_for(options.rate_per_s)

    def run(self) -> RedriveResult:
        started_s = idle_since_s = self.clock()
        bucket = TokenBucket(self.options.rate_per_s, self.burst, started_s)
        while (stopped := self._stop_reason()) is None:
            quota = self.burst if self.options.max_messages is None else min(
                self.burst, self.options.max_messages - self.moved)
            records = [record for record in self.consumer.poll(POLL_WAIT_MS, max_records=quota)
                       if record.offset < self._end(record.partition)]
            if not records:
                if (self.clock() - idle_since_s) * 1000 > self.options.idle_timeout_ms:
                    raise RailmqError(ErrorCode.REQUEST_TIMED_OUT,
                                      f"no record of {self.options.dlq_topic} arrived for "
                                      f"{self.options.idle_timeout_ms} ms; {self._remaining()} still to move")
                continue
            self.sleep(bucket.take(len(records), self.clock()))
            self._move(records)
            idle_since_s = self.clock()
            if self.on_progress is not None:
                self.on_progress(self.moved, self._remaining())
        return RedriveResult(dlq_topic=self.options.dlq_topic, moved=self.moved,
                             by_destination=self.by_destination, remaining=self._remaining(), stopped=stopped,
                             elapsed_s=self.clock() - started_s)

    def _stop_reason(self) -> str | None:
        if self.options.max_messages is not None and self.moved >= self.options.max_messages:
            return "max-messages"
        assigned = self.consumer.assignment()
        if len(assigned) < len(self.ends):
            return None  # still joining the group
        positions = [known_position(self.consumer, tp) for tp in assigned]
        if all(position is not None and position >= self._end(tp.partition)
               for tp, position in zip(assigned, positions)):
            return "caught-up"
        return None

    def _end(self, partition: int) -> int:
        """Where the redrive stops in `partition`. A partition the DLQ topic gained during the
        redrive (a DeadLetterWriter grows it with its source) held nothing when it started: its
        records wait for the next redrive. (Indexing `ends` by it was a KeyError traceback.)"""
        return self.ends.get(partition, 0)

    def _remaining(self) -> int:
        """Records of the starting snapshot not moved yet, in the partitions this redrive holds."""
        total = 0
        for tp in self.consumer.assignment():
            position = known_position(self.consumer, tp)
            total += self._end(tp.partition) - min(self._end(tp.partition), position or 0)
        return total

    def _move(self, records: list[ConsumerRecord]) -> None:
        """Send, wait for every acknowledgement, then commit. A record that cannot be routed stops
        the redrive after the ones before it have moved."""
        routed: list[tuple[ConsumerRecord, str, int | None]] = []
        refusal: MalformedDeadLetter | None = None
        for record in records:
            try:
                routed.append((record, *self._route(record)))
            except MalformedDeadLetter as error:
                refusal = error
                break
        timeout_s = self.options.request_timeout_ms / 1000
        futures = [self.producer.send(topic, record.value, key=record.key, headers=redriven_headers(record),
                                      partition=partition) for record, topic, partition in routed]
        self.producer.flush(timeout_s)
        for future in futures:
            future.result(timeout_s)
        if routed:
            self.consumer.commit({TopicPartition(record.topic, record.partition): record.offset + 1
                                  for record, _, _ in routed})
        for _, topic, _ in routed:
            self.by_destination[topic] = self.by_destination.get(topic, 0) + 1
        self.moved += len(routed)
        if refusal is not None:
            raise refusal

    def _route(self, record: ConsumerRecord) -> tuple[str, int | None]:
        topic, partition = redrive_destination(record, self.options.to_topic)
        if partition is not None and partition >= self.producer.partitions_for(topic):
            partition = None  # the source has fewer partitions now: the key decides
        return topic, partition
