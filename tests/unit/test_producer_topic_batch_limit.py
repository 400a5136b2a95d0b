"""A producer fills its batches only as far as the topic's `batch_bytes_max` takes them.

A topic's batch limit is its own setting (Kafka's max.message.bytes), told in its metadata; the
producer batched up to its own `batch_bytes_max` (1 MiB) whatever the topic took, so with a topic
of 4 KiB, ten records of 1,000 bytes sent together went as one 10 KB batch and the leader refused
all ten (MESSAGE_TOO_LARGE), though each fitted. (Kafka's producer splits such a batch and sends
it again.) No cluster: the batches stay open and are checked as the leader checks them.
"""

from __future__ import annotations

import contextlib

import pytest

from actors.messages import PartitionMetadata, TopicConfig, TopicMetadata
from railmq.producer import Producer
from storage.batch import encode_batch, parse_header, validate_producer_batch

NOBODY = "tcp://127.0.0.1:1"
TOPIC_BATCH_BYTES = 4096


@pytest.fixture
def producer():
    producer = Producer(NOBODY, max_block_ms=300, delivery_timeout_ms=60_000, linger_ms=60_000)
    producer._metadata([TopicMetadata(name="t", config=TopicConfig(batch_bytes_max=TOPIC_BATCH_BYTES),
                                      partitions=[PartitionMetadata(partition=0)])])
    yield producer
    with contextlib.suppress(TimeoutError):  # nobody answers: nothing is delivered, and that is fine
        producer.close(timeout=0)


def batches_as_the_leader_takes_them(batches) -> list[int]:
    """Each distinct batch encoded and checked against the topic's limit as the leader checks it
    (BatchTooLarge: MESSAGE_TOO_LARGE); how many records each holds."""
    counts = []
    for batch in {id(batch): batch for batch in batches}.values():
        encoded = encode_batch(batch.records, batch.first_timestamp_ms, batch.max_timestamp_ms)
        validate_producer_batch(encoded, parse_header(encoded, batch_bytes_max=TOPIC_BATCH_BYTES))
        counts.append(len(batch.records))
    return counts


@pytest.mark.timeout(30)
def test_records_sent_together_fill_batches_only_up_to_the_topics_limit(producer):
    futures = [producer.send("t", b"v" * 1_000, partition=0) for _ in range(10)]

    counts = batches_as_the_leader_takes_them([future._batch for future in futures])

    assert sum(counts) == 10 and max(counts) > 1


@pytest.mark.timeout(30)
def test_a_send_batch_fills_batches_only_up_to_the_topics_limit(producer):
    future = producer.send_batch("t", [b"v" * 1_000] * 10, partition=0)

    counts = batches_as_the_leader_takes_them([batch for batch, *_ in future._spans])

    assert sum(counts) == 10 and max(counts) > 1


@pytest.mark.timeout(30)
def test_a_record_larger_than_the_topics_limit_goes_alone_and_ends_the_call(producer):
    # It fits the producer's own limit: the leader refuses it alone, the records around it go.
    first = producer.send("t", b"a", partition=0)
    large = producer.send("t", b"v" * (TOPIC_BATCH_BYTES + 1), partition=0)
    spans = producer.send_batch("t", [b"b", b"v" * (TOPIC_BATCH_BYTES + 1), b"c"], partition=0)

    assert first._batch is not large._batch and len(large._batch.records) == 1
    assert sum(count for _, _, count, _ in spans._spans) == 3
    holding_large = [batch for batch, *_ in spans._spans
                     if any(len(record[2]) > TOPIC_BATCH_BYTES for record in batch.records)]
    assert [len(batch.records) for batch in holding_large] == [1]
