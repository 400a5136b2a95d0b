"""Retries for classic-group handlers, and the way out when they run out: the dead-letter topic.

A classic group commits one offset per partition, so a record whose handler always fails blocks
its partition for good unless something gives up on it. `RetryingHandler` wraps a handler: it
retries a failure with capped exponential backoff and jitter (`RetryPolicy`); when the attempts
run out it publishes the record to the dead-letter topic in the shared format of `railmq.dlq`
(reason `retries-exhausted`), waits until every in-sync replica has it, and returns normally so
the caller commits past the record. An exception outside `retry_on` is not worth retrying: the
record is dead-lettered at once, reason `rejected`.

Invariant: the wrapper never returns normally for a record that is neither handled nor in the
DLQ. If the dead-letter write fails, `DeadLetterFailed` propagates, and the caller must not
commit past the record (it is delivered again, and retried again). Dead-lettering is therefore
at-least-once: a consumer that dies between the DLQ's acknowledgement and its own commit
dead-letters the record again when it is redelivered.

Retrying blocks the poll loop, on purpose. Pausing the partition instead would mean polling from
inside the handler and interleaving other partitions' records with a retry in progress; railmq
keeps the simple form and bounds it instead. `RetryPolicy.retry_budget_ms()` is the longest a
record can sleep between its attempts, and a member must fit max_poll_records × (that budget +
attempts × handler time) inside max_poll_interval_ms, or the group evicts it in the middle of a
retry and another member starts the record over. `check_poll_interval` says whether it fits:
a long retry budget needs a larger max_poll_interval_ms or a smaller max_poll_records.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import msgspec

from actors.dead_letter_records import DEAD_LETTER_HEADERS_BYTES_MAX
from actors.errors import ErrorCode, RailmqError
from actors.limits import Limits
from actors.messages import RefreshMetadata, TopicConfig, TopicMetadata
from railmq.admin import Admin
from railmq.dlq import REASON_REJECTED, REASON_RETRIES_EXHAUSTED, DeadLetter, default_dlq_topic
from railmq.member_notices import dead_letter_line, retry_line
from railmq.producer import Producer, RecordMetadata
from railmq.records import ConsumerRecord

# More attempts than this is not retrying a failure, it is storing the record in the consumer.
RETRY_ATTEMPTS_MAX = 100
# A DLQ's replication factor is its source's, but never more than this (Kafka's usual 3).
DLQ_REPLICATION_FACTOR_MAX = 3
# How long a dead-letter write may wait for every in-sync replica's acknowledgement.
DEAD_LETTER_ACK_TIMEOUT_MS = 30_000
# While a producer learns of a DLQ's new partitions, it is asked again this often.
METADATA_RECHECK_S = 0.05
# The writer's own producer takes records up to the largest batch any topic may take (a topic's
# batch_bytes_max is at most fetch_bytes_max): the DLQ topic, not the producer, sets the limit.
DEAD_LETTER_PRODUCER_BATCH_BYTES_MAX = Limits().fetch_bytes_max


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry: `attempts` calls in all, the n-th retry waiting
    min(backoff_max_ms, backoff_ms × multiplier^(n-1)), ± `jitter` of it, never above the cap."""

    attempts: int = 5
    backoff_ms: int = 100
    multiplier: float = 2.0
    backoff_max_ms: int = 10_000
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if not 1 <= self.attempts <= RETRY_ATTEMPTS_MAX:
            raise ValueError(f"attempts must be 1..{RETRY_ATTEMPTS_MAX}, not {self.attempts}")
        if self.backoff_ms < 0 or self.backoff_max_ms < self.backoff_ms:
            raise ValueError(f"need 0 <= backoff_ms <= backoff_max_ms, got {self.backoff_ms} "
                             f"and {self.backoff_max_ms}")
        if self.multiplier < 1:
            raise ValueError(f"the multiplier must be at least 1, not {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter is a fraction in [0, 1], not {self.jitter}")
        if not self.retry_on or not all(isinstance(kind, type) and issubclass(kind, BaseException)
                                        for kind in self.retry_on):
            raise ValueError("retry_on must be a non-empty tuple of exception classes")

    def retries(self, error: BaseException) -> bool:
        return isinstance(error, self.retry_on)

    def base_backoff_ms(self, retry: int) -> float:
        """The backoff before retry number `retry` (1 = after the first failure), without jitter."""
        delay = float(self.backoff_ms)
        for _ in range(retry - 1):
            delay = min(float(self.backoff_max_ms), delay * self.multiplier)  # stepwise: never overflows
        return min(float(self.backoff_max_ms), delay)

    def backoff_before_ms(self, retry: int, rng: random.Random) -> int:
        spread = self.jitter * (2 * rng.random() - 1)
        return int(min(self.backoff_max_ms, max(0.0, round(self.base_backoff_ms(retry) * (1 + spread)))))

    def retry_budget_ms(self) -> int:
        """The longest one record can spend sleeping between its attempts (jitter at its worst)."""
        return sum(int(min(self.backoff_max_ms, round(self.base_backoff_ms(retry) * (1 + self.jitter))))
                   for retry in range(1, self.attempts))

    def check_poll_interval(self, max_poll_interval_ms: int, max_poll_records: int,
                            handler_time_max_ms: int = 0) -> None:
        """ValueError when a poll's worth of failing records could outlast max_poll_interval_ms."""
        worst_ms = max_poll_records * (self.retry_budget_ms() + self.attempts * handler_time_max_ms)
        if worst_ms >= max_poll_interval_ms:
            raise ValueError(
                f"{max_poll_records} failing records could take {worst_ms} ms between two polls, but the "
                f"group evicts a member after max_poll_interval_ms={max_poll_interval_ms}: raise it, lower "
                f"max_poll_records, or shorten the retry budget ({self.retry_budget_ms()} ms per record)")


