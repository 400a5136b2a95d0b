"""`IdempotentStore`: apply each message's side effect once, however often the message arrives.

At-least-once delivery (commit the offset after processing) redelivers whatever was processed
but not yet committed when a consumer died. The store makes a redelivery a no-op:
`process(record, handler)` runs one SQLite transaction that

1. skips the record if its message id is already recorded (returns False);
2. otherwise calls `handler(record, connection)`, which makes its change through the store's own
   connection, records the id, and commits (returns True).

The change and the id are committed together or not at all. An exception rolls both back; a
process killed before COMMIT leaves neither (SQLite's write-ahead log ignores a transaction that
never committed). With offsets committed only after `process` returns, the side effect happens
exactly once per message id. The handler must do all its work through `connection`: no commit,
no rollback (a handler that ends the transaction is a programming error, raised as
`TransactionEnded`), no second connection, nothing outside the database that cannot be undone.

Message ids default to `topic/partition/offset@topic_id`: the same on every redelivery of a
record. The topic's id is part of it because a topic deleted and made again under its name
numbers its records from 0 again, and the group reads the new one from its start: with
`topic/partition/offset` alone its records took the ids of the old topic's and were skipped as
redeliveries, never applied. (A record whose topic id is not known, 0, keeps
`topic/partition/offset`.) A record stored twice (a producer retry without idempotence) has two
offsets; when that matters, derive the id from the key or a header (`key_message_id`,
`header_message_id`).

Growth is bounded by `prune(older_than_ms)`, which forgets ids recorded longer ago than that.
It is safe only for ids that can no longer be redelivered: the group must have committed past
them, and no one may rewind the group's offsets that far.

One connection per store, serialised by a lock (calls from several threads take turns); WAL mode
so readers do not block the writer; `synchronous=FULL` by default, so a committed id survives a
power loss as well as a crash (with NORMAL, the last commits can vanish on power loss while their
offsets are already committed, and those messages would never be applied).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from actors.wire_bounds import text_bytes
from railmq.records import ConsumerRecord

MessageId = Callable[[ConsumerRecord], str]
Handler = Callable[[ConsumerRecord, sqlite3.Connection], Any]

# A message id longer than this (in UTF-8 bytes, as stored) is a payload, not an id.
MESSAGE_ID_BYTES_MAX = 1024
# `prune` deletes in transactions of at most this many ids, so a big prune never holds the write
# lock long enough to stall `process`.
PRUNE_BATCH_ROWS_MAX = 10_000
SYNCHRONOUS_MODES = ("FULL", "NORMAL")
IDS_TABLE = "railmq_processed_messages"


def offset_message_id(record: ConsumerRecord) -> str:
    where = f"{record.topic}/{record.partition}/{record.offset}"
    return f"{where}@{record.topic_id}" if record.topic_id else where


def key_message_id(record: ConsumerRecord) -> str:
    if record.key is None:
        raise ValueError(f"{offset_message_id(record)} has no key to use as its message id")
    return record.key.decode("utf-8")


def header_message_id(name: str) -> MessageId:
    """Message ids from the first header called `name` (e.g. a producer-assigned event id)."""
    def from_header(record: ConsumerRecord) -> str:
        for header, value in record.headers or []:
            if header == name:
                return value.decode("utf-8")
        raise ValueError(f"{offset_message_id(record)} has no {name!r} header to use as its message id")
    return from_header


class TransactionEnded(RuntimeError):
    """The handler committed or rolled back the store's transaction itself."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class IdempotentStore:
    def __init__(self, path: str, *, message_id: MessageId = offset_message_id, synchronous: str = "FULL",
                 busy_timeout_ms: int = 5_000, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        if synchronous not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, "
                             f"not {synchronous!r}")
        self.path = path
        self.message_id = message_id
        self.clock_ms = clock_ms
        self._lock = threading.Lock()
        self._owner: int | None = None
        # isolation_level=None: no implicit transactions; this class says BEGIN and COMMIT itself.
        self.connection = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None,
                                          check_same_thread=False)
        self.connection.execute("PRAGMA journal_mode=WAL")
        self.connection.execute(f"PRAGMA synchronous={synchronous}")
        with self.transaction() as connection:
            connection.execute(f"CREATE TABLE IF NOT EXISTS {IDS_TABLE} "
                               "(message_id TEXT PRIMARY KEY, processed_ms INTEGER NOT NULL)")
            connection.execute(f"CREATE INDEX IF NOT EXISTS {IDS_TABLE}_by_time "
                               f"ON {IDS_TABLE} (processed_ms)")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction on the store's connection (for schema setup and reads too):
        committed when the block ends, rolled back if it raises."""
        if self._owner == threading.get_ident():
            raise RuntimeError("the store is already in a transaction in this thread (a handler may not "
                               "call process() or transaction())")
        with self._lock:
            self._owner = threading.get_ident()
            try:
                self.connection.execute("BEGIN IMMEDIATE")  # take the write lock now, not at the first write
                try:
                    yield self.connection
                    if not self.connection.in_transaction:
                        raise TransactionEnded("the transaction was ended inside the block; "
                                               "the store commits it")
                    self.connection.execute("COMMIT")
                except BaseException:
                    if self.connection.in_transaction:
                        self.connection.execute("ROLLBACK")
                    raise
            finally:
                self._owner = None

    def process(self, record: ConsumerRecord, handler: Handler) -> bool:
        """Apply `handler(record, connection)` unless this record's message id was processed;
        True if it was applied now, False if it was skipped as a redelivery."""
        message_id = self.message_id(record)
        if not isinstance(message_id, str) or not 0 < text_bytes(message_id) <= MESSAGE_ID_BYTES_MAX:
            shown = repr(message_id[:64] if isinstance(message_id, str) else message_id)[:100]
            size = f" ({text_bytes(message_id):,} bytes)" if isinstance(message_id, str) else ""
            raise ValueError(f"a message id is a string of 1..{MESSAGE_ID_BYTES_MAX} bytes in UTF-8, "
                             f"got {shown}{size}")
        with self.transaction() as connection:
            if self._seen(connection, message_id):
                return False
            handler(record, connection)
            if not connection.in_transaction:
                raise TransactionEnded(f"the handler for {message_id} ended the store's transaction; "
                                       "its change is committed without the message id")
            connection.execute(f"INSERT INTO {IDS_TABLE} (message_id, processed_ms) VALUES (?, ?)",
                               (message_id, self.clock_ms()))
        return True

    def processed(self, message_id: str) -> bool:
        with self.transaction() as connection:
            return self._seen(connection, message_id)

    @staticmethod
    def _seen(connection: sqlite3.Connection, message_id: str) -> bool:
        row = connection.execute(f"SELECT 1 FROM {IDS_TABLE} WHERE message_id = ?", (message_id,)).fetchone()
        return row is not None

    def count(self) -> int:
        """How many message ids the store remembers."""
        with self.transaction() as connection:
            return connection.execute(f"SELECT COUNT(*) FROM {IDS_TABLE}").fetchone()[0]

    def prune(self, older_than_ms: int) -> int:
        """Forget the ids processed more than `older_than_ms` ago; returns how many were forgotten."""
        if older_than_ms < 0:
            raise ValueError(f"older_than_ms must be zero or more, not {older_than_ms}")
        cutoff_ms = self.clock_ms() - older_than_ms
        forgotten = 0
        while True:
            with self.transaction() as connection:
                deleted = connection.execute(
                    f"DELETE FROM {IDS_TABLE} WHERE rowid IN "
                    f"(SELECT rowid FROM {IDS_TABLE} WHERE processed_ms < ? LIMIT ?)",
                    (cutoff_ms, PRUNE_BATCH_ROWS_MAX)).rowcount
            forgotten += deleted
            if deleted < PRUNE_BATCH_ROWS_MAX:
                return forgotten

    def close(self) -> None:
        with self._lock:
            self.connection.close()

    def __enter__(self) -> "IdempotentStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
