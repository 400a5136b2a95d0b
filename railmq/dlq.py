"""Dead-letter topics: the record format, their depth, reading them, and moving records back.

The format is shared by everything that dead-letters a record and everything that reads one:

- a dead letter keeps the source record's key and value byte for byte, and sits in the partition
  of the DLQ topic that has the source partition's number;
- its headers are the ten `railmq.dlq.*` headers below, in this order, with UTF-8 values (numbers
  in decimal), then the source record's own headers, in their order;
- the DLQ topic defaults to `<source topic>.dlq`; `railmq.retry` creates it on first use with the
  source's partition count and a replication factor of min(3, the source's).

`DeadLetter` formats (`record_headers`) and parses (`DeadLetter.parse`) that layout; parsing is
strict by default (`MalformedDeadLetter`), or lenient for tools that must show every record. The
share groups' coordinator is an actor and cannot import this module: actors/share_partition.py
writes the same layout, and tests/unit/test_retry.py reads its output with `DeadLetter.parse`.

Depth is the number of records between a partition's log start and its high watermark, summed
over partitions. The log is append-only, so a redriven record still counts until retention
removes it; `pending` says how many the redrive group has not moved yet.

`inspect` reads without a group and commits nothing. `redrive` moves records back at a bounded
rate and never loses one (its promises are on the function). The module is longer than most
because the format and the two tools that read it change together.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import msgspec

from actors.errors import ErrorCode, RailmqError
from actors.messages import ListOffsetsResponse
from railmq.admin import Admin
from railmq.consumer import Consumer
from railmq.lag import GroupAdminClient
from railmq.producer import Producer
from railmq.records import ConsumerRecord, TopicPartition

DLQ_SUFFIX = ".dlq"
HEADER_PREFIX = "railmq.dlq."
HEADER_SOURCE_TOPIC = "railmq.dlq.source_topic"
HEADER_SOURCE_PARTITION = "railmq.dlq.source_partition"
HEADER_SOURCE_OFFSET = "railmq.dlq.source_offset"
HEADER_GROUP = "railmq.dlq.group"
HEADER_ATTEMPTS = "railmq.dlq.attempts"
HEADER_REASON = "railmq.dlq.reason"
HEADER_LAST_ERROR = "railmq.dlq.last_error"
HEADER_SOURCE_TIMESTAMP_MS = "railmq.dlq.source_timestamp_ms"
HEADER_FIRST_DELIVERY_MS = "railmq.dlq.first_delivery_ms"
HEADER_DEAD_LETTERED_MS = "railmq.dlq.dead_lettered_ms"
# A redriven record carries this instead of the railmq.dlq.* headers: "<dlq topic>/<partition>/<offset>".
HEADER_REDRIVEN_FROM = "railmq.redriven_from"

REASON_REJECTED = "rejected"  # the handler (or a share consumer) said the record can never succeed
REASON_MAX_ATTEMPTS = "max-attempts"  # a share group delivered it delivery_attempts_max times
REASON_RETRIES_EXHAUSTED = "retries-exhausted"  # a classic group's retry policy gave up
REASONS = (REASON_REJECTED, REASON_MAX_ATTEMPTS, REASON_RETRIES_EXHAUSTED)

# The last error is a repr() of an exception, whose message can embed a whole payload: this many
# characters are plenty to diagnose, and keep a dead letter close to its source record's size.
LAST_ERROR_CHARS_MAX = 1000
DEFAULT_REDRIVE_GROUP = "railmq-redrive"
EARLIEST, LATEST = -2, -1


class MalformedDeadLetter(RailmqError):
    """A record in a DLQ topic without the dead-letter headers (or with one that does not parse)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, message)


