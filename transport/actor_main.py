"""The entry point of every actor process: build the actor from its spec, bind, report, run.

A process is told what to be by an `ActorSpec` (MessagePack bytes, so the spawn/forkserver hand-off
pickles nothing clever). It binds its ROUTER, builds its actor with real storage, tells the
supervisor "ready" with its endpoint over the lifeline pipe, then runs the runtime loop.

The lifeline is the supervisor's end of a pipe: when the supervisor dies (even by SIGKILL) the
pipe reads EOF and this process stops — no orphans. Ctrl-C (SIGINT) reaches every process in the
terminal's process group, so actors ignore it and let the supervisor stop them in order with
SIGTERM (graceful: the actor's `Stop` flushes its storage) or a "stop" line on the lifeline.

Before an actor touches its directory it takes the directory's lock (storage/directory.py) and
checks whose it is: a replica directory of another cluster, topic id, partition or node, a
coordinator whose state file is missing, short or corrupt while replica directories exist, a
directory another live process holds — each makes the process *refuse to start*: it sends
("refused", sentence) on the lifeline and exits with EXIT_REFUSED, having changed nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import sys
import time
from multiprocessing.connection import Connection
from typing import Any, Iterator

import msgspec
import zmq

from actors.limits import Limits
from actors.messages import TopicConfig
from storage.errors import StorageFull

EXIT_CRASHED = 70  # the actor asked to crash (failed fsync, deleted topic, ...)
EXIT_PARENT_GONE = 71
EXIT_REFUSED = 72  # the actor refused to start: its directory is someone else's, or its state is lost
EXIT_DISK_FULL = 73  # a write it could not do without (a controller's raft log) found the disk full
PROFILE_ENV = "RAILMQ_PROFILE_DIR"  # set to a directory to profile every actor process
PROFILE_CLOCK_ENV = "RAILMQ_PROFILE_CLOCK"  # "cpu" to profile CPU time instead of wall time


class ActorSpec(msgspec.Struct, kw_only=True):
    kind: str  # "controller" | "coordinator" | "group-coordinator" | "replica"
    name: str
    cluster_id: str
    data_dir: str
    port: int = 0
    coordinator: str = ""
    node: int = 0
    nodes: list[int] = []
    topic: str = ""
    topic_id: int = 0
    partition: int = -1
    config: TopicConfig = TopicConfig()
    limits: Limits = Limits()
    trace_path: str = ""
    log_level: str = "WARNING"
    shared_memory: bool = True  # fetch payloads through shared-memory rings on this host
    secret: bytes = b""  # the cluster secret (transport/auth.py); handed over the pipe, never a socket
    faults_enabled: bool = False  # obey the chaos harness's fault switch (clusters started for chaos)
    replicas: list[int] = []  # replicas: the partition's replica list, recorded in its directory
    rebuild_metadata: bool = False  # coordinator: rebuild a lost state from the replica directories
    report_to: str = ""  # replicas: their node agent's endpoint ("": report to the coordinator)
    voters: dict[int, str] = {}  # controllers: the quorum, voter (node) id -> endpoint
    bind_host: str = "127.0.0.1"  # where the actor's ROUTER listens
    advertise_host: str = ""  # the address others reach it at ("": bind_host), docs/deploy.md
    quorum_formed: bool = False  # controllers: some voter already has a log (a new one joins empty)


class RefusedToStart(Exception):
    """The actor must not run on this directory; the sentence says why and what to do."""


def replica_directory(data_dir: str, node: int, topic: str, partition: int, topic_id: int) -> str:
    return os.path.join(data_dir, f"node-{node}", f"{topic}-{partition}-{topic_id:x}")


def log_config_for(config: TopicConfig) -> Any:
    """Storage settings for a topic. `every_batch` flushing is done by the actor (AfterFlush, so
    one fsync covers many requests), so the log itself is told NEVER for that policy."""
    from storage.log import FlushPolicy, LogConfig

    policy = FlushPolicy.INTERVAL if config.flush_policy == "interval" else FlushPolicy.NEVER
    return LogConfig(
        segment_bytes=config.segment_bytes, segment_ms=config.segment_ms, retention_ms=config.retention_ms,
        retention_bytes=config.retention_bytes, flush_policy=policy, flush_interval_ms=config.flush_interval_ms,
        batch_bytes_max=config.batch_bytes_max,
    )


class StorageFaults:
    """Lets the runtime's FaultControlRequest reach the actor's file system."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def __call__(self, *, disk_full: bool, fail_next_fsync: bool) -> None:
        self.fs.faults.set_write_quota(0 if disk_full else None)
        if fail_next_fsync:
            self.fs.faults.fail_next_fsync()


