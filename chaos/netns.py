"""Hosts for chaos across machines: one network namespace per node, one `railmq node` in each.

Each namespace has its own network stack (its own loopback and one veth into a bridge in the
root namespace, where the caller and its clients run), so the nodes reach each other only over
TCP at their advertised addresses, as separate machines do. Node n is 10.231.<x>.n, the root
namespace .254; names carry a random tag so runs never meet each other's links.

The faults are a network's and a machine's: `cut` takes a host's link down (no packet in or
out: a partition between it and everyone else), `cut_between` drops what passes between two
hosts only, both ways or one way (a partial partition: each still reaches the others and the
clients), `degrade` delays and drops its packets (`tc netem`; a kernel without netem gets a
slow link instead, and the sentence says so), `kill_node` kills every process of the host at
once (the node process and its actors share one session) and `start_node` brings it back on its
own data directory.

The drops between two hosts need neither nftables nor iptables, nor the `tc` actions that a
small kernel leaves out: each host's link gets an HTB qdisc whose default class passes
everything, plus a class whose only queue holds nothing (`pfifo limit 0`: every packet put in it
is dropped); one `u32` filter per cut destination address sends that host's packets there. The
delay and loss of `degrade` sit under the default class, so both faults can hold at once.

It needs root and a kernel that allows namespaces: `unavailable()` says why not, and
`HostsUnavailable` carries that sentence. Everything it makes — namespaces, links, processes —
is removed by `destroy`, which is safe to call after any failure (and twice).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import msgspec

from actors.limits import Limits
from storage.directory import ClusterIdentity

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PORT = 7411
COMMAND_TIMEOUT_S = 30
STOP_TIMEOUT_S = 20
QUORUM_TIMEOUT_S = 60
PASS_RATE = "10gbit"  # the link's default class: no limit a test could reach


class HostsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, or the kernel refuses): the reason."""


def sh(*command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), capture_output=True, text=True, check=check, timeout=COMMAND_TIMEOUT_S)


def unavailable() -> str:
    """Why namespaces cannot be made here, or "" when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"rmqprobe{os.getpid()}"
    try:
        made = sh("ip", "netns", "add", probe, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return f"the ip command failed: {error}"
    if made.returncode != 0:
        return f"network namespaces are not allowed here: {made.stderr.strip()}"
    sh("ip", "netns", "del", probe, check=False)
    return ""


def session_alive(session: int) -> bool:
    """Whether any process of session `session` is still running."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == session:
                    return True
            except OSError:
                continue
    return False


