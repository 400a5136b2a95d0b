"""A cluster across hosts: three network namespaces as three machines, one `railmq node` in each.

Each namespace has its own network stack (its own loopback and one veth into a bridge in the root
namespace, where this test and its clients run), so the nodes reach each other only over TCP at
their advertised addresses, as on separate machines. The story: a topic at RF 3 (min in-sync 2)
under a steady acks=all load, while the network between the hosts misbehaves — `tc netem` delay
and loss on one host's link, a host cut off entirely (its link down, longer than an election),
and every process of a host killed and started again. At the end every acknowledged write is
there, the topic is intact, and its replicas are back in sync.

It needs root (namespaces, veths, a bridge) and skips with the reason where that is not allowed.
Everything it makes — namespaces, links, processes, directories — is removed even when it fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from actors.errors import RailmqError
from railmq.admin import Admin
from railmq.producer import Producer
from storage.directory import ClusterIdentity
from tests.helpers import read_values, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODES = (1, 2, 3)
PORT = 7411


def sh(*command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), capture_output=True, text=True, check=check, timeout=30)


class Hosts:
    """Three namespaces on a bridge: node n at 10.<a>.<b>.n, the root namespace at .254."""

    def __init__(self, base_dir: str) -> None:
        self.tag = uuid.uuid4().hex[:6]
        third = int(self.tag[:2], 16) % 200 + 20
        self.subnet = f"10.231.{third}"
        self.bridge = f"rmq{self.tag}br"
        self.base_dir = base_dir
        self.processes: dict[int, subprocess.Popen] = {}
        self.made: list[tuple[str, str]] = []

    def namespace(self, node: int) -> str:
        return f"rmq{self.tag}n{node}"

    def address(self, node: int) -> str:
        return f"{self.subnet}.{node}"

    def data_dir(self, node: int) -> str:
        return os.path.join(self.base_dir, f"host-{node}")

    @property
    def bootstrap(self) -> str:
        return ",".join(f"tcp://{self.address(node)}:{PORT}" for node in NODES)

    def create(self) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        sh("ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for node in NODES:
            namespace, outside = self.namespace(node), f"rmq{self.tag}v{node}"
            sh("ip", "netns", "add", namespace)
            self.made.append(("netns", namespace))
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            self.made.append(("link", outside))
            sh("ip", "link", "set", outside, "master", self.bridge, "up")
            self.run_in(node, "ip", "addr", "add", f"{self.address(node)}/24", "dev", "eth0")
            self.run_in(node, "ip", "link", "set", "eth0", "up")
            self.run_in(node, "ip", "link", "set", "lo", "up")

    def run_in(self, node: int, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", self.namespace(node), *command, check=check)

    def degrade_link(self, node: int) -> str:
        """Delay and loss on the host's link (`tc netem`); on a kernel without netem, a slow link
        (a 2 mbit/s token bucket) instead. Returns what was applied."""
        netem = self.run_in(node, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "30ms", "loss", "5%",
                            check=False)
        if netem.returncode == 0:
            return "netem: 30 ms delay, 5% loss"
        self.run_in(node, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "2mbit", "burst", "32kbit",
                    "latency", "100ms")
        return f"tbf: 2 mbit/s (netem is not in this kernel: {netem.stderr.strip()})"

    def start_node(self, node: int) -> None:
        voters = ",".join(f"{n}={self.address(n)}" for n in NODES)
        command = ["ip", "netns", "exec", self.namespace(node), sys.executable, "-m", "railmq", "node",
                   "--node", str(node), "--voters", voters, "--port", str(PORT),
                   "--data-dir", self.data_dir(node), "--identity-from", self.data_dir(1)]
        log = open(os.path.join(self.base_dir, f"node-{node}.log"), "ab")
        self.processes[node] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPOSITORY,
                                                start_new_session=True)
        log.close()

    def kill_node(self, node: int) -> None:
        """Every process of the host at once: the node process and all its actors (one session)."""
        process = self.processes.pop(node, None)
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _session_alive(process.pid):
            time.sleep(0.05)

    def destroy(self) -> None:
        for node in list(self.processes):
            self.kill_node(node)
        for kind, name in reversed(self.made):
            if kind == "netns":
                sh("ip", "netns", "del", name, check=False)
            else:
                sh("ip", "link", "del", name, check=False)


def _session_alive(session: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == session:
                    return True
            except OSError:
                continue
    return False


@pytest.fixture
def hosts(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    probe = sh("ip", "netns", "add", f"rmqprobe{os.getpid()}", check=False)
    if probe.returncode != 0:
        pytest.skip(f"network namespaces are not allowed here: {probe.stderr.strip()}")
    sh("ip", "netns", "del", f"rmqprobe{os.getpid()}", check=False)
    made = Hosts(str(tmp_path))
    try:
        made.create()
        yield made
    finally:
        made.destroy()


class AckedLoad:
    """acks=all sends in a closed loop from the root namespace; what was acknowledged, kept."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.acked: set[bytes] = set()
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
                    except (RailmqError, TimeoutError):
                        pass  # not acknowledged: no promise to keep