def build_actor(spec: ActorSpec, endpoint: str, incarnation: int) -> tuple[Any, Any]:
    """(actor, storage fault hook) for a spec. Raises RefusedToStart when the directory is not
    this actor's to use."""
    from actors.replicated_state import BadCommand
    from storage.directory import DirectoryInUse, DirectoryLock
    from storage.errors import CorruptState
    from storage.fs import OsFileSystem
    from storage.raft_records import CorruptRaftLog, CorruptRaftSnapshot

    fs = OsFileSystem()
    directory = actor_directory(spec)
    try:
        _LOCKS.append(DirectoryLock(directory).acquire())  # held until the process exits
    except DirectoryInUse as error:
        raise RefusedToStart(str(error)) from None
    except OSError as error:  # the lock file cannot be made (a directory in its place, no permission)
        raise RefusedToStart(f"{error.filename or directory}: cannot take the directory's lock "
                             f"({error.strerror or error})") from None
    try:
        return _build_kind(spec, fs, directory, endpoint, incarnation)
    except (CorruptState, CorruptRaftLog, CorruptRaftSnapshot, BadCommand) as error:
        # Damage found on open is not a crash to retry at once: the file is left as it is, and the
        # actor stays down (retried ever more slowly) until an operator restores or removes it.
        raise RefusedToStart(f"{spec.name}: its durable state is damaged ({error}); the file is left as it is "
                             "(docs/operations.md, \"Storage faults\")") from None


def _build_kind(spec: ActorSpec, fs: Any, directory: str, endpoint: str, incarnation: int) -> tuple[Any, Any]:
    if spec.kind == "coordinator":
        return _build_coordinator(spec, fs, directory, incarnation), StorageFaults(fs)
    if spec.kind == "controller":
        return _build_controller(spec, fs, directory, endpoint, incarnation), StorageFaults(fs)
    if spec.kind == "group-coordinator" and spec.voters:
        return _build_group_voter(spec, fs, directory, endpoint, incarnation), StorageFaults(fs)
    if spec.kind == "group-coordinator":
        from actors.group_coordinator import GroupCoordinator
        from storage.state import DurableState

        state = DurableState.open(os.path.join(directory, "groups.state"), fs=fs)
        actor = GroupCoordinator(state=state, coordinator=spec.coordinator, endpoint=endpoint,
                                 incarnation=incarnation, pid=os.getpid(), limits=spec.limits,
                                 rng=random.Random(incarnation))
        return actor, StorageFaults(fs)
    if spec.kind == "replica":
        return _build_replica(spec, fs, directory, endpoint, incarnation), StorageFaults(fs)
    raise ValueError(f"unknown actor kind {spec.kind!r}")


_LOCKS: list[Any] = []


def actor_directory(spec: ActorSpec) -> str:
    if spec.kind == "replica":
        return replica_directory(spec.data_dir, spec.node, spec.topic, spec.partition, spec.topic_id)
    if spec.kind == "controller":
        return controller_directory(spec.data_dir, spec.node)
    if spec.kind == "group-coordinator" and spec.voters:
        return os.path.join(spec.data_dir, f"node-{spec.node}", "group-coordinator")
    return os.path.join(spec.data_dir, spec.kind)


REJOINING_MARK = "rejoining"


def controller_directory(data_dir: str, node: int) -> str:
    """A controller's Raft log lives with its node's replicas: losing the node loses both."""
    return os.path.join(data_dir, f"node-{node}", "controller")


