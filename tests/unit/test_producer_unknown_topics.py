"""A producer forgets names that are no topic, and the topics it writes to are always asked first.

Found in an audit: the shell's send to a name that is no topic asks the actor for its metadata
(`RefreshMetadata`) and raises UNKNOWN_TOPIC_OR_PARTITION at the first answer, but the actor kept
the name wanted for ever: ~20 metadata requests a second naming every wrong name ever sent to, and
past the controller's `topics_max` names every request was refused INVALID_REQUEST, so the
producer never again learned a leader for the topics it writes to. Kafka's producer forgets a
topic unused for `metadata.max.idle.ms`; here a name no batch needs is forgotten once nobody has
asked for it for `METADATA_WANTED_IDLE_MS`, the names a producer keeps and asks for at once are
at most `client_metadata_topics_max`, and the topics with batches waiting or in flight go first.
"""

from __future__ import annotations

from actors.errors import ErrorCode
from actors.limits import DEFAULT_LIMITS
from actors.messages import (
    MetadataRequest, MetadataResponse, PartitionMetadata, ProduceRequest, RefreshMetadata, TopicMetadata,
)
from tests.unit.actor_harness import notices
from tests.unit.test_producer_client import BOOTSTRAP, PRODUCER, Stage, leader


class Controller:
    """Plays the active controller: "orders" is led by node 1, every other name is no topic, and
    a request naming more than `topics_max` names is refused, as actors/cluster_views.py does."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, list[str]]] = []  # (when, names) of every request

    def start(self, now_ns: int) -> list:
        return []

    def invariants(self) -> None:
        pass

    def handle(self, message, sender, now_ns: int) -> list:
        from actors.effects import Send

        assert isinstance(message, MetadataRequest), message
        self.asked.append((now_ns, list(message.topics or [])))
        if message.topics is not None and len(message.topics) > DEFAULT_LIMITS.topics_max:
            return [Send(sender, MetadataResponse(correlation_id=message.correlation_id,
                                                  error=ErrorCode.INVALID_REQUEST))]
        topics = [TopicMetadata(name=name, partitions=[PartitionMetadata(partition=0, leader=1,
                                                                         leader_endpoint=leader(1))])
                  if name == "orders" else
                  TopicMetadata(name=name, error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                  for name in message.topics or []]
        return [Send(sender, MetadataResponse(correlation_id=message.correlation_id, topics=topics))]

    def naming(self, name: str, since_ns: int = 0) -> list[int]:
        return [when for when, names in self.asked if when >= since_ns and name in names]


def staged() -> tuple[Stage, Controller]:
    stage = Stage()
    controller = Controller()
    stage.harness.add(BOOTSTRAP, controller)
    return stage, controller


def test_names_answered_unknown_are_forgotten_once_nobody_waits_for_them():
    stage, controller = staged()
    wrong = ["ordres", "oders", "orderz"]

    # The shell's `_wait_for_topic` asks, and raises at the first UNKNOWN_TOPIC_OR_PARTITION.
    stage.harness.deliver(PRODUCER, RefreshMetadata(topics=wrong), b"")
    stage.harness.run()
    told = [topic for payload in notices([notice for _, notice in stage.harness.notified], "metadata")
            for topic in payload]
    assert {topic.name for topic in told if topic.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION} == set(wrong)

    stage.harness.advance(10_000)  # ten seconds later, nobody has sent to them again
    later = stage.harness.now_ns - 5_000 * 1_000_000
    asked_since = {name: len(controller.naming(name, later)) for name in wrong}
    assert asked_since == dict.fromkeys(wrong, 0), f"metadata requests in the last 5 s: {asked_since}"
    assert not set(wrong) & set(stage.producer.metadata_wanted)
    assert not set(wrong) & set(stage.producer.topics)


def test_a_name_still_asked_for_stays_wanted():
    stage, controller = staged()
    for _ in range(40):  # a caller waiting on a topic being created asks again every 0.5 s
        stage.harness.deliver(PRODUCER, RefreshMetadata(topics=["soon"]), b"")
        stage.harness.advance(500)
    assert controller.naming("soon", stage.harness.now_ns - 1_000 * 1_000_000)


def test_more_wrong_names_than_topics_max_do_not_stop_the_real_topic_from_finding_its_leader():
    stage, controller = staged()
    wrong = [f"typo-{number}" for number in range(DEFAULT_LIMITS.topics_max + 1)]
    for start in range(0, len(wrong), 1000):  # user threads sending to wrong names, each asking once
        stage.harness.deliver(PRODUCER, RefreshMetadata(topics=wrong[start:start + 1000]), b"")

    stage.send(partition=0)  # a batch for the real topic, whose leader is not known yet
    stage.harness.advance(1_000)

    acceptable = [names for _, names in controller.asked
                  if "orders" in names and len(names) <= DEFAULT_LIMITS.topics_max]
    assert acceptable, (f"{len(controller.asked)} metadata requests, none of at most topics_max names "
                        f"naming 'orders' (largest: {max(len(names) for _, names in controller.asked)})")
    [request] = stage.harness.take(leader(1), ProduceRequest)
    assert (request.topic, request.partition) == ("orders", 0)
    assert all(len(names) <= DEFAULT_LIMITS.client_metadata_topics_max for _, names in controller.asked)
    assert len(stage.producer.metadata_wanted) <= DEFAULT_LIMITS.client_metadata_topics_max
    assert len(stage.producer.topics) <= DEFAULT_LIMITS.client_metadata_topics_max


def test_a_name_no_topic_can_have_is_answered_at_once_and_never_asked_for():
    stage, controller = staged()
    name = "x" * 1_000_000  # a megabyte of name, longer than any replica's directory name may be

    stage.harness.deliver(PRODUCER, RefreshMetadata(topics=[name]), b"")
    stage.harness.advance(1_000)

    [told] = [topic for _, notice in stage.harness.notified if notice.kind == "metadata"
              for topic in notice.payload]
    assert (told.name, told.error) == (name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert controller.asked == [] and stage.producer.metadata_wanted == {}
