"""Three (or five) `Controller`s on a deterministic network, for unit tests of the quorum with the
real coordinator inside (actors/controller.py).

Messages are encoded and decoded through the real codec's union on the way (as on the wire); links
can be cut; `AfterFlush` flushes the store at once; timers are kept per controller and fired in
deadline order by `run_for`; `crash(node)` loses what its disk never flushed and `restart(node)`
builds a new Controller over that disk. A "client" is any endpoint string that is not a voter:
what reaches it is recorded in `inbox[client]`.
"""

from __future__ import annotations

import random
from collections import deque

from actors.controller import Controller
from actors.coordinator import Coordinator
from actors.group_coordinator import GroupCoordinator
from actors.group_quorum import GroupQuorumVoter
from actors.effects import AfterFlush, CancelTimer, Send, SetTimer, Trace
from actors.limits import Limits
from actors.messages import TimerFired
from actors.raft import RaftConfig
from actors.raft.roles import Role
from storage.memory import MemoryFileSystem
from storage.raft_log import RaftLog
from transport.codec import Codec

MS = 1_000_000
DIRECTORY = "/controller/raft"
CLUSTER_ID = "cluster-test"
METADATA_CONTROLLER = "tcp://metadata-controller"  # where a group voter announces itself: a client here


def voter_endpoint(node: int) -> str:
    return f"tcp://controller-{node}"


class ControllerNet:
    def __init__(self, size: int = 3, *, seed: int = 1, nodes: list[int] | None = None,
                 limits: Limits | None = None, groups: bool = False, **raft_fields) -> None:
        self.voters = {node: voter_endpoint(node) for node in range(1, size + 1)}
        self.by_endpoint = {address: node for node, address in self.voters.items()}
        self.nodes = nodes or [1, 2, 3]
        self.limits = limits or Limits()
        self.raft_fields = raft_fields
        self.groups = groups  # the group-coordination quorum (GroupQuorumVoter over a GroupCoordinator) instead
        self.cluster_id = CLUSTER_ID  # what each controller's coordinator is told it runs (cluster.meta's)
        self.rng = random.Random(seed)
        self.now_ns = 1_000 * MS
        self.codec = Codec()
        self.fs = {node: MemoryFileSystem() for node in self.voters}
        self.controllers: dict[int, Controller] = {}
        self.timers: dict[int, dict[str, int]] = {node: {} for node in self.voters}
        self.queue: deque[tuple[str, str, object]] = deque()  # (from, to, message)
        self.cut: set[tuple[str, str]] = set()
        self.inbox: dict[str, list] = {}
        self.traces: list[Trace] = []
        self.bootstrap: dict[int, list] = {}
        for node in self.voters:
            self.restart(node)

    # ------------------------------------------------------------------ controllers

    def restart(self, node: int) -> Controller:
        log = RaftLog.open(DIRECTORY, fs=self.fs[node])
        config = RaftConfig(node_id=node, voters=self.voters, **self.raft_fields)
        seed = self.rng.getrandbits(32)

        def factory(state):
            if self.groups:
                return GroupCoordinator(state=state, coordinator=METADATA_CONTROLLER, endpoint=voter_endpoint(node),
                                        incarnation=seed + 1, limits=self.limits, rng=random.Random(seed))
            return Coordinator(state=state, nodes=self.nodes, rng=random.Random(seed), limits=self.limits,
                               cluster_id=self.cluster_id)

        kind = GroupQuorumVoter if self.groups else Controller
        controller = kind(config=config, log=log, rng=random.Random(seed), coordinator_factory=factory,
                          pid=1000 + node, bootstrap=self.bootstrap.get(node))
        self.controllers[node] = controller
        self.timers[node] = {}
        self._apply(voter_endpoint(node), controller.start(self.now_ns))
        return controller

    def crash(self, node: int) -> None:
        self.controllers.pop(node)
        self.timers[node] = {}
        self.queue = deque(item for item in self.queue if item[1] != voter_endpoint(node))
        self.fs[node].crash()

    def active(self) -> list[int]:
        return [node for node, controller in self.controllers.items() if controller.coordinator is not None]

    def leader(self) -> int:
        leaders = [node for node, c in self.controllers.items() if c.raft.role is Role.LEADER]
        assert len(leaders) <= 1 or len({self.controllers[n].raft.term for n in leaders}) == len(leaders)
        return leaders[0] if leaders else 0

    # ------------------------------------------------------------------ effects

    def _apply(self, source: str, effects: list) -> None:
        node = self.by_endpoint.get(source)
        for effect in effects:
            if isinstance(effect, Send):
                frames = self.codec.encode(effect.message)
                message = self.codec.decode([bytes(frame) for frame in frames])
                self.queue.append((source, effect.to, message))
            elif isinstance(effect, AfterFlush):
                effect.store.flush()
                self._apply(source, list(effect.effects))
            elif isinstance(effect, SetTimer):
                self.timers[node][effect.name] = effect.deadline_ns
            elif isinstance(effect, CancelTimer):
                self.timers[node].pop(effect.name, None)
            elif isinstance(effect, Trace):
                self.traces.append(effect)
        if node in self.controllers:
            self.controllers[node].invariants()

    def send(self, client: str, node: int, message: object) -> None:
        self.queue.append((client, voter_endpoint(node), message))

    def deliver(self, steps_max: int = 100_000) -> None:
        steps = 0
        while self.queue:
            steps += 1
            assert steps <= steps_max, "livelock"
            source, destination, message = self.queue.popleft()
            if (source, destination) in self.cut:
                continue
            node = self.by_endpoint.get(destination)
            if node is None:
                self.inbox.setdefault(destination, []).append(message)
            elif node in self.controllers:
                self._apply(destination, self.controllers[node].handle(message, source, self.now_ns))

    def run_for(self, milliseconds: float) -> None:
        end = self.now_ns + int(milliseconds * MS)
        while True:
            self.deliver()
            due = [(deadline, node, name) for node, timers in self.timers.items() if node in self.controllers
                   for name, deadline in timers.items() if deadline <= end]
            if not due:
                break
            deadline, node, name = min(due)
            del self.timers[node][name]
            self.now_ns = max(self.now_ns, deadline)
            self._apply(voter_endpoint(node), self.controllers[node].handle(TimerFired(name=name), "", self.now_ns))
        self.now_ns = end

    def run_until_active(self, bound_ms: int = 5_000) -> int:
        for _ in range(bound_ms // 10):
            self.run_for(10)
            if self.active():
                return self.active()[0]
        raise AssertionError(f"no active controller within {bound_ms} ms")

    # ------------------------------------------------------------------ links

    def isolate(self, node: int) -> None:
        me = voter_endpoint(node)
        for other in self.voters.values():
            if other != me:
                self.cut.update({(me, other), (other, me)})

    def heal(self) -> None:
        self.cut.clear()

    def answers(self, client: str) -> list:
        return self.inbox.pop(client, [])