def _build_coordinator(spec: ActorSpec, fs: Any, directory: str, incarnation: int) -> Any:
    from actors.coordinator import Coordinator
    from storage.errors import CorruptState
    from storage.state import DurableState
    from transport.metadata_rebuild import check_state_present, rebuild_state

    path = os.path.join(directory, "metadata.state")
    if spec.rebuild_metadata:
        rebuild_state(spec.data_dir, path, spec.cluster_id, fs)
    check_state_present(spec.data_dir, path)
    try:
        state = DurableState.open(path, fs=fs, confirm=True)  # storage/state.py: epochs must not be lost to bit rot
    except CorruptState as error:
        raise RefusedToStart(f"the coordinator's state is corrupt ({error}); see `railmq up --help` "
                             "for --rebuild-metadata") from None
    try:
        return Coordinator(state=state, nodes=spec.nodes, rng=random.Random(incarnation), limits=spec.limits,
                           cluster_id=spec.cluster_id)
    except ValueError as error:
        raise RefusedToStart(str(error)) from None


def _build_controller(spec: ActorSpec, fs: Any, directory: str, endpoint: str, incarnation: int) -> Any:
    """A voter of the quorum. A voter with an empty log on a cluster whose quorum never formed
    takes the metadata of a single-coordinator cluster (`coordinator/metadata.state`) as its
    first command if it is elected; with neither, while replica directories exist, it refuses to
    start, as the single coordinator does (the metadata is lost: `--rebuild-metadata`)."""
    from actors.controller import Controller
    from actors.coordinator import Coordinator

    raft_directory = os.path.join(directory, "raft")
    empty = voter_log_missing(raft_directory)
    bootstrap: list[tuple[str, Any]] = []
    if empty and not quorum_formed(spec, directory):  # checked before anything is written
        bootstrap = _first_metadata(spec, fs)
    log, rejoining, rejoined = _open_voter_log(spec, fs, directory, empty)
    config = _raft_config(spec)
    rng = random.Random(incarnation)

    def coordinator(state: Any) -> Any:
        return Coordinator(state=state, nodes=spec.nodes, rng=random.Random(rng.getrandbits(64)), limits=spec.limits,
                           cluster_id=spec.cluster_id)

    return Controller(config=config, log=log, rng=rng, coordinator_factory=coordinator, endpoint=endpoint,
                      pid=os.getpid(), bootstrap=bootstrap, name=spec.name, rejoining=rejoining,
                      on_rejoined=rejoined)


def voter_log_missing(raft_directory: str) -> bool:
    """Whether a voter has no raft journal (new, or its disk was lost). Decided by the journal's
    name, not by an empty directory: a leftover temporary file beside a lost journal must not
    make a wiped voter look like one that still holds its vote."""
    from storage.raft_records import LOG_NAME

    return not os.path.exists(os.path.join(raft_directory, LOG_NAME))


def _open_voter_log(spec: ActorSpec, fs: Any, directory: str, empty: bool) -> tuple[Any, bool, Any]:
    """(raft log, rejoining, what to call once caught up) of a voter of either quorum.

    A voter that comes back empty to a quorum that had formed (its disk was lost) must not vote
    until a leader has caught it up (docs/raft.md §7); the mark survives its crashes."""
    from storage.raft_log import RaftLog

    log = RaftLog.open(os.path.join(directory, "raft"), fs=fs)
    mark = os.path.join(directory, REJOINING_MARK)
    if empty and quorum_formed(spec, directory) and not os.path.exists(mark):
        with open(mark, "wb") as handle:
            handle.write(b"this voter lost its log: it votes again once a leader has caught it up\n")
            os.fsync(handle.fileno())
        fs.sync_directory(directory)
    rejoining = os.path.exists(mark)

    def rejoined() -> None:
        try:
            os.unlink(mark)
            fs.sync_directory(directory)
        except OSError:
            pass  # still marked: after a restart it waits to be caught up once more, which is safe

    return log, rejoining, rejoined if rejoining else None


def quorum_formed(spec: ActorSpec, directory: str) -> bool:
    """Whether this voter's quorum had formed before: the cluster said so at start, or another
    voter of it on this machine has written a record or a snapshot (this one was wiped while the
    cluster runs). A voter that merely started has a log of headers only."""
    from storage.raft_records import HEADER_BYTES, LOG_NAME, SNAPSHOT_NAME

    if spec.quorum_formed:
        return True
    kind = os.path.basename(directory)
    for node in spec.voters:
        raft = os.path.join(spec.data_dir, f"node-{node}", kind, "raft")
        if node == spec.node:
            continue
        log = os.path.join(raft, LOG_NAME)
        if os.path.exists(os.path.join(raft, SNAPSHOT_NAME)) or (
                os.path.exists(log) and os.path.getsize(log) > HEADER_BYTES):
            return True
    return False


