"""A cluster across hosts: three network namespaces as three machines, one `railmq node` in each.

Each namespace has its own network stack (its own loopback and one veth into a bridge in the root
namespace, where this test and its clients run), so the nodes reach each other only over TCP at
their advertised addresses, as on separate machines. The story: a topic at RF 3 (min in-sync 2)
under a steady acks=all load, while the network between the hosts misbehaves — `tc netem` delay
and loss on one host's link, a host cut off entirely (its link down, longer than an election),
two hosts cut off from each other only (both still reach the third and the clients), one host's
packets to another dropped one way, and every process of a host killed and started again — while a fourth host runs a clone of node 2
(its directory copied, started as node 2: a cloned machine), whose Raft messages the real voters
drop (they come from another address than node 2's) and whose node agent is refused. At the end
every acknowledged write is there, the topic is intact, its replicas are back in sync, and no term
had two leaders.

The hosts are chaos/netns.py's (the `multi-host` chaos scenario runs on them too, judged by the
chaos checker: tests/chaos/test_scenarios.py). It needs root (namespaces, veths, a bridge) and
skips with the reason where that is not allowed. Everything it makes — namespaces, links,
processes, directories — is removed even when it fails.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

import pytest

from actors.errors import RailmqError
from chaos.netns import NamespaceHosts, unavailable
from railmq.admin import Admin
from railmq.producer import Producer
from tests.helpers import read_values, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def hosts(tmp_path):
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    made = NamespaceHosts(str(tmp_path), spare_hosts=1)  # host 4: where node 2 is started a second time
    try:
        made.create()
        yield made
    finally:
        made.destroy()


def _print_what_the_hosts_said(made: NamespaceHosts) -> None:
    """Each host's log tail and the cluster's decisions in time order (elections, ISR changes,
    controller terms)."""
    for node in [*made.nodes, 4]:
        path = made.log_path(node)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as handle:
                print(f"--- host {node}'s log, last lines ---\n" + "".join(handle.readlines()[-40:]))
    merged = os.path.join(made.base_dir, "trace.merged.jsonl")
    made.merge_traces(merged)
    wanted = ("elected", "isr", "leader", "term", "vote", "offline", "quorum", "fenced", "stale")
    with open(merged, encoding="utf-8", errors="replace") as handle:
        decisions = [line.rstrip() for line in handle if any(word in line[:200] for word in wanted)]
    print(f"--- {len(decisions)} decisions in the hosts' traces, the last 200 ---")
    print("\n".join(line[:400] for line in decisions[-200:]))


class AckedLoad:
    """acks=all sends in a closed loop from the root namespace; what was acknowledged, kept."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.acked: set[bytes] = set()
        self.refusals: Counter[str] = Counter()  # why sends were not acknowledged, by error name
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Producer(self.bootstrap, acks="all", idempotent=True, request_timeout_ms=2000,
                      delivery_timeout_ms=20_000) as producer:
            sequence = 0
            while not self.stop.is_set():
                values = [f"v{sequence + index}".encode() for index in range(20)]
                sequence += 20
                futures = [(value, producer.send(self.topic, value)) for value in values]
                for value, future in futures:
                    try:
                        future.result(30)
                        self.acked.add(value)
                    except RailmqError as error:  # not acknowledged: no promise to keep
                        self.refusals[error.name] += 1
                    except TimeoutError:
                        self.refusals["timed out"] += 1


def test_a_cluster_across_hosts_keeps_every_acknowledged_write_through_network_faults(hosts, unique_name):
    loads: list[AckedLoad] = []
    try:
        _story(hosts, unique_name, loads)
    except BaseException:
        # Shown with the failure: a fresh CI machine keeps nothing else.
        for load in loads:
            print(f"acknowledged {len(load.acked)}; not acknowledged, by reason: {dict(load.refusals)}")
        _print_what_the_hosts_said(hosts)
        raise


