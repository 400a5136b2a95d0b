"""Dead-letter topics: the record format, their depth, and reading them.

The format is shared by everything that dead-letters a record and everything that reads one:

- a dead letter keeps the source record's key and value byte for byte, and sits in the partition
  of the DLQ topic that has the source partition's number;
- its headers are the ten `railmq.dlq.*` headers below, in this order, with UTF-8 values (numbers
  in decimal), then the source record's own headers, in their order;
- the DLQ topic defaults to `<source topic>.dlq`; `railmq.retry` creates it on first use with the
  source's partition count and a replication factor of min(3, the source's).

`DeadLetter` formats (`record_headers`) and parses (`DeadLetter.parse`) that layout; parsing is
strict by default (`MalformedDeadLetter`), or lenient for tools that must show every record. The
share groups' coordinator is an actor and cannot import this module: actors/dead_letter_records.py
writes the same layout, and tests/unit/test_retry.py reads its output with `DeadLetter.parse`.

Depth is the number of records between a partition's log start and its high watermark, summed
over partitions. The log is append-only, so a redriven record still counts until retention
removes it; `pending` says how many the redrive group has not moved yet.

`inspect` reads without a group and commits nothing. `redrive`, which moves records back at a
bounded rate and never loses one, is railmq/redrive.py; its names stay importable from here.
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Iterable

import msgspec

from actors.errors import ErrorCode, RailmqError
from actors.messages import ListOffsetsResponse
from railmq.admin import Admin
from railmq.consumer import Consumer
from railmq.group_admin import GroupAdminClient
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
                fields[field] = decode_header(raw, kind, name)
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


def decode_header(raw: bytes | None, kind: type, name: str) -> str | int:
    """A dead-letter header's value as `kind` (str or int); ValueError names the header."""
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

# `redrive` and its helpers live in railmq/redrive.py, which imports the format from here. They
# stay importable from this module too, looked up on first use so that the import goes one way.
_REDRIVE_NAMES = frozenset({
    "POLL_WAIT_MS", "REDRIVE_BATCH_RECORDS_MAX", "REDRIVE_BURST_S", "RedriveOptions", "RedriveResult",
    "TokenBucket", "burst_for", "known_position", "redrive", "redrive_destination", "redriven_headers",
    "start_at_committed",
})


def __getattr__(name: str) -> Any:
    if name in _REDRIVE_NAMES:
        return getattr(importlib.import_module("railmq.redrive"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
