"""The entry point of every actor process: build the actor from its spec, bind, report, run.

A process is told what to be by an `ActorSpec` (MessagePack bytes, so the spawn/forkserver hand-off
pickles nothing clever). It binds its ROUTER, builds its actor with real storage, tells the
supervisor "ready" with its endpoint over the lifeline pipe, then runs the runtime loop.

The lifeline is the supervisor's end of a pipe: when the supervisor dies (even by SIGKILL) the
pipe reads EOF and this process stops — no orphans. Ctrl-C (SIGINT) reaches every process in the
terminal's process group, so actors ignore it and let the supervisor stop them in order with
SIGTERM (graceful: the actor's `Stop` flushes its storage) or a "stop" line on the lifeline.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import msgspec
import zmq

from actors.limits import Limits
from actors.messages import TopicConfig

EXIT_CRASHED = 70  # the actor asked to crash (failed fsync, deleted topic, ...)
EXIT_PARENT_GONE = 71
PROFILE_ENV = "RAILMQ_PROFILE_DIR"  # set to a directory to profile every actor process


class ActorSpec(msgspec.Struct, kw_only=True):
    kind: str  # "coordinator" | "group-coordinator" | "replica"
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
    """(actor, storage fault hook) for a spec."""
    from storage.fs import OsFileSystem

    fs = OsFileSystem()
    if spec.kind == "coordinator":
        from actors.coordinator import Coordinator
        from storage.state import DurableState

        directory = os.path.join(spec.data_dir, "coordinator")
        os.makedirs(directory, exist_ok=True)
        state = DurableState.open(os.path.join(directory, "metadata.state"), fs=fs)
        coordinator = Coordinator(state=state, nodes=spec.nodes, rng=random.Random(incarnation), limits=spec.limits,
                                  cluster_id=spec.cluster_id)
        return coordinator, StorageFaults(fs)
    if spec.kind == "group-coordinator":
        from actors.group_coordinator import GroupCoordinator
        from storage.state import DurableState

        directory = os.path.join(spec.data_dir, "group-coordinator")
        os.makedirs(directory, exist_ok=True)
        state = DurableState.open(os.path.join(directory, "groups.state"), fs=fs)
        actor = GroupCoordinator(state=state, coordinator=spec.coordinator, endpoint=endpoint,
                                 incarnation=incarnation, pid=os.getpid(), limits=spec.limits,
                                 rng=random.Random(incarnation))
        return actor, StorageFaults(fs)
    if spec.kind == "replica":
        from actors.partition_replica import PartitionReplica
        from storage.log import PartitionLog

        directory = replica_directory(spec.data_dir, spec.node, spec.topic, spec.partition, spec.topic_id)
        os.makedirs(directory, exist_ok=True)
        log = PartitionLog.open(directory, log_config_for(spec.config), fs=fs, now_ms=time.time_ns() // 1_000_000)
        actor = PartitionReplica(
            topic=spec.topic, topic_id=spec.topic_id, partition=spec.partition, node=spec.node, endpoint=endpoint,
            coordinator=spec.coordinator, log=log, config=spec.config, incarnation=incarnation, pid=os.getpid(),
            limits=spec.limits)
        return actor, StorageFaults(fs)
    raise ValueError(f"unknown actor kind {spec.kind!r}")


class TraceFile:
    """Appends an actor's Trace effects as JSON lines (the chaos harness and labs read them)."""

    def __init__(self, path: str, actor_name: str) -> None:
        self.handle = open(path, "a", encoding="utf-8", buffering=1)
        self.actor_name = actor_name

    def __call__(self, event: str, details: dict) -> None:
        line = {"time_ns": time.time_ns(), "actor": self.actor_name, "pid": os.getpid(), "event": event, **details}
        self.handle.write(json.dumps(line, default=str) + "\n")


def _name_process(name: str) -> None:
    """Show the actor's name in ps/top (Linux keeps 15 bytes); best effort elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def main(spec_bytes: bytes, lifeline: Connection) -> None:
    from transport.runtime import ActorCrashed, Runtime

    spec = msgspec.msgpack.decode(spec_bytes, type=ActorSpec)
    _name_process(spec.name.replace("replica/", "r/"))
    logging.basicConfig(level=spec.log_level, format=f"%(asctime)s {spec.name} %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    incarnation = random.SystemRandom().getrandbits(62) + 1
    context = zmq.Context()
    links = None
    if spec.shared_memory and spec.kind == "replica":
        from transport.ring_link import RingLinks

        links = RingLinks(actor_id=spec.name, cluster_id=spec.cluster_id, zero_copy=True, counters={},
                          capacity_bytes=2 * spec.limits.replica_fetch_bytes_max + 4096)
    runtime = Runtime(None, identity=spec.name, limits=spec.limits, context=context,
                      on_trace=TraceFile(spec.trace_path, spec.name) if spec.trace_path else None,
                      ring_links=links)
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
        endpoint = runtime.bind(spec.port)
        runtime.actor, runtime.storage_faults = build_actor(spec, endpoint, incarnation)
        lifeline.send(("ready", endpoint, os.getpid(), incarnation))
        runtime.watch_fd(wake_read, lambda: os.read(wake_read, 4096))
        runtime.watch_fd(lifeline.fileno(), lambda: _on_lifeline(lifeline, runtime))
        _run_profiled(runtime, spec.name) if os.environ.get(PROFILE_ENV) else runtime.run()
        if getattr(runtime, "parent_gone", False):
            exit_code = EXIT_PARENT_GONE
    except ActorCrashed:
        exit_code = EXIT_CRASHED
    except Exception:
        logging.getLogger("railmq.actor").exception("%s failed", spec.name)
        exit_code = 1
    finally:
        runtime.close()
        context.destroy(linger=0)
    sys.stdout.flush()
    os._exit(exit_code)


def _run_profiled(runtime: Any, name: str) -> None:
    """Run under cProfile and leave `<name>.<pid>.prof` in $RAILMQ_PROFILE_DIR (`python -m pstats`)."""
    import cProfile

    profiler = cProfile.Profile()
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
