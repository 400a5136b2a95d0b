"""Simulated processes: each `Host` runs one production actor, with its own memory disk.

A host is what the real system calls a process: it has a name, a node, an endpoint per
incarnation (a restarted replica binds a new port in real life, so it gets a new endpoint here;
the coordinator keeps its pinned one), a routing id (what receivers see as the sender), its timers
and a `MemoryFileSystem` that survives crashes minus whatever was not flushed. Actors are built
by the same constructors `transport/actor_main.py` uses, over memory storage.

A host also has what the real machine gives a process and the simulator takes away now and then:
a clock (`clock_offset_ns` from the simulator's true time, within the allowed skew), a disk that
may be slow (`disk_latency_ns`: each flush keeps the process busy that long) and a disk that may
see the process killed in the middle of a flush (`SimFaultInjector`).

`TinyAgent` plays the admin and the process half of the node agents: it creates the topics and
reports the replica assignments, for which the simulator starts a host each. The liveness half —
the reports and node heartbeats — is chaos/sim_agents.py's, one agent per node.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Callable

from actors.controller_endpoints import ControllerEndpoints
from actors.effects import Notify, Send, SetTimer
from actors.limits import Limits
from actors.messages import (
    CreateTopicRequest, CreateTopicResponse, NodeAssignmentsRequest, NodeAssignmentsResponse, TimerFired, TopicConfig,
)
from chaos.sim_network import MS
from storage.fs import FaultInjector
from storage.memory import MemoryFileSystem

if TYPE_CHECKING:
    from chaos.sim_config import SimConfig

ActorFactory = Callable[["Host", int], Any]


class SimFaultInjector(FaultInjector):
    """The storage faults, plus a kill in the middle of a flush: once `crash_after_fsyncs` is
    armed (>= 0), that many more fsyncs succeed and the next one fails, so a flush that syncs
    several files (a segment, its index, a checkpoint) leaves some durable and some not. The
    simulator turns the failure into the process's death, as the runtime does."""

    def __init__(self) -> None:
        super().__init__()
        self.crash_after_fsyncs = -1
        self.fsyncs = 0  # every fsync asked for: a slow disk makes a step that synced take time
        # A full disk (the `disk-full` fault): no write may take new space. Overwriting bytes a
        # file already has takes none (ext4, xfs; not a copy-on-write file system).
        self.disk_full = False

    def allows_growth(self, growth_bytes: int) -> bool:
        return growth_bytes <= 0 or not self.disk_full

    def take_fsync_failure(self) -> bool:
        self.fsyncs += 1
        if self.crash_after_fsyncs == 0:
            self.crash_after_fsyncs = -1
            return True
        if self.crash_after_fsyncs > 0:
            self.crash_after_fsyncs -= 1
        return super().take_fsync_failure()


