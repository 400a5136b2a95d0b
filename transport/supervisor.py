"""The process supervisor: spawns actor processes, watches them, restarts them, stops them all.

Processes come from the `forkserver` context: a clean server process (no ZeroMQ context, modules
preloaded) forks each actor, which is fast and never forks a process holding sockets. Each actor
gets a lifeline pipe (see transport/actor_main.py): readiness comes back on it, and its EOF tells
an actor its supervisor died.

Restart policy: an actor that exits while it is wanted is restarted after `restart_delay_ms`
(crashed actors recover from their durable state). `stop_all` stops actors gracefully in reverse
start order (SIGTERM, then SIGKILL after a grace period) and reaps every child, so a stopped
cluster leaves no process behind. Shared-memory segments recorded with `record_segment` are
unlinked when their actor dies and when everything stops.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import select
import signal
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Callable

import msgspec

from transport.actor_main import EXIT_DISK_FULL, ActorSpec

log = logging.getLogger("railmq.supervisor")

_context_lock = threading.Lock()
_context: multiprocessing.context.BaseContext | None = None


def process_context() -> multiprocessing.context.BaseContext:
    """The forkserver context, with the actor modules preloaded once."""
    global _context
    with _context_lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([
                "transport.actor_main", "transport.runtime", "actors.coordinator",
                "actors.partition_replica", "actors.group_coordinator", "storage.log", "storage.state",
                # What an actor would otherwise import after the fork, each copy its own memory:
                "storage.directory", "storage.replica_meta", "transport.metadata_rebuild", "transport.ring_link",
                "transport.doorbell", "transport.shm", "ctypes", "psutil",
                "transport.forkserver_ready",  # last: freezes what the others loaded
            ])
            _context = context
        return _context


class ManagedActor:
    def __init__(self, spec: ActorSpec) -> None:
        self.spec = spec
        self.process: multiprocessing.process.BaseProcess | None = None
        self.lifeline: Connection | None = None
        self.endpoint = ""
        self.pid = 0
        self.incarnation = 0
        self.ready = False
        self.wanted = True
        self.restarts = 0
        self.started_ns = 0
        self.restart_at_ns: int | None = None
        self.exit_code: int | None = None  # of the process that exited, until the next one starts
        self.last_exit_code: int | None = None  # of the last process that exited (kept across restarts)
        self.refusal = ""  # why the last process refused to start, if it did
        self.refusals = 0  # refusals (or stops on a full disk) in a row
        self.quick_failures = 0  # failures soon after starting, in a row (a crash loop)
        self.segments: set[str] = set()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()


class ActorStartFailed(RuntimeError):
    pass


REFUSED_RESTART_DELAY_MAX_MS = 10_000
# An actor that fails (an exception, exit code 1) this soon after it started, three times or more
# in a row, is in a crash loop: each next start waits twice as long, up to the bound above.
CRASH_LOOP_WINDOW_MS = 10_000
CRASH_LOOP_FREE_RESTARTS = 2


class Supervisor:
    def __init__(self, *, restart_delay_ms: int = 500, ready_timeout_s: float = 30.0,
                 on_exit: Callable[[ManagedActor], None] | None = None) -> None:
        self.restart_delay_ms = restart_delay_ms
        self.ready_timeout_s = ready_timeout_s
        self.on_exit = on_exit
        self.actors: dict[str, ManagedActor] = {}
        self.lock = threading.RLock()
        self._order: list[str] = []
        # Rung whenever a process is started, so a thread waiting on `watch()`'s descriptors
        # (the node agent) wakes to watch the new one too. Made by the first `watch()`.
        self._doorbell: tuple[int, int] | None = None

    # ------------------------------------------------------------------ starting

    def launch(self, spec: ActorSpec) -> ManagedActor:
        """Start a process for `spec` without waiting for it to be ready."""
        with self.lock:
            managed = self.actors.get(spec.name) or ManagedActor(spec)
            managed.spec = spec
            managed.wanted = True
            self.actors[spec.name] = managed
            if spec.name not in self._order:
                self._order.append(spec.name)
            self._spawn(managed)
            return managed

    def _spawn(self, managed: ManagedActor) -> None:
        context = process_context()
        parent_end, child_end = context.Pipe(duplex=True)
        spec_bytes = msgspec.msgpack.encode(managed.spec)
        from transport import actor_main

        process = context.Process(target=actor_main.main, args=(spec_bytes, child_end),
                                  name=f"railmq:{managed.name}", daemon=False)
        process.start()
        child_end.close()
        managed.process, managed.lifeline = process, parent_end
        managed.pid = process.pid or 0
        managed.ready = False
        managed.endpoint = ""
        managed.incarnation = 0  # the new process's, once it says it is ready
        managed.exit_code = None
        managed.refusal = ""
        managed.restart_at_ns = None
        managed.started_ns = time.monotonic_ns()
        if self._doorbell is not None:
            try:
                os.write(self._doorbell[1], b"x")
            except OSError:
                pass  # full: a wake-up is already waiting

    def watch(self) -> tuple[list[int], int | None]:
        """What `poll` has to act on, for a caller that sleeps until then: the descriptors that
        become readable when there is something (a process's exit sentinel, the lifeline of one
        not ready yet, the doorbell of a new process), and the monotonic time of the next
        restart due (None: none is scheduled). Sleeping on these instead of polling on a period
        is what lets an idle node cost nothing."""
        with self.lock:
            if self._doorbell is None:
                self._doorbell = os.pipe()
                for fd in self._doorbell:
                    os.set_blocking(fd, False)
        try:
            while os.read(self._doorbell[0], 4096):
                pass
        except OSError:
            pass
        fds, due = [self._doorbell[0]], None
        with self.lock:
            for managed in self.actors.values():
                if managed.process is not None:
                    fds.append(managed.process.sentinel)
                    if not managed.ready and managed.lifeline is not None:
                        fds.append(managed.lifeline.fileno())
                elif managed.wanted and managed.restart_at_ns is not None:
                    due = managed.restart_at_ns if due is None else min(due, managed.restart_at_ns)
        return fds, due

    def close_watch(self) -> None:
        """The watcher is done: its doorbell's descriptors are closed."""
        with self.lock:
            doorbell, self._doorbell = self._doorbell, None
        for fd in doorbell or ():
            os.close(fd)

    def start(self, spec: ActorSpec) -> ManagedActor:
        managed = self.launch(spec)
        self.wait_ready([managed])
        return managed

    def wait_ready(self, actors: list[ManagedActor], timeout_s: float | None = None) -> None:
        deadline = time.monotonic() + (timeout_s or self.ready_timeout_s)
        pending = [managed for managed in actors if not managed.ready]
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ActorStartFailed(f"not ready in time: {', '.join(m.name for m in pending)}")
            for managed in pending:
                self.check_ready(managed, 0)
                if managed.process is not None and not managed.process.is_alive() and not managed.ready:
                    self.check_ready(managed, 0)
                    if managed.refusal:
                        raise ActorStartFailed(f"{managed.name} refused to start: {managed.refusal}")
                    raise ActorStartFailed(f"{managed.name} exited with code {managed.process.exitcode} while starting")
            pending = [managed for managed in pending if not managed.ready]
            if pending:
                wait([managed.lifeline for managed in pending if managed.lifeline is not None]
                     + [managed.process.sentinel for managed in pending if managed.process is not None],
                     timeout=min(remaining, 0.2))

    def check_ready(self, managed: ManagedActor, timeout_s: float = 0) -> bool:
        if managed.ready or managed.lifeline is None:
            return managed.ready
        try:
            if not managed.lifeline.poll(timeout_s):
                return False
            message = managed.lifeline.recv()
        except (EOFError, OSError):
            return False
        if isinstance(message, tuple) and message and message[0] == "ready":
            _, managed.endpoint, managed.pid, managed.incarnation = message
            managed.ready = True
            managed.refusal = ""
        elif isinstance(message, tuple) and len(message) == 2 and message[0] == "refused":
            managed.refusal = str(message[1])
        return managed.ready

    # ------------------------------------------------------------------ watching

    def poll(self) -> list[ManagedActor]:
        """Reap exited actors (scheduling restarts), start due restarts, notice readiness.
        Returns the actors that exited since the last call."""
        exited: list[ManagedActor] = []
        now = time.monotonic_ns()  # restart delays are durations: a wall clock set back must not stretch them
        with self.lock:
            running = [managed for managed in self.actors.values() if managed.process is not None]
            # One select over every process's sentinel (readable once it has exited) and the
            # lifelines of those not ready yet, instead of a waitpid and a select per process:
            # a box of a few hundred idle actors costs the supervisor almost nothing.
            watched = select.poll()
            for managed in running:
                watched.register(managed.process.sentinel, select.POLLIN)
                if not managed.ready and managed.lifeline is not None:
                    watched.register(managed.lifeline.fileno(), select.POLLIN)
            ready = {fd for fd, _ in watched.poll(0)} if running else set()
            for managed in list(self.actors.values()):
                process = managed.process
                if process is None:
                    if managed.wanted and managed.restart_at_ns is not None and now >= managed.restart_at_ns:
                        managed.restarts += 1
                        log.warning("restarting %s (restart %d)", managed.name, managed.restarts)
                        self._spawn(managed)
                    continue
                if process.sentinel not in ready:
                    if managed.lifeline is not None and not managed.ready and managed.lifeline.fileno() in ready:
                        self.check_ready(managed)
                    continue
                self.check_ready(managed)  # a refusal sent just before the exit
                self._reap(managed)
                exited.append(managed)
                if managed.wanted:
                    managed.restart_at_ns = now + self._restart_delay_ns(managed)
                else:
                    self._forget(managed)
        for managed in exited:
            if self.on_exit is not None:
                self.on_exit(managed)
        return exited

    def _restart_delay_ns(self, managed: ManagedActor) -> int:
        """An actor that refused to start (its directory is in use, or not its own), or stopped
        because its disk is full, is retried with a doubling delay up to
        REFUSED_RESTART_DELAY_MAX_MS: the cause may pass (a previous process still exiting, space
        freed), but a loop must not spin. So is one that keeps failing with an exception within
        CRASH_LOOP_WINDOW_MS of its start, from the third time in a row: an error at every start
        (a directory it cannot use) restarted it every half second for ever. Any other exit (a
        crash, kill -9) is restarted after `restart_delay_ms`, and starts the doubling over."""
        delay_ms = self.restart_delay_ms
        lived_ns = time.monotonic_ns() - managed.started_ns
        quick = managed.exit_code == 1 and lived_ns < CRASH_LOOP_WINDOW_MS * 1_000_000
        managed.quick_failures = managed.quick_failures + 1 if quick else 0
        if managed.refusal or managed.exit_code == EXIT_DISK_FULL:
            managed.refusals += 1
            delay_ms = min(REFUSED_RESTART_DELAY_MAX_MS, delay_ms * 2 ** min(managed.refusals, 10))
            why = managed.refusal or "its disk took no write (full, or read-only: its log says which)"
            log.error("%s cannot run (%d times in a row): %s; next try in %d ms", managed.name, managed.refusals,
                      why, delay_ms)
            return delay_ms * 1_000_000
        managed.refusals = 0
        doublings = managed.quick_failures - CRASH_LOOP_FREE_RESTARTS
        if doublings > 0:
            delay_ms = min(REFUSED_RESTART_DELAY_MAX_MS, delay_ms * 2 ** min(doublings, 10))
            log.error("%s failed within %d s of starting %d times in a row (its log says why); next in %d ms",
                      managed.name, CRASH_LOOP_WINDOW_MS // 1000, managed.quick_failures, delay_ms)
        return delay_ms * 1_000_000

    def _reap(self, managed: ManagedActor) -> None:
        process = managed.process
        process.join(timeout=0)
        managed.exit_code = managed.last_exit_code = process.exitcode
        if managed.lifeline is not None:
            managed.lifeline.close()
        managed.process, managed.lifeline, managed.ready = None, None, False
        self._unlink_segments(managed)
        from transport.shm import actor_prefix, unlink_segments

        # Its rings die with it; the prefix is keyed, so no topic name can make it another actor's.
        unlink_segments(actor_prefix(managed.spec.cluster_id, managed.spec.name, managed.spec.secret))
        log.info("%s exited with code %s", managed.name, managed.exit_code)

    def _forget(self, managed: ManagedActor) -> None:
        self.actors.pop(managed.name, None)
        if managed.name in self._order:
            self._order.remove(managed.name)

    # ------------------------------------------------------------------ stopping

    def signal(self, name: str, signum: int) -> int:
        """Send a signal to an actor's process (the chaos harness's kill and pause); returns its pid."""
        with self.lock:
            managed = self.actors[name]
            if managed.process is None or not managed.process.is_alive():
                raise ProcessLookupError(f"{name} is not running")
            os.kill(managed.process.pid, signum)
            return managed.process.pid

    def stop(self, name: str, timeout_s: float = 5.0) -> None:
        """Stop one actor for good (it is not restarted)."""
        with self.lock:
            managed = self.actors.get(name)
            if managed is None:
                return
            managed.wanted = False
            self._terminate([managed], timeout_s)
            self._forget(managed)

    def stop_all(self, timeout_s: float = 5.0) -> None:
        with self.lock:
            ordered = [self.actors[name] for name in reversed(self._order) if name in self.actors]
            for managed in ordered:
                managed.wanted = False
            self._terminate(ordered, timeout_s)
            self.actors.clear()
            self._order.clear()

    def _terminate(self, actors: list[ManagedActor], timeout_s: float) -> None:
        running = [managed for managed in actors if managed.process is not None]
        for managed in running:
            if managed.process.is_alive():
                try:
                    os.kill(managed.process.pid, signal.SIGCONT)  # a paused actor cannot stop itself
                    os.kill(managed.process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout_s
        for managed in running:
            managed.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if managed.process.is_alive():
                log.warning("%s did not stop within %.1fs: killing it", managed.name, timeout_s)
                managed.process.kill()
                managed.process.join(timeout=5)
            self._reap(managed)

    # ------------------------------------------------------------------ shared memory

    def record_segment(self, name: str, segment: str) -> None:
        with self.lock:
            if name in self.actors:
                self.actors[name].segments.add(segment)

    def _unlink_segments(self, managed: ManagedActor) -> None:
        for segment in list(managed.segments):
            try:
                os.unlink(os.path.join("/dev/shm", segment.lstrip("/")))
            except FileNotFoundError:
                pass
            managed.segments.discard(segment)
