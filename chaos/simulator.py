"""Deterministic simulation of a whole railmq cluster (FoundationDB / TigerBeetle style).

    python -m chaos.simulator --seed 7 [--duration-ms 10000] [--faults crash,pause,partition,network]
    python -m chaos.simulator --seeds 200          # a sweep; failing seeds are printed

The production actor classes — coordinator, partition replicas (leader and follower roles),
group coordinator, producer and consumer-member logic — run in one process under a virtual
clock. Messages pass through the real codec and a seeded network that drops, delays, duplicates,
reorders and partitions (one-way too); processes crash (their memory disk forgets what was not
flushed), restart with a new incarnation, and pause. One `random.Random(seed)` decides everything,
so every run replays exactly from its seed.

Checks, during the run: every actor's `invariants()` after every step; at most one leader per
partition and epoch; a leader's high watermark never moves back within its epoch. After the
run: faults healed, a recovery window, then the history goes through `chaos.checker` — no
acknowledged write lost, per-key order, one value per offset, committed offsets never regress,
replicas agree, every acknowledged write reached the consumer group — and the group must have
settled. A failure prints the seed and the last events.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from actors.effects import AfterFlush, CancelTimer, Crash, Exit, Notify, Send, SetTimer, Trace
from actors.limits import Limits
from actors.messages import (
    CreateTopicRequest, CreateTopicResponse, NodeAssignmentsRequest, NodeAssignmentsResponse, PeerDisconnected,
    ReplicaExited, TimerFired, TopicConfig,
)
from chaos.sim_hosts import Host, coordinator_factory, group_coordinator_factory, replica_factory
from chaos.sim_network import MS, EventQueue, Network, NetworkFaults
from chaos.sim_workload import ConsumerShell, ProducerShell
from transport.auth import refusal
from transport.codec import Codec

SIM_SECRET = b"railmq-simulated-cluster-secret!"

START_NS = 1_800_000_000 * 1_000_000_000  # a plausible wall clock for record timestamps
SIM_LIMITS = Limits(replica_session_timeout_ms=1000, replica_lag_time_max_ms=1500,
                    coordinator_election_grace_ms=500, group_initial_rebalance_delay_ms=50)
FAULT_KINDS = ("crash", "pause", "partition", "network", "disk")
TOPIC = "sim"
GROUP = "sim-group"


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 3
    partitions: int = 3
    replication_factor: int = 3
    min_insync: int = 2
    flush_policy: str = "every_batch"
    producers: int = 2
    consumers: int = 2
    keys: int = 6
    duration_ms: int = 8_000
    recovery_ms: int = 6_000
    produce_interval_ms: int = 100  # each producer: ~10 batches of 4-12 records per simulated second
    records_per_batch: tuple[int, int] = (4, 12)
    commit_interval_ms: int = 250
    faults: tuple[str, ...] = FAULT_KINDS
    fault_interval_ms: tuple[int, int] = (300, 1500)
    restart_delay_ms: int = 300
    network: NetworkFaults = field(default_factory=lambda: NetworkFaults())
    limits: Limits = SIM_LIMITS
    trace_events_max: int = 60
    steps_max: int = 0  # end the faulty phase after this many steps (0: by duration only)


class SimulationFailed(AssertionError):
    def __init__(self, seed: int, problems: list[str], trace: list[str]) -> None:
        lines = [f"simulation seed {seed} failed:"] + [f"  - {p}" for p in problems[:20]]
        lines += ["last events:"] + [f"  {line}" for line in trace]
        super().__init__("\n".join(lines))
        self.seed = seed
        self.problems = problems


class TinyAgent:
    """The node agent and admin of the simulated cluster: creates the topic, then reports the
    coordinator's replica assignments (the simulator starts a host for each)."""

    name = "agent"

    def __init__(self, coordinator: str, config: SimConfig) -> None:
        self.coordinator = coordinator
        self.config = config
        self.created = False

    def start(self, now_ns: int) -> list[Any]:
        return [SetTimer("poll", now_ns + 10 * MS)]

    def invariants(self) -> None:
        pass

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Any]:
        if isinstance(message, TimerFired):
            # Like the node agent: often until the topic's replicas exist, then now and then.
            effects: list[Any] = [SetTimer("poll", now_ns + (1000 if self.created else 100) * MS)]
            if not self.created:
                config = TopicConfig(min_insync_replicas=self.config.min_insync, flush_policy=self.config.flush_policy)
                effects.append(Send(self.coordinator, CreateTopicRequest(
                    correlation_id=1, name=TOPIC, partitions=self.config.partitions,
                    replication_factor=self.config.replication_factor, config=config)))
            effects.append(Send(self.coordinator, NodeAssignmentsRequest(
                correlation_id=2, nodes=list(range(1, self.config.nodes + 1)))))
            return effects
        if isinstance(message, CreateTopicResponse):
            self.created = True
        if isinstance(message, NodeAssignmentsResponse):
            return [Notify("assignments", message.replicas)]
        return []