class DeadLetterFailed(RailmqError):
    """A record could not be written to its dead-letter topic: do not commit past it."""

    def __init__(self, message: str, code: int = ErrorCode.UNKNOWN_SERVER_ERROR) -> None:
        super().__init__(code, message)


class Outcome(msgspec.Struct, frozen=True):
    status: str  # "handled" | "dead-lettered"
    attempts: int
    dead_letters: tuple[RecordMetadata, ...] = ()  # where each record went, when dead-lettered


class RetryingHandler:
    """`handler(record)` with retries; a record that keeps failing goes to the DLQ."""

    def __init__(self, handler: Callable[[ConsumerRecord], Any], policy: RetryPolicy,
                 dead_letters: "DeadLetterWriter", group: str, *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], int] = wall_clock_ms, rng: random.Random | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.handler = handler
        self.say = say  # told each retry and each dead letter, as one line (railmq/member_notices.py)
        self.policy = policy
        self.dead_letters = dead_letters
        self.group = group
        self.sleep = sleep
        self.clock = clock  # wall-clock milliseconds, for the dead-letter timestamps
        self.rng = rng or random.Random()
        self.handled = 0
        self.retried = 0
        self.dead_lettered = 0

    def __call__(self, record: ConsumerRecord) -> Outcome:
        return self.run_unit([record], lambda: self.handler(record))

    def run_unit(self, records: list[ConsumerRecord], call: Callable[[], Any]) -> Outcome:
        """Run `call` (which handles `records`) with retries; dead-letter every one of the records
        if it keeps failing."""
        first_delivery_ms = self.clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                call()
            except Exception as error:
                if not self.policy.retries(error):
                    return self._give_up(records, REASON_REJECTED, attempt, error, first_delivery_ms)
                if attempt >= self.policy.attempts:
                    return self._give_up(records, REASON_RETRIES_EXHAUSTED, attempt, error, first_delivery_ms)
                self.retried += 1
                backoff_ms = self.policy.backoff_before_ms(attempt, self.rng)
                if self.say is not None:
                    self.say(retry_line(_where(records), attempt, self.policy.attempts, backoff_ms, error))
                self.sleep(backoff_ms / 1000)
                continue
            self.handled += len(records)
            return Outcome("handled", attempt)

    def _give_up(self, records: list[ConsumerRecord], reason: str, attempts: int, error: Exception,
                 first_delivery_ms: int) -> Outcome:
        written = []
        for record in records:
            letter = DeadLetter.of_failure(record, group=self.group, reason=reason, attempts=attempts,
                                           last_error=error_repr(error), first_delivery_ms=first_delivery_ms,
                                           dead_lettered_ms=self.clock())
            written.append(self.dead_letters.write(letter))
            self.dead_lettered += 1
            if self.say is not None:
                where = written[-1]
                self.say(dead_letter_line(_where([record]), f"{where.topic}/{where.partition}@{where.offset}",
                                          attempts, reason, error))
        return Outcome("dead-lettered", attempts, tuple(written))


