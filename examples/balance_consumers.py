"""The two account-balance consumers of `examples.balances`, each run as a child process.

Both read deposit/withdraw events from one topic as a classic-group member, add each event to a
SQLite `balances` table, and commit offsets to the group every `commit_every` records, after the
side effects (at-least-once). They differ only in how the side effect is applied:

- the naive consumer updates the balance in a transaction of its own. A crash after that update
  but before the next offset commit means the group redelivers the record and it is added again;
- the idempotent consumer applies the update through `railmq.idempotent.IdempotentStore`, which
  records the message id in the same transaction and skips a record it has seen.

Crash injection: a job may carry a `CrashPoint` — "after handling the K-th record of this run,
either just after its side effect committed (`after-apply`) or inside its transaction
(`in-transaction`)". At that point the child sets the `crashing` event and waits; the runner
kills it with SIGKILL. The point is chosen by the runner from a seed, so the number of records
that were applied but not committed at the kill is known in advance (`uncommitted_at`).
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any, Callable

import msgspec

from railmq.consumer import Consumer
from railmq.dlq import known_position, start_at_committed
from railmq.idempotent import IdempotentStore
from railmq.records import ConsumerRecord, TopicPartition

AFTER_APPLY, IN_TRANSACTION = "after-apply", "in-transaction"
CRASH_PHASES = (AFTER_APPLY, IN_TRANSACTION)
NAIVE, IDEMPOTENT = "naive", "idempotent"
POLL_WAIT_MS = 200
# A child waiting at its crash point sleeps in steps this long until the SIGKILL arrives.
AWAIT_KILL_STEP_S = 0.05


class Event(msgspec.Struct, frozen=True):
    account: str
    kind: str  # "deposit" | "withdraw"
    amount: int  # positive; a withdrawal subtracts it

    @property
    def signed_amount(self) -> int:
        return self.amount if self.kind == "deposit" else -self.amount


class CrashPoint(msgspec.Struct, frozen=True):
    after_records: int  # counted from the start of this run of the child
    phase: str  # AFTER_APPLY | IN_TRANSACTION


class ConsumerJob(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # NAIVE | IDEMPOTENT
    bootstrap: str
    topic: str
    group: str
    database: str
    commit_every: int
    end_offsets: dict[int, int]  # stop once every partition is processed up to here
    crash: CrashPoint | None = None
    session_timeout_ms: int = 10_000


_event_decoder = msgspec.json.Decoder(Event)


def uncommitted_at(crash: CrashPoint, commit_every: int) -> int:
    """Records applied but not committed when the child dies at `crash`: the redelivery applies
    them again unless the consumer is idempotent. Commits follow records commit_every, 2 ×
    commit_every, ..., and a crash at record K comes before the commit that record K would make."""
    committed = commit_every * ((crash.after_records - 1) // commit_every)
    applied = crash.after_records if crash.phase == AFTER_APPLY else crash.after_records - 1
    return applied - committed


def update_balance(connection: sqlite3.Connection, event: Event) -> None:
    connection.execute(
        "INSERT INTO balances (account, balance, transactions) VALUES (?, ?, 1) ON CONFLICT (account) "
        "DO UPDATE SET balance = balance + excluded.balance, transactions = transactions + 1",
        (event.account, event.signed_amount))


BALANCES_SCHEMA = ("CREATE TABLE IF NOT EXISTS balances "
                   "(account TEXT PRIMARY KEY, balance INTEGER NOT NULL, transactions INTEGER NOT NULL)")


def read_balances(database: str) -> dict[str, tuple[int, int]]:
    """account -> (balance, transactions applied)."""
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT account, balance, transactions FROM balances").fetchall()
    return {account: (balance, transactions) for account, balance, transactions in rows}


class NaiveBalances:
    """Adds each event in a transaction of its own; knows nothing of redelivery."""

    def __init__(self, database: str) -> None:
        self.connection = sqlite3.connect(database, isolation_level=None)
        self.connection.execute("PRAGMA journal_mode=WAL")
        self.connection.execute(BALANCES_SCHEMA)

    def apply(self, record: ConsumerRecord, inside_transaction: Callable[[], None]) -> None:
        self.connection.execute("BEGIN IMMEDIATE")
        try:
            update_balance(self.connection, _event_decoder.decode(record.value))
            inside_transaction()
            self.connection.execute("COMMIT")
        except BaseException:
            self.connection.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.connection.close()


class IdempotentBalances:
    """Adds each event through the idempotent store: once per message id."""

    def __init__(self, database: str) -> None:
        self.store = IdempotentStore(database)
        with self.store.transaction() as connection:
            connection.execute(BALANCES_SCHEMA)

    def apply(self, record: ConsumerRecord, inside_transaction: Callable[[], None]) -> None:
        def handler(record: ConsumerRecord, connection: sqlite3.Connection) -> None:
            update_balance(connection, _event_decoder.decode(record.value))
            inside_transaction()
        self.store.process(record, handler)

    def close(self) -> None:
        self.store.close()


def await_kill(crashing: Any) -> None:
    """Tell the runner this is the crash point, then wait for its SIGKILL."""
    crashing.set()
    while True:
        time.sleep(AWAIT_KILL_STEP_S)


def run_consumer(job: ConsumerJob, crashing: Any) -> None:
    """The child process: consume until every partition reaches its end offset, then exit."""
    balances = NaiveBalances(job.database) if job.kind == NAIVE else IdempotentBalances(job.database)
    consumer = Consumer(job.bootstrap, group_id=job.group, group_instance_id=f"{job.group}-member",
                        auto_offset_reset="earliest", enable_auto_commit=False,
                        session_timeout_ms=job.session_timeout_ms, client_id=f"balances-{job.kind}")
    try:
        consumer.subscribe([job.topic], on_assign=lambda partitions: start_at_committed(consumer, partitions))
        _consume(job, consumer, balances, crashing)
    finally:
        balances.close()
        consumer.close()


def _consume(job: ConsumerJob, consumer: Consumer, balances: NaiveBalances | IdempotentBalances,
             crashing: Any) -> None:
    handled = 0
    pending: dict[TopicPartition, int] = {}
    while not _caught_up(consumer, job.end_offsets):
        for record in consumer.poll(POLL_WAIT_MS):
            handled += 1
            crash = job.crash if job.crash is not None and job.crash.after_records == handled else None
            in_transaction = crash is not None and crash.phase == IN_TRANSACTION
            balances.apply(record, (lambda: await_kill(crashing)) if in_transaction else (lambda: None))
            if crash is not None:
                await_kill(crashing)  # after the side effect, before the commit that would cover it
            pending[TopicPartition(record.topic, record.partition)] = record.offset + 1
            if handled % job.commit_every == 0:
                consumer.commit(pending)
                pending = {}
    if pending:
        consumer.commit(pending)


def _caught_up(consumer: Consumer, end_offsets: dict[int, int]) -> bool:
    assigned = consumer.assignment()
    if len(assigned) < len(end_offsets):
        return False
    positions = [known_position(consumer, tp) for tp in assigned]
    return all(position is not None and position >= end_offsets[tp.partition]
               for tp, position in zip(assigned, positions))
