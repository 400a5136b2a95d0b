"""The nemesis: performs `FaultStep`s on a running `LocalCluster` and its workload processes.

It resolves a step's abstract target against the live cluster when the step is due ("the
current leader of partition 2", "a follower of partition 0", "the replicas of node 3", "a group
member"), does the fault, and logs it: a `fault` line in the history (docs/history.md) for each
target, and a fuller line in `faults.jsonl` (pids, endpoints, problems, steps it had to skip).

Process faults are signals: kill -9 (the supervisor, or the worker pool, restarts the process),
SIGSTOP/SIGCONT, SIGTERM for a graceful restart. Network and disk faults go through the fault
switch of each actor's runtime (chaos/links.py). Faults with a duration are undone by `perform`
itself before it returns, or early when `abort` is set; `heal` undoes everything still active
(paused processes, link and disk faults) and writes the `heal` line.

Every random choice (which follower, which member) comes from the run's one `random.Random`,
over candidates in sorted order, so a seed replays the same choices against the same states.

Fault lines name `topic` and `partition` with role `leader` only for faults that take a leader
away (kill, pause, isolate, restart of a current leader): the checker measures failover from
exactly those. Link and disk faults that hit a leader carry role `leader-<action>` instead.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from typing import Any, NamedTuple

from actors.errors import RailmqError
from actors.messages import LinkFault, PartitionMetadata
from chaos.links import (
    ActorRef, FaultBoard, isolation_plan, one_way_plan, slow_link_plan, split_plan,
)
from chaos.scenarios import FaultStep
from chaos.workload import LineRecorder
from railmq.admin import Admin
from transport.node_agent import replica_actor_name

# How long a step waits for its partition to have a leader before it is skipped.
LEADER_WAIT_S = 5.0
# Fault-switch and metadata requests from the nemesis time out after this: an actor that does
# not answer is down or paused, and the step moves on.
NEMESIS_REQUEST_TIMEOUT_MS = 2000
# A just-started actor's endpoint reaches the supervisor a moment after the process runs.
ENDPOINT_WAIT_S = 3.0
COORDINATOR_ROLES = ("coordinator", "controller", "group-coordinator")
# Faults after which the partition must elect a new leader; their fault lines carry role "leader".
LEADER_LOSING = ("kill", "pause", "isolate", "restart")


class Victim(NamedTuple):
    name: str
    role: str  # "leader" | "follower" | "coordinator" | "group-coordinator" | "member" | "producer"
    kind: str  # "actor" | "worker"
    partition: int | None = None
    node: int = 0


class StepSkipped(Exception):
    """The step's target does not exist right now (no leader, no live member): nothing was done."""


class FaultLog:
    """Fault lines for the history, and the detailed fault log (`faults.jsonl`)."""

    def __init__(self, history: LineRecorder, detail: LineRecorder, topic: str) -> None:
        self.history = history
        self.detail = detail
        self.topic = topic
        self.count = 0

    def fault(self, action: str, victim: Victim, phase: str, step_index: int, **detail: Any) -> None:
        line: dict[str, Any] = {"type": "fault", "nemesis": action, "target": victim.name, "phase": phase}
        role = victim.role
        if victim.partition is not None:
            line.update(topic=self.topic, partition=victim.partition)
            if role == "leader" and action not in LEADER_LOSING:
                role = f"leader-{action}"  # the leader stays leader: not a failover to measure
        line["role"] = role
        stamp = self.history.record(line)
        self.count += phase == "start"
        self.detail.record({**line, "step": step_index, "kind": victim.kind, "node": victim.node,
                            "fault_time_ns": stamp, **detail})

    def note(self, step_index: int, action: str, sentence: str) -> None:
        self.detail.record({"type": "note", "step": step_index, "nemesis": action, "note": sentence})

    def heal(self, problems: list[str]) -> int:
        stamp = self.history.record({"type": "heal"})
        self.detail.record({"type": "heal", "heal_time_ns": stamp, "problems": problems})
        return stamp


