"""Simulated processes: each `Host` runs one production actor, with its own memory disk.

A host is what the real system calls a process: it has a name, a node, an endpoint per
incarnation (a restarted replica binds a new port in real life, so it gets a new endpoint here;
the coordinator keeps its pinned one), a routing id (what receivers see as the sender), its timers
and a `MemoryFileSystem` that survives crashes minus whatever was not flushed. Actors are built
by the same constructors `transport/actor_main.py` uses, over memory storage.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from actors.limits import Limits
from actors.messages import TopicConfig
from storage.memory import MemoryFileSystem

ActorFactory = Callable[["Host", int], Any]


class Host:
    def __init__(self, name: str, kind: str, node: int, factory: ActorFactory, *, fixed_endpoint: bool = False,
                 server: bool = True) -> None:
        self.name = name
        self.kind = kind
        self.node = node
        self.factory = factory
        self.fixed_endpoint = fixed_endpoint
        self.server = server
        self.fs = MemoryFileSystem()
        self.actor: Any = None
        self.incarnation = 0
        self.alive = False
        self.paused_until_ns = 0
        self.timers: dict[str, int] = {}
        self.endpoint = ""
        self.routing_id = name.encode()
        self.peers: set[str] = set()  # endpoints this incarnation has sent to (its "connections")
        self.state: dict[str, Any] = {}  # per-host scratch space for drivers

    def endpoint_for(self, incarnation: int) -> str:
        if not self.server:
            return ""
        return f"sim://{self.name}" if self.fixed_endpoint else f"sim://{self.name}#{incarnation}"

    def boot(self, rng: random.Random) -> None:
        self.incarnation += 1
        self.endpoint = self.endpoint_for(self.incarnation)
        self.timers = {}
        self.peers = set()
        self.alive = True
        self.actor = self.factory(self, rng.getrandbits(62) + 1)

    def crash(self) -> None:
        self.alive = False
        self.actor = None
        self.timers = {}
        self.fs.crash()


def coordinator_factory(nodes: list[int], limits: Limits) -> ActorFactory:
    def build(host: Host, incarnation: int) -> Any:
        from actors.coordinator import Coordinator
        from storage.state import DurableState

        state = DurableState.open("/coordinator/metadata.state", fs=host.fs)
        return Coordinator(state=state, nodes=nodes, rng=random.Random(incarnation), limits=limits,
                           cluster_id=SIM_CLUSTER_ID)
    return build


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
                    limits: Limits, clock: Callable[[], int], replicas: list[int] = ()) -> ActorFactory:
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
                                findings=opened.findings)
    return build
