"""How fast the pure Raft core elects and commits, with no sockets, no clock and no real disk.

    python -m bench.raft [--json PATH] [--repeat N] [--quick]

A quorum of RaftNodes (actors/raft) over RaftLogs on memory disks (storage/raft_log.py over
storage/memory.py: the real record encoding and CRCs, no fsync cost) exchanges messages through
msgspec encoding and decoding, as on the wire, in one thread; `AfterFlush` flushes at once. So the
figures are the protocol's own CPU cost, the ceiling of what one controller process could do
before any I/O, not a cluster's speed.

- elections/s: a follower's election timeout expires (its lease has run out), it pre-votes,
  campaigns, wins, appends its no-op and commits it on a majority; the old leader steps down.
- entries committed/s: the leader proposes 100-byte commands in bursts (1 and 64 proposals before
  the messages flow), until every voter has applied them.
"""

from __future__ import annotations

import random
import time
from collections import deque

import msgspec

from actors.effects import AfterFlush, Send
from actors.messages import TimerFired
from actors.raft import Proposed, RaftConfig, RaftNode, Role
from actors.raft.roles import ELECTION_TIMER
from actors.raft_messages import RaftWireMessage
from bench.common import median_of, parse_args, phase, report
from chaos.sim_raft_checks import DigestStateMachine
from storage.memory import MemoryFileSystem
from storage.raft_log import RaftLog

MS = 1_000_000
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RaftWireMessage)


class Quorum:
    def __init__(self, size: int, **config) -> None:
        self.voters = {node: f"bench://controller-{node}" for node in range(1, size + 1)}
        self.by_endpoint = {address: node for node, address in self.voters.items()}
        self.now_ns = 1_000 * MS
        self.queue: deque = deque()
        self.messages = 0
        self.nodes: dict[int, RaftNode] = {}
        for node in self.voters:
            log = RaftLog.open("/raft", fs=MemoryFileSystem())
            self.nodes[node] = RaftNode(config=RaftConfig(node_id=node, voters=self.voters, **config), log=log,
                                        state_machine=DigestStateMachine(keep_commands=False),
                                        rng=random.Random(node), name=f"controller-{node}")
            self.nodes[node].start(self.now_ns)

    def apply(self, effects: list) -> None:
        for effect in effects:
            if type(effect) is Send:
                self.queue.append((self.by_endpoint[effect.to], _encoder.encode(effect.message)))
            elif type(effect) is AfterFlush:
                effect.store.flush()
                self.apply(list(effect.effects))

    def deliver(self) -> None:
        queue, nodes = self.queue, self.nodes
        while queue:
            node, frame = queue.popleft()
            self.messages += 1
            self.apply(nodes[node].handle(_decoder.decode(frame), b"", self.now_ns))

    def elect(self, node: int) -> None:
        raft = self.nodes[node]
        self.now_ns = max(self.now_ns + 2 * raft.config.election_timeout_ms * MS, raft.election_deadline_ns)
        self.apply(raft.handle(TimerFired(name=ELECTION_TIMER), b"", self.now_ns))
        self.deliver()
        assert raft.role is Role.LEADER, f"controller-{node} was not elected"

    def leader(self) -> RaftNode:
        return next(raft for raft in self.nodes.values() if raft.role is Role.LEADER)


def elections_per_s(size: int, elections: int) -> float:
    quorum = Quorum(size)
    quorum.elect(1)
    started = time.perf_counter()
    for number in range(elections):
        quorum.elect(2 + number % (size - 1) if quorum.leader().id == 1 else 1)
    return elections / (time.perf_counter() - started)


def commits_per_s(size: int, entries: int, burst: int) -> float:
    # Snapshots every 1024 entries, as configured by default: compaction is part of the cost.
    quorum = Quorum(size)
    quorum.elect(1)
    leader = quorum.leader()
    payload = b"x" * 100
    first = leader.log.last_index + 1
    started = time.perf_counter()
    proposed = 0
    while proposed < entries:
        for _ in range(burst):
            result = leader.propose(payload, quorum.now_ns)
            assert isinstance(result, Proposed), result
            quorum.apply(result.effects)
            proposed += 1
        quorum.deliver()
    last = first + entries - 1
    assert all(raft.applied_index >= last for raft in quorum.nodes.values()), "not every voter applied"
    return entries / (time.perf_counter() - started)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    elections = 300 if args.quick else 2000
    entries = 5_000 if args.quick else 40_000
    figures: dict[str, float] = {}
    for size in (3, 5):
        phase(f"{size} voters: elections")
        figures[f"elections_per_s_{size}_voters"] = median_of(args.repeat, lambda: elections_per_s(size, elections),
                                                              label=f"elections {size}")
        for burst in (1, 64):
            phase(f"{size} voters: commits, bursts of {burst}")
            figures[f"entries_committed_per_s_{size}_voters_burst_{burst}"] = median_of(
                args.repeat, lambda: commits_per_s(size, entries, burst), label=f"commits {size}/{burst}")
    report("bench.raft", figures, args, {"elections": elections, "entries": entries, "entry_bytes": 100,
                                         "codec": "msgspec msgpack round trip per message", "disk": "memory"})


if __name__ == "__main__":
    main()
