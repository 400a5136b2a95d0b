"""A consumer's life as a member of a classic group (the client side of Kafka's group protocol).

    unjoined --coordinator known--> joining --JoinGroup ok--> syncing --SyncGroup ok--> stable
    stable --REBALANCE_IN_PROGRESS / subscription or partition-count change--> revoking --> joining
    stable --ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID--> (partitions lost) joining
    any --leave/close--> left          any --FENCED_INSTANCE_ID--> fenced (fatal)

Revocation happens in the user's thread (the `on_revoke` callback, and the last commit of an
auto-committing consumer), so before rejoining the member asks the shell with a
("revoke", ...) notification and waits for its "revoked" command. With an eager assignor
(`range`, `round-robin`) every partition is revoked before each rebalance; with
`cooperative-sticky` (KIP-429) a member keeps what it owns, revokes only what the new assignment
moves away, and rejoins once more so the moved partitions reach their new owner.

The shell answers every ("revoke", ...) notification, lost ones included, with one "revoked",
in order, when its user's thread gets to it (after the batch it is processing, after the commit
the revocation makes). The member joins only once every notification it sent is answered, as
Kafka's consumer runs onPartitionsRevoked / onPartitionsLost in poll before it rejoins: a member
that rejoined first could be given back a partition whose late revocation the shell then
applies (it forgets the partition's position and drops every record fetched for it after), and
would hold partitions in a generation whose new owners already have them.

One JoinGroup is in flight at a time (Kafka's AbstractCoordinator keeps one join future): each
answer is an identity, and a member that took every answer it was sent (a paused coordinator
answering a burst of retries) synced as each and owned the union of their assignments. A new
join drops a sync in flight; an error answering a heartbeat of a membership the member has
already left (an earlier generation or member id) changes nothing. An answer that breaks the
protocol (a JoinGroup success naming no member, an assignment refused) makes the next join wait a
backoff that doubles while such answers keep coming (KIP-580).

The leader member runs the assignor (actors/assignors.py) with the members' subscriptions and the
partition counts from metadata, and hands the result to the coordinator in SyncGroup.
`max_poll_interval_ms` without a poll from the user makes the member leave the group (its
partitions go to members that are making progress) until the next poll.

Three mixins hold the rest of a member's life: how it reaches its coordinator (finding it,
requests, timeouts: actors/consumer_member_coordinator.py), how it takes the assignment SyncGroup
gives it and the positions of its new partitions (actors/consumer_member_assignment.py), and the
user's commits and committed-offsets lookups (actors/consumer_member_offsets.py).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec

from actors.actor import MS
from actors.assignors import COOPERATIVE_ASSIGNORS, AssignorError, Subscription, assign, cooperative_adjust
from actors.effects import Effect, Notify, Trace
from actors.errors import ErrorCode, RailmqError
from actors.consumer_member_assignment import AssignmentIntake
from actors.consumer_member_coordinator import CoordinatorLink, caller_of
from actors.consumer_member_offsets import MemberOffsets
from actors.messages import (
    ClientCommand, ConsumerAssignment, ErrorResponse, GroupProtocol, HeartbeatRequest, HeartbeatResponse,
    JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, MemberAssignment,
    MetadataResponse, OffsetCommitResponse, OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse,
)

if TYPE_CHECKING:
    from actors.consumer_client import ConsumerClient

_subscription_codec = msgspec.msgpack.Decoder(Subscription)
_encoder = msgspec.msgpack.Encoder()


def _subscription_of(data: bytes) -> Subscription:
    """A joined member's subscription; one that does not decode subscribes to nothing (so that
    member is given nothing, and the others are not held up by it)."""
    try:
        return _subscription_codec.decode(data)
    except msgspec.DecodeError:
        return Subscription(topics=[])


# After an answer that breaks the protocol (a JoinGroup success naming no member or an impossible
# generation, an assignment refused), the next join waits: from JOIN_BACKOFF_MS (Kafka's
# retry.backoff.ms), doubling to JOIN_BACKOFF_MAX_MS (KIP-580's retry.backoff.max.ms), so a
# coordinator that keeps sending one is not asked again once per round trip. The errors of the
# protocol's normal flow (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS) rejoin at
# once, as Kafka's consumer does.
JOIN_BACKOFF_MS = 100
JOIN_BACKOFF_MAX_MS = 1_000


class GroupSettings(msgspec.Struct, frozen=True, kw_only=True):
    group_id: str
    group_instance_id: str | None = None
    client_id: str = "consumer"
    assignor: str = "range"
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    max_poll_interval_ms: int = 300_000
    request_timeout_ms: int = 30_000
    metadata_refresh_ms: int = 1_000


class ConsumerMember(CoordinatorLink, AssignmentIntake, MemberOffsets):
    def __init__(self, client: "ConsumerClient", settings: GroupSettings) -> None:
        self.client = client
        self.settings = settings
        self.state = "unjoined"
        self.topics: list[str] = []
        self.pattern: re.Pattern | None = None
        self.member_id = ""
        self.member_secret = b""  # from the join answer that named member_id; carried in its requests
        self.generation = -1
        self.leader = ""
        self.protocol = ""
        self.owned: list[tuple[str, int]] = []
        self.coordinator = ""
        self.pending: dict[int, tuple[str, Any, int, str]] = {}  # correlation -> (kind, token/extra, deadline, to)
        self.last_heartbeat_ns = 0
        self.last_poll_ns = 0
        self.last_metadata_ns = 0
        self.assigned_counts: dict[str, int] = {}
        self.rejoin_reason = ""
        self.join_after_revoke = False
        self.revocations_unanswered = 0  # ("revoke", ...) notifications the shell has not answered
        self.left_for_poll_timeout = False
        self.joined_members: list = []
        self.join_not_before_ns = 0  # no join before this: an answer broke the protocol
        self.broken_answers = 0  # in a row since the last assignment taken (the backoff doubles)
        self.sync_again: tuple[int, SyncGroupRequest] | None = None  # the leader's sync refused BUSY
        self.computed_own: list[tuple[str, int]] | None = None  # as leader: what it assigned itself
        self.unreachable: dict[str, int] = {}
        self.coordinator_incarnation = 0  # of the process at `coordinator`, as metadata said
        self.dead_incarnation: dict[str, int] = {}  # endpoint -> the incarnation seen gone there

    # ------------------------------------------------------------------ lifecycle

    def start(self, now_ns: int) -> list[Effect]:
        self.last_poll_ns = now_ns
        return []

    def stop(self, now_ns: int) -> list[Effect]:
        return self._leave("the consumer closed", now_ns)

    # ------------------------------------------------------------------ commands from the shell

    def on_command(self, command: ClientCommand, now_ns: int) -> list[Effect]:
        arguments = command.arguments
        match command.command:
            case "subscribe":
                self.topics = sorted(arguments.get("topics") or [])
                self.pattern = re.compile(arguments["pattern"]) if arguments.get("pattern") else None
                return self._request_rejoin("subscription changed", now_ns) + self.client.request_metadata([])
            case "polled":
                self.last_poll_ns = now_ns
                if self.left_for_poll_timeout:
                    self.left_for_poll_timeout = False
                    return self._join(now_ns)
                return []
            case "revoked":
                return self._on_revoked(now_ns)
            case "commit":
                return self._commit(command, now_ns)
            case "committed":
                return self._committed(command, now_ns)
            case "leave":
                effects = self._leave(arguments.get("reason", "the consumer left"), now_ns)
                return effects + [Notify("result", (command.token, None, None))]
        return [Notify("result", (command.token, None, RailmqError(ErrorCode.INVALID_REQUEST,
                                                                     f"unknown command {command.command!r}")))]

    # ------------------------------------------------------------------ metadata

    def on_metadata(self, response: MetadataResponse, now_ns: int) -> list[Effect]:
        self.last_metadata_ns = now_ns
        effects: list[Effect] = self._learn_coordinator(response, now_ns)
        if self.pattern is not None:
            matched = sorted(t.name for t in response.topics if self.pattern.fullmatch(t.name) and t.error == 0)
            if matched and matched != self.topics:
                self.topics = matched
                effects += self._request_rejoin("pattern matched new topics", now_ns)
        if self.state == "stable" and self.member_id == self.leader and self._counts_changed():
            effects += self._request_rejoin("partition count changed", now_ns)
        if self.state == "unjoined" and self.coordinator and self.topics:
            effects += self._join(now_ns)
        if self.state == "awaiting-metadata":
            effects += self._lead_assignment(now_ns)
        return effects

    def _counts_changed(self) -> bool:
        """A subscribed topic grew, shrank, or appeared (created after the assignment)."""
        for topic, count in self.assigned_counts.items():
            metadata = self.client.topics.get(topic)
            if (len(metadata.partitions) if metadata is not None else 0) != count:
                return True
        return False

    # ------------------------------------------------------------------ joining

    def _request_rejoin(self, reason: str, now_ns: int) -> list[Effect]:
        self.rejoin_reason = reason
        if self.state in ("stable", "syncing", "joining"):
            return self._begin_rebalance(reason, now_ns)
        return []

    def _begin_rebalance(self, reason: str, now_ns: int) -> list[Effect]:
        """Revoke what must go (in the user's thread), then join."""
        cooperative = self.settings.assignor in COOPERATIVE_ASSIGNORS
        to_revoke = [] if cooperative else list(self.owned)
        if not to_revoke:
            return self._join(now_ns)
        self.state = "revoking"
        self.join_after_revoke = True
        return [self._revoke(to_revoke, lost=False),
                Trace("member-revoking", {"reason": reason, "partitions": to_revoke})]

    def _revoke(self, partitions: list[tuple[str, int]], *, lost: bool) -> Notify:
        self.revocations_unanswered += 1
        return Notify("revoke", (partitions, lost))

    def _on_revoked(self, now_ns: int) -> list[Effect]:
        self.revocations_unanswered = max(0, self.revocations_unanswered - 1)
        if self.state != "revoking" or self.revocations_unanswered:
            return []  # an earlier revocation's answer: the user's thread has more to do
        if self.settings.assignor not in COOPERATIVE_ASSIGNORS:
            self.owned = []
            self.client.assign([], now_ns)
        if self.join_after_revoke:
            return self._join(now_ns)
        self.state = "stable"
        return []

    def _join(self, now_ns: int) -> list[Effect]:
        if self.revocations_unanswered:
            self.state = "revoking"  # the user's thread is still revoking: join once it answered
            self.join_after_revoke = True
            return []
        if not self.coordinator or not self.topics or now_ns < self.join_not_before_ns:
            self.state = "unjoined"  # the tick joins once the backoff has passed (see deadlines)
            return []
        self.state = "joining"
        if any(kind == "join" for kind, *_ in self.pending.values()):
            return []  # one join in flight (each answer is an identity): its answer, or its timeout, comes
        for correlation in [c for c, (kind, *_) in self.pending.items() if kind in ("sync", "positions")]:
            # Rejoining: an earlier sync's answer, or the committed offsets asked for an earlier
            # generation's partitions, are no longer wanted — and such a request timing out must
            # not unseat the membership of a later generation (the simulator's seed 2423: it did,
            # and the member joined again without revoking what it held).
            del self.pending[correlation]
        subscription = Subscription(topics=list(self.topics), owned=[tuple(tp) for tp in self.owned])
        request = JoinGroupRequest(
            correlation_id=0, group_id=self.settings.group_id, member_id=self.member_id,
            member_secret=self.member_secret, group_instance_id=self.settings.group_instance_id,
            client_id=self.settings.client_id,
            session_timeout_ms=self.settings.session_timeout_ms, rebalance_timeout_ms=self.settings.max_poll_interval_ms,
            protocols=[GroupProtocol(name=self.settings.assignor, metadata=_encoder.encode(subscription))],
            reason=self.rejoin_reason)
        return self._send("join", request, now_ns, timeout_ms=self._join_retry_ms())

    def _on_join_response(self, response: JoinGroupResponse, now_ns: int) -> list[Effect]:
        code = response.error
        if code == ErrorCode.NONE and (not response.member_id or response.generation < 0):
            return self.join_after_backoff(f"JoinGroup succeeded with member id {response.member_id[:64]!r} in "
                                           f"generation {response.generation}", now_ns)
        if code == ErrorCode.NONE:
            self.member_id, self.generation = response.member_id, response.generation
            self.member_secret = response.member_secret
            self.leader, self.protocol = response.leader, response.protocol_name
            self.joined_members = response.members
            self.computed_own = None
            if self.member_id == self.leader and response.members:
                self.state = "awaiting-metadata"
                return self._lead_assignment(now_ns)
            return self._sync(now_ns, [])
        return self._on_group_error(code, response.error_message, now_ns)

    def join_after_backoff(self, reason: str, now_ns: int) -> list[Effect]:
        """The coordinator's answer broke the protocol: join again, after the backoff."""
        delay_ms = self._backoff_ms()
        self.join_not_before_ns = now_ns + delay_ms * MS
        self.rejoin_reason = reason
        self.state = "unjoined"
        return [Trace("member-answer-refused", {"reason": reason, "join_in_ms": delay_ms})]

    def _backoff_ms(self) -> int:
        self.broken_answers += 1
        return min(JOIN_BACKOFF_MAX_MS, JOIN_BACKOFF_MS << min(self.broken_answers - 1, 10))

    def _lead_assignment(self, now_ns: int) -> list[Effect]:
        """As leader: run the assignor once metadata covers every subscribed topic."""
        subscriptions = {m.member_id: _subscription_of(m.metadata) for m in self.joined_members}
        topics = sorted({topic for sub in subscriptions.values() for topic in sub.topics})
        counts = {t: len(self.client.topics[t].partitions) for t in topics if t in self.client.topics}
        missing = [t for t in topics if t not in counts]
        if missing and now_ns - self.last_metadata_ns > 50 * MS:
            self.state = "awaiting-metadata"
            return self.client.request_metadata(missing)
        try:
            target = assign(self.protocol, subscriptions, counts)
            if self.protocol in COOPERATIVE_ASSIGNORS:
                owned = {member: list(sub.owned) for member, sub in subscriptions.items()}
                target = cooperative_adjust(target, owned).assignment
        except AssignorError as error:
            # The coordinator chose a protocol nobody proposed, or the members' subscriptions
            # cannot be assigned: ask the group again rather than sync a guess.
            self.rejoin_reason = f"the join answer cannot be assigned: {error}"
            return [Trace("member-assignment-failed", {"generation": self.generation, "error": str(error)})] + \
                self._join(now_ns)
        assignments = [MemberAssignment(member_id=member, assignment=_encoder.encode(
            ConsumerAssignment(partitions=[tuple(tp) for tp in partitions]))) for member, partitions in sorted(target.items())]
        self.assigned_counts = {topic: counts.get(topic, 0) for topic in topics}  # 0: not created yet
        self.computed_own = sorted({tuple(tp) for tp in target.get(self.member_id, [])})
        return [Trace("assignment-computed", {"generation": self.generation, "assignor": self.protocol,
                                              "assignment": {m: list(p) for m, p in target.items()}})] + self._sync(now_ns, assignments)

    def _sync(self, now_ns: int, assignments: list[MemberAssignment]) -> list[Effect]:
        self.state = "syncing"
        request = SyncGroupRequest(correlation_id=0, group_id=self.settings.group_id, generation=self.generation,
                                   member_id=self.member_id, member_secret=self.member_secret,
                                   group_instance_id=self.settings.group_instance_id, assignments=assignments)
        return self._send("sync", request, now_ns, request, timeout_ms=self._join_retry_ms())

    def _join_retry_ms(self) -> int:
        """A join may legitimately wait for slower members, but its answer can also be lost (a
        dropped connection, a coordinator restart): re-asking after a session timeout is safe —
        the coordinator only replaces this member's waiting request, or starts a new rebalance
        if the lost answer had completed one."""
        return max(self.settings.session_timeout_ms, self.settings.request_timeout_ms)

    # ------------------------------------------------------------------ staying in

    def deadlines(self):
        """When each thing `tick` does falls due: the consumer's timer fires no later."""
        for _, _, deadline, _ in self.pending.values():
            yield deadline + 1
        if self.topics or self.pattern:
            yield self.last_metadata_ns + self.settings.metadata_refresh_ms * MS + 1
        if self.state == "stable":
            yield self.last_poll_ns + self.settings.max_poll_interval_ms * MS + 1
        if self.state == "unjoined" and self.coordinator and self.topics:
            yield self.join_not_before_ns
        if self.sync_again is not None:
            yield self.sync_again[0]
        if self.state in ("stable", "revoking", "syncing") and self.generation >= 0:
            yield self.last_heartbeat_ns + self.settings.heartbeat_interval_ms * MS

    def tick(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = self._expire_pending(now_ns)
        if now_ns - self.last_metadata_ns > self.settings.metadata_refresh_ms * MS and (self.topics or self.pattern):
            effects += self.client.request_metadata([] if self.pattern else list(self.topics))
        if self.state == "stable" and now_ns - self.last_poll_ns > self.settings.max_poll_interval_ms * MS:
            effects += self._leave("max_poll_interval_ms passed without a poll", now_ns)
            self.left_for_poll_timeout = True
            return effects
        if self.state == "unjoined" and self.coordinator and self.topics and now_ns >= self.join_not_before_ns:
            effects += self._join(now_ns)
        if self.sync_again is not None and now_ns >= self.sync_again[0]:
            effects += self._sync_again(now_ns)
        if self.state in ("stable", "revoking", "syncing") and self.generation >= 0 and \
                now_ns - self.last_heartbeat_ns >= self.settings.heartbeat_interval_ms * MS:
            self.last_heartbeat_ns = now_ns
            effects += self._send("heartbeat", HeartbeatRequest(
                correlation_id=0, group_id=self.settings.group_id, generation=self.generation,
                member_id=self.member_id, member_secret=self.member_secret,
                group_instance_id=self.settings.group_instance_id), now_ns,
                (self.generation, self.member_id))
        return effects

    def _on_group_error(self, code: int, text: str, now_ns: int) -> list[Effect]:
        effects: list[Effect] = [Trace("member-error", {"error": code, "message": text, "state": self.state})]
        if code == ErrorCode.FENCED_INSTANCE_ID:
            self.state = "fenced"
            return effects + [Notify("fatal", RailmqError(code, text))]
        if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
            if code == ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id, self.member_secret = "", b""
            lost = list(self.owned)
            self.owned, self.generation = [], -1
            self.client.assign([], now_ns)
            if lost:
                effects.append(self._revoke(lost, lost=True))  # lost, not revoked: no commit is possible
            return effects + self._join(now_ns)
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            return effects + self._begin_rebalance("the coordinator started a rebalance", now_ns)
        if code in (ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR, ErrorCode.UNKNOWN_MESSAGE):
            # Find the coordinator again. A stable member carries on there in its generation (the
            # group's state moved with the coordinator, as Kafka's does); a join or sync in
            # progress starts over.
            self.coordinator = ""
            if self.state not in ("stable", "revoking"):
                self.state = "unjoined"
            return effects + self.client.request_metadata(list(self.topics))
        self.state = "unjoined"
        if code in (ErrorCode.INCONSISTENT_GROUP_PROTOCOL, ErrorCode.INVALID_SESSION_TIMEOUT, ErrorCode.INVALID_REQUEST):
            effects.append(Notify("fatal", RailmqError(code, text)))
        return effects

    def _leave(self, reason: str, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        if self.member_id and self.coordinator and self.settings.group_instance_id is None:
            leave = LeaveGroupRequest(correlation_id=0, group_id=self.settings.group_id, reason=reason,
                                      member_id=self.member_id, member_secret=self.member_secret)
            effects += self._send("leave", leave, now_ns)
        self.owned, self.generation, self.state = [], -1, "left"
        if self.settings.group_instance_id is None:
            self.member_id, self.member_secret = "", b""
        self.client.assign([], now_ns)
        return effects + [Trace("member-left", {"reason": reason})]

    # ------------------------------------------------------------------ responses

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        if isinstance(message, HeartbeatResponse) and message.correlation_id == 0:
            # The coordinator's unsolicited "rebalancing" notice (actors/classic_group.py).
            if message.error == ErrorCode.REBALANCE_IN_PROGRESS and self.state == "stable" and \
                    sender == self.coordinator:
                return self._begin_rebalance("the coordinator announced a rebalance", now_ns)
            return []
        entry = self._take_answer(message, sender)
        if entry is None:
            return []  # not an answer to anything asked there (a server reusing a correlation id)
        kind, token, _, _ = entry
        if isinstance(message, ErrorResponse):
            if kind in ("commit", "user-fetch"):
                return [Notify("result", (caller_of(kind, token), None, RailmqError(message.error, message.error_message)))]
            if message.error == ErrorCode.BUSY:
                return self._on_busy(kind, token, message.error_message, now_ns)
            return self._on_group_error(message.error, message.error_message, now_ns)
        match kind, message:
            case "join", JoinGroupResponse():
                return self._on_join_response(message, now_ns)
            case "sync", SyncGroupResponse():
                return self._on_sync_response(message, now_ns)
            case "heartbeat", HeartbeatResponse():
                if message.error == ErrorCode.NONE or token != (self.generation, self.member_id):
                    return []  # an answer about a membership this member has already left changes nothing
                return self._on_group_error(message.error, message.error_message, now_ns)
            case "positions", OffsetFetchResponse():
                return self._on_positions(message, token, now_ns)
            case "commit", OffsetCommitResponse():
                return self._on_commit_response(message, token, now_ns)
            case "user-fetch", OffsetFetchResponse():
                return [Notify("result", (token, message.offsets, None))]
            case "leave", LeaveGroupResponse():
                return []
        return [Trace("member-unexpected", {"kind": kind, "message": type(message).__name__})]
