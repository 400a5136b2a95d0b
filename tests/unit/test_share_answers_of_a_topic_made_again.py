"""A share consumer's answers name the topic id of the records they answer.

A topic deleted and made again under its name starts its share-partitions again from offset 0, so
the old topic's records and the new one's meet at the same (topic, partition, offset). The answers
went by those three alone: a late reject of the old record 0 was sent, and taken by the group
coordinator, as the answer to the new record 0 (dead-lettered, never handled), and an answer to an
old record object was taken for the new record delivered since under its key. No cluster: what
the consumer would send is read as it hands it to its I/O thread.
"""

from __future__ import annotations

import pytest

from actors.errors import ErrorCode, RailmqError
from railmq.share_consumer import ShareConsumer, ShareRecord

NOBODY = "tcp://127.0.0.1:1"
OLD_TOPIC_ID, NEW_TOPIC_ID = 11, 22


def record(topic_id: int) -> ShareRecord:
    return ShareRecord(0, None, b"v", topic="t", partition=0, offset=0, delivery_count=1, topic_id=topic_id)


@pytest.fixture
def consumer():
    consumer = ShareConsumer(NOBODY, "g")
    sent: list[dict] = []
    consumer._command = lambda command, **arguments: sent.append(arguments)  # what the I/O thread gets
    consumer.sent = sent
    yield consumer
    consumer._closed = True
    consumer._engine.stop()


@pytest.mark.timeout(30)
def test_an_answer_carries_the_topic_id_its_record_was_read_from(consumer):
    consumer._delivered[("t", 0, 0)] = record(NEW_TOPIC_ID)  # as poll records what it returned
    consumer.acknowledge(record(NEW_TOPIC_ID), "reject", error="bad")
    consumer._send_acknowledgements(token=0)

    [arguments] = consumer.sent
    assert arguments["acknowledgements"] == [["t", 0, 0, 0, "reject", 0, "bad", 1, NEW_TOPIC_ID]]


@pytest.mark.timeout(30)
def test_an_answer_to_the_old_topics_record_is_not_taken_for_the_new_record_at_its_offset(consumer):
    consumer._delivered[("t", 0, 0)] = record(NEW_TOPIC_ID)

    with pytest.raises(RailmqError) as refused:
        consumer.acknowledge(record(OLD_TOPIC_ID), "reject")

    assert refused.value.code == ErrorCode.INVALID_RECORD_STATE
    assert consumer._acknowledgements == {}, "the new record is still the user's to answer"


@pytest.mark.timeout(30)
def test_records_left_unanswered_are_accepted_under_their_topic_id(consumer):
    consumer._delivered[("t", 0, 0)] = record(NEW_TOPIC_ID)
    consumer._accept_unanswered()
    consumer._send_acknowledgements(token=0)

    [arguments] = consumer.sent
    assert arguments["acknowledgements"] == [["t", 0, 0, 0, "accept", 0, "", 1, NEW_TOPIC_ID]]
