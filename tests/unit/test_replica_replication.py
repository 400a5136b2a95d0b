"""Replication in one process: a coordinator and three partition replicas routed by the harness.

The first stories run the whole control loop: the coordinator elects, replicas heartbeat and
fetch, clients produce to whoever leads. The later ones set two replicas' logs up by hand with
the epoch histories of KIP-279's examples and let the real follower and leader code reconcile
them. In every story the end state is checked byte for byte: every replica's log must equal
the leader's.
"""

from __future__ import annotations

import random

import pytest

from actors.coordinator import Coordinator
from actors.effects import AfterFlush, Send
from actors.errors import ErrorCode
from actors.limits import Limits
from actors.messages import (
    CreateTopicRequest, CreateTopicResponse, FetchRequest, FetchResponse, PartitionState, ProduceRequest,
    ProduceResponse, ReplicaExited, ReplicaHeartbeatResponse, TopicConfig,
)
from actors.partition_replica import PartitionReplica
from storage.batch import decode_records, encode_batch, iter_batches
from storage.log import LogConfig
from storage.memory import MemoryFileSystem, open_memory_log
from storage.state import DurableState
from tests.helpers import producer_secret_of
from tests.unit.actor_harness import Harness, flushed, messages, only, unflushed_messages

COORDINATOR, CLIENT = "coordinator", "client"
LIMITS = Limits()
WHOLE_LOG_BYTES = 1 << 30


def endpoint(node: int, generation: int = 0) -> str:
    return f"tcp://127.0.0.1:7{node}{generation}/orders/0"


def batch(count: int, tag: str, first_timestamp_ms: int = 1_000) -> bytes:
    records = [(i, f"{tag}-{i}".encode(), f"value-{tag}-{i}".encode(), None) for i in range(count)]
    return bytes(encode_batch(records, first_timestamp_ms))


def log_bytes(log) -> bytes:
    if log.log_end_offset == log.log_start_offset:
        return b""
    return log.read(log.log_start_offset, WHOLE_LOG_BYTES)


def tags_in(log) -> list[str]:
    """The first key of every batch, to read which writes a log holds."""
    data = log_bytes(log)
    return [decode_records(data, header, position)[0][1].decode() for position, header in iter_batches(data)]