def _story(hosts: NamespaceHosts, unique_name, loads: list[AckedLoad]) -> None:
    hosts.identity()  # made in the first host's directory: every other host is given a copy
    hosts.start_node(1)
    hosts.start_node(2)
    topic = unique_name()
    with Admin(hosts.bootstrap, timeout_ms=5_000) as admin:
        wait_for(lambda: _answers(admin), 60, "two of the three voters to elect a controller")
        hosts.start_node(3, join=1)  # `railmq node --join`: it asks host 1's controller for the voters
        wait_for(lambda: _voter_caught_up(admin, 3), 60, "host 3, joined, to follow the quorum")
        admin.create_topic(topic, partitions=2, replication_factor=3, config={"min_insync_replicas": 2},
                           timeout_s=60)
        admin.wait_for_leaders(topic, timeout_s=60, full_isr=True)
        endpoints = wait_for(lambda: _replica_endpoints(admin, topic), 30, "every replica to report its endpoint")
        assert all(endpoint.startswith(f"tcp://{hosts.subnet}.") for endpoint in endpoints), (
            f"a replica advertised an address other hosts cannot reach: {endpoints}")
        load = AckedLoad(hosts.bootstrap, topic)
        loads.append(load)
        load.thread.start()
        wait_for(lambda: len(load.acked) >= 200, 60, "acknowledged writes before the faults")

        # Node 2 started a second time on host 4 from a copy of its directory (a cloned machine),
        # for the rest of the story: through the election that host 1's loss forces below.
        hosts.start_clone(of=2, on=4)
        wait_for(lambda: _wrong_address_refusals(admin) > 0, 60, "the clone's Raft messages refused")

        print(f"host 2's link: {hosts.degrade(2)}")
        time.sleep(3)
        hosts.restore(2)

        hosts.cut(3)  # host 3 cut off from every other host
        time.sleep(4)
        hosts.reconnect(3)

        # A partial partition: hosts 1 and 2 cannot reach each other, each still reaches host 3
        # and the clients. Whoever leads must go on with host 3, and nobody may lead twice.
        hosts.cut_between(1, 2)
        before_split = len(load.acked)
        wait_for(lambda: len(load.acked) > before_split + 100, 60, "writes acknowledged while hosts 1 and 2 are split")
        time.sleep(2)
        hosts.mend_between(1, 2)
        hosts.cut_between(3, 1, one_way=True)  # host 3's packets to host 1 lost, host 1's arrive
        time.sleep(3)
        hosts.mend_between(3, 1)

        before_kill = len(load.acked)
        hosts.kill_node(1)  # every process of host 1, at once
        wait_for(lambda: len(load.acked) > before_kill + 100, 60, "writes acknowledged without host 1")
        hosts.start_node(1)
        time.sleep(2)
        load.stop.set()
        load.thread.join(60)

        wait_for(lambda: _in_sync(admin, topic), 90, "every replica back in the ISR")
        assert topic in admin.list_topics()
        clone_log = open(hosts.log_path(4), encoding="utf-8", errors="replace").read()
        hosts.kill_node(4)
        assert "DUPLICATE_BROKER_REGISTRATION" in clone_log or "is refused" in clone_log, clone_log[-2000:]
        leaders = _leaders_by_term(admin)
        assert all(len(named) == 1 for named in leaders.values()), f"two leaders in one term: {leaders}"
    served = read_values(hosts.bootstrap, topic, 2, load.acked, timeout_s=90)
    missing = load.acked - served
    assert len(load.acked) > 500 and not missing, f"{len(missing)} of {len(load.acked)} acknowledged writes lost"


def _replica_endpoints(admin: Admin, topic: str) -> list[str]:
    """Every replica's advertised endpoint, once each has reported one (else empty: ask again)."""
    endpoints = [info.endpoint for partition in admin.describe_topic(topic).partitions
                 for info in partition.replica_info]
    return endpoints if len(endpoints) == 6 and all(endpoints) else []


def _voter_caught_up(admin: Admin, node: int) -> bool:
    """Whether the active controller counts `node`'s voter as following with nothing to catch up."""
    from actors.messages import ControllerStatusRequest, ControllerStatusResponse

    for endpoint in admin.bootstrap.split(","):
        try:
            status = admin.rpc.request(endpoint, ControllerStatusRequest(correlation_id=0), 2_000)
        except (RailmqError, TimeoutError):
            continue
        if isinstance(status, ControllerStatusResponse) and status.role == "leader":
            return 0 < status.commit_index <= status.followers.get(node, 0)
    return False


def _wrong_address_refusals(admin: Admin) -> int:
    """Raft messages the real voters (controllers and group voters) dropped for coming from an
    address other than their sender's host."""
    from actors.messages import RuntimeStatsRequest, RuntimeStatsResponse

    total = 0
    for endpoint in admin.bootstrap.split(","):
        host, _, port = endpoint.rpartition(":")
        for voter in (endpoint, f"{host}:{int(port) + 1}"):
            try:
                stats = admin.rpc.request(voter, RuntimeStatsRequest(correlation_id=0), 2_000)
            except (RailmqError, TimeoutError):
                continue
            if isinstance(stats, RuntimeStatsResponse):
                total += stats.counters.get("rejected_wrong_address", 0)
    return total


def _leaders_by_term(admin: Admin) -> dict[int, set[int]]:
    """term -> the leaders the real voters name for it."""
    from actors.messages import ControllerStatusRequest, ControllerStatusResponse

    named: dict[int, set[int]] = {}
    for endpoint in admin.bootstrap.split(","):
        try:
            status = admin.rpc.request(endpoint, ControllerStatusRequest(correlation_id=0), 2_000)
        except (RailmqError, TimeoutError):
            continue
        if isinstance(status, ControllerStatusResponse) and status.leader > 0:
            named.setdefault(status.term, set()).add(status.leader)
    return named


def _answers(admin: Admin) -> bool:
    try:
        admin.metadata([])
        return True
    except RailmqError:
        return False


def _in_sync(admin: Admin, topic: str) -> bool:
    try:
        return all(sorted(p.isr) == sorted(p.replicas) for p in admin.describe_topic(topic).partitions)
    except RailmqError:
        return False
