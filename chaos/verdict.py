"""The checker's verdict: what `chaos.checker` found, as types, sentences and a summary document.

It owns the shape of a verdict, not the rules: `CheckResult` with its exact counts, the anomaly
records the rules name (at most `ANOMALIES_PER_KIND_MAX` of each kind; the counts stay exact
whatever that bound is), the sentences, and `summary_dict`, the `summary.json` document
(docs/history.md lists its fields) that reports and the command line print. It never reads a
history: chaos/checker.py fills a `CheckResult` from the rules (chaos/checker_rules.py) and
says how many anomalies an expected loss excuses; `violation_sentences` then writes one sentence
per rule that still failed, naming its first example, and a result is valid exactly when there
is none.
"""

from __future__ import annotations

from typing import Any

import msgspec

from chaos.history import Key, Value

# Enough to show a pattern in a report; the counts stay exact whatever this is.
ANOMALIES_PER_KIND_MAX = 50

Position = tuple[str, int, int]  # (topic, partition, offset)


class LostMessage(msgspec.Struct, frozen=True):
    topic: str
    partition: int | None
    offset: int | None
    key: Key
    value: Value
    reason: str


class ReadAnomaly(msgspec.Struct, frozen=True):
    """A value read that should not exist: a phantom or the value of a failed send."""

    topic: str
    partition: int
    offset: int
    value: Value
    reader: str  # the polling process, or "final-read"


class OffsetConflict(msgspec.Struct, frozen=True):
    topic: str
    partition: int
    offset: int
    values: list[Value]


class ValueConflict(msgspec.Struct, frozen=True):
    value: Value
    positions: list[Position]


class OrderViolation(msgspec.Struct, frozen=True):
    """`earlier` completed before `later` was invoked, yet does not precede it in its partition."""

    topic: str
    key: Key
    earlier_value: Value
    earlier_partition: int
    earlier_offset: int
    later_value: Value
    later_partition: int
    later_offset: int


class PollBreak(msgspec.Struct, frozen=True):
    group: str
    member: str
    generation: int | None
    topic: str
    partition: int
    previous_offset: int
    offset: int
    kind: str  # "backwards" or "skip"


class CommitRegression(msgspec.Struct, frozen=True):
    group: str
    topic: str
    partition: int
    earlier_offset: int
    later_offset: int


class Divergence(msgspec.Struct, frozen=True):
    topic: str
    partition: int
    replica: str
    other_replica: str
    offset: int
    entry: list[Any] | None
    other_entry: list[Any] | None


class UnseenMessage(msgspec.Struct, frozen=True):
    group: str
    topic: str
    partition: int | None
    offset: int | None
    value: Value


class DuplicateStats(msgspec.Struct, frozen=True):
    deliveries: int
    distinct: int
    duplicates: int
    rate: float
    max_deliveries: int


class FailoverSample(msgspec.Struct, frozen=True):
    topic: str
    partition: int
    nemesis: str | None
    fault_ns: int
    recovered_ns: int | None  # None: no send on the partition succeeded after the fault
    failover_ms: float | None


class CheckResult(msgspec.Struct, kw_only=True):
    valid: bool
    violations: list[str]
    scenario: str | None = None
    seed: int | None = None
    expect_loss: bool = False
    healed: bool = False
    sends: int = 0
    acknowledged: int = 0
    failed_sends: int = 0
    indeterminate_sends: int = 0
    polls: int = 0
    deliveries: int = 0
    lost: int = 0
    lost_messages: list[LostMessage] = []
    unchecked: int = 0  # acknowledged, not lost, on a partition without a final read
    unchecked_partitions: list[tuple[str, int | None]] = []
    phantom: int = 0
    phantom_reads: list[ReadAnomaly] = []
    failed_reads: int = 0
    failed_read_records: list[ReadAnomaly] = []
    inconsistent_offsets: int = 0
    offset_conflicts: list[OffsetConflict] = []
    value_conflicts: list[ValueConflict] = []
    order_violations: int = 0
    order_breaks: list[OrderViolation] = []
    poll_violations: int = 0
    poll_breaks: list[PollBreak] = []
    commit_regressions: int = 0
    commit_breaks: list[CommitRegression] = []
    divergences: int = 0
    divergent_replicas: list[Divergence] = []
    unseen: int = 0
    unseen_by_group: dict[str, int] = {}
    unseen_messages: list[UnseenMessage] = []
    duplicates: int = 0
    duplicate_rate: float = 0.0
    duplicate_max: int = 0
    duplicates_by_group: dict[str, DuplicateStats] = {}
    faults: int = 0
    failover_ms_p50: float | None = None
    failover_ms_p99: float | None = None
    failover_ms_max: float | None = None
    failovers_unrecovered: int = 0
    failover_samples: list[FailoverSample] = []
    leftover_processes: list[Any] = []
    leftover_shm: list[Any] = []


def _at(topic: str, partition: int | None, offset: int | None) -> str:
    return f"{topic}/{partition}@{offset}"


