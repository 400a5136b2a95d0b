"""One chaos run, start to verdict: cluster, workload, faults, heal, recovery, observation, report.

    outcome = run_scenario(get_scenario("leader-kill"), seed=7, duration_s=20, report_dir="out")

The order of a run (Jepsen's, on real processes):
1. start a `LocalCluster` with short timeouts (`CHAOS_LIMITS`) — or, for a scenario `over_hosts`,
   one `railmq node` per network namespace with the same timeouts (chaos/netns.py, whose faults
   chaos/host_nemesis.py performs) — create the topic, start the workload processes and wait
   until the first write is acknowledged;
2. the fault phase: a thread performs the scenario's seeded schedule while the workload runs;
3. heal everything (`heal` line), let producers finish their outstanding sends, then give the
   cluster up to the recovery window to converge (full ISR, group caught up), stop the members;
4. read every partition from the start (`final-read`), note each replica's high watermark, stop
   the cluster, read every replica's log files (`replica-log`), record `hygiene`;
5. merge every process's history into `history.jsonl`, judge it (chaos.checker), write
   `summary.json`, `faults.jsonl`, `trace.jsonl` and `report.html` (chaos.report).

Invariants: whatever fails, every process the run started is stopped and the cluster's data
directory removed (unless kept); the history's first line is the `config` line; one seed fixes
the schedule and every random choice of the nemesis (one `random.Random`).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from actors.limits import Limits
from chaos import observe
from chaos.checker import CheckResult, check_file
from chaos.host_nemesis import HostNemesis
from chaos.nemesis import FaultLog, Nemesis
from chaos.netns import NamespaceHosts
from chaos.scenarios import FaultStep, Scenario
from chaos.workers import WorkerPool, merge_histories
from chaos.workload import LineRecorder, MemberSpec, ProducerSpec
from railmq.admin import Admin
from railmq.cluster import LocalCluster

# Short enough that a 20 s run sees several failovers, long enough for a loaded 2-core machine
# (the values tests/conftest.py uses for the same reason).
CHAOS_LIMITS = Limits(replica_session_timeout_ms=1500, replica_lag_time_max_ms=2000,
                      coordinator_election_grace_ms=500, group_initial_rebalance_delay_ms=50,
                      scrub_pass_interval_ms=1000, replica_keepalive_interval_ms=500,
                      replica_keepalive_timeout_ms=1500, node_heartbeat_interval_ms=250,
                      node_session_timeout_ms=1500)
ACTOR_RESTART_DELAY_MS = 200
TOPIC = "chaos"
GROUP = "g1"
RECOVERY_WINDOW_S = 5.0
# The workload must acknowledge a first write within this, or the run stops as broken.
WORKLOAD_READY_TIMEOUT_S = 30.0
FINAL_READ_TIMEOUT_S = 20.0
PROGRESS_INTERVAL_S = 0.25


class RunBroken(RuntimeError):
    """The harness could not run the scenario at all (the cluster or workload never came up)."""


@dataclass
class Progress:
    phase: str  # "starting" | "faults" | "recovering" | "observing" | "checking" | "done"
    elapsed_s: float
    duration_s: float
    acknowledged: int
    faults: int


@dataclass
class RunOutcome:
    result: CheckResult
    summary: dict[str, Any]
    report_dir: str
    run_info: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.result.valid


def run_scenario(scenario: Scenario, *, seed: int, duration_s: float, report_dir: str,
                 recovery_window_s: float = RECOVERY_WINDOW_S,
                 on_progress: Callable[[Progress], None] | None = None,
                 keep_data: bool = False) -> RunOutcome:
    run = ChaosRun(scenario, seed, duration_s, report_dir, recovery_window_s, on_progress, keep_data)
    return run.execute()


class ChaosRun:
    def __init__(self, scenario: Scenario, seed: int, duration_s: float, report_dir: str,
                 recovery_window_s: float, on_progress: Callable[[Progress], None] | None,
                 keep_data: bool) -> None:
        if duration_s <= 0 or recovery_window_s < 0:
            raise ValueError("the duration must be positive and the recovery window not negative")
        self.scenario = scenario
        self.seed = seed
        self.duration_s = duration_s
        self.report_dir = report_dir
        self.work_dir = os.path.join(report_dir, "workers")
        self.recovery_window_s = recovery_window_s
        self.on_progress = on_progress
        self.keep_data = keep_data
        self.rng = random.Random(seed)
        self.steps: list[FaultStep] = scenario.schedule(self.rng, duration_s)
        self.origin_ns = 0
        self.wall_origin_ns = 0
        self.info: dict[str, Any] = {}
        self.recorder: LineRecorder | None = None
        self._replica_states: list[observe.ReplicaState] = []
        self.runner_path = os.path.join(self.work_dir, "runner.jsonl")

    # ------------------------------------------------------------------ the run

    def execute(self) -> RunOutcome:
        os.makedirs(self.work_dir, exist_ok=True)
        self._reset_outputs()
        started = time.monotonic()
        self.origin_ns, self.wall_origin_ns = time.monotonic_ns(), time.time_ns()
        self.recorder = LineRecorder(self.runner_path, self.origin_ns)
        detail = LineRecorder(os.path.join(self.report_dir, "faults.jsonl"), self.origin_ns)
        self._record_config()
        data_dir = tempfile.mkdtemp(prefix="railmq-chaos-")
        cluster: Any
        if self.scenario.over_hosts:
            cluster = NamespaceHosts(data_dir, self.scenario.shape.nodes, limits=CHAOS_LIMITS)
        else:
            cluster = LocalCluster(self.scenario.shape.nodes, data_dir=data_dir, limits=CHAOS_LIMITS,
                                   restart_delay_ms=ACTOR_RESTART_DELAY_MS, trace=True, fault_injection=True)
        log = FaultLog(self.recorder, detail, TOPIC)
        workers: WorkerPool | None = None
        try:
            workers = self._run_cluster(cluster, log)
            self._after_stop(cluster, data_dir)
        finally:
            if workers is not None:
                workers.stop()
            cluster.stop()
            if self.scenario.over_hosts:
                cluster.destroy()
            detail.close()
            if not self.keep_data:
                shutil.rmtree(data_dir, ignore_errors=True)
        self.info.update(elapsed_s=round(time.monotonic() - started, 3), faults_performed=log.count,
                         data_dir=data_dir if self.keep_data else None)
        return self._judge(workers)

    def _reset_outputs(self) -> None:
        """A report folder reused for a new run starts empty of the old run's files."""
        for name in ("faults.jsonl", "history.jsonl", "summary.json", "report.html", "trace.jsonl"):
            path = os.path.join(self.report_dir, name)
            if os.path.exists(path):
                os.unlink(path)
        for name in os.listdir(self.work_dir):
            os.unlink(os.path.join(self.work_dir, name))

    def _record_config(self) -> None:
        shape = self.scenario.shape
        self.recorder.record({
            "type": "config", "scenario": self.scenario.name, "seed": self.seed,
            "expect_loss": self.scenario.expect_loss, "duration_s": self.duration_s,
            "recovery_window_s": self.recovery_window_s, "topic": TOPIC, "group": GROUP,
            "shape": msgspec.to_builtins(shape), "limits": msgspec.to_builtins(CHAOS_LIMITS),
            "schedule": msgspec.to_builtins(self.steps), "wall_origin_ns": self.wall_origin_ns,
        })

    def _run_cluster(self, cluster: LocalCluster, log: FaultLog) -> WorkerPool:
        self._progress("starting", 0.0, 0, 0)
        cluster.start()
        self._mark("cluster_started_s")
        self._create_topic(cluster.bootstrap)
        self._mark("topic_ready_s")
        workers = WorkerPool(self._worker_specs(cluster.bootstrap), self.work_dir, self.origin_ns)
        try:
            workers.start()
            self._wait_ready(workers)
            self._mark("workload_ready_s")
            nemesis: Any = (HostNemesis(cluster, log) if self.scenario.over_hosts
                            else Nemesis(cluster, workers, TOPIC, self.rng, log))
            try:
                self._fault_phase(nemesis, workers, log)
                nemesis.heal()
            finally:
                nemesis.close()
            self._progress("recovering", self.duration_s, workers.acknowledged(), log.count)
            self._mark("healed_s")
            workers.stop_role("producer", timeout_s=12.0)
            self._mark("producers_stopped_s")
            self.info["converged"] = observe.wait_converged(
                cluster.bootstrap, TOPIC, GROUP, self.scenario.shape.partitions, self.recovery_window_s)
            self._mark("recovered_s")
            workers.stop_role("member", timeout_s=5.0)
            self._progress("observing", self.duration_s, workers.acknowledged(), log.count)
            self._observe_running(cluster)
        except BaseException:
            workers.stop()
            raise
        return workers

    def _mark(self, name: str) -> None:
        """Note when a stage of the run was reached (seconds since the origin), for the summary."""
        self.info.setdefault("stages", {})[name] = round((time.monotonic_ns() - self.origin_ns) / 1e9, 3)

    def _create_topic(self, bootstrap: str) -> None:
        shape = self.scenario.shape
        config = {"min_insync_replicas": shape.min_insync_replicas, "flush_policy": shape.flush_policy,
                  "unclean_leader_election": shape.unclean_leader_election}
        with Admin(bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=shape.partitions,
                               replication_factor=shape.replication_factor, config=config)
            admin.wait_for_leaders(TOPIC, timeout_s=30, full_isr=True)

    def _worker_specs(self, bootstrap: str) -> list[ProducerSpec | MemberSpec]:
        shape = self.scenario.shape
        keys = [f"k{index}" for index in range(shape.keys)]
        specs: list[ProducerSpec | MemberSpec] = [
            ProducerSpec(process=f"producer-{index}", client_id=f"chaos-producer-{index}",
                         bootstrap=bootstrap, topic=TOPIC, history_path="", origin_ns=self.origin_ns,
                         keys=keys,
                         rate_per_s=shape.producer_rate_per_s, acks=shape.acks, idempotent=shape.idempotent,
                         seed=self.rng.randrange(1 << 30))
            for index in range(1, shape.producers + 1)
        ]
        specs += [
            MemberSpec(process=f"{GROUP}/member-{index}", client_id=f"chaos-member-{index}",
                       bootstrap=bootstrap, topic=TOPIC, group=GROUP, history_path="",
                       origin_ns=self.origin_ns,
                       session_timeout_ms=shape.member_session_timeout_ms,
                       processing_ms=shape.member_processing_ms)
            for index in range(1, shape.members + 1)
        ]
        return specs

    def _wait_ready(self, workers: WorkerPool) -> None:
        deadline = time.monotonic() + WORKLOAD_READY_TIMEOUT_S
        while workers.acknowledged() == 0:
            if time.monotonic() > deadline:
                raise RunBroken(f"no write was acknowledged within {WORKLOAD_READY_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def _fault_phase(self, nemesis: Nemesis, workers: WorkerPool, log: FaultLog) -> None:
        phase_start = time.monotonic()
        self._mark("fault_phase_start_s")
        thread = threading.Thread(target=self._perform_schedule, args=(nemesis, phase_start),
                                  name="chaos-nemesis", daemon=True)
        thread.start()
        try:
            while (elapsed := time.monotonic() - phase_start) < self.duration_s:
                self._progress("faults", elapsed, workers.acknowledged(), log.count)
                time.sleep(min(PROGRESS_INTERVAL_S, max(0.0, self.duration_s - elapsed)))
        finally:
            nemesis.abort.set()
            thread.join()

    def _perform_schedule(self, nemesis: Nemesis, phase_start: float) -> None:
        for index, step in enumerate(self.steps):
            if nemesis.abort.wait(max(0.0, phase_start + step.at_s - time.monotonic())):
                return
            try:
                nemesis.perform(step, index)
            except Exception as error:  # a nemesis bug must not hang the run: note it and go on
                nemesis.log.note(index, step.action, f"failed: {type(error).__name__}: {error}")

    def _observe_running(self, cluster: LocalCluster) -> None:
        partitions = self.scenario.shape.partitions
        entries, incomplete = observe.final_read(cluster.bootstrap, TOPIC, partitions, FINAL_READ_TIMEOUT_S)
        for partition in range(partitions):
            if partition not in incomplete:
                self.recorder.record({"type": "final-read", "topic": TOPIC, "partition": partition,
                                      "entries": entries[partition]})
        self.info["final_read_incomplete"] = incomplete
        with Admin(cluster.bootstrap) as admin:
            self.info["topic_id"], self._replica_states = observe.replica_states(admin, TOPIC)
        self.info["cluster_id"] = cluster.cluster_id
        self._mark("observed_s")

    def _after_stop(self, cluster: LocalCluster, data_dir: str) -> None:
        """Stop the cluster, then read its files and look for anything left behind."""
        cluster.stop()
        trace = os.path.join(self.report_dir, "trace.jsonl")
        if self.scenario.over_hosts:
            cluster.merge_traces(trace)
            for node in cluster.nodes:
                states = [state for state in self._replica_states if state.node == node]
                for line in observe.replica_logs(cluster.data_dir(node), TOPIC, self.info["topic_id"], states):
                    self.recorder.record(line)
            return
        if cluster.trace_path and os.path.exists(cluster.trace_path):
            shutil.copyfile(cluster.trace_path, trace)
        for line in observe.replica_logs(data_dir, TOPIC, self.info["topic_id"], self._replica_states):
            self.recorder.record(line)

    def _judge(self, workers: WorkerPool | None) -> RunOutcome:
        from chaos.report import write_report

        self._progress("checking", self.duration_s, workers.acknowledged() if workers else 0, 0)
        self.recorder.record({"type": "hygiene", "leftover_processes": observe.leftover_processes(),
                              "leftover_shm": observe.leftover_segments(self.info.get("cluster_id", "?"))})
        self.recorder.close()
        runner_lines = [msgspec.json.decode(line) for line in open(self.runner_path, "rb") if line.strip()]
        history_path = os.path.join(self.report_dir, "history.jsonl")
        merge_histories(runner_lines, workers.incarnations() if workers else [], history_path)
        result = check_file(history_path)
        self.info.update(scenario=self.scenario.name, seed=self.seed, duration_s=self.duration_s,
                         recovery_window_s=self.recovery_window_s, steps=len(self.steps),
                         wall_origin_ns=self.wall_origin_ns)
        summary = write_report(self.report_dir, result, self.info)
        self._progress("done", self.duration_s, result.acknowledged, result.faults)
        return RunOutcome(result, summary, self.report_dir, summary["run"])

    def _progress(self, phase: str, elapsed_s: float, acknowledged: int, faults: int) -> None:
        if self.on_progress is not None:
            self.on_progress(Progress(phase, elapsed_s, self.duration_s, acknowledged, faults))