class Cluster:
    """Coordinator + one replica per node for a 3-replica topic `orders` with one partition."""

    def __init__(self, *, seed: int = 3, **config) -> None:
        self.harness = Harness()
        self.coordinator_fs = MemoryFileSystem()
        self.coordinator = self.new_coordinator(seed)
        self.harness.add(COORDINATOR, self.coordinator)
        self.config = TopicConfig(**config)
        created = only(self.harness.deliver(COORDINATOR, CreateTopicRequest(
            correlation_id=1, name="orders", partitions=1, replication_factor=3, config=self.config)),
            CreateTopicResponse)
        self.topic_id = created.topic.topic_id
        self.disks = {node: MemoryFileSystem() for node in (1, 2, 3)}
        self.logs = {node: open_memory_log(LogConfig(), fs=self.disks[node]) for node in (1, 2, 3)}
        self.generation = {node: 0 for node in (1, 2, 3)}
        self.replicas: dict[int, PartitionReplica] = {}
        for node in (1, 2, 3):
            self.start_replica(node)
        self.harness.advance(LIMITS.coordinator_election_grace_ms + 300)
        self.correlation = 0

    def new_coordinator(self, seed: int) -> Coordinator:
        state = DurableState.open("/coordinator/state", fs=self.coordinator_fs)
        return Coordinator(state=state, nodes=[1, 2, 3], rng=random.Random(seed), limits=LIMITS)

    def restart_coordinator(self) -> None:
        """The coordinator process dies, forgetting what it never flushed, and starts again."""
        self.harness.remove(COORDINATOR)
        self.coordinator_fs.crash()
        self.coordinator = self.new_coordinator(seed=99)
        self.harness.add(COORDINATOR, self.coordinator)

    def start_replica(self, node: int) -> PartitionReplica:
        self.generation[node] += 1
        replica = PartitionReplica(
            topic="orders", topic_id=self.topic_id, partition=0, node=node, endpoint=endpoint(node),
            coordinator=COORDINATOR, log=self.logs[node], config=self.config,
            incarnation=1000 * node + self.generation[node], limits=LIMITS)
        self.replicas[node] = replica
        self.harness.add(endpoint(node), replica)
        return replica

    @property
    def leader(self) -> int:
        return self.coordinator.partitions[("orders", 0)].leader

    def produce(self, tag: str, *, count: int = 1, acks: int = -1, to: int | None = None) -> None:
        self.correlation += 1
        node = self.leader if to is None else to
        request = ProduceRequest(correlation_id=self.correlation, topic="orders", partition=0, acks=acks,
                                 batch=batch(count, tag))
        self.harness.deliver(endpoint(node), request, CLIENT)
        self.harness.run()

    def acknowledged(self) -> list[ProduceResponse]:
        return self.harness.received(CLIENT, ProduceResponse)

    def isolate(self, node: int) -> None:
        for other in [COORDINATOR] + [endpoint(n) for n in (1, 2, 3) if n != node]:
            self.harness.cut(endpoint(node), other)

    def settle(self, milliseconds: int = 1_000) -> None:
        self.harness.advance(milliseconds)

    def assert_converged(self, nodes=(1, 2, 3)) -> None:
        reference = log_bytes(self.logs[self.leader])
        for node in nodes:
            assert log_bytes(self.logs[node]) == reference, f"node {node} differs from leader {self.leader}"
            assert self.logs[node].epoch_entries() == self.logs[self.leader].epoch_entries()


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


# ---------------------------------------------------------------------------- steady state


def test_the_coordinator_elects_a_leader_and_the_others_follow_it(cluster):
    leader = cluster.leader

    assert cluster.replicas[leader].role == "leader"
    assert sorted(node for node, replica in cluster.replicas.items() if replica.role == "follower") == \
        sorted({1, 2, 3} - {leader})


def test_followers_copy_the_leaders_log_byte_for_byte(cluster):
    for tag in ("a", "b", "c"):
        cluster.produce(tag, count=3)

    assert [r.error for r in cluster.acknowledged()] == [0, 0, 0]
    cluster.settle(LIMITS.replica_fetch_wait_max_ms + 100)  # followers learn the high watermark on their next fetch
    cluster.assert_converged()
    assert tags_in(cluster.logs[cluster.leader]) == ["a-0", "b-0", "c-0"]
    assert all(replica.high_watermark == 9 for replica in cluster.replicas.values())


def test_an_acks_all_write_is_acknowledged_only_once_every_isr_member_holds_it(cluster):
    cluster.produce("a", count=2)

    response = only(cluster.acknowledged(), ProduceResponse)
    assert response.error == ErrorCode.NONE
    for node in (1, 2, 3):
        assert cluster.logs[node].log_end_offset >= 2


def test_the_high_watermark_follows_the_slowest_isr_member_until_it_leaves_the_isr(cluster):
    leader = cluster.leader
    slow = [node for node in cluster.coordinator.topics["orders"].replicas[0] if node != leader][-1]
    cluster.produce("a")
    cluster.harness.cut(endpoint(leader), endpoint(slow))

    cluster.produce("b", acks=1)
    cluster.settle(500)

    assert cluster.replicas[leader].high_watermark == 1, "passed the slow follower's position"
    cluster.settle(LIMITS.replica_lag_time_max_ms + 500)
    assert slow not in cluster.coordinator.partitions[("orders", 0)].isr
    assert cluster.replicas[leader].high_watermark == 2
    cluster.harness.heal()
    cluster.settle(LIMITS.replica_lag_time_max_ms)
    assert slow in cluster.coordinator.partitions[("orders", 0)].isr, "the caught-up follower did not rejoin"
    cluster.assert_converged()