class DeadLetter(msgspec.Struct, kw_only=True):
    """One dead-lettered record: why and where from, the source record, and where it sits now."""

    source_topic: str
    source_partition: int
    source_offset: int
    group: str
    attempts: int
    reason: str
    last_error: str
    source_timestamp_ms: int
    first_delivery_ms: int
    dead_lettered_ms: int
    key: bytes | None = None
    value: bytes | None = None
    headers: list[tuple[str, bytes]] = []  # the source record's own headers
    # Where the dead letter sits in its DLQ topic (known once it is read back).
    topic: str = ""
    partition: int = -1
    offset: int = -1
    malformed: str = ""  # only from a lenient parse: what was missing or garbled

    @classmethod
    def of_failure(cls, record: ConsumerRecord, *, group: str, reason: str, attempts: int, last_error: str,
                   first_delivery_ms: int, dead_lettered_ms: int) -> "DeadLetter":
        """The dead letter for a record a consumer gave up on."""
        if reason not in REASONS:
            raise ValueError(f"reason must be one of {', '.join(REASONS)}, not {reason!r}")
        return cls(source_topic=record.topic, source_partition=record.partition, source_offset=record.offset,
                   group=group, attempts=attempts, reason=reason,
                   last_error=last_error[:LAST_ERROR_CHARS_MAX], source_timestamp_ms=record.timestamp_ms,
                   first_delivery_ms=first_delivery_ms,
                   dead_lettered_ms=dead_lettered_ms, key=record.key, value=record.value,
                   headers=list(record.headers or []))

    def dead_letter_headers(self) -> list[tuple[str, bytes]]:
        """The ten railmq.dlq.* headers, in the shared order."""
        return [(name, str(getattr(self, field)).encode("utf-8")) for name, field, _ in _FIELDS]

    def record_headers(self) -> list[tuple[str, bytes]]:
        """Every header of the DLQ record: the dead-letter headers, then the source record's."""
        return self.dead_letter_headers() + list(self.headers)

    @classmethod
    def parse(cls, record: ConsumerRecord, *, strict: bool = True) -> "DeadLetter":
        """Read a record from a DLQ topic back into a DeadLetter."""
        found, original = split_headers(record.headers or [])
        fields: dict = {}
        problems: list[str] = []
        for name, field, kind in _FIELDS:
            raw = found.get(name)
            try:
                fields[field] = _decode(raw, kind, name)
            except ValueError as error:
                if strict:
                    where = f"{record.topic}/{record.partition}@{record.offset}"
                    raise MalformedDeadLetter(f"{where} is not a dead letter: {error}") from None
                problems.append(str(error))
                fields[field] = "" if kind is str else -1
        return cls(**fields, key=record.key, value=record.value, headers=original, topic=record.topic,
                   partition=record.partition, offset=record.offset, malformed="; ".join(problems))


_FIELDS = (
    (HEADER_SOURCE_TOPIC, "source_topic", str), (HEADER_SOURCE_PARTITION, "source_partition", int),
    (HEADER_SOURCE_OFFSET, "source_offset", int), (HEADER_GROUP, "group", str),
    (HEADER_ATTEMPTS, "attempts", int), (HEADER_REASON, "reason", str),
    (HEADER_LAST_ERROR, "last_error", str),
    (HEADER_SOURCE_TIMESTAMP_MS, "source_timestamp_ms", int),
    (HEADER_FIRST_DELIVERY_MS, "first_delivery_ms", int), (HEADER_DEAD_LETTERED_MS, "dead_lettered_ms", int),
)
_NAMES = frozenset(name for name, _, _ in _FIELDS)


def split_headers(headers: Iterable[tuple[str, bytes]]) -> tuple[dict[str, bytes], list[tuple[str, bytes]]]:
    """(the first value of each dead-letter header, every other header in order)."""
    found: dict[str, bytes] = {}
    others: list[tuple[str, bytes]] = []
    for name, value in headers:
        if name in _NAMES and name not in found:
            found[name] = value
        else:
            others.append((name, value))
    return found, others


def _decode(raw: bytes | None, kind: type, name: str) -> str | int:
    if raw is None:
        raise ValueError(f"header {name} is missing")
    try:
        text = raw.decode("utf-8")
        return int(text) if kind is int else text
    except (UnicodeDecodeError, ValueError):
        expected = "a decimal number" if kind is int else "UTF-8"
        raise ValueError(f"header {name} is not {expected}: {raw[:40]!r}") from None


# --------------------------------------------------------------------------- topics


def default_dlq_topic(source_topic: str) -> str:
    return f"{source_topic}{DLQ_SUFFIX}"


def is_dead_letter_topic(name: str) -> bool:
    return name.endswith(DLQ_SUFFIX) and len(name) > len(DLQ_SUFFIX)


# --------------------------------------------------------------------------- depth


class DeadLetterTopicInfo(msgspec.Struct, kw_only=True):
    topic: str
    source_topic: str
    partitions: int
    depth: int  # records between log start and high watermark, all partitions
    pending: int  # of those, records the redrive group has not moved back yet


def partition_bounds(admin: Admin, topic: str) -> list[ListOffsetsResponse]:
    """Each partition's log start offset and high watermark, from its leader."""
    count = len(admin.describe_topic(topic).partitions)
    return [admin.list_offsets(topic, partition, LATEST) for partition in range(count)]


def dlq_depth(admin: Admin, topic: str) -> int:
    return sum(max(0, bounds.high_watermark - bounds.log_start_offset)
               for bounds in partition_bounds(admin, topic))


