"""The entry point of every actor process: build the actor from its spec, bind, report, run.

A process is told what to be by an `ActorSpec` (MessagePack bytes, so the spawn/forkserver hand-off
pickles nothing clever; transport/actor_spec.py). It binds its ROUTER, builds its actor with real
storage (transport/actor_build.py), tells the supervisor "ready" with its endpoint over the
lifeline pipe, then runs the runtime loop.

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

import errno
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

from storage.errors import StorageFull
from transport.actor_build import METADATA_BOOTSTRAP_LOCK, build_kind, log_config_for
from transport.actor_spec import (
    ActorSpec,
    RefusedToStart,
    actor_directory,
    controller_directory,
    replica_directory,
)
from transport.connections import raise_open_files_limit
from transport.trace_file import TraceFile

__all__ = [  # names other modules import from here, some of them defined in actor_spec.py and actor_build.py
    "EXIT_CRASHED", "EXIT_DISK_FULL", "EXIT_PARENT_GONE", "EXIT_REFUSED", "METADATA_BOOTSTRAP_LOCK", "PROFILE_ENV",
    "ActorSpec", "RefusedToStart", "TraceFile", "build_actor", "controller_directory",
    "log_config_for", "main", "replica_directory",
]

EXIT_CRASHED = 70  # the actor asked to crash (failed fsync, deleted topic, ...)
EXIT_PARENT_GONE = 71
EXIT_REFUSED = 72  # the actor refused to start: its directory is someone else's, or its state is lost
EXIT_DISK_FULL = 73  # a write it could not do without (a controller's raft log) found the disk full
# A port another process holds now (an ephemeral port is any free one: a connection may have it as
# its own end while a restarted cluster binds its remembered ports) is tried again this long before
# the actor refuses to start; an address this machine lacks is refused at once.
PORT_IN_USE_WAIT_S = 10.0
PROFILE_ENV = "RAILMQ_PROFILE_DIR"  # set to a directory to profile every actor process
PROFILE_CLOCK_ENV = "RAILMQ_PROFILE_CLOCK"  # "cpu" to profile CPU time instead of wall time


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
        return build_kind(spec, fs, directory, endpoint, incarnation)
    except (CorruptState, CorruptRaftLog, CorruptRaftSnapshot, BadCommand) as error:
        # Damage found on open is not a crash to retry at once: the file is left as it is, and the
        # actor stays down (retried ever more slowly) until an operator restores or removes it.
        raise RefusedToStart(f"{spec.name}: its durable state is damaged ({error}); the file is left as it is "
                             "(docs/operations.md, \"Storage faults\")") from None


_LOCKS: list[Any] = []


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
                          capacity_bytes=spec.limits.replica_ring_bytes, secret=spec.secret)
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
        raise_open_files_limit()  # before the bind: the client connections' bound is half of it
        endpoint = _listen(runtime, spec)
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


def _listen(runtime: Any, spec: ActorSpec) -> str:
    """Bind the actor's port: waiting up to PORT_IN_USE_WAIT_S while another process holds it,
    refusing to start, naming the address, when it stays held or the machine lacks the address."""
    deadline = time.monotonic() + PORT_IN_USE_WAIT_S
    while True:
        try:
            return runtime.bind(spec.port, spec.bind_host, spec.advertise_host)
        except zmq.ZMQError as error:
            if error.errno != errno.EADDRINUSE or not spec.port or time.monotonic() >= deadline:
                where = f"tcp://{spec.bind_host}:{spec.port or '*'}"
                raise RefusedToStart(f"cannot listen on {where}: {error}") from None
            time.sleep(0.1)


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
