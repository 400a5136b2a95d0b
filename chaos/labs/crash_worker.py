"""A group member that crashes itself on purpose, and the loop that keeps restarting it.

`run_until_done(spec)` starts `crash_member_main` as a process (the forkserver context the
cluster's actors come from), and starts it again every time it dies, until one incarnation has
committed every record of the topic and exits 0. Inside, the member reads one partition in a
classic group (static membership, KIP-345, so a restarted incarnation takes its place at once)
and, for every record, in the order the delivery policy says:

- `after` (at-least-once): process, then draw the crash, then commit (every record or every
  `commit_every`) — a crash replays what was processed since the last commit;
- `before` (at-most-once): commit, then draw the crash, then process — a crash loses the record.

The crash is a SIGKILL the process sends itself with probability `crash_probability` per record,
drawn from a `random.Random` seeded per incarnation, so a run is repeatable. "Processing" is
either a line in the member's log, or a balance update in SQLite, done naively or through
`railmq.idempotent.IdempotentStore` (lab 12). Every event is one `os.write` to the log before
the step it describes, so a SIGKILL cannot lose the record of what was done:

    P <offset>        processed (the side effect happened)
    C <next offset>   committed (after the broker's acknowledgement)
    X <uncommitted>   about to die: processed records not covered by a commit
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import time
from dataclasses import dataclass, field

import msgspec

from chaos.workload import exit_when_parent_dies
from transport.supervisor import process_context

AFTER, BEFORE = "after", "before"
PLAIN, NAIVE_BALANCE, IDEMPOTENT_BALANCE = "log", "naive-balance", "idempotent-balance"
# One incarnation has this long to finish or die before the run is declared stuck.
INCARNATION_TIMEOUT_S = 60.0
SESSION_TIMEOUT_MS = 6000


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    bootstrap: str
    topic: str
    group: str
    end_offset: int  # the partition's records are [0, end_offset)
    log_path: str
    delivery: str = AFTER
    commit_every: int = 1
    crash_probability: float = 0.0
    seed: int = 0
    incarnation: int = 1
    processing: str = PLAIN
    database: str = ""


class WorkerLogError(RuntimeError):
    """The member's log contradicts itself (a bug in the worker, never an outcome of the lab)."""


@dataclass
class WorkerRun:
    incarnations: int = 0
    processed: list[int] = field(default_factory=list)  # offsets, in processing order, every incarnation
    commits: list[int] = field(default_factory=list)
    crashes_uncommitted: list[int] = field(default_factory=list)  # per crash: processed, not committed
    elapsed_s: float = 0.0

    @property
    def crashes(self) -> int:
        return len(self.crashes_uncommitted)

    @property
    def duplicates(self) -> int:
        return len(self.processed) - len(set(self.processed))

    def lost(self, end_offset: int) -> list[int]:
        return sorted(set(range(end_offset)) - set(self.processed))


class _Log:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def line(self, kind: str, number: int) -> None:
        os.write(self.fd, f"{kind} {number}\n".encode())


def _apply_balance(connection: sqlite3.Connection, record) -> None:
    account, amount = record.value.decode().split(":")
    connection.execute("INSERT INTO balances (account, balance, applied) VALUES (?, ?, 1) "
                       "ON CONFLICT(account) DO UPDATE SET balance = balance + excluded.balance, "
                       "applied = applied + 1", (account, int(amount)))


def open_balances(path: str) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("CREATE TABLE IF NOT EXISTS balances "
                       "(account TEXT PRIMARY KEY, balance INTEGER NOT NULL, applied INTEGER NOT NULL)")
    return connection


def read_balances(path: str) -> dict[str, tuple[int, int]]:
    with sqlite3.connect(path) as connection:
        return {account: (balance, applied) for account, balance, applied
                in connection.execute("SELECT account, balance, applied FROM balances")}


