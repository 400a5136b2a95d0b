"""The history checker: reads what every client did and saw during a chaos run and judges it.

It owns the verdict and nothing else: it never talks to a cluster, and it judges a hand-written
history exactly as it judges a recorded one (format: docs/history.md, parsing: chaos.history).
One pass over the lines fills a `_Ledger` keyed by value (values are unique across a run); the
rules then run over the ledger. Every rule is linear or n log n, so a history of a million
operations checks in seconds. The rules, after Jepsen's Kafka and queue checkers:

- lost: an `ok` send whose value is missing from the `final-read` of its partition, or present
  there at another offset than acknowledged (then also an inconsistent offset). Without a final
  read of that partition: acknowledged offset below the highest offset any poll returned there,
  and the value never read (Jepsen's rule).
- phantom: a value read (poll or final read) that no send ever invoked.
- failed read: a value read whose send completed with `fail`.
- inconsistent offsets: two values seen at one (topic, partition, offset), or one value seen at
  two positions, across acknowledgements, polls and final reads.
- order (per key): send A `ok` before send B `invoke`, same topic and key, needs
  offset(A) < offset(B) in the final read (acknowledged offsets where there is no final read).
  A key written to two partitions is also a violation. Sends without a key are not ordered.
- polls: per (group, member, generation, topic, partition) successive polled offsets must each
  be the previous one plus one; a backwards move or a skip is a violation.
- commits: per (group, topic, partition), `ok` commit A completed before `ok` commit B was
  invoked needs offset(B) >= offset(A).
- divergence: two `replica-log`s of one partition must hold identical entries from the later of
  their log start offsets up to the smaller of their high watermarks.
- unseen: per group, acknowledged values in the group's topics that no poll of the group
  returned (lost values excluded: they are counted as lost). A violation only when the history
  has a `heal` line and the group polled, i.e. after the recovery window.
- duplicates: per group, deliveries beyond the first of each value (rate = duplicates / distinct
  values delivered, and the most deliveries of one value). Reported, never a violation.
- failover: per leader fault (`fault`, phase start, naming topic and partition, role absent or
  `leader`), the time to the first `ok` send on that partition completed after the fault.
- hygiene: a leftover process or /dev/shm segment is a violation.

`info` and unanswered sends are indeterminate: never lost, never failed. With
`config.expect_loss` lost and failed-read values, and inconsistent offsets that involve lost
values only (a truncated acknowledged write), are reported but are not violations.
Counts are exact; each list of named anomalies keeps the first `ANOMALIES_PER_KIND_MAX`.

The module owns the ledger (the one pass) and the rules, in that order. What they produce (the
result and anomaly types, the violation sentences, the summary document) is chaos/verdict.py;
its public names are re-exported here. It stays longer than the usual 400 lines because every
rule reads the ledger's private `_Send` records, so the ledger and the rules change together.
"""

from __future__ import annotations

import contextlib
import gc
import math
from bisect import bisect_right
from pathlib import Path
from typing import Any, Iterable, Iterator

import msgspec

from chaos.history import (
    AssignLine,
    CommitLine,
    ConfigLine,
    FaultLine,
    FinalReadLine,
    HealLine,
    HistoryLine,
    HygieneLine,
    Key,
    MalformedHistory,
    PollLine,
    ReplicaLogLine,
    SendLine,
    Value,
    iter_typed_history,
    load_history,
    typed_line,
)
from chaos.verdict import (
    ANOMALIES_PER_KIND_MAX,
    ANOMALY_FIELDS,
    SUMMARY_FIELDS,
    CheckResult,
    CommitRegression,
    Divergence,
    DuplicateStats,
    FailoverSample,
    LostMessage,
    OffsetConflict,
    OrderViolation,
    PollBreak,
    Position,
    ReadAnomaly,
    UnseenMessage,
    ValueConflict,
    summary_dict,
    violation_sentences,
)

# The verdict's public names are importable from here too (chaos.__main__ and reports do).
__all__ = [
    "ANOMALIES_PER_KIND_MAX", "ANOMALY_FIELDS", "SUMMARY_FIELDS", "CheckResult", "check_file",
    "check_history", "load_history", "summary_dict",
]


