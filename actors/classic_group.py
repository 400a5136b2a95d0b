"""One classic consumer group: membership, generations and rebalances (Kafka's group protocol).

States and transitions (Kafka's GroupMetadata):

    Empty --join--> PreparingRebalance --everyone rejoined (or rebalance timeout)--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup--> Stable
    Stable --join / leave / session expiry / metadata change--> PreparingRebalance
    PreparingRebalance --last member gone--> Empty

Every completed join phase starts a new generation; only requests carrying the current
generation and a known member id are accepted, which is what fences zombies: a member that
stalled past its session timeout comes back to ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID and its
commits are refused. Static members (KIP-345, `group_instance_id`) that rejoin while the group is
Stable take over their old identity and assignment without a rebalance; the identity they
replaced is fenced (FENCED_INSTANCE_ID). "Rejoin" means another process: the one holding the
instance that asks again without its member id (a retry, a duplicate) gets the id it has; so
does a dynamic member whose join is still waiting, asked again from the same connection.

A member id alone proves nothing (DescribeGroup lists them): a join is answered with the member's
secret too, and a request naming a member must carry it (actors/client_secrets.py), or it is
refused UNKNOWN_MEMBER_ID and changes nothing. Two requests need no secret, as in Kafka: a join
of a static member without a member id (a restarted instance takes its identity over) and a leave
naming only a `group_instance_id` (an operator removing a static member).

The group coordinator owns persistence and timers; this class is the per-group state machine.
It returns effects (replies) and never touches storage.
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.actor import MS
from actors.client_secrets import MemberSecrets, refusal_text
from actors.effects import Effect, Send, Trace
from actors.classic_group_member import Member, named_by_all
from actors.errors import ErrorCode
from actors.messages import (
    ConsumerAssignment, GroupMember, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, MemberDescription, SyncGroupRequest,
    SyncGroupResponse,
)

EMPTY, PREPARING, COMPLETING, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"
_assignment_decoder = msgspec.msgpack.Decoder(ConsumerAssignment)


class ClassicGroup:
    def __init__(self, group_id: str, generation: int = 0, initial_delay_ms: int = 100,
                 secrets: MemberSecrets = MemberSecrets()) -> None:
        self.group_id = group_id
        self.secrets = secrets
        self.state = EMPTY
        self.generation = generation
        self.protocol_type = "consumer"
        self.protocol_name = ""
        self.leader = ""
        self.members: dict[str, Member] = {}
        self.static: dict[str, str] = {}  # group_instance_id -> member_id
        self.rebalance_deadline_ns = 0
        self.join_not_before_ns = 0
        self.initial_delay_ms = initial_delay_ms

    # ------------------------------------------------------------------ join

    def join(self, request: JoinGroupRequest, sender: Any, now_ns: int, new_member_id: str) -> list[Effect]:
        if request.protocol_type != self.protocol_type or not request.protocols or not self._compatible(request):
            return [self._join_error(sender, request, ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                                     "no assignor in common with the group's members")]
        member_id = request.member_id
        if request.group_instance_id is not None and request.group_instance_id in self.static:
            known = self.static[request.group_instance_id]
            if member_id and member_id != known:
                return [self._join_error(sender, request, ErrorCode.FENCED_INSTANCE_ID,
                                         f"instance {request.group_instance_id} is now member {known}")]
            if not member_id:
                mine = self.members.get(known)
                if mine is None or mine.address != sender:
                    return self._static_rejoin(request, sender, now_ns, known, new_member_id)
                # The very process that holds the instance asks again (a retry after a timeout, a
                # duplicate): it is that member, not a newer instance. A new member id would fence
                # the answer it already took (the simulator's seed 3192: a static member died of
                # FENCED_INSTANCE_ID after its own join came twice).
                member_id = known
                if self.state == STABLE and mine.protocols == list(request.protocols):
                    mine.last_heartbeat_ns = now_ns
                    return [Send(sender, JoinGroupResponse(
                        correlation_id=request.correlation_id, generation=self.generation,
                        protocol_name=self.protocol_name, leader=self.leader, member_id=known,
                        member_secret=self.secrets.of(self.group_id, known)))]
        if not member_id and request.group_instance_id is None:
            member_id = self._waiting_join_of(sender)
        if member_id and member_id not in self.members:
            return [self._join_error(sender, request, ErrorCode.UNKNOWN_MEMBER_ID,
                                     f"member {member_id} is not in group {self.group_id}; rejoin without an id")]
        if request.member_id and not self.secrets.proves(self.group_id, member_id, request.member_secret):
            return [self._join_error(sender, request, ErrorCode.UNKNOWN_MEMBER_ID,
                                     refusal_text(self.group_id, member_id))]
        effects: list[Effect] = []
        if not member_id:
            member_id = new_member_id
            self.members[member_id] = Member.joining(member_id, request, now_ns)
            if request.group_instance_id is not None:
                self.static[request.group_instance_id] = member_id
        member = self.members[member_id]
        changed = member.protocols != list(request.protocols)
        member.protocols = list(request.protocols)
        member.session_timeout_ms, member.rebalance_timeout_ms = request.session_timeout_ms, request.rebalance_timeout_ms
        member.last_heartbeat_ns = now_ns
        member.address = sender
        member.join_waiter = (sender, request.correlation_id)
        if self.state != PREPARING:
            reason = f"member {member_id} {'changed its subscription' if changed else 'joined'}"
            effects += self.prepare_rebalance(now_ns, reason)
        return effects + self.maybe_complete_join(now_ns)

    def _static_rejoin(self, request: JoinGroupRequest, sender: Any, now_ns: int, old_id: str,
                       new_id: str) -> list[Effect]:
        """KIP-345: a restarted static member takes over its identity; no rebalance if Stable."""
        old = self.members.pop(old_id)
        effects: list[Effect] = []
        fenced = "a newer instance with the same group_instance_id joined"
        # A waiter of the very process asking now is not a zombie: it sent its join again (a retry
        # after a timeout, a duplicate). It gets the answer of this join; fencing its earlier
        # request would stop the live instance for good.
        if old.join_waiter is not None and old.join_waiter[0] != sender:
            effects.append(Send(old.join_waiter[0], JoinGroupResponse(
                correlation_id=old.join_waiter[1], error=ErrorCode.FENCED_INSTANCE_ID, error_message=fenced)))
        if old.sync_waiter is not None and old.sync_waiter[0] != sender:
            effects.append(Send(old.sync_waiter[0], SyncGroupResponse(
                correlation_id=old.sync_waiter[1], error=ErrorCode.FENCED_INSTANCE_ID, error_message=fenced)))
        member = Member.joining(new_id, request, now_ns)
        member.assignment = old.assignment
        member.address = sender
        self.members[new_id] = member
        self.static[request.group_instance_id] = new_id
        if self.leader == old_id:
            self.leader = new_id
        effects.append(Trace("static-member-replaced", {"group": self.group_id, "old": old_id, "new": new_id}))
        if self.state == STABLE and old.protocols == list(request.protocols):
            effects.append(Send(sender, JoinGroupResponse(
                correlation_id=request.correlation_id, generation=self.generation, protocol_name=self.protocol_name,
                leader=self.leader, member_id=new_id, member_secret=self.secrets.of(self.group_id, new_id))))
            return effects
        member.join_waiter = (sender, request.correlation_id)
        if self.state != PREPARING:
            effects += self.prepare_rebalance(now_ns, f"static member {new_id} changed its subscription")
        return effects + self.maybe_complete_join(now_ns)

    def _waiting_join_of(self, sender: Any) -> str:
        """The dynamic member whose join, sent from `sender`, is still waiting ("" if none): a join
        without a member id from there is its client asking again (its answer was late: a rebalance
        waits up to the slowest member's rebalance timeout, a client re-asks after a session), not
        another member. Each such retry used to add a member that never synced, was given
        partitions and started another rebalance when its session ended (Kafka's KIP-394 problem;
        a connection's routing id is random and never shown, so no other client can claim it)."""
        for member in self.members.values():
            waiter = member.join_waiter
            if member.instance_id is None and waiter is not None and waiter[0] == sender:
                return member.member_id
        return ""

    def _compatible(self, request: JoinGroupRequest) -> bool:
        others = [m for m in self.members.values() if m.member_id != request.member_id]
        if not others:
            return True
        shared = named_by_all(others)
        return any(protocol.name in shared for protocol in request.protocols)

    def _join_error(self, sender: Any, request: JoinGroupRequest, code: ErrorCode, text: str) -> Send:
        return Send(sender, JoinGroupResponse(correlation_id=request.correlation_id, error=code, error_message=text,
                                              member_id=request.member_id))

    def prepare_rebalance(self, now_ns: int, reason: str) -> list[Effect]:
        effects: list[Effect] = [Trace("rebalance-started", {"group": self.group_id, "reason": reason,
                                                             "generation": self.generation})]
        for member in self.members.values():
            if member.sync_waiter is not None:
                sender, correlation = member.sync_waiter
                member.sync_waiter = None
                effects.append(Send(sender, SyncGroupResponse(
                    correlation_id=correlation, error=ErrorCode.REBALANCE_IN_PROGRESS,
                    error_message="the group is rebalancing; rejoin")))
        for member in self.members.values():
            if member.join_waiter is None and member.address is not None:
                # Tell members now instead of at their next heartbeat (correlation id 0: unsolicited).
                # Kafka's classic protocol waits for the heartbeat; this only shortens the pause.
                effects.append(Send(member.address, HeartbeatResponse(
                    correlation_id=0, error=ErrorCode.REBALANCE_IN_PROGRESS,
                    error_message=f"generation {self.generation} is rebalancing: {reason}")))
        timeout_ms = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
        if self.state == EMPTY:
            self.join_not_before_ns = now_ns + self.initial_delay_ms * MS
        self.state = PREPARING
        self.rebalance_deadline_ns = now_ns + timeout_ms * MS
        return effects

    def maybe_complete_join(self, now_ns: int) -> list[Effect]:
        if self.state != PREPARING:
            return []
        everyone = all(member.join_waiter is not None for member in self.members.values())
        if (everyone and now_ns >= self.join_not_before_ns) or now_ns >= self.rebalance_deadline_ns:
            return self._complete_join(now_ns)
        return []

    def _complete_join(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        for member_id in [m.member_id for m in self.members.values() if m.join_waiter is None]:
            effects += self._remove(member_id, "did not rejoin within the rebalance timeout")
        self.generation += 1
        if not self.members:
            self.state, self.leader, self.protocol_name = EMPTY, "", ""
            return effects + [Trace("group-empty", {"group": self.group_id, "generation": self.generation})]
        self.protocol_name = self._select_protocol()
        if self.leader not in self.members:
            self.leader = next(iter(self.members))
        self.state = COMPLETING
        # The members' SyncGroup is awaited as long as their rejoin was (Kafka's pending sync,
        # KAFKA-12890): see _sync_overdue.
        self.rebalance_deadline_ns = now_ns + max(m.rebalance_timeout_ms for m in self.members.values()) * MS
        everyone = [GroupMember(member_id=m.member_id, group_instance_id=m.instance_id, metadata=self._metadata(m))
                    for m in self.members.values()]
        for member in self.members.values():
            sender, correlation = member.join_waiter
            member.join_waiter = None
            member.assignment = b""
            member.last_heartbeat_ns = now_ns  # a fresh session: waiting for slow members is not silence
            effects.append(Send(sender, JoinGroupResponse(
                correlation_id=correlation, generation=self.generation, protocol_name=self.protocol_name,
                leader=self.leader, member_id=member.member_id,
                member_secret=self.secrets.of(self.group_id, member.member_id),
                members=everyone if member.member_id == self.leader else [])))
        effects.append(Trace("generation-started", {
            "group": self.group_id, "generation": self.generation, "leader": self.leader,
            "members": list(self.members), "protocol": self.protocol_name}))
        return effects

    def _select_protocol(self) -> str:
        members = list(self.members.values())
        shared = named_by_all(members)
        common = [p.name for p in members[0].protocols if p.name in shared]
        votes = {name: 0 for name in common}
        for member in members:
            for protocol in member.protocols:
                if protocol.name in votes:
                    votes[protocol.name] += 1
                    break
        return max(common, key=lambda name: (votes[name], -common.index(name)))

    def _metadata(self, member: Member) -> bytes:
        for protocol in member.protocols:
            if protocol.name == self.protocol_name:
                return protocol.metadata
        return b""

    # ------------------------------------------------------------------ sync, heartbeat, leave

    def check_member(self, member_id: str, instance_id: str | None, generation: int | None,
                     secret: bytes | None) -> tuple[ErrorCode, str] | None:
        """Why a request naming this member (with `secret`; None: a leave by instance id, which
        needs none) cannot act as it in `generation` (None: any), or None."""
        if instance_id is not None and instance_id in self.static and self.static[instance_id] != member_id:
            return ErrorCode.FENCED_INSTANCE_ID, f"instance {instance_id} belongs to member {self.static[instance_id]} now"
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in group {self.group_id}"
        if secret is not None and not self.secrets.proves(self.group_id, member_id, secret):
            return ErrorCode.UNKNOWN_MEMBER_ID, refusal_text(self.group_id, member_id)
        if generation is not None and generation != self.generation:
            return ErrorCode.ILLEGAL_GENERATION, f"generation {generation} is not the current {self.generation}"
        return None

    def sync(self, request: SyncGroupRequest, sender: Any, now_ns: int) -> list[Effect]:
        problem = self.check_member(request.member_id, request.group_instance_id, request.generation,
                                    request.member_secret)
        if problem is not None:
            return [Send(sender, SyncGroupResponse(correlation_id=request.correlation_id, error=problem[0],
                                                   error_message=problem[1]))]
        member = self.members[request.member_id]
        member.last_heartbeat_ns = now_ns
        member.address = sender
        if self.state == PREPARING:
            return [Send(sender, SyncGroupResponse(correlation_id=request.correlation_id,
                                                   error=ErrorCode.REBALANCE_IN_PROGRESS, error_message="rejoin"))]
        if self.state == STABLE:
            return [Send(sender, SyncGroupResponse(correlation_id=request.correlation_id, assignment=member.assignment))]
        member.sync_waiter = (sender, request.correlation_id)
        if request.member_id != self.leader:
            return []
        given = {entry.member_id: entry.assignment for entry in request.assignments}
        for other in self.members.values():
            other.assignment = given.get(other.member_id, b"")
        self.state = STABLE
        effects: list[Effect] = [Trace("group-stable", {"group": self.group_id, "generation": self.generation})]
        for other in self.members.values():
            if other.sync_waiter is not None:
                waiter_sender, correlation = other.sync_waiter
                other.sync_waiter = None
                effects.append(Send(waiter_sender, SyncGroupResponse(correlation_id=correlation,
                                                                     assignment=other.assignment)))
        return effects

    def heartbeat(self, request: HeartbeatRequest, sender: Any, now_ns: int) -> list[Effect]:
        problem = self.check_member(request.member_id, request.group_instance_id, request.generation,
                                    request.member_secret)
        if problem is None and self.state == PREPARING:
            problem = (ErrorCode.REBALANCE_IN_PROGRESS, "the group is rebalancing; rejoin")
        if request.member_id in self.members and (problem is None or problem[0] == ErrorCode.REBALANCE_IN_PROGRESS):
            self.members[request.member_id].last_heartbeat_ns = now_ns
            self.members[request.member_id].address = sender
        code, text = problem if problem is not None else (ErrorCode.NONE, "")
        return [Send(sender, HeartbeatResponse(correlation_id=request.correlation_id, error=code, error_message=text))]

    def leave(self, request: LeaveGroupRequest, sender: Any, now_ns: int) -> list[Effect]:
        member_id, secret = request.member_id, request.member_secret
        if not member_id and request.group_instance_id in self.static:
            member_id, secret = self.static[request.group_instance_id], None
        problem = self.check_member(member_id, request.group_instance_id, None, secret)
        if problem is not None:
            return [Send(sender, LeaveGroupResponse(correlation_id=request.correlation_id, error=problem[0],
                                                    error_message=problem[1]))]
        effects = self._remove(member_id, request.reason or "left the group")
        effects += self._after_departure(now_ns, f"member {member_id} left")
        return effects + [Send(sender, LeaveGroupResponse(correlation_id=request.correlation_id))]

    def _remove(self, member_id: str, reason: str) -> list[Effect]:
        member = self.members.pop(member_id)
        if member.instance_id is not None and self.static.get(member.instance_id) == member_id:
            del self.static[member.instance_id]
        effects: list[Effect] = [Trace("member-removed", {"group": self.group_id, "member": member_id, "reason": reason})]
        if member.join_waiter is not None:
            effects.append(Send(member.join_waiter[0], JoinGroupResponse(
                correlation_id=member.join_waiter[1], error=ErrorCode.UNKNOWN_MEMBER_ID, error_message=reason)))
        if member.sync_waiter is not None:
            effects.append(Send(member.sync_waiter[0], SyncGroupResponse(
                correlation_id=member.sync_waiter[1], error=ErrorCode.UNKNOWN_MEMBER_ID, error_message=reason)))
        return effects

    def _after_departure(self, now_ns: int, reason: str) -> list[Effect]:
        if not self.members:
            if self.state != EMPTY:
                self.generation += 1
            self.state, self.leader, self.protocol_name = EMPTY, "", ""
            return [Trace("group-empty", {"group": self.group_id, "generation": self.generation})]
        if self.state in (STABLE, COMPLETING):
            return self.prepare_rebalance(now_ns, reason)
        return self.maybe_complete_join(now_ns)

    # ------------------------------------------------------------------ time

    def deadlines(self) -> list[int]:
        """When each thing `tick` does falls due: the coordinator's timer fires no later."""
        preparing = self.state == PREPARING
        deadlines = [member.last_heartbeat_ns + member.session_timeout_ms * MS + 1
                     for member in self.members.values()
                     if not (preparing and member.join_waiter is not None)]
        if preparing or self.state == COMPLETING:
            deadlines.append(self.rebalance_deadline_ns)
            if all(member.join_waiter is not None for member in self.members.values()):
                deadlines.append(self.join_not_before_ns)
        return deadlines

    def tick(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        for member in list(self.members.values()):
            if self.state == PREPARING and member.join_waiter is not None:
                continue  # waiting for the others: the rebalance timeout covers it
            if now_ns - member.last_heartbeat_ns > member.session_timeout_ms * MS:
                effects += self._remove(member.member_id, "session timed out")
                effects += self._after_departure(now_ns, f"member {member.member_id} timed out")
        return effects + self._sync_overdue(now_ns) + self.maybe_complete_join(now_ns)

    def _sync_overdue(self, now_ns: int) -> list[Effect]:
        """Members that have not sent SyncGroup within the rebalance timeout of the join phase
        are removed, and the others rejoin without them. A heartbeat keeps a session here, so a
        leader that heartbeat and never synced held its group in CompletingRebalance for good,
        with no member assigned anything (Kafka's KAFKA-12890 removes them the same way)."""
        if self.state != COMPLETING or now_ns < self.rebalance_deadline_ns:
            return []
        effects: list[Effect] = []
        for member_id in [m.member_id for m in self.members.values() if m.sync_waiter is None]:
            effects += self._remove(member_id, "did not send SyncGroup within the rebalance timeout")
        return effects + self._after_departure(now_ns, "members did not sync within the rebalance timeout")

    # ------------------------------------------------------------------ durability

    def record(self) -> dict[str, Any]:
        """What the coordinator keeps of this group: the generation and, while the group is Stable,
        its members with their assignments, so a restarted coordinator carries on without a
        rebalance (Kafka keeps the same in its offsets log). A group caught mid-rebalance keeps
        only its generation: its members rejoin, as they were about to anyway."""
        if self.state != STABLE:
            return {"generation": self.generation}
        return {"generation": self.generation, "protocol": self.protocol_name, "leader": self.leader,
                "members": [member.record() for member in self.members.values()]}

    def record_version(self) -> tuple:
        """Changes whenever `record()` would: cheap enough to compare around every request."""
        return (self.generation, tuple(self.members) if self.state == STABLE else None)

    @classmethod
    def from_record(cls, group_id: str, record: dict[str, Any], initial_delay_ms: int,
                    secrets: MemberSecrets = MemberSecrets()) -> "ClassicGroup":
        group = cls(group_id, int(record["generation"]), initial_delay_ms, secrets)
        members = [Member.from_record(row, 0) for row in record.get("members") or []]
        if members and record.get("leader") in {member.member_id for member in members}:
            group.members = {member.member_id: member for member in members}
            group.static = {member.instance_id: member.member_id for member in members if member.instance_id is not None}
            group.state, group.leader, group.protocol_name = STABLE, record["leader"], record["protocol"]
        return group

    def resume_sessions(self, now_ns: int) -> None:
        """After a restart every restored member gets a whole session to find the new coordinator."""
        for member in self.members.values():
            member.last_heartbeat_ns = now_ns

    # ------------------------------------------------------------------ views

    def describe(self, now_ns: int) -> list[MemberDescription]:
        described = []
        for member in self.members.values():
            partitions: list[tuple[str, int]] = []
            if member.assignment:
                try:
                    partitions = [tuple(tp) for tp in _assignment_decoder.decode(member.assignment).partitions]
                except msgspec.DecodeError:
                    partitions = []
            described.append(MemberDescription(
                member_id=member.member_id, group_instance_id=member.instance_id, client_id=member.client_id,
                assignment=partitions, last_heartbeat_ms_ago=(now_ns - member.last_heartbeat_ns) // MS,
                session_timeout_ms=member.session_timeout_ms))
        return described

    def invariants(self) -> None:
        assert (self.state == EMPTY) == (not self.members) or self.state == PREPARING, (
            f"group {self.group_id}: state {self.state} with {len(self.members)} members")
        if self.state in (COMPLETING, STABLE):
            assert self.leader in self.members, f"group {self.group_id}: leader {self.leader} is not a member"
        for instance_id, member_id in self.static.items():
            assert member_id in self.members and self.members[member_id].instance_id == instance_id

