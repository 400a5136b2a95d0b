"""An idle cluster sleeps: with nothing produced or consumed, its processes wake only for what
must happen (a heartbeat, a keepalive round, a long poll that ends), never on a period of their
own. Counted in wake-ups, not in CPU time, so a loaded machine cannot make it pass or fail.

Given a 3-node cluster with the product's default limits and a 3-partition RF 3 topic that has
settled (every follower parked at the log end, both quorums quiet), when nothing happens for
10 s, then:
- every replica wakes at most 10 times (three keepalive rounds, at most one end of a parked
  fetch, and the stats requests of this test; an actor loop that woke once a second to look
  around did 10 on its own);
- every quorum voter that does not lead wakes at most 20 times, and the leaders at most 80 (a
  quiet leader heartbeats once a second; at the 75 ms heartbeat a follower woke ~130 times);
- the node agent, whose thread sleeps on its processes' exit descriptors, its reports socket
  and its next heartbeat, wakes at most 40 times (a 100 ms supervision period was 100).
And a replica killed while everything sleeps is still restarted and back in the ISR.
"""

from __future__ import annotations

import time

import pytest

from actors.limits import Limits
from railmq.admin import Admin

pytestmark = pytest.mark.integration

QUIET_S = 10.0


def wakeups(admin: Admin, endpoints: dict[str, str]) -> dict[str, int]:
    return {name: admin.runtime_stats(endpoint).counters.get("wakeups", 0) for name, endpoint in endpoints.items()}


@pytest.mark.timeout(120)
def test_an_idle_cluster_wakes_only_for_heartbeats_and_keepalives(fresh_cluster, unique_name):
    cluster = fresh_cluster(limits=Limits())
    topic = unique_name("idle")
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=3, replication_factor=3)
        admin.wait_for_leaders(topic, timeout_s=60, full_isr=True)
        time.sleep(3)  # the start's reports sent, followers parked, both quorums quiet
        endpoints = {actor["name"]: actor["endpoint"] for actor in cluster.actors() if actor["alive"]}
        leaders = {cluster.active_controller(), cluster.group_coordinator_name()}
        before, agent_before = wakeups(admin, endpoints), cluster.agent.wakeups
        time.sleep(QUIET_S)
        after, agent_after = wakeups(admin, endpoints), cluster.agent.wakeups

        woke = {name: after[name] - before[name] for name in endpoints}
        replicas = {name: count for name, count in woke.items() if name.startswith("replica/")}
        voters = {name: count for name, count in woke.items() if not name.startswith("replica/")}
        print(f"wake-ups in {QUIET_S:.0f} idle seconds: {woke}; node agent {agent_after - agent_before}")
        assert len(replicas) == 9 and len(voters) == 6, woke
        assert max(replicas.values()) <= 10, f"replicas woke in {QUIET_S:.0f} idle seconds: {replicas}"
        for name, count in voters.items():
            assert count <= (80 if name in leaders else 20), f"{name} woke {count} times: {voters}"
        assert agent_after - agent_before <= 40, f"the node agent woke {agent_after - agent_before} times"

        partition = admin.describe_topic(topic).partitions[0]
        node = next(replica for replica in partition.replicas if replica != partition.leader)
        follower = f"replica/{topic}/0/n{node}"
        restarts = cluster.actor(follower).restarts
        cluster.kill(follower)
        deadline = time.monotonic() + 30
        while cluster.actor(follower).restarts == restarts or not cluster.actor(follower).alive:
            assert time.monotonic() < deadline, f"{follower} was not restarted"
            time.sleep(0.05)
        admin.wait_for_leaders(topic, timeout_s=30, full_isr=True)