class _Send(msgspec.Struct, gc=False):
    """Everything the history says about one value. Created by its invoke, or by its first read.

    Untracked by the garbage collector (gc=False): a million of these would otherwise make every
    full collection walk them all, and they hold no reference cycles.
    """

    value: Value
    topic: str
    key: Key
    invoke_ns: int | None = None
    invoked: bool = False
    outcome: str | None = None  # "ok" | "fail" | "info" | None (never answered)
    complete_ns: int | None = None
    ack_partition: int | None = None
    ack_offset: int | None = None
    position: Position | None = None  # first place the value was seen (ack or read)
    reader: str | None = None  # who read it first (a process, or "final-read"); None: never read
    final: Position | None = None  # where the final read found it

    @property
    def sent(self) -> bool:
        return self.invoked or self.outcome is not None


class _Ledger:
    """One pass over the history, keyed by value; judging happens afterwards."""

    def __init__(self) -> None:
        self.config = ConfigLine(type="config", time_ns=0)
        self.sends: dict[Value, _Send] = {}
        self.pending_sends: dict[tuple[str, Key], Value] = {}
        self.log: dict[tuple[str, int], dict[int, Value]] = {}
        self.offset_conflicts: dict[Position, list[Value]] = {}
        self.value_conflicts: dict[Value, list[Position]] = {}
        self.highest_polled: dict[tuple[str, int], int] = {}
        self.final_partitions: set[tuple[str, int]] = set()
        self.final_topics: set[str] = set()
        self.polls = 0
        self.deliveries: dict[str, dict[Value, int]] = {}
        self.group_topics: dict[str, set[str]] = {}
        self.poll_positions: dict[tuple[str, str, int | None, str, int], int] = {}
        self.poll_violations = 0
        self.poll_breaks_by_partition: dict[tuple[str, int], int] = {}
        self.poll_breaks: list[PollBreak] = []
        self.pending_commits: dict[str, tuple[int, dict[int, int]]] = {}
        self.commits: dict[tuple[str, str, int], list[tuple[int | None, int, int]]] = {}
        self.faults: list[FaultLine] = []
        self.heal_ns: int | None = None
        self.hygiene = HygieneLine(type="hygiene", time_ns=0)
        self.replica_logs: dict[tuple[str, int], list[ReplicaLogLine]] = {}

    def feed(self, typed: HistoryLine, line_number: int) -> None:
        match typed:
            case SendLine(type="invoke"):
                self._on_send_invoke(typed, line_number)
            case SendLine():
                self._on_send_completion(typed, line_number)
            case PollLine(type="ok"):
                self._on_poll(typed)
            case CommitLine(type="invoke"):
                self.pending_commits[typed.process] = (typed.time_ns, typed.offsets)
            case CommitLine(type="ok"):
                self._on_commit_ok(typed)
            case CommitLine():
                self.pending_commits.pop(typed.process, None)
            case AssignLine(type="ok"):
                self.group_topics.setdefault(typed.group, set()).add(typed.topic)
            case FaultLine():
                self.faults.append(typed)
            case HealLine():
                self.heal_ns = typed.time_ns if self.heal_ns is None else self.heal_ns
            case FinalReadLine():
                self._on_final_read(typed)
            case ReplicaLogLine():
                self.replica_logs.setdefault((typed.topic, typed.partition), []).append(typed)
            case HygieneLine():
                self.hygiene = typed
            case ConfigLine():
                self.config = typed
            case _:
                pass  # polls that returned nothing, failed polls and assigns, kinds from newer writers

    def _send_for(self, value: Value, topic: str, key: Key) -> _Send:
        record = self.sends.get(value)
        if record is None:
            record = self.sends[value] = _Send(value, topic, key)
        return record

    def _partition_log(self, topic: str, partition: int) -> dict[int, Value]:
        slot = self.log.get((topic, partition))
        if slot is None:
            slot = self.log[(topic, partition)] = {}
        return slot

    def _on_send_invoke(self, line: SendLine, line_number: int) -> None:
        if line.value is None:
            raise MalformedHistory(line_number, "send invoke without a value")
        record = self._send_for(line.value, line.topic, line.key)
        if record.invoked:
            raise MalformedHistory(line_number, f"value {line.value!r} is sent twice (values must be unique)")
        record.invoked, record.invoke_ns = True, line.time_ns
        record.topic, record.key = line.topic, line.key
        self.pending_sends[(line.process, line.key)] = line.value

    def _on_send_completion(self, line: SendLine, line_number: int) -> None:
        pairing = (line.process, line.key)
        pending = self.pending_sends.pop(pairing, None)
        value = line.value if line.value is not None else pending
        if value is None:
            raise MalformedHistory(line_number, f"send {line.type} names no value and completes no invoke")
        if pending is not None and pending != value:
            self.pending_sends[pairing] = pending  # this completion belongs to another invoke
        record = self._send_for(value, line.topic, line.key)
        if record.outcome is not None:
            raise MalformedHistory(line_number, f"send of value {value!r} completes twice")
        record.outcome, record.complete_ns = line.type, line.time_ns
        if line.type == "ok":
            record.ack_partition, record.ack_offset = line.partition, line.offset
            if line.partition is not None and line.offset is not None:
                slot = self._partition_log(line.topic, line.partition)
                self._observe(slot, line.topic, line.partition, line.offset, value, None)

    def _observe(
        self, slot: dict[int, Value], topic: str, partition: int, offset: int, value: Value,
        reader: str | None,
    ) -> _Send:
        """Note that `value` sits at (topic, partition, offset), `slot` being that partition's
        log; `reader` is None for an acknowledgement. The hottest path of the checker."""
        held = slot.setdefault(offset, value)
        if held != value:
            values = self.offset_conflicts.setdefault((topic, partition, offset), [held])
            if value not in values:
                values.append(value)
        record = self.sends.get(value)
        if record is None:
            record = self.sends[value] = _Send(value, topic, None)
        position = record.position
        if position is None:
            record.position = (topic, partition, offset)
        elif position[2] != offset or position[1] != partition or position[0] != topic:
            positions = self.value_conflicts.setdefault(value, [position])
            if (topic, partition, offset) not in positions:
                positions.append((topic, partition, offset))
        if reader is not None and record.reader is None:
            record.reader = reader
        return record

    def _on_poll(self, line: PollLine) -> None:
        self.polls += 1
        counts = self.deliveries.setdefault(line.group, {})
        self.group_topics.setdefault(line.group, set()).add(line.topic)
        member = line.member if line.member is not None else line.process
        topic, reader = line.topic, line.process
        for partition, offset, _key, value in line.records:
            counts[value] = counts.get(value, 0) + 1
            self._observe(self._partition_log(topic, partition), topic, partition, offset, value, reader)
            if offset > self.highest_polled.get((topic, partition), -1):
                self.highest_polled[(topic, partition)] = offset
            self._step_poll((line.group, member, line.generation, topic, partition), offset)

    def _step_poll(self, stream: tuple[str, str, int | None, str, int], offset: int) -> None:
        previous = self.poll_positions.get(stream)
        self.poll_positions[stream] = offset
        if previous is None or offset == previous + 1:
            return
        self.poll_violations += 1
        partition_key = (stream[3], stream[4])
        self.poll_breaks_by_partition[partition_key] = self.poll_breaks_by_partition.get(partition_key, 0) + 1
        if len(self.poll_breaks) < ANOMALIES_PER_KIND_MAX:
            kind = "backwards" if offset <= previous else "skip"
            self.poll_breaks.append(PollBreak(*stream, previous_offset=previous, offset=offset, kind=kind))

    def _on_commit_ok(self, line: CommitLine) -> None:
        invoke_ns, invoked_offsets = self.pending_commits.pop(line.process, (None, {}))
        for partition, offset in (line.offsets or invoked_offsets).items():
            stream = (line.group, line.topic, partition)
            self.commits.setdefault(stream, []).append((invoke_ns, line.time_ns, offset))

    def _on_final_read(self, line: FinalReadLine) -> None:
        topic, partition = line.topic, line.partition
        self.final_partitions.add((topic, partition))
        self.final_topics.add(topic)
        slot = self._partition_log(topic, partition)
        for offset, _key, value in line.entries:
            record = self._observe(slot, topic, partition, offset, value, "final-read")
            position = record.position
            if position is not None and position == (topic, partition, offset):
                record.final = position  # the common case: where it was first seen
            elif record.final is None or (record.ack_offset == offset and record.ack_partition == partition):
                record.final = (topic, partition, offset)  # the acknowledged place wins among several