def _raft_config(spec: ActorSpec) -> Any:
    from actors.raft import RaftConfig

    return RaftConfig(node_id=spec.node, voters=dict(spec.voters),
                      election_timeout_ms=spec.limits.controller_election_timeout_ms,
                      heartbeat_interval_ms=spec.limits.controller_heartbeat_interval_ms,
                      idle_heartbeat_interval_ms=spec.limits.controller_idle_heartbeat_interval_ms,
                      campaign_at_first_start=True)


def _build_group_voter(spec: ActorSpec, fs: Any, directory: str, endpoint: str, incarnation: int) -> Any:
    """A voter of the group-coordination quorum (actors/group_quorum.py). A new quorum on a
    cluster that had a single group coordinator starts from its `groups.state`."""
    from actors.group_coordinator import GroupCoordinator
    from actors.group_quorum import GroupQuorumVoter
    from storage.state import DurableState

    raft_directory = os.path.join(directory, "raft")
    empty = voter_log_missing(raft_directory)
    bootstrap: list[tuple[str, Any]] = []
    legacy = os.path.join(spec.data_dir, "group-coordinator", "groups.state")
    if empty and not quorum_formed(spec, directory) and os.path.exists(legacy):
        bootstrap = DurableState.read(legacy, fs=fs)  # another actor's file: read, never written
    log, rejoining, rejoined = _open_voter_log(spec, fs, directory, empty)
    rng = random.Random(incarnation)

    def group_coordinator(state: Any) -> Any:
        return GroupCoordinator(state=state, coordinator=spec.coordinator, endpoint=endpoint,
                                incarnation=rng.getrandbits(62) + 1, pid=os.getpid(), limits=spec.limits,
                                rng=random.Random(rng.getrandbits(64)))

    return GroupQuorumVoter(config=_raft_config(spec), log=log, rng=rng, coordinator_factory=group_coordinator,
                            endpoint=endpoint, pid=os.getpid(), bootstrap=bootstrap, name=spec.name,
                            rejoining=rejoining, on_rejoined=rejoined)


def _first_metadata(spec: ActorSpec, fs: Any) -> list[tuple[str, Any]]:
    """What the first leader of a new quorum starts from: the single coordinator's state when
    this cluster had one (rebuilt from the replica directories with `--rebuild-metadata`), or
    nothing for a new cluster. Refuses when replica directories exist but no metadata does."""
    from transport.metadata_rebuild import rebuild_state

    legacy = os.path.join(spec.data_dir, "coordinator", "metadata.state")
    with _metadata_bootstrap_lock(spec.data_dir):
        if spec.rebuild_metadata:
            rebuild_state(spec.data_dir, legacy, spec.cluster_id, fs)
        return _read_first_metadata(spec, fs, legacy)


