"""Losing a node: every process of one node killed and its data directory deleted, then the node
comes back empty (as a replaced machine would).

The node chosen is the one whose controller is active, and the test checks what the issue asks:
no acknowledged write lost, no committed offset lost, topics and groups intact, every partition
back to a full ISR, and the node's wiped voters (controller and group coordination) caught up.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from actors.messages import OffsetFetchRequest
from railmq.admin import Admin
from railmq.group_admin import GroupAdminClient
from railmq.consumer import Consumer
from railmq.producer import Producer
from storage.raft_log import rejoining_on_disk
from tests.helpers import read_values, wait_for
from transport.actor_main import controller_directory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def produce(bootstrap: str, topic: str, count: int, tag: str) -> set[bytes]:
    values = [f"{tag}-{index}".encode() for index in range(count)]
    with Producer(bootstrap, acks="all", request_timeout_ms=3000) as producer:
        for future in [producer.send(topic, value, partition=index % 2) for index, value in enumerate(values)]:
            future.result(60)
    return set(values)


def committed_by_group(bootstrap: str, topic: str, group: str) -> dict:
    """The group's committed offsets, asked until the group coordinator answers (it may be failing over)."""
    with GroupAdminClient(bootstrap, timeout_ms=30_000) as groups:
        reply = groups._group_request(OffsetFetchRequest(correlation_id=0, group_id=group))
    return {entry.partition: entry.offset for entry in reply.offsets if entry.topic == topic}


def test_a_lost_node_comes_back_empty_and_the_cluster_loses_nothing(fresh_cluster, unique_name):
    cluster = fresh_cluster()
    topic, group = unique_name(), unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=3, config={"min_insync_replicas": 2})
        admin.wait_for_leaders(topic, full_isr=True)
    acknowledged = produce(cluster.bootstrap, topic, 300, "before")
    with Consumer(cluster.bootstrap, group_id=group, auto_offset_reset="earliest") as member:
        member.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 30
        while got < 300 and time.monotonic() < deadline:
            got += len(member.poll(200))
        member.commit()
    committed = committed_by_group(cluster.bootstrap, topic, group)
    assert sum(committed.values()) == 300, committed

    node = int(cluster.active_controller().rsplit("/", 1)[1])
    lost = cluster.lose_node(node)
    assert f"controller/{node}" in lost and f"group-coordinator/{node}" in lost
    assert not os.path.exists(os.path.join(cluster.data_dir, f"node-{node}"))

    acknowledged |= produce(cluster.bootstrap, topic, 100, "during")  # the majority serves meanwhile
    with Admin(cluster.bootstrap) as admin:
        def back_in_sync() -> bool:  # the node's new, empty replicas re-fetched everything
            partitions = admin.describe_topic(topic).partitions
            return all(node in p.isr and any(info.node == node and info.alive and info.log_end_offset >= 200
                                             and info.storage.state == "ok" for info in p.replica_info)
                       for p in partitions)
        wait_for(back_in_sync, 60, f"node {node}'s replicas back in the ISR with the whole log")
        assert topic in admin.list_topics()
    for kind in ("controller", "group-coordinator"):
        raft = os.path.join(cluster.data_dir, f"node-{node}", kind, "raft")

        def caught_up(raft: str = raft) -> bool:
            return os.path.exists(os.path.join(raft, "raft.log")) and not rejoining_on_disk(raft)
        wait_for(caught_up, 30, f"the wiped {kind} voter of node {node} to be caught up")
    assert os.path.isdir(os.path.join(controller_directory(cluster.data_dir, node), "raft"))
    with open(cluster.trace_path, encoding="utf-8") as handle:
        rejoined = {event["actor"] for event in map(json.loads, handle) if event["event"] == "raft_rejoined"}
    assert {f"controller/{node}", f"group-coordinator/{node}"} <= rejoined, (
        f"the wiped voters did not wait to be caught up: {rejoined}")
    assert committed_by_group(cluster.bootstrap, topic, group) == committed, "a committed offset was lost"
    assert acknowledged <= read_values(cluster.bootstrap, topic, 2, acknowledged), "an acknowledged write was lost"
