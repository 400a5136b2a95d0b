"""A caller's mistakes on a `Consumer` or `ShareConsumer`: a typed error at the call, never a
subscription or a position that silently stands for something else.

No cluster: the bootstrap is a port nobody listens on, and every check here is made before
anything would be asked of one.
"""

from __future__ import annotations

import pytest

from actors.errors import ErrorCode, RailmqError
from railmq.consumer import Consumer
from railmq.records import TopicPartition
from railmq.share_consumer import ShareConsumer, ShareRecord

NOBODY = "tcp://127.0.0.1:1"


@pytest.fixture
def consumer():
    consumer = Consumer(NOBODY, request_timeout_ms=500)
    yield consumer
    consumer.close()


@pytest.fixture
def member():
    consumer = Consumer(NOBODY, group_id="g", request_timeout_ms=500)
    yield consumer
    consumer.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("topics", ["orders", b"orders", [None], ["orders", 5]])
def test_subscribing_to_what_is_not_a_list_of_topic_names_is_a_type_error(member, topics):
    # Before: subscribe("orders") subscribed to the topics "d", "e", "o", "r" and "s", and
    # subscribe([None]) to a topic None: no error, and no record ever came.
    with pytest.raises(TypeError, match="topic"):
        member.subscribe(topics)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("topics", ["orders", [None], ["orders", 5]])
def test_a_share_consumer_subscribing_to_what_is_not_a_list_of_topic_names_is_a_type_error(topics):
    consumer = ShareConsumer(NOBODY, "g")
    try:
        with pytest.raises(TypeError, match="topic"):
            consumer.subscribe(topics)
    finally:
        consumer.close(timeout_s=1)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("partitions", ["t", "orders", [(None, 0)], [("t", 0.5)], [("t", "1")], [("t", True)],
                                        [(b"t", 0)]])
def test_assigning_what_is_not_a_list_of_topic_partitions_is_a_type_error(consumer, partitions):
    # Before: "t" raised IndexError, "orders" a ValueError from int("r"); (None, 0) was assigned as
    # the topic "None", ("t", 0.5) as partition 0 and b"t" as the topic "b't'", without a word.
    with pytest.raises(TypeError, match="topic|partition"):
        consumer.assign(partitions)
    assert consumer.assignment() == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("offset", [1.5, True, "5"])
def test_an_offset_that_is_not_an_int_is_a_type_error(consumer, offset):
    # Before: seek(tp, 1.5) was taken, and position() answered 1.5.
    consumer.assign([TopicPartition("t", 0)])
    with pytest.raises(TypeError, match="offset"):
        consumer.seek(("t", 0), offset)
    with pytest.raises(TypeError, match="timestamp"):
        consumer.offsets_for_times({("t", 0): offset})  # a timestamp: the same rule
    assert ("t", 0) not in consumer.positions()


@pytest.mark.timeout(30)
def test_acknowledging_after_close_is_refused_not_dropped():
    # Before: close released the record, and this later acknowledgement was taken without a word
    # and never sent: the caller believed the record done while it went to another member.
    consumer = ShareConsumer(NOBODY, "g")
    record = ShareRecord(0, None, b"v", topic="t", partition=0, offset=7, delivery_count=1)
    consumer._delivered[("t", 0, 7)] = record  # as poll records what it returned
    consumer.close(timeout_s=0.5)
    with pytest.raises(RailmqError, match="closed") as refused:
        consumer.acknowledge(record)
    assert refused.value.code == ErrorCode.INVALID_REQUEST


@pytest.mark.timeout(30)
def test_pausing_a_partition_not_assigned_is_refused_and_a_later_assignment_delivers(consumer):
    # Before: the pause was taken, kept, and applied to the partition when it was assigned later:
    # a consumer that never delivered it, with no error (Kafka's pause refuses it the same way).
    with pytest.raises(RailmqError, match="not assigned") as refused:
        consumer.pause([("t", 3)])
    assert refused.value.code == ErrorCode.INVALID_REQUEST
    with pytest.raises(RailmqError, match="not assigned"):
        consumer.resume([("t", 3)])
    consumer.assign([("t", 3)])
    assert consumer.paused() == set()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("max_records", [0, -1, 1.5])
def test_poll_for_no_records_or_fewer_is_refused(consumer, max_records):
    # Before: max_records=0 meant max_poll_records (500 records to a caller that asked for none),
    # and -1 returned [] at once, whatever the timeout: a caller's loop spun.
    with pytest.raises((ValueError, TypeError), match="max_records"):
        consumer.poll(0, max_records=max_records)
