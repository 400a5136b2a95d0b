"""Retry policy, the retrying handler, the dead-letter format and the redrive's pure parts.

Given a handler that fails, when the RetryingHandler runs it with a fake sleep, a fake clock and
a fake dead-letter writer, then it retries on the policy's schedule and, when the attempts run
out, writes exactly one dead letter in the shared format and returns normally — or raises when
the dead letter could not be written, so nobody commits past a record that is nowhere."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railmq.dlq import (
    HEADER_ATTEMPTS, HEADER_DEAD_LETTERED_MS, HEADER_FIRST_DELIVERY_MS, HEADER_GROUP, HEADER_LAST_ERROR,
    HEADER_REASON, HEADER_REDRIVEN_FROM, HEADER_SOURCE_OFFSET, HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TIMESTAMP_MS, HEADER_SOURCE_TOPIC, LAST_ERROR_CHARS_MAX, DeadLetter, MalformedDeadLetter,
    TokenBucket, burst_for, redrive_destination, redriven_headers,
)
from railmq.producer import Producer, RecordMetadata
from railmq.records import ConsumerRecord, TopicPartition
from railmq.redrive import RedriveOptions, _Redrive
from railmq.retry import DeadLetterFailed, DeadLetterWriter, RetryingHandler, RetryPolicy, retrying_delivery

SHARED_HEADER_ORDER = [
    HEADER_SOURCE_TOPIC, HEADER_SOURCE_PARTITION, HEADER_SOURCE_OFFSET, HEADER_GROUP, HEADER_ATTEMPTS,
    HEADER_REASON, HEADER_LAST_ERROR, HEADER_SOURCE_TIMESTAMP_MS, HEADER_FIRST_DELIVERY_MS,
    HEADER_DEAD_LETTERED_MS,
]


def record(offset: int = 7, *, headers=None, value: bytes | None = b"payload") -> ConsumerRecord:
    return ConsumerRecord(timestamp_ms=1_000, key=b"account-1", value=value, headers=headers,
                          topic="orders", partition=2, offset=offset)


class FakeWriter:
    def __init__(self, fail: bool = False) -> None:
        self.letters: list[DeadLetter] = []
        self.fail = fail

    def write(self, letter: DeadLetter) -> RecordMetadata:
        if self.fail:
            raise DeadLetterFailed("the DLQ topic is unreachable")
        self.letters.append(letter)
        return RecordMetadata(f"{letter.source_topic}.dlq", letter.source_partition, len(self.letters) - 1, 0)


class FakeTime:
    """A wall clock in ms that moves only when the handler sleeps (and by 1 ms per reading)."""

    def __init__(self) -> None:
        self.now_ms = 50_000
        self.sleeps_s: list[float] = []

    def clock(self) -> int:
        self.now_ms += 1
        return self.now_ms

    def sleep(self, seconds: float) -> None:
        self.sleeps_s.append(seconds)
        self.now_ms += int(seconds * 1000)


class Failing:
    """Raises `error` on the first `failures` calls, then succeeds."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or ConnectionError("the payment service is down")
        self.calls = 0

    def __call__(self, _record: ConsumerRecord) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error


def retrying(handler, policy: RetryPolicy, writer: FakeWriter, clock: FakeTime) -> RetryingHandler:
    return RetryingHandler(handler, policy, writer, "billing", sleep=clock.sleep, clock=clock.clock,
                           rng=random.Random(1))


# --------------------------------------------------------------------------- policy


@pytest.mark.parametrize("fields", [
    dict(attempts=0), dict(attempts=101), dict(backoff_ms=-1), dict(backoff_ms=500, backoff_max_ms=100),
    dict(multiplier=0.5), dict(jitter=1.5), dict(retry_on=()), dict(retry_on=(int,)),
])
def test_policy_refuses_values_that_cannot_bound_a_retry(fields):
    with pytest.raises(ValueError):
        RetryPolicy(**fields)


