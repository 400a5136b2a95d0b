"""The actors the fuzzer (chaos/fuzz.py) runs, each over memory storage, in a state worth fuzzing.

Each is built the way transport/actor_main.py builds it, then brought to a working state by a few
ordinary messages — a topic created, a partition led with records in its log, a follower told whom
to follow, clients with metadata — so that fuzzed messages reach the handlers' deeper branches.
A target rebuilt after a crash or an exit reopens the same memory storage (after a simulated
crash of it), like a restarted process.
"""

from __future__ import annotations

import random

from actors.coordinator import Coordinator
from actors.group_coordinator import GroupCoordinator
from actors.limits import Limits
from actors.messages import (
    ClientCommand, CreateTopicRequest, MetadataResponse, PartitionMetadata, PartitionState, ProduceRequest,
    ReplicaHeartbeatResponse, SendBatch, TopicConfig, TopicMetadata,
)
from actors.partition_replica import PartitionReplica
from chaos.fuzz import START_NS, Target
from storage.batch import encode_batch
from storage.memory import MemoryFileSystem
from storage.replica_meta import ReplicaMeta, open_replica_directory
from storage.state import DurableState
from transport.actor_main import log_config_for

TOPIC, TOPIC_ID = "orders", 0xA11CE
LEADER, FOLLOWER = "tcp://127.0.0.1:9/orders/0/n1", "tcp://127.0.0.1:9/orders/0/n2"
# Small segments (below topic_segment_bytes_min) so that a few fuzzed batches roll them.
LIMITS = Limits(coordinator_election_grace_ms=0, partition_creation_grace_ms=0,
                topic_segment_bytes_min=16 * 1024)
CONFIG = TopicConfig(min_insync_replicas=2, segment_bytes=16 * 1024)


def _hints(**extra) -> dict[str, tuple]:
    hints = {"topic": (TOPIC, "other"), "partition": (0, 1, 2), "topic_id": (0, TOPIC_ID, TOPIC_ID + 1),
             "leader_epoch": (-1, 0, 1, 2), "partition_epoch": (0, 1, 2), "replica": (-1, 1, 2, 3),
             "node": (1, 2, 3), "leader": (-1, 1, 2), "nodes": (1, 2, 3), "replicas": (1, 2, 3), "isr": (1, 2, 3),
             "group_id": ("g", "s", "fresh"), "acks": (-1, 0, 1), "timestamp_ms": (-2, -1, 0, 1_000),
             "max_wait_ms": (0, 0, 10), "correlation_id": (0, 1, 2, 3), "name": (TOPIC, "new-topic")}
    hints.update(extra)
    return hints


def coordinator_target() -> Target:
    fs = MemoryFileSystem()

    def build() -> Coordinator:
        fs.crash()
        actor = Coordinator(state=DurableState.open("/c/metadata.state", fs=fs, confirm=True), nodes=[1, 2, 3],
                            rng=random.Random(1), limits=LIMITS, cluster_id="fuzz")
        if TOPIC not in actor.topics:
            actor.handle(CreateTopicRequest(correlation_id=1, name=TOPIC, partitions=3, replication_factor=3,
                                            config=CONFIG), b"admin", START_NS)
            actor.state.flush()
            assert TOPIC in actor.topics, "the fuzzed coordinator has no topic: its rules were not exercised"
        return actor

    return Target("coordinator", build, _hints())


