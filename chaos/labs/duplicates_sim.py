"""Duplicates from crashes between processing and commit, counted on railmq's own state machines.

    result = simulate_duplicates(DuplicatesConfig(messages=1_000_000, crash_probability=0.01))

The question (the design articles' worked example): a consumer commits its offset after
processing, and crashes with probability p right after processing a message, before the commit.
How many messages are processed twice per 1,000,000, when it commits after every message, and
when it commits once per batch of B? The arithmetic is in railmq/sizing.py; this module *runs*
it: the production coordinator, one partition replica, the group coordinator, a producer and a
consumer (ConsumerClient + ConsumerMember, the classic-group member state machine) exchange
every message through the real codec under chaos/sim_network.py's virtual clock, as
chaos/simulator.py does. Only the consumer's shell is written here: it processes each fetched
record in order, draws the crash from a seeded `random.Random`, commits (synchronously, one
commit in flight, as `Consumer.commit` does) after every message or every B messages, and on a
crash the consumer's host dies and restarts as a new process that rejoins the group (static
membership, KIP-345) and resumes from the committed offset — so every replay is what railmq's
group protocol really redelivers.

Invariants: one seed gives one result (every random choice comes from one `random.Random`);
every message is processed at least once (the run ends when the committed offset reaches the
end); duplicates = processings − messages.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from actors.effects import AfterFlush, CancelTimer, Crash, Exit, Notify, Send, SetTimer, Trace
from actors.limits import Limits
from actors.messages import ClientCommand, PeerDisconnected, RefreshMetadata, SendBatch, TimerFired
from chaos.sim_hosts import Host, coordinator_factory, group_coordinator_factory, replica_factory
from chaos.sim_network import MS, EventQueue, Network
from chaos.simulator import START_NS, SimConfig, TinyAgent
from chaos.simulator import TOPIC as TOPIC  # the topic TinyAgent creates
from railmq.records import decode_fetched
from transport.codec import Codec

GROUP = "workers"
# Records per produced batch: large batches make producing a small part of the run.
PRODUCE_BATCH_RECORDS = 2000
# Fetched data after a crash is fetched again: small fetches keep that waste small.
FETCH_BYTES_MAX = 8 * 1024
# A crashed consumer process comes back this long after (virtual time: costs nothing real).
RESTART_DELAY_MS = 200
# Short timeouts keep a restart cheap in simulated events; the group waits for nobody else.
SIM_LIMITS = Limits(replica_session_timeout_ms=1000, replica_lag_time_max_ms=1500,
                    coordinator_election_grace_ms=100, group_initial_rebalance_delay_ms=0,
                    partition_creation_grace_ms=100)
# The run gives up (a bug, never an answer) after this much simulated time per message.
SIMULATED_MS_PER_MESSAGE_MAX = 50


class SimulationStuck(RuntimeError):
    """The simulated consumer stopped making progress: a bug in the driver or the actors."""


@dataclass(frozen=True)
class DuplicatesConfig:
    messages: int = 1_000_000
    crash_probability: float = 0.01
    commit_every: int = 1  # 1: commit after every message; B: after every B messages
    seed: int = 1

    def __post_init__(self) -> None:
        if self.messages < 1 or self.commit_every < 1:
            raise ValueError("messages and commit_every must be at least 1")
        if not 0.0 <= self.crash_probability < 1.0:
            raise ValueError(f"the crash probability is in [0, 1), not {self.crash_probability}")


@dataclass(frozen=True)
class DuplicatesResult:
    config: DuplicatesConfig
    processings: int
    crashes: int
    commits: int
    simulated_s: float
    wall_s: float
    events: int

    @property
    def duplicates(self) -> int:
        return self.processings - self.config.messages

    @property
    def duplicates_per_crash(self) -> float:
        return self.duplicates / self.crashes if self.crashes else 0.0


class CrashingWorker:
    """The consumer's shell: process in offset order, maybe crash, commit by the policy."""

    def __init__(self, config: DuplicatesConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        self.processings = 0
        self.crashes = 0
        self.commits = 0
        self.committed = 0  # the group's committed offset, as acknowledged
        self.reset()

    def reset(self) -> None:
        """A new process: nothing in memory but what the group and the log will tell it."""
        self.position: int | None = None  # the next offset to take from the fetched data
        self.fetched_end = 0  # fetched records not processed yet: [position, fetched_end)
        self.chunks: deque[tuple[int, int]] = deque()  # (end offset, bytes) to report as consumed
        self.since_commit = 0
        self.commit_in_flight = False
        self.tokens = 0

    def start(self) -> list[Any]:
        return [ClientCommand(command="subscribe", arguments={"topics": [TOPIC]})]

    def on_notify(self, kind: str, payload: Any) -> tuple[list[Any], bool]:
        """(internal messages for the actor, whether the process crashes now)."""
        if kind == "position":
            self.position = self.fetched_end = payload[3]
            return [], False
        if kind == "records":
            return self._on_records(payload)
        if kind == "result":
            return self._on_commit_result(payload)
        if kind == "revoke":
            return [ClientCommand(command="revoked")], False
        return [], False

    def _on_records(self, payload: Any) -> tuple[list[Any], bool]:
        topic, partition, _, batches, _, _ = payload
        if self.position is None:
            return [ClientCommand(command="consumed", arguments={"bytes": len(batches)})], False
        records = decode_fetched(topic, partition, batches, self.fetched_end)
        if not records:
            return [ClientCommand(command="consumed", arguments={"bytes": len(batches)})], False
        self.fetched_end = records[-1].offset + 1
        self.chunks.append((self.fetched_end, len(batches)))
        commands, crashed = self._work()
        return [ClientCommand(command="polled")] + commands, crashed

    def _work(self) -> tuple[list[Any], bool]:
        """Process fetched records until a commit must be awaited or the process crashes.
        A fetched chunk is reported consumed once processed, so the client's bounded buffer
        (one fetch) lets it fetch the next: the consumer never reads far ahead of its work."""
        if self.commit_in_flight or self.position is None:
            return [], False
        probability = self.config.crash_probability
        random_value = self.rng.random
        commands: list[Any] = []
        while self.position < self.fetched_end:
            offset = self.position
            self.position += 1
            self.processings += 1
            if probability and random_value() < probability:
                self.crashes += 1
                return [], True  # after processing, before the commit: the whole point
            while self.chunks and self.chunks[0][0] <= self.position:
                commands.append(ClientCommand(command="consumed",
                                              arguments={"bytes": self.chunks.popleft()[1]}))
            self.since_commit += 1
            if self.since_commit >= self.config.commit_every or offset + 1 >= self.config.messages:
                return commands + self._commit(offset + 1), False
        return commands, False

    def _commit(self, offset: int) -> list[Any]:
        self.commit_in_flight = True
        self.since_commit = 0
        self.tokens += 1
        self.commits += 1
        return [ClientCommand(command="commit", arguments={"offsets": [[TOPIC, 0, offset, ""]]},
                              token=self.tokens)]

    def _on_commit_result(self, payload: Any) -> tuple[list[Any], bool]:
        token, offsets, error = payload
        if token != self.tokens or not self.commit_in_flight:
            return [], False
        self.commit_in_flight = False
        if error is None and offsets:
            self.committed = max(self.committed, max(entry.offset for entry in offsets))
        commands, crashed = self._work()
        return commands, crashed


class DuplicatesSimulation:
    def __init__(self, config: DuplicatesConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.queue = EventQueue()
        self.queue.now_ns = START_NS
        self.network = Network(random.Random(self.rng.getrandbits(64)))
        self.codec = Codec()
        self.hosts: dict[str, Host] = {}
        self.by_endpoint: dict[str, Host] = {}
        self.by_routing: dict[bytes, Host] = {}
        self.worker = CrashingWorker(config, random.Random(self.rng.getrandbits(64)))
        self.produced = 0
        self.partition_known = False
        self.refresh_scheduled = False
        self.events = 0
        self.coordinator_endpoint = "sim://coordinator"

    # ------------------------------------------------------------------ hosts

    def build(self) -> None:
        topology = SimConfig(nodes=1, partitions=1, replication_factor=1, min_insync=1, flush_policy="never")
        self._add(Host("coordinator", "coordinator", 0, coordinator_factory([1], SIM_LIMITS),
                       fixed_endpoint=True))
        self._add(Host("group-coordinator", "group-coordinator", 0,
                       group_coordinator_factory(self.coordinator_endpoint, SIM_LIMITS)))
        self._add(Host("agent", "agent", 0, lambda host, _: TinyAgent(self.coordinator_endpoint, topology),
                       server=False))
        self._add(Host("producer", "producer", 0, self._producer, server=False))
        self._add(Host("consumer", "consumer", 0, self._consumer, server=False))
        for host in list(self.hosts.values()):
            if host.name != "consumer":  # it starts once the topic has a leader (it subscribes to it)
                self._boot(host)

    def _producer(self, host: Host, incarnation: int) -> Any:
        from actors.producer_client import ProducerClient, ProducerSettings

        settings = ProducerSettings(acks=1, request_timeout_ms=5000, retry_backoff_ms=50)
        return ProducerClient(bootstrap=self.coordinator_endpoint, settings=settings, name="producer")

    def _consumer(self, host: Host, incarnation: int) -> Any:
        from actors.consumer_client import ConsumerClient, ConsumerSettings
        from actors.consumer_member import ConsumerMember, GroupSettings

        client = ConsumerClient(bootstrap=self.coordinator_endpoint, settings=ConsumerSettings(
            auto_offset_reset="earliest", fetch_max_wait_ms=100, request_timeout_ms=2000,
            fetch_partition_bytes_max=FETCH_BYTES_MAX, buffer_bytes_max=FETCH_BYTES_MAX), name="consumer")
        client.member = ConsumerMember(client, GroupSettings(
            group_id=GROUP, group_instance_id="worker-1", client_id="consumer", session_timeout_ms=1000,
            heartbeat_interval_ms=300, max_poll_interval_ms=3_600_000, request_timeout_ms=2000))
        return client

    def _add(self, host: Host) -> None:
        self.hosts[host.name] = host
        self.by_routing[host.routing_id] = host

    def _boot(self, host: Host) -> None:
        host.boot(self.rng)
        if host.endpoint:
            self.by_endpoint[host.endpoint] = host
        self._apply(host, host.actor.start(self.queue.now_ns))
        if host.name == "consumer":
            self.worker.reset()
            self._internal(host, self.worker.start())
        elif host.name == "producer":
            self._internal(host, [RefreshMetadata(topics=[TOPIC])])

    def _on_assignments(self, replicas: list) -> None:
        for assignment in replicas:
            name = f"replica/{assignment.topic}/{assignment.partition}/n{assignment.node}"
            if name in self.hosts:
                continue
            factory = replica_factory(assignment.topic, assignment.topic_id, assignment.partition,
                                      assignment.node,
                                      self.coordinator_endpoint, assignment.config, SIM_LIMITS,
                                      lambda: self.queue.now_ns)
            host = Host(name, "replica", assignment.node, factory)
            self._add(host)
            self._boot(host)

    def _crash_consumer(self) -> None:
        host = self.hosts["consumer"]
        host.crash()
        self.queue.push(self.queue.now_ns + RESTART_DELAY_MS * MS, "call", lambda: self._boot(host))

    # ------------------------------------------------------------------ effects and messages

    def _apply(self, host: Host, effects: list) -> None:
        for effect in effects:
            kind = type(effect)
            if kind is Send:
                self._send(host, effect.to, effect.message)
            elif kind is SetTimer:
                host.timers[effect.name] = effect.deadline_ns
                self.queue.push(effect.deadline_ns, "timer", (host.name, host.incarnation, effect.name,
                                                              effect.deadline_ns))
            elif kind is CancelTimer:
                host.timers.pop(effect.name, None)
            elif kind is AfterFlush:
                effect.store.flush()
                self._apply(host, list(effect.effects))
            elif kind is Notify:
                self._on_notify(host, effect.kind, effect.payload)
                if not host.alive:
                    return
            elif kind is Crash or kind is Exit:
                raise SimulationStuck(f"{host.name} stopped: {effect.reason}")
            elif kind is not Trace:
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
        elif host.name == "producer":
            self._on_producer_notify(host, kind, payload)
        elif host.name == "consumer":
            commands, crashed = self.worker.on_notify(kind, payload)
            if crashed:
                self._crash_consumer()
            else:
                self._internal(host, commands)

    def _on_producer_notify(self, host: Host, kind: str, payload: Any) -> None:
        if kind == "metadata":
            if self.partition_known:
                return
            if any(topic.name == TOPIC and topic.error == 0 and topic.partitions[0].leader_endpoint
                   for topic in payload):
                self.partition_known = True
                self._produce_next(host)
                self._boot(self.hosts["consumer"])
            elif not self.refresh_scheduled:
                self.refresh_scheduled = True
                self.queue.push(self.queue.now_ns + 50 * MS, "call", lambda: self._refresh(host))
        elif kind == "batch-done":
            if payload[3] is not None:
                raise SimulationStuck(f"a produce failed: {payload[3]}")
            self._produce_next(host)

    def _refresh(self, host: Host) -> None:
        self.refresh_scheduled = False
        self._internal(host, [RefreshMetadata(topics=[TOPIC])])

    def _produce_next(self, host: Host) -> None:
        count = min(PRODUCE_BATCH_RECORDS, self.config.messages - self.produced)
        if count <= 0:
            return
        now_ms = self.queue.now_ns // MS
        records = [(0, None, b"m", None)] * count
        self.produced += count
        self._internal(host, [SendBatch(batch_id=self.produced, topic=TOPIC, partition=0, records=records,
                                        first_timestamp_ms=now_ms, max_timestamp_ms=now_ms,
                                        deadline_ns=self.queue.now_ns + 60_000 * MS)])

    def _send(self, host: Host, to: Any, message: Any) -> None:
        frames = self.codec.encode(message)
        if len(frames) > 1:
            frames = [bytes(frame) for frame in frames]
        if isinstance(to, str):
            destination = self.by_endpoint.get(to)
            sender: Any = host.routing_id
            if destination is None or not destination.alive or destination.endpoint != to:
                self.queue.push(self.queue.now_ns + MS, "disconnect", (host.name, host.incarnation, to))
                return
        else:
            destination = self.by_routing.get(to)
            sender = host.endpoint
        if destination is None:
            return
        target = to if isinstance(to, str) else destination.incarnation
        for arrival in self.network.plan(host.name, destination.name, self.queue.now_ns):
            self.queue.push(arrival, "deliver", (destination.name, target, sender, frames))

    def _deliver(self, name: str, target: Any, sender: Any, frames: list) -> None:
        host = self.hosts[name]
        if not host.alive:
            return
        if isinstance(target, str) and target != host.endpoint:
            return
        if isinstance(target, int) and target != host.incarnation:
            return  # a reply to a process that has since died
        self._step(host, self.codec.decode(frames), sender)

    def _step(self, host: Host, message: Any, sender: Any) -> None:
        self.events += 1
        self._apply(host, host.actor.handle(message, sender, self.queue.now_ns))

    def _timer(self, name: str, incarnation: int, timer: str, deadline: int) -> None:
        host = self.hosts[name]
        if not host.alive or host.incarnation != incarnation or host.timers.get(timer) != deadline:
            return
        del host.timers[timer]
        self._step(host, TimerFired(name=timer), b"")

    def _disconnect(self, name: str, incarnation: int, endpoint: str) -> None:
        host = self.hosts[name]
        if host.alive and host.incarnation == incarnation:
            self._step(host, PeerDisconnected(endpoint=endpoint), b"")

    # ------------------------------------------------------------------ running

    def run(self) -> DuplicatesResult:
        started = time.perf_counter()
        self.build()
        limit_ns = START_NS + (10_000 + self.config.messages * SIMULATED_MS_PER_MESSAGE_MAX) * MS
        queue = self.queue
        while self.worker.committed < self.config.messages:
            event = queue.pop_due(limit_ns)
            if event is None:
                raise SimulationStuck(f"committed {self.worker.committed} of {self.config.messages} "
                                      f"by {(queue.now_ns - START_NS) / 1e9:.0f} simulated s")
            kind, payload = event
            if kind == "deliver":
                self._deliver(*payload)
            elif kind == "timer":
                self._timer(*payload)
            elif kind == "disconnect":
                self._disconnect(*payload)
            else:
                payload()
        worker = self.worker
        return DuplicatesResult(self.config, worker.processings, worker.crashes, worker.commits,
                                (queue.now_ns - START_NS) / 1e9, time.perf_counter() - started, self.events)


def simulate_duplicates(config: DuplicatesConfig) -> DuplicatesResult:
    return DuplicatesSimulation(config).run()
