"""Replication, in-sync replicas and leader failover on real processes.

Given RF=3 and min in-sync 2, when the leader is killed, paused or cut off, then every
acknowledged acks=all write survives, in order, once; and the teaching case (unclean election)
loses exactly the writes only the old leader had."""

from __future__ import annotations

import threading
import time

import pytest

from actors.errors import ErrorCode, RailmqError
from railmq.admin import Admin
from railmq.consumer import Consumer
from railmq.producer import Producer
from tests.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def partition_info(admin: Admin, topic: str, partition: int = 0):
    return admin.describe_topic(topic).partitions[partition]


def read_partition(bootstrap: str, topic: str, partition: int, timeout_s: float = 20.0) -> list:
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, partition)])
        end = consumer.end_offsets([(topic, partition)])[(topic, partition)]
        records: list = []
        deadline = time.monotonic() + timeout_s
        while (not records or records[-1].offset < end - 1) and time.monotonic() < deadline and end > 0:
            records += consumer.poll(200)
        return records


class Workload:
    """A producer thread sending unique values with acks=all; remembers what was acknowledged."""

    def __init__(self, bootstrap: str, topic: str, **options) -> None:
        self.producer = Producer(bootstrap, acks="all", request_timeout_ms=2000, retry_backoff_ms=50,
                                 delivery_timeout_ms=60_000, **options)
        self.topic = topic
        self.acked: list[tuple[str, int, int]] = []
        self.failed: list[str] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        sequence = 0
        pending = []
        while not self.stop_event.is_set():
            value = f"v{sequence}"
            pending.append((value, self.producer.send(self.topic, value, partition=0)))
            sequence += 1
            if len(pending) >= 20:
                self._settle(pending)
                pending = []
        self._settle(pending)

    def _settle(self, pending) -> None:
        for value, future in pending:
            try:
                metadata = future.result(90)
                self.acked.append((value, metadata.partition, metadata.offset))
            except RailmqError:
                self.failed.append(value)

    def start(self) -> "Workload":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(120)
        self.producer.close()


def test_killing_the_leader_under_acks_all_loses_no_acknowledged_write(fresh_cluster, unique_name):
    cluster = fresh_cluster()
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        admin.wait_for_leaders(topic, full_isr=True)
        workload = Workload(cluster.bootstrap, topic, idempotent=True).start()
        wait_for(lambda: len(workload.acked) > 200, timeout_s=20, what="acknowledged writes before the kill")
        old = partition_info(admin, topic)
        cluster.kill(cluster.leader_of(topic, 0))
        wait_for(lambda: partition_info(admin, topic).leader_epoch > old.leader_epoch
                 and partition_info(admin, topic).leader_endpoint, timeout_s=20, what="a new leader")
        count_at_failover = len(workload.acked)
        wait_for(lambda: len(workload.acked) > count_at_failover + 200,
                 timeout_s=20, what="writes acknowledged by the new leader")
        workload.stop()
        assert partition_info(admin, topic).leader != old.leader or partition_info(admin, topic).leader_epoch > old.leader_epoch
    records = read_partition(cluster.bootstrap, topic, 0)
    values = [record.value.decode() for record in records]
    assert len(values) == len(set(values)), "the idempotent producer's retries wrote nothing twice"
    by_value = {record.value.decode(): record.offset for record in records}
    for value, _, offset in workload.acked:
        assert by_value.get(value) == offset, f"acknowledged {value} at {offset} is missing or moved"
    acked_sequence = [int(value[1:]) for value, _, _ in sorted(workload.acked, key=lambda item: item[2])]
    assert acked_sequence == sorted(acked_sequence), "acknowledged writes are in send order"


def test_a_lagging_follower_leaves_the_isr_and_returns(fresh_cluster, unique_name):
    cluster = fresh_cluster()
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        info = admin.wait_for_leaders(topic, full_isr=True).partitions[0]
        follower = next(node for node in info.replicas if node != info.leader)
        name = cluster.replica_name(topic, 0, follower)
        with Producer(cluster.bootstrap, acks="all") as producer:
            cluster.pause(name)
            try:
                for i in range(20):
                    producer.send(topic, f"{i}", partition=0).result(30)  # 2 of 3 in sync: still accepted
                wait_for(lambda: follower not in partition_info(admin, topic).isr,
                         timeout_s=20, what="the ISR to shrink")
            finally:
                cluster.resume(name)
            wait_for(lambda: follower in partition_info(admin, topic).isr,
                     timeout_s=20, what="the follower to rejoin the ISR")
            producer.send(topic, "after", partition=0).result(30)