def test_backoff_grows_by_the_multiplier_up_to_the_cap():
    policy = RetryPolicy(attempts=8, backoff_ms=100, multiplier=2.0, backoff_max_ms=1_000, jitter=0.0)
    schedule = [policy.backoff_before_ms(retry, random.Random(0)) for retry in range(1, 8)]
    assert schedule == [100, 200, 400, 800, 1_000, 1_000, 1_000]
    assert policy.retry_budget_ms() == sum(schedule)


def test_a_huge_multiplier_is_capped_without_overflowing():
    policy = RetryPolicy(attempts=100, backoff_ms=1, multiplier=1e10, backoff_max_ms=5_000, jitter=0.0)
    assert policy.base_backoff_ms(99) == 5_000
    assert policy.retry_budget_ms() == 1 + 98 * 5_000


def test_jitter_spreads_backoffs_within_its_fraction_and_never_past_the_cap():
    policy = RetryPolicy(attempts=5, backoff_ms=1_000, multiplier=1.0, backoff_max_ms=1_050, jitter=0.1)
    rng = random.Random(3)
    delays = [policy.backoff_before_ms(1, rng) for _ in range(500)]
    assert min(delays) >= 900 and max(delays) <= 1_050
    assert len(set(delays)) > 50, "jitter spreads retries of many consumers apart"
    assert policy.retry_budget_ms() == 4 * 1_050, "the budget assumes the worst jitter, capped"


def test_check_poll_interval_says_when_a_polls_worth_of_retries_outlasts_the_group():
    policy = RetryPolicy(attempts=3, backoff_ms=1_000, multiplier=1.0, backoff_max_ms=1_000, jitter=0.0)
    policy.check_poll_interval(max_poll_interval_ms=300_000, max_poll_records=100)  # 100 × 2 s fits in 300 s
    with pytest.raises(ValueError, match="max_poll_interval_ms=300000"):
        policy.check_poll_interval(max_poll_interval_ms=300_000, max_poll_records=500)
    with pytest.raises(ValueError):
        policy.check_poll_interval(max_poll_interval_ms=300_000, max_poll_records=100,
                                   handler_time_max_ms=400)


# --------------------------------------------------------------------------- retrying handler


def test_a_handler_that_succeeds_runs_once_and_dead_letters_nothing():
    writer, clock, handler = FakeWriter(), FakeTime(), Failing(0)
    outcome = retrying(handler, RetryPolicy(), writer, clock)(record())
    assert (outcome.status, outcome.attempts, handler.calls) == ("handled", 1, 1)
    assert clock.sleeps_s == [] and writer.letters == []


def test_a_transient_failure_is_retried_after_the_backoff():
    writer, clock, handler = FakeWriter(), FakeTime(), Failing(2)
    policy = RetryPolicy(attempts=5, backoff_ms=100, jitter=0.0)
    wrapped = retrying(handler, policy, writer, clock)
    outcome = wrapped(record())
    assert (outcome.status, outcome.attempts, handler.calls) == ("handled", 3, 3)
    assert clock.sleeps_s == [0.1, 0.2]
    assert writer.letters == [] and (wrapped.handled, wrapped.retried, wrapped.dead_lettered) == (1, 2, 0)


def test_a_poison_record_is_dead_lettered_with_the_shared_headers_and_returns_normally():
    writer, clock, handler = FakeWriter(), FakeTime(), Failing(10**9, ValueError("bad amount: 'x'"))
    policy = RetryPolicy(attempts=4, backoff_ms=10, multiplier=3.0, jitter=0.0)
    source = record(headers=[("trace", b"abc")])
    outcome = retrying(handler, policy, writer, clock)(source)
    assert handler.calls == 4 and clock.sleeps_s == [0.01, 0.03, 0.09]
    assert outcome.status == "dead-lettered" and outcome.dead_letters[0].partition == source.partition
    [letter] = writer.letters
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == ("orders", 2, 7)
    assert (letter.group, letter.reason, letter.attempts) == ("billing", "retries-exhausted", 4)
    assert letter.last_error == repr(ValueError("bad amount: 'x'"))
    assert letter.source_timestamp_ms == 1_000
    assert letter.first_delivery_ms == 50_001, "the time of the first attempt"
    assert letter.dead_lettered_ms > letter.first_delivery_ms + 130, "after the three backoffs"
    assert (letter.key, letter.value, letter.headers) == (b"account-1", b"payload", [("trace", b"abc")])