class Simulator:
    def __init__(self, seed: int, config: SimConfig | None = None) -> None:
        self.seed = seed
        self.config = config or SimConfig()
        self.rng = random.Random(seed)
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
        self.leaders: dict[tuple[str, int, int], int] = {}
        self.high_watermarks: dict[tuple[str, int, int], int] = {}
        self.producing = True
        self.faulting = True
        self.steps = 0
        self.coordinator_endpoint = "sim://coordinator"
        from chaos.sim_disk import DiskFaults

        self.disk = DiskFaults(self, random.Random(self.rng.getrandbits(64)))

    @property
    def now_ns(self) -> int:
        return self.queue.now_ns

    # ------------------------------------------------------------------ building

    def build(self) -> None:
        limits = self.config.limits
        self._add(Host("coordinator", "coordinator", 0,
                       coordinator_factory(list(range(1, self.config.nodes + 1)), limits), fixed_endpoint=True))
        self._add(Host("group-coordinator", "group-coordinator", 0,
                       group_coordinator_factory(self.coordinator_endpoint, limits)))
        self._add(Host("agent", "agent", 0, lambda host, _: TinyAgent(self.coordinator_endpoint, self.config),
                       server=False))
        keys = [f"k{i}" for i in range(self.config.keys)]
        for index in range(self.config.producers):
            name = f"producer-{index + 1}"
            self.shells[name] = ProducerShell(name, TOPIC, keys, random.Random(self.rng.getrandbits(64)),
                                              self.history.append, self.config.records_per_batch, 60_000)
            self._add(Host(name, "producer", 0, self._producer_factory, server=False))
        for index in range(self.config.consumers):
            name = f"consumer-{index + 1}"
            self.shells[name] = ConsumerShell(name, GROUP, TOPIC, self.history.append)
            self._add(Host(name, "consumer", 0, self._consumer_factory, server=False))
        for host in list(self.hosts.values()):
            self._boot(host)

    def _producer_factory(self, host: Host, incarnation: int) -> Any:
        from actors.producer_client import ProducerClient, ProducerSettings

        settings = ProducerSettings(acks=-1, idempotent=True, request_timeout_ms=1000, retry_backoff_ms=50)
        return ProducerClient(bootstrap=self.coordinator_endpoint, settings=settings, name=host.name)

    def _consumer_factory(self, host: Host, incarnation: int) -> Any:
        from actors.consumer_client import ConsumerClient, ConsumerSettings
        from actors.consumer_member import ConsumerMember, GroupSettings

        client = ConsumerClient(bootstrap=self.coordinator_endpoint, settings=ConsumerSettings(
            auto_offset_reset="earliest", fetch_max_wait_ms=200, request_timeout_ms=2000), name=host.name)
        client.member = ConsumerMember(client, GroupSettings(
            group_id=GROUP, client_id=host.name, assignor="cooperative-sticky", session_timeout_ms=1500,
            heartbeat_interval_ms=200, max_poll_interval_ms=30_000, request_timeout_ms=2000))
        return client

    def _add(self, host: Host) -> None:
        self.hosts[host.name] = host
        self.by_routing[host.routing_id] = host

    def _boot(self, host: Host) -> None:
        host.boot(self.rng)
        if host.endpoint:
            self.by_endpoint[host.endpoint] = host
        self._note(f"boot {host.name}#{host.incarnation}")
        self._apply(host, host.actor.start(self.now_ns))
        shell = self.shells.get(host.name)
        if shell is not None:
            self._internal(host, shell.start())

    def _on_assignments(self, replicas: list) -> None:
        for assignment in replicas:
            name = f"replica/{assignment.topic}/{assignment.partition}/n{assignment.node}"
            if name in self.hosts:
                continue
            factory = replica_factory(assignment.topic, assignment.topic_id, assignment.partition, assignment.node,
                                      self.coordinator_endpoint, assignment.config, self.config.limits,
                                      lambda: self.now_ns, assignment.replicas)
            host = Host(name, "replica", assignment.node, factory)
            host.state["topic_partition"] = (assignment.topic, assignment.partition)
            self._add(host)
            self._boot(host)

    # ------------------------------------------------------------------ effects

    def _apply(self, host: Host, effects: list) -> None:
        for effect in effects:
            kind = type(effect)
            if kind is Send:
                self._send(host, effect.to, effect.message)
            elif kind is SetTimer:
                host.timers[effect.name] = effect.deadline_ns
                self.queue.push(effect.deadline_ns, "timer", (host.name, host.incarnation, effect.name, effect.deadline_ns))
            elif kind is CancelTimer:
                host.timers.pop(effect.name, None)
            elif kind is AfterFlush:
                effect.store.flush()  # durable before anything it guards is revealed
                self._apply(host, list(effect.effects))
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

    def _internal(self, host: Host, messages: list) -> None:
        for message in messages:
            if not host.alive:
                return
            self._step(host, message, b"")

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
                     "generation-started", "member-removed"):
            self._note(f"{host.name} {event} {details}")
        if event == "follower-refused-truncation":
            # The follower defended its log: the leader it was told to follow lacks offsets the
            # follower had seen committed. Only a broken election does that (no unclean election runs here).
            self.problems.append(f"{host.name}: leader of epoch {details['leader_epoch']} lacks committed offsets "
                                 f"(it ends at {details['leader_end_offset']}; {details['committed_offset']} were "
                                 f"committed in epoch {details['committed_epoch']})")
        if event == "became-leader":
            key = (details["topic"], details["partition"], details["leader_epoch"])
            previous = self.leaders.setdefault(key, details["node"])
            if previous != details["node"]:
                self.problems.append(f"two leaders for {key[0]}/{key[1]} in epoch {key[2]}: nodes {previous} "
                                     f"and {details['node']}")

    # ------------------------------------------------------------------ network

    def _send(self, host: Host, to: Any, message: Any) -> None:
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
        self._apply(host, actor.handle(message, sender, self.queue.now_ns))
        if host.alive:
            actor = host.actor
            actor.invariants()
            if host.kind == "replica" and actor.leader is not None:
                self._check_high_watermark(host)

    def _check_high_watermark(self, host: Host) -> None:
        actor = host.actor
        key = (actor.topic, actor.partition, actor.leader.epoch)
        previous = self.high_watermarks.get(key, -1)
        if actor.high_watermark < previous:
            self.problems.append(f"{host.name}: high watermark moved back from {previous} to "
                                 f"{actor.high_watermark} in epoch {key[2]}")
        self.high_watermarks[key] = max(previous, actor.high_watermark)

    def _timer(self, name: str, incarnation: int, timer: str, deadline: int) -> None:
        host = self.hosts[name]
        if not host.alive or host.incarnation != incarnation or host.timers.get(timer) != deadline:
            return
        if host.paused_until_ns > self.now_ns:
            self.queue.push(host.paused_until_ns, "timer", (name, incarnation, timer, deadline))
            return
        del host.timers[timer]
        self._step(host, TimerFired(name=timer), b"")

    # ------------------------------------------------------------------ faults

    def crash(self, name: str, restart: bool = True, notify: bool = True) -> None:
        """Kill a host; `notify=False` loses the node agent's exit notice (it died too)."""
        host = self.hosts[name]
        if not host.alive:
            return
        self._note(f"crash {name}#{host.incarnation}")
        shell = self.shells.get(name)
        if shell is not None:
            shell.crashed(self.now_ns)
        endpoint = host.endpoint
        incarnation = getattr(host.actor, "incarnation", 0)
        host.crash()
        for other in self.hosts.values():
            if other.alive and endpoint and endpoint in other.peers:
                other.peers.discard(endpoint)
                self.queue.push(self.now_ns + MS, "disconnect", (other.name, other.incarnation, endpoint))
        if host.kind == "replica" and notify:
            topic, partition = host.state["topic_partition"]
            notice = ReplicaExited(topic=topic, partition=partition, node=host.node, incarnation=incarnation)
            notice_sender = self.hosts["agent"]
            self.queue.push(self.now_ns + 60 * MS, "call", lambda: self._send(notice_sender, self.coordinator_endpoint, notice))
        if restart:
            self.queue.push(self.now_ns + self.config.restart_delay_ms * MS, "call", lambda: self._restart(name))

    def restart(self, name: str) -> None:
        self._restart(name)

    def note(self, line: str) -> None:
        self._note(line)

    def _restart(self, name: str) -> None:
        host = self.hosts[name]
        if not host.alive:
            self._boot(host)

    def _disconnect(self, name: str, incarnation: int, endpoint: str) -> None:
        host = self.hosts[name]
        if host.alive and host.incarnation == incarnation:
            if host.paused_until_ns > self.now_ns:
                self.queue.push(host.paused_until_ns, "disconnect", (name, incarnation, endpoint))
                return
            self._step(host, PeerDisconnected(endpoint=endpoint), b"")

    def _schedule_fault(self) -> None:
        if not self.faulting:
            return
        low, high = self.config.fault_interval_ms
        self.queue.push(self.now_ns + self.rng.randint(low, high) * MS, "call", self._inject_fault)

    def _inject_fault(self) -> None:
        if not self.faulting:
            return
        kind = self.rng.choice(self.config.faults)
        servers = sorted(name for name, host in self.hosts.items() if host.kind not in ("agent",))
        target = self.rng.choice(servers)
        duration_ms = self.rng.randint(200, 2500)
        self.history.append({"type": "fault", "time_ns": self.now_ns, "nemesis": kind, "target": target,
                             "phase": "start"})
        if kind == "crash":
            self.crash(target)
        elif kind == "disk":
            done = self.disk.inject()
            self.history[-1].update(target=self.disk.injected[-1][0] if done else "", fault=done or "none")
        elif kind == "pause":
            host = self.hosts[target]
            host.paused_until_ns = max(host.paused_until_ns, self.now_ns + duration_ms * MS)
            self._note(f"pause {target} for {duration_ms} ms")
        elif kind == "partition":
            self._partition(target, duration_ms)
        elif kind == "network":
            self.network.faults = replace(self.network.faults, drop_probability=0.05, duplicate_probability=0.05,
                                          slow_probability=0.1)
            self._note(f"lossy network for {duration_ms} ms")
            self.queue.push(self.now_ns + duration_ms * MS, "call", self._calm_network)
        self._schedule_fault()

    def _partition(self, target: str, duration_ms: int) -> None:
        names = sorted(self.hosts)
        choice = self.rng.random()
        if choice < 0.4:
            self.network.isolate(target, names)
            self._note(f"isolate {target} for {duration_ms} ms")
        elif choice < 0.7:
            self.network.isolate(target, names, direction=self.rng.choice(("in", "out")))
            self._note(f"one-way cut of {target} for {duration_ms} ms")
        else:
            nodes = list(range(1, self.config.nodes + 1))
            side = set(self.rng.sample(nodes, self.rng.randint(1, len(nodes) - 1)))
            control = self.rng.random() < 0.5
            side_a = [n for n, h in self.hosts.items() if h.node in side or (h.node == 0 and control and h.server)]
            side_b = [n for n, h in self.hosts.items() if h.server and n not in side_a]
            self.network.split(side_a, side_b)
            self._note(f"split {sorted(side_a)} | {sorted(side_b)} for {duration_ms} ms")
        self.queue.push(self.now_ns + duration_ms * MS, "call", self.network.heal)

    def _calm_network(self) -> None:
        self.network.faults = self.config.network

    def heal(self) -> None:
        self.faulting = False
        self.network.heal()
        self._calm_network()
        for host in self.hosts.values():
            host.paused_until_ns = min(host.paused_until_ns, self.now_ns)
        self.history.append({"type": "heal", "time_ns": self.now_ns})
        self._note("heal")

    # ------------------------------------------------------------------ workload

    def _produce_tick(self) -> None:
        if not self.producing:
            return
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
            if isinstance(shell, ConsumerShell) and host.alive and host.paused_until_ns <= self.now_ns:
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
                             "expect_loss": False})
        self.build()
        self.queue.push(self.now_ns + 1500 * MS, "call", self._produce_tick)
        self.queue.push(self.now_ns + 1500 * MS, "call", self._commit_tick)
        if config.faults:
            self.queue.push(self.now_ns + 2000 * MS, "call", self._schedule_fault)
        self.run_until(START_NS + (1500 + config.duration_ms) * MS, config.steps_max)
        self.producing = False
        self.heal()
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