def check_history(lines: Iterable[dict[str, Any] | HistoryLine]) -> CheckResult:
    """Judge a history given as decoded lines (dicts or typed lines), in recorded order.

    An error about a line names its 1-based position in `lines`, which is its line number when
    the lines come from a file.
    """
    numbered = ((number, typed_line(line, number)) for number, line in enumerate(lines, start=1))
    return _check_numbered(numbered)


def check_file(path: str | Path) -> CheckResult:
    """Judge a history file, streaming it (memory grows with distinct values, not with lines)."""
    return _check_numbered(iter_typed_history(path))


def _check_numbered(numbered: Iterable[tuple[int, HistoryLine | None]]) -> CheckResult:
    with _collector_paused():
        ledger = _Ledger()
        for line_number, typed in numbered:
            if typed is not None:
                ledger.feed(typed, line_number)
        return _judge(ledger)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while checking.

    The ledger builds millions of small acyclic objects; each full collection would walk all of
    them again (a third of the run time on a million operations). Reference counting frees
    everything the checker drops, and the previous collector state is restored afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Tally:
    """An exact count and the first few examples of one kind of anomaly."""

    def __init__(self) -> None:
        self.count = 0
        self.examples: list[Any] = []

    def add(self, example: Any) -> None:
        self.count += 1
        if len(self.examples) < ANOMALIES_PER_KIND_MAX:
            self.examples.append(example)