def test_an_exception_outside_retry_on_is_rejected_at_once():
    writer, clock, handler = FakeWriter(), FakeTime(), Failing(1, KeyError("no such account"))
    outcome = retrying(handler, RetryPolicy(retry_on=(ConnectionError,)), writer, clock)(record())
    assert (outcome.status, outcome.attempts, handler.calls) == ("dead-lettered", 1, 1)
    assert clock.sleeps_s == [] and writer.letters[0].reason == "rejected"


def test_when_the_dead_letter_cannot_be_written_the_failure_propagates():
    writer, clock = FakeWriter(fail=True), FakeTime()
    wrapped = retrying(Failing(10**9), RetryPolicy(attempts=2, backoff_ms=0), writer, clock)
    with pytest.raises(DeadLetterFailed):
        wrapped(record())
    assert wrapped.dead_lettered == 0


class Unprintable(Exception):
    """A handler's exception whose str() and repr() fail themselves (a field they read unset)."""

    def __str__(self) -> str:
        raise AttributeError("'Unprintable' object has no attribute 'account'")

    __repr__ = __str__


def test_an_exception_that_cannot_be_printed_is_still_retried_and_dead_lettered():
    writer, clock, notices = FakeWriter(), FakeTime(), []
    handler = RetryingHandler(Failing(10**9, Unprintable()), RetryPolicy(attempts=2, backoff_ms=10), writer,
                              "billing", sleep=clock.sleep, clock=clock.clock, rng=random.Random(1),
                              say=notices.append)
    outcome = handler(record())
    assert (outcome.status, outcome.attempts) == ("dead-lettered", 2)
    [letter] = writer.letters
    assert letter.last_error.startswith("<Unprintable: str() and repr() failed")
    assert [line.split(" ")[0] for line in notices] == ["retrying", "dead-lettered"]


def test_keyboard_interrupt_is_never_retried():
    def interrupted(_record):
        raise KeyboardInterrupt

    writer, clock = FakeWriter(), FakeTime()
    with pytest.raises(KeyboardInterrupt):
        retrying(interrupted, RetryPolicy(), writer, clock)(record())
    assert clock.sleeps_s == [] and writer.letters == []


def test_retrying_delivery_wraps_a_member_delivery_per_unit():
    writer, clock = FakeWriter(), FakeTime()
    seen: list[list[int]] = []

    def delivery(records):
        seen.append([r.offset for r in records])
        if any(r.offset == 2 for r in records):
            raise RuntimeError("poison")

    deliver = retrying_delivery(RetryPolicy(attempts=2, backoff_ms=0), writer, "billing",
                                sleep=clock.sleep, clock=clock.clock)(delivery)
    deliver([record(1)])
    deliver([record(2)])
    deliver([record(3), record(2)])  # a per-batch unit fails as a whole
    assert seen == [[1], [2], [2], [3, 2], [3, 2]]
    assert [letter.source_offset for letter in writer.letters] == [2, 3, 2]


def test_a_dead_letter_writer_refuses_a_producer_that_does_not_wait_for_every_replica():
    producer = Producer("tcp://127.0.0.1:9", acks=1)  # nothing listens: no request is ever sent
    try:
        with pytest.raises(ValueError, match="acks='all'"):
            DeadLetterWriter(producer)
    finally:
        producer.close(timeout=5)


# --------------------------------------------------------------------------- the dead-letter format


def failed_letter(**overrides) -> DeadLetter:
    fields = dict(group="billing", reason="retries-exhausted", attempts=5, last_error="ValueError('x')",
                  first_delivery_ms=1_500, dead_lettered_ms=2_500)
    fields.update(overrides)
    source = record(headers=[("trace", b"abc"), ("railmq.dlq.group", b"original")])
    return DeadLetter.of_failure(source, **fields)


def as_dlq_record(letter: DeadLetter, offset: int = 0) -> ConsumerRecord:
    return ConsumerRecord(timestamp_ms=3_000, key=letter.key, value=letter.value,
                          headers=letter.record_headers(), topic="orders.dlq",
                          partition=letter.source_partition, offset=offset)