class Nemesis:
    def __init__(self, cluster: Any, workers: Any, topic: str, rng: random.Random, log: FaultLog) -> None:
        self.cluster = cluster
        self.workers = workers
        self.topic = topic
        self.rng = rng
        self.log = log
        self.abort = threading.Event()
        self._admin_lock = threading.Lock()
        self._admin = Admin(cluster.bootstrap, timeout_ms=NEMESIS_REQUEST_TIMEOUT_MS, secret=cluster.secret)
        self.board = FaultBoard(self._endpoint_of, self._set_faults)
        self.paused: dict[str, Victim] = {}
        self.labels: dict[str, list[Victim]] = {}

    def close(self) -> None:
        with self._admin_lock:
            self._admin.close()

    # ------------------------------------------------------------------ cluster facts

    def _actor_refs(self) -> list[ActorRef]:
        """Every running actor whose endpoint the supervisor knows. A process that has just
        started (or restarted) is known by name a moment before its endpoint is."""
        return sorted(ActorRef(actor["name"], actor["endpoint"], actor["node"] or 0)
                      for actor in self.cluster.actors() if actor["alive"] and actor["endpoint"])

    def _endpoint_of(self, name: str, wait_s: float = ENDPOINT_WAIT_S) -> str:
        deadline = time.monotonic() + wait_s
        while True:
            for ref in self._actor_refs():
                if ref.name == name:
                    return ref.endpoint
            if time.monotonic() > deadline or name not in self.cluster.supervisor.actors:
                return ""
            time.sleep(0.02)

    def _set_faults(self, endpoint: str, links: list[LinkFault], disk_full: bool,
                    fail_next_fsync: bool) -> None:
        with self._admin_lock:
            self._admin.set_faults(endpoint, links, disk_full=disk_full, fail_next_fsync=fail_next_fsync)

    def partition_state(self, partition: int, wait_s: float = LEADER_WAIT_S) -> PartitionMetadata:
        """The partition's metadata once it has a leader (StepSkipped after `wait_s`)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                with self._admin_lock:
                    state = self._admin.describe_topic(self.topic).partitions[partition]
                if state.leader >= 0 and state.leader_endpoint:
                    return state
            except (RailmqError, TimeoutError, IndexError):  # the coordinator is down or electing
                pass
            if time.monotonic() > deadline or self.abort.is_set():
                raise StepSkipped(f"{self.topic}/{partition} has no leader")
            time.sleep(0.05)

    def _replica(self, partition: int, node: int, role: str) -> Victim:
        return Victim(replica_actor_name(self.topic, partition, node), role, "actor", partition, node)

    # ------------------------------------------------------------------ resolving targets

    def resolve(self, step: FaultStep) -> list[Victim]:
        role = step.role
        if role == "label":
            victims = self.labels.pop(step.label, [])
            if not victims:
                raise StepSkipped(f"nothing is labelled {step.label!r}")
            return victims
        if role in COORDINATOR_ROLES:
            return [Victim(self._coordinator_name(role), role, "actor")]
        if role in ("member", "producer"):
            names = self.workers.alive_names(role)
            if not names:
                raise StepSkipped(f"no {role} is running")
            return [Victim(self.rng.choice(names), role, "worker")]
        if role == "node" and step.action == "lose-node":
            return []  # the whole node, processes and disk (LocalCluster.lose_node)
        if role == "node":
            return self._node_replicas(step.node or 1)
        return self._partition_victims(step)

    def _coordinator_name(self, role: str) -> str:
        """The process playing `role` now: with a quorum, the voter that is active."""
        try:
            if role in ("coordinator", "controller"):
                return self.cluster.active_controller(timeout_s=NEMESIS_REQUEST_TIMEOUT_MS / 1000) \
                    if getattr(self.cluster, "controller_ids", None) else "coordinator"
            return self.cluster.group_coordinator_name() if hasattr(self.cluster, "group_coordinator_name") else role
        except (RailmqError, TimeoutError):
            raise StepSkipped(f"no {role} is active (an election is under way)") from None

    def _partition_victims(self, step: FaultStep) -> list[Victim]:
        partition = step.partition or 0
        state = self.partition_state(partition)
        leader = self._replica(partition, state.leader, "leader")
        followers = [self._replica(partition, node, "follower") for node in sorted(state.replicas)
                     if node != state.leader]
        if step.role == "leader":
            return [leader]
        if step.role == "followers":
            return followers
        if step.role == "follower":
            if not followers:
                raise StepSkipped(f"{self.topic}/{partition} has no follower")
            return [self.rng.choice(followers)]
        return [self.rng.choice([leader] + followers)]  # "replica"

    def _node_replicas(self, node: int) -> list[Victim]:
        victims = []
        for partition in range(self._partition_count()):
            state = self.partition_state(partition)
            if node in state.replicas:
                role = "leader" if state.leader == node else "follower"
                victims.append(self._replica(partition, node, role))
        return victims

    def _partition_count(self) -> int:
        with self._admin_lock:
            return len(self._admin.describe_topic(self.topic).partitions)

    # ------------------------------------------------------------------ performing

    def perform(self, step: FaultStep, index: int = 0) -> None:
        """Do one step; a step with a duration is undone before this returns."""
        try:
            victims = self.resolve(step)
            handler = getattr(self, "_do_" + step.action.replace("-", "_"))
            handler(step, index, victims)
        except StepSkipped as skipped:
            self.log.note(index, step.action, f"skipped: {skipped}")
        except (ProcessLookupError, LookupError) as gone:
            self.log.note(index, step.action, f"skipped: {gone}")

    def _signal(self, victim: Victim, signum: int) -> int:
        if victim.kind == "worker":
            return self.workers.signal(victim.name, signum)
        return self.cluster.supervisor.signal(victim.name, signum)

    def _hold(self, step: FaultStep) -> None:
        self.abort.wait(step.duration_s)

    def _do_kill(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        for victim in victims:
            pid = self._signal(victim, signal.SIGKILL)
            self.log.fault("kill", victim, "start", index, pid=pid)

    def _do_lose_node(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        node = step.node or 1
        lost = self.cluster.lose_node(node)
        victim = Victim(f"node {node}", "node", "node", None, node)
        self.log.fault("lose-node", victim, "start", index, processes=lost)

    def _do_restart(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        for victim in victims:
            pid = self._signal(victim, signal.SIGTERM)
            self.log.fault("restart", victim, "start", index, pid=pid)

    def _do_crash_member(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        for victim in victims:
            pid, before_commit = self.workers.crash_before_commit(victim.name)
            self.log.fault("crash-member", victim, "start", index, pid=pid, before_commit=before_commit)

    def _do_pause(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        for victim in victims:
            pid = self._signal(victim, signal.SIGSTOP)
            self.paused[victim.name] = victim
            self.log.fault("pause", victim, "start", index, pid=pid, label=step.label)
        if step.label:
            self.labels[step.label] = victims
        if step.duration_s > 0:
            self._hold(step)
            self._resume(victims, index)

    def _do_resume(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        self._resume(victims, index)

    def _resume(self, victims: list[Victim], index: int) -> None:
        for victim in victims:
            self.paused.pop(victim.name, None)
            try:
                self._signal(victim, signal.SIGCONT)
            except ProcessLookupError:
                pass  # it died while paused (the run is stopping): nothing left to resume
            self.log.fault("pause", victim, "stop", index)

    def _network_fault(self, action: str, step: FaultStep, index: int, victims: list[Victim],
                       plan: dict[str, list[LinkFault]], **detail: Any) -> None:
        fault_id, problems = self.board.start_links(plan)
        for victim in victims:
            self.log.fault(action, victim, "start", index, problems=problems, **detail)
        self._hold(step)
        problems = self.board.stop(fault_id)
        for victim in victims:
            self.log.fault(action, victim, "stop", index, problems=problems)

    def _refs_with(self, victim: Victim) -> tuple[ActorRef, list[ActorRef]]:
        """(the victim's reference, every actor's), once the victim's endpoint is known."""
        if not self._endpoint_of(victim.name):
            raise StepSkipped(f"{victim.name} is not running")
        refs = self._actor_refs()
        for ref in refs:
            if ref.name == victim.name:
                return ref, refs
        raise StepSkipped(f"{victim.name} stopped running")

    def _partition_peers(self, victim: Victim, refs: list[ActorRef]) -> list[ActorRef]:
        prefix = replica_actor_name(self.topic, victim.partition or 0, 0)[:-1]  # "replica/<t>/<p>/n"
        return [ref for ref in refs if ref.name.startswith(prefix) and ref.name != victim.name]

    def _do_isolate(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        target, refs = self._refs_with(victims[0])
        self._network_fault("isolate", step, index, victims[:1], isolation_plan(target, refs))

    def _do_split(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        refs = self._actor_refs()
        side = [ref for ref in refs if ref.node in step.side]
        other = [ref for ref in refs if ref.node not in step.side]
        named = [Victim(f"nodes {sorted(step.side)} | rest", "node", "actor")]
        self._network_fault("split", step, index, named, split_plan(side, other),
                            side=[ref.name for ref in side])

    def _do_cut(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        source, refs = self._refs_with(victims[0])
        peers = self._partition_peers(victims[0], refs)
        self._network_fault("cut", step, index, victims[:1], one_way_plan(source, peers),
                            destinations=[ref.name for ref in peers])

    def _do_slow_link(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        source, refs = self._refs_with(victims[0])
        peers = self._partition_peers(victims[0], refs) + [ref for ref in refs if ref.name == "coordinator"]
        plan = slow_link_plan(source, peers, step.delay_ms, step.drop_probability)
        self._network_fault("slow-link", step, index, victims[:1], plan, delay_ms=step.delay_ms,
                            drop_probability=step.drop_probability)

    def _do_disk_full(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        victim = victims[0]
        fault_id, problems = self.board.start_disk_full(victim.name)
        self.log.fault("disk-full", victim, "start", index, problems=problems,
                       was_leader=victim.role == "leader")
        self._hold(step)
        problems = self.board.stop(fault_id)
        self.log.fault("disk-full", victim, "stop", index, problems=problems)

    def _replica_directory(self, victim: Victim) -> str:
        from transport.actor_main import replica_directory

        with self._admin_lock:
            topic_id = self._admin.describe_topic(self.topic).topic_id
        return replica_directory(self.cluster.data_dir, victim.node, self.topic, victim.partition, topic_id)

    def _do_wipe(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        """Lose a disk: kill the replica and delete its whole directory before it restarts."""
        victim = victims[0]
        directory = self._replica_directory(victim)
        pid = self._signal(victim, signal.SIGKILL)
        wiped = wipe_directory(directory)
        self.log.fault("wipe", victim, "start", index, pid=pid, files=wiped, was_leader=victim.role == "leader")

    def _do_corrupt(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        """Bit rot: flip one byte inside a batch's records in a segment the replica has written."""
        victim = victims[0]
        where = flip_payload_byte(self._replica_directory(victim), self.rng)
        self.log.fault("corrupt", victim, "start", index, where=where, was_leader=victim.role == "leader")

    def _do_fsync_fail(self, step: FaultStep, index: int, victims: list[Victim]) -> None:
        victim = victims[0]
        problems = self.board.fail_next_fsync(victim.name)
        self.log.fault("fsync-fail", victim, "start", index, problems=problems,
                       was_leader=victim.role == "leader")

    # ------------------------------------------------------------------ healing

    def heal(self) -> int:
        """Undo every fault still in force and write the `heal` line; returns its stamp."""
        self.abort.set()
        problems: list[str] = []
        for victim in list(self.paused.values()):
            self._resume([victim], -1)
        self.labels.clear()
        problems += self.board.heal([ref.name for ref in self._actor_refs()])
        return self.log.heal(problems)


def wipe_directory(directory: str) -> int:
    """Delete every file of a replica directory (and the directory); how many files went."""
    import shutil

    count = sum(len(names) for _, _, names in os.walk(directory))
    shutil.rmtree(directory, ignore_errors=True)
    return count


def flip_payload_byte(directory: str, rng: random.Random) -> str:
    """Flip one byte of one record payload in the oldest half of a replica's log; where it was.
    Only under a batch's CRC (never the stamped offset or epoch): the damage reads must find."""
    from storage.batch import HEADER_SIZE
    from storage.segment import iter_batches_in_file, parse_segment_file_name
    from storage.fs import OsFileSystem

    names = sorted(name for name in os.listdir(directory) if parse_segment_file_name(name) is not None)
    if not names:
        raise StepSkipped(f"{directory} holds no segment yet")
    path = os.path.join(directory, names[0])
    handle = OsFileSystem().open(path)
    try:
        batches = [(position, header) for position, header in
                   iter_batches_in_file(handle, 0, handle.size, verify=False, batch_bytes_max=64 << 20)]
    finally:
        handle.close()
    if not batches:
        raise StepSkipped(f"{path} holds no batch yet")
    position, header = rng.choice(batches[: max(1, len(batches) // 2)])
    target = position + HEADER_SIZE + rng.randrange(header.payload_length)
    with open(path, "r+b") as file:
        file.seek(target)
        byte = file.read(1)
        file.seek(target)
        file.write(bytes([byte[0] ^ 0x5A]))
    return f"{names[0]} byte {target} (offsets {header.base_offset}..{header.last_offset})"