def _judge(ledger: _Ledger) -> CheckResult:
    lost, lost_values = _find_lost(ledger)
    phantoms, failed_reads = _find_bad_reads(ledger)
    offset_conflicts, value_conflicts, unexplained = _find_inconsistencies(ledger, lost_values)
    order = _find_order_violations(ledger)
    lossy = _lossy_partitions(ledger, lost_values)
    commits, excused_commits = _find_commit_regressions(ledger, lossy)
    excused_polls = sum(count for key, count in ledger.poll_breaks_by_partition.items() if key in lossy)
    divergences = _find_divergences(ledger)
    unseen, unseen_by_group, unseen_counted = _find_unseen(ledger, lost_values)
    by_group = {group: _duplicate_stats(counts) for group, counts in sorted(ledger.deliveries.items())}
    samples = _failover_samples(ledger)
    recovered = [sample.failover_ms for sample in samples if sample.failover_ms is not None]
    result = CheckResult(
        valid=True,
        violations=[],
        scenario=ledger.config.scenario,
        seed=ledger.config.seed,
        expect_loss=ledger.config.expect_loss,
        healed=ledger.heal_ns is not None,
        polls=ledger.polls,
        deliveries=sum(stats.deliveries for stats in by_group.values()),
        lost=lost.count,
        lost_messages=lost.examples,
        phantom=phantoms.count,
        phantom_reads=phantoms.examples,
        failed_reads=failed_reads.count,
        failed_read_records=failed_reads.examples,
        inconsistent_offsets=offset_conflicts.count + value_conflicts.count,
        offset_conflicts=offset_conflicts.examples,
        value_conflicts=value_conflicts.examples,
        order_violations=order.count,
        order_breaks=order.examples,
        poll_violations=ledger.poll_violations,
        poll_breaks=ledger.poll_breaks,
        commit_regressions=commits.count,
        commit_breaks=commits.examples,
        divergences=divergences.count,
        divergent_replicas=divergences.examples,
        unseen=unseen.count,
        unseen_by_group=unseen_by_group,
        unseen_messages=unseen.examples,
        duplicates_by_group=by_group,
        faults=sum(1 for fault in ledger.faults if fault.phase == "start"),
        failover_ms_p50=_percentile(recovered, 0.50),
        failover_ms_p99=_percentile(recovered, 0.99),
        failover_ms_max=max(recovered) if recovered else None,
        failovers_unrecovered=len(samples) - len(recovered),
        failover_samples=samples,
        leftover_processes=list(ledger.hygiene.leftover_processes),
        leftover_shm=list(ledger.hygiene.leftover_shm),
    )
    _count_sends(ledger, result)
    _total_duplicates(result)
    result.violations = violation_sentences(
        result, unexplained, unseen_counted, excused_polls, excused_commits
    )
    result.valid = not result.violations
    return result