def test_dead_letter_headers_come_first_in_the_shared_order_then_the_original_headers():
    headers = failed_letter().record_headers()
    assert [name for name, _ in headers] == SHARED_HEADER_ORDER + ["trace", "railmq.dlq.group"]
    assert dict(headers[:10]) == {
        HEADER_SOURCE_TOPIC: b"orders", HEADER_SOURCE_PARTITION: b"2", HEADER_SOURCE_OFFSET: b"7",
        HEADER_GROUP: b"billing", HEADER_ATTEMPTS: b"5", HEADER_REASON: b"retries-exhausted",
        HEADER_LAST_ERROR: b"ValueError('x')", HEADER_SOURCE_TIMESTAMP_MS: b"1000",
        HEADER_FIRST_DELIVERY_MS: b"1500", HEADER_DEAD_LETTERED_MS: b"2500",
    }


def test_a_dead_letter_parses_back_to_what_was_written():
    letter = failed_letter()
    parsed = DeadLetter.parse(as_dlq_record(letter, offset=41))
    assert (parsed.topic, parsed.partition, parsed.offset, parsed.malformed) == ("orders.dlq", 2, 41, "")
    for field in ("source_topic", "source_partition", "source_offset", "group", "attempts", "reason",
                  "last_error", "source_timestamp_ms", "first_delivery_ms", "dead_lettered_ms", "key",
                  "value", "headers"):
        assert getattr(parsed, field) == getattr(letter, field), field
    assert parsed.headers == [("trace", b"abc"), ("railmq.dlq.group", b"original")], \
        "an original header with a dead-letter name keeps its place"


def test_a_share_groups_dead_letter_reads_back_with_the_same_parser():
    """The share-group coordinator (an actor: it cannot import railmq.dlq) writes the same format."""
    from actors.dead_letter_records import DeadLetterItem, dead_letter_headers

    item = DeadLetterItem(group_id="workers", topic="orders", partition=1, offset=12, reason="max-attempts",
                          attempts=5, last_error="timeout", first_delivery_ms=100, dead_lettered_ms=900)
    headers = dead_letter_headers(item, source_timestamp_ms=50) + [("trace", b"abc")]
    assert [name for name, _ in headers[:10]] == SHARED_HEADER_ORDER
    parsed = DeadLetter.parse(ConsumerRecord(timestamp_ms=900, key=b"k", value=b"v", headers=headers,
                                             topic="orders.dlq", partition=1, offset=0))
    assert (parsed.source_topic, parsed.source_partition, parsed.source_offset, parsed.group) == (
        "orders", 1, 12, "workers")
    assert (parsed.reason, parsed.attempts, parsed.last_error) == ("max-attempts", 5, "timeout")
    assert (parsed.source_timestamp_ms, parsed.first_delivery_ms, parsed.dead_lettered_ms) == (50, 100, 900)
    assert parsed.headers == [("trace", b"abc")]


def test_a_long_error_is_cut_and_an_unknown_reason_refused():
    assert len(failed_letter(last_error="x" * 10_000).last_error) == LAST_ERROR_CHARS_MAX
    with pytest.raises(ValueError):
        failed_letter(reason="gave-up")


def test_a_record_without_dead_letter_headers_is_malformed_strictly_and_described_leniently():
    plain = ConsumerRecord(timestamp_ms=1, key=None, value=b"v", headers=[(HEADER_SOURCE_PARTITION, b"two")],
                           topic="orders.dlq", partition=0, offset=3)
    with pytest.raises(MalformedDeadLetter, match="orders.dlq/0@3"):
        DeadLetter.parse(plain)
    lenient = DeadLetter.parse(plain, strict=False)
    assert "source_topic is missing" in lenient.malformed and "not a decimal number" in lenient.malformed
    assert (lenient.source_partition, lenient.value) == (-1, b"v")


# --------------------------------------------------------------------------- redrive's pure parts


def test_redriven_headers_drop_the_dead_letter_headers_and_say_where_the_record_came_from():
    dlq_record = as_dlq_record(failed_letter(), offset=9)
    dlq_record.headers.append((HEADER_REDRIVEN_FROM, b"older/0/1"))
    assert redriven_headers(dlq_record) == [("trace", b"abc"), (HEADER_REDRIVEN_FROM, b"orders.dlq/2/9")]


