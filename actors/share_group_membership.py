"""Share-group membership in the group coordinator (KIP-932): joins, heartbeats, leaves and
session timeouts.

A mixin of `ShareGroups` (actors/share_group.py), which owns the groups, the durable state, the
leaders and the parked acquires. Membership is soft state (unlike a classic group's, which is
stored: a rejoining share member loses nothing, since its locks are void after a restart anyway):
a member heartbeats; after its session timeout it is removed and every lock it held is released
(records available, counts kept), and the acquires parked on its group are served again. A group
id is a share group from its first share join (its settings are stored then); a classic group's
id is refused with INCONSISTENT_GROUP_PROTOCOL, and the classic join refuses ours.

A heartbeat is answered with every partition of the topics the member subscribes to; one that
needs a topic's partition count waits for metadata, at most HEARTBEAT_METADATA_WAIT_MS. Bounded:
groups, members per group, topics per member, distinct topic names over every group (each metadata
request gathers them). A group without `dead_letter_topic` refuses to subscribe a topic whose
default dead-letter topic, `<topic>.dlq`, could not exist.
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.actor import MS
from actors.client_secrets import refusal_text
from actors.deadlines import lowered
from actors.effects import Effect, Send, Trace
from actors.errors import ErrorCode
from actors.group_membership_budget import MEMBER_ID_SUFFIX_BYTES
from actors.group_offsets import is_topic_name
from actors.limits import Limits
from actors.messages import ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, ShareGroupSettings
from actors.share_partition import SharePartition
from actors.wire_bounds import text_bytes

GROUP_ID_LENGTH_MAX = 255
# A group without `dead_letter_topic` dead-letters a topic's records to `<topic>.dlq`.
DEAD_LETTER_SUFFIX = ".dlq"
# A heartbeat that needs a topic's partition count waits at most this long for metadata.
HEARTBEAT_METADATA_WAIT_MS = 1000


class ShareMemberState:
    __slots__ = ("member_id", "client_id", "topics", "session_timeout_ms", "last_seen_ns")

    def held_bytes(self) -> int:
        """What this member makes the coordinator hold: its ids and its subscription."""
        return text_bytes(self.member_id) + text_bytes(self.client_id) + sum(map(len, self.topics))

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
        # What its members hold (`held_bytes`), kept as they come, change and go: summed again at
        # each heartbeat, 30 members of 10,000 names each made every heartbeat ~9 ms.
        self.members_bytes = 0
        self.partitions: dict[tuple[str, int], SharePartition] = {}
        # Records in flight over its share-partitions (`share_records_in_flight_per_group_max`),
        # counted with the coordinator's total (ShareGroups._count_records).
        self.records_in_flight = 0


class ShareMembership:
    """Mixed into `ShareGroups` (actors/share_group.py), which owns `groups`, `state`, `limits`,
    `rng`, `secrets`, `leaders`, `waiting_heartbeats`, `subscribed`, `wrote`, `is_classic_group`,
    `session_floor_ns`, `_settle` and `_serve_group_parked`."""

    def _on_heartbeat(self, request: ShareGroupHeartbeatRequest, sender: Any, now_ns: int) -> list[Effect]:
        problem = self._check_heartbeat(request)
        group = self.groups.get(request.group_id)
        if problem is None and not request.leaving:
            problem = self._check_subscription(group, request)
        if problem is None and not request.leaving:
            problem = check_dead_letter_names(group.settings if group is not None else request.settings,
                                              request.topics, self.limits)
        if problem is None and group is None:
            problem = self._create_group(request)
            group = self.groups.get(request.group_id)
        if problem is None:
            problem = self._check_member(group, request, joining=not request.leaving)
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
            # One waits per member: a newer heartbeat is the one its member waits for. It waits
            # without its names (the member holds them, once each): a request may name one name
            # 10,000 times, and kept whole that held ~2.9 MB per member for up to a second.
            key = (group.group_id, member.member_id)
            self.waiting_heartbeats.pop(key, None)
            self.waiting_heartbeats[key] = (sender, msgspec.structs.replace(request, topics=[]), now_ns)
            return self.leaders.request_metadata(missing, now_ns, for_members=True)
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
        bad = next((topic for topic in request.topics if not is_topic_name(topic, limits)), None)
        if bad is not None:
            return ErrorCode.INVALID_REQUEST, f"{bad[:60]!r} is not a topic name"
        return None

    def _check_subscription(self, group: ShareGroup | None,
                            request: ShareGroupHeartbeatRequest) -> tuple[int, str] | None:
        """Share members count against the same byte bounds as classic ones
        (actors/group_membership_budget.py): 10,000 topic names of 249 characters, times 200
        members of 1,000 groups, would be half a terabyte (`groups_membership_bytes_max`); and
        one member (`group_member_bytes_max`) and one group (`group_membership_bytes_max`), or a
        DescribeGroup of 200 members with 100 KB client ids was 40 MB, past a client's frame."""
        known = group.members.get(request.member_id) if group is not None else None
        before = known.held_bytes() if known is not None else 0
        client_id = known.client_id if known is not None else request.client_id
        member_id_bytes = (text_bytes(request.member_id) if known is not None
                           else text_bytes(request.client_id or "member") + MEMBER_ID_SUFFIX_BYTES)
        # (Topic names are ASCII, checked above: their length is their size.)
        after = member_id_bytes + text_bytes(client_id) + sum(map(len, set(request.topics)))
        if after > self.limits.group_member_bytes_max:
            return ErrorCode.LIMIT_REACHED, (f"a share member of {after:,} bytes (ids and topic names); "
                                             f"group_member_bytes_max is {self.limits.group_member_bytes_max:,}")
        in_group = group.members_bytes if group is not None else 0
        if in_group - before + after > self.limits.group_membership_bytes_max:
            return ErrorCode.LIMIT_REACHED, (
                f"share group {request.group_id!r} would hold {in_group - before + after:,} bytes of members; "
                f"group_membership_bytes_max is {self.limits.group_membership_bytes_max:,}")
        limit = self.limits.groups_membership_bytes_max
        if self.members_bytes - before + after > limit:
            return ErrorCode.LIMIT_REACHED, (f"share members would hold {self.members_bytes - before + after:,} bytes; "
                                             f"groups_membership_bytes_max is {limit:,}")
        return self._check_names(known, request.topics)

    def _check_names(self, known: ShareMemberState | None, topics: list[str]) -> tuple[int, str] | None:
        """Whether the distinct names subscribed over every group stay within
        `share_subscribed_topics_max` with this member's subscription in place of its last."""
        subscribed = self.subscribed
        wanted = set(topics)
        added = sum(1 for topic in wanted if topic not in subscribed)
        if not added:
            return None
        dropped = 0 if known is None else sum(
            1 for topic in known.topics if topic not in wanted and subscribed[topic] == 1)
        most, names = self.limits.share_subscribed_topics_max, len(subscribed) + added - dropped
        if names > most:
            return ErrorCode.LIMIT_REACHED, (f"share members would subscribe to {names:,} distinct topic "
                                             f"names; share_subscribed_topics_max is {most:,}")
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

    def _check_member(self, group: ShareGroup, request: ShareGroupHeartbeatRequest,
                      joining: bool) -> tuple[int, str] | None:
        member_id = request.member_id
        if member_id and member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID, f"{member_id!r} is not a member of {group.group_id!r}; join again"
        if member_id and not self.secrets.proves(group.group_id, member_id, request.member_secret):
            return ErrorCode.UNKNOWN_MEMBER_ID, refusal_text(group.group_id, member_id)
        if joining and not member_id and len(group.members) >= self.limits.share_group_members_max:
            return ErrorCode.BUSY, f"share group {group.group_id!r} has its maximum of {len(group.members)} members"
        return None

    def _member_for(self, group: ShareGroup, request: ShareGroupHeartbeatRequest, now_ns: int) -> ShareMemberState:
        member = group.members.get(request.member_id)
        if member is None:
            member_id = f"{request.client_id or 'member'}-{self.rng.getrandbits(48):012x}"
            member = group.members[member_id] = ShareMemberState(member_id, request.client_id)
        else:
            self._count_member_bytes(group, -member.held_bytes())
            self._count_names(member.topics, -1)
        member.topics = sorted(set(request.topics))
        self._count_member_bytes(group, member.held_bytes())
        self._count_names(member.topics, 1)
        member.session_timeout_ms = request.session_timeout_ms
        member.last_seen_ns = now_ns
        # (A heartbeat only moves a session's end later: the floor stays below it.)
        self.session_floor_ns = lowered(self.session_floor_ns, now_ns + member.session_timeout_ms * MS + 1, now_ns)
        return member

    def _count_member_bytes(self, group: ShareGroup, change: int) -> None:
        group.members_bytes += change
        self.members_bytes += change

    def _count_names(self, topics: list[str], change: int) -> None:
        subscribed = self.subscribed
        for topic in topics:
            count = subscribed.get(topic, 0) + change
            if count:
                subscribed[topic] = count
            else:
                del subscribed[topic]
                self.leaders.unsubscribed(topic)

    def _heartbeat_answer(self, group: ShareGroup, member: ShareMemberState,
                          request: ShareGroupHeartbeatRequest) -> ShareGroupHeartbeatResponse:
        return ShareGroupHeartbeatResponse(
            correlation_id=request.correlation_id, member_id=member.member_id,
            member_secret=self.secrets.of(group.group_id, member.member_id),
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
        waiting = {}
        for key, (sender, request, since_ns) in self.waiting_heartbeats.items():
            group = self.groups.get(request.group_id)
            member = group.members.get(request.member_id) if group is not None else None
            if member is None:
                continue
            ready = all(topic in self.leaders.topics or topic in (answered or ()) for topic in member.topics)
            if ready or now_ns - since_ns >= HEARTBEAT_METADATA_WAIT_MS * MS:
                effects.append(Send(sender, self._heartbeat_answer(group, member, request)))
            else:
                waiting[key] = (sender, request, since_ns)
        self.waiting_heartbeats = waiting
        return effects

    def _remove_member(self, group: ShareGroup, member_id: str, why: str, now_ns: int) -> list[Effect]:
        member = group.members.pop(member_id)
        self._count_member_bytes(group, -member.held_bytes())
        self._count_names(member.topics, -1)
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
        return set(self.subscribed)


def check_dead_letter_names(settings: ShareGroupSettings, topics: list[str],
                            limits: Limits) -> tuple[int, str] | None:
    """A group without `dead_letter_topic` dead-letters to `<topic>.dlq`, which for a topic of the
    last few name lengths is longer than any topic may be: the controller refused to make it, and
    a rejected record waited to be dead-lettered for good, stalling its share-partition. Refused
    at the subscription instead, as SQS asks for a redrive target that exists."""
    if settings.dead_letter_topic:
        return None
    longest = limits.topic_name_length_max
    bad = next((topic for topic in topics if len(topic) + len(DEAD_LETTER_SUFFIX) > longest), None)
    if bad is None:
        return None
    return ErrorCode.INVALID_CONFIG, (
        f"topic {bad[:40]!r}... has {len(bad)} characters: its default dead-letter topic "
        f"(<topic>{DEAD_LETTER_SUFFIX}) would pass topic_name_length_max ({longest}); "
        f"subscribe it from a share group that sets dead_letter_topic")


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
    if topic and not is_topic_name(topic, limits):
        return f"dead_letter_topic {topic!r} is not a valid topic name"
    return None