def describe_dead_letter_topic(admin: Admin, topic: str, *,
                               redrive_group: str = DEFAULT_REDRIVE_GROUP) -> DeadLetterTopicInfo:
    bounds = partition_bounds(admin, topic)
    moved = redrive_positions(admin, redrive_group, topic)
    depth = pending = 0
    for partition, offsets in enumerate(bounds):
        start, end = offsets.log_start_offset, offsets.high_watermark
        depth += max(0, end - start)
        pending += max(0, end - max(start, moved.get(partition, start)))
    return DeadLetterTopicInfo(topic=topic, source_topic=topic.removesuffix(DLQ_SUFFIX),
                               partitions=len(bounds), depth=depth, pending=pending)


def list_dead_letter_topics(admin: Admin, *,
                            redrive_group: str = DEFAULT_REDRIVE_GROUP) -> list[DeadLetterTopicInfo]:
    """Every topic named `*.dlq`, with its depth."""
    names = sorted(name for name in admin.list_topics() if is_dead_letter_topic(name))
    return [describe_dead_letter_topic(admin, name, redrive_group=redrive_group) for name in names]


def redrive_positions(admin: Admin, group: str, topic: str) -> dict[int, int]:
    """Per partition of `topic`, the offset the redrive group has committed (moved everything before)."""
    with GroupAdminClient(admin.bootstrap, timeout_ms=admin.timeout_ms) as client:
        try:
            offsets = client.describe_group(group).offsets
        except RailmqError as error:
            if error.code != ErrorCode.GROUP_ID_NOT_FOUND:
                raise
            return {}
    return {entry.partition: entry.offset for entry in offsets if entry.topic == topic and entry.offset >= 0}


# --------------------------------------------------------------------------- reading


def inspect(bootstrap: str, dlq_topic: str, limit: int = 20, from_offset: int = 0, *,
            partition: int | None = None, timeout_ms: int = 10_000) -> list[DeadLetter]:
    """Up to `limit` dead letters from `from_offset` on, partition by partition, in offset order.

    Reads without a group and commits nothing. A record without the dead-letter headers is
    returned too, with `malformed` saying what is missing."""
    if limit <= 0 or from_offset < 0:
        raise ValueError("limit must be positive and from_offset zero or more")
    with Admin(bootstrap, timeout_ms=timeout_ms) as admin:
        bounds = partition_bounds(admin, dlq_topic)
    if partition is not None and not 0 <= partition < len(bounds):
        raise RailmqError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{dlq_topic} has no partition {partition}")
    wanted = range(len(bounds)) if partition is None else [partition]
    letters: list[DeadLetter] = []
    with Consumer(bootstrap, auto_offset_reset="earliest", request_timeout_ms=timeout_ms,
                  client_id="railmq-dlq-inspect") as consumer:
        for number in wanted:
            start = max(from_offset, bounds[number].log_start_offset)
            records = read_range(consumer, TopicPartition(dlq_topic, number), start,
                                 bounds[number].high_watermark, limit - len(letters), timeout_ms)
            letters += [DeadLetter.parse(record, strict=False) for record in records]
            if len(letters) >= limit:
                break
    return letters


def read_range(consumer: Consumer, tp: TopicPartition, start: int, end: int, count_max: int,
               timeout_ms: int) -> list[ConsumerRecord]:
    """Records of one partition in [start, end), at most `count_max`, with a consumer of no group."""
    if start >= end or count_max <= 0:
        return []
    consumer.assign([tp])
    consumer.seek(tp, start)
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_ms / 1000
    while len(records) < count_max and consumer.position(tp) < end:
        batch = [record for record in consumer.poll(100, max_records=count_max - len(records))
                 if record.offset < end]
        records += batch
        if batch:
            deadline = time.monotonic() + timeout_ms / 1000
        elif time.monotonic() > deadline:
            raise RailmqError(ErrorCode.REQUEST_TIMED_OUT,
                              f"{tp.topic}/{tp.partition} gave no record between {start} and {end} in time")
    return records


# --------------------------------------------------------------------------- redrive

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
        topic = str(_decode(found.get(HEADER_SOURCE_TOPIC), str, HEADER_SOURCE_TOPIC))
        partition = int(_decode(found.get(HEADER_SOURCE_PARTITION), int, HEADER_SOURCE_PARTITION))
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
                       if record.offset < self.ends[record.partition]]
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
        if all(position is not None and position >= self.ends[tp.partition]
               for tp, position in zip(assigned, positions)):
            return "caught-up"
        return None

    def _remaining(self) -> int:
        """Records of the starting snapshot not moved yet, in the partitions this redrive holds."""
        total = 0
        for tp in self.consumer.assignment():
            position = known_position(self.consumer, tp)
            total += self.ends[tp.partition] - min(self.ends[tp.partition], position or 0)
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
