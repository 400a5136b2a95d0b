"""Deterministic simulation of a whole railmq cluster (FoundationDB / TigerBeetle style).

    python -m chaos.simulator --seed 7 [--duration-ms 10000] [--faults crash,pause,partition,network]
    python -m chaos.simulator --seeds 200          # a sweep; failing seeds are printed

Every actor kind runs in one process under a virtual clock, as the production classes: the
coordinator, partition replicas (leader and follower roles), the group coordinator with classic
and share groups, idempotent producers that retry across failovers, classic group members (one of
them static, the group's assignor chosen per seed among all of them) whose processing takes
simulated time between fetch and commit, and share-group members that accept, release with a
delay, reject and crash with records locked. Messages pass through the real codec and a seeded
network that drops, delays, duplicates, reorders and partitions (one-way too). The faults the
world has (chaos/sim_faults.py, chaos/sim_disk.py): crashes whose exit notice is lost or late,
pauses longer than the sessions, clock jumps within the allowed skew, slow disks, a kill in the
middle of a flush, topics flushing by interval (per seed) so that a crash loses an unflushed
tail, and disks that lose or damage what was flushed. One `random.Random(seed)` decides
everything, so every run replays exactly from its seed.

Checks, during the run: every actor's `invariants()` after every step (an exception from an actor
is a violation too); the promises of chaos/sim_invariants.py and chaos/sim_share.py (one leader
and one incarnation per epoch, an acknowledged acks=all write on at least min_insync replicas, a
restarted group coordinator holding every commit it acknowledged, one owner per partition per
generation, one lock per share record, delivery counts that never go back). After the run:
faults healed, a recovery window, then chaos/sim_checks.py — the chaos checker's rules over the
history, the group settled, every share record accepted or dead-lettered once. A failure prints
the seed and the last events.

This module owns the run: building the cluster, the workload's ticks, the phases (faulty,
healed, recovery) and the result. Its parts: what a run is given (chaos/sim_config.py), what
reaches a process and when (chaos/sim_delivery.py), one step of an actor and its effects
(chaos/sim_steps.py), the hosts (chaos/sim_hosts.py) and the network (chaos/sim_network.py).
"""

from __future__ import annotations

import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from heapq import heappop
from typing import Any, Callable

from chaos.sim_agents import SimNodeAgent, node_agent_endpoint, node_agent_name
from chaos.sim_config import (
    DEAD_LETTER_TOPIC,
    FAULT_KINDS,
    SIM_LIMITS,
    START_NS,
    TOPIC,
    SeedPlan,
    SimConfig,
)
from chaos.sim_delivery import Delivery
from chaos.sim_hosts import TinyAgent
from chaos.sim_hosts import Host, controller_factory, coordinator_factory, group_coordinator_factory, replica_factory
from chaos.sim_network import MS, EventQueue, Network
from chaos.sim_steps import ActorSteps
from storage.errors import StorageFull
from transport.codec import Codec

# The simulator's entry points, and the names its users (the sweep, chaos/labs, tests) import
# from here though they live in chaos/sim_config.py and chaos/sim_hosts.py.
__all__ = [
    "FAULT_KINDS", "SIM_LIMITS", "START_NS", "TOPIC", "SimConfig", "SimulationFailed", "SimulationResult",
    "Simulator", "TinyAgent", "simulate",
]


class SimulationFailed(AssertionError):
    def __init__(self, seed: int, problems: list[str], trace: list[str]) -> None:
        lines = [f"simulation seed {seed} failed:"] + [f"  - {p}" for p in problems[:20]]
        lines += ["last events:"] + [f"  {line}" for line in trace]
        super().__init__("\n".join(lines))
        self.seed = seed
        self.problems = problems


