"""The history checker: reads what every client did and saw during a chaos run and judges it.

It owns the verdict and nothing else: it never talks to a cluster, and it judges a hand-written
history exactly as it judges a recorded one (format: docs/history.md, parsing: chaos.history).
One pass over the lines fills a `Ledger` keyed by value (values are unique across a run); the
rules then run over the ledger. Every rule is linear or n log n, so a history of a million
operations checks in seconds. The rules, after Jepsen's Kafka and queue checkers:

- lost: an `ok` send whose value is missing from the `final-read` of its partition, or present
  there at another offset than acknowledged (then also an inconsistent offset). Without a final
  read of that partition: acknowledged offset below the highest offset any poll returned there,
  and the value never read (Jepsen's rule). A send never acknowledged is lost too when a poll
  read it (it was committed) and the final read of that partition lacks it.
- unchecked: an `ok` send not judged lost whose partition has no final read (a final read that
  could not finish is not written). Nothing shows it survived, so it is a violation: a run is
  never "0 lost" by default.
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
  returned (lost values excluded: they are counted as lost), and values of indeterminate sends
  that the final read holds: a record in the log is owed to every group however its send ended.
  A violation only when the history has a `heal` line, i.e. after the recovery window; a group
  is known by its polls and its assignments (a group assigned partitions that never polled owes
  every value).
- duplicates: per group, deliveries beyond the first of each value (rate = duplicates / distinct
  values delivered, and the most deliveries of one value). Reported, never a violation.
- failover: per leader fault (`fault`, phase start, naming topic and partition, role absent or
  `leader`), the time to the first `ok` send on that partition completed after the fault.
- hygiene: a leftover process or /dev/shm segment is a violation.

`info` and unanswered sends are indeterminate: never lost, never failed. With
`config.expect_loss` lost and failed-read values, and inconsistent offsets that involve lost
values only (a truncated acknowledged write), are reported but are not violations.
Counts are exact; each list of named anomalies keeps the first `ANOMALIES_PER_KIND_MAX`.

The checker is three modules, in the order they run: chaos/checker_ledger.py makes the one
pass over the lines, chaos/checker_rules.py judges the ledger it fills, and this module runs both
and assembles the result. What they produce (the result and anomaly types, the violation
sentences, the summary document) is chaos/verdict.py; its public names are re-exported here.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path
from typing import Any, Iterable, Iterator

from chaos.checker_ledger import Ledger
from chaos.checker_rules import (
    duplicate_stats,
    failover_samples,
    find_bad_reads,
    find_commit_regressions,
    find_divergences,
    find_inconsistencies,
    find_lost,
    find_order_violations,
    find_unchecked,
    find_unseen,
    lossy_partitions,
    percentile,
)
from chaos.history import HistoryLine, iter_typed_history, load_history, typed_line
from chaos.verdict import (
    ANOMALIES_PER_KIND_MAX,
    ANOMALY_FIELDS,
    SUMMARY_FIELDS,
    CheckResult,
    summary_dict,
    violation_sentences,
)

# The verdict's public names are importable from here too (chaos.__main__ and reports do).
__all__ = [
    "ANOMALIES_PER_KIND_MAX", "ANOMALY_FIELDS", "SUMMARY_FIELDS", "CheckResult", "check_file",
    "check_history", "load_history", "summary_dict",
]


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
        ledger = Ledger()
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


def _judge(ledger: Ledger) -> CheckResult:
    lost, lost_values = find_lost(ledger)
    unchecked, unchecked_partitions = find_unchecked(ledger, lost_values)
    phantoms, failed_reads = find_bad_reads(ledger)
    offset_conflicts, value_conflicts, unexplained = find_inconsistencies(ledger, lost_values)
    order = find_order_violations(ledger)
    lossy = lossy_partitions(ledger, lost_values)
    commits, excused_commits = find_commit_regressions(ledger, lossy)
    excused_polls = sum(count for key, count in ledger.poll_breaks_by_partition.items() if key in lossy)
    divergences = find_divergences(ledger)
    unseen, unseen_by_group, unseen_counted = find_unseen(ledger, lost_values)
    by_group = {group: duplicate_stats(counts) for group, counts in sorted(ledger.deliveries.items())}
    samples = failover_samples(ledger)
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
        unchecked=unchecked,
        unchecked_partitions=unchecked_partitions,
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
        failover_ms_p50=percentile(recovered, 0.50),
        failover_ms_p99=percentile(recovered, 0.99),
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


def _count_sends(ledger: Ledger, result: CheckResult) -> None:
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


def _total_duplicates(result: CheckResult) -> None:
    groups = result.duplicates_by_group.values()
    result.duplicates = sum(stats.duplicates for stats in groups)
    distinct = sum(stats.distinct for stats in groups)
    result.duplicate_rate = result.duplicates / distinct if distinct else 0.0
    result.duplicate_max = max((stats.max_deliveries for stats in groups), default=0)
