"""`LocalCluster`: a whole railmq cluster on this machine, as processes, from Python.

    with LocalCluster(nodes=3) as cluster:
        Admin(cluster.bootstrap).create_topic("orders", partitions=3, replication_factor=3)

It starts the controller quorum — one controller per node, up to `controllers` (3 by default, 1
on a cluster of one or two nodes), on `port`, `port + 1`, ... or free ports; `controllers=0`
runs the single coordinator process of earlier releases instead — then the group coordinator,
and a node agent that starts one process per partition replica as topics are created.
`bootstrap` lists every voter (`tcp://...:p1,tcp://...:p2,...`); clients given any one of them
find the others from its answers. Data lives in `data_dir`
(a temporary directory removed on stop when none is given). Stopping is orderly and complete:
every actor gets SIGTERM (then SIGKILL), every child is reaped, and shared-memory segments the
actors recorded are unlinked. `railmq up` is this class in the foreground.

For chaos experiments it exposes the processes: `actors()` lists name, pid, endpoint and role;
`kill`, `pause` and `resume` signal one by name; `leader_of(topic, partition)` names the actor
leading a partition right now. The fault switch of every actor (link cuts, disk faults) obeys only
a cluster started with `fault_injection=True`, and only requests carrying this cluster's secret
(`Admin(bootstrap, secret=cluster.secret)`).

The data directory belongs to one cluster at a time: `start` takes its lock (a second
`LocalCluster` or `railmq up` on it fails with `DirectoryInUse` naming the holder's pid), and
reads its identity — the cluster id and secret created by its first start (storage/directory.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from typing import Any

from actors.limits import NODES_MAX, Limits
from storage.directory import ClusterIdentity, DirectoryLock
from transport.actor_main import ActorSpec
from transport.node_agent import NodeAgent, replica_actor_name
from transport.supervisor import ManagedActor, Supervisor


def controller_name(node: int) -> str:
    return f"controller/{node}"


def group_voter_name(node: int) -> str:
    return f"group-coordinator/{node}"


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now (bound, read and released together, so they differ)."""
    import socket

    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class LocalCluster:
    def __init__(self, nodes: int = 3, *, data_dir: str | None = None, port: int = 0,
                 limits: Limits | None = None, restart_delay_ms: int = 500, trace: bool = True,
                 log_level: str = "WARNING", cluster_id: str | None = None, shared_memory: bool = True,
                 fault_injection: bool = False, rebuild_metadata: bool = False,
                 controllers: int | None = None, reset_group_state: bool = False) -> None:
        if not 1 <= nodes <= NODES_MAX:
            raise ValueError(f"a cluster has at least one node and at most {NODES_MAX}, got {nodes}")
        self.node_ids = list(range(1, nodes + 1))
        if controllers is None:
            controllers = 3 if nodes >= 3 else 1
        if not 0 <= controllers <= nodes:
            raise ValueError(f"controllers must be 0 (a single coordinator) to {nodes} (one per node), "
                             f"got {controllers}")
        self.controller_ids = self.node_ids[:controllers]
        self.own_data_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="railmq-")
        self.port = port
        self.limits = limits or Limits()
        self.requested_cluster_id = cluster_id
        self.cluster_id = cluster_id or ""
        self.secret = b""
        self.fault_injection = fault_injection
        self.rebuild_metadata = rebuild_metadata
        self.reset_group_state = reset_group_state  # the first start only: a restart never starts empty
        self._lock: DirectoryLock | None = None
        self.trace_path = os.path.join(self.data_dir, "trace.jsonl") if trace else ""
        self.log_level = log_level
        self.shared_memory = shared_memory
        self.supervisor = Supervisor(restart_delay_ms=restart_delay_ms)
        self.agent: NodeAgent | None = None
        self.bootstrap = ""
        self.controller_endpoints: dict[int, str] = {}
        self.started = False

    def start(self) -> "LocalCluster":
        os.makedirs(self.data_dir, exist_ok=True)
        from transport.ring import unlink_orphaned_rings
        from transport.shm import cluster_prefix

        self._lock = DirectoryLock(self.data_dir).acquire()
        try:
            identity = ClusterIdentity.load_or_create(self.data_dir, self.requested_cluster_id)
        except BaseException:
            self._release_lock()
            raise
        self.cluster_id, self.secret = identity.cluster_id, identity.secret
        unlink_orphaned_rings(cluster_prefix(self.cluster_id))  # a previous run killed outright
        try:
            self.bootstrap = self._start_controllers() if self.controller_ids else self._start_coordinator()
            if not self.controller_ids:
                spec = self._spec("group-coordinator", "group-coordinator")
                spec.reset_group_state = self.reset_group_state
                self.supervisor.start(spec)
                spec.reset_group_state = False
            self.agent = NodeAgent(
                supervisor=self.supervisor, coordinator=self.bootstrap, nodes=self.node_ids,
                data_dir=self.data_dir, cluster_id=self.cluster_id, limits=self.limits,
                trace_path=self.trace_path, log_level=self.log_level, shared_memory=self.shared_memory,
                secret=self.secret, faults_enabled=self.fault_injection)
            self.agent.start()
            self.started = True
        except BaseException:
            self.stop()
            raise
        return self

    def _start_coordinator(self) -> str:
        spec = self._spec("coordinator", "coordinator", port=self.port)
        spec.rebuild_metadata = self.rebuild_metadata
        coordinator = self.supervisor.start(spec)
        spec.rebuild_metadata = False  # restarts open the rebuilt state
        coordinator.spec.port = int(coordinator.endpoint.rsplit(":", 1)[1])  # restarts keep the port
        return coordinator.endpoint

    def _start_controllers(self) -> str:
        """Both quorums, one voter of each per controller node (actors/controller.py,
        actors/group_quorum.py). Every voter must know every voter's endpoint before it starts, so
        the ports are chosen first — consecutive from `port` (the controllers', then the group
        voters'), else free ones — and kept across restarts. The voters start together."""
        from transport.actor_main import controller_directory

        count = len(self.controller_ids)
        ports = [self.port + offset for offset in range(2 * count)] if self.port else free_ports(2 * count)
        quorums = [
            ("controller", controller_name, ports[:count], lambda node: controller_directory(self.data_dir, node)),
            ("group-coordinator", group_voter_name, ports[count:],
             lambda node: os.path.join(self.data_dir, f"node-{node}", "group-coordinator")),
        ]
        launched = []
        for kind, name_of, kind_ports, directory_of in quorums:
            voters = {node: f"tcp://127.0.0.1:{port}" for node, port in zip(self.controller_ids, kind_ports)}
            if kind == "controller":  # the group voters announce themselves to the controllers
                self.controller_endpoints, self.bootstrap = voters, ",".join(voters.values())
            formed = any(os.path.isdir(os.path.join(directory_of(node), "raft"))
                         and os.listdir(os.path.join(directory_of(node), "raft")) for node in self.controller_ids)
            for index, node in enumerate(self.controller_ids):
                spec = self._spec(kind, name_of(node), port=int(voters[node].rsplit(":", 1)[1]))
                spec.node, spec.voters, spec.quorum_formed = node, voters, formed
                if self.rebuild_metadata and index == 0 and kind == "controller":
                    spec.rebuild_metadata = True  # one rebuild, before the other voters read its result
                    self.supervisor.start(spec)
                    spec.rebuild_metadata = False
                else:
                    spec.reset_group_state = self.reset_group_state and kind == "group-coordinator"
                    launched.append(self.supervisor.launch(spec))
        self.supervisor.wait_ready(launched)
        for managed in launched:
            managed.spec.reset_group_state = False
        return self.bootstrap

    def controller_endpoint(self, timeout_s: float = 10.0) -> str:
        """The one endpoint that decides now: the active controller's (or the single coordinator's)."""
        if not self.controller_ids:
            return self.bootstrap
        return self.actor(self.active_controller(timeout_s)).endpoint

    def group_coordinator_name(self, timeout_s: float = 10.0) -> str:
        """The actor name of the process coordinating groups now (the active group voter)."""
        if not self.controller_ids:
            return "group-coordinator"
        from railmq.admin import Admin

        deadline = time.monotonic() + timeout_s
        with Admin(self.bootstrap) as admin:
            while True:
                endpoint = admin.metadata([]).group_coordinator_endpoint
                for name in self.group_voter_names():
                    managed = self.supervisor.actors.get(name)
                    if endpoint and managed is not None and managed.alive and managed.endpoint == endpoint:
                        return name
                if time.monotonic() > deadline:
                    raise TimeoutError("no group coordinator is announced")
                time.sleep(0.05)

    def group_voter_names(self) -> list[str]:
        return [group_voter_name(node) for node in self.controller_ids]

    def controller_names(self) -> list[str]:
        return [controller_name(node) for node in self.controller_ids]

    def active_controller(self, timeout_s: float = 10.0) -> str:
        """The actor name of the active controller (raises TimeoutError when none is, in time)."""
        from railmq.admin import Admin

        with Admin(self.bootstrap) as admin:
            status = admin.quorum_status(timeout_s=timeout_s)
        active = [entry.node for entry in status if entry.active]
        if not active:
            raise TimeoutError("no controller is active")
        return controller_name(active[0])

    def _spec(self, kind: str, name: str, port: int = 0) -> ActorSpec:
        return ActorSpec(kind=kind, name=name, cluster_id=self.cluster_id, data_dir=self.data_dir, port=port,
                         coordinator=self.bootstrap, nodes=self.node_ids, limits=self.limits,
                         trace_path=self.trace_path, log_level=self.log_level, secret=self.secret,
                         faults_enabled=self.fault_injection)

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
            self.agent = None
        self.supervisor.stop_all()
        from transport.ring import unlink_orphaned_rings
        from transport.shm import cluster_prefix, unlink_segments

        if self.cluster_id and self.started:
            unlink_segments(cluster_prefix(self.cluster_id))  # every ring of the cluster, clients' too
        elif self.cluster_id:
            # A start that failed: another process may run this cluster (a second `railmq up` on a
            # directory whose .lock was deleted is refused by its actors' locks), and its rings are live.
            unlink_orphaned_rings(cluster_prefix(self.cluster_id))
        self.started = False
        self._release_lock()
        if self.own_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ processes

    def actors(self) -> list[dict[str, Any]]:
        with self.supervisor.lock:
            return [self._describe(managed) for managed in self.supervisor.actors.values()]

    def _describe(self, managed: ManagedActor) -> dict[str, Any]:
        spec = managed.spec
        return {"name": managed.name, "kind": spec.kind, "node": spec.node, "topic": spec.topic,
                "partition": spec.partition, "pid": managed.pid if managed.alive else 0,
                "endpoint": managed.endpoint, "alive": managed.alive, "restarts": managed.restarts}

    def actor(self, name: str) -> ManagedActor:
        return self.supervisor.actors[name]

    def replica_name(self, topic: str, partition: int, node: int) -> str:
        return replica_actor_name(topic, partition, node)

    def kill(self, name: str) -> int:
        """SIGKILL an actor (the supervisor restarts it after its restart delay)."""
        return self.supervisor.signal(name, signal.SIGKILL)

    def node_actors(self, node: int) -> list[str]:
        """Every process that runs on `node`: its controller, its group voter and its replicas."""
        with self.supervisor.lock:
            return sorted(name for name, managed in self.supervisor.actors.items() if managed.spec.node == node)

    def lose_node(self, node: int) -> list[str]:
        """The loss of a machine: SIGKILL every process of `node`, then delete its data directory
        (`data_dir/node-<node>`: its replicas, its controller's and group voter's logs). The
        supervisor restarts them after the restart delay, empty, as a replaced machine would be."""
        import psutil

        names = self.node_actors(node)
        pids = []
        for name in names:
            try:
                pids.append(self.kill(name))
            except (KeyError, ProcessLookupError):
                pass
        deadline = time.monotonic() + 5.0
        for pid in pids:  # dead (a zombie holds no file open) before its files go
            while time.monotonic() < deadline:
                try:
                    if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                        break
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.005)
        shutil.rmtree(os.path.join(self.data_dir, f"node-{node}"), ignore_errors=True)
        return names

    def pause(self, name: str) -> int:
        return self.supervisor.signal(name, signal.SIGSTOP)

    def resume(self, name: str) -> int:
        return self.supervisor.signal(name, signal.SIGCONT)

    def leader_of(self, topic: str, partition: int) -> str:
        """The actor name of the partition's current leader (raises if it has none)."""
        from railmq.admin import Admin

        with Admin(self.bootstrap) as admin:
            leader = admin.describe_topic(topic).partitions[partition].leader
        if leader < 0:
            raise LookupError(f"{topic}/{partition} has no leader")
        return replica_actor_name(topic, partition, leader)
