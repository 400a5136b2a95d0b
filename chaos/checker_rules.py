"""The checker's rules: each reads the ledger of a history and tallies one kind of anomaly.

It owns the judging of the records chaos/checker_ledger.py filled, after the rules stated in
chaos/checker.py (lost, phantom, failed read, inconsistent offsets, order, commits, divergence,
unseen, duplicates, failover); chaos/checker.py runs them and assembles the result. A rule never
reads the history again and never changes the ledger. Every rule is linear or n log n, so a
history of a million operations checks in seconds. Counts are exact; each `Tally` keeps the
first `ANOMALIES_PER_KIND_MAX` examples.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any

from chaos.checker_ledger import Ledger, SendRecord
from chaos.history import Key, ReplicaLogLine, Value
from chaos.verdict import (
    ANOMALIES_PER_KIND_MAX,
    CommitRegression,
    Divergence,
    DuplicateStats,
    FailoverSample,
    LostMessage,
    OffsetConflict,
    OrderViolation,
    Position,
    ReadAnomaly,
    UnseenMessage,
    ValueConflict,
)


class Tally:
    """An exact count and the first few examples of one kind of anomaly."""

    def __init__(self) -> None:
        self.count = 0
        self.examples: list[Any] = []

    def add(self, example: Any) -> None:
        self.count += 1
        if len(self.examples) < ANOMALIES_PER_KIND_MAX:
            self.examples.append(example)


def _loss_reason(record: SendRecord, ledger: Ledger) -> str | None:
    """Why an acknowledged send counts as lost, or None when it is not (or cannot be judged)."""
    topic, partition, offset = record.topic, record.ack_partition, record.ack_offset
    if partition is None:
        if topic in ledger.final_topics and record.final is None:
            return "missing from every final read of its topic"
        return None
    if (topic, partition) in ledger.final_partitions:
        if record.final is None:
            return "missing from the final read"
        if offset is not None and record.final != (topic, partition, offset):
            return f"the final read has it at partition {record.final[1]} offset {record.final[2]}"
        return None
    highest = ledger.highest_polled.get((topic, partition))
    if offset is not None and highest is not None and offset < highest and record.reader is None:
        return f"never read, though polls of the partition reached offset {highest}"
    return None


def _consumed_loss_reason(record: SendRecord, ledger: Ledger) -> str | None:
    """Why a send never acknowledged counts as lost: a consumer read it, so it was committed (a
    consumer reads below the high watermark only), yet the final read of its partition lacks it."""
    if record.outcome == "fail" or not record.sent or record.final is not None:
        return None  # a failed send read is a failed read; a value nobody sent is a phantom
    if record.reader is None or record.reader == "final-read" or record.position is None:
        return None
    topic, partition, _offset = record.position
    if (topic, partition) not in ledger.final_partitions:
        return None
    return f"not acknowledged, but {record.reader} read it there; missing from the final read"


def find_lost(ledger: Ledger) -> tuple[Tally, set[Value]]:
    """Acknowledged sends the log lost, and sends never acknowledged that a consumer read and the
    log then lost: both were committed. The set holds the acknowledged ones only: an expected loss
    (acks=1) is of acknowledged writes, and it alone excuses the offsets a loss left inconsistent."""
    lost, lost_values = Tally(), set()
    for record in ledger.sends.values():
        if record.outcome == "ok":
            reason = _loss_reason(record, ledger)
            partition, offset = record.ack_partition, record.ack_offset
        else:
            reason = _consumed_loss_reason(record, ledger)
            partition, offset = record.position[1:] if record.position is not None else (None, None)
        if reason is not None:
            if record.outcome == "ok":
                lost_values.add(record.value)
            lost.add(LostMessage(record.topic, partition, offset, record.key, record.value, reason))
    return lost, lost_values


def find_unchecked(ledger: Ledger, lost_values: set[Value]) -> tuple[int, list[tuple[str, int | None]]]:
    """Acknowledged sends not judged lost whose partition has no final read, and those partitions.

    Nothing shows they survived: a poll saw the log once, not after the recovery window, and an
    acknowledged offset above every polled one is not judged at all. A partition whose final
    read could not finish (its leader never came back) must not pass for one that lost nothing.
    """
    count, partitions = 0, set()
    for record in ledger.sends.values():
        if record.outcome != "ok" or record.value in lost_values:
            continue
        if record.ack_partition is None:
            if record.topic in ledger.final_topics:
                continue
        elif (record.topic, record.ack_partition) in ledger.final_partitions:
            continue
        count += 1
        partitions.add((record.topic, record.ack_partition))
    ordered = sorted(partitions, key=lambda place: (place[0], -1 if place[1] is None else place[1]))
    return count, ordered


def find_bad_reads(ledger: Ledger) -> tuple[Tally, Tally]:
    phantoms, failed_reads = Tally(), Tally()
    for record in ledger.sends.values():
        if record.reader is None or record.position is None:
            continue
        # Neither a phantom nor a failed send has an acknowledged position: it was first seen read.
        topic, partition, offset = record.position
        if not record.sent:
            phantoms.add(ReadAnomaly(topic, partition, offset, record.value, record.reader))
        elif record.outcome == "fail":
            failed_reads.add(ReadAnomaly(topic, partition, offset, record.value, record.reader))
    return phantoms, failed_reads


def find_inconsistencies(ledger: Ledger, lost_values: set[Value]) -> tuple[Tally, Tally, int]:
    """Both kinds of inconsistent offsets, and how many are not explained by an expected loss."""
    offset_conflicts, value_conflicts = Tally(), Tally()
    unexplained = 0
    for (topic, partition, offset), values in ledger.offset_conflicts.items():
        offset_conflicts.add(OffsetConflict(topic, partition, offset, values))
        unexplained += sum(1 for value in values if value not in lost_values) > 1
    for value, positions in ledger.value_conflicts.items():
        value_conflicts.add(ValueConflict(value, positions))
        unexplained += value not in lost_values
    if not ledger.config.expect_loss:
        unexplained = offset_conflicts.count + value_conflicts.count
    return offset_conflicts, value_conflicts, unexplained


def _log_position(record: SendRecord, final_partitions: set[tuple[str, int]]) -> Position | None:
    """Where the log holds a sent value: the final read, else the acknowledgement if unread."""
    if record.final is not None:
        return record.final
    if record.outcome != "ok" or record.ack_partition is None or record.ack_offset is None:
        return None
    if (record.topic, record.ack_partition) in final_partitions:
        return None  # the final read of its partition lacks it: lost, not ordered
    return (record.topic, record.ack_partition, record.ack_offset)


# An event for the precedence sweep: (invoke_ns or None, ok_ns or None, offset, value).
_Event = tuple[int | None, int | None, int, Any]


def _precedence_breaks(events: list[_Event], equal_is_break: bool) -> list[tuple[_Event, _Event]]:
    """Pairs (earlier, later) where `earlier` completed before `later` was invoked, yet
    offset(later) < offset(earlier) (or == too, when `equal_is_break`).

    Events sorted by invoke time meet a running maximum over the offsets of events completed
    before that invoke, so the sweep is n log n; the earlier half of each pair is the event
    holding that maximum.
    """
    completed = sorted((event for event in events if event[1] is not None), key=lambda event: event[1])
    started = sorted((event for event in events if event[0] is not None), key=lambda event: event[0])
    breaks: list[tuple[_Event, _Event]] = []
    highest: _Event | None = None
    index = 0
    for later in started:
        while index < len(completed) and completed[index][1] < later[0]:  # type: ignore[operator]
            if highest is None or completed[index][2] > highest[2]:
                highest = completed[index]
            index += 1
        if highest is not None and (later[2] < highest[2] or (equal_is_break and later[2] == highest[2])):
            breaks.append((highest, later))
    return breaks


def find_order_violations(ledger: Ledger) -> Tally:
    streams: dict[tuple[str, Key, int], list[_Event]] = {}
    partitions_of_key: dict[tuple[str, Key], list[int]] = {}
    for record in ledger.sends.values():
        if record.key is None or not record.sent:
            continue
        position = _log_position(record, ledger.final_partitions)
        if position is None:
            continue
        ok_ns = record.complete_ns if record.outcome == "ok" else None
        _topic, partition, offset = position
        streams.setdefault((record.topic, record.key, partition), []).append(
            (record.invoke_ns, ok_ns, offset, record.value)
        )
        seen = partitions_of_key.setdefault((record.topic, record.key), [])
        if partition not in seen:
            seen.append(partition)
    order = Tally()
    for (topic, key), partitions in partitions_of_key.items():
        if len(partitions) > 1:  # a key in two partitions has no order at all
            first, second = (streams[(topic, key, partition)][0] for partition in partitions[:2])
            order.add(OrderViolation(
                topic, key, first[3], partitions[0], first[2], second[3], partitions[1], second[2]
            ))
    for (topic, key, partition), events in streams.items():
        if len(events) > 1:
            for earlier, later in _precedence_breaks(events, equal_is_break=True):
                order.add(OrderViolation(
                    topic, key, earlier[3], partition, earlier[2], later[3], partition, later[2]
                ))
    return order


def find_commit_regressions(ledger: Ledger, excused_partitions: set[tuple[str, int]]) -> tuple[Tally, int]:
    """All regressions, and how many of them are on `excused_partitions`."""
    regressions = Tally()
    excused = 0
    for (group, topic, partition), commits in ledger.commits.items():
        events = [(invoke_ns, ok_ns, offset, None) for invoke_ns, ok_ns, offset in commits]
        for earlier, later in _precedence_breaks(events, equal_is_break=False):
            regressions.add(CommitRegression(group, topic, partition, earlier[2], later[2]))
            excused += (topic, partition) in excused_partitions
    return regressions, excused


def lossy_partitions(ledger: Ledger, lost_values: set) -> set[tuple[str, int]]:
    """Partitions that lost acknowledged writes: when loss is expected (teaching scenarios), the
    consumers' resets and rewinds there follow from it and are reported, not judged."""
    if not ledger.config.expect_loss:
        return set()
    found = set()
    for value in lost_values:
        record = ledger.sends.get(value)
        if record is not None and record.ack_partition is not None:
            found.add((record.topic, record.ack_partition))
    return found