class NamespaceHosts:
    """Three (or `nodes`) namespaces on a bridge, and the `railmq node` process of each."""

    def __init__(self, base_dir: str, nodes: int = 3, *, port: int = DEFAULT_PORT,
                 limits: Limits | None = None, spare_hosts: int = 0) -> None:
        self.tag = uuid.uuid4().hex[:6]
        third = int(self.tag[:2], 16) % 200 + 20
        self.subnet = f"10.231.{third}"
        self.bridge = f"rmq{self.tag}br"
        self.base_dir = base_dir
        self.nodes = tuple(range(1, nodes + 1))
        self.hosts = tuple(range(1, nodes + spare_hosts + 1))  # the spares run no node of their own
        self.port = port
        self.limits = limits
        self.processes: dict[int, subprocess.Popen] = {}
        self.made: list[tuple[str, str]] = []
        self.degraded: dict[int, str] = {}  # host -> "netem" or "rate": what restore undoes
        self.cut_off: set[int] = set()
        self.cut_pairs: set[tuple[int, int]] = set()  # (from, to): packets from one host to the other dropped
        self.shaped: set[int] = set()  # hosts whose link has the HTB root below
        self.cluster_id = ""

    def namespace(self, node: int) -> str:
        return f"rmq{self.tag}n{node}"

    def address(self, node: int) -> str:
        return f"{self.subnet}.{node}"

    def data_dir(self, node: int) -> str:
        return os.path.join(self.base_dir, f"host-{node}")

    @property
    def bootstrap(self) -> str:
        return ",".join(f"tcp://{self.address(node)}:{self.port}" for node in self.nodes)

    def identity(self) -> ClusterIdentity:
        """The cluster's id and secret, made in the first host's directory (the others copy it)."""
        os.makedirs(self.data_dir(1), exist_ok=True)
        return ClusterIdentity.load_or_create(self.data_dir(1))

    def create(self) -> None:
        reason = unavailable()
        if reason:
            raise HostsUnavailable(reason)
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        sh("ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for node in self.hosts:
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

    # ------------------------------------------------------------------ network faults

    def cut(self, node: int) -> None:
        """The host's link down: nothing reaches it and nothing leaves it."""
        self.run_in(node, "ip", "link", "set", "eth0", "down")
        self.cut_off.add(node)

    def reconnect(self, node: int) -> None:
        self.run_in(node, "ip", "link", "set", "eth0", "up")
        self.cut_off.discard(node)

    def cut_between(self, first: int, second: int, *, one_way: bool = False) -> None:
        """Drop every packet from host `first` to host `second` (and back, unless `one_way`);
        both keep reaching every other host and the clients."""
        for source, destination in ((first, second),) if one_way else ((first, second), (second, first)):
            if (source, destination) in self.cut_pairs:
                continue
            self._shape(source)
            self.run_in(source, "tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip",
                        "prio", str(destination), "u32", "match", "ip", "dst", f"{self.address(destination)}/32",
                        "flowid", "1:2")
            self.cut_pairs.add((source, destination))

    def mend_between(self, first: int, second: int) -> None:
        """Undo `cut_between` of the two hosts, in both directions."""
        for source, destination in ((first, second), (second, first)):
            if (source, destination) in self.cut_pairs:
                self.run_in(source, "tc", "filter", "del", "dev", "eth0", "parent", "1:", "prio", str(destination))
                self.cut_pairs.discard((source, destination))
                self._unshape_if_unused(source)

    def degrade(self, node: int, delay_ms: int = 30, loss_percent: float = 5.0) -> str:
        """Delay and loss on the host's link (`tc netem`); on a kernel without netem, a slow link
        (the default class held to 2 mbit/s) instead. Returns what was applied."""
        self._shape(node)
        netem = self.run_in(node, "tc", "qdisc", "add", "dev", "eth0", "parent", "1:1", "handle", "10:", "netem",
                            "delay", f"{delay_ms}ms", "loss", f"{loss_percent}%", check=False)
        if netem.returncode == 0:
            self.degraded[node] = "netem"
            return f"netem: {delay_ms} ms delay, {loss_percent}% loss"
        self._pass_rate(node, "2mbit")
        self.degraded[node] = "rate"
        return f"2 mbit/s (netem is not in this kernel: {netem.stderr.strip()})"

    def restore(self, node: int) -> None:
        how = self.degraded.pop(node, "")
        if how == "netem":
            self.run_in(node, "tc", "qdisc", "del", "dev", "eth0", "parent", "1:1", "handle", "10:", check=False)
        elif how == "rate":
            self._pass_rate(node, PASS_RATE)
        self._unshape_if_unused(node)

    def _shape(self, node: int) -> None:
        """The host's link through an HTB root: class 1:1 passes (the default), class 1:2 drops."""
        if node in self.shaped:
            return
        tc = ("tc", "qdisc", "add", "dev", "eth0")
        self.run_in(node, *tc, "root", "handle", "1:", "htb", "default", "1")
        self.shaped.add(node)
        self._pass_rate(node, PASS_RATE, command="add")
        self.run_in(node, "tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:2", "htb",
                    "rate", "8bit", "quantum", "1514")
        self.run_in(node, *tc, "parent", "1:2", "handle", "20:", "pfifo", "limit", "0")

    def _pass_rate(self, node: int, rate: str, command: str = "change") -> None:
        self.run_in(node, "tc", "class", command, "dev", "eth0", "parent", "1:", "classid", "1:1", "htb",
                    "rate", rate, "quantum", "60000")

    def _unshape_if_unused(self, node: int) -> None:
        if node in self.shaped and node not in self.degraded and not any(
                source == node for source, _ in self.cut_pairs):
            self.run_in(node, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
            self.shaped.discard(node)

    # ------------------------------------------------------------------ processes

    def start_node(self, node: int, *, join: int = 0) -> subprocess.Popen:
        """`railmq node` in the host's namespace, given every voter (`--voters`), or told to ask
        the running controller of host `join` for them (`--join`, with `--advertise`)."""
        command = ["ip", "netns", "exec", self.namespace(node), sys.executable, "-m", "railmq", "node",
                   "--node", str(node)]
        if join:
            command += ["--join", f"{self.address(join)}:{self.port}", "--advertise", self.address(node)]
        else:
            command += ["--voters", ",".join(f"{n}={self.address(n)}" for n in self.nodes), "--port", str(self.port)]
        command += ["--data-dir", self.data_dir(node), "--identity-from", self.data_dir(1)]
        if self.limits is not None:
            path = os.path.join(self.base_dir, "limits.json")
            with open(path, "wb") as handle:
                handle.write(msgspec.json.encode(self.limits))
            command += ["--limits", path]
        log = open(self.log_path(node), "ab")
        self.processes[node] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPOSITORY,
                                                start_new_session=True)
        log.close()
        return self.processes[node]

    def start_clone(self, of: int, on: int) -> subprocess.Popen:
        """Node `of` started a second time on spare host `on` from a copy of its data directory,
        as a cloned machine would be: the same node id, identity, voters and logs, another address."""
        shutil.copytree(self.data_dir(of), self.data_dir(on), dirs_exist_ok=True)
        command = ["ip", "netns", "exec", self.namespace(on), sys.executable, "-m", "railmq", "node",
                   "--node", str(of), "--voters", ",".join(f"{n}={self.address(n)}" for n in self.nodes),
                   "--port", str(self.port), "--advertise", self.address(on), "--data-dir", self.data_dir(on)]
        log = open(self.log_path(on), "ab")
        self.processes[on] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPOSITORY,
                                              start_new_session=True)
        log.close()
        return self.processes[on]

    def log_path(self, node: int) -> str:
        return os.path.join(self.base_dir, f"node-{node}.log")

    def kill_node(self, node: int) -> int:
        """Every process of the host at once: the node process and all its actors (one session).
        Returns the node process's pid (0 when it was not running)."""
        process = self.processes.pop(node, None)
        if process is None:
            return 0
        _signal_session(process.pid, signal.SIGKILL)
        process.wait(timeout=COMMAND_TIMEOUT_S)
        _wait_session_gone(process.pid, 10)
        return process.pid

    def stop_node(self, node: int) -> None:
        """`railmq node`'s own stop (SIGTERM: actors flush and exit), then kill what is left."""
        process = self.processes.get(node)
        if process is None:
            return
        _signal_session(process.pid, signal.SIGTERM, leader_only=True)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        _wait_session_gone(process.pid, 5)
        self.kill_node(node)

    def stop(self) -> None:
        for node in list(self.processes):
            self.stop_node(node)

    def destroy(self) -> None:
        for node in list(self.processes):
            self.kill_node(node)
        for kind, name in reversed(self.made):
            if kind == "netns":
                sh("ip", "netns", "del", name, check=False)
            else:
                sh("ip", "link", "del", name, check=False)
        self.made.clear()

    def start(self, timeout_s: float = QUORUM_TIMEOUT_S) -> None:
        """Make the hosts, start every node, and wait until a controller of the quorum answers."""
        from actors.errors import RailmqError
        from railmq.admin import Admin

        self.create()
        self.cluster_id = self.identity().cluster_id
        for node in self.nodes:
            self.start_node(node)
        deadline = time.monotonic() + timeout_s
        with Admin(self.bootstrap, timeout_ms=2_000) as admin:
            while True:
                try:
                    admin.metadata([])
                    return
                except RailmqError as error:
                    if time.monotonic() > deadline:
                        raise HostsUnavailable(f"the quorum across the hosts elected no controller in "
                                               f"{timeout_s:.0f} s: {error}") from None
                    time.sleep(0.2)

    def merge_traces(self, path: str) -> None:
        """Every host's trace in one file, in time order (torn lines left out: a killed process's)."""
        events = []
        for node in self.nodes:
            source = os.path.join(self.data_dir(node), "trace.jsonl")
            if not os.path.exists(source):
                continue
            with open(source, "rb") as handle:
                for raw in handle:
                    try:
                        event = msgspec.json.decode(raw)
                    except msgspec.DecodeError:
                        continue
                    if isinstance(event, dict):
                        events.append((event.get("time_ns", 0), raw.rstrip(b"\n")))
        with open(path, "wb") as handle:
            for _, raw in sorted(events, key=lambda item: item[0]):
                handle.write(raw + b"\n")


def _signal_session(session: int, signum: int, *, leader_only: bool = False) -> None:
    try:
        if leader_only:
            os.kill(session, signum)
        else:
            os.killpg(session, signum)
    except ProcessLookupError:
        pass


def _wait_session_gone(session: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and session_alive(session):
        time.sleep(0.05)