def test_a_cluster_across_hosts_keeps_every_acknowledged_write_through_network_faults(hosts, unique_name):
    os.makedirs(hosts.data_dir(1))
    ClusterIdentity.load_or_create(hosts.data_dir(1))  # the identity every host is given a copy of
    for node in NODES:
        hosts.start_node(node)
    topic = unique_name()
    with Admin(hosts.bootstrap, timeout_ms=5_000) as admin:
        wait_for(lambda: _answers(admin), 60, "the quorum across the hosts to elect a controller")
        admin.create_topic(topic, partitions=2, replication_factor=3, config={"min_insync_replicas": 2},
                           timeout_s=60)
        admin.wait_for_leaders(topic, timeout_s=60, full_isr=True)
        endpoints = wait_for(lambda: _replica_endpoints(admin, topic), 30, "every replica to report its endpoint")
        assert all(endpoint.startswith(f"tcp://{hosts.subnet}.") for endpoint in endpoints), (
            f"a replica advertised an address other hosts cannot reach: {endpoints}")
        load = AckedLoad(hosts.bootstrap, topic)
        load.thread.start()
        wait_for(lambda: len(load.acked) >= 200, 60, "acknowledged writes before the faults")

        print(f"host 2's link: {hosts.degrade_link(2)}")
        time.sleep(3)
        hosts.run_in(2, "tc", "qdisc", "del", "dev", "eth0", "root")

        hosts.run_in(3, "ip", "link", "set", "eth0", "down")  # host 3 cut off from every other host
        time.sleep(4)
        hosts.run_in(3, "ip", "link", "set", "eth0", "up")

        before_kill = len(load.acked)
        hosts.kill_node(1)  # every process of host 1, at once
        wait_for(lambda: len(load.acked) > before_kill + 100, 60, "writes acknowledged without host 1")
        hosts.start_node(1)
        time.sleep(2)
        load.stop.set()
        load.thread.join(60)

        wait_for(lambda: _in_sync(admin, topic), 90, "every replica back in the ISR")
        assert topic in admin.list_topics()
    served = read_values(hosts.bootstrap, topic, 2, load.acked, timeout_s=90)
    missing = load.acked - served
    assert len(load.acked) > 500 and not missing, f"{len(missing)} of {len(load.acked)} acknowledged writes lost"


def _replica_endpoints(admin: Admin, topic: str) -> list[str]:
    """Every replica's advertised endpoint, once each has reported one (else empty: ask again)."""
    endpoints = [info.endpoint for partition in admin.describe_topic(topic).partitions
                 for info in partition.replica_info]
    return endpoints if len(endpoints) == 6 and all(endpoints) else []


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
