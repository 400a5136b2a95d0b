"""Consumer groups seen from outside: lag per partition, hot partitions, offset-reset plans.

Two layers, so tests and tools can reuse the arithmetic without a cluster:

- pure functions (`lag_messages`, `lag_seconds`, `hot_flags`, `build_group_lag`, `plan_reset`)
  turn facts into plain msgspec Structs (`GroupLag`, `PartitionLag`, `OffsetResetPlan`);
- `GroupAdminClient` (railmq/group_admin.py) gathers the facts: the group coordinator's
  DescribeGroup (members, assignments, committed offsets — it works for a group with no live
  member), ListOffsets from each partition's leader (the log end offset a consumer can reach is
  the high watermark), and one small fetch at the committed offset for the timestamp of the
  oldest unconsumed record; `measure_group_lag` puts the two together.

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

from actors.errors import ErrorCode, RailmqError
from actors.messages import DescribeGroupResponse
from railmq.group_admin import EARLIEST, LATEST, GroupAdminClient, TopicPartitionKey


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
                    log_starts: dict[TopicPartitionKey, int] | None = None,
                    topic_ids: dict[str, int] | None = None) -> GroupLag:
    """Lag per partition of every topic the group has commits for or is assigned; a partition
    without a commit is measured from where `reset` would start a member (`log_starts` gives
    the log start of those partitions). With `topic_ids` (each topic's id now), a commit of
    another id (the topic was deleted and made again) counts as none."""
    if reset not in ("earliest", "latest"):
        raise ValueError(f"reset must be earliest or latest, not {reset!r}")
    owners = {tuple(tp): member for member in description.members for tp in member.assignment}
    committed = _commits(description, topic_ids or {})
    topics = sorted({entry.topic for entry in description.offsets} | {tp[0] for tp in owners})
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


def measure_group_lag(client: GroupAdminClient, group_id: str, *, sample_ms: int = 0,
                      rule: HotRule = HotRule(), sleep: Callable[[float], None] = time.sleep,
                      reset: str = "latest") -> GroupLag:
    """Describe the group and compute its lag; with `sample_ms`, also each partition's arrival
    rate. Partitions without a commit are measured from where `reset` starts a new member."""
    description = client.describe_group(group_id)
    committed = {(entry.topic, entry.partition): entry.offset for entry in description.offsets}
    assigned = {tuple(tp) for member in description.members for tp in member.assignment}
    counts, topic_ids = _partition_counts(client, sorted({topic for topic, _ in set(committed) | assigned}))
    committed = _commits(description, topic_ids)
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
                           rule=rule, sample_ms=sample_ms, reset=reset, log_starts=log_starts,
                           topic_ids=topic_ids)


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


def _partition_counts(client: GroupAdminClient, topics: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Partition counts and ids of the topics that still exist (a deleted topic keeps its commits only)."""
    counts, topic_ids = {}, {}
    for topic in topics:
        try:
            metadata = client.topic(topic)
        except RailmqError as error:
            if error.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise
            continue
        counts[topic], topic_ids[topic] = len(metadata.partitions), metadata.topic_id
    return counts, topic_ids


def _commits(description: DescribeGroupResponse, topic_ids: dict[str, int]) -> dict[TopicPartitionKey, int]:
    """The group's committed offsets, without those of a topic deleted and made again under its
    name (another id than `topic_ids` gives it now): a member starts those partitions from its
    reset policy (trace position-of-a-deleted-topic), so they are measured from there. Measured
    from the old offsets, a new topic shorter than them showed no lag at all."""
    return {(entry.topic, entry.partition): entry.offset for entry in description.offsets
            if not (entry.topic_id and topic_ids.get(entry.topic, 0) not in (0, entry.topic_id))}


def _log_ends(client: GroupAdminClient, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
    """Every partition's end in one round trip, right after the commits were read: read one
    leader after another, a loaded machine's round trips were counted as lag."""
    return client.list_offsets(keys, LATEST)