def error_repr(error: BaseException) -> str:
    """The dead letter's last error: repr(error), or what can be said when the exception's own
    repr() (and str()) fails. Raised from _give_up, that failure was the handler's again on every
    redelivery: the record was never dead-lettered and its consumer never got past it."""
    try:
        return repr(error)
    except Exception:
        pass
    try:
        return f"{type(error).__name__}({str(error)!r})"
    except Exception:
        return f"<{type(error).__name__}: str() and repr() failed>"


def _where(records: list[ConsumerRecord]) -> str:
    first = records[0]
    more = f" (+{len(records) - 1} more)" if len(records) > 1 else ""
    return f"{first.topic}/{first.partition}@{first.offset}{more}"


def retrying_delivery(policy: RetryPolicy, dead_letters: "DeadLetterWriter", group: str,
                      **options: Any) -> Callable[[Callable[[list[ConsumerRecord]], Any]], Callable]:
    """A `wrap_delivery` for `railmq.member_process.run_group_member`: each unit (one record, or a
    polled batch with a per-batch handler) is retried as a whole and, when it keeps failing,
    every record of it is dead-lettered — use a per-record handler to isolate poison records."""
    def wrap(delivery: Callable[[list[ConsumerRecord]], Any]) -> Callable[[list[ConsumerRecord]], None]:
        retrying = RetryingHandler(lambda record: delivery([record]), policy, dead_letters, group, **options)

        def deliver(records: list[ConsumerRecord]) -> None:
            retrying.run_unit(records, lambda: delivery(records))
        return deliver
    return wrap


# --------------------------------------------------------------------------- writing dead letters


def ensure_dead_letter_topic(admin: Admin, source_topic: str, dlq_topic: str) -> TopicMetadata:
    """The DLQ topic, created (or grown) to match its source, so that partition p of the source
    dead-letters into partition p of the DLQ; replication min(3, the source's)."""
    source = admin.describe_topic(source_topic)
    count = len(source.partitions)
    try:
        dlq = admin.describe_topic(dlq_topic)
    except RailmqError as error:
        if error.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise
        dlq = _create_dead_letter_topic(admin, source, dlq_topic)
    if len(dlq.partitions) < count:
        admin.create_partitions(dlq_topic, count)
        dlq = admin.describe_topic(dlq_topic)
    return dlq


def _create_dead_letter_topic(admin: Admin, source: TopicMetadata, dlq_topic: str) -> TopicMetadata:
    """Make the DLQ topic (or take the one another writer made first). Its batches may be
    DEAD_LETTER_HEADERS_BYTES_MAX larger than its source's; a cluster whose fetch_bytes_max
    refuses that (INVALID_CONFIG) gets the source's own limit."""
    replication = min(DLQ_REPLICATION_FACTOR_MAX, len(source.partitions[0].replicas))
    min_insync = min(source.config.min_insync_replicas, replication)
    own = source.config.batch_bytes_max
    candidates = [own + DEAD_LETTER_HEADERS_BYTES_MAX, own]
    for batch_bytes_max in candidates:
        config = TopicConfig(min_insync_replicas=min_insync, batch_bytes_max=batch_bytes_max)
        try:
            return admin.create_topic(dlq_topic, len(source.partitions), replication, config)
        except RailmqError as refusal:
            if refusal.code == ErrorCode.TOPIC_ALREADY_EXISTS:
                return admin.wait_for_leaders(dlq_topic)  # another writer created it first: use theirs
            if refusal.code != ErrorCode.INVALID_CONFIG or batch_bytes_max == candidates[-1]:
                raise
    raise AssertionError("unreachable: the last limit either makes the topic or raises")