class Simulator(ActorSteps, Delivery):
    def __init__(self, seed: int, config: SimConfig | None = None) -> None:
        self.seed = seed
        self.config = config or SimConfig()
        self.rng = random.Random(seed)
        self.plan = self._choose_plan()
        self.queue = EventQueue()
        self.queue.now_ns = START_NS
        self.network = Network(random.Random(self.rng.getrandbits(64)), self.config.network)
        # Processes of the cluster prove what they send comes from inside it, clients do not;
        # receivers check it through the runtime's rule (chaos/sim_delivery.py).
        self.codec = Codec()
        self.hosts: dict[str, Host] = {}
        self.by_endpoint: dict[str, Host] = {}
        self.by_routing: dict[bytes, Host] = {}
        self.shells: dict[str, Any] = {}
        self.history: list[dict] = []
        self.problems: list[str] = []
        self.recent: deque[str] = deque(maxlen=self.config.trace_events_max)
        self.producing = True
        self.steps = 0
        self.voters = {node: f"sim://controller/{node}" for node in range(1, self.config.controllers + 1)}
        self.coordinator_endpoint = ",".join(self.voters.values()) or "sim://coordinator"
        from chaos.sim_disk import DiskFaults
        from chaos.sim_raft_checks import SafetyChecker

        self.raft_checker = SafetyChecker()  # the quorum's safety, after every step of a controller
        from chaos.sim_faults import Faults
        from chaos.sim_invariants import Invariants
        from chaos.sim_share import ShareLedger

        self.faults = Faults(self, random.Random(self.rng.getrandbits(64)))
        self.disk = DiskFaults(self, random.Random(self.rng.getrandbits(64)),
                               restart_cluster_probability=0.5 if self.plan.flush_policy != "interval" else 0.0)
        self.watch = Invariants(self)
        self.share = ShareLedger(self)
        self.workload_rng = random.Random(self.rng.getrandbits(64))

    def _choose_plan(self) -> SeedPlan:
        config = self.config
        policy = config.flush_policy or self.rng.choice(config.flush_policies)
        interval = self.rng.randint(*config.flush_interval_ms) if policy == "interval" else 1000
        return SeedPlan(policy, interval, self.rng.choice(config.assignors))

    @property
    def now_ns(self) -> int:
        return self.queue.now_ns

    @property
    def faulting(self) -> bool:
        return self.faults.active

    # ------------------------------------------------------------------ building

    def build(self) -> None:
        from chaos.sim_workload import build_clients

        limits = self.config.limits
        nodes = list(range(1, self.config.nodes + 1))
        if self.voters:
            for node in self.voters:
                self._add(Host(f"controller/{node}", "controller", node,
                               controller_factory(node, self.voters, nodes, limits, self.config.entry_bytes_max),
                               fixed_endpoint=True))
        else:
            self._add(Host("coordinator", "coordinator", 0, coordinator_factory(nodes, limits), fixed_endpoint=True))
        self._add(Host("group-coordinator", "group-coordinator", 0,
                       group_coordinator_factory(self.coordinator_endpoint, limits)))
        extra = ((DEAD_LETTER_TOPIC, 1),) if self.config.share_members else ()
        agent_config = SimConfig(nodes=self.config.nodes, partitions=self.config.partitions,
                                 replication_factor=self.config.replication_factor, min_insync=self.config.min_insync,
                                 flush_policy=self.plan.flush_policy)
        self._add(Host("agent", "agent", 0, lambda host, _: TinyAgent(
            self.coordinator_endpoint, agent_config, extra, self.plan.flush_interval_ms), server=False))
        if self.config.node_agents:
            for node in nodes:
                self._add(Host(node_agent_name(node), "node-agent", node, self._node_agent_factory(node),
                               fixed_endpoint=True))
        for host, shell in build_clients(self):
            self.shells[host.name] = shell
            self._add(host)
        for host in list(self.hosts.values()):
            self._boot(host)

    def _node_agent_factory(self, node: int) -> Any:
        def build(host: Host, _: int) -> SimNodeAgent:
            agent_id = f"sim-n{node}-{host.incarnation}"  # new at every start, as the real agent's
            return SimNodeAgent(node, self.coordinator_endpoint, self.config.limits, agent_id,
                                lambda topic, partition: self._running_incarnation(topic, partition, node))
        return build

    def _running_incarnation(self, topic: str, partition: int, node: int) -> int:
        """The incarnation of the replica process a node's agent runs (0: none is running)."""
        host = self.hosts.get(f"replica/{topic}/{partition}/n{node}")
        return host.actor.incarnation if host is not None and host.alive else 0

    def node_agent(self, node: int) -> Host | None:
        """The node's agent host, when the run has node agents."""
        return self.hosts.get(node_agent_name(node))

    def _add(self, host: Host) -> None:
        self.hosts[host.name] = host
        self.by_routing[host.routing_id] = host

    def _boot(self, host: Host) -> None:
        try:
            host.boot(self.rng)
        except StorageFull as error:  # opening its storage needed a write the full disk refused
            self._note(f"{host.name}#{host.incarnation} stops at its start, its disk full: {error}")
            host.crash(keep_writes=True)
            self.schedule(self.now_ns + self.config.restart_delay_ms * MS, lambda: self.restart(host.name))
            return
        if host.endpoint:
            self.by_endpoint[host.endpoint] = host
        self._note(f"boot {host.name}#{host.incarnation}")
        self.watch.on_boot(host)
        try:
            effects = host.actor.start(host.clock_ns(self.now_ns))
        except StorageFull as error:
            self.stopped_by_full_disk(host, error)
            return
        self._apply(host, effects)
        shell = self.shells.get(host.name)
        if shell is not None:
            self._internal(host, shell.start())

    def _on_assignments(self, replicas: list) -> None:
        for assignment in replicas:
            name = f"replica/{assignment.topic}/{assignment.partition}/n{assignment.node}"
            if name in self.hosts:
                continue
            report_to = node_agent_endpoint(assignment.node) if self.config.node_agents else ""
            factory = replica_factory(assignment.topic, assignment.topic_id, assignment.partition, assignment.node,
                                      self.coordinator_endpoint, assignment.config, self.config.limits,
                                      lambda: self.now_ns, assignment.replicas, report_to)
            host = Host(name, "replica", assignment.node, factory)
            host.state["topic_partition"] = (assignment.topic, assignment.partition)
            self._add(host)
            self._boot(host)

    def coordinator(self) -> Any:
        """The coordinator deciding now: the single one, or the active controller's (the newest
        term, should a deposed one not know yet); None when there is none."""
        if not self.voters:
            host = self.hosts["coordinator"]
            return host.actor if host.alive else None
        active = [host.actor for host in self.controller_hosts() if host.alive and host.actor.coordinator is not None]
        return max(active, key=lambda controller: controller.active_term).coordinator if active else None

    def controller_hosts(self) -> list[Host]:
        return [host for host in self.hosts.values() if host.kind in ("coordinator", "controller")]

    def replicas_of(self, topic: str, partition: int) -> list[Host]:
        return [host for host in self.hosts.values()
                if host.kind == "replica" and host.state["topic_partition"] == (topic, partition)]

    def agent_controller(self) -> str:
        """Where the node agent sends now: the controller it believes active."""
        agent = self.hosts.get("agent")
        if agent is None or not agent.alive:
            return self.coordinator_endpoint.split(",")[0]
        return agent.actor.controllers.current

    # ------------------------------------------------------------------ faults (chaos/sim_faults.py)

    def crash(self, name: str, restart: bool = True, notify: bool = True) -> None:
        """Kill a host; `notify=False` loses the node agent's exit notice (it died too)."""
        self.faults.crash(name, restart=restart, notify=notify)

    def stop(self, name: str) -> None:
        """Stop a host as `railmq down` does (chaos/sim_faults.py `Faults.stop`)."""
        self.faults.stop(name)

    def restart(self, name: str) -> None:
        host = self.hosts[name]
        if not host.alive:
            self._boot(host)

    def note(self, line: str) -> None:
        self._note(line)

    def schedule(self, at_ns: int, action: Callable[[], None]) -> None:
        self.queue.push(at_ns, "call", action)

    # ------------------------------------------------------------------ workload

    def _produce_tick(self) -> None:
        if not self.producing:
            return
        from chaos.sim_workload import ProducerShell

        for name, shell in self.shells.items():
            host = self.hosts[name]
            if isinstance(shell, ProducerShell) and host.alive and host.paused_until_ns <= self.now_ns:
                batch = shell.next_batch(self.now_ns)
                if batch is not None:
                    self._step(host, batch, b"")
        self.queue.push(self.now_ns + self.config.produce_interval_ms * MS, "call", self._produce_tick)

    def _commit_tick(self) -> None:
        for name, shell in self.shells.items():
            host = self.hosts[name]
            if host.alive and host.paused_until_ns <= self.now_ns and hasattr(shell, "commit"):
                self._internal(host, shell.commit(None, self.now_ns))
        self.queue.push(self.now_ns + self.config.commit_interval_ms * MS, "call", self._commit_tick)

    # ------------------------------------------------------------------ running

    def run_until(self, until_ns: int, steps_max: int = 0) -> None:
        # EventQueue.pop_due, inlined: this loop runs once per simulated event.
        queue = self.queue
        heap = queue._heap
        handlers = {"deliver": self._deliver, "timer": self._timer, "disconnect": self._disconnect}
        while True:
            if steps_max and self.steps >= steps_max:
                return
            if not heap or heap[0][0] > until_ns:
                break
            at_ns, _, kind, payload = heappop(heap)
            queue.now_ns = at_ns
            handler = handlers.get(kind)
            if handler is None:
                payload()  # "call"
            else:
                handler(*payload)
        queue.now_ns = max(queue.now_ns, until_ns)

    def run(self) -> "SimulationResult":
        started = time.perf_counter()
        config = self.config
        self.history.append({"type": "config", "time_ns": self.now_ns, "scenario": "simulation", "seed": self.seed,
                             "expect_loss": False, "flush_policy": self.plan.flush_policy,
                             "flush_interval_ms": self.plan.flush_interval_ms, "assignor": self.plan.assignor})
        self.build()
        self.queue.push(self.now_ns + 1500 * MS, "call", self._produce_tick)
        self.queue.push(self.now_ns + 1500 * MS, "call", self._commit_tick)
        if config.faults:
            self.queue.push(self.now_ns + 2000 * MS, "call", self.faults.schedule_next)
        self.run_until(START_NS + (1500 + config.duration_ms) * MS, config.steps_max)
        self.producing = False
        self.faults.heal()
        self.run_until(self.now_ns + config.recovery_ms * MS)
        from chaos.sim_checks import final_checks

        final_checks(self)
        simulated_s = (self.now_ns - START_NS) / 1e9
        return SimulationResult(self.seed, simulated_s, time.perf_counter() - started, self.steps, list(self.problems),
                                list(self.recent), self.history)

    def _note(self, line: str) -> None:
        self.recent.append(f"{(self.now_ns - START_NS) / 1e6:10.1f} ms  {line}")


@dataclass
class SimulationResult:
    seed: int
    simulated_s: float
    wall_s: float
    steps: int
    problems: list[str]
    trace: list[str]
    history: list[dict]

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_for_problems(self) -> None:
        if self.problems:
            raise SimulationFailed(self.seed, self.problems, self.trace)


def simulate(seed: int, config: SimConfig | None = None) -> SimulationResult:
    return Simulator(seed, config).run()


if __name__ == "__main__":
    from chaos.sim_sweep import main  # the command line lives with the sweep

    sys.exit(main())