def test_with_flush_policy_every_batch_a_follower_fetches_on_only_after_flushing():
    cluster = Cluster(flush_policy="every_batch")
    follower = next(node for node in (1, 2, 3) if node != cluster.leader)

    cluster.produce("a", count=2)

    steps = [step for step in cluster.harness.steps_of(endpoint(follower), FetchResponse)
             if len(step.message.records)]
    assert steps
    for step in steps:
        flushes = [effect for effect in step.effects if isinstance(effect, AfterFlush)]
        assert len(flushes) == 1 and flushes[0].store is cluster.logs[follower]
        assert [type(e.message) for e in flushes[0].effects if isinstance(e, Send)] == [FetchRequest]
        assert not any(isinstance(effect, Send) for effect in step.effects)
    reply_steps = [step for step in cluster.harness.steps_of(endpoint(cluster.leader))
                   if messages(step.effects, ProduceResponse)]
    assert len(reply_steps) == 1
    assert messages(flushed(reply_steps[0].effects), ProduceResponse)
    assert not unflushed_messages(reply_steps[0].effects, ProduceResponse)
    assert cluster.logs[follower].flushed_offset == 2


# ---------------------------------------------------------------------------- failover


def test_a_new_leader_takes_over_and_the_old_one_truncates_its_unreplicated_tail(cluster):
    old = cluster.leader
    cluster.produce("a", count=2)
    cluster.harness.cut(endpoint(old), endpoint(1 if old != 1 else 2))
    cluster.harness.cut(endpoint(old), endpoint(3 if old != 3 else 2))
    cluster.produce("lost", count=3, acks=1, to=old)  # only the old leader has it
    assert cluster.logs[old].log_end_offset == 5

    cluster.isolate(old)
    cluster.settle(LIMITS.replica_session_timeout_ms + 300)
    new = cluster.leader
    assert new != old
    cluster.produce("b", count=1)
    cluster.harness.heal()
    cluster.settle(1_000)

    assert cluster.replicas[old].role == "follower"
    assert tags_in(cluster.logs[old]) == ["a-0", "b-0"]
    cluster.assert_converged()
    assert cluster.harness.trace_events("follower-truncated")


def test_an_exited_leader_is_replaced_at_once_and_a_restarted_one_rejoins_as_a_follower(cluster):
    old = cluster.leader
    cluster.produce("a")
    cluster.harness.remove(endpoint(old))
    incarnation = cluster.replicas[old].incarnation
    notice = ReplicaExited(topic="orders", partition=0, node=old, incarnation=incarnation)
    cluster.harness.deliver(COORDINATOR, notice)
    cluster.harness.run()
    assert cluster.leader != old

    cluster.produce("b")
    cluster.start_replica(old)
    cluster.settle(LIMITS.replica_lag_time_max_ms)

    assert cluster.replicas[old].role == "follower"
    cluster.assert_converged()
    assert old in cluster.coordinator.partitions[("orders", 0)].isr
    assert [r.error for r in cluster.acknowledged()] == [0, 0]


