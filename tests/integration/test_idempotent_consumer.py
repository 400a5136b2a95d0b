"""The idempotent consumer under crash injection: exact balances, where a naive one double-counts.

Given deposit/withdraw events with known totals, when the naive and the idempotent consumer of
`examples.balances` each run as a child process that is SIGKILLed at the same seeded crash points
(some just after a side effect, some inside its transaction) and restarted until all events are
consumed, then the idempotent balances are exactly right and the naive consumer applied exactly
the records the crash points left uncommitted a second time."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time

import pytest

from examples.balance_consumers import AFTER_APPLY, IN_TRANSACTION, CrashPoint, uncommitted_at
from examples.balances import crash_schedule, run_experiment
from railmq.admin import Admin
from railmq.consumer import Consumer
from railmq.idempotent import IdempotentStore
from railmq.producer import Producer
from railmq.records import ConsumerRecord
from tests.helpers import created_again, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_idempotent_balances_are_exact_while_the_naive_consumer_double_counts(cluster, tmp_path, unique_name):
    report = run_experiment(cluster.bootstrap, unique_name("balances"), str(tmp_path), events=200, seed=11,
                            crashes=3, commit_every=10, partitions=3, replication_factor=2)
    assert len(report.naive_runs.kills) == 3, "every crash point was hit"
    assert report.idempotent_runs.kills == report.naive_runs.kills, "both crashed at the same points"
    assert report.idempotent == report.expected, "balances and transaction counts exactly right"
    double_applied = report.expected_double_applied()
    assert double_applied > 0
    assert report.transactions(report.naive) == report.events + double_applied
    assert {account: balance for account, (balance, _) in report.naive.items()} != {
        account: balance for account, (balance, _) in report.expected.items()}, "the naive balances are off"
    assert [child for child in multiprocessing.active_children() if child.name.startswith("balances-")] == []


def test_crash_points_leave_a_known_number_of_records_applied_but_uncommitted():
    assert uncommitted_at(CrashPoint(after_records=13, phase=AFTER_APPLY), commit_every=10) == 3
    assert uncommitted_at(CrashPoint(after_records=20, phase=AFTER_APPLY), commit_every=10) == 10
    assert uncommitted_at(CrashPoint(after_records=13, phase=IN_TRANSACTION), commit_every=10) == 2
    assert uncommitted_at(CrashPoint(after_records=11, phase=IN_TRANSACTION), commit_every=10) == 0
    for seed in range(50):
        schedule = crash_schedule(seed, crashes=3, commit_every=10)
        assert len(schedule) == 3 and any(crash.phase == AFTER_APPLY for crash in schedule)
        assert all(11 <= crash.after_records <= 30 for crash in schedule), "every run commits at least once"
    assert crash_schedule(5, 3, 10) == crash_schedule(5, 3, 10), "seeded"


def deposit_record() -> ConsumerRecord:
    return ConsumerRecord(timestamp_ms=0, key=b"alice", value=b"10", topic="payments", partition=0, offset=4)


def insert_deposit(record: ConsumerRecord, connection: sqlite3.Connection) -> None:
    connection.execute("INSERT INTO balances VALUES (?, ?)", (record.key.decode(), int(record.value)))


def deposit_then_wait_for_the_kill(database: str, inside) -> None:
    store = IdempotentStore(database)
    with store.transaction() as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, balance INTEGER)")
    record = deposit_record()

    def handler(record, connection) -> None:
        insert_deposit(record, connection)
        inside.set()
        signal.pause()  # the parent's SIGKILL arrives here, before COMMIT

    store.process(record, handler)


def test_a_process_killed_inside_the_transaction_leaves_neither_the_change_nor_the_id(tmp_path):
    database = str(tmp_path / "store.db")
    context = multiprocessing.get_context("spawn")
    inside = context.Event()
    child = context.Process(target=deposit_then_wait_for_the_kill, args=(database, inside), daemon=True)
    child.start()
    try:
        assert inside.wait(30), "the child never reached its handler"
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)
    assert child.exitcode == -signal.SIGKILL
    with IdempotentStore(database) as store:
        assert not store.processed("payments/0/4")
        with store.transaction() as connection:
            assert connection.execute("SELECT COUNT(*) FROM balances").fetchone()[0] == 0
        assert store.process(deposit_record(), insert_deposit), "the redelivery applies it"
    with sqlite3.connect(database) as connection:
        assert connection.execute("SELECT balance FROM balances").fetchall() == [(10,)]


def apply_once(bootstrap: str, topic: str, store: IdempotentStore, expected: int) -> list[bool]:
    """Read the group's records, apply each through the store, commit; whether each was applied."""
    applied: list[bool] = []
    with Consumer(bootstrap, group_id=f"{topic}-balances", auto_offset_reset="earliest",
                  enable_auto_commit=False, session_timeout_ms=1000, heartbeat_interval_ms=100) as consumer:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(applied) < expected and time.monotonic() < deadline:
            records = consumer.poll(100)
            applied += [store.process(record, insert_deposit) for record in records]
            if records:
                consumer.commit()
    return applied


def test_a_topic_deleted_and_made_again_under_its_name_is_applied_not_skipped_as_redelivered(
        cluster, tmp_path, unique_name):
    """The group reads the new topic from its start (its committed offsets were of the old one),
    and the records come at offsets the store had seen: with ids of topic, partition and offset
    only, all 5 were skipped as redeliveries and never applied."""
    topic = unique_name("payments")
    store = IdempotentStore(str(tmp_path / "balances.db"))
    with store.transaction() as connection:
        connection.execute("CREATE TABLE balances (account TEXT, amount INTEGER)")
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
        produce_deposits(cluster.bootstrap, topic, 5)
        assert apply_once(cluster.bootstrap, topic, store, 5) == [True] * 5
        admin.delete_topic(topic)
        wait_for(lambda: created_again(admin, topic), timeout_s=30, what=f"{topic} to be made again")
    produce_deposits(cluster.bootstrap, topic, 5)

    applied = apply_once(cluster.bootstrap, topic, store, 5)

    assert applied == [True] * 5, "every record of the new topic applied once"
    with store.transaction() as connection:
        assert connection.execute("SELECT COUNT(*) FROM balances").fetchone()[0] == 10
    store.close()


def produce_deposits(bootstrap: str, topic: str, count: int) -> None:
    with Producer(bootstrap, acks="all") as producer:
        for _ in range(count):
            producer.send(topic, "10", key="alice", partition=0)
        producer.flush(30)
