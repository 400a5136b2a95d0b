"""Share groups in the group coordinator (KIP-932): membership, acquire and acknowledge, lock
expiry and long-polled acquires, with leaders and dead-lettering handed to their own modules.

`ShareGroups` is attached to the `GroupCoordinator` (actors/group_coordinator.py), which hands it
every message it does not handle itself and its 50 ms tick. Per-record delivery state lives in
`SharePartition` (actors/share_partition.py); this module owns what spans share-partitions:

- Membership is soft state (unlike a classic group's, which is stored: a rejoining share member
  loses nothing, since its locks are void after a restart anyway): a member heartbeats; after its
  session timeout it is removed and every lock it held is released (records available, counts kept). A
  group id is a share group from its first share join (its settings are stored then); a classic
  group's id is refused with INCONSISTENT_GROUP_PROTOCOL, and the classic join refuses ours.
- Durability: every change to a share-partition is put to the coordinator's `DurableState` before
  the member hears of it (replies go inside `AfterFlush`), so a restarted coordinator has every
  delivery count and every answer it acknowledged. Locks are not stored: after a restart they are
  void and the records available again.
- High watermarks and leaders come from `PartitionLeaders` (actors/share_leaders.py), which also
  numbers and times out every request this module sends; no offset at or above the last high
  watermark read is ever handed out, and a leader failover costs a retry, never share state
  (that lives here, not at the leader). An acquire that finds nothing waits, parked for its
  max_wait_ms (at most share_acquire_wait_max_ms), until a higher high watermark, an answer, an
  expired lock or a departed member frees records.
- Dead-lettering is exactly once: `DeadLetterWriter` (actors/share_dead_letters.py) writes the
  records as an idempotent producer and stores each write before sending it. This module hands
  it every share-partition's new dead letters, routes its requests' answers to it, and stores
  a write's outcome together with the records it archives (`put_many`).

Bounded: groups, members per group, share-partitions, parked acquires (BUSY beyond), requests in
flight (one metadata request, one ListOffsets per partition, one dead-letter write per
dead-letter partition).
"""

from __future__ import annotations

import random
from typing import Any, Callable, NamedTuple

import msgspec

from actors.actor import MS
from actors.effects import AfterFlush, Effect, Send, SetTimer, Trace
from actors.errors import ErrorCode
from actors.limits import Limits
from actors.messages import (
    CreateTopicResponse, DescribeGroupRequest, DescribeGroupResponse, DescribeSharePartitionsRequest,
    DescribeSharePartitionsResponse, ErrorResponse, FetchResponse, GroupSummary, InitProducerIdResponse,
    ListOffsetsResponse, MemberDescription, MetadataResponse, OffsetEntry, PeerDisconnected, ProduceResponse,
    ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareAcquireRequest, ShareAcquireResponse,
    ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, ShareGroupSettings, TimerFired,
)
from actors.share_dead_letters import DeadLetterWriter
from actors.share_leaders import Outbound, PartitionLeaders
from actors.share_partition import DEAD_LETTERING, DeadLetterItem, SharePartition

GROUP_ID_LENGTH_MAX = 255
# A heartbeat that needs a topic's partition count waits at most this long for metadata.
HEARTBEAT_METADATA_WAIT_MS = 1000
REFRESH_TIMER = "share-refresh"


class ShareMemberState:
    __slots__ = ("member_id", "client_id", "topics", "session_timeout_ms", "last_seen_ns")

    def __init__(self, member_id: str, client_id: str) -> None:
        self.member_id = member_id
        self.client_id = client_id
        self.topics: list[str] = []
        self.session_timeout_ms = 0
        self.last_seen_ns = 0


class ShareGroup:
    def __init__(self, group_id: str, settings: ShareGroupSettings) -> None:
        self.group_id = group_id
        self.settings = settings
        self.members: dict[str, ShareMemberState] = {}
        self.partitions: dict[tuple[str, int], SharePartition] = {}


