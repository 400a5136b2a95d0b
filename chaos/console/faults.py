"""The console's fault buttons: kill, pause, resume, isolate and heal a replica, a whole node, the
coordinator or the group coordinator.

How each is done:
- kill / pause / resume are signals (SIGKILL, SIGSTOP, SIGCONT). A console that started the
  cluster (`railmq up --console`) signals through its `LocalCluster`; one that joined a running
  cluster (`railmq console --bootstrap B`) signals the pid the cluster reports (replicas: their
  heartbeats, via metadata; the coordinators: their RuntimeStats answer), after checking that
  the pid is still that actor — alive, and named as the actor names its process (ps shows the
  first 15 bytes of its name, `replica/` shortened to `r/`) — so a reused pid is never signalled.
  The supervisor
  restarts a killed actor after its restart delay, as it would after a crash.
- isolate is the chaos harness's network fault (chaos/links.py's isolation plan: the target
  hears and reaches nobody, everyone drops the target), installed through every actor's fault
  switch. The switch obeys only requests signed with the cluster secret, and only on a cluster
  started with the fault switch on (`railmq up --console` does; `LocalCluster(fault_injection=True)`):
  the console needs the data directory to read `cluster.secret`. The console's own requests
  (routing id `admin|...`) are never cut, so it keeps watching and can heal.

Every action returns a `FaultOutcome` with one sentence saying what was done, or why not; the
collector puts it on the timeline. `close()` resumes what this console paused and heals what it
isolated: a console that stops leaves no fault behind.
"""

from __future__ import annotations

import os
import signal
import stat
import threading
from typing import Any, Callable, NamedTuple

import psutil

from actors.errors import RailmqError
from actors.messages import LinkFault, MetadataResponse
from chaos.links import ActorRef, FaultBoard, LinkPlan, isolation_plan
from railmq.admin import Admin
from storage.directory import SECRET_BYTES_MAX

ACTIONS = ("kill", "pause", "resume", "isolate", "heal")
TARGET_KINDS = ("replica", "node", "coordinator", "group-coordinator")
PROCESS_NAME_BYTES = 15  # Linux keeps this much of a process name (transport/actor_main.py)


def process_name_of(actor_name: str) -> str:
    """The name an actor gives its process (transport/actor_main.py's main)."""
    return actor_name.replace("replica/", "r/")[:PROCESS_NAME_BYTES]


FAULT_REQUEST_TIMEOUT_MS = 2000
SECRET_FILE = "cluster.secret"  # storage/directory.py's CLUSTER_SECRET_NAME


class FaultRefused(Exception):
    """An action that cannot be done here (no secret, unknown target, nothing to resume)."""


class FaultOutcome(NamedTuple):
    action: str
    target: str
    ok: bool
    sentence: str


def read_secret(data_dir: str) -> bytes:
    """Read as storage reads it (storage/directory.py): a regular file, opened non-blocking, within
    its bound. Read whole and blocking, a symlink to /dev/zero was read until memory ran out and a
    pipe held the collector's start for ever."""
    path = os.path.join(data_dir, SECRET_FILE)
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise FaultRefused(f"the cluster secret {path} cannot be read (not a regular file)")
            secret = handle.read(SECRET_BYTES_MAX + 1)
    except OSError as error:
        raise FaultRefused(f"the cluster secret {path} cannot be read ({error.strerror})") from None
    if len(secret) > SECRET_BYTES_MAX:
        raise FaultRefused(f"the cluster secret {path} cannot be read (larger than {SECRET_BYTES_MAX} "
                           "bytes: not one railmq wrote)")
    if len(secret) < 16:
        raise FaultRefused(f"the cluster secret {path} is shorter than 16 bytes")
    return secret


def merge_plans(plans: list[LinkPlan]) -> LinkPlan:
    merged: LinkPlan = {}
    for plan in plans:
        for name, links in plan.items():
            merged.setdefault(name, []).extend(links)
    return merged


def node_isolation_plan(targets: list[ActorRef], everyone: list[ActorRef]) -> LinkPlan:
    """Every replica of a node isolated at once: each hears and reaches nobody, and the rest of
    the cluster drops all of them (one isolation plan per target, merged)."""
    return merge_plans([isolation_plan(target, everyone) for target in targets])


class ActorProcess(NamedTuple):
    name: str
    pid: int
    endpoint: str
    node: int  # 0 for the coordinators


