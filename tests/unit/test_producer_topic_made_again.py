"""A producer whose topic was deleted and made again under its name with fewer partitions.

Keyless records stick to one partition until its batch is sent (KIP-480). The producer kept
that choice apart from the partitioner and took it as it was for each record: with the topic made
again with 2 partitions instead of 6, its keyless records went on to partition 3, which has no
leader, until the batch there was sent; they all failed REQUEST_TIMED_OUT after the delivery
timeout, though the caller never named a partition. No cluster: the batches stay open.
"""

from __future__ import annotations

import contextlib

import pytest

from actors.messages import PartitionMetadata, TopicMetadata
from railmq.producer import Producer

NOBODY = "tcp://127.0.0.1:1"


def topic(partitions: int, topic_id: int) -> TopicMetadata:
    return TopicMetadata(name="t", topic_id=topic_id,
                         partitions=[PartitionMetadata(partition=number) for number in range(partitions)])


@pytest.fixture
def producer():
    # seed 0: the sticky choice among 6 partitions is partition 3
    producer = Producer(NOBODY, max_block_ms=300, delivery_timeout_ms=60_000, linger_ms=60_000, seed=0)
    yield producer
    with contextlib.suppress(TimeoutError):  # nobody answers: nothing is delivered, and that is fine
        producer.close(timeout=0)


@pytest.mark.timeout(30)
def test_keyless_records_go_to_a_partition_the_topic_made_again_has(producer):
    producer._metadata([topic(partitions=6, topic_id=1)])
    before = producer.send("t", b"old")
    assert before._batch.partition == 3, "the sticky choice this test starts from"

    producer._metadata([topic(partitions=2, topic_id=2)])
    after = [producer.send("t", b"new") for _ in range(5)]

    assert {future._batch.partition for future in after} <= {0, 1}
    assert len({future._batch.partition for future in after}) == 1, "still sticky: one batch"


@pytest.mark.timeout(30)
def test_a_sticky_choice_the_topic_still_has_is_kept_when_it_grows(producer):
    producer._metadata([topic(partitions=6, topic_id=1)])
    before = producer.send("t", b"a")

    producer._metadata([topic(partitions=8, topic_id=1)])
    after = producer.send("t", b"b")

    assert after._batch is before._batch, "the batch being filled goes on being filled"
