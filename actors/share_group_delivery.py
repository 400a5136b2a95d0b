"""Acquire and acknowledge in a share group (KIP-932): records handed to members, their answers,
and the acquires that wait for records.

A mixin of `ShareGroups` (actors/share_group.py), which owns the groups, the durable state and the
leaders; per-record delivery state lives in `SharePartition` (actors/share_partition.py).

- A request is served only for a member of the group that subscribes to the topic; any request
  from a member is proof of life.
- Every change to a share-partition is settled (stored, its new dead letters handed on) before
  the answer that tells of it goes out (`ShareGroups` sends replies inside `AfterFlush`).
- No offset at or above the last high watermark read is ever handed out. An acquire that finds
  nothing waits, parked for its max_wait_ms (at most share_acquire_wait_max_ms), until a higher
  high watermark, an answer, an expired lock or a departed member frees records; while acquires
  wait and the high watermark does not grow, it is read again every
  share_high_watermark_refresh_ms.

Bounded: share-partitions, parked acquires (BUSY beyond), acknowledgements per request.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from actors.actor import MS
from actors.client_secrets import refusal_text
from actors.effects import Effect, Send, SetTimer
from actors.errors import ErrorCode
from actors.messages import (
    ListOffsetsResponse, ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareAcquireRequest, ShareAcquireResponse,
)
from actors.share_group_membership import ShareGroup
from actors.share_partition import SharePartition

REFRESH_TIMER = "share-refresh"


class ParkedAcquire(NamedTuple):
    sender: Any
    request: ShareAcquireRequest
    deadline_ns: int


class Refusal(NamedTuple):
    code: int
    text: str


class ShareDelivery:
    """Mixed into `ShareGroups` (actors/share_group.py), which owns `groups`, `parked`, `limits`,
    `secrets`, `leaders`, `persist`, `_settle`, `_parked_floor_for` and `_touch`."""

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
        self._parked_floor_for(key)
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
        if not self.secrets.proves(group.group_id, member.member_id, request.member_secret):
            return Refusal(ErrorCode.UNKNOWN_MEMBER_ID, refusal_text(group.group_id, member.member_id))
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
        share_partition.topic_id = metadata.topic_id
        watch = self.leaders.watches.get(key)
        if watch is not None and watch.high_watermark >= 0:
            share_partition.observe_log(watch.log_start_offset, watch.high_watermark,
                                        *self._placing(group, share_partition))
            self.persist(group.group_id, share_partition)
        return group, share_partition

    def _placing(self, group: ShareGroup, share_partition: SharePartition) -> tuple[int, bool]:
        """For a window whose start is not placed yet: the topic's partition count now, and
        whether the topic gained this partition while the group read it (a placed sibling of the
        same topic id counted fewer partitions than this one's number)."""
        if share_partition.initialized:
            return 0, False
        topic, topic_id = share_partition.topic, share_partition.topic_id
        metadata = self.leaders.topics.get(topic)
        count = len(metadata.partitions) if metadata is not None and metadata.topic_id == topic_id else 0
        gained = any(other.initialized and other.topic == topic and other.topic_id == topic_id
                     and 0 < other.topic_partitions <= share_partition.partition
                     for other in group.partitions.values())
        return count, gained

    def _try_acquire(self, group: ShareGroup, share_partition: SharePartition, request: ShareAcquireRequest,
                     now_ns: int) -> ShareAcquireResponse | None:
        """The answer if records could be acquired (or the request is bad), None to keep waiting."""
        if request.max_records <= 0 or request.max_wait_ms < 0:
            return self._acquire_error(request, ErrorCode.INVALID_REQUEST,
                                       "max_records must be positive and max_wait_ms not negative")
        if not share_partition.initialized:
            return None
        max_records = min(request.max_records, self.limits.share_fetch_records_max)
        room = self._room_in_flight(group)
        acquisition = share_partition.acquire(request.member_id, max_records, now_ns, room)
        self._settle(group.group_id, share_partition)
        if not acquisition.acquired:
            return None
        return ShareAcquireResponse(correlation_id=request.correlation_id, topic=request.topic,
                                    partition=request.partition, acquired=acquisition.acquired,
                                    lock_deadline_ms=acquisition.lock_deadline_ns // MS,
                                    topic_id=share_partition.topic_id)

    def _room_in_flight(self, group: ShareGroup) -> int:
        """How many more records `group` may take in flight: what is left of its own bound, within
        what is left of its reservation and of the rest the groups share (actors/limits.py)."""
        limits = self.limits
        own = group.records_in_flight
        reserved = limits.share_records_in_flight_reserved_per_group
        shared = limits.share_records_in_flight_total_max - reserved * limits.share_groups_max
        return max(0, min(limits.share_records_in_flight_per_group_max - own,
                          max(0, reserved - own) + max(0, shared - self.pooled_in_flight),
                          limits.share_records_in_flight_total_max - self.records_in_flight))

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
        if request.topic_id and share_partition.topic_id and request.topic_id != share_partition.topic_id:
            # Records of a topic deleted and made again under its name: their offsets name other
            # records here, possibly locked to this same member under the same delivery count.
            return [Send(sender, ShareAcknowledgeResponse(
                correlation_id=request.correlation_id, error=ErrorCode.UNKNOWN_TOPIC_ID, topic=request.topic,
                partition=request.partition, error_message=(
                    f"the records answered are of topic id {request.topic_id:x}; {request.topic} is now "
                    f"topic id {share_partition.topic_id:x} (deleted and made again): nothing settled")))]
        limits = self.limits
        # A member acknowledges at most what it can hold: ranges that overlap or repeat (2,000
        # renewals of the same 2,000 records were 0.4 s of the coordinator every group shares).
        covered = sum(max(0, entry.last_offset - entry.first_offset + 1) for entry in request.acknowledgements)
        if len(request.acknowledgements) > limits.share_acknowledgements_per_request_max \
                or covered > limits.share_records_in_flight_max:
            return [Send(sender, ShareAcknowledgeResponse(
                correlation_id=request.correlation_id, error=ErrorCode.INVALID_REQUEST, topic=request.topic,
                partition=request.partition, error_message=(
                    f"at most {limits.share_acknowledgements_per_request_max} acknowledgements covering at most "
                    f"{limits.share_records_in_flight_max} offsets per request (asked: {covered} offsets)")))]
        results = [share_partition.acknowledge(request.member_id, acknowledgement, now_ns)
                   for acknowledgement in request.acknowledgements]
        self._settle(group.group_id, share_partition)
        reply = ShareAcknowledgeResponse(correlation_id=request.correlation_id, topic=request.topic,
                                         partition=request.partition, results=results)
        return [Send(sender, reply)] + self._serve_parked((group.group_id, request.topic, request.partition), now_ns)

    # ------------------------------------------------------------------ high watermarks: waking parked acquires

    def _on_list_offsets(self, key: tuple[str, int], response: ListOffsetsResponse, now_ns: int) -> list[Effect]:
        if response.error != ErrorCode.NONE or (response.topic, response.partition) != key:
            refused = self.leaders.high_watermark_refused(key, now_ns)  # refused, or about another partition
            for parked_key in [parked_key for parked_key in self.parked if parked_key[1:] == key]:
                self._parked_floor_for(parked_key)  # when its high watermark may be read again
            return refused
        grew = self.leaders.observe_high_watermark(key, response)
        effects: list[Effect] = []
        for group in self.groups.values():
            share_partition = group.partitions.get(key)
            if share_partition is None:
                continue
            share_partition.observe_log(response.log_start_offset, response.high_watermark,
                                        *self._placing(group, share_partition))
            self._settle(group.group_id, share_partition)
            if (group.group_id, *key) in self.parked:
                effects += self._serve_parked((group.group_id, *key), now_ns)
        waiting = [parked_key for parked_key in self.parked if parked_key[1:] == key]
        if not grew and waiting:
            effects.append(SetTimer(REFRESH_TIMER, now_ns + self.limits.share_high_watermark_refresh_ms * MS))
        for parked_key in waiting:
            self._parked_floor_for(parked_key)  # when its high watermark may be read again
        return effects

    def _refresh_waiting(self, now_ns: int) -> list[Effect]:
        """Re-read the high watermark of every partition that acquires are waiting on."""
        effects: list[Effect] = []
        for key in sorted({parked_key[1:] for parked_key in self.parked}):
            effects += self.leaders.refresh_high_watermark(key, now_ns)
        return effects
