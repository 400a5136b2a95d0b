"""Account balances under crashes: a naive consumer double-counts, an idempotent one is exact.

    python -m examples.balances [--bootstrap tcp://127.0.0.1:7411] [--events 300] [--seed 7]

A producer writes deposit and withdraw events keyed by account, so the final balance of every
account is known before anyone consumes. Two consumers (`examples.balance_consumers`) apply the
events to SQLite, committing offsets every `commit_every` records after the side effects. Each
runs as a child process (spawn) that the runner kills with SIGKILL at seeded crash points —
some just after a side effect, some inside its transaction — and restarts, until every event
is consumed. Then the balances are compared with the expected ones:

- naive: each crash after a side effect and before the next commit makes the group redeliver
  records that were already applied, and they are added again. The number of extra applications
  follows from the crash schedule (`expected_double_applied`), and the balances are off;
- idempotent (`railmq.idempotent.IdempotentStore`): the side effect and the message id commit
  together, so a redelivered record is skipped and a crash inside the transaction leaves
  nothing: the balances are exactly right.

Without `--bootstrap` the example starts a local cluster of its own and stops it at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import signal
import tempfile
import time
import uuid
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from examples.balance_consumers import (
    AFTER_APPLY, CRASH_PHASES, IDEMPOTENT, NAIVE, ConsumerJob, CrashPoint, Event, read_balances, run_consumer,
    uncommitted_at,
)
from railmq.admin import Admin
from railmq.producer import Producer

ACCOUNTS_DEFAULT = 8
# A withdrawal is rarer than a deposit, as in a real ledger; amounts are whole currency units.
WITHDRAW_FRACTION = 0.3
AMOUNT_MAX = 500
# How long one child may take to reach its crash point or to finish (a loaded 2-core machine).
CHILD_TIMEOUT_S = 60.0


class ConsumerRuns(msgspec.Struct, kw_only=True):
    runs: int = 0
    kills: list[CrashPoint] = []  # the crash points that were reached, in order


class ExperimentReport(msgspec.Struct, kw_only=True):
    events: int
    commit_every: int
    expected: dict[str, tuple[int, int]]  # account -> (balance, transactions)
    naive: dict[str, tuple[int, int]]
    idempotent: dict[str, tuple[int, int]]
    naive_runs: ConsumerRuns
    idempotent_runs: ConsumerRuns

    def transactions(self, balances: dict[str, tuple[int, int]]) -> int:
        return sum(transactions for _, transactions in balances.values())

    def expected_double_applied(self) -> int:
        """Extra applications the naive consumer must show, given where it was killed."""
        return sum(uncommitted_at(crash, self.commit_every) for crash in self.naive_runs.kills)


# --------------------------------------------------------------------------- events


def make_events(seed: int, count: int, accounts: int = ACCOUNTS_DEFAULT) -> list[Event]:
    rng = random.Random(seed)
    names = [f"acct-{number:02d}" for number in range(accounts)]
    events = []
    for _ in range(count):
        kind = "withdraw" if rng.random() < WITHDRAW_FRACTION else "deposit"
        events.append(Event(account=rng.choice(names), kind=kind, amount=rng.randint(1, AMOUNT_MAX)))
    return events


def expected_balances(events: list[Event]) -> dict[str, tuple[int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for event in events:
        balance, transactions = totals.get(event.account, (0, 0))
        totals[event.account] = (balance + event.signed_amount, transactions + 1)
    return totals


def produce_events(bootstrap: str, topic: str, events: list[Event]) -> dict[int, int]:
    """Write the events keyed by account (acks=all); the end offset of each partition."""
    with Producer(bootstrap, acks="all", idempotent=True, client_id="balances-producer") as producer:
        futures = [producer.send(topic, msgspec.json.encode(event), key=event.account) for event in events]
        acks = [future.result(30) for future in futures]
        partitions = producer.partitions_for(topic)
    ends = {partition: 0 for partition in range(partitions)}
    for ack in acks:
        ends[ack.partition] = max(ends[ack.partition], ack.offset + 1)
    return ends


# --------------------------------------------------------------------------- crashes


def crash_schedule(seed: int, crashes: int, commit_every: int) -> list[CrashPoint]:
    """Seeded crash points. Each falls between commit_every + 1 and 3 × commit_every records into
    its run, so every run commits at least once (the experiment makes progress), and at least one
    comes just after a side effect (the naive consumer is sure to double-count)."""
    rng = random.Random(seed)
    phases = [AFTER_APPLY] + [rng.choice(CRASH_PHASES) for _ in range(crashes - 1)]
    rng.shuffle(phases)
    return [CrashPoint(after_records=rng.randint(commit_every + 1, 3 * commit_every), phase=phase)
            for phase in phases[:crashes]]


def run_with_crashes(job: ConsumerJob, schedule: list[CrashPoint]) -> ConsumerRuns:
    """Run the consumer once per crash point, killing it there, then once more to the end."""
    context = multiprocessing.get_context("spawn")
    outcome = ConsumerRuns()
    for crash in [*schedule, None]:
        crashing = context.Event()
        run = msgspec.structs.replace(job, crash=crash)
        child = context.Process(target=run_consumer, args=(run, crashing), name=f"balances-{job.kind}",
                                daemon=True)
        child.start()
        outcome.runs += 1
        try:
            killed = _kill_at_crash_point(child, crashing) if crash is not None else False
            child.join(CHILD_TIMEOUT_S)
            if child.exitcode != (-signal.SIGKILL if killed else 0):
                raise RuntimeError(f"the {job.kind} consumer ended with exit code {child.exitcode}")
        finally:
            if child.is_alive():
                child.kill()
                child.join(CHILD_TIMEOUT_S)
        if killed:
            outcome.kills.append(crash)
        else:
            break  # it consumed everything before reaching its crash point
    return outcome


def _kill_at_crash_point(child: Any, crashing: Any) -> bool:
    """SIGKILL the child once it reports its crash point; False if it finished first."""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while not crashing.wait(0.05):
        if not child.is_alive():
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"{child.name} reached neither its crash point nor its end")
    os.kill(child.pid, signal.SIGKILL)
    return True


# --------------------------------------------------------------------------- the experiment


def run_experiment(bootstrap: str, topic: str, workdir: str, *, events: int = 300, seed: int = 7,
                   crashes: int = 3, commit_every: int = 10, partitions: int = 3,
                   replication_factor: int = 1) -> ExperimentReport:
    """Create `topic`, produce the events, run both consumers under the same crash schedule."""
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, replication_factor=replication_factor)
    produced = make_events(seed, events)
    ends = produce_events(bootstrap, topic, produced)
    schedule = crash_schedule(seed, crashes, commit_every)
    results: dict[str, tuple[dict, ConsumerRuns]] = {}
    for kind in (NAIVE, IDEMPOTENT):
        database = os.path.join(workdir, f"{kind}.db")
        job = ConsumerJob(kind=kind, bootstrap=bootstrap, topic=topic, group=f"{topic}-{kind}",
                          database=database, commit_every=commit_every, end_offsets=ends)
        runs = run_with_crashes(job, schedule)
        results[kind] = (read_balances(database), runs)
    return ExperimentReport(events=events, commit_every=commit_every, expected=expected_balances(produced),
                            naive=results[NAIVE][0], idempotent=results[IDEMPOTENT][0],
                            naive_runs=results[NAIVE][1], idempotent_runs=results[IDEMPOTENT][1])


def report_table(report: ExperimentReport) -> Table:
    table = Table(title="balances after SIGKILLs", title_justify="left")
    for column in ("account", "expected", "naive", "idempotent"):
        table.add_column(column, justify="left" if column == "account" else "right")
    for account in sorted(report.expected):
        expected = report.expected[account][0]
        naive = report.naive.get(account, (0, 0))[0]
        idempotent = report.idempotent.get(account, (0, 0))[0]
        table.add_row(account, str(expected), _marked(naive, expected), _marked(idempotent, expected))
    table.add_row("events applied", str(report.events),
                  _marked(report.transactions(report.naive), report.events),
                  _marked(report.transactions(report.idempotent), report.events))
    return table


def _marked(value: int, expected: int) -> str:
    return str(value) if value == expected else f"[bold red]{value} ({value - expected:+d})[/]"


def summary_lines(report: ExperimentReport) -> list[str]:
    naive_extra = report.transactions(report.naive) - report.events
    return [
        f"naive: {report.naive_runs.runs} runs, {len(report.naive_runs.kills)} SIGKILLs, "
        f"{naive_extra} events applied twice (the crash points predict {report.expected_double_applied()})",
        f"idempotent: {report.idempotent_runs.runs} runs, {len(report.idempotent_runs.kills)} SIGKILLs, "
        f"{'exact' if report.idempotent == report.expected else 'WRONG'}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.balances", description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="use this cluster instead of starting one")
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--crashes", type=int, default=3)
    parser.add_argument("--commit-every", type=int, default=10)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="railmq-balances-") as workdir:
        cluster = None
        if args.bootstrap is None:
            from railmq.cluster import LocalCluster

            cluster = LocalCluster(nodes=1, data_dir=os.path.join(workdir, "cluster")).start()
        try:
            bootstrap = args.bootstrap or cluster.bootstrap
            topic = f"balances-{uuid.uuid4().hex[:8]}"
            report = run_experiment(bootstrap, topic, workdir, events=args.events, seed=args.seed,
                                    crashes=args.crashes, commit_every=args.commit_every)
        finally:
            if cluster is not None:
                cluster.stop()
    console = Console()
    console.print(report_table(report))
    for line in summary_lines(report):
        console.print(line)
    return 0 if report.idempotent == report.expected else 1


if __name__ == "__main__":
    raise SystemExit(main())
