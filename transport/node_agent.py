"""The node agent: keeps the replica processes of some nodes in line with the coordinator's plan.

Every `interval_ms` it asks the coordinator which replicas its nodes should run
(`NodeAssignmentsRequest`), starts a process for each missing one, stops each one that is no
longer assigned, lets the supervisor restart crashed actors, and tells the coordinator at once
when a replica process exits (`ReplicaExited`) so failover does not wait for the session timeout.
It runs in a thread of the process that owns the supervisor (`railmq up`, `LocalCluster`), with
its own sockets.

It deletes a replica's data only when the coordinator has *recorded* that topic id as deleted
(`deleted_topic_ids`, the coordinator's tombstones) — never because a topic is absent from the
list it got: a coordinator that lost or forgot its state must not be able to wipe the disks. An
answer from a coordinator of another cluster (its cluster id differs) is ignored altogether.

Kubernetes-style reconciliation: the desired state is always re-read, so a restarted coordinator,
a deleted topic or a crashed replica all converge the same way.
"""

from __future__ import annotations

import logging
import os
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


def _topic_id_of(directory_name: str) -> int | None:
    """The topic id a replica directory's name ends with (`<topic>-<partition>-<topic id hex>`)."""
    _, _, suffix = directory_name.rpartition("-")
    try:
        return int(suffix, 16)
    except ValueError:
        return None


class NodeAgent:
    def __init__(self, *, supervisor: Supervisor, coordinator: str, nodes: list[int], data_dir: str,
                 cluster_id: str, limits: Limits, trace_path: str = "", log_level: str = "WARNING",
                 interval_ms: int = 100, on_change: Callable[[], None] | None = None,
                 shared_memory: bool = True, secret: bytes = b"", faults_enabled: bool = False) -> None:
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
        self.secret = secret
        self.faults_enabled = faults_enabled
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
        rpc = RpcClient(identity="node-agent", secret=self.secret or None)
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
                            timeout_ms=RECONCILE_TIMEOUT_MS, authenticated_only=bool(self.secret))
        if not isinstance(reply, NodeAssignmentsResponse) or reply.error:
            return
        if reply.cluster_id and reply.cluster_id != self.cluster_id:
            log.error("the coordinator at %s belongs to cluster %s, not %s: ignoring its assignments",
                      self.coordinator, reply.cluster_id, self.cluster_id)
            return
        deleted = set(reply.deleted_topic_ids)
        wanted = {replica_actor_name(assignment.topic, assignment.partition, assignment.node): assignment
                  for assignment in reply.replicas}
        changed = False
        for name, assignment in wanted.items():
            known = self.replicas.get(name)
            if known is not None and known[3] == assignment.topic_id:
                continue
            if known is not None:
                self._retire(name, delete=known[3] in deleted)
            spec = ActorSpec(kind="replica", name=name, cluster_id=self.cluster_id, data_dir=self.data_dir,
                             coordinator=self.coordinator, node=assignment.node, topic=assignment.topic,
                             topic_id=assignment.topic_id, partition=assignment.partition, config=assignment.config,
                             limits=self.limits, trace_path=self.trace_path, log_level=self.log_level,
                             shared_memory=self.shared_memory, secret=self.secret,
                             faults_enabled=self.faults_enabled, replicas=list(assignment.replicas))
            self.supervisor.launch(spec)
            self.replicas[name] = (assignment.topic, assignment.partition, assignment.node, assignment.topic_id)
            changed = True
        for name in [name for name in self.replicas if name not in wanted]:
            self._retire(name, delete=self.replicas[name][3] in deleted)
            changed = True
        changed |= self._delete_tombstoned_directories(deleted)
        if changed and self.on_change is not None:
            self.on_change()

    def _retire(self, name: str, *, delete: bool) -> None:
        topic, partition, node, topic_id = self.replicas.pop(name)
        self.supervisor.stop(name)
        if delete:
            shutil.rmtree(replica_directory(self.data_dir, node, topic, partition, topic_id), ignore_errors=True)
            log.info("retired %s and deleted its data (topic id %x was deleted)", name, topic_id)
        else:
            log.warning("stopped %s: no longer assigned, but its topic id %x was never recorded as deleted, "
                        "so its data stays in %s", name, topic_id,
                        replica_directory(self.data_dir, node, topic, partition, topic_id))

    def _delete_tombstoned_directories(self, deleted: set[int]) -> bool:
        """Directories of deleted topics left on disk (the cluster was down when they were deleted)."""
        removed = False
        for node in self.nodes:
            node_dir = os.path.join(self.data_dir, f"node-{node}")
            try:
                names = os.listdir(node_dir)
            except FileNotFoundError:
                continue
            for name in names:
                topic_id = _topic_id_of(name)
                running = any(known[3] == topic_id and known[2] == node for known in self.replicas.values())
                if topic_id in deleted and not running:
                    shutil.rmtree(os.path.join(node_dir, name), ignore_errors=True)
                    log.info("deleted %s/%s: its topic id %x was deleted", node_dir, name, topic_id)
                    removed = True
        return removed

    def replica_names(self) -> list[str]:
        return sorted(self.replicas)
