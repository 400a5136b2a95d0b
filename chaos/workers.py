"""The workload's processes seen from the runner: start, kill, pause, restart, stop, merge.

`WorkerPool` owns the producer and group-member processes of one run (chaos/workload.py has
what runs inside them). They come from the same forkserver context as the cluster's actors
(transport.supervisor.process_context: fast, never forks a process holding sockets). A worker
that dies while it is wanted — killed by the nemesis, or crashed — is started again after
`restart_delay_ms` as a new *incarnation*: a new process name in the history (`producer-1#2`)
and a new history file, so every process in the history does one thing at a time.

`merge_histories` turns the runner's own lines and every incarnation's file into one history
ordered by time. Operations a killed incarnation left open (an invoke without a completion) are
completed there with `info` at the moment the incarnation was seen dead: indeterminate, never
lost or failed.

Invariants: every process the pool started is reaped by `stop()`, even when stopping fails; a
worker is never restarted after `stop_*` asked it to stop.
"""

from __future__ import annotations

import heapq
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import msgspec

from chaos.history import HistoryWriter
from chaos.workload import (
    PHASE_UNCOMMITTED, DELIVERY_TIMEOUT_MS, SEND_OUTCOME_GRACE_MS, MemberSpec, ProducerSpec, member_main,
    producer_main,
)
from transport.supervisor import process_context

# How often the monitor looks for dead workers and due restarts.
MONITOR_INTERVAL_S = 0.05
# A worker asked to stop gets this long beyond its own drain time before it is killed.
STOP_GRACE_S = 3.0


@dataclass
class Incarnation:
    process: str  # name in the history
    history_path: str
    pid: int
    started_ns: int
    ended_ns: int | None = None  # monotonic, relative to the run's origin
    killed: bool = False  # it did not end by being asked to stop


@dataclass
class Worker:
    base: str  # "producer-1", "g1/member-2"
    role: str  # "producer" | "member"
    spec: ProducerSpec | MemberSpec
    wanted: bool = True
    process: Any = None
    stop_event: Any = None
    shared: Any = None  # acked counter (producer) or phase (member)
    restart_at: float | None = None
    incarnations: list[Incarnation] = field(default_factory=list)
    acked_before: int = 0  # acknowledged by earlier incarnations

    @property
    def name(self) -> str:
        return self.incarnations[-1].process if self.incarnations else self.base

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()


def incarnation_name(base: str, number: int) -> str:
    return base if number == 1 else f"{base}#{number}"


def _file_name(process: str) -> str:
    return process.replace("/", "_").replace("#", "-") + ".jsonl"