def _count_sends(ledger: _Ledger, result: CheckResult) -> None:
    for record in ledger.sends.values():
        if not record.sent:
            continue
        result.sends += 1
        if record.outcome == "ok":
            result.acknowledged += 1
        elif record.outcome == "fail":
            result.failed_sends += 1
        else:
            result.indeterminate_sends += 1


def _loss_reason(record: _Send, ledger: _Ledger) -> str | None:
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


def _find_lost(ledger: _Ledger) -> tuple[_Tally, set[Value]]:
    lost, lost_values = _Tally(), set()
    for record in ledger.sends.values():
        if record.outcome != "ok":
            continue
        reason = _loss_reason(record, ledger)
        if reason is not None:
            lost_values.add(record.value)
            lost.add(LostMessage(
                record.topic, record.ack_partition, record.ack_offset, record.key, record.value, reason
            ))
    return lost, lost_values


def _find_bad_reads(ledger: _Ledger) -> tuple[_Tally, _Tally]:
    phantoms, failed_reads = _Tally(), _Tally()
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


def _find_inconsistencies(ledger: _Ledger, lost_values: set[Value]) -> tuple[_Tally, _Tally, int]:
    """Both kinds of inconsistent offsets, and how many are not explained by an expected loss."""
    offset_conflicts, value_conflicts = _Tally(), _Tally()
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


def _log_position(record: _Send, final_partitions: set[tuple[str, int]]) -> Position | None:
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


def _find_order_violations(ledger: _Ledger) -> _Tally:
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
    order = _Tally()
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


def _find_commit_regressions(ledger: _Ledger, excused_partitions: set[tuple[str, int]]) -> tuple[_Tally, int]:
    """All regressions, and how many of them are on `excused_partitions`."""
    regressions = _Tally()
    excused = 0
    for (group, topic, partition), commits in ledger.commits.items():
        events = [(invoke_ns, ok_ns, offset, None) for invoke_ns, ok_ns, offset in commits]
        for earlier, later in _precedence_breaks(events, equal_is_break=False):
            regressions.add(CommitRegression(group, topic, partition, earlier[2], later[2]))
            excused += (topic, partition) in excused_partitions
    return regressions, excused


def _lossy_partitions(ledger: _Ledger, lost_values: set) -> set[tuple[str, int]]:
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


def _find_divergences(ledger: _Ledger) -> _Tally:
    divergences = _Tally()
    for logs in ledger.replica_logs.values():
        ordered = sorted(logs, key=lambda log: log.replica)
        for index, log in enumerate(ordered):
            for other in ordered[index + 1:]:
                difference = _first_difference(log, other)
                if difference is not None:
                    divergences.add(difference)
    return divergences


def _find_unseen(ledger: _Ledger, lost_values: set[Value]) -> tuple[_Tally, dict[str, int], int]:
    """Acknowledged values each group never polled; the last figure is how many are violations."""
    unseen, by_group, counted = _Tally(), {}, 0
    acknowledged = [record for record in ledger.sends.values() if record.outcome == "ok"]
    for group in sorted(ledger.group_topics):
        topics = ledger.group_topics[group]
        delivered = ledger.deliveries.get(group, {})
        missing = 0
        for record in acknowledged:
            if record.topic in topics and record.value not in delivered and record.value not in lost_values:
                missing += 1
                unseen.add(UnseenMessage(
                    group, record.topic, record.ack_partition, record.ack_offset, record.value
                ))
        by_group[group] = missing
        if ledger.heal_ns is not None and group in ledger.deliveries:
            counted += missing
    return unseen, by_group, counted


def _duplicate_stats(counts: dict[Value, int]) -> DuplicateStats:
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


def _total_duplicates(result: CheckResult) -> None:
    groups = result.duplicates_by_group.values()
    result.duplicates = sum(stats.duplicates for stats in groups)
    distinct = sum(stats.distinct for stats in groups)
    result.duplicate_rate = result.duplicates / distinct if distinct else 0.0
    result.duplicate_max = max((stats.max_deliveries for stats in groups), default=0)


def _failover_samples(ledger: _Ledger) -> list[FailoverSample]:
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


def _percentile(samples: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile, None without samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = max(1, math.ceil(fraction * len(ordered) - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]