class Host:
    def __init__(self, name: str, kind: str, node: int, factory: ActorFactory, *, fixed_endpoint: bool = False,
                 server: bool = True) -> None:
        self.name = name
        self.kind = kind
        self.node = node
        self.factory = factory
        self.fixed_endpoint = fixed_endpoint
        self.server = server
        self.faults = SimFaultInjector()
        self.fs = MemoryFileSystem(self.faults)
        self.actor: Any = None
        self.incarnation = 0
        self.alive = False
        self.paused_until_ns = 0
        self.timers: dict[str, int] = {}
        self.endpoint = ""
        self.routing_id = name.encode()
        self.reply_address = b""  # what receivers answer to: the routing id and this incarnation
        self.in_cluster = server or kind == "agent"  # holds the cluster secret (a client does not)
        self.peers: set[str] = set()  # endpoints this incarnation has sent to (its "connections")
        self.state: dict[str, Any] = {}  # per-host scratch space for drivers
        self.clock_offset_ns = 0  # this process's clock minus the simulator's true time
        self.disk_latency_ns = 0  # how long one flush keeps the process busy (a slow disk)
        self.flush_done_ns = 0  # when the last flush this incarnation started completes
        self.flushes_pending = 0  # flushes begun and not complete: later ones wait behind them

    def clock_ns(self, true_ns: int) -> int:
        """What this process's clock reads at the simulator's true time `true_ns`."""
        return true_ns + self.clock_offset_ns

    def endpoint_for(self, incarnation: int) -> str:
        if not self.server:
            return ""
        return f"sim://{self.name}" if self.fixed_endpoint else f"sim://{self.name}#{incarnation}"

    def boot(self, rng: random.Random) -> None:
        self.incarnation += 1
        self.endpoint = self.endpoint_for(self.incarnation)
        self.reply_address = self.routing_id + b"#" + str(self.incarnation).encode()
        self.timers = {}
        self.peers = set()
        self.alive = True
        self.actor = self.factory(self, rng.getrandbits(62) + 1)

    def crash(self, keep_writes: bool = False) -> None:
        """The process dies; with `keep_writes` only the process (it exited), not the machine: its
        disk keeps what it wrote but never synced."""
        self.alive = False
        self.actor = None
        self.timers = {}
        self.flush_done_ns = 0
        self.flushes_pending = 0
        self.faults.crash_after_fsyncs = -1
        self.fs.process_exit() if keep_writes else self.fs.crash()


def coordinator_factory(nodes: list[int], limits: Limits) -> ActorFactory:
    def build(host: Host, incarnation: int) -> Any:
        from actors.coordinator import Coordinator
        from storage.state import DurableState

        state = DurableState.open("/coordinator/metadata.state", fs=host.fs, confirm=True)  # as in actor_main
        return Coordinator(state=state, nodes=nodes, rng=random.Random(incarnation), limits=limits,
                           cluster_id=SIM_CLUSTER_ID)
    return build


def controller_factory(node: int, voters: dict[int, str], nodes: list[int], limits: Limits,
                       entry_bytes_max: int = 0) -> ActorFactory:
    """A voter of the controller quorum, as transport/actor_main.py builds it, over the host's
    memory disk (`entry_bytes_max`: see SimConfig). What it applies is kept in
    `host.state["applied"]` for the Raft checker."""
    def build(host: Host, incarnation: int) -> Any:
        from actors.controller import Controller
        from actors.coordinator import Coordinator
        from actors.raft import RaftConfig
        from storage.raft_log import RaftLog

        # A voter whose disk was lost comes back marked rejoining, as transport/actor_build.py opens it.
        log = RaftLog.open(CONTROLLER_DIRECTORY, fs=host.fs,
                           rejoining_if_created=host.state.pop(LOST_DISK, False))
        config = RaftConfig(node_id=node, voters=voters, election_timeout_ms=limits.controller_election_timeout_ms,
                            heartbeat_interval_ms=limits.controller_heartbeat_interval_ms,
                            idle_heartbeat_interval_ms=limits.controller_idle_heartbeat_interval_ms,
                            # one part per append, one append in flight: a leader may die between parts
                            **({"entry_bytes_max": entry_bytes_max, "append_bytes_max": entry_bytes_max,
                                "inflight_appends_max": 1} if entry_bytes_max else {}))
        rng = random.Random(incarnation)

        def coordinator(state: Any) -> Any:
            return Coordinator(state=state, nodes=nodes, rng=random.Random(rng.getrandbits(64)), limits=limits,
                               cluster_id=SIM_CLUSTER_ID)

        controller = Controller(config=config, log=log, rng=rng, coordinator_factory=coordinator,
                                endpoint=host.endpoint, name=host.name)
        host.state["applied"] = controller.applied = []
        return controller
    return build


CONTROLLER_DIRECTORY = "/controller/raft"
LOST_DISK = "lost-disk"  # in a host's state: its disk was lost since it last started


