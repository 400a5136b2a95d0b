"""One controller's Raft state machine, pure: messages and time in, effects out.

What it owns: this voter's role, term and vote, the commit and applied indices, the leader's view
of each follower, and the order in which committed entries reach the state machine. What it
never does: touch a socket, a clock or a thread. Time comes in as `now_ns`, randomness as an
injected `random.Random` (election timeouts), storage as the injected `RaftLog`, whose writes it
makes but whose flushes the runtime (or the simulator) performs.

Durability is railmq's `AfterFlush` rule, not etcd-io/raft's Ready/Advance: at the end of every
step (a `handle`, a `propose`, a `transfer_leadership`), if the term, the vote or any entry
changed and is not flushed yet (`log.needs_flush`), every message and state-machine effect of the
step is wrapped in one `AfterFlush(log, ...)`; timers and traces are not. So no vote, no
acknowledgement of an entry and no reply to a client can leave before the state it reveals is on
disk, and since the runtime never lets later effects overtake a pending flush of the same store
(they are wrapped too while it is pending), nothing revealed is ever forgotten by a crash.

Term rules, for every message (Raft §5.1, with etcd-io/raft's pre-vote and check-quorum rules):
- a higher term makes this node a follower of that term, except a vote request inside the
  leader lease (ignored), a pre-vote request (it changes no term) and a granted pre-vote answer;
- a lower term is refused: an append or snapshot is answered with this node's term, so a
  deposed leader learns it at once; a vote request is refused with it; answers are dropped.

Invariants (`invariants()`): applied <= commit <= last index; the in-memory term and vote are the
log's; a leader voted for itself and tracks every peer with match < next <= last + 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors.actor import IllegalTransition
from actors.effects import AfterFlush, CancelTimer, Send, SetTimer, Trace
from actors.messages import PeerDisconnected, TimerFired
from actors.raft.config import RaftConfig
from actors.raft.election import ElectionRules
from actors.raft.follower import FollowerRules
from actors.raft.inbound import check_message
from actors.raft.replication import LeaderRules
from actors.raft.roles import ELECTION_TIMER, HEARTBEAT_TIMER, QUORUM_TIMER, TIMERS, Role
from actors.raft.state_machine import NotController, ProposalRefused, Proposed, ProposeResult, StateMachine
from actors.raft_messages import (
    RaftAppendRequest, RaftAppendResponse, RaftMessage, RaftSnapshotRequest, RaftTimeoutNow, RaftVoteRequest,
    RaftVoteResponse,
)
from storage.raft_log import ENTRY_COMMAND, RaftEntry, RaftLog, SnapshotMeta

if TYPE_CHECKING:  # actors/ never imports random: the generator is injected
    import random

MS = 1_000_000
NEVER = -(1 << 62)


class RaftNode(ElectionRules, LeaderRules, FollowerRules):
    def __init__(self, *, config: RaftConfig, log: RaftLog, state_machine: StateMachine, rng: "random.Random",
                 name: str = "raft") -> None:
        self.config = config.check()
        self.id = config.node_id
        self.name = name
        self.log = log
        self.state_machine = state_machine
        self.rng = rng
        self._heartbeat_ns = config.heartbeat_interval_ms * MS
        self._idle_heartbeat_ns = config.idle_heartbeat_interval_ms * MS
        self._election_timeout_ns = config.election_timeout_ms * MS
        self._quiet_rounds = 0  # the leader's heartbeat rounds in a row with nothing to send
        self.idle = False  # the leader heartbeats at the idle interval (replication.py)
        self._lease_extra_ns = 0  # a follower: how much longer than usual its leader said it may be silent
        hard = log.hard_state
        self.term, self.voted_for = hard.term, hard.vote
        self.role = Role.FOLLOWER
        self.leader_id = 0
        self.last_leader_contact_ns = NEVER
        self.election_deadline_ns = 0
        self._election_timer_ns: int | None = None
        self.votes: dict[int, bool] = {}
        self.progress: dict = {}
        self.transfer_target = 0
        self.transfer_deadline_ns = 0
        self.counters: dict[str, int] = {}
        # A voter whose log was lost while the quorum had formed (docs/raft.md §7): it neither
        # votes nor campaigns until a leader has caught it up (`_check_rejoined`). The mark lives
        # in the log's header (storage/raft_records.py), so it survives crashes.
        self.rejoining = log.rejoining
        self.rejoin_term = self.rejoin_commit = 0
        self.sequence_sent = 0  # appends and snapshots sent (replication.py `_next_sequence`)
        # The snapshot arriving in chunks (follower.py `_assemble_snapshot`): which one
        # (leader, term, index, term of its last entry), and its bytes so far.
        self._snapshot_chunks: tuple[tuple[int, int, int, int], bytearray] | None = None
        self._out: list[Any] = []  # messages and state-machine effects of this step
        self._early: list[Any] = []  # timers and traces: never wait for a flush
        snapshot = log.snapshot
        self.applied_index = 0
        self.applied_bytes = 0  # data of the entries applied since the last snapshot
        if snapshot is not None:
            state_machine.restore(log.snapshot_data, snapshot.index)
            self.applied_index = snapshot.index
        self.commit_index = max(hard.commit, self.applied_index)

    # ------------------------------------------------------------------ the actor contract

    def start(self, now_ns: int) -> list:
        self._reset_election_deadline(now_ns)
        if (self.config.campaign_at_first_start and self.term == 0 and self.log.last_index == 0
                and self.log.snapshot is None and self.id == min(self.config.voters) and not self.rejoining):
            self.election_deadline_ns = now_ns
            self._arm_election_timer()
        self._apply_committed()
        return self._release()

    def handle(self, message: Any, sender: Any, now_ns: int) -> list:
        match message:
            case TimerFired(name=name) if name in TIMERS:
                self._on_timer(name, now_ns)
            case PeerDisconnected(endpoint=endpoint):
                self._on_disconnected(endpoint, now_ns)
            case RaftMessage():
                problem = check_message(message, self.config)
                if problem:
                    self._count(f"dropped_{problem}")
                else:
                    self._step(message, now_ns)
            case _:
                raise IllegalTransition(self.name, self.role, message)
        return self._release()

    def invariants(self) -> None:
        log = self.log
        assert self.applied_index <= self.commit_index <= log.last_index, (
            f"{self.name}: applied {self.applied_index}, commit {self.commit_index}, last {log.last_index}")
        assert (self.term, self.voted_for) == tuple(log.hard_state)[:2], f"{self.name}: term/vote not the log's"
        snapshot_index = log.snapshot.index if log.snapshot is not None else 0
        assert self.applied_index >= snapshot_index, f"{self.name}: applied below the snapshot"
        if self._snapshot_chunks is not None:
            (_, term, _, _), held = self._snapshot_chunks
            assert term == self.term and len(held) <= self.config.snapshot_bytes_max, (
                f"{self.name}: {len(held)} bytes of a snapshot of term {term} held in term {self.term}")
        if self.role is Role.LEADER:
            assert self.leader_id == self.id and self.voted_for == self.id, (
                f"{self.name}: a leader that did not vote for itself")
            for peer, progress in self.progress.items():
                assert progress.match_index < progress.next_index <= log.last_index + 1, (
                    f"{self.name}: {peer} {progress}")

    # ------------------------------------------------------------------ the proposal API

    def propose(self, data: bytes, now_ns: int) -> ProposeResult:
        """Append a command if this node is the active controller (see state_machine.py)."""
        return self.propose_many([data], now_ns)

    def propose_many(self, commands: list[bytes], now_ns: int) -> ProposeResult:
        """Append commands at consecutive indexes, all of them or none (the parts of one step,
        replicated_state.py); `Proposed` names the last one's index."""
        if self.role is not Role.LEADER:
            return NotController(self.leader_id, self.config.voters.get(self.leader_id, ""), self.term)
        if self.transfer_target:
            return ProposalRefused("BUSY", f"leadership is moving to controller {self.transfer_target}")
        for data in commands:
            if len(data) > self.config.entry_bytes_max:
                return ProposalRefused("TOO_LARGE", f"an entry of {len(data)} bytes exceeds entry_bytes_max "
                                                    f"({self.config.entry_bytes_max})")
        if self.log.last_index - self.commit_index + len(commands) > self.config.uncommitted_entries_max:
            return ProposalRefused("BUSY", f"{len(commands)} more entries would pass the "
                                           f"{self.config.uncommitted_entries_max} that may be uncommitted "
                                           "(uncommitted_entries_max)")
        waiting = self.log.data_bytes(self.commit_index + 1, self.log.last_index)
        if waiting and waiting + sum(map(len, commands)) > self.config.uncommitted_bytes_max:
            self._count("proposals_refused_uncommitted_bytes")
            return ProposalRefused("BUSY", f"{waiting:,} bytes of entries are not committed yet "
                                           f"(uncommitted_bytes_max {self.config.uncommitted_bytes_max:,})")
        first = self.log.last_index + 1
        entries = [RaftEntry(index=first + offset, term=self.term, kind=ENTRY_COMMAND, data=bytes(data))
                   for offset, data in enumerate(commands)]
        self.log.append(entries)
        self._broadcast_append(now_ns)
        self._maybe_commit(now_ns)
        return Proposed(entries[-1].index, self.term, self._release())

    def uncommitted(self) -> tuple[int, int]:
        """(entries, bytes of data) appended past the commit index: what `propose_many` bounds."""
        entries = self.log.last_index - self.commit_index
        if entries <= 0:
            return 0, 0
        return entries, self.log.data_bytes(self.commit_index + 1, self.log.last_index)

    def status(self) -> dict:
        """What `railmq cluster info` will show of this voter."""
        return {"id": self.id, "role": self.role.value, "term": self.term, "leader": self.leader_id,
                "commit_index": self.commit_index, "applied_index": self.applied_index,
                "last_index": self.log.last_index,
                "followers": {peer: progress.match_index for peer, progress in sorted(self.progress.items())}}

    # ------------------------------------------------------------------ dispatch

    def _step(self, message: RaftMessage, now_ns: int) -> None:
        if message.term > self.term:
            if not self._higher_term(message, now_ns):
                return
        elif message.term < self.term:
            self._lower_term(message)
            return
        match message:
            case RaftVoteRequest():
                self._on_vote_request(message, now_ns)
            case RaftVoteResponse():
                self._on_vote_response(message, now_ns)
            case RaftAppendRequest():
                self._on_append_request(message, now_ns)
            case RaftAppendResponse():
                self._on_append_response(message, now_ns)
            case RaftSnapshotRequest():
                self._on_snapshot_request(message, now_ns)
            case RaftTimeoutNow():
                self._on_timeout_now(message, now_ns)
            case _:
                raise IllegalTransition(self.name, self.role, message)
        if self.rejoining and isinstance(message, (RaftAppendRequest, RaftSnapshotRequest)):
            self._check_rejoined(message)

    def _check_rejoined(self, message: RaftAppendRequest | RaftSnapshotRequest) -> None:
        """A rejoining voter is a full voter again once its log holds every entry that may have
        been committed with the acknowledgements it lost, which takes both of:

        - its commit index reaches what this term's leader had committed when it first heard from
          it (entries of this term, which that leader committed itself);
        - the entry at its commit index is of the leader's term. Its log then equals the leader's
          up to there, and the leader holds every entry committed in earlier terms, all before
          its own term's first entry. Without this, a new leader that had not yet learned how far
          its predecessor committed would let the voter back in short of an entry the voter's lost
          copy had helped commit (tests/unit/test_raft_rejoin.py)."""
        if message.source != self.leader_id:
            return
        if self.rejoin_term != self.term:  # a new leader: what it had committed when it first reached us
            told = message.leader_commit if isinstance(message, RaftAppendRequest) else message.snapshot_index
            self.rejoin_term, self.rejoin_commit = self.term, max(told, 1)
        if self.commit_index >= self.rejoin_commit and self.log.term_at(self.commit_index) == self.term:
            self.rejoining = False
            self.log.set_rejoining(False)  # durable with this step's flush
            self._count("rejoined")
            self._early.append(Trace("raft_rejoined", {"node": self.id, "term": self.term,
                                                       "commit_index": self.commit_index}))
    def _higher_term(self, message: RaftMessage, now_ns: int) -> bool:
        """Apply the higher-term rules; False when the message is to be ignored."""
        if isinstance(message, RaftVoteRequest):
            if not message.transfer and self._in_lease(now_ns):
                self._count("votes_ignored_in_lease")
                return False
            if message.pre_vote:
                return True
            self._become_follower(message.term, 0, now_ns)
            return True
        if isinstance(message, RaftVoteResponse) and message.pre_vote and message.granted:
            return True
        leader = message.source if isinstance(message, (RaftAppendRequest, RaftSnapshotRequest, RaftTimeoutNow)) else 0
        self._become_follower(message.term, leader, now_ns)
        return True

    def _lower_term(self, message: RaftMessage) -> None:
        self._count("stale_term_messages")
        if isinstance(message, (RaftAppendRequest, RaftSnapshotRequest)):
            self._send(message.source, RaftAppendResponse(source=self.id, destination=message.source, term=self.term))
        elif isinstance(message, RaftVoteRequest):
            self._send(message.source, RaftVoteResponse(source=self.id, destination=message.source, term=self.term,
                                                        pre_vote=message.pre_vote))

    def _on_disconnected(self, endpoint: str, now_ns: int) -> None:
        """The connection to `endpoint` dropped. When it is the leader's, its process most likely
        died (the kernel closes a dead process's sockets at once): the lease ends and this
        follower campaigns within half an election timeout (random, so two followers seldom
        collide) instead of waiting out the leader's silence. If the leader is in fact alive,
        pre-vote loses (the other voters are still in its lease) and its next append restores it."""
        if self.role is not Role.FOLLOWER or not self.leader_id or self.config.voters.get(self.leader_id) != endpoint:
            return
        self._count("leader_disconnected")
        self._early.append(Trace("raft_leader_disconnected", {"node": self.id, "term": self.term,
                                                               "leader": self.leader_id}))
        self._set_role(Role.FOLLOWER, leader_id=0)
        self.last_leader_contact_ns = NEVER
        self._lease_extra_ns = 0
        self._move_election_deadline(now_ns + self.rng.randrange(0, max(1, self.config.election_timeout_ms // 2)) * MS)

    def _on_timer(self, name: str, now_ns: int) -> None:
        if name == ELECTION_TIMER:
            self._election_timer_ns = None
            if self.role is Role.LEADER:
                return
            if now_ns < self.election_deadline_ns:
                self._arm_election_timer()
                return
            if self.rejoining:  # it cannot know whether its empty log may lead: it waits to be caught up
                self._count("campaigns_skipped_rejoining")
                self._reset_election_deadline(now_ns)
                return
            self._campaign(now_ns)
        elif self.role is not Role.LEADER:
            return  # a leader's timer that fired after it stepped down
        elif name == HEARTBEAT_TIMER:
            self._on_heartbeat_timer(now_ns)
        else:
            self._on_quorum_timer(now_ns)

    # ------------------------------------------------------------------ transitions

    def _become_follower(self, term: int, leader_id: int, now_ns: int) -> None:
        if term > self.term:
            self._set_term(term, vote=0)
        if self.role is Role.LEADER:
            self._early.extend([CancelTimer(HEARTBEAT_TIMER), CancelTimer(QUORUM_TIMER)])
        self.progress = {}
        self.votes = {}
        self.transfer_target = 0
        self.idle = False
        self._lease_extra_ns = 0
        self._set_role(Role.FOLLOWER, leader_id=leader_id)
        if leader_id:
            self.last_leader_contact_ns = now_ns
        self._reset_election_deadline(now_ns)

    def _set_role(self, role: Role, *, leader_id: int) -> None:
        changed = role is not self.role or leader_id != self.leader_id
        self.role = role
        self.leader_id = leader_id
        if changed:
            self._early.append(Trace("raft_role", {"node": self.id, "role": role.value, "term": self.term,
                                                   "leader": leader_id}))

    def _set_term(self, term: int, *, vote: int) -> None:
        self.term, self.voted_for = term, vote
        self.log.set_hard_state(term, vote)
        self._snapshot_chunks = None  # a snapshot arriving from an earlier term's leader: never finished

    # ------------------------------------------------------------------ commit and apply

    def _commit_to(self, index: int) -> None:
        self.commit_index = index
        self.log.set_commit(index)
        self._apply_committed()

    def _apply_committed(self) -> None:
        while self.applied_index < self.commit_index:
            entry = self.log.entry(self.applied_index + 1)
            self._out.extend(self.state_machine.apply(entry))
            self.applied_index = entry.index
            self.applied_bytes += len(entry.data)
        self._maybe_snapshot()

    def _maybe_snapshot(self) -> None:
        """A snapshot once `snapshot_interval_entries` were applied since the last one, or
        `snapshot_interval_bytes` of them (at least as many as that snapshot holds)."""
        log, config = self.log, self.config
        snapshot_index = log.snapshot.index if log.snapshot is not None else 0
        if (self.applied_index - snapshot_index < config.snapshot_interval_entries
                and self.applied_bytes < max(config.snapshot_interval_bytes, len(log.snapshot_data))):
            return
        data = self.state_machine.snapshot()
        if len(data) > self.config.snapshot_bytes_max:
            self._count("snapshots_too_large")
            return
        meta = SnapshotMeta(index=self.applied_index, term=log.term_at(self.applied_index),
                            voters=sorted(self.config.voters))
        keep_from = max(log.first_index, self.applied_index - config.snapshot_trailing_entries + 1)
        trailing = log.data_bytes(keep_from, self.applied_index)
        while keep_from <= self.applied_index and trailing > config.snapshot_trailing_bytes:
            trailing -= len(log.entry(keep_from).data)
            keep_from += 1
        log.save_snapshot(meta, data, keep_from)
        self.applied_bytes = 0
        self._count("snapshots_taken")

    # ------------------------------------------------------------------ effects

    def _send(self, peer: int, message: RaftMessage) -> None:
        self._out.append(Send(self.config.voters[peer], message))

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _set_timer(self, name: str, deadline_ns: int) -> None:
        self._early.append(SetTimer(name, deadline_ns))

    def _reset_election_deadline(self, now_ns: int, extra_ns: int = 0) -> None:
        timeout = self.config.election_timeout_ms
        self._move_election_deadline(now_ns + extra_ns + self.rng.randrange(timeout, 2 * timeout) * MS,
                                     rearm=bool(extra_ns))

    def _move_election_deadline(self, deadline_ns: int, *, rearm: bool = False) -> None:
        """The timer is lazy: set at the deadline of its time, it fires and looks again (fast
        heartbeats move the deadline more often than it would be worth setting it), so it is set
        only when the deadline comes earlier — or with `rearm`: a quiet leader's heartbeat moves
        it past the next one, where a lazy timer would wake this node once per heartbeat."""
        self.election_deadline_ns = deadline_ns
        if rearm or self._election_timer_ns is None or self._election_timer_ns > deadline_ns:
            self._arm_election_timer()

    def _arm_election_timer(self) -> None:
        self._election_timer_ns = self.election_deadline_ns
        self._set_timer(ELECTION_TIMER, self.election_deadline_ns)

    def _cancel_election_timer(self) -> None:
        self._election_timer_ns = None
        self._early.append(CancelTimer(ELECTION_TIMER))

    def _release(self) -> list:
        """This step's effects: timers and traces first, then everything else, behind the
        log's flush when the step changed durable state that is not flushed yet."""
        early, out = self._early, self._out
        self._early, self._out = [], []
        if out and self.log.needs_flush:
            early.append(AfterFlush(self.log, tuple(out)))
            return early
        early.extend(out)
        return early
