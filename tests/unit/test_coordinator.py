"""The coordinator (actors/coordinator.py): topics, placement, metadata, liveness and elections.

The coordinator runs in the harness at COORDINATOR over a DurableState on a MemoryFileSystem;
replicas are played by the test: they send heartbeats from their endpoints, and whatever the
coordinator sends them lands in the harness outbox. A "restart" builds a new Coordinator over the
same file system after a crash that forgets everything never flushed.
"""

from __future__ import annotations

import random

import pytest

from actors.coordinator import Coordinator, place_replicas
from actors.effects import AfterFlush
from actors.elections import PartitionRecord
from actors.errors import ErrorCode
from actors.limits import DEFAULT_LIMITS, Limits
from actors.messages import (
    AlterIsrRequest, AlterIsrResponse, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicRequest,
    CreateTopicResponse, DeleteTopicRequest, DeleteTopicResponse, ErrorResponse, FetchRequest,
    InitProducerIdRequest, InitProducerIdResponse, MetadataRequest, MetadataResponse, NodeAssignmentsRequest,
    NodeAssignmentsResponse, ReplicaExited, ReplicaHeartbeat, ReplicaHeartbeatResponse, ServiceHeartbeat,
    ServiceHeartbeatResponse, TimerFired, TopicConfig,
)
from storage.memory import MemoryFileSystem
from storage.state import DurableState
from tests.unit.actor_harness import (
    Harness, at_once, flushed, flushed_messages, messages, only, unflushed_messages,
)
from transport.codec import Codec

COORDINATOR = "coordinator"
ADMIN = "admin"
STATE_PATH = "/coordinator/metadata.state"
NODES = [1, 2, 3]
LIMITS = Limits()  # heartbeat 100 ms, session 1000 ms, grace 1000 ms
SESSION_MS = LIMITS.replica_session_timeout_ms
GRACE_MS = LIMITS.coordinator_election_grace_ms
CREATION_GRACE_MS = max(GRACE_MS, LIMITS.partition_creation_grace_ms)  # a new partition's replicas are starting


def endpoint(topic: str, partition: int, node: int) -> str:
    return f"tcp://127.0.0.1:7/{topic}/{partition}/n{node}"