def _first_difference(log: ReplicaLogLine, other: ReplicaLogLine) -> Divergence | None:
    entries = {entry[0]: entry for entry in log.entries}
    other_entries = {entry[0]: entry for entry in other.entries}
    start = max(_log_start(log), _log_start(other))
    for offset in range(start, min(log.high_watermark, other.high_watermark)):
        entry, other_entry = entries.get(offset), other_entries.get(offset)
        if entry != other_entry:
            return Divergence(
                log.topic, log.partition, log.replica, other.replica, offset,
                list(entry) if entry is not None else None,
                list(other_entry) if other_entry is not None else None,
            )
    return None


def _log_start(log: ReplicaLogLine) -> int:
    if log.log_start_offset is not None:
        return log.log_start_offset
    return log.entries[0][0] if log.entries else 0


def find_divergences(ledger: Ledger) -> Tally:
    divergences = Tally()
    for logs in ledger.replica_logs.values():
        ordered = sorted(logs, key=lambda log: log.replica)
        for index, log in enumerate(ordered):
            for other in ordered[index + 1:]:
                difference = _first_difference(log, other)
                if difference is not None:
                    divergences.add(difference)
    return divergences


def _owed_position(record: SendRecord, lost_values: set[Value]) -> tuple[int | None, int | None] | None:
    """Where a record every group must deliver is, or None when it is not owed to the groups: an
    acknowledged value not lost (at its acknowledged place), or a value of an indeterminate send
    that the final read holds (a group skipping it breaks at-least-once just the same)."""
    if record.outcome == "ok":
        return None if record.value in lost_values else (record.ack_partition, record.ack_offset)
    if record.outcome != "fail" and record.sent and record.final is not None:
        return record.final[1], record.final[2]
    return None