def test_acks_all_is_refused_when_the_isr_is_below_min_insync(fresh_cluster, unique_name):
    cluster = fresh_cluster()
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        info = admin.wait_for_leaders(topic, full_isr=True).partitions[0]
        followers = [cluster.replica_name(topic, 0, node) for node in info.replicas if node != info.leader]
        for name in followers:
            cluster.pause(name)
        try:
            wait_for(lambda: partition_info(admin, topic).isr == [info.leader],
                     timeout_s=20, what="the ISR to shrink to the leader")
            end_before = admin.list_offsets(topic, 0, -1)
            with Producer(cluster.bootstrap, acks="all", delivery_timeout_ms=1500, retry_backoff_ms=100) as producer:
                with pytest.raises(RailmqError) as refused:
                    producer.send(topic, b"refused", partition=0).result(30)
                assert refused.value.code in (ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.REQUEST_TIMED_OUT)
                assert "NOT_ENOUGH_REPLICAS" in str(refused.value)
            with Producer(cluster.bootstrap, acks=1) as producer:
                producer.send(topic, b"acks=1 still works", partition=0).result(30)
            assert partition_info(admin, topic).replica_info  # describe still answers
            leader_info = next(r for r in partition_info(admin, topic).replica_info if r.node == info.leader)
            assert leader_info.log_end_offset >= end_before.log_end_offset
        finally:
            for name in followers:
                cluster.resume(name)


def test_a_paused_leader_is_fenced_when_it_resumes(fresh_cluster, unique_name):
    cluster = fresh_cluster()
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        info = admin.wait_for_leaders(topic, full_isr=True).partitions[0]
        old_leader = cluster.replica_name(topic, 0, info.leader)
        old_endpoint = info.leader_endpoint
        with Producer(cluster.bootstrap, acks="all", request_timeout_ms=2000) as producer:
            producer.send(topic, b"before", partition=0).result(30)
            cluster.pause(old_leader)
            try:
                wait_for(lambda: partition_info(admin, topic).leader not in (-1, info.leader), timeout_s=30,
                         what="a new leader while the old one is paused")
                acked = producer.send(topic, b"during", partition=0).result(30)
            finally:
                cluster.resume(old_leader)
        # The resumed zombie learns the new epoch and refuses to lead.
        from actors.messages import ProduceRequest, ProduceResponse
        from storage.batch import encode_batch
        from transport.rpc import RpcClient

        def zombie_refuses() -> bool:
            rpc = RpcClient("test")
            try:
                reply = rpc.request(old_endpoint, ProduceRequest(
                    correlation_id=0, topic=topic, partition=0, acks=-1, batch=encode_batch([(0, None, b"zombie", None)], 1)),
                    timeout_ms=2000)
                return isinstance(reply, ProduceResponse) and reply.error == ErrorCode.NOT_LEADER
            except TimeoutError:
                return False
            finally:
                rpc.close()

        wait_for(zombie_refuses, timeout_s=30, what="the resumed leader to refuse produce requests")
        wait_for(lambda: info.leader in partition_info(admin, topic).isr, timeout_s=30, what="the old leader to catch up")
    values = [r.value for r in read_partition(cluster.bootstrap, topic, 0)]
    assert values[:2] == [b"before", b"during"] and b"zombie" not in values
    assert acked.offset == 1


def test_unclean_election_loses_exactly_the_writes_only_the_old_leader_had(fresh_cluster, unique_name):
    cluster = fresh_cluster()
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=2,
                           config={"min_insync_replicas": 1, "unclean_leader_election": True})
        info = admin.wait_for_leaders(topic, full_isr=True).partitions[0]
        leader = cluster.replica_name(topic, 0, info.leader)
        follower_node = next(node for node in info.replicas if node != info.leader)
        follower = cluster.replica_name(topic, 0, follower_node)
        with Producer(cluster.bootstrap, acks=1) as producer:
            for i in range(10):
                producer.send(topic, f"safe-{i}", partition=0)
            producer.flush(30)
            wait_for(lambda: next(r for r in partition_info(admin, topic).replica_info
                                  if r.node == follower_node).log_end_offset == 10,
                     timeout_s=20, what="the follower to copy")
            cluster.pause(follower)
            wait_for(lambda: partition_info(admin, topic).isr == [info.leader],
                     timeout_s=20, what="the ISR to drop the follower")
            doomed = [producer.send(topic, f"doomed-{i}", partition=0).result(30) for i in range(5)]
        assert [m.offset for m in doomed] == [10, 11, 12, 13, 14]
        cluster.pause(leader)
        cluster.resume(follower)
        wait_for(lambda: partition_info(admin, topic).leader == follower_node, timeout_s=30,
                 what="the out-of-sync follower to be elected (unclean)")
        with Producer(cluster.bootstrap, acks=1) as producer:
            replaced = producer.send(topic, "after-unclean", partition=0).result(30)
        cluster.resume(leader)
        wait_for(lambda: len(partition_info(admin, topic).isr) == 2, timeout_s=30, what="the old leader to rejoin")
    records = read_partition(cluster.bootstrap, topic, 0)
    values = [r.value.decode() for r in records]
    lost = [f"doomed-{i}" for i in range(5) if f"doomed-{i}" not in values]
    assert lost == [f"doomed-{i}" for i in range(5)], "every write only the old leader had is gone"
    assert replaced.offset == 10, "the new leader reused offset 10 for a different record"
    assert values[:11] == [f"safe-{i}" for i in range(10)] + ["after-unclean"]
    trace = open(cluster.trace_path).read()
    assert "unclean-election" in trace
