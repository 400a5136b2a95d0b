"""A caller's mistakes on a `Producer`: each is a typed error at the call, and the producer goes on.

No cluster: the bootstrap is a port nobody listens on, and where a send needs a partition count
the test hands the producer the metadata notice its I/O thread would deliver. Batches then wait
for a leader that never comes and fail at their delivery deadline, which is when callbacks run.
"""

from __future__ import annotations

import threading

import pytest

from actors.errors import ErrorCode, RailmqError
from actors.messages import PartitionMetadata, TopicMetadata
from railmq.producer import Producer

NOBODY = "tcp://127.0.0.1:1"


@pytest.fixture
def producer():
    producer = Producer(NOBODY, max_block_ms=300, delivery_timeout_ms=300, linger_ms=0)
    producer._metadata([TopicMetadata(name="t", partitions=[PartitionMetadata(partition=0),
                                                            PartitionMetadata(partition=1)])])
    yield producer
    producer.close(timeout=2)


def still_working(producer: Producer) -> None:
    """The I/O thread is alive and completes a send (here: fails it at its delivery deadline)."""
    assert producer._engine.failure is None and producer._engine.alive
    with pytest.raises(RailmqError) as failed:
        producer.send("t", b"after", partition=0).result(5)
    assert failed.value.code == ErrorCode.REQUEST_TIMED_OUT


@pytest.mark.timeout(30)
@pytest.mark.parametrize("topic", [None, 5, b"t", ["t"]])
def test_a_topic_that_is_not_a_string_is_a_type_error_and_the_producer_goes_on(producer, topic):
    # Before: the name reached the I/O thread's metadata request, whose len(None) killed the thread;
    # this send then timed out, and so did every later one.
    for call in (lambda: producer.send(topic, b"x"), lambda: producer.send(topic, b"x", key=b"k"),
                 lambda: producer.send_batch(topic, [b"x"]), lambda: producer.partitions_for(topic)):
        with pytest.raises(TypeError, match="topic"):
            call()
    still_working(producer)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("partition", [0.5, "1", True])
def test_a_partition_that_is_not_an_int_is_a_type_error(producer, partition):
    for call in (lambda: producer.send("t", b"x", partition=partition),
                 lambda: producer.send_batch("t", [b"x"], partition=partition)):
        with pytest.raises(TypeError, match="partition"):
            call()
    still_working(producer)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("headers", [[(b"name", b"v")], [(1, b"v")], [("a", b"v", b"w")], [b"av"], "ab"])
def test_headers_must_be_pairs_of_a_str_name_and_a_value(producer, headers):
    # Before: a bytes name was sent as its repr ("b'name'") without a word.
    with pytest.raises(TypeError, match="header"):
        producer.send("t", b"x", partition=0, headers=headers)
    still_working(producer)