def _replica(node: int, fs: MemoryFileSystem, endpoint: str) -> PartitionReplica:
    fs.crash()
    meta = ReplicaMeta(cluster_id="fuzz", topic=TOPIC, topic_id=TOPIC_ID, partition=0, node=node, replicas=[1, 2, 3])
    opened = open_replica_directory(fs, "/replica", meta, log_config_for(CONFIG), START_NS // 1_000_000)
    return PartitionReplica(topic=TOPIC, topic_id=TOPIC_ID, partition=0, node=node, endpoint=endpoint,
                            coordinator="coordinator", log=opened.log, config=CONFIG, incarnation=node * 10,
                            limits=LIMITS, health=opened.health, findings=opened.findings)


def _state(leader: int, endpoint: str) -> PartitionState:
    return PartitionState(topic=TOPIC, topic_id=TOPIC_ID, partition=0, leader=leader, leader_endpoint=endpoint,
                          leader_epoch=1, partition_epoch=1, replicas=[1, 2, 3], isr=[1, 2, 3], config=CONFIG)


def leader_target() -> Target:
    fs = MemoryFileSystem()

    def build() -> PartitionReplica:
        replica = _replica(1, fs, LEADER)
        replica.handle(ReplicaHeartbeatResponse(state=_state(1, LEADER)), "coordinator", START_NS)
        if replica.log.log_end_offset == 0:
            for index in range(5):
                batch = bytes(encode_batch([(0, f"k{index}".encode(), b"value", None)] * 3, 1_000))
                replica.handle(ProduceRequest(correlation_id=index, topic=TOPIC, partition=0, acks=1, batch=batch),
                               b"producer", START_NS)
        return replica

    return Target("replica-leader", build, _hints(offset=(0, 3, 15, 16, -1, 2**40)))


def follower_target() -> Target:
    fs = MemoryFileSystem()

    def build() -> PartitionReplica:
        replica = _replica(2, fs, FOLLOWER)
        replica.handle(ReplicaHeartbeatResponse(state=_state(1, LEADER)), "coordinator", START_NS)
        return replica

    return Target("replica-follower", build, _hints(offset=(0, 1, 5, -1), correlation_id=(0, 1, 2, 3, 4, 5)))


def group_coordinator_target() -> Target:
    fs = MemoryFileSystem()

    def build() -> GroupCoordinator:
        fs.crash()
        return GroupCoordinator(state=DurableState.open("/g/groups.state", fs=fs), coordinator="coordinator",
                                endpoint="tcp://127.0.0.1:9/groups", incarnation=7, limits=LIMITS, rng=random.Random(2))

    return Target("group-coordinator", build, _hints(member_id=("", "m-1", "member-000000000001"),
                                                    generation=(-1, 0, 1, 2), protocol_type=("consumer", "other")))


def _metadata() -> MetadataResponse:
    partitions = [PartitionMetadata(partition=p, leader=1, leader_endpoint=LEADER, leader_epoch=1) for p in range(3)]
    return MetadataResponse(correlation_id=1, topics=[TopicMetadata(name=TOPIC, topic_id=TOPIC_ID, partitions=partitions)],
                            group_coordinator_endpoint="tcp://127.0.0.1:9/groups")


def producer_target() -> Target:
    from actors.producer_client import ProducerClient, ProducerSettings

    def build() -> ProducerClient:
        client = ProducerClient(bootstrap="coordinator", settings=ProducerSettings(acks=-1, idempotent=False))
        client.handle(_metadata(), "coordinator", START_NS)
        client.handle(SendBatch(batch_id=1, topic=TOPIC, partition=0, records=[(0, b"k", b"v", None)],
                                first_timestamp_ms=1_000, max_timestamp_ms=1_000, deadline_ns=START_NS + 10**12),
                      b"", START_NS)
        return client

    return Target("producer", build, _hints())


def consumer_target() -> Target:
    from actors.consumer_client import ConsumerClient, ConsumerSettings

    def build() -> ConsumerClient:
        client = ConsumerClient(bootstrap="coordinator", settings=ConsumerSettings(auto_offset_reset="earliest"))
        client.handle(ClientCommand(command="assign", arguments={"partitions": [(TOPIC, 0), (TOPIC, 1)]}, token=1),
                      b"", START_NS)
        client.handle(_metadata(), "coordinator", START_NS)
        return client

    return Target("consumer", build, _hints())


def all_targets() -> list[Target]:
    return [coordinator_target(), leader_target(), follower_target(), group_coordinator_target(),
            producer_target(), consumer_target()]