def test_redrive_goes_back_to_the_source_partition_or_to_the_topic_asked_for():
    dlq_record = as_dlq_record(failed_letter())
    assert redrive_destination(dlq_record, None) == ("orders", 2)
    assert redrive_destination(dlq_record, "orders-retry") == ("orders-retry", None)
    no_source = ConsumerRecord(timestamp_ms=1, key=None, value=b"v", headers=[], topic="x.dlq", partition=0,
                               offset=0)
    with pytest.raises(MalformedDeadLetter, match="names no source"):
        redrive_destination(no_source, None)
    assert redrive_destination(no_source, "x") == ("x", None)
    looping = as_dlq_record(failed_letter())
    looping.topic = "orders"
    with pytest.raises(MalformedDeadLetter, match="its own DLQ"):
        redrive_destination(looping, None)


def test_token_bucket_lets_a_burst_through_then_paces_at_the_rate():
    bucket = TokenBucket(rate_per_s=10, burst=5, now_s=0.0)
    waits = [bucket.take(1, 0.0) for _ in range(8)]
    assert waits[:5] == [0.0] * 5
    assert waits[5:] == pytest.approx([0.1, 0.2, 0.3])
    assert bucket.take(5, 0.3) == pytest.approx(0.5), "the debt is paid at 0.3 s; 5 more take 0.5 s at 10/s"
    assert bucket.take(5, 1.8) == 0.0, "a full bucket again after a second of rest"
    with pytest.raises(ValueError):
        bucket.take(6, 10.0)


def test_burst_is_a_tenth_of_a_second_of_the_rate_within_bounds():
    assert [burst_for(rate) for rate in (1, 100, 2_000, 10**6)] == [1, 10, 200, 500]


@settings(max_examples=200, deadline=None)
@given(rate=st.integers(1, 1_000), burst=st.integers(1, 50),
       steps=st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 50)), min_size=1, max_size=60))
def test_token_bucket_never_lets_more_than_burst_plus_rate_times_span_through(rate, burst, steps):
    bucket = TokenBucket(rate, burst, now_s=0.0)
    now_s, sent = 0.0, []  # (time the units go, count)
    for gap_s, count in steps:
        now_s += gap_s
        count = min(count, burst)
        go_s = now_s + bucket.take(count, now_s)
        sent.append((go_s, count))
        now_s = go_s  # the caller waits before it sends
    for first, (start_s, _) in enumerate(sent):
        for end_s, _ in sent[first:]:
            units = sum(count for at_s, count in sent if start_s <= at_s <= end_s)
            assert units <= burst + rate * (end_s - start_s) + 1e-6


class GrownDeadLetterTopic:
    """A redrive's consumer after the DLQ topic grew from 1 partition to 2 during the redrive (a
    DeadLetterWriter grows a DLQ with its source): partition 0 is done, partition 1 is new."""

    def __init__(self) -> None:
        self.committed: list[dict] = []

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("orders.dlq", 0), TopicPartition("orders.dlq", 1)]

    def position(self, tp: TopicPartition, timeout: float | None = None) -> int:
        return 1 if tp.partition == 0 else 0

    def poll(self, timeout_ms: int, max_records: int | None = None) -> list[ConsumerRecord]:
        return [as_dlq_record(failed_letter(source_partition=1), offset=0)]

    def commit(self, offsets: dict) -> None:
        self.committed.append(offsets)


def test_a_redrive_whose_dlq_topic_grows_meanwhile_stops_at_its_snapshot_without_a_traceback():
    consumer = GrownDeadLetterTopic()
    run = _Redrive(RedriveOptions(dlq_topic="orders.dlq"), consumer, producer=None, ends={0: 1},
                   clock=lambda: 0.0, sleep=lambda seconds: None, on_progress=None)
    result = run.run()
    assert (result.moved, result.remaining, result.stopped) == (0, 0, "caught-up")
    assert consumer.committed == [], "the new partition's records wait for the next redrive"
