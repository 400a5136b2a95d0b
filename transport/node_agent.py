"""The node agent: keeps the replica processes of some nodes in line with the coordinator's plan.

Every `interval_ms` it asks the coordinator which replicas its nodes should run
(`NodeAssignmentsRequest`), starts a process for each missing one, stops (and deletes the data
of) each one that is no longer assigned, lets the supervisor restart crashed actors, and tells
the coordinator at once when a replica process exits (`ReplicaExited`) so failover does not wait
for the session timeout. It runs in a thread of the process that owns the supervisor
(`railmq up`, `LocalCluster`), with its own sockets.

Kubernetes-style reconciliation: the desired state is always re-read, so a restarted coordinator,
a deleted topic or a crashed replica all converge the same way.
"""

from __future__ import annotations

import logging
import shutil
import threading
from typing import Callable

from actors.limits import Limits
from actors.messages import NodeAssignmentsRequest, NodeAssignmentsResponse, ReplicaExited
from transport.actor_main import ActorSpec, replica_directory
from transport.rpc import RequestTimeout, RpcClient
from transport.supervisor import ManagedActor, Supervisor

log = logging.getLogger("railmq.node_agent")


RECONCILE_TIMEOUT_MS = 200


def replica_actor_name(topic: str, partition: int, node: int) -> str:
    return f"replica/{topic}/{partition}/n{node}"


class NodeAgent:
    def __init__(self, *, supervisor: Supervisor, coordinator: str, nodes: list[int], data_dir: str,
                 cluster_id: str, limits: Limits, trace_path: str = "", log_level: str = "WARNING",
                 interval_ms: int = 100, on_change: Callable[[], None] | None = None,
                 shared_memory: bool = True) -> None:
        self.supervisor = supervisor
        self.coordinator = coordinator
        self.nodes = list(nodes)
        self.data_dir = data_dir
        self.cluster_id = cluster_id
        self.limits = limits
        self.trace_path = trace_path
        self.log_level = log_level
        self.interval_ms = interval_ms
        self.shared_memory = shared_memory
        self.on_change = on_change
        self.replicas: dict[str, tuple[str, int, int, int]] = {}  # actor name -> (topic, partition, node, topic id)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._exits: list[ManagedActor] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        self.supervisor.on_exit = self._on_exit
        self._thread = threading.Thread(target=self._run, name="railmq-node-agent", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _on_exit(self, managed: ManagedActor) -> None:
        with self._lock:
            self._exits.append(managed)

    def _run(self) -> None:
        rpc = RpcClient(identity="node-agent")
        try:
            while not self._stop.is_set():
                self.supervisor.poll()
                self._report_exits(rpc)
                try:
                    self._reconcile(rpc)
                except RequestTimeout:
                    pass  # the coordinator is restarting; try again next round
                except Exception:
                    log.exception("node agent reconcile failed")
                self._stop.wait(self.interval_ms / 1000)
        finally:
            rpc.close()

    def _report_exits(self, rpc: RpcClient) -> None:
        with self._lock:
            exits, self._exits = self._exits, []
        for managed in exits:
            spec = managed.spec
            if spec.kind == "replica" and managed.incarnation:
                rpc.send(self.coordinator, ReplicaExited(
                    topic=spec.topic, partition=spec.partition, node=spec.node, incarnation=managed.incarnation))

    def _reconcile(self, rpc: RpcClient) -> None:
        # Short: while the coordinator is down this thread must keep reaping and restarting
        # processes (the coordinator itself among them), not wait on it.
        reply = rpc.request(self.coordinator, NodeAssignmentsRequest(correlation_id=0, nodes=self.nodes),
                            timeout_ms=RECONCILE_TIMEOUT_MS)
        if not isinstance(reply, NodeAssignmentsResponse):
            return
        wanted: dict[str, tuple[str, int, int, int, object]] = {}
        for assignment in reply.replicas:
            name = replica_actor_name(assignment.topic, assignment.partition, assignment.node)
            wanted[name] = (assignment.topic, assignment.partition, assignment.node, assignment.topic_id,
                            assignment.config)
        changed = False
        for name, (topic, partition, node, topic_id, config) in wanted.items():
            known = self.replicas.get(name)
            if known is not None and known[3] == topic_id:
                continue
            if known is not None:
                self._retire(name)
            spec = ActorSpec(kind="replica", name=name, cluster_id=self.cluster_id, data_dir=self.data_dir,
                             coordinator=self.coordinator, node=node, topic=topic, topic_id=topic_id,
                             partition=partition, config=config, limits=self.limits,
                             trace_path=self.trace_path, log_level=self.log_level, shared_memory=self.shared_memory)
            self.supervisor.launch(spec)
            self.replicas[name] = (topic, partition, node, topic_id)
            changed = True
        for name in [name for name in self.replicas if name not in wanted]:
            self._retire(name)
            changed = True
        if changed and self.on_change is not None:
            self.on_change()

    def _retire(self, name: str) -> None:
        topic, partition, node, topic_id = self.replicas.pop(name)
        self.supervisor.stop(name)
        shutil.rmtree(replica_directory(self.data_dir, node, topic, partition, topic_id), ignore_errors=True)
        log.info("retired %s", name)

    def replica_names(self) -> list[str]:
        return sorted(self.replicas)