def parse_faults(text: str) -> tuple[str, ...]:
    if text in ("", "none"):
        return ()
    kinds = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [kind for kind in kinds if kind not in FAULT_KINDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault kinds {unknown}; choose from {', '.join(FAULT_KINDS)}")
    return kinds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulator's flags, shared by `python -m chaos.simulator` and `railmq sim`."""
    parser.add_argument("--seed", type=int, default=1, help="the seed of one run (default 1)")
    parser.add_argument("--seeds", type=int, default=0, help="sweep this many seeds starting at --seed")
    parser.add_argument("--duration-ms", type=int, default=SimConfig.duration_ms, help="simulated time with faults")
    parser.add_argument("--steps", type=int, default=0,
                        help="end the faulty phase after about this many steps (0: no limit)")
    parser.add_argument("--faults", type=parse_faults, default=FAULT_KINDS,
                        help=f"comma-separated fault kinds ({','.join(FAULT_KINDS)}) or 'none'")
    parser.add_argument("--quiet", action="store_true", help="print only failures and the summary")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m chaos.simulator", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the seeds `add_arguments` describes (chaos/sim_sweep.py); 1 when any failed."""
    from chaos.sim_sweep import run as run_sweep  # the sweep imports this module

    return run_sweep(args)


if __name__ == "__main__":
    sys.exit(main())