class WorkerPool:
    def __init__(self, specs: list[ProducerSpec | MemberSpec], directory: str, origin_ns: int, *,
                 restart_delay_ms: int = 300) -> None:
        self.directory = directory
        self.origin_ns = origin_ns
        self.restart_delay_s = restart_delay_ms / 1000
        self.context = process_context()
        self.lock = threading.RLock()
        self.workers = [Worker(spec.process, "producer" if isinstance(spec, ProducerSpec) else "member", spec)
                        for spec in specs]
        self._stop_monitor = threading.Event()
        self._monitor = threading.Thread(target=self._watch, name="chaos-workers", daemon=True)

    # ------------------------------------------------------------------ starting

    def start(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        with self.lock:
            for worker in self.workers:
                self._launch(worker)
        self._monitor.start()

    def _launch(self, worker: Worker) -> None:
        number = len(worker.incarnations) + 1
        process_name = incarnation_name(worker.base, number)
        path = os.path.join(self.directory, _file_name(process_name))
        spec = msgspec.structs.replace(worker.spec, process=process_name, history_path=path,
                                       client_id=f"{worker.spec.client_id}-{number}")
        if isinstance(spec, ProducerSpec):
            spec = msgspec.structs.replace(spec, seed=spec.seed * 1000 + number)
        worker.stop_event = self.context.Event()
        worker.shared = self.context.Value("q" if worker.role == "producer" else "i", 0, lock=False)
        target = producer_main if worker.role == "producer" else member_main
        worker.process = self.context.Process(
            target=target, args=(msgspec.msgpack.encode(spec), worker.stop_event, worker.shared),
            name=f"chaos:{process_name}", daemon=False)
        worker.process.start()
        worker.restart_at = None
        worker.incarnations.append(Incarnation(process_name, path, worker.process.pid or 0, self._now_ns()))

    def _now_ns(self) -> int:
        return time.monotonic_ns() - self.origin_ns

    # ------------------------------------------------------------------ watching

    def _watch(self) -> None:
        while not self._stop_monitor.wait(MONITOR_INTERVAL_S):
            with self.lock:
                for worker in self.workers:
                    self._check(worker)

    def _check(self, worker: Worker) -> None:
        if worker.process is not None and not worker.process.is_alive():
            self._reap(worker, killed=worker.wanted)
            if worker.wanted:
                worker.restart_at = time.monotonic() + self.restart_delay_s
        if worker.wanted and worker.process is None and worker.restart_at is not None \
                and time.monotonic() >= worker.restart_at:
            self._launch(worker)

    def _reap(self, worker: Worker, *, killed: bool) -> None:
        worker.process.join(timeout=0)
        if worker.role == "producer":
            worker.acked_before += worker.shared.value
        incarnation = worker.incarnations[-1]
        incarnation.ended_ns = self._now_ns()
        incarnation.killed = killed or incarnation.killed
        worker.process = None

    # ------------------------------------------------------------------ faults

    def find(self, name: str) -> Worker:
        with self.lock:
            for worker in self.workers:
                if name in (worker.base, worker.name):
                    return worker
        raise LookupError(f"no worker named {name!r}")

    def alive_names(self, role: str) -> list[str]:
        with self.lock:
            return sorted(worker.name for worker in self.workers if worker.role == role and worker.alive)

    def signal(self, name: str, signum: int) -> int:
        with self.lock:
            worker = self.find(name)
            if not worker.alive:
                raise ProcessLookupError(f"{name} is not running")
            if signum == signal.SIGKILL:
                worker.incarnations[-1].killed = True
            os.kill(worker.process.pid, signum)
            return worker.process.pid

    def kill(self, name: str) -> int:
        return self.signal(name, signal.SIGKILL)

    def pause(self, name: str) -> int:
        return self.signal(name, signal.SIGSTOP)

    def resume(self, name: str) -> int:
        return self.signal(name, signal.SIGCONT)

    def crash_before_commit(self, name: str, timeout_s: float = 3.0) -> tuple[int, bool]:
        """Kill a member while it holds polled records it has not committed. Returns the pid and
        whether the kill landed in that window (False: it never polled records in time, so it was
        killed anyway)."""
        deadline = time.monotonic() + timeout_s
        worker = self.find(name)
        while time.monotonic() < deadline:
            with self.lock:
                if not worker.alive:
                    raise ProcessLookupError(f"{name} is not running")
                if worker.shared.value == PHASE_UNCOMMITTED:
                    pid = self.kill(worker.name)
                    worker.process.join(timeout=2.0)
                    return pid, worker.shared.value == PHASE_UNCOMMITTED
            time.sleep(0.001)
        return self.kill(worker.name), False

    def acknowledged(self) -> int:
        """Sends acknowledged so far by every incarnation (a live figure for progress bars)."""
        with self.lock:
            live = [worker.shared.value if worker.alive and worker.role == "producer" else 0
                    for worker in self.workers]
            return sum(worker.acked_before for worker in self.workers) + sum(live)

    # ------------------------------------------------------------------ stopping

    def stop_role(self, role: str, timeout_s: float) -> None:
        """Ask every worker of a role to finish (producers drain their outstanding sends), then
        kill whatever has not exited within `timeout_s`."""
        with self.lock:
            chosen = [worker for worker in self.workers if worker.role == role]
            for worker in chosen:
                worker.wanted = False
                if worker.alive:
                    os.kill(worker.process.pid, signal.SIGCONT)  # a paused worker cannot stop itself
                    worker.stop_event.set()
        deadline = time.monotonic() + timeout_s
        for worker in chosen:
            process = worker.process
            if process is not None:
                process.join(timeout=max(0.0, deadline - time.monotonic()))
        with self.lock:
            for worker in chosen:
                if worker.process is None:
                    continue
                if worker.process.is_alive():
                    worker.process.kill()
                    worker.process.join(timeout=5)
                    worker.incarnations[-1].killed = True
                self._reap(worker, killed=worker.incarnations[-1].killed)

    def stop(self) -> None:
        try:
            drain_s = (DELIVERY_TIMEOUT_MS + SEND_OUTCOME_GRACE_MS) / 1000
            self.stop_role("producer", drain_s + STOP_GRACE_S)
            self.stop_role("member", STOP_GRACE_S)
        finally:
            self._stop_monitor.set()
            if self._monitor.is_alive():
                self._monitor.join(timeout=5)
            with self.lock:
                for worker in self.workers:
                    if worker.process is not None:
                        worker.process.kill()
                        worker.process.join(timeout=5)
                        self._reap(worker, killed=True)

    def incarnations(self) -> list[Incarnation]:
        with self.lock:
            return [incarnation for worker in self.workers for incarnation in worker.incarnations]


# --------------------------------------------------------------------------- merging

_decoder = msgspec.json.Decoder()


class TornHistory(ValueError):
    """A worker's history file has a malformed line that is not a killed process's torn tail."""


def read_worker_lines(path: str, *, killed: bool) -> list[dict[str, Any]]:
    """The lines of one incarnation's file; a killed process may have left a torn last line."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as handle:
        raw_lines = handle.read().split(b"\n")
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        try:
            lines.append(_decoder.decode(raw))
        except msgspec.DecodeError:
            if killed and number >= len(raw_lines) - 1:
                break  # the last line was being written when the process died
            raise TornHistory(f"{path}: line {number} is not JSON") from None
    return lines


def close_open_operations(lines: list[dict[str, Any]], ended_ns: int) -> list[dict[str, Any]]:
    """`info` completions for the invokes in `lines` that never completed (a dead process)."""
    open_sends: dict[Any, dict[str, Any]] = {}
    open_commit: dict[str, Any] | None = None
    for line in lines:
        operation, kind = line.get("f"), line.get("type")
        if operation == "send":
            if kind == "invoke":
                open_sends[line["value"]] = line
            else:
                open_sends.pop(line.get("value"), None)
        elif operation == "commit":
            open_commit = line if kind == "invoke" else None
    stamp = max([ended_ns] + [line["time_ns"] for line in lines])
    closing = [{**invoke, "type": "info", "time_ns": stamp, "error": "process killed"}
               for invoke in open_sends.values()]
    if open_commit is not None:
        closing.append({**open_commit, "type": "info", "time_ns": stamp, "error": "process killed"})
    return closing


def _sources(runner_lines: list[dict[str, Any]],
             incarnations: list[Incarnation]) -> Iterator[list[dict[str, Any]]]:
    yield runner_lines
    for incarnation in incarnations:
        lines = read_worker_lines(incarnation.history_path, killed=incarnation.killed)
        ended_ns = incarnation.ended_ns
        if ended_ns is None:
            ended_ns = lines[-1]["time_ns"] if lines else 0
        yield lines + close_open_operations(lines, ended_ns)


def merge_histories(runner_lines: list[dict[str, Any]], incarnations: list[Incarnation], path: str) -> int:
    """Write one history ordered by time (ties keep the runner first, then each file's order).
    Returns the number of lines written."""
    keyed = (
        [(line["time_ns"], source, index, line) for index, line in enumerate(lines)]
        for source, lines in enumerate(_sources(runner_lines, incarnations))
    )
    count = 0
    with HistoryWriter(path) as writer:
        for _, _, _, line in heapq.merge(*keyed, key=lambda item: item[:3]):
            writer.write(line)
            count += 1
    return count