class Cluster:
    """A coordinator in a harness, and the replicas' side of the conversation."""

    def __init__(self, *, seed: int = 7, limits: Limits = LIMITS, fs: MemoryFileSystem | None = None,
                 harness: Harness | None = None) -> None:
        self.fs = fs or MemoryFileSystem()
        self.seed = seed
        self.limits = limits
        self.harness = harness or Harness()
        self.incarnations: dict[tuple[str, int, int], int] = {}
        self.coordinator = self._build()
        self.harness.add(COORDINATOR, self.coordinator)

    def _build(self) -> Coordinator:
        state = DurableState.open(STATE_PATH, fs=self.fs)
        return Coordinator(state=state, nodes=list(NODES), rng=random.Random(self.seed), limits=self.limits)

    def restart(self) -> None:
        """The coordinator process dies (unflushed state is lost) and starts again."""
        self.harness.remove(COORDINATOR)
        self.fs.crash()
        self.coordinator = self._build()
        self.harness.add(COORDINATOR, self.coordinator)

    def ask(self, message) -> list:
        return self.harness.deliver(COORDINATOR, message, ADMIN)

    def create(self, name="orders", partitions=1, replication_factor=3, **config) -> CreateTopicResponse:
        request = CreateTopicRequest(correlation_id=1, name=name, partitions=partitions,
                                     replication_factor=replication_factor, config=TopicConfig(**config))
        effects = self.ask(request)
        return only(effects, CreateTopicResponse)

    def metadata(self, *topics: str) -> MetadataResponse:
        request = MetadataRequest(correlation_id=2, topics=list(topics) or None)
        return only(self.ask(request), MetadataResponse)

    def replicas(self, topic="orders", partition=0) -> list[int]:
        return list(self.coordinator.topics[topic].replicas[partition])

    def record(self, topic="orders", partition=0) -> PartitionRecord:
        return self.coordinator.partitions[(topic, partition)]

    def heartbeat(self, node: int, topic="orders", partition=0, *, incarnation: int | None = None,
                  **fields) -> list:
        key = (topic, partition, node)
        if incarnation is not None:
            self.incarnations[key] = incarnation
        incarnation = self.incarnations.setdefault(key, 1000 * node + partition + 1)
        known = self.coordinator.topics.get(topic)
        topic_id = fields.pop("topic_id", known.topic_id if known is not None else 0)
        beat = ReplicaHeartbeat(topic=topic, topic_id=topic_id, partition=partition, node=node,
                                endpoint=endpoint(topic, partition, node), pid=node, incarnation=incarnation,
                                **fields)
        return self.harness.deliver(COORDINATOR, beat, endpoint(topic, partition, node))

    def beat_for(self, milliseconds: int, nodes=NODES, topic="orders", partitions=(0,)) -> None:
        """Let time pass with the given replicas heartbeating every interval."""
        interval = self.limits.replica_heartbeat_interval_ms
        for _ in range(milliseconds // interval):
            for partition in partitions:
                for node in nodes:
                    self.heartbeat(node, topic, partition)
            self.harness.advance(interval)

    def pushed_states(self, topic="orders", partition=0, node=None) -> list:
        """States the coordinator pushed (or answered) to replicas, oldest first."""
        found = []
        for each in ([node] if node is not None else NODES):
            found += [response.state for response in self.harness.received(endpoint(topic, partition, each),
                                                                             ReplicaHeartbeatResponse)
                      if response.state is not None]
        return found


def heartbeat_reply(effects: list) -> ReplicaHeartbeatResponse:
    """The answer to a heartbeat: the last message to its sender (pushes to replicas come first)."""
    return messages(effects, ReplicaHeartbeatResponse)[-1]


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


# ---------------------------------------------------------------------------- creating topics


def test_a_created_topic_is_announced_only_after_its_record_is_flushed(cluster):
    request = CreateTopicRequest(correlation_id=5, name="orders", partitions=3, replication_factor=2)

    effects = cluster.ask(request)

    assert unflushed_messages(effects) == []
    response = only(flushed(effects), CreateTopicResponse)
    assert response.correlation_id == 5 and response.error == ErrorCode.NONE
    assert [p.partition for p in response.topic.partitions] == [0, 1, 2]
    assert all(len(p.replicas) == 2 and p.isr == p.replicas and p.leader == p.replicas[0]
               for p in response.topic.partitions)


def test_a_created_topic_survives_a_crash_right_after_the_reply(cluster):
    cluster.create("orders", partitions=2, replication_factor=3, min_insync_replicas=2)
    replicas_before = [cluster.replicas("orders", p) for p in range(2)]

    cluster.restart()

    assert cluster.coordinator.topics["orders"].config.min_insync_replicas == 2
    assert [cluster.replicas("orders", p) for p in range(2)] == replicas_before
    assert cluster.record("orders", 1).isr == replicas_before[1]


# "orders\n": `$` matches before a final newline, and a topic "orders\n" (directories named
# "orders\n-0-<id>", listed as a second "orders") was created.
@pytest.mark.parametrize("name", ["", "a/b", "space name", ".", "..",
                                  "x" * (DEFAULT_LIMITS.topic_name_length_max + 1), "ü",
                                  "orders\n", "..\n"])
def test_a_topic_name_outside_the_allowed_alphabet_or_length_is_refused(cluster, name):
    response = cluster.create(name)

    assert response.error == ErrorCode.INVALID_REQUEST
    assert cluster.coordinator.topics == {}


def test_the_longest_allowed_name_is_accepted(cluster):
    assert cluster.create("x" * DEFAULT_LIMITS.topic_name_length_max).error == ErrorCode.NONE


def test_creating_an_existing_topic_is_refused_and_changes_nothing(cluster):
    first = cluster.create("orders", partitions=2)

    again = cluster.create("orders", partitions=5)

    assert again.error == ErrorCode.TOPIC_ALREADY_EXISTS
    assert len(cluster.coordinator.topics["orders"].replicas) == 2
    assert cluster.coordinator.topics["orders"].topic_id == first.topic.topic_id


def test_the_cluster_refuses_topics_beyond_its_maximum():
    cluster = Cluster(limits=Limits(topics_max=1))
    cluster.create("first")

    assert cluster.create("second").error == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("partitions", [0, -1, LIMITS.partitions_per_topic_max + 1])
def test_a_partition_count_outside_the_limits_is_refused(cluster, partitions):
    assert cluster.create(partitions=partitions).error == ErrorCode.INVALID_PARTITIONS


@pytest.mark.parametrize("replication_factor", [0, 4])
def test_a_replication_factor_the_nodes_cannot_hold_is_refused(cluster, replication_factor):
    assert cluster.create(replication_factor=replication_factor).error == ErrorCode.INVALID_REPLICATION_FACTOR


@pytest.mark.parametrize("config", [
    {"min_insync_replicas": 4}, {"min_insync_replicas": 0}, {"flush_policy": "sometimes"},
    {"segment_bytes": 0}, {"segment_ms": -1}, {"flush_interval_ms": 0}, {"batch_bytes_max": 0},
    {"retention_ms": 0}, {"retention_bytes": -5},
    {"batch_bytes_max": 16 * 1024 * 1024 + 1},  # a batch is fetched whole: it must fit one answer
])
def test_an_invalid_topic_config_is_refused(cluster, config):
    response = cluster.create(replication_factor=3, **config)

    assert response.error == ErrorCode.INVALID_CONFIG
    assert response.error_message
    assert "orders" not in cluster.coordinator.topics


@pytest.mark.parametrize("config", [
    {"segment_bytes": 1}, {"segment_bytes": LIMITS.topic_segment_bytes_min - 1},
    {"segment_ms": 1}, {"segment_ms": LIMITS.topic_segment_ms_min - 1},
])
def test_segments_too_small_to_hold_more_than_a_batch_are_refused(cluster, config):
    """A segment costs its replica a file and ~1.2 KB of memory (its index, its entry): with
    `segment_bytes=1` (or `segment_ms=1`, a batch each millisecond) every batch had its own.
    20,000 batches of 40 bytes made 20,002 files, 81 MB of disk and 25 MB of memory where 64 MiB
    segments took 3 files, 2 MB and 0.4 MB, appends ran 5x slower and a reopen 5x longer: a
    million small batches, a million files (~1.2 GB) on every replica. Kafka 4 (KIP-1030) refuses
    segment.bytes under 1 MB, and Kafka 5 segment.ms under a minute, for this."""
    response = cluster.create(replication_factor=3, **config)

    assert response.error == ErrorCode.INVALID_CONFIG
    assert next(iter(config)) in response.error_message
    assert "orders" not in cluster.coordinator.topics


def test_the_smallest_segments_allowed_are_accepted(cluster):
    smallest = dict(segment_bytes=LIMITS.topic_segment_bytes_min, segment_ms=LIMITS.topic_segment_ms_min)

    response = cluster.create(**smallest)

    assert response.error == ErrorCode.NONE


@pytest.mark.parametrize("settings", [
    {"min_insync_replica": 2}, {"retention_mss": 1_000, "retention_ms": 5}, {"min_insync_replicas": "2"},
    {"min_insync_replicas": 2.0}, {"unclean_leader_election": 1}, {"retention_ms": True},
])
def test_a_raw_clients_unknown_or_mistyped_topic_setting_is_refused_naming_it(cluster, settings):
    """A client speaking the wire itself (no `Admin` to check first). The decoder dropped names it
    did not know, so {"min_insync_replica": 2} made a topic of min in-sync 1 without a word, where
    acks=all acknowledges what one copy holds; a value of another type failed the whole frame."""
    codec = Codec()
    request = codec.decode(codec.encode(CreateTopicRequest(correlation_id=1, name="orders", partitions=1,
                                                           replication_factor=3, config=settings)))

    response = only(cluster.ask(request), CreateTopicResponse)

    assert response.error == ErrorCode.INVALID_CONFIG
    assert next(iter(settings)) in response.error_message
    assert "orders" not in cluster.coordinator.topics


def test_a_raw_clients_settings_by_name_make_the_topic_with_the_rest_at_their_defaults(cluster):
    codec = Codec()
    request = codec.decode(codec.encode(CreateTopicRequest(
        correlation_id=1, name="orders", partitions=1, replication_factor=3,
        config={"min_insync_replicas": 2, "retention_ms": None})))

    assert only(cluster.ask(request), CreateTopicResponse).error == ErrorCode.NONE
    made = cluster.coordinator.topics["orders"].config
    assert made == TopicConfig(min_insync_replicas=2, retention_ms=None)


@pytest.mark.parametrize("settings", [
    {"retention_ms": 2**63}, {"retention_ms": 2**64 - 1}, {"retention_bytes": 2**64 - 1},
    {"segment_ms": 2**64 - 1}, {"flush_policy": "interval", "flush_interval_ms": 2**64 - 1},
])
def test_a_setting_past_what_an_int64_holds_is_refused(cluster, settings):
    """Settings travel as int64s (Kafka's are Longs), but MessagePack carries 64-bit unsigned ints
    too, and {"retention_ms": 2**64 - 1} made a topic: every MetadataResponse then held it, and a
    client in a language that reads the int64 the protocol promises could no longer read any."""
    codec = Codec()
    request = codec.decode(codec.encode(CreateTopicRequest(correlation_id=1, name="orders", partitions=1,
                                                           replication_factor=3, config=settings)))

    response = only(cluster.ask(request), CreateTopicResponse)

    assert response.error == ErrorCode.INVALID_CONFIG
    assert list(settings)[-1] in response.error_message
    assert "orders" not in cluster.coordinator.topics


def test_the_largest_int64_setting_is_taken(cluster):
    assert cluster.create(retention_ms=2**63 - 1, retention_bytes=2**63 - 1, segment_ms=2**63 - 1).error \
        == ErrorCode.NONE


def test_segments_too_large_to_roll_before_retention_bytes_are_refused(cluster):
    """Retention deletes whole closed segments only: with `segment_bytes` 2**62 (and `segment_ms`
    as large) no segment ever closed, and a topic of `retention_bytes` 1 MiB grew until its disk
    was full. Kafka's segment.bytes is an int32: at most 2 GiB past its retention.bytes."""
    too_large = LIMITS.topic_segment_bytes_max + 1

    response = cluster.create(segment_bytes=too_large, segment_ms=2**62, retention_bytes=1024 * 1024)

    assert response.error == ErrorCode.INVALID_CONFIG
    assert "segment_bytes" in response.error_message and "topic_segment_bytes_max" in response.error_message
    assert cluster.create(segment_bytes=LIMITS.topic_segment_bytes_max).error == ErrorCode.NONE


@pytest.mark.parametrize("kind", ["create", "delete", "grow", "alter"])
def test_a_long_name_that_is_no_topic_is_not_echoed_whole_in_the_error_text(cluster, kind):
    """A name of 5 MB of NUL characters was quoted whole in the refusal, and repr() writes each as
    four characters: a 20 MB error text (a name filling the 32 MiB frame: 128 MB, past what any
    client decodes), built, encoded and queued by the active controller's only thread."""
    from actors.messages import AlterTopicConfigRequest

    name = "\x00" * 5_000_000
    request = {"create": CreateTopicRequest(correlation_id=1, name=name, partitions=1),
               "delete": DeleteTopicRequest(correlation_id=1, name=name),
               "grow": CreatePartitionsRequest(correlation_id=1, name=name, total_partitions=2),
               "alter": AlterTopicConfigRequest(correlation_id=1, name=name, changes={"retention_ms": 1}),
               }[kind]

    [answer] = [effect.message for effect in cluster.ask(request)]

    assert answer.error in (ErrorCode.INVALID_REQUEST, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert len(answer.error_message) < 400
    assert cluster.coordinator.topics == {}


def test_a_refusal_is_sent_at_once_because_it_reveals_no_decision(cluster):
    effects = cluster.ask(CreateTopicRequest(correlation_id=1, name="bad/name", partitions=1))

    assert [type(m) for m in unflushed_messages(effects)] == [CreateTopicResponse]


# ---------------------------------------------------------------------------- placement


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_leaders_are_spread_evenly_over_the_nodes(seed):
    cluster = Cluster(seed=seed)
    cluster.create("orders", partitions=6, replication_factor=2)

    leaders = [cluster.replicas("orders", p)[0] for p in range(6)]

    assert sorted(leaders.count(node) for node in NODES) == [2, 2, 2]


def test_followers_are_the_next_nodes_after_the_leader():
    assert place_replicas([1, 2, 3, 4], 0, 4, 3, start=1) == [[2, 3, 4], [3, 4, 1], [4, 1, 2], [1, 2, 3]]
    assert place_replicas([1, 2, 3], 5, 1, 2, start=0) == [[3, 1]]  # partition 5 continues the rotation


# ---------------------------------------------------------------------------- deleting and growing


def test_deleting_a_topic_forgets_it_durably_and_tells_its_replicas_to_stop(cluster):
    cluster.create("orders")
    topic_id = cluster.coordinator.topics["orders"].topic_id
    cluster.heartbeat(1)

    effects = cluster.ask(DeleteTopicRequest(correlation_id=9, name="orders"))

    assert only(flushed(effects), DeleteTopicResponse).error == ErrorCode.NONE
    cluster.restart()
    assert "orders" not in cluster.coordinator.topics
    assert cluster.coordinator.partitions == {}
    metadata = cluster.metadata("orders")
    assert metadata.topics[0].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert only(cluster.heartbeat(1, topic_id=topic_id), ReplicaHeartbeatResponse).deleted
    assert topic_id in cluster.ask(NodeAssignmentsRequest(correlation_id=3, nodes=[1]))[0].message.deleted_topic_ids


def test_a_replica_of_a_topic_the_coordinator_never_deleted_is_not_told_to_stop(cluster):
    """A coordinator that does not know a topic (another cluster's state, a lost file) must not
    make its replicas exit: only a recorded deletion (a tombstone) does."""
    reply = only(cluster.heartbeat(1, topic="never-created", topic_id=123), ReplicaHeartbeatResponse)

    assert not reply.deleted
    assert reply.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert cluster.ask(NodeAssignmentsRequest(correlation_id=3, nodes=[1]))[0].message.deleted_topic_ids == []


def test_deleting_an_unknown_topic_is_an_error(cluster):
    response = only(cluster.ask(DeleteTopicRequest(correlation_id=1, name="nope")), DeleteTopicResponse)

    assert response.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_a_replica_of_a_deleted_and_recreated_topic_is_told_its_topic_is_gone(cluster):
    old_id = cluster.create("orders").topic.topic_id
    cluster.ask(DeleteTopicRequest(correlation_id=1, name="orders"))
    new_id = cluster.create("orders").topic.topic_id

    assert new_id != old_id
    assert only(cluster.heartbeat(1, topic_id=old_id), ReplicaHeartbeatResponse).deleted
    assert not heartbeat_reply(cluster.heartbeat(1, topic_id=new_id)).deleted


def test_a_heartbeat_for_a_partition_the_topic_does_not_have_is_told_to_stop(cluster):
    cluster.create("orders", partitions=2)

    assert only(cluster.heartbeat(1, partition=2), ReplicaHeartbeatResponse).deleted


def test_a_heartbeat_for_a_negative_partition_is_refused_not_a_crash(cluster):
    cluster.create("orders", partitions=2)

    assert only(cluster.heartbeat(1, partition=-1), ReplicaHeartbeatResponse).deleted


def kept_of(coordinator: Coordinator, name: str) -> list[str]:
    """Which of the coordinator's maps still hold an entry of topic `name` (by name or by
    (name, partition...) key)."""
    return sorted(attribute for attribute, value in vars(coordinator).items() if isinstance(value, dict)
                  and any(key == name or (isinstance(key, tuple) and key[:1] == (name,)) for key in value))


def test_a_deleted_topic_leaves_nothing_of_it_but_its_tombstone(cluster):
    """Creating and deleting ever new names is open to any client. Each kept its creation time
    in the active controller for good (~300 bytes a name of 234 characters), and every heartbeat
    walked them all to set the liveness timer: a million such names cost it ~300 MB and a
    million-step loop per heartbeat. The tombstones, the one thing kept, are bounded."""
    for number in range(50):
        name = f"churn-{number}-" + "x" * 200
        assert cluster.create(name, partitions=2).error == ErrorCode.NONE
        effects = cluster.ask(DeleteTopicRequest(correlation_id=1, name=name))
        assert only(flushed(effects), DeleteTopicResponse).error == ErrorCode.NONE

        assert kept_of(cluster.coordinator, name) == []
    assert len(cluster.coordinator.tombstones) == 50


def test_growing_a_topic_gives_a_starting_grace_only_to_the_partitions_it_adds():
    """A new partition's replicas are processes being started: nobody is judged absent for
    `partition_creation_grace_ms`. The grace was the topic's, so every CreatePartitions started it
    again for partitions running long since. After a controller failover a leader that died
    unheard stays the leader until its grace ends; a client adding a partition every few seconds
    (999 times, 83 minutes at 5 s each) kept partition 0 on its dead leader, without a leader."""
    cluster = Cluster()
    leader, replicas = started_topic(cluster)
    cluster.restart()  # the new controller never hears from the leader: it died meanwhile
    grow_every_ms = CREATION_GRACE_MS - 1_000

    for total in range(2, 6):
        grow = CreatePartitionsRequest(correlation_id=3, name="orders", total_partitions=total)
        assert only(flushed(cluster.ask(grow)), CreatePartitionsResponse).error == ErrorCode.NONE
        cluster.beat_for(grow_every_ms, nodes=replicas[1:])

    assert cluster.record().leader == replicas[1], "partition 0 kept a leader the controller never heard from"
    newest = cluster.replicas("orders", 4)
    assert cluster.record("orders", 4).leader == newest[0], "the partition just added was judged in its grace"


def test_growing_a_topic_adds_partitions_with_the_same_replication_factor(cluster):
    cluster.create("orders", partitions=2, replication_factor=2)

    effects = cluster.ask(CreatePartitionsRequest(correlation_id=3, name="orders", total_partitions=5))

    assert only(flushed(effects), CreatePartitionsResponse).error == ErrorCode.NONE
    topic = cluster.metadata("orders").topics[0]
    assert [p.partition for p in topic.partitions] == [0, 1, 2, 3, 4]
    assert all(len(p.replicas) == 2 for p in topic.partitions)
    cluster.restart()
    assert len(cluster.coordinator.topics["orders"].replicas) == 5
    assert ("orders", 4) in cluster.coordinator.partitions


@pytest.mark.parametrize("total, code", [
    (2, ErrorCode.INVALID_PARTITIONS), (1, ErrorCode.INVALID_PARTITIONS),
    (LIMITS.partitions_per_topic_max + 1, ErrorCode.INVALID_PARTITIONS),
])
def test_growing_must_add_partitions_within_the_limit(cluster, total, code):
    cluster.create("orders", partitions=2)

    request = CreatePartitionsRequest(correlation_id=1, name="orders", total_partitions=total)

    response = only(cluster.ask(request), CreatePartitionsResponse)

    assert response.error == code
    assert len(cluster.coordinator.topics["orders"].replicas) == 2


def test_growing_an_unknown_topic_is_an_error(cluster):
    response = only(cluster.ask(CreatePartitionsRequest(correlation_id=1, name="nope", total_partitions=3)),
                    CreatePartitionsResponse)

    assert response.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_node_assignments_list_each_nodes_replicas_including_new_partitions(cluster):
    cluster.create("orders", partitions=3, replication_factor=1)
    cluster.ask(CreatePartitionsRequest(correlation_id=1, name="orders", total_partitions=6))

    response = only(cluster.ask(NodeAssignmentsRequest(correlation_id=4, nodes=[2])), NodeAssignmentsResponse)

    expected = sorted(p for p in range(6) if cluster.replicas("orders", p) == [2])
    assert sorted(assignment.partition for assignment in response.replicas) == expected
    assert len(expected) == 2
    assert all(assignment.node == 2 and assignment.topic == "orders" for assignment in response.replicas)


# ---------------------------------------------------------------------------- metadata and heartbeats


def test_metadata_names_no_leader_endpoint_until_the_leader_reports(cluster):
    cluster.create("orders")
    leader = cluster.replicas()[0]

    before = cluster.metadata("orders").topics[0].partitions[0]
    cluster.heartbeat(leader, log_end_offset=42, high_watermark=40, log_start_offset=3)
    after = cluster.metadata("orders").topics[0].partitions[0]

    assert before.leader == leader and before.leader_endpoint == ""
    assert before.error == ErrorCode.LEADER_NOT_AVAILABLE
    assert after.leader_endpoint == endpoint("orders", 0, leader) and after.error == ErrorCode.NONE
    info = {entry.node: entry for entry in after.replica_info}
    assert info[leader].alive and (info[leader].log_start_offset, info[leader].log_end_offset,
                                   info[leader].high_watermark) == (3, 42, 40)
    assert not any(info[node].alive for node in NODES if node != leader)


def test_metadata_for_every_topic_is_sorted_and_unknown_topics_carry_an_error(cluster):
    cluster.create("beta")
    cluster.create("alpha")

    everything = cluster.metadata()
    asked = cluster.metadata("alpha", "missing")

    assert [t.name for t in everything.topics] == ["alpha", "beta"]
    assert everything.nodes == NODES
    assert [(t.name, t.error) for t in asked.topics] == [
        ("alpha", ErrorCode.NONE), ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]


def test_a_metadata_request_naming_a_topic_many_times_is_answered_once_per_topic():
    """Each name in a MetadataRequest was answered with the topic's whole metadata, repeats
    included: a 2 MB request naming a 3-partition topic 1,000,000 times cost the active controller
    47 s and 3.5 GB building a ~900 MB answer (its quorum deposed it meanwhile), and 32 MiB of
    names would have taken 50 GB. Names are answered once each (Kafka reads them as a set), and a
    request naming more than `topics_max` is refused before anything is built."""
    cluster = Cluster(limits=Limits(topics_max=100))
    cluster.create("orders", partitions=3)
    one = cluster.metadata("orders")

    repeated = cluster.metadata(*["orders", "missing"] * 50)
    refused = cluster.metadata(*["orders"] * 101)

    assert [(t.name, t.error) for t in repeated.topics] == [
        ("orders", ErrorCode.NONE), ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    assert repeated.topics[0] == one.topics[0]
    assert refused.error == ErrorCode.INVALID_REQUEST and "topics_max" in refused.error_message
    assert refused.topics == []


def test_an_unknown_topic_name_is_not_echoed_whole_in_the_error_text(cluster):
    """An unknown name came back twice (its name and its error text): a megabyte of name was two
    megabytes of answer. The text quotes only its start; the name is echoed once, to match on."""
    name = "x" * 1_000_000

    answer = cluster.metadata(name)

    assert answer.topics[0].name == name and answer.topics[0].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert len(answer.topics[0].error_message) < 200


def test_metadata_names_the_group_coordinator_while_it_heartbeats(cluster):
    beat = ServiceHeartbeat(role="group-coordinator", endpoint="tcp://127.0.0.1:9/groups", pid=5,
                            incarnation=1)
    reply = only(cluster.harness.deliver(COORDINATOR, beat, "groups"), ServiceHeartbeatResponse)

    assert reply.error == ErrorCode.NONE
    assert cluster.metadata().group_coordinator_endpoint == "tcp://127.0.0.1:9/groups"
    # It announces itself once per node heartbeat interval, so it is judged by the node session.
    cluster.harness.advance(LIMITS.node_session_timeout_ms - 1)
    assert cluster.metadata().group_coordinator_endpoint == "tcp://127.0.0.1:9/groups"
    cluster.harness.advance(2)
    assert cluster.metadata().group_coordinator_endpoint == ""


def test_a_heartbeat_carrying_current_epochs_gets_no_state_and_a_stale_one_does(cluster):
    cluster.create("orders")
    record = cluster.record()

    first = heartbeat_reply(cluster.heartbeat(1))
    epoch, partition_epoch = record.leader_epoch, record.partition_epoch
    current = only(cluster.heartbeat(1, leader_epoch=epoch, partition_epoch=partition_epoch),
                   ReplicaHeartbeatResponse)
    stale = only(cluster.heartbeat(1, leader_epoch=epoch - 1, partition_epoch=partition_epoch),
                 ReplicaHeartbeatResponse)

    assert first.state is not None  # a new incarnation always learns the state
    assert current.state is None
    assert stale.state is not None and stale.state.leader_epoch == record.leader_epoch


def test_a_follower_without_the_leaders_endpoint_gets_the_state_again_though_its_epochs_are_current(cluster):
    # A state pushed before the leader reported named no endpoint; the announcement that followed
    # can be lost. Epochs alone would call the follower up to date for ever (simulation seed 1050).
    leader, replicas = started_topic(cluster)
    follower = replicas[1]
    record = cluster.record()
    epochs = {"leader_epoch": record.leader_epoch, "partition_epoch": record.partition_epoch}

    lost = only(cluster.heartbeat(follower, leader_endpoint="", **epochs), ReplicaHeartbeatResponse)
    knows = only(cluster.heartbeat(follower, leader_endpoint=endpoint("orders", 0, leader), **epochs),
                 ReplicaHeartbeatResponse)
    the_leader = only(cluster.heartbeat(leader, **epochs), ReplicaHeartbeatResponse)

    assert lost.state is not None and lost.state.leader_endpoint == endpoint("orders", 0, leader)
    assert knows.state is None
    assert the_leader.state is None, "a leader fetches from nobody"


def test_an_unknown_message_gets_a_typed_error(cluster):
    effects = cluster.ask(FetchRequest(correlation_id=77, topic="orders", partition=0, offset=0))

    response = only(effects, ErrorResponse)
    assert (response.correlation_id, response.error) == (77, ErrorCode.UNKNOWN_MESSAGE)


# ---------------------------------------------------------------------------- failure detection


def started_topic(cluster: Cluster, **config) -> tuple[int, list[int]]:
    """A 3-replica topic whose replicas have heartbeated through the grace period."""
    cluster.create("orders", **config)
    cluster.beat_for(CREATION_GRACE_MS + 200)
    replicas = cluster.replicas()
    assert cluster.record().leader == replicas[0]
    return replicas[0], replicas


def test_a_silent_leader_is_replaced_after_the_session_timeout_and_the_new_state_is_pushed(cluster):
    leader, replicas = started_topic(cluster)
    epoch_before = cluster.record().leader_epoch
    survivors = replicas[1:]

    cluster.beat_for(SESSION_MS - 100, nodes=survivors)
    assert cluster.record().leader == leader, "replaced before the session timeout"
    cluster.beat_for(300, nodes=survivors)

    record = cluster.record()
    assert record.leader == survivors[0]
    assert record.isr == survivors
    assert record.leader_epoch == epoch_before + 1
    push_steps = [step for step in cluster.harness.steps_of(COORDINATOR)
                  if any(isinstance(e, AfterFlush) for e in step.effects)
                  and isinstance(step.message, TimerFired)]
    assert push_steps, "the election was not announced from the liveness timer"
    pushed = flushed_messages(push_steps[-1].effects, ReplicaHeartbeatResponse)
    assert {m.state.leader for m in pushed} == {survivors[0]}
    assert len(pushed) == len(survivors)
    assert cluster.pushed_states(node=leader)[-1].leader == leader  # nothing sent to the silent one
    assert [t["leader"] for t in cluster.harness.trace_events("leader-elected")] == [survivors[0]]


def test_nobody_is_judged_during_the_grace_period_after_a_start(cluster):
    cluster.create("orders")
    leader, *others = cluster.replicas()

    cluster.beat_for(CREATION_GRACE_MS - 100, nodes=others)

    assert cluster.record().leader == leader
    cluster.beat_for(300, nodes=others)
    assert cluster.record().leader == others[0]


def test_a_replica_exit_notice_replaces_the_leader_without_waiting(cluster):
    leader, replicas = started_topic(cluster)
    incarnation = cluster.incarnations[("orders", 0, leader)]

    effects = cluster.ask(ReplicaExited(topic="orders", partition=0, node=leader, incarnation=incarnation))

    assert cluster.record().leader == replicas[1]
    pushed = flushed_messages(effects, ReplicaHeartbeatResponse)
    assert pushed and all(m.state.leader == replicas[1] for m in pushed)
    assert unflushed_messages(effects) == []


def test_an_exit_notice_for_an_older_incarnation_is_ignored(cluster):
    leader, _ = started_topic(cluster)
    stale = cluster.incarnations[("orders", 0, leader)] - 1

    effects = cluster.ask(ReplicaExited(topic="orders", partition=0, node=leader, incarnation=stale))

    assert effects == []
    assert cluster.record().leader == leader


def test_a_late_heartbeat_from_an_exited_incarnation_does_not_revive_it():
    cluster = Cluster()
    cluster.create("solo", replication_factor=1)
    cluster.beat_for(CREATION_GRACE_MS + 200, nodes=cluster.replicas("solo"), topic="solo")
    node = cluster.replicas("solo")[0]
    cluster.ask(ReplicaExited(topic="solo", partition=0, node=node,
                              incarnation=cluster.incarnations[("solo", 0, node)]))
    assert cluster.record("solo").leader == -1

    cluster.heartbeat(node, topic="solo")  # was in flight when the process died

    assert cluster.record("solo").leader == -1


def test_a_restarted_replica_reporting_a_new_incarnation_leaves_the_isr_at_once(cluster):
    leader, replicas = started_topic(cluster)
    follower = replicas[2]

    effects = cluster.heartbeat(follower, incarnation=999_999)

    assert cluster.record().isr == replicas[:2]
    assert unflushed_messages(effects) == []
    told = flushed_messages(effects, ReplicaHeartbeatResponse)
    assert {m.state.partition_epoch for m in told} == {cluster.record().partition_epoch}
    assert all(m.state.isr == replicas[:2] for m in told)


@pytest.mark.parametrize("allowed", [False, True])
def test_an_unclean_election_happens_only_when_the_topic_allows_it(allowed):
    cluster = Cluster()
    leader, replicas = started_topic(cluster, unclean_leader_election=allowed)
    for node, end in ((replicas[1], 40), (replicas[2], 70)):  # restarted: out of the ISR
        cluster.heartbeat(node, incarnation=50_000 + node, log_end_offset=end)
    assert cluster.record().isr == [leader]

    cluster.ask(ReplicaExited(topic="orders", partition=0, node=leader,
                              incarnation=cluster.incarnations[("orders", 0, leader)]))

    assert cluster.record().leader == (replicas[2] if allowed else -1)
    assert cluster.record().isr == ([replicas[2]] if allowed else [leader])
    assert bool(cluster.harness.trace_events("unclean-election")) == allowed


# ---------------------------------------------------------------------------- ISR changes from leaders


def alter_request(cluster: Cluster, isr, **changes) -> AlterIsrRequest:
    record = cluster.record()
    fields = dict(correlation_id=11, topic="orders", partition=0, leader=record.leader,
                  leader_epoch=record.leader_epoch, partition_epoch=record.partition_epoch, isr=list(isr),
                  isr_incarnations=[cluster.incarnations[("orders", 0, node)] for node in isr])
    fields.update(changes)
    return AlterIsrRequest(**fields)


def test_a_leaders_isr_shrink_is_stored_before_the_leader_hears_of_it(cluster):
    leader, replicas = started_topic(cluster)
    epoch = cluster.record().partition_epoch

    request = alter_request(cluster, replicas[:2])

    effects = cluster.harness.deliver(COORDINATOR, request, endpoint("orders", 0, leader))

    response = only(flushed(effects), AlterIsrResponse)
    assert response.error == ErrorCode.NONE and response.state.isr == replicas[:2]
    assert response.state.partition_epoch == epoch + 1
    cluster.restart()
    assert cluster.record().isr == replicas[:2]


def test_settings_changed_between_a_leaders_isr_changes_do_not_refuse_them(cluster):
    """A settings change bumps every partition's epoch (that is how replicas take it), and a
    leader asks for an ISR change at the epoch it last heard. Any client may alter a topic's
    settings, and with one alter decided before each ISR change every change was refused as
    stale (0 of 20 taken): the leader heard the new epoch only in the refusal, and the next alter
    came first again. A slow follower then stays in the ISR (acks=all writes wait for it) and a
    caught-up one never rejoins. An ISR change asked at an epoch only settings changes followed
    is asked of the same leader and ISR, and is taken."""
    leader, replicas = started_topic(cluster)
    known = cluster.record().partition_epoch  # what the leader last heard
    taken = 0
    for round_number in range(20):
        assert alter(cluster, retention_ms=60_000 + round_number).error == ErrorCode.NONE
        isr = replicas[:2] if cluster.record().isr == replicas else replicas
        request = alter_request(cluster, isr, partition_epoch=known, correlation_id=100 + round_number)
        effects = cluster.harness.deliver(COORDINATOR, request, endpoint("orders", 0, leader))
        response = only(messages(effects, AlterIsrResponse) or flushed(effects), AlterIsrResponse)
        taken += response.error == ErrorCode.NONE
        known = response.state.partition_epoch
    assert taken == 20, f"{taken} of 20 ISR changes were taken"
    assert cluster.record().isr == replicas
    # Asked at an epoch from before the last ISR change, it is still stale.
    assert alter(cluster, retention_ms=1).error == ErrorCode.NONE
    stale = alter_request(cluster, replicas[:2], partition_epoch=request.partition_epoch)
    effects = cluster.harness.deliver(COORDINATOR, stale, endpoint("orders", 0, leader))
    assert only(effects, AlterIsrResponse).error == ErrorCode.INVALID_REQUEST
    assert cluster.record().isr == replicas


def test_a_fenced_isr_change_is_answered_at_once_with_the_current_state(cluster):
    leader, replicas = started_topic(cluster)
    record = cluster.record()

    effects = cluster.ask(alter_request(cluster, replicas[:2], leader_epoch=record.leader_epoch - 1))

    response = only(at_once(effects), AlterIsrResponse)
    assert response.error == ErrorCode.FENCED_LEADER_EPOCH
    assert response.state.leader_epoch == record.leader_epoch
    assert cluster.record().isr == replicas


def test_an_isr_change_for_an_unknown_partition_is_refused(cluster):
    cluster.create("orders")

    effects = cluster.ask(AlterIsrRequest(correlation_id=1, topic="orders", partition=3, leader=1,
                                          leader_epoch=0, partition_epoch=0, isr=[1]))

    assert only(effects, AlterIsrResponse).error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# ---------------------------------------------------------------------------- restarts


def test_after_a_restart_epochs_and_isr_are_remembered_and_nobody_is_judged_during_the_grace(cluster):
    leader, replicas = started_topic(cluster)
    cluster.ask(ReplicaExited(topic="orders", partition=0, node=leader,
                              incarnation=cluster.incarnations[("orders", 0, leader)]))
    before = cluster.record()

    cluster.restart()

    assert cluster.record() == before
    cluster.beat_for(GRACE_MS - 100, nodes=[replicas[2]])
    assert cluster.record().leader == before.leader, "judged during the grace period"
    cluster.beat_for(300, nodes=[replicas[2]])
    assert cluster.record().leader == replicas[2]
    assert cluster.record().leader_epoch == before.leader_epoch + 1


def test_producer_ids_increase_and_are_never_reused_after_a_restart(cluster):
    def init() -> int:
        effects = cluster.ask(InitProducerIdRequest(correlation_id=1))
        return only(flushed(effects), InitProducerIdResponse).producer_id

    first, second = init(), init()
    cluster.restart()
    third = init()

    assert first < second < third


# ---------------------------------------------------------------------------- limits that fit one process per replica


def test_a_topic_that_would_ask_a_node_for_too_many_replica_processes_is_refused():
    limits = Limits(replica_processes_per_node_max=10)
    cluster = Cluster(limits=limits)

    answer = only(cluster.ask(CreateTopicRequest(correlation_id=1, name="big", partitions=11, replication_factor=3)),
                  CreateTopicResponse)

    assert answer.error == ErrorCode.LIMIT_REACHED and "replica_processes_per_node_max" in answer.error_message
    assert "big" not in cluster.coordinator.topics


def test_the_process_limit_counts_every_topic_and_growing_one_too():
    limits = Limits(replica_processes_per_node_max=10)
    cluster = Cluster(limits=limits)
    assert only(flushed(cluster.ask(CreateTopicRequest(correlation_id=1, name="a", partitions=6, replication_factor=3))),
                CreateTopicResponse).error == ErrorCode.NONE

    second = only(cluster.ask(CreateTopicRequest(correlation_id=2, name="b", partitions=5, replication_factor=3)),
                  CreateTopicResponse)
    grown = only(cluster.ask(CreatePartitionsRequest(correlation_id=3, name="a", total_partitions=11)),
                 CreatePartitionsResponse)

    assert second.error == ErrorCode.LIMIT_REACHED and grown.error == ErrorCode.LIMIT_REACHED


# ---------------------------------------------------------------------------- altering a topic's settings


def alter(cluster, **changes):
    from actors.messages import AlterTopicConfigRequest, AlterTopicConfigResponse

    effects = cluster.ask(AlterTopicConfigRequest(correlation_id=4, name="orders", changes=changes))
    return only(messages(effects, AlterTopicConfigResponse) or flushed(effects), AlterTopicConfigResponse)


def test_retention_and_min_in_sync_change_durably_and_reach_the_replicas(cluster):
    cluster.create("orders", min_insync_replicas=2)
    cluster.beat_for(300)
    epoch_before = cluster.coordinator.partitions[("orders", 0)].partition_epoch

    answer = alter(cluster, retention_ms=60_000, retention_bytes=None, min_insync_replicas=1)

    assert answer.error == ErrorCode.NONE
    assert (answer.config.retention_ms, answer.config.min_insync_replicas) == (60_000, 1)
    assert cluster.coordinator.partitions[("orders", 0)].partition_epoch == epoch_before + 1
    for node in cluster.replicas():
        pushed = [m for m in cluster.harness.take(endpoint("orders", 0, node), ReplicaHeartbeatResponse) if m.state]
        assert pushed and pushed[-1].state.config.retention_ms == 60_000, f"node {node} did not hear of the change"
    cluster.restart()
    assert cluster.coordinator.topics["orders"].config.retention_ms == 60_000


@pytest.mark.parametrize("changes, code", [
    ({"segment_bytes": 1024}, ErrorCode.INVALID_CONFIG),
    ({"min_insync_replicas": 4}, ErrorCode.INVALID_CONFIG),
    ({"retention_ms": -5}, ErrorCode.INVALID_CONFIG),
    ({"min_insync_replicas": True}, ErrorCode.INVALID_CONFIG),
])
def test_a_setting_that_cannot_change_or_a_bad_value_is_refused_and_nothing_changes(cluster, changes, code):
    cluster.create("orders")
    before = cluster.coordinator.topics["orders"].config

    answer = alter(cluster, **changes)

    assert answer.error == code
    assert cluster.coordinator.topics["orders"].config == before


def test_a_retention_change_past_what_an_int64_holds_is_refused_and_nothing_changes(cluster):
    cluster.create("orders")
    before = cluster.coordinator.topics["orders"].config

    answer = alter(cluster, retention_bytes=2**64 - 1)

    assert answer.error == ErrorCode.INVALID_CONFIG and "retention_bytes" in answer.error_message
    assert cluster.coordinator.topics["orders"].config == before


def test_a_misspelt_setting_is_named_as_unknown_not_as_one_that_cannot_change(cluster):
    cluster.create("orders")

    answer = alter(cluster, min_insync_replica=1)

    assert answer.error == ErrorCode.INVALID_CONFIG
    assert "no topic setting is called 'min_insync_replica'" in answer.error_message


def test_turning_on_unclean_election_lets_an_offline_partition_elect_a_live_replica(cluster):
    cluster.create("orders")
    cluster.beat_for(300)
    leader = cluster.coordinator.partitions[("orders", 0)].leader
    others = [node for node in cluster.replicas() if node != leader]
    cluster.coordinator.partitions[("orders", 0)].isr[:] = [leader]  # only the leader is in sync ...
    cluster.beat_for(2_000, nodes=others)  # ... and it dies: offline
    assert cluster.coordinator.partitions[("orders", 0)].leader == -1

    alter(cluster, unclean_leader_election=True)

    assert cluster.coordinator.partitions[("orders", 0)].leader in others


def test_an_offline_partition_elects_its_returning_isr_member_though_heartbeats_come_faster_than_the_interval(cluster):
    # Every heartbeat re-sets the liveness timer; while a partition has no leader that timer must
    # still fire once per interval, not be pushed an interval ahead by each of many heartbeats.
    leader, replicas = started_topic(cluster)
    cluster.coordinator.partitions[("orders", 0)].isr[:] = [leader]  # only the leader is in sync ...
    cluster.beat_for(2_000, nodes=replicas[1:])  # ... and it goes silent: offline
    assert cluster.record().leader == -1

    step_ms = LIMITS.replica_heartbeat_interval_ms // len(replicas)
    for _ in range(2_000 // step_ms):  # the leader is back; one report lands every third of an interval
        for node in replicas:
            cluster.heartbeat(node)
            cluster.harness.advance(step_ms)

    assert cluster.record().leader == leader