def group_coordinator_factory(coordinator: str, limits: Limits) -> ActorFactory:
    def build(host: Host, incarnation: int) -> Any:
        from actors.group_coordinator import GroupCoordinator
        from storage.state import DurableState

        state = DurableState.open("/group-coordinator/groups.state", fs=host.fs)
        return GroupCoordinator(state=state, coordinator=coordinator, endpoint=host.endpoint,
                                incarnation=incarnation, pid=0, limits=limits, rng=random.Random(incarnation))
    return build


SIM_CLUSTER_ID = "sim"
REPLICA_DIRECTORY = "/replica"


def replica_factory(topic: str, topic_id: int, partition: int, node: int, coordinator: str, config: TopicConfig,
                    limits: Limits, clock: Callable[[], int], replicas: list[int] = (),
                    report_to: str = "") -> ActorFactory:
    def build(host: Host, incarnation: int) -> Any:
        import msgspec

        from actors.partition_replica import PartitionReplica
        from storage.replica_meta import ReplicaMeta, open_replica_directory
        from transport.actor_main import log_config_for

        now_ms = clock() // 1_000_000
        expected = ReplicaMeta(cluster_id=SIM_CLUSTER_ID, topic=topic, topic_id=topic_id, partition=partition,
                               node=node, replicas=list(replicas), config=msgspec.to_builtins(config),
                               created_ms=now_ms)
        opened = open_replica_directory(host.fs, REPLICA_DIRECTORY, expected, log_config_for(config), now_ms)
        return PartitionReplica(topic=topic, topic_id=topic_id, partition=partition, node=node,
                                endpoint=host.endpoint, coordinator=coordinator, log=opened.log, config=config,
                                incarnation=incarnation, pid=0, limits=limits, health=opened.health,
                                findings=opened.findings, report_to=report_to)
    return build


class TinyAgent:
    """The node agent and admin of the simulated cluster: creates the topics, then reports the
    coordinator's replica assignments (the simulator starts a host for each)."""

    name = "agent"

    def __init__(self, coordinator: str, config: "SimConfig", extra_topics: tuple[tuple[str, int], ...] = (),
                 flush_interval_ms: int = 1000) -> None:
        from chaos.sim_config import TOPIC

        self.controllers = ControllerEndpoints(coordinator)
        self.answered = True
        self.config = config
        self.topics = ((TOPIC, config.partitions),) + tuple(extra_topics)
        self.flush_interval_ms = flush_interval_ms
        self.created: set[str] = set()

    def start(self, now_ns: int) -> list[Any]:
        return [SetTimer("poll", now_ns + 10 * MS)]

    def invariants(self) -> None:
        pass

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Any]:
        if isinstance(message, TimerFired):
            # Like the node agent: often until the topics' replicas exist, then now and then.
            done = len(self.created) == len(self.topics)
            effects: list[Any] = [SetTimer("poll", now_ns + (1000 if done else 100) * MS)]
            if not self.answered:
                self.controllers.rotate()  # no answer since the last poll: try the next voter
            self.answered = False
            config = TopicConfig(min_insync_replicas=self.config.min_insync, flush_policy=self.config.flush_policy,
                                 flush_interval_ms=self.flush_interval_ms)
            for index, (name, partitions) in enumerate(self.topics):
                if name not in self.created:
                    effects.append(Send(self.controllers.current, CreateTopicRequest(
                        correlation_id=10 + index, name=name, partitions=partitions,
                        replication_factor=self.config.replication_factor, config=config)))
            effects.append(Send(self.controllers.current, NodeAssignmentsRequest(
                correlation_id=2, nodes=list(range(1, self.config.nodes + 1)))))
            return effects
        self.answered = True
        if self.controllers.take(message):
            return []  # the next poll asks the voter it named
        if isinstance(message, CreateTopicResponse) and 10 <= message.correlation_id < 10 + len(self.topics):
            self.created.add(self.topics[message.correlation_id - 10][0])
        if isinstance(message, NodeAssignmentsResponse):
            return [Notify("assignments", message.replicas)]
        return []