def violation_sentences(
    result: CheckResult, unexplained_inconsistent: int, unseen_counted: int, excused_polls: int = 0,
    excused_commits: int = 0,
) -> list[str]:
    """One human sentence per rule that failed, naming the first example."""
    sentences = []
    if result.lost and not result.expect_loss:
        first = result.lost_messages[0]
        sentences.append(
            f"{result.lost} acknowledged or consumed sends lost; first: value {first.value!r} key "
            f"{first.key!r} at {_at(first.topic, first.partition, first.offset)}, {first.reason}"
        )
    if result.unchecked:
        places = ", ".join(_at(topic, partition, None).removesuffix("@None")
                           for topic, partition in result.unchecked_partitions[:5])
        sentences.append(
            f"{result.unchecked} acknowledged sends could not be checked: no final read of {places}"
        )
    if result.phantom:
        first = result.phantom_reads[0]
        sentences.append(
            f"{result.phantom} phantom values read that no send invoked; first: {first.value!r} "
            f"at {_at(first.topic, first.partition, first.offset)} read by {first.reader}"
        )
    if result.failed_reads and not result.expect_loss:
        first = result.failed_read_records[0]
        sentences.append(
            f"{result.failed_reads} values of failed sends were read; first: {first.value!r} "
            f"at {_at(first.topic, first.partition, first.offset)} read by {first.reader}"
        )
    if unexplained_inconsistent:
        sentences.append(f"{unexplained_inconsistent} inconsistent offsets; {_first_inconsistency(result)}")
    if result.order_violations:
        first = result.order_breaks[0]
        sentences.append(
            f"{result.order_violations} per-key order violations; first: key {first.key!r} value "
            f"{first.earlier_value!r} at {_at(first.topic, first.earlier_partition, first.earlier_offset)} "
            f"was acknowledged before value {first.later_value!r} was sent, yet the latter is at "
            f"{_at(first.topic, first.later_partition, first.later_offset)}"
        )
    if result.poll_violations > excused_polls:
        first = result.poll_breaks[0]
        sentences.append(
            f"{result.poll_violations} polls went backwards or skipped within a generation; first: group "
            f"{first.group} member {first.member} generation {first.generation} on "
            f"{first.topic}/{first.partition} read offset {first.offset} after {first.previous_offset} "
            f"({first.kind})"
        )
    if result.commit_regressions > excused_commits:
        first = result.commit_breaks[0]
        sentences.append(
            f"{result.commit_regressions} committed offsets went backwards; first: group {first.group} on "
            f"{first.topic}/{first.partition} committed {first.later_offset} after {first.earlier_offset}"
        )
    if result.divergences:
        first = result.divergent_replicas[0]
        sentences.append(
            f"{result.divergences} replica pairs diverge below their high watermarks; first: "
            f"{first.replica} and {first.other_replica} on {first.topic}/{first.partition} at offset "
            f"{first.offset}: {first.entry} vs {first.other_entry}"
        )
    if unseen_counted:
        first = result.unseen_messages[0]
        sentences.append(
            f"{unseen_counted} acknowledged values were never polled after the recovery window; "
            f"first: group {first.group} never saw {first.value!r} at "
            f"{_at(first.topic, first.partition, first.offset)}"
        )
    if result.leftover_processes or result.leftover_shm:
        sentences.append(
            f"the run left {len(result.leftover_processes)} processes and {len(result.leftover_shm)} "
            f"/dev/shm segments behind: {(result.leftover_processes + result.leftover_shm)[:5]}"
        )
    return sentences


def _first_inconsistency(result: CheckResult) -> str:
    if result.offset_conflicts:
        first = result.offset_conflicts[0]
        return f"first: {_at(first.topic, first.partition, first.offset)} holds values {first.values}"
    moved = result.value_conflicts[0]
    places = ", ".join(_at(*position) for position in moved.positions)
    return f"first: value {moved.value!r} seen at {places}"


SUMMARY_FIELDS = (
    "valid", "scenario", "seed", "expect_loss", "healed",
    "sends", "acknowledged", "failed_sends", "indeterminate_sends", "polls", "deliveries",
    "lost", "unchecked", "phantom", "failed_reads", "inconsistent_offsets", "order_violations",
    "poll_violations", "commit_regressions", "divergences", "unseen",
    "duplicates", "duplicate_rate", "duplicate_max",
    "faults", "failover_ms_p50", "failover_ms_p99", "failover_ms_max", "failovers_unrecovered",
)
ANOMALY_FIELDS = (
    "lost_messages", "phantom_reads", "failed_read_records", "offset_conflicts", "value_conflicts",
    "order_breaks", "poll_breaks", "commit_breaks", "divergent_replicas", "unseen_messages",
    "failover_samples",
)


def summary_dict(result: CheckResult) -> dict[str, Any]:
    """The summary.json document: every count, the violations, and the first anomalies of each kind."""
    summary: dict[str, Any] = {name: getattr(result, name) for name in SUMMARY_FIELDS}
    summary["leftover_processes"] = len(result.leftover_processes)
    summary["leftover_shm"] = len(result.leftover_shm)
    summary["unseen_by_group"] = dict(result.unseen_by_group)
    summary["unchecked_partitions"] = [list(place) for place in result.unchecked_partitions]
    summary["duplicates_by_group"] = msgspec.to_builtins(result.duplicates_by_group)
    summary["violations"] = list(result.violations)
    summary["anomalies"] = {name: msgspec.to_builtins(getattr(result, name)) for name in ANOMALY_FIELDS}
    return summary
