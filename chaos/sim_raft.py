"""A deterministic simulation of a controller quorum alone: 3 or 5 RaftNodes, a faulty network,
disks that flush late or lose what they had not flushed, crashes and restarts.

    python -m chaos.sim_raft --seed 7 [--voters 5] [--variant vote-twice] [--sweep 200]   # chaos/sim_raft_sweep.py

It runs the production classes (actors/raft, storage/raft_log.RaftLog over storage.memory's
MemoryFileSystem) with a virtual clock (chaos.sim_network.EventQueue); one `random.Random(seed)`
decides everything, so a failure replays from its seed. Faults, during `duration_ms`:

- network: messages dropped, duplicated, delayed, and (on seeds that do not keep links FIFO, as
  ZeroMQ over TCP would) reordered within a link; partitions that isolate one voter (the leader
  half the time, one way or both) or split the voters into a minority and a majority;
- crashes: a voter (the leader half the time, or one whose flush is still pending) dies at once:
  its timers, its queued effects and every unflushed byte are gone; it restarts later from what
  its disk kept (RaftLog.open), with a new incarnation;
- disks: `AfterFlush` is not instant here: the flush completes a random 0.1-5 ms later (now and
  then 50 ms), and the guarded effects go out only then, so "reply only after the vote is
  durable" is tested against crashes in between;
- lost disks (`wipe`, on when listed in `faults`): a voter crashes and comes back with an empty
  disk, so its journal is created again with the rejoining mark (docs/raft.md §7), as
  transport/actor_build.py creates it for a voter whose quorum had formed. Its votes and
  acknowledgements before the loss are void, which is what the mark must make harmless.

A client proposes a command every few milliseconds to the voter it believes leads, following
NOT_CONTROLLER hints. After every step, chaos.sim_raft_checks.SafetyChecker checks election
safety, log matching, leader completeness and state-machine safety. After the faulty phase the
network heals and every voter restarts: a leader must be elected within `liveness_bound_ms`, and
a command proposed after that must be applied by every voter before the run ends.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass, field

import msgspec

from actors.effects import AfterFlush, CancelTimer, Send, SetTimer, Trace
from actors.messages import PeerDisconnected, TimerFired
from actors.raft import NotController, Proposed, RaftConfig, RaftNode
from actors.raft.roles import Role
from actors.raft_messages import RaftAppendResponse, RaftVoteResponse, RaftWireMessage
from chaos.sim_network import MS, EventQueue
from chaos.sim_raft_checks import DigestStateMachine, SafetyChecker, check_commit_survives, check_promises
from chaos.sim_raft_config import RaftSimConfig, RaftSimResult
from chaos.sim_raft_faults import FaultRules
from storage.memory import MemoryFileSystem
from storage.raft_log import RaftLog

DIRECTORY = "/controller/raft"
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RaftWireMessage)


@dataclass
class Voter:
    node_id: int
    fs: MemoryFileSystem = field(default_factory=MemoryFileSystem)
    raft: RaftNode | None = None
    machine: DigestStateMachine | None = None
    incarnation: int = 0
    timers: dict = field(default_factory=dict)
    held: list = field(default_factory=list)  # AfterFlush effects waiting for the disk
    flush_due: bool = False
    promised_vote: tuple[int, int] = (0, 0)  # (term, candidate) of the last vote it granted
    promised_match: int = 0  # the match index of the last append it acknowledged
    durable_up: tuple[int, int] = (0, 0)  # (last term, last index) of the log its disk holds
    durable_rejoining: bool = False  # its disk holds the rejoining mark
    wiped: bool = False  # its disk was lost: the next boot creates the journal marked rejoining
    leader_commit_checked: int = 0


class RaftSimulation(FaultRules):
    def __init__(self, seed: int, config: RaftSimConfig | None = None) -> None:
        self.seed = seed
        self.config = config or RaftSimConfig()
        self.rng = random.Random(seed)
        self.queue = EventQueue()
        self.voters = {node: Voter(node) for node in range(1, self.config.voters + 1)}
        self.endpoints = {node: f"sim://controller-{node}" for node in self.voters}
        self.by_endpoint = {address: node for node, address in self.endpoints.items()}
        self.raft_config = self._choose_raft_config()
        self.fifo_links = self.rng.random() < 0.5
        self.link_free_ns: dict[tuple[int, int], int] = {}
        self.blocked: dict[tuple[int, int], int] = {}  # link -> how many cuts hold it
        self.network_scale = 1.0
        self.checker = SafetyChecker()
        self.steps = 0
        self.elections = 0
        self.wipes = 0
        self.wipe_at_commit = 0  # a leader to wipe when its commit index next moves
        self.proposal_sequence = 0
        self.client_target = 1
        self.trace: list[str] = []
        self.fingerprint = hashlib.blake2b(digest_size=16)
        self.faulty = True
        self.after_heal_proposals: list[tuple[int, int]] = []

    def _choose_raft_config(self) -> dict:
        c, pick = self.config, self.rng.choice
        return dict(election_timeout_ms=c.election_timeout_ms, heartbeat_interval_ms=c.heartbeat_interval_ms,
                    idle_heartbeat_interval_ms=c.idle_heartbeat_interval_ms,
                    append_entries_max=pick(c.append_entries_max), inflight_appends_max=pick(c.inflight_appends_max),
                    snapshot_interval_entries=pick(c.snapshot_interval_entries),
                    snapshot_trailing_entries=pick(c.snapshot_trailing_entries),
                    **({"snapshot_chunk_bytes": c.snapshot_chunk_bytes} if c.snapshot_chunk_bytes else {}),
                    **({"snapshot_interval_bytes": c.snapshot_interval_bytes,
                        "snapshot_trailing_bytes": c.snapshot_interval_bytes // 2}
                       if c.snapshot_interval_bytes else {}),
                    **({"uncommitted_bytes_max": c.uncommitted_bytes_max} if c.uncommitted_bytes_max else {}))

    # ------------------------------------------------------------------ voters

    def boot(self, node: int) -> None:
        voter = self.voters[node]
        voter.incarnation += 1
        voter.timers, voter.held, voter.flush_due = {}, [], False
        log = RaftLog.open(DIRECTORY, fs=voter.fs, rejoining_if_created=voter.wiped)
        voter.wiped = False
        check_promises(self.checker, voter, log)
        voter.durable_up = (log.last_term, log.last_index)
        voter.durable_rejoining = log.rejoining
        voter.leader_commit_checked = 0
        voter.machine = DigestStateMachine(keep_commands=False)
        config = RaftConfig(node_id=node, voters=self.endpoints, **self.raft_config)
        voter.raft = RaftNode(config=config, log=log, state_machine=voter.machine,
                              rng=random.Random(self.rng.getrandbits(64)), name=f"controller-{node}")
        self._note(f"controller-{node} starts (incarnation {voter.incarnation}, term {voter.raft.term})")
        self._apply(voter, voter.raft.start(self.queue.now_ns))

    def crash(self, node: int) -> None:
        voter = self.voters[node]
        if voter.raft is None:
            return
        self._note(f"controller-{node} crashes ({len(voter.held)} flushes pending)")
        voter.raft = voter.machine = None
        voter.timers, voter.held, voter.flush_due = {}, [], False
        voter.fs.crash()
        if self.config.disconnect_on_crash:
            for other in self.voters:
                if other != node and (other, node) not in self.blocked:
                    delay = self.rng.uniform(*self.config.delay_ms)
                    self.queue.push(self.queue.now_ns + int(delay * MS), "disconnect", (other, self.endpoints[node]))

    # ------------------------------------------------------------------ effects

    def _apply(self, voter: Voter, effects: list) -> None:
        for effect in effects:
            kind = type(effect)
            if kind is Send:
                self._send(voter.node_id, effect.to, effect.message)
            elif kind is AfterFlush:
                voter.held.append(effect)
                if not voter.flush_due:
                    voter.flush_due = True
                    self.queue.push(self.queue.now_ns + self._flush_delay_ns(), "flush",
                                    (voter.node_id, voter.incarnation))
            elif kind is SetTimer:
                voter.timers[effect.name] = effect.deadline_ns
                self.queue.push(effect.deadline_ns, "timer", (voter.node_id, voter.incarnation, effect.name,
                                                              effect.deadline_ns))
            elif kind is CancelTimer:
                voter.timers.pop(effect.name, None)
            elif kind is Trace:
                if effect.event == "raft_role":
                    self._on_role(effect.details)
            else:
                raise AssertionError(f"unexpected effect {effect!r}")

    def _flush_delay_ns(self) -> int:
        c = self.config
        if self.faulty and self.rng.random() < c.slow_flush_probability:
            return int(self.rng.uniform(1.0, c.slow_flush_ms) * MS)
        return int(self.rng.uniform(*c.flush_delay_ms) * MS)

    def _send(self, source: int, address: str, message) -> None:
        destination = self.by_endpoint[address]
        if isinstance(message, RaftVoteResponse) and message.granted and not message.pre_vote:
            self.voters[source].promised_vote = (message.term, destination)
        elif isinstance(message, RaftAppendResponse) and message.success:
            self.voters[source].promised_match = message.match_index
        frame = _encoder.encode(message)
        if (source, destination) in self.blocked:
            return
        c, random_ = self.config, self.rng.random
        copies = 1
        if self.faulty:
            if random_() < c.drop_probability * self.network_scale:
                return
            if random_() < c.duplicate_probability * self.network_scale:
                copies = 2
        for _ in range(copies):
            low, high = c.delay_ms
            delay = low + (high - low) * self.network_scale * random_()
            arrival = self.queue.now_ns + int(delay * MS)
            if self.fifo_links:
                link = (source, destination)
                arrival = max(arrival, self.link_free_ns.get(link, 0) + 1)
                self.link_free_ns[link] = arrival
            self.queue.push(arrival, "deliver", (destination, frame))

    # ------------------------------------------------------------------ steps

    def _step(self, voter: Voter, message) -> None:
        self.steps += 1
        raft = voter.raft
        effects = raft.handle(message, self.endpoints.get(getattr(message, "source", 0), b""), self.queue.now_ns)
        self._apply(voter, effects)
        self._check(voter)

    def _check(self, voter: Voter) -> None:
        raft = voter.raft
        if raft is None:
            return
        try:
            raft.invariants()
        except AssertionError as error:
            self.checker.fail(f"controller-{voter.node_id} invariant: {error}")
        self.checker.after_step(voter.node_id, voter.incarnation, raft, voter.machine, self.queue.now_ns)
        log = raft.log
        if not log.needs_flush:
            voter.durable_up = (log.last_term, log.last_index)
            voter.durable_rejoining = log.rejoining
        if raft.role is Role.LEADER and raft.commit_index > voter.leader_commit_checked:
            voter.leader_commit_checked = raft.commit_index
            check_commit_survives(self.checker, self.voters, voter.node_id, raft)
            if self.wipe_at_commit == voter.node_id and self.faulty:
                self.wipe_at_commit = 0
                strike_ns = self.queue.now_ns + int(self.rng.uniform(0.0, 1.0) * MS)
                self.queue.push(strike_ns, "wipe-now", voter.node_id)

    def _on_event(self, kind: str, payload) -> None:
        self.fingerprint.update(f"{self.queue.now_ns}:{kind};".encode())
        if kind == "deliver":
            destination, frame = payload
            voter = self.voters[destination]
            if voter.raft is not None:
                self._step(voter, _decoder.decode(frame))
        elif kind == "timer":
            node, incarnation, name, deadline = payload
            voter = self.voters[node]
            if voter.raft is not None and voter.incarnation == incarnation and voter.timers.get(name) == deadline:
                del voter.timers[name]
                self._step(voter, TimerFired(name=name))
        elif kind == "disconnect":
            node, endpoint = payload
            voter = self.voters[node]
            if voter.raft is not None:
                self._step(voter, PeerDisconnected(endpoint=endpoint))
        elif kind == "flush":
            self._on_flush(*payload)
        elif kind == "propose":
            self._propose()
        elif kind == "fault":
            self._fault()
        elif kind == "restart":
            if self.voters[payload].raft is None:
                self.boot(payload)
        elif kind == "wipe-now":
            self._wipe_now(payload)
        elif kind == "crash-now":
            if self.voters[payload].raft is not None:
                self.crash(payload)
                self.queue.push(self.queue.now_ns + self.rng.randint(*self.config.restart_delay_ms) * MS,
                                "restart", payload)
        elif kind == "isolate":
            self._cut(self._isolation(payload, "both"), f"controller-{payload} isolated (both)")
        elif kind == "heal":
            self._heal_links(payload)
        else:
            raise AssertionError(f"unknown event {kind}")

    def _on_flush(self, node: int, incarnation: int) -> None:
        voter = self.voters[node]
        if voter.raft is None or voter.incarnation != incarnation:
            return  # crashed first: the flush never happened
        held, voter.held, voter.flush_due = voter.held, [], False
        voter.raft.log.flush()
        for effect in held:
            self._apply(voter, list(effect.effects))
        self._check(voter)

    def _propose(self) -> None:
        c = self.config
        self.queue.push(self.queue.now_ns + self.rng.randint(*c.propose_interval_ms) * MS, "propose", None)
        voter = self.voters[self.client_target]
        if voter.raft is None:
            self.client_target = self.rng.choice(list(self.voters))
            return
        count = self.rng.randint(1, c.commands_per_proposal_max) if c.commands_per_proposal_max > 1 else 1
        commands = []
        for _ in range(count):
            self.proposal_sequence += 1
            commands.append(b"command-%d" % self.proposal_sequence)
        result = voter.raft.propose_many(commands, self.queue.now_ns)
        if isinstance(result, Proposed):
            if not self.faulty:
                self.after_heal_proposals += [(result.index - back, result.term) for back in range(count)]
            self._apply(voter, result.effects)
            self._check(voter)
        elif isinstance(result, NotController) and result.leader_id:
            self.client_target = result.leader_id
        else:
            self.client_target = self.rng.choice(list(self.voters))

    # ------------------------------------------------------------------ faults

    def _leader(self) -> int:
        leaders = [(voter.raft.term, node) for node, voter in self.voters.items()
                   if voter.raft is not None and voter.raft.role is Role.LEADER]
        return max(leaders)[1] if leaders else 0

    def _note(self, text: str) -> None:
        self.trace.append(f"{self.queue.now_ns / 1e9:8.3f} s  {text}")
        if len(self.trace) > 40:
            del self.trace[0]

    # ------------------------------------------------------------------ the run

    def run(self) -> RaftSimResult:
        started = time.perf_counter()
        c = self.config
        for node in self.voters:
            self.boot(node)
        self.queue.push(self.queue.now_ns + 50 * MS, "propose", None)
        self.queue.push(self.queue.now_ns + self.rng.randint(*c.fault_interval_ms) * MS, "fault", None)
        self._run_until(c.duration_ms * MS)
        heal_ns = self._heal()
        leader_ns = self._run_until(heal_ns + c.recovery_ms * MS, stop_at_leader=True)
        after_heal_ms = (leader_ns - heal_ns) / MS if leader_ns else float("inf")
        if leader_ns is None or after_heal_ms > c.liveness_bound_ms:
            self.checker.fail(f"liveness: no leader within {c.liveness_bound_ms} ms of the heal")
        else:
            self._check_progress_after_heal(heal_ns + c.recovery_ms * MS)
        committed = max((v.raft.commit_index for v in self.voters.values() if v.raft is not None), default=0)
        return RaftSimResult(self.seed, list(self.checker.problems), self.steps, self.queue.now_ns / 1e9,
                             time.perf_counter() - started, self.elections, committed, after_heal_ms,
                             self.fingerprint.hexdigest(), list(self.trace))

    def _heal(self) -> int:
        self.faulty = False
        self.blocked.clear()
        self.network_scale = 1.0
        self.queue = _without_faults(self.queue)
        for node, voter in self.voters.items():
            if voter.raft is None:
                self.boot(node)
        self._note("healed: every controller up, the network clean")
        return self.queue.now_ns

    def _run_until(self, end_ns: int, stop_at_leader: bool = False, stop_when=None) -> int | None:
        while self.queue and not self.checker.problems and self.steps < self.config.steps_max:
            if stop_at_leader and self._leader():
                return self.queue.now_ns
            if stop_when is not None and stop_when():
                return self.queue.now_ns
            event = self.queue.pop_due(end_ns)
            if event is None:
                break
            self._on_event(*event)
        return None

    def _check_progress_after_heal(self, end_ns: int) -> None:
        """Some command proposed after the heal is applied by every controller before the end."""
        self._run_until(end_ns, stop_when=self._a_proposal_applied_everywhere)
        if not self._a_proposal_applied_everywhere():
            applied = {node: voter.raft.applied_index for node, voter in self.voters.items()}
            self.checker.fail(f"liveness: no command proposed after the heal was applied everywhere "
                              f"({len(self.after_heal_proposals)} proposed; applied indices {applied})")

    def _a_proposal_applied_everywhere(self) -> bool:
        rafts = [voter.raft for voter in self.voters.values()]
        for index, term in self.after_heal_proposals:
            if all(raft.applied_index >= index and raft.log.term_at(index) in (term, None) for raft in rafts):
                return True
        return False


def _without_faults(queue: EventQueue) -> EventQueue:
    """The same queue minus pending faults, restarts and heals (recovery is fault-free)."""
    clean = EventQueue()
    now_ns = clean.now_ns = queue.now_ns
    while queue:
        at_ns, kind, payload = queue.pop()
        if kind not in ("fault", "restart", "heal", "crash-now", "isolate", "wipe-now"):
            clean.push(at_ns, kind, payload)
    clean.now_ns = now_ns
    return clean


def simulate_raft(seed: int, config: RaftSimConfig | None = None) -> RaftSimResult:
    return RaftSimulation(seed, config).run()


if __name__ == "__main__":
    from chaos.sim_raft_sweep import main  # the command line lives with the sweep

    raise SystemExit(main())
