"""The group coordinator: consumer groups' membership and their committed offsets.

It hosts every group of the cluster (one process; Kafka spreads groups over brokers by hashing
the group id, which a local cluster does not need). Per-group membership logic is in
`classic_group.py` (and `share_group.py` for share groups); this module dispatches requests,
runs the timers, and owns durability:

- committed offsets and each group's generation are written to the durable state and flushed
  before the reply (`AfterFlush`), so a restarted coordinator has every acknowledged commit and
  never reuses a generation (zombies from before the restart stay fenced);
- so is the membership of every Stable group (members, assignments, leader): a restarted
  coordinator gives each of them a fresh session and they carry on in the same generation, with
  no rebalance and no rewind to committed offsets; members of a group that was mid-rebalance
  get UNKNOWN_MEMBER_ID and rejoin.

Commit fencing (the zombie rule): a commit must come from a current member with the current
generation; a commit with generation -1 and no member id is an administrative commit (offset
reset) and is only accepted while the group has no members.

A request naming a member must carry the secret that member's join was answered with
(actors/client_secrets.py), derived from `client_key`: the cluster secret in a cluster, so every
group voter and every restart derive the same secrets and none is stored.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec

from actors.actor import MS
from actors.classic_group import EMPTY, PREPARING, ClassicGroup
from actors.client_secrets import MemberSecrets
from actors.controller_endpoints import ControllerEndpoints
from actors.deadlines import DeadlineTimer
from actors.effects import AfterFlush, Effect, Send, SetTimer, Trace
from actors.errors import ErrorCode
from actors.group_membership_budget import MembershipBudget
from actors.group_offsets import OffsetStore, check_entry, check_group_id, entry_bytes, offset_from_record
from actors.limits import DEFAULT_LIMITS, Limits
from actors.messages import (
    DeleteGroupRequest, DeleteGroupResponse, DescribeGroupRequest, DescribeGroupResponse, ErrorResponse,
    FetchResponse, GroupSummary, HeartbeatRequest, InitProducerIdResponse, JoinGroupRequest, LeaveGroupRequest,
    ListGroupsRequest, ListGroupsResponse, ListOffsetsResponse, MetadataResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetEntry, OffsetFetchRequest, ProduceResponse,
    ServiceHeartbeat, ServiceHeartbeatResponse, Stop, SyncGroupRequest, SyncGroupResponse, TimerFired,
)
from storage.errors import CorruptState

CLUSTER_ANSWERS = (MetadataResponse, ListOffsetsResponse, FetchResponse, ProduceResponse, InitProducerIdResponse,
                   ServiceHeartbeatResponse)


ANNOUNCE_CORRELATION_ID = 1 << 40  # the group coordinator's announcements (never a request id of its own)

class GroupCoordinator:
    def __init__(self, *, state: Any, coordinator: str, endpoint: str, incarnation: int, pid: int = 0,
                 limits: Limits = DEFAULT_LIMITS, rng: random.Random | None = None,
                 name: str = "group-coordinator", client_key: bytes = b"") -> None:
        self.name = name
        self.secrets = MemberSecrets(client_key)
        # At the next session expiry, rebalance deadline or share-group deadline. A step wants the
        # deadlines of the classic groups it touched (`touched`) and, if it went to the share
        # groups, theirs; the tick wants everyone's again.
        self.timer = DeadlineTimer()
        self.touched: set[str] = set()
        self.share_stepped = True  # the last step went to the share groups (or started them)
        self.state = state
        self.controllers = ControllerEndpoints(coordinator)
        self.announce_unanswered = False
        self.endpoint = endpoint
        self.incarnation = incarnation
        self.pid = pid
        self.limits = limits
        self.rng = rng or random.Random(incarnation)
        self.groups: dict[str, ClassicGroup] = {}
        self.offsets = OffsetStore(limits)
        self.membership = MembershipBudget(limits)  # the bytes members hold, bounded
        from actors.share_group import ShareGroups  # share groups (KIP-932), loaded from the same state
        self.share: Any = _from_record("share-group/ and share-partition/", lambda: ShareGroups(
            state=state, coordinator=coordinator, limits=limits, rng=self.rng, secrets=self.secrets,
            is_classic_group=lambda group_id: group_id in self.groups or group_id in self.offsets))
        self._load()

    def _load(self) -> None:
        """Groups and committed offsets from the state. A record this coordinator cannot have
        written (a bug, or a file from elsewhere) refuses the start with `CorruptState` naming its
        key: skipping it would forget a commit, and the group would re-read or skip records."""
        delay_ms = self.limits.group_initial_rebalance_delay_ms
        for key, value in self.state.items("group/"):
            group_id = key[len("group/"):]
            self.groups[group_id] = _from_record(
                key, lambda: ClassicGroup.from_record(group_id, value, delay_ms, self.secrets))
        for key, value in self.state.items("offset/"):
            self.offsets.load(*_from_record(key, lambda: offset_from_record(key, value)))
        for group in self.groups.values():
            self.membership.measure(group)

    def _new_group(self, group_id: str) -> ClassicGroup:
        return ClassicGroup(group_id, 0, self.limits.group_initial_rebalance_delay_ms, self.secrets)

    def needs_authentication(self, message: Any) -> bool:
        """Answers to what the coordinator asked (metadata, high watermarks, records, dead-letter
        writes, producer ids) come from processes of this cluster; requests come from anyone."""
        return isinstance(message, CLUSTER_ANSWERS)

    def start(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = self._announce(now_ns)
        for group in self.groups.values():
            if group.members:
                group.resume_sessions(now_ns)
                effects.append(Trace("group-restored", {"group": group.group_id, "generation": group.generation,
                                                        "members": list(group.members)}))
        self.timer.want(now_ns)  # a first tick at once: dead-letter writes stored before a restart go on
        return effects + self.timer.arm(now_ns)

    def invariants(self) -> None:
        for group in self.groups.values():
            group.invariants()
        self.membership.invariants(self.groups)
        self.offsets.invariants()
        if self.share is not None:
            self.share.invariants()  # share groups: their partitions' windows, locks and delivery counts
        # Every share deadline after a step that went to the share groups; after one that did not,
        # their state is as it was and the timer only moved earlier: their earliest suffices.
        missed = self.timer.uncovered(self._deadlines(every_share_deadline=self.share_stepped))
        assert missed is None, f"{self.name}: the timer would fire after the deadline at {missed} ns"

    def _deadlines(self, every_share_deadline: bool = False) -> list[int]:
        """The classic groups' deadlines, and the share groups' earliest as their last step ended
        (or, for invariants(), every one of theirs)."""
        deadlines: list[int] = []
        for group in self.groups.values():
            deadlines += group.deadlines()
        if self.share is not None:
            if every_share_deadline:
                deadlines += self.share.deadlines()
            elif self.share.next_deadline_ns is not None:
                deadlines.append(self.share.next_deadline_ns)
        return deadlines

    # ------------------------------------------------------------------ dispatch

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        self.share_stepped = isinstance(message, TimerFired)  # the tick steps the share groups too
        effects = self._dispatch(message, sender, now_ns)
        for group_id in self.touched:
            group = self.groups.get(group_id)
            if group is not None:
                self.timer.want_all(group.deadlines(), now_ns)
                self.membership.measure_if_reshaped(group)
            else:
                self.membership.forget(group_id)
        self.touched.clear()
        return effects + self.timer.arm(now_ns)

    def _dispatch(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        match message:
            case HeartbeatRequest():
                return self._with_group(message, sender, lambda group: group.heartbeat(message, sender, now_ns))
            case OffsetCommitRequest():
                return self._on_commit(message, sender, now_ns)
            case OffsetFetchRequest():
                return [Send(sender, self.offsets.answer_fetch(message))]
            case JoinGroupRequest():
                return self._on_join(message, sender, now_ns)
            case SyncGroupRequest():
                return self._with_group(message, sender, lambda group: self._sync(group, message, sender, now_ns))
            case LeaveGroupRequest():
                return self._with_group(message, sender, lambda group: group.leave(message, sender, now_ns))
            case TimerFired(name="tick"):
                return self._on_tick(now_ns)
            case TimerFired(name="announce"):
                return self._announce(now_ns)
            case ListGroupsRequest():
                return [Send(sender, self._list_groups(message))]
            case DescribeGroupRequest():
                return [Send(sender, self._describe(message, now_ns))]
            case DeleteGroupRequest():
                return self._on_delete(message, sender)
            case OffsetDeleteRequest():
                return self._on_offset_delete(message, sender)
            case ServiceHeartbeatResponse():
                self.announce_unanswered = False
                return []
            case ErrorResponse() if (message.correlation_id == ANNOUNCE_CORRELATION_ID
                                     and self.controllers.take(message)):
                return [Send(self.controllers.current, self._announcement())]  # to the voter it named
            case Stop():
                self.state.flush()
                return []
        if self.share is not None:
            handled = self.share.handle(message, sender, now_ns)
            if handled is not None:
                self.share_stepped = True
                if self.share.next_deadline_ns is not None:
                    self.timer.want(self.share.next_deadline_ns)
                return handled
        return [Send(sender, ErrorResponse(
            correlation_id=getattr(message, "correlation_id", -1), error=ErrorCode.UNKNOWN_MESSAGE,
            error_message=f"the group coordinator does not handle {type(message).__name__}"))]

    def _announcement(self) -> ServiceHeartbeat:
        return ServiceHeartbeat(correlation_id=ANNOUNCE_CORRELATION_ID, role="group-coordinator",
                                endpoint=self.endpoint, pid=self.pid, incarnation=self.incarnation)

    def _announce(self, now_ns: int) -> list[Effect]:
        """Tell the active controller where group coordination is (metadata answers name it):
        at once when it starts, then once per node heartbeat interval (metadata stops naming it
        a node session after the last). A new active group voter announces itself at once, so
        failover does not wait for this."""
        if self.announce_unanswered:
            self.controllers.rotate()  # that voter did not answer the last one: try the next
        self.announce_unanswered = True
        interval = self.limits.node_heartbeat_interval_ms
        return [Send(self.controllers.current, self._announcement()), SetTimer("announce", now_ns + interval * MS)]

    def _with_group(self, message: Any, sender: Any, action: Any) -> list[Effect]:
        group = self.groups.get(message.group_id)
        if group is None:
            return [Send(sender, ErrorResponse(correlation_id=message.correlation_id, error=ErrorCode.UNKNOWN_MEMBER_ID,
                                               error_message=f"group {message.group_id!r} has no members"))]
        before = group.record_version()
        return self._persist(group, before, action(group))

    def _persist(self, group: ClassicGroup, before: tuple, effects: list[Effect]) -> list[Effect]:
        """A new generation, and a stable group's membership, are durable before anyone hears of them."""
        self.touched.add(group.group_id)  # its deadlines may have moved
        if group.record_version() == before:
            return effects
        self.state.put(f"group/{group.group_id}", group.record())
        return [AfterFlush(self.state, tuple(effects))]

    # ------------------------------------------------------------------ membership

    def _on_join(self, request: JoinGroupRequest, sender: Any, now_ns: int) -> list[Effect]:
        limits = self.limits
        problem = None
        if check_group_id(request.group_id) is not None:
            problem = (ErrorCode.INVALID_REQUEST, check_group_id(request.group_id))
        elif request.group_id not in self.groups and len(self.groups) >= limits.groups_max:
            problem = (ErrorCode.LIMIT_REACHED, f"the coordinator holds its maximum of {limits.groups_max} groups "
                                                "(groups_max); delete groups that are no longer used")
        elif len(request.protocols) > limits.group_protocols_max:
            problem = (ErrorCode.INVALID_REQUEST, f"a member names at most {limits.group_protocols_max} assignors "
                                                  f"(group_protocols_max), not {len(request.protocols)}")
        elif not limits.group_session_timeout_min_ms <= request.session_timeout_ms <= limits.group_session_timeout_max_ms:
            problem = (ErrorCode.INVALID_SESSION_TIMEOUT, (
                f"session_timeout_ms must be {limits.group_session_timeout_min_ms}.."
                f"{limits.group_session_timeout_max_ms}, got {request.session_timeout_ms}"))
        elif not 0 < request.rebalance_timeout_ms <= limits.group_rebalance_timeout_max_ms:
            problem = (ErrorCode.INVALID_REQUEST, (
                f"rebalance_timeout_ms must be 1..{limits.group_rebalance_timeout_max_ms} "
                f"(group_rebalance_timeout_max_ms), got {request.rebalance_timeout_ms}"))
        elif self.share is not None and self.share.owns(request.group_id):
            problem = (ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"{request.group_id!r} is a share group")
        group = self.groups.get(request.group_id)
        if problem is None and group is not None and not request.member_id and len(group.members) >= limits.group_members_max:
            problem = (ErrorCode.BUSY, f"group {request.group_id!r} has its maximum of {limits.group_members_max} members")
        if problem is None and (too_large := self.membership.refuse_join(group, request)) is not None:
            problem = (ErrorCode.LIMIT_REACHED, too_large)
        if problem is not None:
            from actors.messages import JoinGroupResponse

            return [Send(sender, JoinGroupResponse(correlation_id=request.correlation_id, error=problem[0],
                                                   error_message=problem[1], member_id=request.member_id))]
        if group is None:
            group = self.groups[request.group_id] = self._new_group(request.group_id)
        before = group.record_version()
        member_id = f"{request.client_id or 'member'}-{self.rng.getrandbits(48):012x}"
        effects = group.join(request, sender, now_ns, member_id)
        self.membership.measure(group)  # a rejoin may change its subscription and nothing else
        return self._persist(group, before, effects)

    def _sync(self, group: ClassicGroup, request: SyncGroupRequest, sender: Any, now_ns: int) -> list[Effect]:
        too_large = self.membership.refuse_assignments(group, request)
        if too_large is not None:
            return [Send(sender, SyncGroupResponse(correlation_id=request.correlation_id, error=ErrorCode.LIMIT_REACHED,
                                                   error_message=too_large))]
        effects = group.sync(request, sender, now_ns)
        self.membership.measure(group)
        return effects

    def _on_tick(self, now_ns: int) -> list[Effect]:
        """Sessions, joins and share-group work that fell due. A coordinator with no member
        anywhere and nothing in flight has no deadline and sets no timer."""
        self.timer.fired()
        effects: list[Effect] = []
        for group in self.groups.values():
            before = group.record_version()
            effects += self._persist(group, before, group.tick(now_ns))
        if self.share is not None:
            effects += self.share.tick(now_ns)
        self.timer.want_all(self._deadlines(), now_ns)
        return effects

    # ------------------------------------------------------------------ offsets

    def _on_commit(self, request: OffsetCommitRequest, sender: Any, now_ns: int) -> list[Effect]:
        group = self.groups.get(request.group_id)
        problem = self._check_commit(request, group)
        problems = ""
        if problem is not None:
            code, text = problem
            results = [msgspec.structs.replace(entry, error=code) for entry in request.offsets]
            return [Send(sender, OffsetCommitResponse(correlation_id=request.correlation_id, error=code,
                                                      error_message=text, offsets=results))]
        results = []
        timestamp = now_ns // MS
        for entry in request.offsets:
            kept = OffsetEntry(topic=entry.topic, partition=entry.partition, offset=entry.offset,
                               metadata=entry.metadata, commit_timestamp_ms=timestamp, leader_epoch=entry.leader_epoch,
                               topic_id=entry.topic_id)
            invalid = check_entry(entry, self.limits)
            limit = None if invalid is not None else self.offsets.over_budget(request.group_id, kept)
            if invalid is not None or limit is not None:
                code, text = invalid if invalid is not None else (ErrorCode.LIMIT_REACHED, limit)
                results.append(msgspec.structs.replace(entry, error=code))
                problems = problems or text
                continue
            self.offsets.put(request.group_id, kept)
            self.state.put(f"offset/{request.group_id}/{entry.topic}/{entry.partition}",
                           [entry.offset, entry.metadata, timestamp, entry.leader_epoch,
                            *([entry.topic_id] if entry.topic_id else [])])
            results.append(kept)
        if group is None and request.group_id in self.offsets:
            group = self.groups[request.group_id] = self._new_group(request.group_id)
            self.state.put(f"group/{request.group_id}", group.record())
        reply = OffsetCommitResponse(correlation_id=request.correlation_id, offsets=results, error_message=problems)
        return [AfterFlush(self.state, (Send(sender, reply),))]

    def _check_commit(self, request: OffsetCommitRequest, group: ClassicGroup | None) -> tuple[ErrorCode, str] | None:
        invalid = check_group_id(request.group_id)
        if invalid is not None:
            return ErrorCode.INVALID_REQUEST, invalid
        if self.share is not None and self.share.owns(request.group_id):
            # Refused as a classic join is: an administrative commit (no member needed) made a
            # classic group of a share group's id, and every heartbeat of the share group was
            # refused from then on, so its members left and it delivered nothing more.
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL, (
                f"{request.group_id!r} is a share group: its progress is its share-partitions' state, "
                "not offsets")
        if len(request.offsets) > self.limits.group_offsets_max:
            return ErrorCode.LIMIT_REACHED, f"a commit holds at most {self.limits.group_offsets_max} entries"
        size = sum(entry_bytes(request.group_id, entry) for entry in request.offsets)
        if size > self.limits.group_commit_bytes_max:
            return ErrorCode.LIMIT_REACHED, (f"a commit of {size:,} bytes of offsets is more than "
                                             f"group_commit_bytes_max ({self.limits.group_commit_bytes_max:,}); "
                                             "commit in smaller requests")
        if group is None and len(self.groups) >= self.limits.groups_max:
            return ErrorCode.LIMIT_REACHED, (f"the coordinator holds its maximum of {self.limits.groups_max} groups "
                                             "(groups_max); delete groups that are no longer used")
        if request.generation < 0 and not request.member_id:
            if group is not None and group.members:
                return ErrorCode.NON_EMPTY_GROUP, (
                    f"group {request.group_id!r} has {len(group.members)} active members; stop them before resetting offsets")
            return None
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, f"group {request.group_id!r} has no members"
        problem = group.check_member(request.member_id, request.group_instance_id, request.generation,
                                     request.member_secret)
        if problem is not None:
            return problem
        if group.state not in (PREPARING, "Stable"):
            return ErrorCode.REBALANCE_IN_PROGRESS, "the group is completing a rebalance; commit after it"
        return None

    # ------------------------------------------------------------------ admin

    def _list_groups(self, request: ListGroupsRequest) -> ListGroupsResponse:
        groups = [GroupSummary(group_id=group_id, state=group.state, members=len(group.members))
                  for group_id, group in sorted(self.groups.items())]
        if self.share is not None:
            groups += self.share.summaries()
        return ListGroupsResponse(correlation_id=request.correlation_id, groups=groups)

    def _describe(self, request: DescribeGroupRequest, now_ns: int) -> DescribeGroupResponse:
        if self.share is not None and self.share.owns(request.group_id):
            return self.share.describe(request, now_ns)
        group = self.groups.get(request.group_id)
        stored = self.offsets.get(request.group_id, {})
        offsets = [stored[key] for key in sorted(stored)]
        if group is None:
            if not stored:
                return DescribeGroupResponse(correlation_id=request.correlation_id, error=ErrorCode.GROUP_ID_NOT_FOUND,
                                             error_message=f"group {request.group_id!r} does not exist",
                                             group_id=request.group_id)
            return DescribeGroupResponse(correlation_id=request.correlation_id, group_id=request.group_id,
                                         state=EMPTY, offsets=offsets)
        return DescribeGroupResponse(
            correlation_id=request.correlation_id, group_id=request.group_id, state=group.state,
            protocol_name=group.protocol_name, generation=group.generation, leader=group.leader,
            members=group.describe(now_ns), offsets=offsets)

    def _on_offset_delete(self, request: OffsetDeleteRequest, sender: Any) -> list[Effect]:
        group = self.groups.get(request.group_id)
        if group is None and request.group_id not in self.offsets:
            return [Send(sender, OffsetDeleteResponse(correlation_id=request.correlation_id,
                                                      error=ErrorCode.GROUP_ID_NOT_FOUND,
                                                      error_message=f"group {request.group_id!r} does not exist"))]
        if group is not None and group.members:
            return [Send(sender, OffsetDeleteResponse(
                correlation_id=request.correlation_id, error=ErrorCode.NON_EMPTY_GROUP,
                error_message=f"group {request.group_id!r} has {len(group.members)} active members; stop them first"))]
        deleted = self.offsets.delete_partitions(request.group_id, [tuple(p) for p in request.partitions])
        for topic, partition in deleted:
            self.state.delete(f"offset/{request.group_id}/{topic}/{partition}")
        reply = OffsetDeleteResponse(correlation_id=request.correlation_id, deleted=deleted)
        return [AfterFlush(self.state, (Send(sender, reply),))]

    def _on_delete(self, request: DeleteGroupRequest, sender: Any) -> list[Effect]:
        if self.share is not None and self.share.owns(request.group_id):
            refused = self.share.delete(request.group_id)
            if refused is not None:
                return [Send(sender, DeleteGroupResponse(correlation_id=request.correlation_id, error=refused[0],
                                                         error_message=refused[1]))]
            return [AfterFlush(self.state, (Send(sender, DeleteGroupResponse(correlation_id=request.correlation_id)),))]
        group = self.groups.get(request.group_id)
        if group is None and request.group_id not in self.offsets:
            return [Send(sender, DeleteGroupResponse(correlation_id=request.correlation_id,
                                                     error=ErrorCode.GROUP_ID_NOT_FOUND,
                                                     error_message=f"group {request.group_id!r} does not exist"))]
        if group is not None and group.members:
            return [Send(sender, DeleteGroupResponse(correlation_id=request.correlation_id, error=ErrorCode.NON_EMPTY_GROUP,
                                                     error_message=f"group {request.group_id!r} still has members"))]
        self.groups.pop(request.group_id, None)
        self.membership.forget(request.group_id)
        for topic, partition in self.offsets.delete_group(request.group_id):
            self.state.delete(f"offset/{request.group_id}/{topic}/{partition}")
        self.state.delete(f"group/{request.group_id}")
        return [AfterFlush(self.state, (Send(sender, DeleteGroupResponse(correlation_id=request.correlation_id)),))]


def _from_record(key: str, build: Any) -> Any:
    """`build()`, reading the record(s) under `key`; what malformed input raises becomes CorruptState."""
    try:
        return build()
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        raise CorruptState(f"the group state's records {key[:200]!r} are malformed "
                           f"({type(error).__name__}: {str(error)[:120]})") from None