def find_unseen(ledger: Ledger, lost_values: set[Value]) -> tuple[Tally, dict[str, int], int]:
    """Values owed to each group that it never polled; the last figure is how many are violations."""
    unseen, by_group, counted = Tally(), {}, 0
    owed = []
    for record in ledger.sends.values():
        position = _owed_position(record, lost_values)
        if position is not None:
            owed.append((record, position))
    for group in sorted(ledger.group_topics):
        topics = ledger.group_topics[group]
        delivered = ledger.deliveries.get(group, {})
        missing = 0
        for record, (partition, offset) in owed:
            if record.topic in topics and record.value not in delivered:
                missing += 1
                unseen.add(UnseenMessage(group, record.topic, partition, offset, record.value))
        by_group[group] = missing
        # Every group here polled or was assigned partitions: one that never delivered a record is
        # the worst breach of at-least-once, not a group the run did not have.
        if ledger.heal_ns is not None:
            counted += missing
    return unseen, by_group, counted


def duplicate_stats(counts: dict[Value, int]) -> DuplicateStats:
    deliveries = sum(counts.values())
    distinct = len(counts)
    duplicates = deliveries - distinct
    return DuplicateStats(
        deliveries=deliveries,
        distinct=distinct,
        duplicates=duplicates,
        rate=duplicates / distinct if distinct else 0.0,
        max_deliveries=max(counts.values(), default=0),
    )


def failover_samples(ledger: Ledger) -> list[FailoverSample]:
    """Fault -> the first acknowledgement of a send *invoked after* the fault on that partition:
    only a working leader can give it (an answer already on its way when the fault hit, or one
    from a merely paused leader that had queued it, does not count as recovery)."""
    acknowledged: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for record in ledger.sends.values():
        if record.outcome == "ok" and record.ack_partition is not None and record.complete_ns is not None \
                and record.invoke_ns is not None:
            acknowledged.setdefault((record.topic, record.ack_partition), []).append(
                (record.invoke_ns, record.complete_ns))
    for pairs in acknowledged.values():
        pairs.sort()
    samples = []
    for fault in ledger.faults:
        if fault.phase != "start" or fault.topic is None or fault.partition is None:
            continue
        if fault.role not in (None, "leader"):
            continue
        pairs = acknowledged.get((fault.topic, fault.partition), [])
        index = bisect_right(pairs, (fault.time_ns, 1 << 62))
        later = [complete for _, complete in pairs[index:]]
        recovered_ns = min(later) if later else None
        failover_ms = (recovered_ns - fault.time_ns) / 1e6 if recovered_ns is not None else None
        samples.append(FailoverSample(
            fault.topic, fault.partition, fault.nemesis, fault.time_ns, recovered_ns, failover_ms
        ))
    return samples


def percentile(samples: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile, None without samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = max(1, math.ceil(fraction * len(ordered) - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]
