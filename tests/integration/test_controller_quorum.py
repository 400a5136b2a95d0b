"""The controller quorum in a real cluster: three controller processes, one per node.

- Killing the active controller, again and again, loses no topic and no acknowledged write, and
  metadata changes are accepted again within a couple of seconds each time.
- An active controller cut off from the other voters stops deciding; the majority elects another,
  which accepts changes; after the heal the old one follows, holding the same metadata.
- An active controller whose disk fills stops (typed StorageFull, nothing half written); the
  quorum carries on and the voter follows again once restarted.
- A client given one voter's address finds the active controller (NOT_CONTROLLER hints) and, once
  it has heard the voter list, survives that voter's death.
- `railmq cluster info --json` shows the quorum: every voter's node, endpoint and pid, the leader
  and its term, each voter's commit index and lag.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from actors.errors import RailmqError
from actors.messages import LinkFault
from railmq.admin import Admin
from railmq.consumer import Consumer
from railmq.producer import Producer
from tests.helpers import read_values, wait_for
from transport.actor_main import EXIT_DISK_FULL

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def produce(bootstrap: str, topic: str, count: int, tag: str) -> set[bytes]:
    with Producer(bootstrap, acks="all", request_timeout_ms=3000) as producer:
        futures = [producer.send(topic, f"{tag}-{index}".encode()) for index in range(count)]
        for future in futures:
            future.result(60)
    return {f"{tag}-{index}".encode() for index in range(count)}


def active_controller(cluster) -> str:
    return wait_for(lambda: _active(cluster), 15, "an active controller")


def _active(cluster) -> str:
    try:
        return cluster.active_controller(timeout_s=1.0)
    except (TimeoutError, RailmqError):  # an election is under way
        return ""


def test_killing_the_active_controller_again_and_again_loses_nothing(fresh_cluster, unique_name):
    cluster = fresh_cluster()
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=3, config={"min_insync_replicas": 2})
    acknowledged = produce(cluster.bootstrap, topic, 200, "before")
    created = [topic]
    for round_number in range(3):
        victim = active_controller(cluster)
        cluster.kill(victim)
        started = time.monotonic()
        name = unique_name()
        with Admin(cluster.bootstrap, timeout_ms=20_000) as admin:
            admin.create_topic(name, partitions=1, replication_factor=3, wait=False)
        accepted_s = time.monotonic() - started
        assert accepted_s < 10, f"round {round_number}: a metadata change took {accepted_s:.1f} s after the kill"
        created.append(name)
        acknowledged |= produce(cluster.bootstrap, topic, 100, f"round{round_number}")
    with Admin(cluster.bootstrap) as admin:
        assert set(created) <= set(admin.list_topics()), "a topic was lost with a controller"
    assert read_values(cluster.bootstrap, topic, 2, acknowledged) >= acknowledged


def test_an_isolated_active_controller_is_replaced_and_follows_after_the_heal(fresh_cluster, unique_name):
    cluster = fresh_cluster(fault_injection=True)
    old = active_controller(cluster)
    others = [name for name in cluster.controller_names() if name != old]
    peers = others + [cluster.actor(name).endpoint for name in others]
    with Admin(cluster.bootstrap, secret=cluster.secret) as admin:
        admin.set_faults(cluster.actor(old).endpoint, links=[LinkFault(peers=peers)])
        new = wait_for(lambda: (lambda name: name if name and name != old else "")(_active(cluster)), 15,
                       "a new active controller on the majority side")
        assert new in others
        topic = unique_name()
        admin.create_topic(topic, partitions=1, replication_factor=3, wait=False)
        admin.set_faults(cluster.actor(old).endpoint, links=[])
        status = {}

        def caught_up() -> bool:
            status.update({entry.node: entry for entry in admin.quorum_status()})
            return len({entry.commit_index for entry in status.values()}) == 1 and all(
                entry.role in ("leader", "follower") for entry in status.values())

        wait_for(caught_up, 15, "the old controller to follow and catch up")
        assert [entry.node for entry in status.values() if entry.active] == [int(new.rsplit("/", 1)[1])]
        assert topic in admin.list_topics()


def test_an_active_controller_whose_disk_fills_stops_and_the_quorum_carries_on(fresh_cluster, unique_name):
    """A full disk under the active controller: its next proposal cannot be written (the raft
    log's write raises StorageFull and is rolled back), and the voter stops rather than decide
    without its own copy — with EXIT_DISK_FULL, which its supervisor retries later and later. The metadata change is accepted all the same (another voter leads);
    every topic and acknowledged write is still there, and the stopped voter, restarted by its
    supervisor, follows with the same commit index."""
    cluster = fresh_cluster(fault_injection=True)
    topic = unique_name()
    with Admin(cluster.bootstrap, secret=cluster.secret) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        acknowledged = produce(cluster.bootstrap, topic, 100, "before")
        full = active_controller(cluster)
        restarts = cluster.actor(full).restarts
        admin.set_faults(cluster.actor(full).endpoint, disk_full=True)
        second = unique_name()
        admin.create_topic(second, partitions=1, replication_factor=3)  # proposed on the full disk first
        wait_for(lambda: cluster.actor(full).restarts > restarts, 15, f"{full} to stop on its full disk")
        assert cluster.actor(full).last_exit_code == EXIT_DISK_FULL, "a typed stop, not a crash"
        assert {topic, second} <= set(admin.list_topics())
        assert read_values(cluster.bootstrap, topic, 1, acknowledged) >= acknowledged

        def caught_up() -> bool:
            status = admin.quorum_status()
            return len(status) == 3 and len({entry.commit_index for entry in status}) == 1

        wait_for(caught_up, 20, "the restarted voter to follow with the same commit index")


def test_a_client_given_one_voter_finds_the_leader_and_survives_that_voters_death(fresh_cluster, unique_name):
    cluster = fresh_cluster()
    active = active_controller(cluster)
    follower = next(name for name in cluster.controller_names() if name != active)
    topic = unique_name()
    with Admin(cluster.actor(follower).endpoint) as admin:  # NOT_CONTROLLER, then the hint
        admin.create_topic(topic, partitions=1, replication_factor=3)
        admin.metadata([topic])  # learns the voters
        cluster.kill(follower)
        assert topic in admin.list_topics()
        cluster.kill(active_controller(cluster))
        assert topic in admin.list_topics(), "a client that knew the voters lost the cluster"


def test_cluster_info_shows_every_voter_the_leader_and_the_lag(fresh_cluster):
    cluster = fresh_cluster()
    active = active_controller(cluster)
    result = subprocess.run([sys.executable, "-m", "railmq.cli", "cluster", "info", "--json", "-b", cluster.bootstrap],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    quorum = json.loads(result.stdout)["quorum"]
    voters = {voter["node"]: voter for voter in quorum["voters"]}
    assert sorted(voters) == [1, 2, 3]
    for node, voter in voters.items():
        managed = cluster.actor(f"controller/{node}")
        assert (voter["pid"], voter["endpoint"]) == (managed.pid, managed.endpoint)
        assert voter["lag_entries"] is not None and voter["lag_entries"] >= 0
        assert voter["rejoining"] is False  # no voter of a new cluster lost its log
    assert quorum["leader"] == int(active.rsplit("/", 1)[1]) and quorum["active"]
    assert voters[quorum["leader"]]["role"] == "leader" and voters[quorum["leader"]]["term"] == quorum["term"]
    table = subprocess.run([sys.executable, "-m", "railmq.cli", "cluster", "info", "-b", cluster.bootstrap],
                           capture_output=True, text=True, timeout=60)
    assert f"controller {quorum['leader']} leads term" in table.stdout


def test_topics_and_groups_describe_keep_working_through_a_controller_failover(fresh_cluster, unique_name):
    cluster = fresh_cluster()
    topic, group = unique_name(), unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=3)
    produce(cluster.bootstrap, topic, 20, "r")
    with Consumer(cluster.bootstrap, group_id=group, auto_offset_reset="earliest") as member:
        member.subscribe([topic])
        wait_for(lambda: member.poll(100) or member.assignment(), 30, "the member to be assigned")
        member.commit()
    cluster.kill(active_controller(cluster))
    cluster.kill(cluster.group_coordinator_name())
    for command in (["topics", "describe", topic, "--json"], ["groups", "describe", group, "--json"]):
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "railmq.cli", *command, "-b", cluster.bootstrap],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{command}: {result.stderr}"
        assert topic in result.stdout, command
        assert time.monotonic() - started < 15, f"{command} took {time.monotonic() - started:.1f} s"
