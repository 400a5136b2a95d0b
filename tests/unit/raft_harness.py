"""A small deterministic network of RaftNodes for unit tests, in the style of etcd-io/raft's
`network`: tests say which messages flow, which links are cut, when timers fire and when disks
flush, and nothing happens unless they say so.

- Every message is encoded and decoded with msgspec (the Raft union), as on the wire.
- `AfterFlush` is honoured: by default the node's log is flushed and the guarded effects go out
  at once; with `hold_flushes(node)` they wait in `held[node]` until `flush(node)`, so a test can
  look at what a node would say before its disk confirmed (and crash it in between).
- Timers are recorded per node; `fire(node, name)` delivers `TimerFired` at the timer's deadline
  (moving the clock there), and `campaign(node)` fires the election timer past its deadline.
- `crash(node)` loses what was not flushed (`MemoryFileSystem.crash`); `restart(node)` reopens
  the log from that disk and builds a new RaftNode over it.
"""

from __future__ import annotations

import random
from collections import deque

import msgspec

from actors.effects import AfterFlush, CancelTimer, Send, SetTimer, Trace
from actors.messages import TimerFired
from actors.raft import RaftConfig, RaftNode
from actors.raft.roles import ELECTION_TIMER
from actors.raft_messages import RaftWireMessage
from chaos.sim_raft_checks import DigestStateMachine, SafetyChecker
from storage.memory import MemoryFileSystem
from storage.raft_log import RaftEntry, RaftLog

MS = 1_000_000
DIRECTORY = "/controller/raft"
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RaftWireMessage)


def endpoint(node: int) -> str:
    return f"tcp://controller-{node}"