class ParkedAcquire(NamedTuple):
    sender: Any
    request: ShareAcquireRequest
    deadline_ns: int


class Refusal(NamedTuple):
    code: int
    text: str


class ShareGroups:
    def __init__(self, *, state: Any, coordinator: str, limits: Limits, rng: random.Random,
                 is_classic_group: Callable[[str], bool]) -> None:
        self.state = state
        self.limits = limits
        self.rng = rng
        self.is_classic_group = is_classic_group
        self.groups: dict[str, ShareGroup] = {}
        self.parked: dict[tuple[str, str, int], list[ParkedAcquire]] = {}
        self.waiting_heartbeats: list[tuple[Any, ShareGroupHeartbeatRequest, int]] = []
        self.wrote = False  # something was put during this step: replies wait for the flush
        self.leaders = PartitionLeaders(coordinator=coordinator, limits=limits, topics_in_use=self._topics_in_use)
        self.dead_letters = DeadLetterWriter(self, self.leaders)
        self._load()

    # ------------------------------------------------------------------ durable state

    def _load(self) -> None:
        for key, value in self.state.items("share-group/"):
            group_id = key[len("share-group/"):]
            self.groups[group_id] = ShareGroup(group_id, msgspec.convert(value, ShareGroupSettings))
        for key, value in self.state.items("share-partition/"):
            group_id, topic, partition = key[len("share-partition/"):].rsplit("/", 2)
            group = self.groups.get(group_id)
            if group is not None:
                group.partitions[(topic, int(partition))] = SharePartition.restore(
                    topic, int(partition), group.settings, self.limits, value)
        self.dead_letters.load()
        for group in self.groups.values():
            for share_partition in group.partitions.values():
                self.dead_letters.enqueue(group.group_id, share_partition)

    def persist(self, group_id: str, share_partition: SharePartition) -> None:
        if share_partition.changed:
            self.state.put(_partition_key(group_id, share_partition), share_partition.stored())
            share_partition.changed = False
            self.wrote = True

    def put_many(self, items: list[tuple[str, Any]], touched: list[tuple[str, SharePartition]]) -> None:
        """Several changes that must survive a crash together (a dead-letter write's outcome)."""
        for group_id, share_partition in touched:
            items.append((_partition_key(group_id, share_partition), share_partition.stored()))
            share_partition.changed = False
        self.state.put_many(items)
        self.wrote = True

    def _settle(self, group_id: str, share_partition: SharePartition) -> None:
        """After any change: persist it and hand new dead letters to the writer."""
        self.dead_letters.enqueue(group_id, share_partition)
        self.persist(group_id, share_partition)

    def _finish(self, effects: list[Effect], now_ns: int) -> list[Effect]:
        effects += self.dead_letters.advance(now_ns)
        if self.wrote:
            self.wrote = False
            return [AfterFlush(self.state, tuple(effects))]
        return effects

    # ------------------------------------------------------------------ the coordinator's hooks

    def owns(self, group_id: str) -> bool:
        return group_id in self.groups

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect] | None:
        match message:
            case ShareAcquireRequest():
                effects = self._on_acquire(message, sender, now_ns)
            case ShareAcknowledgeRequest():
                effects = self._on_acknowledge(message, sender, now_ns)
            case ShareGroupHeartbeatRequest():
                effects = self._on_heartbeat(message, sender, now_ns)
            case DescribeSharePartitionsRequest():
                effects = [Send(sender, self._describe_partitions(message))]
            case MetadataResponse() | ListOffsetsResponse() | FetchResponse() | ProduceResponse() | \
                    CreateTopicResponse() | InitProducerIdResponse() | ErrorResponse():
                effects = self._on_response(message, now_ns)
            case PeerDisconnected():
                effects = self._on_disconnect(message.endpoint, now_ns)
            case TimerFired(name=name) if name == REFRESH_TIMER:
                effects = self._refresh_waiting(now_ns)
            case _:
                return None
        return self._finish(effects, now_ns)

    def needs_tick(self) -> bool:
        """Could a tick change anything? Sessions and locks belong to members; the rest is waiting
        requests, answers awaited and dead letters on their way. Nothing of it: no tick."""
        return bool(self.parked or self.waiting_heartbeats or self.leaders.pending or self.dead_letters.busy()
                    or any(group.members for group in self.groups.values()))

    def tick(self, now_ns: int) -> list[Effect]:
        effects = self._expire_members(now_ns)
        for group in self.groups.values():
            for share_partition in group.partitions.values():
                if share_partition.expire_locks(now_ns):
                    self._settle(group.group_id, share_partition)
        effects += self._expire_requests(now_ns)
        effects += self._serve_all_parked(now_ns)
        effects += self._answer_waiting_heartbeats(now_ns)
        effects += self._refresh_waiting(now_ns)
        effects += self.leaders.refresh_if_due(any(group.members for group in self.groups.values()), now_ns)
        return self._finish(effects, now_ns)

    def delete(self, group_id: str) -> tuple[int, str] | None:
        """Forget a share group and its share-partitions; refused while it has members or a record
        of it is still being dead-lettered (the write must finish, exactly once)."""
        group = self.groups[group_id]
        if group.members:
            return ErrorCode.NON_EMPTY_GROUP, f"share group {group_id!r} still has {len(group.members)} members"
        busy = [key for key, share_partition in group.partitions.items()
                if any(record.state == DEAD_LETTERING for record in share_partition.records.values())]
        if busy:
            return ErrorCode.NON_EMPTY_GROUP, (f"share group {group_id!r} is still dead-lettering records of "
                                               f"{busy[0][0]}/{busy[0][1]}; try again when that is done")
        for share_partition in group.partitions.values():
            self.state.delete(_partition_key(group_id, share_partition))
        self.state.delete(f"share-group/{group_id}")
        del self.groups[group_id]
        return None

    def summaries(self) -> list[GroupSummary]:
        return [GroupSummary(group_id=group_id, kind="share", state="Stable" if group.members else "Empty",
                             protocol_type="share", members=len(group.members))
                for group_id, group in sorted(self.groups.items())]

    def describe(self, request: DescribeGroupRequest, now_ns: int) -> DescribeGroupResponse:
        group = self.groups[request.group_id]
        members = [MemberDescription(
            member_id=member.member_id, client_id=member.client_id, assignment=self._partitions_of(member.topics),
            last_heartbeat_ms_ago=(now_ns - member.last_seen_ns) // MS, session_timeout_ms=member.session_timeout_ms)
            for _, member in sorted(group.members.items())]
        offsets = [OffsetEntry(topic=topic, partition=partition, offset=share_partition.start_offset)
                   for (topic, partition), share_partition in sorted(group.partitions.items())
                   if share_partition.initialized]
        return DescribeGroupResponse(
            correlation_id=request.correlation_id, group_id=request.group_id, kind="share",
            state="Stable" if group.members else "Empty", protocol_name="share", members=members, offsets=offsets)

    def _describe_partitions(self, request: DescribeSharePartitionsRequest) -> DescribeSharePartitionsResponse:
        group = self.groups.get(request.group_id)
        if group is None:
            return DescribeSharePartitionsResponse(
                correlation_id=request.correlation_id, error=ErrorCode.GROUP_ID_NOT_FOUND,
                error_message=f"{request.group_id!r} is not a share group", group_id=request.group_id)
        return DescribeSharePartitionsResponse(
            correlation_id=request.correlation_id, group_id=request.group_id, settings=group.settings,
            partitions=[share_partition.describe() for _, share_partition in sorted(group.partitions.items())])

    def invariants(self) -> None:
        parked = sum(len(waiting) for waiting in self.parked.values())
        assert parked <= self.limits.share_acquires_parked_max, f"{parked} parked acquires"
        for group in self.groups.values():
            assert len(group.members) <= self.limits.share_group_members_max, f"{group.group_id}: too many members"
            for share_partition in group.partitions.values():
                share_partition.invariants(group.members)  # and no lock is held by a departed member
        self.dead_letters.invariants()

    # ------------------------------------------------------------------ membership

    def _on_heartbeat(self, request: ShareGroupHeartbeatRequest, sender: Any, now_ns: int) -> list[Effect]:
        problem = self._check_heartbeat(request)
        group = self.groups.get(request.group_id)
        if problem is None and group is None:
            problem = self._create_group(request)
            group = self.groups.get(request.group_id)
        if problem is None:
            problem = self._check_member(group, request.member_id, joining=not request.leaving)
        if problem is not None:
            return [Send(sender, ShareGroupHeartbeatResponse(correlation_id=request.correlation_id, error=problem[0],
                                                             error_message=problem[1], member_id=request.member_id))]
        if request.leaving:
            effects = self._remove_member(group, request.member_id, "left", now_ns) if request.member_id else []
            return effects + [Send(sender, ShareGroupHeartbeatResponse(correlation_id=request.correlation_id))]
        member = self._member_for(group, request, now_ns)
        request = msgspec.structs.replace(request, member_id=member.member_id)
        missing = [topic for topic in member.topics if topic not in self.leaders.topics]
        if missing:
            self.waiting_heartbeats.append((sender, request, now_ns))
            return self.leaders.request_metadata(missing, now_ns)
        return [Send(sender, self._heartbeat_answer(group, member, request))]

    def _check_heartbeat(self, request: ShareGroupHeartbeatRequest) -> tuple[int, str] | None:
        limits = self.limits
        if not request.group_id or len(request.group_id) > GROUP_ID_LENGTH_MAX or "/" in request.group_id:
            return ErrorCode.INVALID_REQUEST, f"group id must be 1..{GROUP_ID_LENGTH_MAX} characters without '/'"
        low, high = limits.group_session_timeout_min_ms, limits.group_session_timeout_max_ms
        if not low <= request.session_timeout_ms <= high:
            return ErrorCode.INVALID_SESSION_TIMEOUT, (
                f"session_timeout_ms must be {limits.group_session_timeout_min_ms}.."
                f"{limits.group_session_timeout_max_ms}, got {request.session_timeout_ms}")
        if self.is_classic_group(request.group_id):
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"{request.group_id!r} is a classic consumer group"
        if len(request.topics) > limits.topics_max:
            return ErrorCode.INVALID_REQUEST, f"a member subscribes to at most {limits.topics_max} topics"
        return None

    def _create_group(self, request: ShareGroupHeartbeatRequest) -> tuple[int, str] | None:
        if request.member_id or request.leaving:
            return ErrorCode.UNKNOWN_MEMBER_ID, (
                f"share group {request.group_id!r} does not exist; join with no member id")
        if len(self.groups) >= self.limits.share_groups_max:
            return ErrorCode.BUSY, f"the coordinator holds its maximum of {self.limits.share_groups_max} share groups"
        problem = check_settings(request.settings, self.limits)
        if problem is not None:
            return ErrorCode.INVALID_CONFIG, problem
        self.groups[request.group_id] = ShareGroup(request.group_id, request.settings)
        self.state.put(f"share-group/{request.group_id}", msgspec.to_builtins(request.settings))
        self.wrote = True
        return None

    def _check_member(self, group: ShareGroup, member_id: str, joining: bool) -> tuple[int, str] | None:
        if member_id and member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID, f"{member_id!r} is not a member of {group.group_id!r}; join again"
        if joining and not member_id and len(group.members) >= self.limits.share_group_members_max:
            return ErrorCode.BUSY, f"share group {group.group_id!r} has its maximum of {len(group.members)} members"
        return None

    def _member_for(self, group: ShareGroup, request: ShareGroupHeartbeatRequest, now_ns: int) -> ShareMemberState:
        member = group.members.get(request.member_id)
        if member is None:
            member_id = f"{request.client_id or 'member'}-{self.rng.getrandbits(48):012x}"
            member = group.members[member_id] = ShareMemberState(member_id, request.client_id)
        member.topics = sorted(set(request.topics))
        member.session_timeout_ms = request.session_timeout_ms
        member.last_seen_ns = now_ns
        return member

    def _heartbeat_answer(self, group: ShareGroup, member: ShareMemberState,
                          request: ShareGroupHeartbeatRequest) -> ShareGroupHeartbeatResponse:
        return ShareGroupHeartbeatResponse(
            correlation_id=request.correlation_id, member_id=member.member_id,
            partitions=self._partitions_of(member.topics), heartbeat_interval_ms=member.session_timeout_ms // 3,
            settings=group.settings)

    def _partitions_of(self, topics: list[str]) -> list[tuple[str, int]]:
        known = self.leaders.topics
        return [(topic, partition) for topic in topics if topic in known
                for partition in range(len(known[topic].partitions))]

    def _answer_waiting_heartbeats(self, now_ns: int, answered: set[str] | None = None) -> list[Effect]:
        """Answer heartbeats whose topics metadata now covers (`answered`: topics the last metadata
        response spoke of, known or not), and any that waited HEARTBEAT_METADATA_WAIT_MS."""
        effects: list[Effect] = []
        waiting = []
        for sender, request, since_ns in self.waiting_heartbeats:
            group = self.groups.get(request.group_id)
            member = group.members.get(request.member_id) if group is not None else None
            if member is None:
                continue
            ready = all(topic in self.leaders.topics or topic in (answered or ()) for topic in member.topics)
            if ready or now_ns - since_ns >= HEARTBEAT_METADATA_WAIT_MS * MS:
                effects.append(Send(sender, self._heartbeat_answer(group, member, request)))
            else:
                waiting.append((sender, request, since_ns))
        self.waiting_heartbeats = waiting
        return effects

    def _remove_member(self, group: ShareGroup, member_id: str, why: str, now_ns: int) -> list[Effect]:
        member = group.members.pop(member_id)
        for key, share_partition in group.partitions.items():
            if share_partition.release_member(member_id, now_ns):
                self._settle(group.group_id, share_partition)
        trace = Trace("share-member-removed", {"group": group.group_id, "member": member_id, "why": why,
                                               "client": member.client_id})
        return [trace] + self._serve_group_parked(group, now_ns)

    def _expire_members(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        for group in self.groups.values():
            expired = [member_id for member_id, member in group.members.items()
                       if now_ns - member.last_seen_ns > member.session_timeout_ms * MS]
            for member_id in expired:
                effects += self._remove_member(group, member_id, "session timeout", now_ns)
        return effects

    def _touch(self, group: ShareGroup, member_id: str, now_ns: int) -> None:
        """Any request from a member is proof of life."""
        member = group.members.get(member_id)
        if member is not None:
            member.last_seen_ns = now_ns

    def _topics_in_use(self) -> set[str]:
        """Every topic a member subscribes to: each metadata request covers them all."""
        return {topic for group in self.groups.values() for member in group.members.values()
                for topic in member.topics}

    # ------------------------------------------------------------------ acquire

    def _on_acquire(self, request: ShareAcquireRequest, sender: Any, now_ns: int) -> list[Effect]:
        found = self._share_partition_for(request, now_ns)
        if isinstance(found, Refusal):
            code, text = found
            effects: list[Effect] = [Send(sender, self._acquire_error(request, code, text))]
            if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                effects += self.leaders.refresh_leaders(request.topic, now_ns)
            return effects
        group, share_partition = found
        self._touch(group, request.member_id, now_ns)
        reply = self._try_acquire(group, share_partition, request, now_ns)
        effects = self.leaders.watch_if_needed(share_partition, now_ns)
        if reply is not None or request.max_wait_ms <= 0:
            reply = reply or ShareAcquireResponse(correlation_id=request.correlation_id, topic=request.topic,
                                                  partition=request.partition)
            return effects + [Send(sender, reply)]
        if sum(len(waiting) for waiting in self.parked.values()) >= self.limits.share_acquires_parked_max:
            return effects + [Send(sender, self._acquire_error(request, ErrorCode.BUSY, "too many waiting acquires"))]
        wait_ms = min(request.max_wait_ms, self.limits.share_acquire_wait_max_ms)
        key = (group.group_id, request.topic, request.partition)
        self.parked.setdefault(key, []).append(ParkedAcquire(sender, request, now_ns + wait_ms * MS))
        return effects

    def _share_partition_for(self, request: ShareAcquireRequest | ShareAcknowledgeRequest,
                             now_ns: int) -> tuple[ShareGroup, SharePartition] | Refusal:
        group = self.groups.get(request.group_id)
        if group is None:
            return Refusal(ErrorCode.GROUP_ID_NOT_FOUND, f"{request.group_id!r} is not a share group")
        member = group.members.get(request.member_id)
        if member is None:
            return Refusal(ErrorCode.UNKNOWN_MEMBER_ID,
                           f"{request.member_id!r} is not a member of {group.group_id!r}; join again")
        if request.topic not in member.topics:
            return Refusal(ErrorCode.INVALID_REQUEST, f"{request.member_id} does not subscribe to {request.topic!r}")
        key = (request.topic, request.partition)
        share_partition = group.partitions.get(key)
        if share_partition is not None:
            return group, share_partition
        metadata = self.leaders.topics.get(request.topic)
        if metadata is None or not 0 <= request.partition < len(metadata.partitions):
            return Refusal(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{request.topic}/{request.partition} is not known")
        if sum(len(each.partitions) for each in self.groups.values()) >= self.limits.share_partitions_max:
            return Refusal(ErrorCode.BUSY, (
                f"the coordinator holds its maximum of {self.limits.share_partitions_max} share-partitions"))
        share_partition = group.partitions[key] = SharePartition(*key, group.settings, self.limits)
        watch = self.leaders.watches.get(key)
        if watch is not None and watch.high_watermark >= 0:
            share_partition.observe_log(watch.log_start_offset, watch.high_watermark)
            self.persist(group.group_id, share_partition)
        return group, share_partition

    def _try_acquire(self, group: ShareGroup, share_partition: SharePartition, request: ShareAcquireRequest,
                     now_ns: int) -> ShareAcquireResponse | None:
        """The answer if records could be acquired (or the request is bad), None to keep waiting."""
        if request.max_records <= 0 or request.max_wait_ms < 0:
            return self._acquire_error(request, ErrorCode.INVALID_REQUEST,
                                       "max_records must be positive and max_wait_ms not negative")
        if not share_partition.initialized:
            return None
        max_records = min(request.max_records, self.limits.share_fetch_records_max)
        acquisition = share_partition.acquire(request.member_id, max_records, now_ns)
        self._settle(group.group_id, share_partition)
        if not acquisition.acquired:
            return None
        return ShareAcquireResponse(correlation_id=request.correlation_id, topic=request.topic,
                                    partition=request.partition, acquired=acquisition.acquired,
                                    lock_deadline_ms=acquisition.lock_deadline_ns // MS)

    def _acquire_error(self, request: ShareAcquireRequest, code: int, text: str) -> ShareAcquireResponse:
        return ShareAcquireResponse(correlation_id=request.correlation_id, error=code, error_message=text,
                                    topic=request.topic, partition=request.partition)

    def _serve_parked(self, key: tuple[str, str, int], now_ns: int) -> list[Effect]:
        """Answer the parked acquires of one share-partition that can be answered now."""
        effects: list[Effect] = []
        still: list[ParkedAcquire] = []
        group = self.groups[key[0]]
        share_partition = group.partitions[key[1], key[2]]
        for parked in self.parked.pop(key, []):
            request = parked.request
            if request.member_id not in group.members:
                effects.append(Send(parked.sender, self._acquire_error(
                    request, ErrorCode.UNKNOWN_MEMBER_ID, f"{request.member_id!r} left the group")))
                continue
            reply = self._try_acquire(group, share_partition, request, now_ns)
            if reply is None and parked.deadline_ns <= now_ns:
                reply = ShareAcquireResponse(correlation_id=request.correlation_id, topic=request.topic,
                                             partition=request.partition)
            if reply is None:
                still.append(parked)
            else:
                effects.append(Send(parked.sender, reply))
        if still:
            self.parked[key] = still
        return effects

    def _serve_group_parked(self, group: ShareGroup, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        for key in [key for key in self.parked if key[0] == group.group_id]:
            effects += self._serve_parked(key, now_ns)
        return effects

    def _serve_all_parked(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        for key in list(self.parked):
            share_partition = self.groups[key[0]].partitions[key[1], key[2]]
            waiting = self.parked[key]
            if share_partition.can_acquire(now_ns) or any(parked.deadline_ns <= now_ns for parked in waiting):
                effects += self._serve_parked(key, now_ns)
        return effects

    # ------------------------------------------------------------------ acknowledge

    def _on_acknowledge(self, request: ShareAcknowledgeRequest, sender: Any, now_ns: int) -> list[Effect]:
        found = self._share_partition_for(request, now_ns)
        if isinstance(found, Refusal):
            code, text = found
            return [Send(sender, ShareAcknowledgeResponse(correlation_id=request.correlation_id, error=code,
                                                          error_message=text, topic=request.topic,
                                                          partition=request.partition))]
        group, share_partition = found
        self._touch(group, request.member_id, now_ns)
        if len(request.acknowledgements) > self.limits.share_acknowledgements_per_request_max:
            return [Send(sender, ShareAcknowledgeResponse(
                correlation_id=request.correlation_id, error=ErrorCode.INVALID_REQUEST, topic=request.topic,
                partition=request.partition, error_message=(
                    f"at most {self.limits.share_acknowledgements_per_request_max} acknowledgements per request")))]
        results = [share_partition.acknowledge(request.member_id, acknowledgement, now_ns)
                   for acknowledgement in request.acknowledgements]
        self._settle(group.group_id, share_partition)
        reply = ShareAcknowledgeResponse(correlation_id=request.correlation_id, topic=request.topic,
                                         partition=request.partition, results=results)
        return [Send(sender, reply)] + self._serve_parked((group.group_id, request.topic, request.partition), now_ns)

    # ------------------------------------------------------------------ high watermarks: waking parked acquires

    def _on_list_offsets(self, key: tuple[str, int], response: ListOffsetsResponse, now_ns: int) -> list[Effect]:
        if response.error != ErrorCode.NONE or (response.topic, response.partition) != key:
            return self.leaders.high_watermark_refused(key, now_ns)  # refused, or about another partition
        grew = self.leaders.observe_high_watermark(key, response)
        effects: list[Effect] = []
        for group in self.groups.values():
            share_partition = group.partitions.get(key)
            if share_partition is None:
                continue
            share_partition.observe_log(response.log_start_offset, response.high_watermark)
            self._settle(group.group_id, share_partition)
            if (group.group_id, *key) in self.parked:
                effects += self._serve_parked((group.group_id, *key), now_ns)
        if not grew and any(parked_key[1:] == key for parked_key in self.parked):
            effects.append(SetTimer(REFRESH_TIMER, now_ns + self.limits.share_high_watermark_refresh_ms * MS))
        return effects

    def _refresh_waiting(self, now_ns: int) -> list[Effect]:
        """Re-read the high watermark of every partition that acquires are waiting on."""
        effects: list[Effect] = []
        for key in sorted({parked_key[1:] for parked_key in self.parked}):
            effects += self.leaders.refresh_high_watermark(key, now_ns)
        return effects

    def _on_metadata(self, response: MetadataResponse, now_ns: int) -> list[Effect]:
        self.dead_letters.on_metadata(response)
        self.leaders.observe_metadata(response)
        effects = self._answer_waiting_heartbeats(now_ns, {topic.name for topic in response.topics})
        return effects + self._refresh_waiting(now_ns)

    # ------------------------------------------------------------------ answers to the coordinator's requests

    def _on_response(self, response: Any, now_ns: int) -> list[Effect]:
        outbound = self.leaders.answered(response.correlation_id, response)
        if outbound is None:
            return []
        return self._dispatch(outbound, response, now_ns)

    def _dispatch(self, outbound: Outbound, response: Any, now_ns: int) -> list[Effect]:
        if outbound.kind == "metadata":
            return self._on_metadata(response, now_ns) if isinstance(response, MetadataResponse) else []
        if outbound.kind == "list-offsets":
            if isinstance(response, ErrorResponse):
                response = ListOffsetsResponse(correlation_id=response.correlation_id, error=response.error,
                                               error_message=response.error_message)
            return self._on_list_offsets(outbound.key, response, now_ns)
        return self.dead_letters.on_response(outbound, response, now_ns)

    def _fail(self, correlation: int, code: int, now_ns: int) -> list[Effect]:
        """A request that will never be answered: answer it ourselves with a retriable error."""
        response = ErrorResponse(correlation_id=correlation, error=code, error_message="no answer")
        outbound = self.leaders.answered(correlation, response)
        assert outbound is not None, f"request {correlation} is not in flight"
        return self._dispatch(outbound, response, now_ns)

    def _expire_requests(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        for correlation in self.leaders.overdue(now_ns):
            effects += self._fail(correlation, ErrorCode.REQUEST_TIMED_OUT, now_ns)
        return effects

    def _on_disconnect(self, endpoint: str, now_ns: int) -> list[Effect]:
        """A peer's process is gone: its answers will never come."""
        effects: list[Effect] = []
        for correlation in self.leaders.disconnected(endpoint, now_ns):
            effects += self._fail(correlation, ErrorCode.NOT_LEADER, now_ns)
        return effects

    # ------------------------------------------------------------------ for the dead-letter writer

    def share_partition_of(self, item: DeadLetterItem) -> SharePartition | None:
        group = self.groups.get(item.group_id)
        return group.partitions.get((item.topic, item.partition)) if group is not None else None

    def dead_letter_topic(self, item: DeadLetterItem) -> str:
        group = self.groups.get(item.group_id)
        configured = group.settings.dead_letter_topic if group is not None else ""
        return configured or f"{item.topic}.dlq"

    def after_archive(self, item: DeadLetterItem, now_ns: int) -> list[Effect]:
        """Archived records may move the start offset, which makes room for parked acquires."""
        key = (item.group_id, item.topic, item.partition)
        return self._serve_parked(key, now_ns) if key in self.parked else []


def check_settings(settings: ShareGroupSettings, limits: Limits) -> str | None:
    """Why these settings cannot make a share group, or None."""
    low, high = limits.share_visibility_timeout_min_ms, limits.share_visibility_timeout_max_ms
    if not low <= settings.visibility_timeout_ms <= high:
        return f"visibility_timeout_ms must be {low}..{high}, got {settings.visibility_timeout_ms}"
    if not 1 <= settings.max_delivery_attempts <= limits.share_delivery_attempts_max:
        return (f"max_delivery_attempts must be 1..{limits.share_delivery_attempts_max}, "
                f"got {settings.max_delivery_attempts}")
    if settings.auto_offset_reset not in ("earliest", "latest"):
        return f"auto_offset_reset must be earliest or latest, not {settings.auto_offset_reset!r}"
    topic = settings.dead_letter_topic
    if topic and (len(topic) > limits.topic_name_length_max or topic in (".", "..")
                  or not all(character.isalnum() or character in "._-" for character in topic)):
        return f"dead_letter_topic {topic!r} is not a valid topic name"
    return None


def _partition_key(group_id: str, share_partition: SharePartition) -> str:
    return f"share-partition/{group_id}/{share_partition.topic}/{share_partition.partition}"
