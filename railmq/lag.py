"""Consumer groups seen from outside: lag per partition, hot partitions, offset-reset plans.

Two layers, so tests and tools can reuse the arithmetic without a cluster:

- pure functions (`lag_messages`, `lag_seconds`, `hot_flags`, `build_group_lag`, `plan_reset`)
  turn facts into plain msgspec Structs (`GroupLag`, `PartitionLag`, `OffsetResetPlan`);
- `GroupAdminClient` gathers the facts: the group coordinator's DescribeGroup (members,
  assignments, committed offsets — it works for a group with no live member), ListOffsets from
  each partition's leader (the log end offset a consumer can reach is the high watermark), and
  one small fetch at the committed offset for the timestamp of the oldest unconsumed record.

Definitions (Kafka's kafka-consumer-groups, plus time):
- lag in messages = high watermark − committed offset. A partition with no commit is measured
  from where a member that joined now would start (`start_from` says which: `latest`, Kafka's
  default, starts at the high watermark, so its lag is 0 and the records already there would be
  skipped; `earliest` starts at the log start); `start_offset` is that position;
- lag in seconds = now − timestamp of the record at the committed offset (0 when there is no lag);
- a partition is hot when its lag exceeds `lag_ratio` × the median lag of the other partitions of
  its topic and `lag_messages_min`, or (with a rate sample) when its arrival rate exceeds
  `rate_ratio` × the median rate of the others and `rate_per_s_min`.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import msgspec

from actors.controller_endpoints import named_endpoint
from actors.errors import ErrorCode, RailmqError
from actors.messages import (
    DeleteGroupRequest, DescribeGroupRequest, DescribeGroupResponse, ErrorResponse, FetchRequest,
    GroupSummary, ListGroupsRequest, ListOffsetsRequest, OffsetCommitRequest, OffsetEntry, TopicMetadata,
)
from railmq.admin import Admin, answer_to, listed_offsets
from railmq.records import decode_fetched
from transport.rpc import RequestTimeout

EARLIEST, LATEST = -2, -1  # ListOffsets' special timestamps
# `timestamp_at` follows a log start this many times in a row: retention may move it again
# between two fetches, but not at every fetch; a leader that says so answers for no log.
LOG_START_FOLLOWS_MAX = 3
RETRY_PAUSE_S = 0.05
TopicPartitionKey = tuple[str, int]


class HotRule(msgspec.Struct, frozen=True, kw_only=True):
    lag_ratio: float = 3.0
    lag_messages_min: int = 100  # a few dozen messages behind is noise, not a hot partition
    rate_ratio: float = 3.0
    rate_per_s_min: float = 10.0


class PartitionLag(msgspec.Struct, kw_only=True):
    topic: str
    partition: int
    member_id: str | None = None  # None: no live member owns it
    client_id: str | None = None
    committed_offset: int | None = None
    log_start_offset: int | None = None  # known for partitions without a commit
    log_end_offset: int | None = None
    start_from: str = "committed"  # "committed" | "earliest" | "latest": what the lag is measured from
    start_offset: int | None = None  # the committed offset, or where a new member would start
    lag_messages: int | None = None
    lag_seconds: float | None = None
    arrival_rate_per_s: float | None = None  # only with a rate sample
    hot: bool = False
    hot_reasons: list[str] = []


class MemberLag(msgspec.Struct, kw_only=True):
    member_id: str
    client_id: str = ""
    group_instance_id: str | None = None
    partitions: list[tuple[str, int]] = []
    idle: bool = False  # a member with no partition
    lag_messages: int = 0


class GroupLag(msgspec.Struct, kw_only=True):
    group_id: str
    kind: str = "classic"
    state: str = "Empty"
    generation: int = -1
    protocol: str = ""
    members: list[MemberLag] = []
    partitions: list[PartitionLag] = []
    total_lag_messages: int = 0
    measured_at_ms: int = 0
    sample_ms: int = 0
    reset: str = "latest"  # the auto_offset_reset assumed for partitions without a commit


class ResetTarget(msgspec.Struct, frozen=True):
    kind: str  # "earliest" | "latest" | "timestamp" | "shift" | "offset" | "delete" (forget the commit)
    value: int = 0  # the timestamp (ms), the shift (messages) or the offset


class OffsetResetPlan(msgspec.Struct, kw_only=True):
    topic: str
    partition: int
    current_offset: int | None
    new_offset: int


# --------------------------------------------------------------------------- pure arithmetic


def lag_messages(committed: int | None, log_end: int | None) -> int | None:
    if committed is None or log_end is None:
        return None
    return max(0, log_end - committed)


def lag_seconds(now_ms: int, lag: int | None, oldest_unconsumed_timestamp_ms: int | None) -> float | None:
    if lag == 0:
        return 0.0
    if lag is None or oldest_unconsumed_timestamp_ms is None:
        return None
    return max(0, now_ms - oldest_unconsumed_timestamp_ms) / 1000


def hot_flags(values: list[float | None], ratio: float, minimum: float) -> list[bool]:
    """For each value: above `ratio` × the median of the other known values, and above `minimum`."""
    flags = []
    for index, value in enumerate(values):
        others = [other for position, other in enumerate(values) if position != index and other is not None]
        flags.append(value is not None and bool(others) and value > minimum
                     and value > ratio * statistics.median(others))
    return flags


def arrival_rates(before: dict[Any, int], after: dict[Any, int], elapsed_ms: float) -> dict[Any, float]:
    if elapsed_ms <= 0:
        return {}
    return {key: max(0, after[key] - before[key]) * 1000 / elapsed_ms for key in after if key in before}


def start_position(committed: int | None, reset: str, log_start: int | None, log_end: int | None) -> int | None:
    """Where a member starts: the commit, else the log start (earliest) or end (latest)."""
    if committed is not None:
        return committed
    return log_start if reset == "earliest" else log_end


def build_group_lag(description: DescribeGroupResponse, partition_counts: dict[str, int],
                    log_ends: dict[TopicPartitionKey, int], oldest_timestamps: dict[TopicPartitionKey, int],
                    now_ms: int, *, rates: dict[TopicPartitionKey, float] | None = None,
                    rule: HotRule = HotRule(), sample_ms: int = 0, reset: str = "latest",
                    log_starts: dict[TopicPartitionKey, int] | None = None) -> GroupLag:
    """Lag per partition of every topic the group has commits for or is assigned; a partition
    without a commit is measured from where `reset` would start a member (`log_starts` gives
    the log start of those partitions)."""
    if reset not in ("earliest", "latest"):
        raise ValueError(f"reset must be earliest or latest, not {reset!r}")
    owners = {tuple(tp): member for member in description.members for tp in member.assignment}
    committed = {(entry.topic, entry.partition): entry.offset for entry in description.offsets}
    topics = sorted({tp[0] for tp in committed} | {tp[0] for tp in owners})
    starts = log_starts or {}
    rows: list[PartitionLag] = []
    for topic in topics:
        keys = _partitions_of(topic, partition_counts, committed, owners)
        topic_rows = [_partition_row(key, owners, committed, log_ends, oldest_timestamps, now_ms, rates,
                                     reset, starts) for key in keys]
        _flag_hot(topic_rows, rule)
        rows += topic_rows
    members = [_member_row(member, rows) for member in description.members]
    return GroupLag(
        group_id=description.group_id, kind=description.kind, state=description.state,
        generation=description.generation, protocol=description.protocol_name, members=members,
        partitions=rows, total_lag_messages=sum(row.lag_messages or 0 for row in rows), measured_at_ms=now_ms,
        sample_ms=sample_ms, reset=reset)


def _partitions_of(topic: str, counts: dict[str, int], committed: dict,
                   owners: dict) -> list[TopicPartitionKey]:
    known = {tp for tp in list(committed) + list(owners) if tp[0] == topic}
    known |= {(topic, partition) for partition in range(counts.get(topic, 0))}
    return sorted(known)


def _partition_row(key: TopicPartitionKey, owners: dict, committed: dict, log_ends: dict, timestamps: dict,
                   now_ms: int, rates: dict | None, reset: str, log_starts: dict) -> PartitionLag:
    owner = owners.get(key)
    commit = committed.get(key)
    start = start_position(commit, reset, log_starts.get(key), log_ends.get(key))
    lag = lag_messages(start, log_ends.get(key))
    return PartitionLag(
        topic=key[0], partition=key[1], member_id=owner.member_id if owner else None,
        client_id=owner.client_id if owner else None, committed_offset=commit,
        log_start_offset=log_starts.get(key) if commit is None else None,
        log_end_offset=log_ends.get(key), start_from="committed" if commit is not None else reset,
        start_offset=start, lag_messages=lag,
        lag_seconds=lag_seconds(now_ms, lag, timestamps.get(key)),
        arrival_rate_per_s=None if rates is None else rates.get(key))


def _flag_hot(rows: list[PartitionLag], rule: HotRule) -> None:
    by_lag = hot_flags([row.lag_messages for row in rows], rule.lag_ratio, rule.lag_messages_min)
    by_rate = hot_flags([row.arrival_rate_per_s for row in rows], rule.rate_ratio, rule.rate_per_s_min)
    for row, lag_hot, rate_hot in zip(rows, by_lag, by_rate):
        row.hot_reasons = [reason for reason, hot in (("lag", lag_hot), ("rate", rate_hot)) if hot]
        row.hot = bool(row.hot_reasons)


def _member_row(member: Any, rows: list[PartitionLag]) -> MemberLag:
    owned = [tuple(tp) for tp in member.assignment]
    lag = sum(row.lag_messages or 0 for row in rows if row.member_id == member.member_id)
    # A share member whose partitions the answer left out (its byte bound) has some all the same.
    return MemberLag(member_id=member.member_id, client_id=member.client_id,
                     group_instance_id=member.group_instance_id, partitions=owned,
                     idle=not owned and not member.assignment_omitted, lag_messages=lag)


def plan_reset(target: ResetTarget, topic: str, partition: int, *, committed: int | None, earliest: int,
               latest: int, at_time: int | None = None) -> OffsetResetPlan:
    """Where a reset moves one partition. A shift starts from the commit (the earliest offset when
    there is none) and stays within [earliest, latest]; a time with no record at or after it
    resets to latest."""
    if target.kind == "earliest":
        new = earliest
    elif target.kind == "latest":
        new = latest
    elif target.kind == "timestamp":
        new = at_time if at_time is not None and at_time >= 0 else latest
    elif target.kind == "shift":
        new = min(latest, max(earliest, (committed if committed is not None else earliest) + target.value))
    elif target.kind == "offset":
        new = min(latest, max(earliest, target.value))  # Kafka clamps an out-of-range --to-offset too
    else:
        raise ValueError(f"unknown reset target {target.kind!r}")
    return OffsetResetPlan(topic=topic, partition=partition, current_offset=committed, new_offset=new)


# --------------------------------------------------------------------------- gathering facts


def _checked(reply: Any) -> Any:
    if isinstance(reply, ErrorResponse) or getattr(reply, "error", ErrorCode.NONE) != ErrorCode.NONE:
        raise RailmqError(reply.error, reply.error_message)
    return reply


class GroupAdminClient:
    """Synchronous requests to the group coordinator and to partition leaders (one thread)."""

    def __init__(self, bootstrap: str, *, timeout_ms: int = 10_000,
                 clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        self.admin = Admin(bootstrap, timeout_ms=timeout_ms)
        self.timeout_ms = timeout_ms
        self.clock_ms = clock_ms
        self._topics: dict[str, TopicMetadata] = {}

    def close(self) -> None:
        self.admin.close()

    def __enter__(self) -> "GroupAdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ask(self, endpoint: str, message: Any, wrong_kind: int) -> Any:
        """One request; an answer of another kind than `message` asks for is `wrong_kind`."""
        self.admin.check_open()
        try:
            reply = self.admin.rpc.request(endpoint, message, self.timeout_ms)
        except RequestTimeout as timeout:
            raise RailmqError(ErrorCode.REQUEST_TIMED_OUT, str(timeout)) from None
        return answer_to(message, reply, wrong_kind)

    def _retrying(self, attempt: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            try:
                return attempt()
            except RailmqError as error:
                # A timeout already waited the whole budget; other retriable errors pass quickly.
                waited_out = error.code == ErrorCode.REQUEST_TIMED_OUT or time.monotonic() > deadline
                if not error.retriable or waited_out:
                    raise
                self._topics.clear()
                time.sleep(RETRY_PAUSE_S)

    # ------------------------------------------------------------------ group coordinator

    def _coordinator(self) -> str:
        endpoint = self.admin.metadata([]).group_coordinator_endpoint
        if not endpoint:
            raise RailmqError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                              "the group coordinator has not announced itself yet")
        if not named_endpoint(endpoint):  # a claim: a local socket, a source address, a 10 KB name
            raise RailmqError(ErrorCode.COORDINATOR_NOT_AVAILABLE, (
                f"the metadata names the group coordinator at {endpoint[:80]!r}, no endpoint of a cluster"))
        return endpoint

    def _group_request(self, message: Any) -> Any:
        wrong_kind = ErrorCode.NOT_COORDINATOR
        return self._retrying(lambda: _checked(self._ask(self._coordinator(), message, wrong_kind)))

    def list_groups(self) -> list[GroupSummary]:
        return self._group_request(ListGroupsRequest(correlation_id=0)).groups

    def describe_group(self, group_id: str) -> DescribeGroupResponse:
        return self._group_request(DescribeGroupRequest(correlation_id=0, group_id=group_id))

    def delete_group(self, group_id: str) -> None:
        self._group_request(DeleteGroupRequest(correlation_id=0, group_id=group_id))

    def delete_offsets(self, group_id: str, partitions: list[TopicPartitionKey]) -> list[TopicPartitionKey]:
        """Forget the group's commits for these partitions (Kafka's OffsetDelete); the group must
        have no members. Returns the partitions that had a commit."""
        from actors.messages import OffsetDeleteRequest

        reply = self._group_request(OffsetDeleteRequest(correlation_id=0, group_id=group_id,
                                                        partitions=[tuple(p) for p in partitions]))
        return [tuple(partition) for partition in reply.deleted]

    def commit_as_admin(self, group_id: str, offsets: dict[TopicPartitionKey, int]) -> None:
        """Commit with generation -1: accepted only while the group has no members (else NON_EMPTY_GROUP)."""
        entries = [OffsetEntry(topic=topic, partition=partition, offset=offset)
                   for (topic, partition), offset in sorted(offsets.items())]
        reply = self._group_request(OffsetCommitRequest(correlation_id=0, group_id=group_id, offsets=entries))
        refused = [entry for entry in reply.offsets if entry.error]
        if refused:
            first = refused[0]
            raise RailmqError(first.error, f"the commit for {first.topic}/{first.partition} was refused")

    # ------------------------------------------------------------------ partition leaders

    def topic(self, name: str) -> TopicMetadata:
        if name not in self._topics:
            self._topics[name] = self.admin.describe_topic(name)
        return self._topics[name]

    def _leader(self, topic: str, partition: int) -> str:
        partitions = self.topic(topic).partitions
        if not 0 <= partition < len(partitions):
            raise RailmqError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")
        endpoint = partitions[partition].leader_endpoint
        if not endpoint:
            raise RailmqError(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}/{partition} has no leader right now")
        return endpoint

    def list_offset(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """EARLIEST, LATEST (the high watermark), or the first offset at or after a time (-1: none)."""
        def attempt() -> int:
            request = ListOffsetsRequest(correlation_id=0, topic=topic, partition=partition,
                                         timestamp_ms=timestamp_ms)
            reply = self._ask(self._leader(topic, partition), request, ErrorCode.NOT_LEADER)
            return listed_offsets(reply, topic, partition).offset
        return self._retrying(attempt)

    def list_offsets(self, keys: list[TopicPartitionKey], timestamp_ms: int) -> dict[TopicPartitionKey, int]:
        """`list_offset` for many partitions in one round trip (every leader asked at once), so the
        offsets are of one moment; if any answer is a retriable error, each is asked again alone."""
        try:
            requests = [(self._leader(topic, partition), ListOffsetsRequest(
                correlation_id=0, topic=topic, partition=partition, timestamp_ms=timestamp_ms))
                for topic, partition in keys]
            self.admin.check_open()
            try:
                replies = self.admin.rpc.request_many(requests, self.timeout_ms)
            except RequestTimeout as timeout:
                raise RailmqError(ErrorCode.REQUEST_TIMED_OUT, str(timeout)) from None
            return {key: listed_offsets(reply, *key).offset for key, reply in zip(keys, replies)}
        except RailmqError as error:
            if not error.retriable:
                raise
            self._topics.clear()
            return {key: self.list_offset(key[0], key[1], timestamp_ms) for key in keys}

    def timestamp_at(self, topic: str, partition: int, offset: int) -> int | None:
        """The timestamp of the first record at or after `offset` (None when there is none yet).
        When retention removed it, the oldest record left is the one: the log start the answer
        names is read instead, at most `LOG_START_FOLLOWS_MAX` times (it called itself for each,
        and a leader naming offset + 1 every time ended in a RecursionError after 986 fetches)."""
        def attempt() -> int | None:
            position = offset
            for _ in range(LOG_START_FOLLOWS_MAX + 1):
                request = FetchRequest(correlation_id=0, topic=topic, partition=partition, offset=position,
                                       max_bytes=1, max_wait_ms=0)
                reply = self._ask(self._leader(topic, partition), request, ErrorCode.NOT_LEADER)
                out_of_range = getattr(reply, "error", 0) == ErrorCode.OFFSET_OUT_OF_RANGE
                if not (out_of_range and position < reply.log_start_offset):
                    records = decode_fetched(topic, partition, _checked(reply).records, position)
                    return records[0].timestamp_ms if records else None
                position = reply.log_start_offset
            raise RailmqError(ErrorCode.OFFSET_OUT_OF_RANGE, (
                f"the log start of {topic}/{partition} moved past each of {LOG_START_FOLLOWS_MAX + 1} "
                f"fetches from offset {offset} on (to {position})"))
        return self._retrying(attempt)


def measure_group_lag(client: GroupAdminClient, group_id: str, *, sample_ms: int = 0,
                      rule: HotRule = HotRule(), sleep: Callable[[float], None] = time.sleep,
                      reset: str = "latest") -> GroupLag:
    """Describe the group and compute its lag; with `sample_ms`, also each partition's arrival
    rate. Partitions without a commit are measured from where `reset` starts a new member."""
    description = client.describe_group(group_id)
    committed = {(entry.topic, entry.partition): entry.offset for entry in description.offsets}
    assigned = {tuple(tp) for member in description.members for tp in member.assignment}
    counts = _partition_counts(client, sorted({topic for topic, _ in set(committed) | assigned}))
    keys = [(topic, partition) for topic, count in sorted(counts.items()) for partition in range(count)]
    log_ends = _log_ends(client, keys)
    rates = None
    if sample_ms > 0:
        started = client.clock_ms()
        sleep(sample_ms / 1000)
        later = _log_ends(client, keys)
        rates = arrival_rates(log_ends, later, client.clock_ms() - started)
        log_ends = later
    uncommitted = [key for key in keys if key not in committed]
    log_starts = {key: client.list_offset(key[0], key[1], EARLIEST) for key in uncommitted}
    starts = {**{key: start for key in uncommitted
                 if (start := start_position(None, reset, log_starts[key], log_ends[key])) is not None}, **committed}
    timestamps = _oldest_unconsumed_timestamps(client, starts, log_ends)
    return build_group_lag(description, counts, log_ends, timestamps, client.clock_ms(), rates=rates,
                           rule=rule, sample_ms=sample_ms, reset=reset, log_starts=log_starts)


def _oldest_unconsumed_timestamps(client: GroupAdminClient, committed: dict[TopicPartitionKey, int],
                                  log_ends: dict[TopicPartitionKey, int]) -> dict[TopicPartitionKey, int]:
    """The timestamp at the committed offset of each partition that has lag."""
    found = {}
    for key, offset in committed.items():
        if key in log_ends and log_ends[key] > offset:
            timestamp = client.timestamp_at(key[0], key[1], offset)
            if timestamp is not None:
                found[key] = timestamp
    return found


def _partition_counts(client: GroupAdminClient, topics: list[str]) -> dict[str, int]:
    """Partition counts of the topics that still exist (a deleted topic keeps its commits only)."""
    counts = {}
    for topic in topics:
        try:
            counts[topic] = len(client.topic(topic).partitions)
        except RailmqError as error:
            if error.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise
    return counts


def _log_ends(client: GroupAdminClient, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
    """Every partition's end in one round trip, right after the commits were read: read one
    leader after another, a loaded machine's round trips were counted as lag."""
    return client.list_offsets(keys, LATEST)