class _Processor:
    """What "processing a record" means for this run (called after the `P` line is written)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.kind = spec.processing
        self.store = None
        self.connection = None
        if self.kind == IDEMPOTENT_BALANCE:
            from railmq.idempotent import IdempotentStore

            self.store = IdempotentStore(spec.database)
            with self.store.transaction() as connection:
                connection.execute("CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, "
                                   "balance INTEGER NOT NULL, applied INTEGER NOT NULL)")
        elif self.kind == NAIVE_BALANCE:
            self.connection = open_balances(spec.database)

    def __call__(self, record) -> None:
        if self.store is not None:
            self.store.process(record, lambda record, connection: _apply_balance(connection, record))
        elif self.connection is not None:
            _apply_balance(self.connection, record)  # committed at once: the side effect is out


def crash_member_main(spec_bytes: bytes) -> None:
    """Entry point of one incarnation; exits 0 once everything is committed, else is killed."""
    from railmq.consumer import Consumer
    from railmq.records import TopicPartition

    exit_when_parent_dies()
    spec = msgspec.msgpack.decode(spec_bytes, type=WorkerSpec)
    rng = random.Random(spec.seed * 1_000_003 + spec.incarnation)
    log, process = _Log(spec.log_path), _Processor(spec)
    consumer = Consumer(spec.bootstrap, group_id=spec.group, group_instance_id="lab-worker",
                        client_id=f"lab-worker-{spec.incarnation}", auto_offset_reset="earliest",
                        enable_auto_commit=False, session_timeout_ms=SESSION_TIMEOUT_MS,
                        heartbeat_interval_ms=SESSION_TIMEOUT_MS // 6, max_poll_records=50)
    tp = TopicPartition(spec.topic, 0)
    consumer.subscribe([spec.topic])
    committed, since_commit = -1, 0

    def crash_maybe(uncommitted: int) -> None:
        if spec.crash_probability and rng.random() < spec.crash_probability:
            log.line("X", uncommitted)
            os.kill(os.getpid(), signal.SIGKILL)

    def commit(offset: int) -> None:
        nonlocal committed
        consumer.commit({tp: offset})
        committed = offset
        log.line("C", offset)

    while committed < spec.end_offset:
        for record in consumer.poll(200):
            if spec.delivery == BEFORE:
                commit(record.offset + 1)
                crash_maybe(0)  # committed and not yet processed: this record is lost
                log.line("P", record.offset)
                process(record)
                continue
            log.line("P", record.offset)
            process(record)
            since_commit += 1
            crash_maybe(since_commit)
            if since_commit >= spec.commit_every or record.offset + 1 >= spec.end_offset:
                commit(record.offset + 1)
                since_commit = 0
    consumer.close()


def read_worker_log(path: str, run: WorkerRun) -> None:
    with open(path, encoding="ascii") as handle:
        for line in handle:
            kind, _, number = line.strip().partition(" ")
            if kind == "P":
                run.processed.append(int(number))
            elif kind == "C":
                run.commits.append(int(number))
            elif kind == "X":
                run.crashes_uncommitted.append(int(number))
            elif kind:
                raise WorkerLogError(f"unknown line {line!r} in {path}")


def run_until_done(spec: WorkerSpec, incarnations_max: int = 500) -> WorkerRun:
    """Start incarnations of the member until one commits everything; return what they did."""
    context = process_context()
    run, started = WorkerRun(), time.monotonic()
    if os.path.exists(spec.log_path):
        os.unlink(spec.log_path)
    for incarnation in range(1, incarnations_max + 1):
        spec_bytes = msgspec.msgpack.encode(msgspec.structs.replace(spec, incarnation=incarnation))
        child = context.Process(target=crash_member_main, args=(spec_bytes,),
                                name=f"lab-worker-{incarnation}", daemon=True)
        child.start()
        run.incarnations = incarnation
        try:
            child.join(INCARNATION_TIMEOUT_S)
        finally:
            if child.is_alive():
                child.kill()
                child.join(5)
        if child.exitcode == 0:
            break
        if child.exitcode != -signal.SIGKILL:
            raise WorkerLogError(f"incarnation {incarnation} ended with exit code {child.exitcode}")
    else:
        raise WorkerLogError(f"{incarnations_max} incarnations did not finish the partition")
    read_worker_log(spec.log_path, run)
    run.elapsed_s = time.monotonic() - started
    return run
