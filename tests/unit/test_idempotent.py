"""The idempotent store: a side effect and its message id commit together or not at all.

Given a balances table in the store's database, when the same record is processed twice, then
the balance moves once; when the handler raises, then neither the change nor the id remains and
a later delivery applies it."""

from __future__ import annotations

import sqlite3
import threading

import msgspec
import pytest

from railmq.idempotent import (
    IDS_TABLE, MESSAGE_ID_BYTES_MAX, PRUNE_BATCH_ROWS_MAX, IdempotentStore, TransactionEnded, header_message_id,
    key_message_id, offset_message_id,
)
from railmq.records import ConsumerRecord


def deposit(offset: int, amount: int = 10, *, account: str = "alice", headers=None) -> ConsumerRecord:
    return ConsumerRecord(timestamp_ms=0, key=account.encode(), value=str(amount).encode(), headers=headers,
                          topic="payments", partition=0, offset=offset)


def apply_deposit(record: ConsumerRecord, connection: sqlite3.Connection) -> None:
    connection.execute("INSERT INTO balances (account, balance) VALUES (?, ?) "
                       "ON CONFLICT (account) DO UPDATE SET balance = balance + excluded.balance",
                       (record.key.decode(), int(record.value)))


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def open_store(tmp_path):
    stores: list[IdempotentStore] = []

    def open_(**options) -> IdempotentStore:
        store = IdempotentStore(str(tmp_path / "consumer.db"), **options)
        with store.transaction() as connection:
            connection.execute("CREATE TABLE IF NOT EXISTS balances "
                               "(account TEXT PRIMARY KEY, balance INTEGER)")
        stores.append(store)
        return store

    try:
        yield open_
    finally:
        for store in stores:
            store.close()


def balance(store: IdempotentStore, account: str = "alice") -> int | None:
    with store.transaction() as connection:
        row = connection.execute("SELECT balance FROM balances WHERE account = ?", (account,)).fetchone()
    return None if row is None else row[0]


def test_applying_a_record_twice_applies_it_once(open_store):
    store = open_store()
    assert store.process(deposit(1), apply_deposit) is True
    assert store.process(deposit(1), apply_deposit) is False
    assert store.process(deposit(2), apply_deposit) is True
    assert balance(store) == 20
    assert store.processed("payments/0/1") and not store.processed("payments/0/3")
    assert store.count() == 2


def test_a_handler_exception_rolls_back_the_change_and_the_id(open_store):
    store = open_store()

    def fails_after_writing(record, connection):
        apply_deposit(record, connection)
        raise RuntimeError("the process dies here")

    with pytest.raises(RuntimeError):
        store.process(deposit(1), fails_after_writing)
    assert balance(store) is None and not store.processed("payments/0/1")
    assert store.process(deposit(1), apply_deposit) is True, "the redelivery applies it"
    assert balance(store) == 10


def test_the_ids_survive_reopening_the_database(open_store):
    first = open_store()
    first.process(deposit(1), apply_deposit)
    first.close()
    again = open_store()
    assert again.process(deposit(1), apply_deposit) is False
    assert balance(again) == 10


def test_the_database_is_in_wal_mode_with_full_sync(open_store):
    store = open_store()
    assert store.connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.connection.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    with pytest.raises(ValueError):
        open_store(synchronous="OFF")


def test_a_handler_that_commits_by_itself_is_a_programming_error(open_store):
    store = open_store()

    def commits(record, connection):
        apply_deposit(record, connection)
        connection.execute("COMMIT")

    with pytest.raises(TransactionEnded):
        store.process(deposit(1), commits)
    assert not store.processed("payments/0/1")


def test_processing_from_inside_a_handler_raises_instead_of_deadlocking(open_store):
    store = open_store()

    def nested(record, connection):
        store.process(deposit(99), apply_deposit)

    with pytest.raises(RuntimeError, match="already in a transaction"):
        store.process(deposit(1), nested)
    assert store.count() == 0


def test_message_ids_from_a_header_or_the_key_dedupe_a_record_stored_twice(open_store):
    store = open_store(message_id=header_message_id("event-id"))
    twice = [deposit(offset, headers=[("event-id", b"e-1")]) for offset in (5, 6)]  # a producer retry
    assert [store.process(record, apply_deposit) for record in twice] == [True, False]
    assert balance(store) == 10
    with pytest.raises(ValueError, match="no 'event-id' header"):
        store.process(deposit(7), apply_deposit)
    assert key_message_id(deposit(1, account="bob")) == "bob"
    assert offset_message_id(deposit(3)) == "payments/0/3"


def test_the_same_offset_of_a_topic_made_again_under_its_name_is_another_message(open_store):
    store = open_store()
    old, new = (msgspec.structs.replace(deposit(3), topic_id=topic_id) for topic_id in (41, 42))
    assert offset_message_id(new) == "payments/0/3@42"
    assert [store.process(record, apply_deposit) for record in (old, old, new)] == [True, False, True]
    assert balance(store) == 20


def test_a_message_id_must_be_a_short_string(open_store):
    store = open_store(message_id=lambda record: "x" * 2_000)
    with pytest.raises(ValueError):
        store.process(deposit(1), apply_deposit)
    assert balance(store) is None


def test_a_message_id_is_bounded_in_bytes_and_a_refused_one_is_not_echoed_whole(open_store):
    """The bound counted characters: 1,024 characters above U+FFFF (a producer's header) were
    stored as a 4 KiB id, four times the bound; and the refusal of a megabyte header quoted all of
    it in its message."""
    wide = "\U0001F600" * MESSAGE_ID_BYTES_MAX
    store = open_store(message_id=header_message_id("event-id"))
    with pytest.raises(ValueError, match="bytes"):
        store.process(deposit(1, headers=[("event-id", wide.encode())]), apply_deposit)
    with pytest.raises(ValueError) as refused:
        store.process(deposit(2, headers=[("event-id", b"y" * 1_000_000)]), apply_deposit)
    assert len(str(refused.value)) < 500
    assert store.process(deposit(3, headers=[("event-id", "\U0001F600".encode() * 256)]), apply_deposit)
    assert balance(store) == 10


def test_prune_forgets_only_ids_older_than_asked(open_store):
    clock = Clock()
    store = open_store(clock_ms=clock)
    store.process(deposit(1), apply_deposit)
    clock.now_ms += 60_000
    store.process(deposit(2), apply_deposit)
    clock.now_ms += 1_000
    assert store.prune(older_than_ms=30_000) == 1
    assert not store.processed("payments/0/1") and store.processed("payments/0/2")
    with pytest.raises(ValueError):
        store.prune(-1)


def test_prune_works_in_bounded_batches(open_store):
    clock = Clock()
    store = open_store(clock_ms=clock)
    rows = PRUNE_BATCH_ROWS_MAX + 5
    with store.transaction() as connection:
        connection.executemany(f"INSERT INTO {IDS_TABLE} VALUES (?, ?)",
                               ((f"id-{number}", 0) for number in range(rows)))
    assert store.prune(older_than_ms=1) == rows
    assert store.count() == 0


def test_threads_sharing_a_store_apply_each_record_once(open_store):
    store = open_store()
    records = [deposit(offset, amount=1) for offset in range(200)]
    applied: list[bool] = []
    lock = threading.Lock()

    def worker() -> None:
        for record in records:
            outcome = store.process(record, apply_deposit)
            with lock:
                applied.append(outcome)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert applied.count(True) == 200 and applied.count(False) == 600
    assert balance(store) == 200