class DeadLetterWriter:
    """Writes dead letters through an acks=all producer and waits for each acknowledgement.

    The DLQ topic of a source topic is `topic_for(source)`, created on first use."""

    def __init__(self, producer: Producer, topic_for: Callable[[str], str] = default_dlq_topic, *,
                 admin: Admin | None = None, ack_timeout_ms: int = DEAD_LETTER_ACK_TIMEOUT_MS) -> None:
        # The producer's acks is fixed at construction; a weaker one could lose a dead letter
        # after the source record was committed past, so it is refused here.
        if producer._actor.settings.acks != -1:
            raise ValueError("a dead-letter writer needs a producer with acks='all'")
        self.producer = producer
        self.topic_for = topic_for
        self.ack_timeout_s = ack_timeout_ms / 1000
        self._admin = admin
        self._owns_admin = admin is None
        self._owns_producer = False
        # (source, dlq) -> the DLQ's partition count when last checked: one entry per source topic.
        self._partitions: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, bootstrap: str,
                topic_for: Callable[[str], str] = default_dlq_topic) -> "DeadLetterWriter":
        """A writer with a producer of its own (acks=all, idempotent), closed with the writer."""
        producer = Producer(bootstrap, acks="all", idempotent=True, client_id="railmq-dead-letters",
                            batch_bytes_max=DEAD_LETTER_PRODUCER_BATCH_BYTES_MAX)
        writer = cls(producer, topic_for)
        writer._owns_producer = True
        return writer

    def write(self, letter: DeadLetter) -> RecordMetadata:
        """Publish one dead letter into partition `source_partition` of its DLQ topic; return
        once every in-sync replica has it. Raises DeadLetterFailed otherwise."""
        topic = self.topic_for(letter.source_topic)
        try:
            self._ensure_topic(letter.source_topic, topic, letter.source_partition)
            future = self.producer.send(topic, letter.value, key=letter.key, headers=letter.record_headers(),
                                        partition=letter.source_partition)
            return future.result(self.ack_timeout_s)
        except RailmqError as error:
            with self._lock:
                self._partitions.pop((letter.source_topic, topic), None)  # look again next time
            raise DeadLetterFailed(f"{letter.source_topic}/{letter.source_partition}@{letter.source_offset} "
                                   f"could not be dead-lettered to {topic}: {error}", error.code) from error
        except TimeoutError as error:
            raise DeadLetterFailed(f"{topic} did not acknowledge a dead letter in time: {error}",
                                   ErrorCode.REQUEST_TIMED_OUT) from error

    def _ensure_topic(self, source_topic: str, dlq_topic: str, partition: int) -> None:
        """Create or grow the DLQ topic when it has no partition `partition` yet (the source grew)."""
        with self._lock:
            if self._partitions.get((source_topic, dlq_topic), 0) > partition:
                return
            if self._admin is None:
                self._admin = Admin(self.producer.bootstrap)
            count = len(ensure_dead_letter_topic(self._admin, source_topic, dlq_topic).partitions)
            self._partitions[(source_topic, dlq_topic)] = count
        if partition < count:
            self._await_partition_count(dlq_topic, partition)

    def _await_partition_count(self, dlq_topic: str, partition: int) -> None:
        """Wait until the producer knows the DLQ has `partition`. A producer refreshes a topic's
        metadata on its own only every few minutes and refuses a partition beyond the count it
        knows, so a DLQ that just grew is asked for explicitly (Producer has no public call for
        this; its engine takes the same RefreshMetadata command it sends itself)."""
        deadline = time.monotonic() + self.ack_timeout_s
        while self.producer.partitions_for(dlq_topic) <= partition:
            if time.monotonic() > deadline:
                raise RailmqError(ErrorCode.REQUEST_TIMED_OUT,
                                  f"the producer did not learn that {dlq_topic} has partition {partition}")
            self.producer._engine.submit(RefreshMetadata(topics=[dlq_topic]))
            time.sleep(METADATA_RECHECK_S)

    def close(self) -> None:
        if self._owns_admin and self._admin is not None:
            self._admin.close()
        if self._owns_producer:
            self.producer.close()

    def __enter__(self) -> "DeadLetterWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