@contextlib.contextmanager
def _metadata_bootstrap_lock(data_dir: str) -> Iterator[None]:
    """Every voter of a new quorum on this machine rebuilds and reads the same legacy file at its
    first start: one at a time (an exclusive flock on `<data dir>/.metadata-bootstrap`, waited
    for; the kernel drops it if its holder dies), or one could read another's half-written
    rebuild, or find the file renamed away mid-read."""
    import fcntl

    fd = os.open(os.path.join(data_dir, METADATA_BOOTSTRAP_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for one rebuild and one read: milliseconds
        yield
    finally:
        os.close(fd)


METADATA_BOOTSTRAP_LOCK = ".metadata-bootstrap"


def _read_first_metadata(spec: ActorSpec, fs: Any, legacy: str) -> list[tuple[str, Any]]:
    from storage.errors import CorruptState
    from storage.state import HEADER_BYTES, DurableState
    from transport.metadata_rebuild import HOW_TO_RECOVER, has_replica_data

    size = os.path.getsize(legacy) if os.path.exists(legacy) else -1
    if size <= HEADER_BYTES:
        if has_replica_data(spec.data_dir):
            raise RefusedToStart(
                f"no controller of this cluster has its log (node-N/controller/raft under {spec.data_dir}) and "
                f"there is no coordinator state {legacy}, but replica directories exist: starting as a new "
                "cluster would abandon their data. " + HOW_TO_RECOVER.format(path="the controllers' logs"))
        return []
    try:
        return DurableState.read(legacy, fs=fs, confirm=True)  # the other voters read it too: never written
    except CorruptState as error:
        raise RefusedToStart(f"the coordinator's state is corrupt ({error}); see `railmq up --help` "
                             "for --rebuild-metadata") from None


def _build_replica(spec: ActorSpec, fs: Any, directory: str, endpoint: str, incarnation: int) -> Any:
    from actors.partition_replica import PartitionReplica
    from storage.replica_meta import MetaMismatch, ReplicaMeta, open_replica_directory

    now_ms = time.time_ns() // 1_000_000
    expected = ReplicaMeta(cluster_id=spec.cluster_id, topic=spec.topic, topic_id=spec.topic_id,
                           partition=spec.partition, node=spec.node, replicas=list(spec.replicas),
                           config=msgspec.to_builtins(spec.config), created_ms=now_ms)
    try:
        opened = open_replica_directory(fs, directory, expected, log_config_for(spec.config), now_ms)
    except MetaMismatch as error:
        raise RefusedToStart(str(error)) from None
    return PartitionReplica(
        topic=spec.topic, topic_id=spec.topic_id, partition=spec.partition, node=spec.node, endpoint=endpoint,
        coordinator=spec.coordinator, log=opened.log, config=spec.config, incarnation=incarnation, pid=os.getpid(),
        limits=spec.limits, health=opened.health, findings=opened.findings, report_to=spec.report_to)


class TraceFile:
    """Appends an actor's Trace effects as JSON lines (the chaos harness and labs read them).

    Tracing never kills an actor: a failed write (a full disk, an I/O error) is counted in
    `dropped` and the line is lost; the file is rotated at `bytes_max` (trace.jsonl -> .1 -> .2 ...),
    keeping `kept` old ones, so it never grows without bound. Several actors append to one file;
    whichever sees it past the limit renames it (the others keep writing to the renamed file
    until they notice, within one line).
    """

    def __init__(self, path: str, actor_name: str, *, bytes_max: int = Limits().trace_file_bytes_max,
                 kept: int = Limits().trace_files_kept) -> None:
        self.path = path
        self.actor_name = actor_name
        self.bytes_max = bytes_max
        self.kept = kept
        self.dropped = 0
        self.handle: Any = None
        self._open()

    def _open(self) -> None:
        try:
            self.handle = open(self.path, "a", encoding="utf-8", buffering=1)
        except OSError:
            self.handle = None

    def __call__(self, event: str, details: dict) -> None:
        line = {"time_ns": time.time_ns(), "actor": self.actor_name, "pid": os.getpid(), "event": event, **details}
        try:
            if self.handle is None:
                self._open()
                if self.handle is None:
                    raise OSError("the trace file cannot be opened")
            self.handle.write(json.dumps(line, default=str) + "\n")
            self._rotate_if_needed()
        except (OSError, ValueError):
            self.dropped += 1
            self._close_quietly()

    def _rotate_if_needed(self) -> None:
        if self.handle.tell() < self.bytes_max:
            return
        try:
            if os.path.exists(self.path) and os.path.getsize(self.path) >= self.bytes_max:
                for index in range(self.kept, 0, -1):
                    older = f"{self.path}.{index - 1}" if index > 1 else self.path
                    if os.path.exists(older):
                        os.replace(older, f"{self.path}.{index}")
        finally:
            self._close_quietly()

    def _close_quietly(self) -> None:
        if self.handle is not None:
            try:
                self.handle.close()
            except OSError:
                pass
            self.handle = None


def _name_process(name: str) -> None:
    """Show the actor's name in ps/top (Linux keeps 15 bytes); best effort elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def main(spec_bytes: bytes, lifeline: Connection) -> None:
    from transport.runtime import ACTOR_POLL_TIMEOUT_MAX_MS, ActorCrashed, Runtime

    spec = msgspec.msgpack.decode(spec_bytes, type=ActorSpec)
    _name_process(spec.name.replace("replica/", "r/"))
    logging.basicConfig(level=spec.log_level, format=f"%(asctime)s {spec.name} %(levelname)s %(message)s")
    logging.raiseExceptions = False  # a log line that cannot be written (a full disk) is dropped, silently
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    incarnation = random.SystemRandom().getrandbits(62) + 1
    context = zmq.Context()
    links = None
    if spec.shared_memory and spec.kind == "replica":
        from transport.ring_link import RingLinks

        links = RingLinks(actor_id=spec.name, cluster_id=spec.cluster_id, zero_copy=True, counters={},
                          capacity_bytes=spec.limits.replica_ring_bytes)
    trace = TraceFile(spec.trace_path, spec.name, bytes_max=spec.limits.trace_file_bytes_max,
                      kept=spec.limits.trace_files_kept) if spec.trace_path else None
    runtime = Runtime(None, identity=spec.name, limits=spec.limits, context=context, on_trace=trace,
                      ring_links=links, secret=spec.secret or None, faults_enabled=spec.faults_enabled,
                      poll_timeout_max_ms=ACTOR_POLL_TIMEOUT_MAX_MS)
    if trace is not None:
        runtime.trace_file = trace
    if links is not None:
        links.counters = runtime.counters
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)

    def on_sigterm(signum: int, frame: Any) -> None:
        runtime.request_stop()
        try:
            os.write(wake_write, b"x")
        except OSError:
            pass

    signal.signal(signal.SIGTERM, on_sigterm)
    exit_code = 0
    try:
        endpoint = runtime.bind(spec.port, spec.bind_host, spec.advertise_host)
        runtime.actor, runtime.storage_faults = build_actor(spec, endpoint, incarnation)
        if spec.voters and spec.kind in ("controller", "group-coordinator") and spec.limits.voter_address_check:
            from transport.voter_address import raft_address_check

            runtime.peer_check = raft_address_check(spec.voters)
        lifeline.send(("ready", endpoint, os.getpid(), incarnation))
        runtime.watch_fd(wake_read, lambda: os.read(wake_read, 4096))
        runtime.watch_fd(lifeline.fileno(), lambda: _on_lifeline(lifeline, runtime))
        _run_profiled(runtime, spec.name) if os.environ.get(PROFILE_ENV) else runtime.run()
        if getattr(runtime, "parent_gone", False):
            exit_code = EXIT_PARENT_GONE
    except ActorCrashed:
        exit_code = EXIT_CRASHED
    except RefusedToStart as refusal:
        logging.getLogger("railmq.actor").error("%s refuses to start: %s", spec.name, refusal)
        try:
            lifeline.send(("refused", str(refusal)))
        except OSError:
            pass
        exit_code = EXIT_REFUSED
    except StorageFull as full:
        # Not a programmer error: the actor stops rather than go on without its own copy, and its
        # supervisor starts it again later and later until the disk has room (transport/supervisor.py).
        logging.getLogger("railmq.actor").error("%s stops: %s", spec.name, full)
        exit_code = EXIT_DISK_FULL
    except Exception:
        logging.getLogger("railmq.actor").exception("%s failed", spec.name)
        exit_code = 1
    finally:
        runtime.close()
        context.destroy(linger=0)
    sys.stdout.flush()
    os._exit(exit_code)


def _run_profiled(runtime: Any, name: str) -> None:
    """Run under cProfile and leave `<name>.<pid>.prof` in $RAILMQ_PROFILE_DIR (`python -m pstats`).

    With RAILMQ_PROFILE_CLOCK=cpu the profile counts the process's CPU time (time.process_time)
    instead of wall time: on a busy box, wall time charges a call for every moment the process
    waited for a core."""
    import cProfile

    timer = time.process_time if os.environ.get(PROFILE_CLOCK_ENV) == "cpu" else time.perf_counter
    profiler = cProfile.Profile(timer)
    try:
        profiler.runcall(runtime.run)
    finally:
        path = os.path.join(os.environ[PROFILE_ENV], f"{name.replace('/', '_')}.{os.getpid()}.prof")
        profiler.dump_stats(path)


def _on_lifeline(lifeline: Connection, runtime: Any) -> None:
    try:
        command = lifeline.recv()
    except (EOFError, OSError):
        runtime.parent_gone = True
        runtime.request_stop()
        return
    if command == "stop":
        runtime.request_stop()