def test_a_new_leader_recognises_a_retry_of_an_idempotent_batch_the_old_leader_acknowledged(cluster):
    old = cluster.leader
    cluster.produce("a", count=2)
    retried = bytes(encode_batch([(0, b"id-key", b"v", None)], 1_000, producer_id=55, producer_epoch=0,
                                 base_sequence=0))
    first = ProduceRequest(correlation_id=100, topic="orders", partition=0, acks=-1, batch=retried,
                           producer_secret=producer_secret_of(retried))
    cluster.harness.deliver(endpoint(old), first, CLIENT)
    cluster.harness.run()
    original = cluster.acknowledged()[-1]
    cluster.harness.remove(endpoint(old))
    incarnation = cluster.replicas[old].incarnation
    notice = ReplicaExited(topic="orders", partition=0, node=old, incarnation=incarnation)
    cluster.harness.deliver(COORDINATOR, notice)
    cluster.harness.run()
    new = cluster.leader
    end = cluster.logs[new].log_end_offset

    again = ProduceRequest(correlation_id=101, topic="orders", partition=0, acks=-1, batch=retried,
                           producer_secret=producer_secret_of(retried))
    cluster.harness.deliver(endpoint(new), again, CLIENT)
    cluster.harness.run()

    answer = cluster.acknowledged()[-1]
    assert (original.error, original.base_offset) == (ErrorCode.NONE, 2)
    assert (answer.correlation_id, answer.error, answer.base_offset) == (101, ErrorCode.NONE, 2)
    assert cluster.logs[new].log_end_offset == end == 3


# ---------------------------------------------------------------------------- KIP-279 by hand


class Pair:
    """Node 1 follows node 2; both logs are built by hand with a chosen epoch history."""

    def __init__(self, leader_history, follower_history, leader_epoch: int, *, leader_start: int = 0,
                 leader_config: LogConfig = LogConfig(), leader_retention_at_ms: int | None = None,
                 follower_committed: tuple[int, int] | None = None) -> None:
        self.harness = Harness()
        self.logs = {1: open_memory_log(LogConfig(), fs=MemoryFileSystem()),
                     2: open_memory_log(leader_config, fs=MemoryFileSystem())}
        if leader_start:
            self.logs[2].reset_to(leader_start)
        for node, history in ((2, leader_history), (1, follower_history)):
            for epoch, tag, count in history:
                self.logs[node].append_producer_batch(batch(count, tag), epoch, 0)
        if leader_retention_at_ms is not None:
            self.logs[2].apply_retention(leader_retention_at_ms)
        if follower_committed is not None:
            self.logs[1].note_high_watermark(*follower_committed)  # (offset, epoch) it saw committed
        self.replicas = {}
        for node in (1, 2):
            self.replicas[node] = PartitionReplica(
                topic="orders", topic_id=1, partition=0, node=node, endpoint=endpoint(node),
                coordinator=COORDINATOR, log=self.logs[node], config=TopicConfig(), incarnation=node,
                limits=LIMITS)
            self.harness.add(endpoint(node), self.replicas[node])
        state = PartitionState(topic="orders", topic_id=1, partition=0, leader=2, leader_endpoint=endpoint(2),
                               leader_epoch=leader_epoch, partition_epoch=leader_epoch, replicas=[1, 2],
                               isr=[2])
        for node in (2, 1):
            self.harness.deliver(endpoint(node), ReplicaHeartbeatResponse(state=state), COORDINATOR)
        self.harness.run()

    def assert_converged(self) -> None:
        assert log_bytes(self.logs[1]) == log_bytes(self.logs[2])
        assert self.logs[1].log_end_offset == self.logs[2].log_end_offset
        assert self.logs[1].epoch_entries() == self.logs[2].epoch_entries()

    def truncations(self) -> list[tuple[int, int]]:
        return [(event["from"], event["to"]) for event in self.harness.trace_events("follower-truncated")]


def test_a_follower_with_a_longer_tail_in_the_same_epoch_truncates_to_where_the_leader_ended_it():
    pair = Pair(leader_history=[(1, "a", 4), (2, "new", 3)],
                follower_history=[(1, "a", 4), (1, "stale", 2)], leader_epoch=2)

    assert pair.truncations() == [(6, 4)]
    pair.assert_converged()
    assert tags_in(pair.logs[1]) == ["a-0", "new-0"]


def test_a_follower_whose_last_epoch_the_leader_never_had_truncates_to_the_end_of_their_common_epoch():
    pair = Pair(leader_history=[(1, "a", 4), (2, "b", 2), (4, "d", 2)],
                follower_history=[(1, "a", 4), (3, "c", 3)], leader_epoch=4)

    assert pair.truncations() == [(7, 4)]
    pair.assert_converged()
    assert pair.logs[1].epoch_entries() == [(1, 0), (2, 4), (4, 6)]


