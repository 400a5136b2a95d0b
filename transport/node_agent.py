"""The node agent: keeps the replica processes of some nodes in line with the coordinator's plan,
and is their heartbeat.

Its replicas report to it (a ROUTER on 127.0.0.1, `endpoint`): once when their state changes and
otherwise a keepalive every `replica_keepalive_interval_ms`, all on the same instants
(actors/replica_reports.py). Every `node_heartbeat_interval_ms` (sooner for news) it sends the
coordinator one `NodeHeartbeat` for all of them — which incarnation runs, whether
each still answers (a report within `replica_keepalive_timeout_ms`), the reports that changed —
and the answer carries the assignments when they changed: it starts a process for each missing
replica, stops each one no longer assigned, and lets the supervisor restart crashed actors. It
tells the coordinator at once when a replica process exits (`ReplicaExited`) so failover does not
wait for any timeout. It runs in a thread of the process that owns the supervisor (`railmq up`,
`LocalCluster`), with its own sockets, and sleeps until something happens (`_sleep`): no period of
its own. Reports are accepted only with the cluster's tag.

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
import secrets
import shutil
import socket
import threading
import time
from typing import Callable

import zmq

from actors.controller_endpoints import ControllerEndpoints
from actors.errors import ErrorCode
from actors.limits import MESSAGE_FRAMES_MAX, Limits
from actors.messages import (
    ErrorResponse, NodeHeartbeat, NodeHeartbeatResponse, ReplicaAssignment, ReplicaExited, ReplicaHeartbeat,
)
from transport.actor_main import ActorSpec, replica_directory
from transport.codec import Codec, DecodeFailure
from transport.connections import RouterGuard, client_connections_bound, raise_open_files_limit
from transport.frames import discard, receive
from transport.replica_report_book import ReplicaReportBook
from transport.rpc import RequestTimeout, RpcClient
from transport.supervisor import ManagedActor, Supervisor

log = logging.getLogger("railmq.node_agent")


RECONCILE_TIMEOUT_MS = 200
REPORTS_PER_WAKE_MAX = 1000
NEWS_DELAY_MS = 20  # news waits this long for more news to share its heartbeat


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
                 on_change: Callable[[], None] | None = None,
                 shared_memory: bool = True, secret: bytes = b"", faults_enabled: bool = False,
                 bind_host: str = "127.0.0.1", advertise_host: str = "") -> None:
        self.supervisor = supervisor
        self.coordinator = coordinator  # the bootstrap: every voter of the quorum (or one coordinator)
        self.controllers = ControllerEndpoints(coordinator)
        self.nodes = list(nodes)
        self.data_dir = data_dir
        self.cluster_id = cluster_id
        self.limits = limits
        self.trace_path = trace_path
        self.log_level = log_level
        self.shared_memory = shared_memory
        self.secret = secret
        self.faults_enabled = faults_enabled
        self.bind_host, self.advertise_host = bind_host, advertise_host  # where its replicas listen
        self.on_change = on_change
        self.replicas: dict[str, tuple[str, int, int, int]] = {}  # actor name -> (topic, partition, node, topic id)
        self.book = ReplicaReportBook(limits.replica_keepalive_timeout_ms)
        # New at every start (Kafka's broker incarnation id): the coordinator lets one agent run a
        # node at a time, and names this one to an operator who started the node twice.
        self.agent_id = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"
        self.refused = ""  # why the coordinator refuses this agent's heartbeats, while it does
        self.assignments_version = ""
        self.full_report_wanted = True
        self.endpoint = ""
        self._router: zmq.Socket | None = None
        self._guard: RouterGuard | None = None  # the bounds on the connections to the reports socket
        # The connection whose message of too many frames is being dropped (transport/frames.py): it
        # is closed once the message is read to its end.
        self._discarding_from: int | None = None
        self.counters: dict[str, int] = {}
        self._stop = threading.Event()
        self._wake_read, self._wake_write = -1, -1  # rung by stop() to end the thread's sleep
        self.wakeups = 0  # times the thread woke from its sleep (an idle node: about one a second)
        self._thread: threading.Thread | None = None
        self._exits: list[tuple[ManagedActor, int]] = []  # (process, its incarnation) that exited
        self.unusable_node_dirs: set[str] = set()  # said once each, until they can be listed again
        self._lock = threading.Lock()

    def start(self) -> None:
        """Bind the reports socket (its endpoint goes into every replica's spec), then run."""
        self.bind_reports()
        self._wake_read, self._wake_write = os.pipe()
        self.supervisor.on_exit = self._on_exit
        self._thread = threading.Thread(target=self._run, name="railmq-node-agent", daemon=True)
        self._thread.start()

    def bind_reports(self) -> None:
        """The reports socket, bound on a port of its own, with its bounds on client connections."""
        router = zmq.Context.instance().socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.RCVHWM, self.limits.router_receive_queue_max)
        router.setsockopt(zmq.MAXMSGSIZE, self.limits.frame_bytes_hard_max)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        self._router, self.endpoint = router, f"tcp://127.0.0.1:{port}"
        # Any local process can reach this port, and this is the process that owns every actor
        # of its nodes: connections without the cluster's tag are bounded as an actor's are.
        raise_open_files_limit()
        self._guard = RouterGuard(
            router, untrusted_max=client_connections_bound(self.limits.client_connections_max),
            inbound_bytes_max=self.limits.client_inbound_bytes_max,
            check_interval_ms=self.limits.client_inbound_check_interval_ms, clock=time.monotonic_ns, count=self._count)

    def stop(self) -> None:
        self._stop.set()
        if self._wake_write >= 0:
            os.write(self._wake_write, b"x")
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._thread is None or not self._thread.is_alive():
            if self._router is not None:
                self._guard.close()
                self._router.close(linger=0)
                self._router = None
            for fd in (self._wake_read, self._wake_write):
                if fd >= 0:
                    os.close(fd)
            self._wake_read = self._wake_write = -1
            self.supervisor.close_watch()

    @property
    def reading_overlong(self) -> bool:
        """Whether a message of too many frames on the reports socket is still being dropped."""
        return self._discarding_from is not None

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _on_exit(self, managed: ManagedActor) -> None:
        # With the incarnation that exited: the next process may be ready before the notice goes.
        with self._lock:
            self._exits.append((managed, managed.incarnation))

    def _run(self) -> None:
        rpc = RpcClient(identity="node-agent", secret=self.secret or None)
        codec = Codec(self.limits.frame_bytes_max, secret=self.secret or None)
        interval_ns = self.limits.node_heartbeat_interval_ms * 1_000_000
        next_beat_ns = 0
        try:
            while not self._stop.is_set():
                self.supervisor.poll()
                self._report_exits(rpc)
                if time.monotonic_ns() >= next_beat_ns:
                    next_beat_ns = time.monotonic_ns() + interval_ns
                    try:
                        self._heartbeat(rpc)
                    except RequestTimeout:
                        pass  # the coordinator is restarting; try again next round
                    except Exception:
                        log.exception("node agent heartbeat failed")
                if self._receive_reports(codec, 0):
                    next_beat_ns = min(next_beat_ns, time.monotonic_ns() + NEWS_DELAY_MS * 1_000_000)
                self._guard.on_events()
                self._guard.check_if_due()
                self._sleep(next_beat_ns, rpc.connection_fds())
                rpc.discard_unasked()  # nothing is asked between heartbeats: what came is stale
                rpc.check_inbound()  # a process on a voter's port sending one endless message
            if not self.refused:
                self._leave(rpc)
        finally:
            rpc.close()

    def _leave(self, rpc: RpcClient) -> None:
        """The last word as the agent stops: its nodes are free at once for the agent that starts
        next, not a node session later (actors/node_liveness.py). Bounded: a coordinator that is
        down already does not hold up the stop."""
        try:
            rpc.request_controller(self.controllers, NodeHeartbeat(correlation_id=0, nodes=self.nodes,
                                                                   agent_id=self.agent_id, leaving=True),
                                   timeout_ms=RECONCILE_TIMEOUT_MS, authenticated_only=bool(self.secret))
        except RequestTimeout:
            pass  # the next agent waits out the node session instead

    def _sleep(self, next_beat_ns: int, controller_fds: list[int]) -> None:
        """Until there is something to do: a process exited or became ready, a process was
        started, a report came, data came on a connection to a controller (transport/rpc.py
        bounds what those hold), a restart or the next heartbeat is due, or stop() was called.
        No period: an idle node wakes this thread once per heartbeat and per keepalive round
        (replicas send their keepalives on shared instants, actors/replica_reports.py)."""
        fds, restart_due_ns = self.supervisor.watch()
        wait_ns = next_beat_ns - time.monotonic_ns()
        for due_ns in (restart_due_ns, self._guard.check_at_ns if self._guard is not None else None):
            if due_ns is not None:
                wait_ns = min(wait_ns, due_ns - time.monotonic_ns())
        if wait_ns <= 0:
            return
        poller = zmq.Poller()
        poller.register(self._wake_read, zmq.POLLIN)
        if self._router is not None:
            poller.register(self._router, zmq.POLLIN)
            poller.register(self._guard.monitor, zmq.POLLIN)
        for fd in fds + controller_fds:
            poller.register(fd, zmq.POLLIN)
        self.wakeups += 1
        try:
            poller.poll(wait_ns / 1e6 + 1)
        except zmq.ZMQError:
            pass  # a descriptor closed under it (another thread stopped a process): look again

    def _receive_reports(self, codec: Codec, timeout_ms: int) -> bool:
        """Take the reports waiting (up to `timeout_ms` for the first); True if one is news."""
        router = self._router
        if router is None or (timeout_ms > 0 and not router.poll(timeout_ms, zmq.POLLIN)):
            return False
        news = False
        for _ in range(REPORTS_PER_WAKE_MAX):
            if self._discarding_from is not None and not self._discard_frames(router):
                break  # the rest at the next wake-up: the heartbeat and the processes first
            try:
                frames, more = receive(router, MESSAGE_FRAMES_MAX)
            except zmq.Again:
                break
            if more:
                # More frames than any report: a process of the cluster never sends one. Read
                # whole, 200,000 empty frames (400 KB) were as many objects on the thread that
                # supervises every actor of the node. Its sender's connection is closed once the
                # message is read to its end (closed before, libzmq took the next one for the rest).
                self._count("messages_over_frames_max")
                self._discarding_from = frames[0].get(zmq.SRCFD)
                continue
            fd = self._guard.arrived(frames)
            try:
                report = codec.decode(frames[1:])
            except DecodeFailure:
                continue
            if codec.last_authenticated:
                self._guard.trust(fd)
            # Only from this cluster's processes, and only about a replica this agent runs: the
            # book holds one report per supervised replica, whoever else writes to the socket.
            if isinstance(report, ReplicaHeartbeat) and (codec.last_authenticated or not self.secret) \
                    and report.node in self.nodes and self._from_running_process(report):
                news |= self.book.take(report, time.monotonic_ns())
        return news

    def _discard_frames(self, router: zmq.Socket) -> bool:
        """Drop frames of a message of too many, at most a runtime's batch of them; whether its end
        was read."""
        read, done = discard(router, self.limits.runtime_batch_frames_max)
        self.counters["message_frames_discarded"] = self.counters.get("message_frames_discarded", 0) + read
        if done:
            fd, self._discarding_from = self._discarding_from, None
            if not self._guard.close_client(fd) and not self._guard.table.trusted(fd):
                self._guard.on_events()  # its connection's report may still be queued
                self._guard.close_client(fd)
        return done

    def _from_running_process(self, report: ReplicaHeartbeat) -> bool:
        """Whether the report comes from the process this agent runs for its replica. An earlier
        process of it may still be alive and send: one paused (SIGSTOP) while its node replaced it
        on a new disk, resumed later with its reports still addressed here. Its reports would tell
        the coordinator that the process on record is one whose disk is lost. A process says it is
        ready before it reports, so a report from one not known ready yet reads the lifeline first."""
        managed = self.supervisor.actors.get(replica_actor_name(report.topic, report.partition, report.node))
        if managed is None:
            return False
        if not managed.ready and managed.process is not None:
            with self.supervisor.lock:
                self.supervisor.check_ready(managed)
        if managed.ready and managed.incarnation == report.incarnation:
            return True
        self._count("reports_from_other_processes")
        return False

    def _report_exits(self, rpc: RpcClient) -> None:
        with self._lock:
            exits, self._exits = self._exits, []
        for managed, incarnation in exits:
            spec = managed.spec
            if spec.kind == "replica" and incarnation:
                self.book.forget(spec.topic, spec.partition, spec.node, incarnation)
                rpc.send(self.controllers.current, ReplicaExited(
                    topic=spec.topic, partition=spec.partition, node=spec.node, incarnation=incarnation))

    def _heartbeat(self, rpc: RpcClient) -> None:
        # Short: while the coordinator is down this thread must keep reaping and restarting
        # processes (the coordinator itself among them), not wait on it.
        beat = self.book.heartbeat(self.nodes, self.assignments_version, time.monotonic_ns(),
                                   everything=self.full_report_wanted, agent_id=self.agent_id)
        reply = rpc.request_controller(self.controllers, beat, timeout_ms=RECONCILE_TIMEOUT_MS,
                                       authenticated_only=bool(self.secret))
        if isinstance(reply, ErrorResponse) and reply.error == ErrorCode.INCONSISTENT_CLUSTER_ID:
            if reply.error_message != self.refused:  # said once: it is the cause, in the log users read
                log.error("the controllers refuse to run this cluster: %s", reply.error_message)
            self.refused = reply.error_message
            return
        if not isinstance(reply, NodeHeartbeatResponse):
            return
        if reply.error == ErrorCode.DUPLICATE_BROKER_REGISTRATION:
            if not self.refused:
                log.warning("node agent %s is refused: %s", self.agent_id, reply.error_message)
            self.refused = reply.error_message
            return
        if reply.error:
            return
        if self.refused:
            log.warning("node agent %s now runs nodes %s", self.agent_id, self.nodes)
            self.refused = ""
        if reply.cluster_id and reply.cluster_id != self.cluster_id:
            log.error("the coordinator at %s belongs to cluster %s, not %s: ignoring its assignments",
                      self.controllers.current, reply.cluster_id, self.cluster_id)
            return
        self.book.delivered(beat)
        self.full_report_wanted = reply.full_report_wanted
        if reply.assignments is not None:
            self._reconcile(reply.assignments, set(reply.deleted_topic_ids))
            self.assignments_version = reply.assignments_version

    def _reconcile(self, assignments: list[ReplicaAssignment], deleted: set[int]) -> None:
        wanted = {replica_actor_name(assignment.topic, assignment.partition, assignment.node): assignment
                  for assignment in assignments}
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
                             faults_enabled=self.faults_enabled, replicas=list(assignment.replicas),
                             report_to=self.endpoint, bind_host=self.bind_host, advertise_host=self.advertise_host)
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
        self.book.forget(topic, partition, node)
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
            names = self._list_node_directory(node_dir)
            for name in names:
                topic_id = _topic_id_of(name)
                running = any(known[3] == topic_id and known[2] == node for known in self.replicas.values())
                if topic_id in deleted and not running:
                    shutil.rmtree(os.path.join(node_dir, name), ignore_errors=True)
                    log.info("deleted %s/%s: its topic id %x was deleted", node_dir, name, topic_id)
                    removed = True
        return removed

    def _list_node_directory(self, node_dir: str) -> list[str]:
        """Its entries; none if it is missing (nothing created there yet) or unusable (a file in
        its place, no permission). An unusable one is the node's own trouble, which its replicas
        report as they refuse to start: said here once, not on every heartbeat."""
        try:
            names = os.listdir(node_dir)
        except FileNotFoundError:
            return []
        except OSError as error:
            if node_dir not in self.unusable_node_dirs:
                self.unusable_node_dirs.add(node_dir)
                log.warning("cannot look for deleted topics' data in %s: %s; its replicas cannot start "
                            "there either until it is a usable directory again", node_dir,
                            (error.strerror or str(error)).lower())
            return []
        self.unusable_node_dirs.discard(node_dir)
        return names

    def replica_names(self) -> list[str]:
        return sorted(self.replicas)
