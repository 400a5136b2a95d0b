"""A producer that meets no error asks for its topics' metadata again every `metadata_max_age_ms`.

Its metadata was asked for only when something was wrong (no leader known, a retriable error), so
a producer that kept sending without trouble never heard that its topic gained partitions: its
keyed records went on to `hash % old count` for its whole life while a producer started after the
change put the same keys elsewhere (one key, two partitions, no order between them), and its
keyless records never reached the new partitions. Kafka's producer refreshes every
metadata.max.age.ms (5 minutes) for the same reason.
"""

from __future__ import annotations

from actors.messages import MetadataRequest
from tests.unit.actor_harness import notices
from tests.unit.test_producer_client import Stage

AGE_MS = 60_000


def test_a_producer_without_errors_learns_that_its_topic_gained_partitions():
    stage = Stage(metadata_max_age_ms=AGE_MS)
    stage.send()
    stage.metadata({0: 1})
    stage.answer(stage.requests()[0])

    stage.harness.advance(AGE_MS + 1)
    stage.send()

    asked = stage.harness.received("bootstrap", MetadataRequest)
    assert [request.topics for request in asked] == [["orders"]], "asked again once its metadata is old"
    told = stage.metadata({0: 1, 1: 1, 2: 1})
    [topic] = [topic for payload in notices(told, "metadata") for topic in payload]
    assert len(topic.partitions) == 3, "the shell hears of the new count"


def test_metadata_younger_than_its_age_is_not_asked_for_again():
    stage = Stage(metadata_max_age_ms=AGE_MS)
    stage.send()
    stage.metadata({0: 1})
    for _ in range(10):
        stage.harness.advance(AGE_MS // 20)
        stage.answer(stage.requests()[-1])
        stage.send()

    assert stage.harness.take("bootstrap", MetadataRequest) == []
    assert len(stage.done()) == 10
