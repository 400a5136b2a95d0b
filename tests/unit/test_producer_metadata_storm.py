"""A producer never has two metadata requests out for the same topic, so answers cannot breed.

Found by a simulator seed (1197, with node agents): a producer whose partition leader had just
dropped its connection (metadata naming it is distrusted for a while) had two metadata requests
in flight after a duplicated message. The answer to the older one took the topic off the wanted
list, the batch waiting for a leader asked again at once — the topic was "new" — and so every
answer sent one more request: 9,450 metadata answers to each of two producers in one run, never
dying down while the leader stayed distrusted. A request in flight that covers the topic is now
enough; an answer to an earlier request starts the retry backoff like the latest one does.
"""

from __future__ import annotations

from actors.messages import (
    MetadataRequest, MetadataResponse, PartitionMetadata, PeerDisconnected, ProduceRequest, TopicMetadata,
)
from actors.producer_client import CHASE_INTERVAL_MS
from tests.unit.actor_harness import only
from tests.unit.test_producer_client import BOOTSTRAP, PRODUCER, Stage, leader


def answer(stage: Stage, correlation_id: int, node: int) -> list:
    partitions = [PartitionMetadata(partition=0, leader=node, leader_endpoint=leader(node))]
    return stage.harness.deliver(PRODUCER, MetadataResponse(
        correlation_id=correlation_id, topics=[TopicMetadata(name="orders", partitions=partitions)]), BOOTSTRAP)


def asked(effects: list) -> list[MetadataRequest]:
    return [effect.message for effect in effects if isinstance(getattr(effect, "message", None), MetadataRequest)]


def test_answers_to_earlier_metadata_requests_do_not_each_send_another():
    stage = Stage(idempotent=False)
    stage.send(partition=0)
    stage.metadata({0: 1})
    only(stage.requests(1), ProduceRequest)
    stage.harness.deliver(PRODUCER, PeerDisconnected(endpoint=leader(1)), b"")  # the leader is gone
    stage.harness.advance(200)
    first = stage.harness.take(BOOTSTRAP, MetadataRequest)
    assert first, "the producer asked who leads now"
    stale = first[-1].correlation_id

    # The controller has not noticed yet: every answer names the gone leader, and answers to one
    # request arrive more than once (a duplicate, requests that overlapped). Only the tick asks
    # again (once per tick at most, when the request out is unanswered), never an answer.
    sent = 0
    for _ in range(100):  # one second
        for _ in range(3):
            effects = answer(stage, stale, node=1)
            assert not asked(effects), "an answer to an earlier request sent another while one covers the topic"
        stage.harness.advance(10)
        sent += len(stage.harness.take(BOOTSTRAP, MetadataRequest))
    assert sent <= 1000 // CHASE_INTERVAL_MS + 1, f"{sent} metadata requests in a second"

    stage.harness.advance(100)
    answer(stage, stage.producer.metadata_correlation, node=2)  # the controller names the new leader
    stage.harness.advance(100)
    assert only(stage.requests(2), ProduceRequest)