class Net:
    def __init__(self, size: int = 3, *, seed: int = 1, logs: dict[int, list[int]] | None = None,
                 terms: dict[int, int] | None = None, **config) -> None:
        self.size = size
        self.config_fields = config
        self.voters = {node: endpoint(node) for node in range(1, size + 1)}
        self.by_endpoint = {address: node for node, address in self.voters.items()}
        self.now_ns = 1_000 * MS
        self.rng = random.Random(seed)
        self.fs = {node: MemoryFileSystem() for node in self.voters}
        self.nodes: dict[int, RaftNode] = {}
        self.machines: dict[int, DigestStateMachine] = {}
        self.incarnations = {node: 0 for node in self.voters}
        self.timers: dict[int, dict[str, int]] = {node: {} for node in self.voters}
        self.queue: deque[tuple[int, int, object]] = deque()
        self.cut: set[tuple[int, int]] = set()
        self.dropped: list[object] = []
        self.held: dict[int, list] = {node: [] for node in self.voters}
        self.holding: set[int] = set()
        self.traces: list[Trace] = []
        self.sent: list[tuple[int, object]] = []  # (sender, message) of every Send, in order
        self.checker = SafetyChecker()
        for node, entry_terms in (logs or {}).items():
            self.preload(node, entry_terms, (terms or {}).get(node, max(entry_terms, default=0)))
        for node in self.voters:
            self.restart(node)

    def preload(self, node: int, entry_terms: list[int], term: int) -> None:
        """Give `node` a log (one entry per term listed, from index 1) and a term, on its disk."""
        log = RaftLog.open(DIRECTORY, fs=self.fs[node])
        log.append([RaftEntry(index=index, term=entry_term, data=b"i%d-t%d" % (index, entry_term))
                    for index, entry_term in enumerate(entry_terms, start=1)])
        log.set_hard_state(term, 0)
        log.flush()

    # ------------------------------------------------------------------ nodes

    def config(self, node: int) -> RaftConfig:
        return RaftConfig(node_id=node, voters=self.voters, **self.config_fields)

    def restart(self, node: int, *, rejoining: bool = False) -> RaftNode:
        log = RaftLog.open(DIRECTORY, fs=self.fs[node])
        if rejoining:  # what transport/actor_build.py does for a voter whose log was lost
            log.set_rejoining(True)
        machine = DigestStateMachine()
        self.incarnations[node] += 1
        raft = RaftNode(config=self.config(node), log=log, state_machine=machine,
                        rng=random.Random(self.rng.getrandbits(32)), name=f"raft-{node}")
        self.nodes[node], self.machines[node] = raft, machine
        self.timers[node] = {}
        self.apply(node, raft.start(self.now_ns))
        return raft

    def crash(self, node: int) -> None:
        del self.nodes[node]
        self.held[node] = []
        self.timers[node] = {}
        self.queue = deque(item for item in self.queue if item[1] != node)
        self.fs[node].crash()

    # ------------------------------------------------------------------ effects

    def apply(self, node: int, effects: list) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                message = _decoder.decode(_encoder.encode(effect.message))
                self.sent.append((node, message))
                self.queue.append((node, self.by_endpoint[effect.to], message))
            elif isinstance(effect, AfterFlush):
                if node in self.holding:
                    self.held[node].append(effect)
                else:
                    effect.store.flush()
                    self.apply(node, list(effect.effects))
            elif isinstance(effect, SetTimer):
                self.timers[node][effect.name] = effect.deadline_ns
            elif isinstance(effect, CancelTimer):
                self.timers[node].pop(effect.name, None)
            elif isinstance(effect, Trace):
                self.traces.append(effect)
            else:
                self.apply_other(node, effect)
        self.check(node)

    def apply_other(self, node: int, effect: object) -> None:
        raise AssertionError(f"unexpected effect {effect!r}")

    def check(self, node: int) -> None:
        raft = self.nodes.get(node)
        if raft is None:
            return
        raft.invariants()
        self.checker.after_step(node, self.incarnations[node], raft, self.machines[node], self.now_ns)
        assert not self.checker.problems, self.checker.problems

    def hold_flushes(self, node: int) -> None:
        self.holding.add(node)

    def flush(self, node: int) -> None:
        """The node's disk confirms: flush its log and release what waited on it."""
        self.holding.discard(node)
        held, self.held[node] = self.held[node], []
        for effect in held:
            effect.store.flush()
            self.apply(node, list(effect.effects))

    # ------------------------------------------------------------------ the network

    def deliver(self, steps_max: int = 10_000) -> int:
        """Deliver queued messages (first sent, first delivered) until none is left."""
        steps = 0
        while self.queue:
            steps += 1
            assert steps <= steps_max, "livelock: too many messages"
            self.deliver_one()
        return steps

    def deliver_one(self) -> None:
        source, destination, message = self.queue.popleft()
        if (source, destination) in self.cut or destination not in self.nodes:
            self.dropped.append(message)
            return
        self.step(destination, message)

    def step(self, node: int, message: object) -> None:
        self.apply(node, self.nodes[node].handle(message, endpoint(getattr(message, "source", 0)), self.now_ns))

    def take(self, kind: type | None = None) -> list:
        """Remove and return the queued messages of `kind` (all of them when None)."""
        taken = [item[2] for item in self.queue if kind is None or isinstance(item[2], kind)]
        self.queue = deque(item for item in self.queue if not (kind is None or isinstance(item[2], kind)))
        return taken

    def isolate(self, node: int) -> None:
        for other in self.voters:
            if other != node:
                self.cut.update({(node, other), (other, node)})

    def heal(self) -> None:
        self.cut.clear()

    # ------------------------------------------------------------------ time

    def advance(self, milliseconds: float) -> None:
        self.now_ns += int(milliseconds * MS)

    def fire(self, node: int, name: str) -> None:
        deadline = self.timers[node].pop(name)
        self.now_ns = max(self.now_ns, deadline)
        self.step(node, TimerFired(name=name))

    def campaign(self, node: int) -> None:
        """Make `node`'s election timeout expire now (the others' clocks do not matter here)."""
        raft = self.nodes[node]
        self.now_ns = max(self.now_ns, raft.election_deadline_ns)
        self.timers[node].pop(ELECTION_TIMER, None)
        self.step(node, TimerFired(name=ELECTION_TIMER))

    def run_for(self, milliseconds: float) -> None:
        """Let time pass: fire every due timer in deadline order, delivering messages as they go."""
        end = self.now_ns + int(milliseconds * MS)
        while True:
            self.deliver()
            due = [(deadline, node, name) for node, timers in self.timers.items() if node in self.nodes
                   for name, deadline in timers.items() if deadline <= end]
            if not due:
                break
            deadline, node, name = min(due)
            del self.timers[node][name]
            self.now_ns = max(self.now_ns, deadline)
            self.step(node, TimerFired(name=name))
        self.now_ns = end

    # ------------------------------------------------------------------ reading

    def propose(self, node: int, data: bytes):
        result = self.nodes[node].propose(data, self.now_ns)
        if hasattr(result, "effects"):
            self.apply(node, result.effects)
        return result

    def commands(self, node: int) -> list[bytes]:
        return list(self.machines[node].commands)