class FaultController:
    """`actors()` gives every actor the console knows right now (from metadata and the services'
    answers); `cluster` is the LocalCluster when the console started it."""

    def __init__(
        self,
        bootstrap: str,
        actors: Callable[[], list[ActorProcess]],
        *,
        secret: bytes = b"",
        cluster: Any = None,
    ) -> None:
        self.bootstrap = bootstrap
        self._actors = actors
        self.cluster = cluster
        self.secret = secret or (cluster.secret if cluster is not None else b"")
        self._lock = threading.Lock()
        self._admin = Admin(bootstrap, timeout_ms=FAULT_REQUEST_TIMEOUT_MS, secret=self.secret or None)
        self.board = FaultBoard(self._endpoint_of, self._set_faults)
        self.paused: dict[str, int] = {}  # actor name -> pid this console stopped
        self.isolated: dict[str, int] = {}  # target label -> the board's fault id

    @property
    def can_isolate(self) -> bool:
        return bool(self.secret)

    # ------------------------------------------------------------------ targets

    def _endpoint_of(self, name: str) -> str:
        return next((actor.endpoint for actor in self._actors() if actor.name == name), "")

    def _set_faults(
        self, endpoint: str, links: list[LinkFault], disk_full: bool, fail_next_fsync: bool
    ) -> None:
        self._admin.set_faults(endpoint, links, disk_full=disk_full, fail_next_fsync=fail_next_fsync)

    def resolve(self, kind: str, name: str) -> list[ActorProcess]:
        """The processes a target means: one actor, or every replica of a node."""
        known = self._actors()
        if kind == "node":
            try:
                node = int(name)
            except ValueError:
                raise FaultRefused(f"{name!r} is not a node number") from None
            found = [actor for actor in known if actor.node == node and actor.name.startswith("replica/")]
            if not found:
                raise FaultRefused(f"node {node} runs no replica the console knows of")
            return found
        if kind not in TARGET_KINDS:
            raise FaultRefused(f"unknown target kind {kind!r} (one of {', '.join(TARGET_KINDS)})")
        wanted = kind if kind != "replica" else name
        found = [actor for actor in known if actor.name == wanted]
        if not found:
            raise FaultRefused(f"{wanted} is not running (or not known yet)")
        return found

    # ------------------------------------------------------------------ actions

    def perform(self, action: str, kind: str, name: str = "") -> FaultOutcome:
        label = f"node {name}" if kind == "node" else (name if kind == "replica" else kind)
        try:
            if action not in ACTIONS:
                raise FaultRefused(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")
            with self._lock:
                sentence = getattr(self, f"_{action}")(kind, name, label)
            return FaultOutcome(action, label, True, sentence)
        except FaultRefused as refused:
            return FaultOutcome(action, label, False, str(refused))
        except (RailmqError, TimeoutError) as error:
            return FaultOutcome(action, label, False, str(error))

    def _kill(self, kind: str, name: str, label: str) -> str:
        targets = self.resolve(kind, name)
        done = [self._signal(actor, signal.SIGKILL) for actor in targets]
        for actor in targets:
            self.paused.pop(actor.name, None)  # a killed process needs no resume
        return "SIGKILL to " + ", ".join(done) + "; the supervisor restarts it after its restart delay"

    def _pause(self, kind: str, name: str, label: str) -> str:
        done = []
        for actor in self.resolve(kind, name):
            done.append(self._signal(actor, signal.SIGSTOP))
            self.paused[actor.name] = actor.pid
        return "SIGSTOP to " + ", ".join(done) + " (resume sends SIGCONT)"

    def _resume(self, kind: str, name: str, label: str) -> str:
        chosen = self._paused_of(kind, name)
        if not chosen:
            raise FaultRefused(f"the console has not paused {label}")
        done = []
        for actor in chosen:
            pid = self.paused.pop(actor)
            done.append(self._signal(ActorProcess(actor, pid, "", 0), signal.SIGCONT, check_name=True))
        return "SIGCONT to " + ", ".join(done)

    def _isolate(self, kind: str, name: str, label: str) -> str:
        if not self.can_isolate:
            raise FaultRefused(
                "isolating needs the cluster secret: start the console with --data-dir DIR "
                "(it reads DIR/cluster.secret) on a cluster started with the fault switch on"
            )
        if label in self.isolated:
            raise FaultRefused(f"{label} is already isolated (heal it first)")
        targets = self.resolve(kind, name)
        everyone = [
            ActorRef(actor.name, actor.endpoint, actor.node) for actor in self._actors() if actor.endpoint
        ]
        refs = [ActorRef(actor.name, actor.endpoint, actor.node) for actor in targets]
        fault_id, problems = self.board.start_links(node_isolation_plan(refs, everyone))
        if problems and any(ref.name in " ".join(problems) for ref in refs):
            self.board.stop(fault_id)
            raise FaultRefused("the fault switch refused: " + "; ".join(problems))
        self.isolated[label] = fault_id
        others = f" ({len(problems)} other actor(s) not reached: {problems[0]})" if problems else ""
        return f"cut off from every peer: {', '.join(ref.name for ref in refs)}{others}"

    def _heal(self, kind: str, name: str, label: str) -> str:
        if kind == "all" or not label:
            problems = self.board.heal([actor.name for actor in self._actors()]) if self.can_isolate else []
            self.isolated.clear()
            return "every link fault removed" + (
                f" ({len(problems)} actor(s) not reached)" if problems else ""
            )
        fault_id = self.isolated.pop(label, None)
        if fault_id is None:
            raise FaultRefused(f"{label} is not isolated by this console")
        problems = self.board.stop(fault_id)
        return "links restored" + (f" ({'; '.join(problems)})" if problems else "")

    def _paused_of(self, kind: str, name: str) -> list[str]:
        """What this console paused that a target names (a paused replica soon looks dead to the
        coordinator, so this is judged from the console's own record, not from metadata)."""
        if kind == "node":
            return [
                paused
                for paused in self.paused
                if paused.startswith("replica/") and paused.endswith(f"/n{name}")
            ]
        wanted = name if kind == "replica" else kind
        return [wanted] if wanted in self.paused else []

    # ------------------------------------------------------------------ signals

    def _signal(self, actor: ActorProcess, signum: int, check_name: bool = True) -> str:
        if self.cluster is not None and actor.name in self.cluster.supervisor.actors:
            pid = self.cluster.supervisor.signal(actor.name, signum)
            return f"{actor.name} (pid {pid})"
        if check_name:
            self._check_process(actor)
        try:
            os.kill(actor.pid, signum)
        except ProcessLookupError:
            raise FaultRefused(f"{actor.name}'s process {actor.pid} is gone") from None
        return f"{actor.name} (pid {actor.pid})"

    @staticmethod
    def _check_process(actor: ActorProcess) -> None:
        if actor.pid <= 0:
            raise FaultRefused(f"the cluster has not reported a pid for {actor.name} yet")
        try:
            process_name = psutil.Process(actor.pid).name()
        except psutil.NoSuchProcess:
            raise FaultRefused(f"{actor.name}'s process {actor.pid} is gone (it may be restarting)") from None
        except psutil.AccessDenied:
            raise FaultRefused(f"not allowed to inspect process {actor.pid}") from None
        if process_name != process_name_of(actor.name):
            raise FaultRefused(
                f"process {actor.pid} is {process_name!r}, not {actor.name}: "
                "the pid is stale and will not be signalled"
            )

    def close(self) -> list[str]:
        """Resume everything this console paused and heal what it isolated."""
        problems = []
        with self._lock:
            for name, pid in list(self.paused.items()):
                try:
                    self._signal(ActorProcess(name, pid, "", 0), signal.SIGCONT)
                except FaultRefused as refused:
                    problems.append(str(refused))
            self.paused.clear()
            if self.isolated:
                problems += self.board.heal([actor.name for actor in self._actors()])
                self.isolated.clear()
            self._admin.close()
        return problems


def actors_from_metadata(
    metadata: MetadataResponse | None, services: list[ActorProcess]
) -> list[ActorProcess]:
    """Every replica the metadata names (with its reported pid and endpoint) plus the services."""
    found = list(services)
    for topic in (metadata.topics if metadata is not None else []):
        for partition in topic.partitions:
            for info in partition.replica_info:
                if info.pid:  # a stale pid is caught by the name check before any signal
                    found.append(
                        ActorProcess(
                            f"replica/{topic.name}/{partition.partition}/n{info.node}",
                            info.pid,
                            info.endpoint,
                            info.node,
                        )
                    )
    return found
