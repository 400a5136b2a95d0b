"""Fetch payloads through shared-memory rings: same bytes as ZeroMQ, no segment left behind.

Given a cluster with shared memory on, when followers replicate and consumers fetch, then the
batches travel through rings (the runtimes count it), the logs are byte-identical to what a
ZeroMQ-only path gives, and killing either end leaves no segment behind."""

from __future__ import annotations

import os
import time

import pytest

from railmq.admin import Admin
from railmq.consumer import Consumer
from railmq.producer import Producer
from tests.conftest import railmq_segments
from tests.helpers import wait_for
from transport.shm import actor_prefix, cluster_prefix

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def counters_of(admin: Admin, cluster, name: str) -> dict:
    actor = next(a for a in cluster.actors() if a["name"] == name)
    return admin.runtime_stats(actor["endpoint"]).counters


def produce(bootstrap: str, topic: str, count: int) -> list[bytes]:
    values = [os.urandom(200) + f"-{i}".encode() for i in range(count)]
    with Producer(bootstrap, acks="all") as producer:
        producer.send_batch(topic, values, partition=0)
        producer.flush(30)
    return values


def read_all(bootstrap: str, topic: str, count: int, shared_memory: bool) -> list:
    with Consumer(bootstrap, auto_offset_reset="earliest", shared_memory=shared_memory) as consumer:
        consumer.assign([(topic, 0)])
        records: list = []
        deadline = time.monotonic() + 30
        while len(records) < count and time.monotonic() < deadline:
            records += consumer.poll(200)
        stats = consumer._engine.runtime.counters
        return records, dict(stats)


def test_replication_and_fetch_go_through_rings_with_identical_bytes(fresh_cluster, unique_name):
    cluster = fresh_cluster()
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        info = admin.wait_for_leaders(topic, full_isr=True).partitions[0]
        values = produce(cluster.bootstrap, topic, 2000)
        wait_for(lambda: all(r.log_end_offset == 2000 for r in admin.describe_topic(topic).partitions[0].replica_info),
                 timeout_s=30, what="every replica to copy 2000 records")
        leader = cluster.replica_name(topic, 0, info.leader)
        followers = [cluster.replica_name(topic, 0, n) for n in info.replicas if n != info.leader]
        assert counters_of(admin, cluster, leader).get("ring_writes", 0) > 0
        for follower in followers:
            assert counters_of(admin, cluster, follower).get("ring_reads", 0) > 0
        through_ring, ring_stats = read_all(cluster.bootstrap, topic, 2000, shared_memory=True)
        over_zeromq, zmq_stats = read_all(cluster.bootstrap, topic, 2000, shared_memory=False)
    assert ring_stats.get("ring_reads", 0) > 0 and zmq_stats.get("ring_reads", 0) == 0
    assert [r.value for r in through_ring] == [r.value for r in over_zeromq] == values
    logs = [open(os.path.join(directory, "00000000000000000000.log"), "rb").read()
            for directory in _replica_directories(cluster, topic)]
    assert len(logs) == 3 and logs[0] == logs[1] == logs[2], "every replica holds the same bytes"
    cluster.stop()
    assert not [name for name in railmq_segments() if name.startswith(cluster_prefix(cluster.cluster_id))]


def _replica_directories(cluster, topic: str) -> list[str]:
    found = []
    for node in cluster.node_ids:
        node_dir = os.path.join(cluster.data_dir, f"node-{node}")
        found += [os.path.join(node_dir, d) for d in os.listdir(node_dir) if d.startswith(f"{topic}-0-")]
    return found


def test_a_killed_follower_leaves_no_ring_and_replication_goes_on(fresh_cluster, unique_name):
    cluster = fresh_cluster(restart_delay_ms=300)
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        info = admin.wait_for_leaders(topic, full_isr=True).partitions[0]
        produce(cluster.bootstrap, topic, 500)
        follower = cluster.replica_name(topic, 0, next(n for n in info.replicas if n != info.leader))
        prefix = actor_prefix(cluster.cluster_id, follower, cluster.secret)
        wait_for(lambda: any(name.startswith(prefix) for name in railmq_segments()),
                 timeout_s=30, what="the follower's ring")
        cluster.kill(follower)
        wait_for(lambda: not any(name.startswith(prefix) and _creator_dead(name) for name in railmq_segments()),
                 timeout_s=30, what="the dead follower's ring to be unlinked")
        produce(cluster.bootstrap, topic, 500)
        wait_for(lambda: len(admin.describe_topic(topic).partitions[0].isr) == 3,
                 timeout_s=30, what="the restarted follower to catch up")
        leader = cluster.leader_of(topic, 0)
        cluster.kill(leader)  # the writer end dies: readers fall back, nothing blocks
        produce(cluster.bootstrap, topic, 500)
        wait_for(lambda: admin.list_offsets(topic, 0, -1).offset == 1500,
                 timeout_s=30, what="1500 records after the failover")
    cluster.stop()
    assert not [name for name in railmq_segments() if name.startswith(cluster_prefix(cluster.cluster_id))]


def _creator_dead(name: str) -> bool:
    """A ring whose reader (its creator) is not a live process."""
    from transport.ring import RingReader

    try:
        reader = RingReader.attach(name)
    except Exception:
        return False  # held by a live reader (busy) or already gone
    reader.close()
    return True
