"""A controller: one voter of the metadata quorum, and, while it leads, the cluster's coordinator.

Each node runs one (`controller/<node>`). It holds a `RaftNode` (actors/raft/) whose replicated
state machine is the coordinator's key-value map (`ReplicatedState`), and, only while it is the
*active* controller, an unchanged `Coordinator` built over that map — so every rule of topics,
placement, elections and the ISR is the same code with or without a quorum (docs/raft.md §9).

- **Becoming active.** A voter that wins an election appends a no-op of its term; once that
  no-op is applied the voter holds everything ever committed (Raft's leader completeness), so it
  builds the `Coordinator` from the committed map, as a restarted coordinator does from its file,
  with the same election grace for liveness (soft state, rebuilt from heartbeats).
- **Deciding.** The coordinator's writes go to the working map; at the end of each step they
  become one Raft command (or, past `entry_bytes_max`, its parts, applied together with the last:
  actors/replicated_state.py). What the coordinator guarded with `AfterFlush(state, ...)` — state
  pushes, admin replies, ISR answers — is held until that command is applied *at the index and
  term it was proposed at*; an entry of another term there means the proposal died with this
  leadership, and the held effects are dropped — the answers among them replaced by the quorum's
  refusal (`NOT_CONTROLLER`, naming the leader as far as known), so the asker goes to the new
  leader at once instead of waiting out its timeout. Every other message it sends (metadata
  answers, pushes of a replica's state, node heartbeat answers) was read from the working map, so
  it waits behind the last uncommitted proposal, if any (a read index, Raft §8). Nothing
  uncommitted is ever announced.
- **Losing leadership** (a higher term, check-quorum) drops the coordinator and everything it
  held (answers refused as above: their decisions may still commit under the next leader, as
  after a timeout); the working map falls back to the committed one.
- **Everyone else** is answered `NOT_CONTROLLER` with the leader this voter knows of
  (actors/controller_endpoints.py says how senders follow it). `ControllerStatusRequest` is
  answered by every voter (`railmq cluster info`).

A proposal the leader refuses (BUSY: too many uncommitted entries; TOO_LARGE) leaves the
coordinator's memory ahead of what will commit; the controller then stops deciding until every
entry it proposed is applied and rebuilds the coordinator from the committed map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import msgspec

from actors.effects import AfterFlush, Effect, Send, Trace
from actors.errors import ErrorCode
from actors.messages import (
    AlterTopicConfigRequest, ControllerStatusRequest, ControllerStatusResponse, CreatePartitionsRequest,
    CreateTopicRequest, DeleteTopicRequest, ErrorResponse, InitProducerIdRequest, MetadataResponse,
    PeerDisconnected, Stop, TimerFired,
)
from actors.raft import NotController, Proposed, RaftConfig, RaftNode
from actors.raft.roles import Role
from actors.raft_messages import RaftMessage
from actors.replicated_state import ReplicatedState
from storage.raft_log import ENTRY_NOOP, RaftEntry, RaftLog

# Written with the single coordinator's state when a new quorum's first leader applies it
# (`bootstrap`); no decider reads it.
BOOTSTRAPPED_KEY = "quorum/bootstrapped"

if TYPE_CHECKING:
    import random

    from actors.coordinator import Coordinator


class Controller:
    REFUSAL = ErrorCode.NOT_CONTROLLER  # what a voter that does not lead answers
    # Messages the decider sends unguarded wait behind the last uncommitted proposal (see _decide).
    HOLDS_READS = True
    SERVES = "metadata"
    # Clients' requests that decide, each an entry: BUSY past their share of the uncommitted log
    # (`controller_client_uncommitted_percent`), so a burst of them never makes a proposal refused.
    CLIENT_WRITES: tuple[type, ...] = (CreateTopicRequest, DeleteTopicRequest, CreatePartitionsRequest,
                                       AlterTopicConfigRequest, InitProducerIdRequest)

    def __init__(self, *, config: RaftConfig, log: RaftLog, rng: "random.Random",
                 coordinator_factory: Callable[[ReplicatedState], "Coordinator"], endpoint: str = "", pid: int = 0,
                 bootstrap: list[tuple[str, Any]] | None = None, name: str = "") -> None:
        self.name = name or f"controller/{config.node_id}"
        self.node = config.node_id
        self.endpoint = endpoint or config.voters[config.node_id]
        self.pid = pid
        self.state = ReplicatedState()
        self.coordinator_factory = coordinator_factory
        self.bootstrap = bootstrap or []
        self.coordinator: Coordinator | None = None
        self.active_term = 0
        self.held: dict[int, tuple[int, list[Effect]]] = {}  # proposal index -> (term, effects)
        # proposal index -> the requests whose answers wait there, as (sender, correlation id):
        # answers that will never go out become refusals, so nobody waits out a timeout for them.
        self.askers: dict[int, set[tuple[Any, int]]] = {}
        # Messages held, in bytes, per proposal index and in all (`controller_held_bytes_max`):
        # reads past it are BUSY, and so are clients' decisions (their answers always wait).
        self.read_bytes: dict[int, int] = {}
        self.held_read_bytes = 0
        self.last_proposed = 0
        self.rebuilding = False  # a refused proposal: stop deciding until everything proposed applied
        # Why this voter, elected, will not decide (its committed state is another cluster's): said
        # to every client while it leads, instead of NOT_CONTROLLER that sends them round the voters.
        self.refused = ""
        self._activate_wanted = False
        self._now = 0
        self.applied: list[RaftEntry] | None = None  # set to a list to observe applied entries (the simulator)
        self.raft = RaftNode(config=config, log=log, state_machine=self, rng=rng, name=f"{self.name}/raft")

    # ------------------------------------------------------------------ the actor contract

    def start(self, now_ns: int) -> list[Effect]:
        self._now = now_ns
        return self.raft.start(now_ns)

    def needs_authentication(self, message: Any) -> bool:
        from actors.coordinator import AUTHENTICATED

        return isinstance(message, RaftMessage) or isinstance(message, AUTHENTICATED)

    def invariants(self) -> None:
        self.raft.invariants()
        if self.coordinator is not None:
            assert self.raft.role is Role.LEADER and self.raft.term == self.active_term, (
                f"{self.name}: a coordinator outside its own leadership (term {self.active_term}, now "
                f"{self.raft.term} as {self.raft.role.value})")
            self.coordinator.invariants()
        assert self.state.applied_index == self.raft.applied_index, (
            f"{self.name}: the state applied {self.state.applied_index}, raft {self.raft.applied_index}")
        held = list(self.held)
        assert held == sorted(held), f"{self.name}: proposals held out of index order: {held[:8]}"
        assert not held or held[0] > self.raft.applied_index, (
            f"{self.name}: effects held for applied index {held[0]}")
        assert set(self.askers) <= set(self.held), f"{self.name}: askers of proposals no longer held"
        assert set(self.read_bytes) <= set(self.held) and self.held_read_bytes == sum(self.read_bytes.values()), (
            f"{self.name}: held read bytes {self.held_read_bytes} miscounted: {self.read_bytes}")

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        self._now = now_ns
        if isinstance(message, (RaftMessage, PeerDisconnected)) or (
                isinstance(message, TimerFired) and message.name.startswith("raft/")):
            # A dropped connection matters to the quorum (the leader's process died); the
            # coordinator inside never waits on a connection.
            return self._after_raft(self.raft.handle(message, sender, now_ns), now_ns)
        if isinstance(message, ControllerStatusRequest):
            return [Send(sender, self.status(message.correlation_id))]
        if isinstance(message, Stop):
            self.raft.log.flush()
            return []
        if self.coordinator is None:
            return self._not_controller(message, sender)
        correlation = getattr(message, "correlation_id", None)
        if self.client_write(message):
            crowded = self._client_writes_crowded()
            if crowded:
                return [Send(sender, ErrorResponse(correlation_id=correlation, error=ErrorCode.BUSY,
                                                   error_message=f"{self.name}: {crowded}; ask again"))]
        asker = (sender, correlation) if type(correlation) is int and correlation >= 0 else None
        return self._decide(self.coordinator.handle(message, sender, now_ns), now_ns, asker)

    def client_write(self, message: Any) -> bool:
        """Whether `message` is a client's request that may decide (write an entry)."""
        return isinstance(message, self.CLIENT_WRITES)

    # ------------------------------------------------------------------ the StateMachine face

    def apply(self, entry: RaftEntry) -> list[Effect]:
        """Called by the RaftNode, in index order, for every committed entry."""
        self.state.apply(entry)
        if self.applied is not None:
            self.applied.append(entry)
        released: list[Effect] = []
        # Proposals are held in the order of their indexes (each new one is past the log's end),
        # so those this entry settles come first: a walk of every held proposal per applied entry
        # read n**2 / 2 of them for a burst of n.
        while self.held:
            index = next(iter(self.held))
            if index > entry.index:
                break
            term, effects = self.held.pop(index)
            askers = self.askers.pop(index, set())
            self.held_read_bytes -= self.read_bytes.pop(index, 0)
            if index == entry.index and term == entry.term:
                released.extend(effects)
            else:
                released.append(Trace("controller-proposal-lost", {"index": index, "term": term}))
                released += self._refusals(effects, askers, "the decision it made for this request was "
                                           "lost with its leadership (another leader's entry took its place)")
        if (entry.kind == ENTRY_NOOP and entry.term == self.raft.term and self.raft.role is Role.LEADER
                and self.coordinator is None):
            self._activate_wanted = True  # done after the raft step: activating writes and proposes
        return released

    def snapshot(self) -> bytes:
        return self.state.snapshot()

    def restore(self, data: bytes, index: int) -> None:
        self.state.restore(data, index)

    # ------------------------------------------------------------------ leadership

    def _after_raft(self, effects: list[Effect], now_ns: int) -> list[Effect]:
        if self.coordinator is not None and (self.raft.role is not Role.LEADER or self.raft.term != self.active_term):
            effects += self._deactivate("leadership lost")
        if self.rebuilding and self.raft.role is Role.LEADER and self.raft.applied_index >= self.raft.log.last_index:
            self.rebuilding = False
            self._activate_wanted = True
        if self._activate_wanted:
            self._activate_wanted = False
            if self.raft.role is Role.LEADER and self.coordinator is None:
                effects += self._activate(now_ns)
        return effects

    def _activate(self, now_ns: int) -> list[Effect]:
        self.state.activate()
        if not len(self.state.committed) and self.bootstrap:
            # An existing cluster's state (the single coordinator's file), applied once: the marker
            # keeps the map from ever being empty again, so a later leader that read the same file
            # never applies it over what was deleted since (every group gone, say).
            self.state.put_many([*self.bootstrap, (BOOTSTRAPPED_KEY, True)])
        try:
            self.coordinator = self.coordinator_factory(self.state)
        except ValueError as error:  # the committed state belongs to another cluster
            self.state.deactivate()
            self.refused = (f"{error}: the data directory's cluster.meta names the second; if that file was "
                            "damaged or replaced, restore the first there")
            return [Trace("controller-refused", {"reason": self.refused})]
        self.refused = ""
        self.active_term = self.raft.term
        effects: list[Effect] = [Trace("controller-active", {"node": self.node, "term": self.raft.term,
                                                             "applied_index": self.raft.applied_index})]
        return effects + self._decide(self.coordinator.start(now_ns), now_ns)

    def _deactivate(self, reason: str) -> list[Effect]:
        dropped = len(self.held)
        refusals: list[Effect] = []
        for index, (_, effects) in sorted(self.held.items()):
            refusals += self._refusals(effects, self.askers.get(index, set()),
                                       f"it stopped deciding before its decision for this request committed "
                                       f"({reason}); the decision may still commit under the next leader")
        self.coordinator = None
        self.held.clear()
        self.askers.clear()
        self.read_bytes.clear()
        self.held_read_bytes = 0
        self.last_proposed = 0
        self.state.deactivate()
        return [Trace("controller-inactive", {"node": self.node, "term": self.raft.term, "reason": reason,
                                              "proposals_dropped": dropped})] + refusals

    def _refusals(self, effects: list[Effect], askers: set[tuple[Any, int]], why: str) -> list[Effect]:
        """The answers among dropped effects, each replaced by this quorum's refusal naming the
        leader as far as known (the asker goes there at once; Kafka's NOT_CONTROLLER after a
        controller failover). Pushes and notices are just dropped: the next heartbeat or report
        brings them again."""
        if not askers:
            return []
        leader = self.raft.leader_id if self.raft.leader_id != self.node else 0
        endpoint = self.raft.config.voters.get(leader, "") if leader else ""
        refused: list[Effect] = []
        waiting = set(askers)  # one refusal per request; a copy per refusal made this quadratic
        for effect in effects:
            if not isinstance(effect, Send):
                continue
            key = (effect.to, getattr(effect.message, "correlation_id", None))
            if key in waiting:
                waiting.discard(key)
                refused.append(Send(effect.to, ErrorResponse(
                    correlation_id=key[1], error=self.REFUSAL, error_message=f"{self.name}: {why}",
                    controller_id=leader, controller_endpoint=endpoint)))
        return refused

    # ------------------------------------------------------------------ deciding

    def _decide(self, effects: list[Effect], now_ns: int, asker: tuple[Any, int] | None = None) -> list[Effect]:
        """Turn the coordinator's step into a proposal, and hold every message it sends until the
        commits it may have read are done.

        What the coordinator guarded with `AfterFlush` waits for this step's command. Every other
        message it sends (a metadata answer, a push of a replica's state, a node heartbeat's
        answer) was built from the working map, which holds every decision of this leadership,
        committed or not: it waits behind the last uncommitted proposal, if there is one — if that
        commits, so did everything the message read; if not, it is dropped with it. With nothing
        in flight the working map is the committed one, and it goes at once. Both kinds keep the
        order the coordinator sent them in. (An active controller cut off from the quorum so
        reveals nothing it decided alone.)"""
        out: list[Effect] = []
        revealing: list[Effect] = []
        reads: list[Effect] = []
        for effect in effects:
            if isinstance(effect, AfterFlush) and effect.store is self.state:
                revealing += effect.effects
            elif isinstance(effect, Send) and self.HOLDS_READS:
                revealing.append(effect)
                reads.append(effect)
            elif isinstance(effect, Send):
                out.append(self._with_quorum(effect))
            else:
                out.append(effect)
        if revealing or self.state.pending:
            out += self._hold(revealing, reads, now_ns, asker)
        return out

    def _hold(self, effects: list[Effect], reads: list[Effect], now_ns: int,
              asker: tuple[Any, int] | None = None) -> list[Effect]:
        commands = self.state.take_commands(self.raft.config.entry_bytes_max)
        if not commands and not (self.last_proposed > self.raft.applied_index and self.last_proposed in self.held):
            return [self._with_quorum(effect) for effect in effects]  # all it revealed is committed already
        effects, busy, size = self._within_budget(effects, reads, asker)
        if not commands:
            self.held[self.last_proposed][1].extend(effects)
            self._count_read_bytes(self.last_proposed, size)
            if asker is not None and not busy:
                self.askers.setdefault(self.last_proposed, set()).add(asker)
            return busy
        # A step too large for one entry is proposed in parts; what it guards waits for the last.
        index, term = self.raft.log.last_index + len(commands), self.raft.term
        self.held[index] = (term, effects)  # before proposing: one voter commits inside propose
        self._count_read_bytes(index, size)
        if asker is not None and not busy:
            self.askers[index] = {asker}
        result = self.raft.propose_many(commands, now_ns)
        if isinstance(result, Proposed):
            self.last_proposed = result.index
            return busy + result.effects
        self.held.pop(index, None)
        self.held_read_bytes -= self.read_bytes.pop(index, 0)
        askers = self.askers.pop(index, set())
        reason = result.message if not isinstance(result, NotController) else "not the leader"
        self.rebuilding = True
        return busy + self._deactivate(f"a proposal was refused: {reason}") + self._refusals(
            effects, askers, f"its decision for this request could not be proposed ({reason})")

    def _within_budget(self, effects: list[Effect], reads: list[Effect],
                       asker: tuple[Any, int] | None) -> tuple[list[Effect], list[Effect], int]:
        """(what to hold, what to send now, the bytes of messages held), each as it will be sent.
        Reads past `controller_held_bytes_max` are not held: the asker's is answered BUSY at once,
        a push is dropped (the next heartbeat or report brings it again). Answers to decisions
        always wait, and count: past the budget no client's decision is made
        (`_client_writes_crowded`)."""
        unread = {id(effect) for effect in reads}
        budget = self.coordinator.limits.controller_held_bytes_max - self.held_read_bytes
        held: list[Effect] = []
        busy: list[Effect] = []
        size = 0
        for effect in effects:
            read = id(effect) in unread
            effect = self._with_quorum(effect)
            encoded = len(msgspec.msgpack.encode(effect.message)) if isinstance(effect, Send) else 0
            if not read:
                held.append(effect)
                size += encoded
            elif size + encoded <= budget:
                size += encoded
                held.append(effect)
            elif asker is not None and (effect.to, getattr(effect.message, "correlation_id", None)) == asker:
                busy.append(Send(effect.to, ErrorResponse(
                    correlation_id=asker[1], error=ErrorCode.BUSY,
                    error_message=f"{self.name}: {self.held_read_bytes + size} bytes of answers already wait for "
                                  "the quorum to commit; ask again")))
        return held, busy, size

    def _count_read_bytes(self, index: int, size: int) -> None:
        if size:
            self.read_bytes[index] = self.read_bytes.get(index, 0) + size
            self.held_read_bytes += size

    def _client_writes_crowded(self) -> str:
        """Why a client's request that decides must wait, or "". A proposal the leader refuses
        (past `uncommitted_entries_max` or `uncommitted_bytes_max`, or while leadership moves)
        makes this controller drop its coordinator, refuse every answer it holds and rebuild,
        forgetting every replica's liveness: a burst of 4,097 InitProducerId did that. Clients'
        decisions fill only their share of what may be uncommitted; the rest is the cluster's own
        (heartbeats, ISR changes, elections), which a step may still need."""
        if self.raft.transfer_target:
            return f"leadership is moving to controller {self.raft.transfer_target}"
        if self.held_read_bytes >= self.coordinator.limits.controller_held_bytes_max:
            return (f"{self.held_read_bytes:,} bytes of answers wait for the quorum to commit "
                    f"(controller_held_bytes_max {self.coordinator.limits.controller_held_bytes_max:,})")
        percent = self.coordinator.limits.controller_client_uncommitted_percent
        config = self.raft.config
        entries, size = self.raft.uncommitted()
        if entries * 100 >= config.uncommitted_entries_max * percent:
            return (f"{entries:,} entries are not committed yet "
                    f"(uncommitted_entries_max {config.uncommitted_entries_max:,})")
        if size * 100 >= config.uncommitted_bytes_max * percent:
            return (f"{size:,} bytes of entries are not committed yet "
                    f"(uncommitted_bytes_max {config.uncommitted_bytes_max:,})")
        return ""

    def _with_quorum(self, effect: Effect) -> Effect:
        """Metadata answers name the quorum, so a client can find the next leader."""
        if isinstance(effect, Send) and isinstance(effect.message, MetadataResponse):
            message = msgspec.structs.replace(effect.message, controller_id=self.node,
                                              controller_endpoints=list(self.raft.config.voters.values()))
            return Send(effect.to, message)
        return effect

    def _not_controller(self, message: Any, sender: Any) -> list[Effect]:
        if isinstance(message, TimerFired) or type(message).__name__.endswith("Response"):
            return []  # a dropped coordinator's timer; an answer (never answer an answer)
        if self.refused and self.raft.role is Role.LEADER:
            return [Send(sender, ErrorResponse(correlation_id=getattr(message, "correlation_id", -1),
                                               error=ErrorCode.INCONSISTENT_CLUSTER_ID,
                                               error_message=f"{self.name} will not decide: {self.refused}"))]
        leader = self.raft.leader_id if self.raft.leader_id != self.node else 0
        endpoint = self.raft.config.voters.get(leader, "") if leader else ""
        why = f"voter {leader} ({endpoint}) is" if leader else "no voter is known to be"
        return [Send(sender, ErrorResponse(
            correlation_id=getattr(message, "correlation_id", -1), error=self.REFUSAL,
            error_message=f"{self.name} does not lead the {self.SERVES} quorum; {why} active",
            controller_id=leader, controller_endpoint=endpoint))]

    # ------------------------------------------------------------------ status

    def status(self, correlation_id: int = 0) -> ControllerStatusResponse:
        raft = self.raft
        leader = raft.leader_id
        return ControllerStatusResponse(
            correlation_id=correlation_id, node=self.node, endpoint=self.endpoint, pid=self.pid,
            role=raft.role.value, term=raft.term, leader=leader,
            leader_endpoint=raft.config.voters.get(leader, "") if leader else "",
            commit_index=raft.commit_index, applied_index=raft.applied_index, last_index=raft.log.last_index,
            active=self.coordinator is not None, rejoining=raft.rejoining,
            followers={peer: progress.match_index for peer, progress in sorted(raft.progress.items())},
            voters=dict(raft.config.voters))