def test_divergence_over_several_epochs_takes_several_rounds_and_ends_on_the_common_prefix():
    pair = Pair(leader_history=[(1, "a", 4), (2, "b", 1), (4, "d", 2), (6, "f", 1)],
                follower_history=[(1, "a", 4), (3, "c", 2), (5, "e", 2)], leader_epoch=6)

    assert pair.truncations() == [(8, 6), (6, 4)]
    pair.assert_converged()
    assert tags_in(pair.logs[1]) == ["a-0", "b-0", "d-0", "f-0"]


def test_a_follower_with_nothing_in_common_truncates_everything():
    pair = Pair(leader_history=[(2, "b", 3)], follower_history=[(1, "a", 2)], leader_epoch=2)

    assert pair.truncations() == [(2, 0)]
    pair.assert_converged()


def test_a_follower_whose_log_ends_before_the_leaders_log_start_resets_to_it():
    pair = Pair(leader_history=[(1, "late", 2)], follower_history=[], leader_epoch=1, leader_start=100)

    assert pair.harness.trace_events("follower-reset") == [
        {"topic": "orders", "partition": 0, "from": 0, "to": 100}]
    pair.assert_converged()
    assert pair.logs[1].log_start_offset == 100


def test_a_follower_below_a_log_start_past_its_last_epoch_resets_to_it_instead_of_truncating():
    """The follower held epoch 1 up to offset 4, all committed; while it was away the partition
    had two more leaders, and retention took the leader's log up to offset 8, epoch 1 and 2 with
    it. Its fetch at 4 carries epoch 1, which the leader no longer knows: answered with a
    diverging epoch (-1), the follower was told to truncate to its own start, below what it had
    seen committed, refused, and asked again every second for ever (Kafka answers a fetch below
    the log start OFFSET_OUT_OF_RANGE whatever its epoch, and the follower starts at the leader's
    log start)."""
    pair = Pair(leader_history=[(1, "a", 4), (2, "b", 4), (3, "c", 4)],
                follower_history=[(1, "a", 4)], leader_epoch=3,
                leader_config=LogConfig(segment_bytes=1, retention_ms=1_000), leader_retention_at_ms=10_000,
                follower_committed=(4, 1))
    assert pair.logs[2].log_start_offset == 8
    pair.harness.advance(5_000)

    assert pair.harness.trace_events("follower-refused-truncation") == []
    assert pair.harness.trace_events("follower-reset") == [
        {"topic": "orders", "partition": 0, "from": 4, "to": 8}]
    assert pair.logs[1].log_start_offset == 8
    pair.assert_converged()


def test_a_follower_already_matching_the_leader_is_not_truncated():
    pair = Pair(leader_history=[(1, "a", 2), (2, "b", 2)], follower_history=[(1, "a", 2)], leader_epoch=2)

    assert pair.truncations() == []
    pair.assert_converged()


# ---------------------------------------------------------------------------- coordinator restarts


def test_a_coordinator_restart_does_not_disturb_replication():
    cluster = Cluster(seed=5)
    leader = cluster.leader
    assert leader == 3, "the story needs followers whose heartbeats come before the leader's"
    isr_before = list(cluster.coordinator.partitions[("orders", 0)].isr)
    cluster.produce("a")

    cluster.restart_coordinator()
    cluster.settle(LIMITS.coordinator_election_grace_ms + LIMITS.replica_lag_time_max_ms + 500)

    assert cluster.leader == leader
    assert cluster.coordinator.partitions[("orders", 0)].isr == isr_before
    assert not cluster.harness.trace_events("isr-change-requested"), "a follower fell behind the restart"
    cluster.produce("b")
    assert [r.error for r in cluster.acknowledged()] == [0, 0]
