"""Records' own timestamps, in any order, each reach a batch the leader accepts.

A batch holds its first record's timestamp and each record's distance from it, 0..2**31-1 ms
(storage/batch.py). Kafka's records carry any timestamps in any order (event times, a backfill,
a clock stepped back), so a record the open batch cannot hold must start a batch of its own: put
in it, it made the leader refuse the whole batch (INVALID_RECORD), the records before it too.

No cluster: the batches stay open (a long linger, a bootstrap nobody answers), and each is
checked as the leader checks it.
"""

from __future__ import annotations

import contextlib

import pytest

from actors.messages import PartitionMetadata, TopicMetadata
from railmq.producer import Producer
from storage.batch import TIMESTAMP_DELTA_MAX, encode_batch, validate_producer_batch, verify_batch

NOBODY = "tcp://127.0.0.1:1"
NOW_MS = 1_700_000_000_000


@pytest.fixture
def producer():
    producer = Producer(NOBODY, max_block_ms=300, delivery_timeout_ms=60_000, linger_ms=60_000)
    producer._metadata([TopicMetadata(name="t", partitions=[PartitionMetadata(partition=0)])])
    yield producer
    with contextlib.suppress(TimeoutError):  # nobody answers: nothing is delivered, and that is fine
        producer.close(timeout=0)


def as_the_leader_takes_them(places: list[tuple]) -> list[int]:
    """Every distinct batch of `places` ((batch, index of a record) pairs) encoded and validated
    as a leader does (InvalidBatch: INVALID_RECORD), and the timestamps those records get."""
    for batch in {id(batch): batch for batch, _ in places}.values():
        encoded = encode_batch(batch.records, batch.first_timestamp_ms, batch.max_timestamp_ms)
        validate_producer_batch(encoded, verify_batch(encoded))
    return [batch.first_timestamp_ms + batch.records[index][0] for batch, index in places]


@pytest.mark.timeout(30)
def test_records_sent_out_of_time_order_or_weeks_apart_each_reach_a_batch_the_leader_accepts(producer):
    # Before: one batch, first timestamp NOW_MS, with a record 1 s earlier (a delta of -1,000) and
    # one 2**31 ms later: the leader refused all six records, the four that were fine as well.
    sent = [NOW_MS, NOW_MS - 1_000, NOW_MS + TIMESTAMP_DELTA_MAX + 1, NOW_MS, 0, NOW_MS, NOW_MS + 5]
    futures = [producer.send("t", b"x", partition=0, timestamp_ms=timestamp) for timestamp in sent]

    assert as_the_leader_takes_them([(future._batch, future._index) for future in futures]) == sent
    assert futures[-1]._batch is futures[-2]._batch, "records in time order still share a batch"


@pytest.mark.timeout(30)
def test_a_send_batch_older_than_the_open_batch_starts_its_own(producer):
    first = producer.send("t", b"x", partition=0, timestamp_ms=NOW_MS)
    older = producer.send_batch("t", [b"a", b"b"], partition=0, timestamp_ms=NOW_MS - 5_000)
    newer = producer.send_batch("t", [b"c"], partition=0, timestamp_ms=NOW_MS + 7)

    places = [(first._batch, first._index)] + [
        (batch, start + index) for future in (older, newer)
        for batch, start, count, *_ in future._spans for index in range(count)]
    assert as_the_leader_takes_them(places) == [NOW_MS, NOW_MS - 5_000, NOW_MS - 5_000, NOW_MS + 7]


def test_a_batch_with_no_records_yet_starts_at_the_first_record_it_takes():
    # A send_batch waiting for buffer space leaves its partition's batch open and empty: sealed,
    # it would go out with no records; it takes the next record's time instead.
    from railmq.producer import takes_time
    from railmq.producer_futures import Batch

    empty = Batch(1, "t", 0, NOW_MS, 0)
    assert takes_time(empty, NOW_MS - 1_000)
    assert (empty.first_timestamp_ms, empty.max_timestamp_ms) == (NOW_MS - 1_000, NOW_MS - 1_000)
    empty.records.append((0, None, b"x", None))
    assert not takes_time(empty, NOW_MS - 2_000) and not takes_time(empty, NOW_MS + TIMESTAMP_DELTA_MAX)
    assert takes_time(empty, NOW_MS - 1_000 + TIMESTAMP_DELTA_MAX)


@pytest.mark.timeout(30)
def test_a_send_batch_reports_its_own_timestamp_not_its_batchs_first(producer):
    # Before: records of a send_batch that joined an open batch were reported with the time of
    # that batch's first record (NOW_MS here), not the time they were sent with.
    first = producer.send("t", b"x", partition=0, timestamp_ms=NOW_MS)
    later = producer.send_batch("t", [b"a", b"b"], partition=0, timestamp_ms=NOW_MS + 7)
    batch = first._batch
    with producer._lock:
        producer._seal(batch)
    producer._batch_done(batch.batch_id, 0, 100, None)  # as the leader's answer completes it

    assert [(record.offset, record.timestamp_ms) for record in later.result(5)] == [(101, NOW_MS + 7),
                                                                                   (102, NOW_MS + 7)]
    assert first.result(5).timestamp_ms == NOW_MS
