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
"""

from __future__ import annotations

import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from actors.effects import AfterFlush, CancelTimer, Crash, Exit, Notify, Send, SetTimer, Trace
from actors.limits import Limits
from actors.messages import PeerDisconnected, TimerFired
from chaos.sim_agents import SimNodeAgent, node_agent_endpoint, node_agent_name
from chaos.sim_hosts import TinyAgent as TinyAgent  # chaos/labs builds its agent from here too
from chaos.sim_hosts import Host, controller_factory, coordinator_factory, group_coordinator_factory, replica_factory
from chaos.sim_network import MS, EventQueue, Network, NetworkFaults
from storage.errors import FsyncFailed
from transport.auth import refusal
from transport.codec import Codec

SIM_SECRET = b"railmq-simulated-cluster-secret!"

START_NS = 1_800_000_000 * 1_000_000_000  # a plausible wall clock for record timestamps
# Shorter timeouts than production, so a fault's consequences (and the recovery from them) play
# out within a run: the group coordinator gives up on a share group's request (metadata, a high
# watermark, a dead-letter write) after 1 s rather than 5. A share group re-reads a high
# watermark its acquires wait on every 100 ms rather than 20, and a replica scrubs its log every
# second rather than every 250 ms: a fifth of the ListOffsets traffic and three quarters of the
# scrubbing, which were a tenth of the simulated steps; nothing checked depends on either. A
# follower waiting at the leader's end gives up on its fetch after 1 s + 1 s rather than 5 s + 1 s
# (a fetch the network lost just before the heal would otherwise end the recovery window still
# unanswered). A follower fetches at most 4 KB at a time rather than 8 MB, so one that comes back
# far behind catches up in several rounds, as it does in production with real volumes.
SIM_LIMITS = Limits(replica_session_timeout_ms=1000, replica_lag_time_max_ms=1500,
                    replica_keepalive_interval_ms=300, replica_keepalive_timeout_ms=1000,
                    node_heartbeat_interval_ms=200, node_session_timeout_ms=1000,
                    coordinator_election_grace_ms=500, group_initial_rebalance_delay_ms=50,
                    share_high_watermark_refresh_ms=100, share_request_timeout_ms=1000, scrub_interval_ms=1000,
                    replica_fetch_idle_wait_max_ms=1000, replica_fetch_bytes_max=4096)
FAULT_KINDS = ("crash", "pause", "partition", "network", "disk", "clock", "slow-disk", "flush-crash")
ASSIGNORS = ("range", "round-robin", "cooperative-sticky")
TOPIC = "sim"
DEAD_LETTER_TOPIC = "sim.dlq"
GROUP = "sim-group"
SHARE_GROUP = "sim-share"


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 3
    controllers: int = 0  # 0: one coordinator process; n: a quorum of n controllers, one per node
    partitions: int = 3
    replication_factor: int = 3
    min_insync: int = 2
    flush_policy: str = ""  # "": each seed chooses one of `flush_policies`
    flush_policies: tuple[str, ...] = ("every_batch", "interval")
    flush_interval_ms: tuple[int, int] = (100, 400)  # an interval-flushed seed's flush interval
    producers: int = 2
    consumers: int = 3  # classic members of GROUP; the last `static_members` are static (KIP-345)
    static_members: int = 1
    assignors: tuple[str, ...] = ASSIGNORS  # the group's assignor: one per seed
    processing_ms: tuple[int, int] = (0, 200)  # a member processes a polled chunk for this long
    share_members: int = 2
    share_visibility_timeout_ms: int = 1000
    share_max_delivery_attempts: int = 3
    keys: int = 6
    duration_ms: int = 8_000
    recovery_ms: int = 6_000
    produce_interval_ms: int = 100  # each producer: ~10 batches of 4-12 records per simulated second
    records_per_batch: tuple[int, int] = (4, 12)
    commit_interval_ms: int = 250
    faults: tuple[str, ...] = FAULT_KINDS
    fault_interval_ms: tuple[int, int] = (300, 1500)
    restart_delay_ms: int = 300
    exit_notice_lost_probability: float = 0.25  # the node agent died too: nobody reports the exit
    exit_notice_late_probability: float = 0.25  # the notice arrives after the restart
    clock_skew_max_ms: int = 50  # a process's clock is at most this far from the true time
    network: NetworkFaults = field(default_factory=lambda: NetworkFaults())
    limits: Limits = SIM_LIMITS
    node_agents: bool = True  # replicas report through their node's agent (False: to the coordinator)
    trace_events_max: int = 60
    steps_max: int = 0  # end the faulty phase after this many steps (0: by duration only)


@dataclass(frozen=True)
class SeedPlan:
    """What one seed chose before anything ran."""

    flush_policy: str
    flush_interval_ms: int
    assignor: str


class SimulationFailed(AssertionError):
    def __init__(self, seed: int, problems: list[str], trace: list[str]) -> None:
        lines = [f"simulation seed {seed} failed:"] + [f"  - {p}" for p in problems[:20]]
        lines += ["last events:"] + [f"  {line}" for line in trace]
        super().__init__("\n".join(lines))
        self.seed = seed
        self.problems = problems


class Simulator:
    def __init__(self, seed: int, config: SimConfig | None = None) -> None:
        self.seed = seed
        self.config = config or SimConfig()
        self.rng = random.Random(seed)
        self.plan = self._choose_plan()
        self.queue = EventQueue()
        self.queue.now_ns = START_NS
        self.network = Network(random.Random(self.rng.getrandbits(64)), self.config.network)
        # Processes of the cluster sign what they send with the cluster secret; clients do not.
        # Receivers check it through the same rule the runtime applies (transport/auth.py).
        self.codec = Codec(secret=SIM_SECRET)
        self.client_codec = Codec()
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
                               controller_factory(node, self.voters, nodes, limits), fixed_endpoint=True))
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
            return SimNodeAgent(node, self.coordinator_endpoint, self.config.limits, agent_id)
        return build

    def node_agent(self, node: int) -> Host | None:
        """The node's agent host, when the run has node agents."""
        return self.hosts.get(node_agent_name(node))

    def _add(self, host: Host) -> None:
        self.hosts[host.name] = host
        self.by_routing[host.routing_id] = host

    def _boot(self, host: Host) -> None:
        host.boot(self.rng)
        if host.endpoint:
            self.by_endpoint[host.endpoint] = host
        self._note(f"boot {host.name}#{host.incarnation}")
        self.watch.on_boot(host)
        self._apply(host, host.actor.start(host.clock_ns(self.now_ns)))
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

    # ------------------------------------------------------------------ effects

    def _apply(self, host: Host, effects: list) -> None:
        for position, effect in enumerate(effects):
            kind = type(effect)
            if kind is Send:
                self._send(host, effect.to, effect.message)
            elif kind is SetTimer:
                host.timers[effect.name] = effect.deadline_ns
                self.queue.push(effect.deadline_ns - host.clock_offset_ns, "timer",
                                (host.name, host.incarnation, effect.name, effect.deadline_ns))
            elif kind is CancelTimer:
                host.timers.pop(effect.name, None)
            elif kind is AfterFlush:
                if self.faults.after_flush(host, effect, effects[position + 1:]) != "applied":
                    return  # it died in the middle of the flush, or the rest waits for the flush
            elif kind is Trace:
                self._on_trace(host, effect.event, effect.details)
            elif kind is Notify:
                self._on_notify(host, effect.kind, effect.payload)
            elif kind is Crash or kind is Exit:
                self._note(f"{host.name} {kind.__name__.lower()}s: {effect.reason}")
                self.crash(host.name)
                return
            else:
                raise AssertionError(f"unknown effect {effect!r}")
            if not host.alive:
                return

    def flush_now(self, host: Host, store: Any) -> bool:
        """Flush `store` of `host` now; False when the process died in the middle of it."""
        try:
            store.flush()  # durable before anything it guards is revealed
        except FsyncFailed as error:
            self._note(f"{host.name} dies in the middle of a flush: {error}")
            self.crash(host.name)
            return False
        return True

    def apply_later(self, host: Host, incarnation: int, effects: list) -> None:
        """Effects a flush held back, once it completed (for the incarnation that asked)."""
        if host.alive and host.incarnation == incarnation:
            self._apply(host, effects)

    def _internal(self, host: Host, messages: list) -> None:
        for message in messages:
            if not host.alive:
                return
            self._step(host, message, b"")

    def later(self, name: str, delay_ns: int, action: Callable[[int], list]) -> None:
        """Run a shell's `action(now_ns)` after `delay_ns` (a processing step that takes time) and
        hand its messages to the actor — for this incarnation only, and not while it is paused."""
        host = self.hosts[name]
        incarnation = host.incarnation

        def due() -> None:
            if not host.alive or host.incarnation != incarnation:
                return
            if host.paused_until_ns > self.now_ns:
                self.queue.push(host.paused_until_ns, "call", due)
                return
            self._internal(host, action(self.now_ns))
        self.queue.push(self.now_ns + delay_ns, "call", due)

    def _on_notify(self, host: Host, kind: str, payload: Any) -> None:
        if host.name == "agent":
            if kind == "assignments":
                self._on_assignments(payload)
            return
        shell = self.shells.get(host.name)
        if shell is not None:
            self._internal(host, shell.on_notify(kind, payload, self.now_ns))

    def _on_trace(self, host: Host, event: str, details: dict) -> None:
        if host.kind == "replica":
            self.disk.on_trace(host, event, details)
        if event in ("became-leader", "leader-elected", "isr-changed", "unclean-election", "follower-truncated",
                     "follower-refused-truncation", "storage-damage-found", "storage-repaired", "repair-truncated",
                     "generation-started", "member-removed", "share-member-removed"):
            self._note(f"{host.name} {event} {details}")
        self.watch.on_trace(host, event, details)

    # ------------------------------------------------------------------ network

    def _send(self, host: Host, to: Any, message: Any) -> None:
        observe = self.watch.sends.get(type(message))
        if observe is not None:
            observe(host, to, message)
        frames = (self.codec if host.server or host.kind == "agent" else self.client_codec).encode(message)
        if len(frames) > 1:  # payload frames may be the sender's buffers: the wire copies them
            frames = [bytes(frame) for frame in frames]
        if isinstance(to, str):
            destination = self.by_endpoint.get(to)
            # As ZeroMQ's routing ids are unique per socket, a reply reaches only the process
            # that asked, never a later incarnation of it.
            sender: Any = host.routing_id + b"#" + str(host.incarnation).encode()
            if destination is None or not destination.alive or destination.endpoint != to:
                self._refused(host, to)  # nobody listens there: the connection is refused
                return
            host.peers.add(to)
            target: Any = to
        else:
            routing, _, incarnation = to.rpartition(b"#")
            destination = self.by_routing.get(routing)
            target = int(incarnation) if incarnation.isdigit() else -1
            sender = host.endpoint
        if destination is None:
            return
        queue = self.queue
        arrivals = self.network.plan(host.name, destination.name, queue.now_ns)
        if arrivals:
            payload = (destination.name, target, sender, frames)
            for arrival in arrivals:
                queue.push(arrival, "deliver", payload)

    def agent_controller(self) -> str:
        """Where the node agent sends now: the controller it believes active."""
        agent = self.hosts.get("agent")
        if agent is None or not agent.alive:
            return self.coordinator_endpoint.split(",")[0]
        return agent.actor.controllers.current

    def send_as(self, name: str, to: str, message: Any) -> None:
        self._send(self.hosts[name], to, message)

    def _refused(self, host: Host, endpoint: str) -> None:
        """Like ZeroMQ's EVENT_CONNECT_RETRIED: the sender hears once that nobody listens there."""
        refused = host.state.setdefault("refused", set())
        if (host.incarnation, endpoint) in refused:
            return
        refused.add((host.incarnation, endpoint))
        self.queue.push(self.now_ns + MS, "disconnect", (host.name, host.incarnation, endpoint))

    def _deliver(self, name: str, target: Any, sender: Any, frames: list) -> None:
        host = self.hosts[name]
        if not host.alive:
            return
        if isinstance(target, str) and target != host.endpoint:
            return  # sent to an endpoint of an earlier incarnation: nobody listens there
        if isinstance(target, int) and target != host.incarnation:
            return  # a reply to a process that has since died
        if host.paused_until_ns > self.now_ns:
            self.queue.push(host.paused_until_ns, "deliver", (name, target, sender, frames))
            return
        message = self.codec.decode(frames)
        refused = refusal(host.actor, message, self.codec.last_authenticated)
        if refused is not None:
            self.problems.append(f"{host.name} got an unauthenticated {type(message).__name__} from {sender!r}")
            return
        self._step(host, message, sender)

    def _step(self, host: Host, message: Any, sender: Any) -> None:
        self.steps += 1
        actor = host.actor
        now = self.queue.now_ns + host.clock_offset_ns
        observe = self.watch.receives.get(type(message))
        if observe is not None:
            observe(host, message, sender, now)
        fsyncs = host.faults.fsyncs
        try:
            effects = actor.handle(message, sender, now)
        except FsyncFailed as error:  # killed in the middle of a flush it made itself
            self._note(f"{host.name} dies in the middle of a flush: {error}")
            self.crash(host.name)
            return
        except Exception as error:  # a programmer error: the real process would die of it
            self._actor_failed(host, f"raised {error!r} handling {type(message).__name__}")
            return
        if host.disk_latency_ns and host.faults.fsyncs != fsyncs:
            # A flush the actor made inline (a flush timer, a checkpoint) on a slow disk: the process
            # sits in fsync and handles nothing more until the disk is done (its effects are not
            # held back: what the flush made durable is already on the memory disk).
            host.paused_until_ns = max(host.paused_until_ns, self.now_ns + host.disk_latency_ns)
        self._apply(host, effects)
        if host.alive:
            try:
                host.actor.invariants()
            except AssertionError as error:
                self._actor_failed(host, f"broke an invariant: {error}")
                return
            if host.kind == "controller":
                self._check_quorum(host, now)
            self.watch.after_step(host)

    def _check_quorum(self, host: Host, now_ns: int) -> None:
        """Election safety, log matching, leader completeness, state-machine safety (chaos/sim_raft_checks.py)."""
        checker = self.raft_checker
        before = len(checker.problems)
        checker.after_step(host.node, host.incarnation, host.actor.raft, _Applied(host.state["applied"]), now_ns)
        self.problems.extend(f"quorum: {problem}" for problem in checker.problems[before:])

    def _actor_failed(self, host: Host, what: str) -> None:
        self.problems.append(f"{host.name}#{host.incarnation} {what}")
        self.crash(host.name)

    def _timer(self, name: str, incarnation: int, timer: str, deadline: int) -> None:
        host = self.hosts[name]
        if not host.alive or host.incarnation != incarnation or host.timers.get(timer) != deadline:
            return
        if host.clock_ns(self.now_ns) < deadline:
            return  # the process's clock jumped back: the timer was queued again for later
        if host.paused_until_ns > self.now_ns:
            self.queue.push(host.paused_until_ns, "timer", (name, incarnation, timer, deadline))
            return
        del host.timers[timer]
        self._step(host, TimerFired(name=timer), b"")

    def requeue_timers(self, host: Host) -> None:
        """After a clock jump: every timer fires when the process's new clock reads its deadline."""
        for timer, deadline in host.timers.items():
            self.queue.push(deadline - host.clock_offset_ns, "timer", (host.name, host.incarnation, timer, deadline))

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

    def _disconnect(self, name: str, incarnation: int, endpoint: str) -> None:
        host = self.hosts[name]
        if host.alive and host.incarnation == incarnation:
            if host.paused_until_ns > self.now_ns:
                self.queue.push(host.paused_until_ns, "disconnect", (name, incarnation, endpoint))
                return
            self._step(host, PeerDisconnected(endpoint=endpoint), b"")

    def disconnect_peers(self, host: Host, endpoint: str) -> None:
        """Everyone connected to a dead process's endpoint sees the connection drop."""
        for other in self.hosts.values():
            if other.alive and endpoint and endpoint in other.peers:
                other.peers.discard(endpoint)
                self.queue.push(self.now_ns + MS, "disconnect", (other.name, other.incarnation, endpoint))

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
        queue = self.queue
        pop_due = queue.pop_due
        while True:
            if steps_max and self.steps >= steps_max:
                return
            event = pop_due(until_ns)
            if event is None:
                break
            kind, payload = event
            if kind == "deliver":
                self._deliver(*payload)
            elif kind == "timer":
                self._timer(*payload)
            elif kind == "disconnect":
                self._disconnect(*payload)
            else:
                payload()
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


class _Applied:
    """What the Raft checker reads of a state machine: the entries applied since the last step."""

    def __init__(self, applied: list) -> None:
        self.applied = applied


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
