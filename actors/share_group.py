"""Share groups in the group coordinator (KIP-932): the state they share and the messages they
take, with membership, delivery, deadlines, leaders and dead-lettering in their own modules.

`ShareGroups` is attached to the `GroupCoordinator` (actors/group_coordinator.py), which hands it
every message it does not handle itself, and its timer's fire at their next deadline. Per-record
delivery state lives in `SharePartition` (actors/share_partition.py); this module owns what spans
share-partitions:

- Membership (actors/share_group_membership.py) is soft state: a member heartbeats; after its
  session timeout it is removed and every lock it held is released (records available, counts
  kept). Acquire and acknowledge, and the acquires parked until records are free, are in
  actors/share_group_delivery.py.
- Durability: every change to a share-partition is put to the coordinator's `DurableState` before
  the member hears of it (replies go inside `AfterFlush`), so a restarted coordinator has every
  delivery count and every answer it acknowledged. Locks are not stored: after a restart they are
  void and the records available again.
- High watermarks and leaders come from `PartitionLeaders` (actors/share_leaders.py), which also
  numbers and times out every request this module sends; this module routes each answer by its
  kind, and a leader failover costs a retry, never share state (that lives here, not at the
  leader).
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
from collections import Counter
from typing import Any, Callable

import msgspec

from actors.client_secrets import MemberSecrets, ProducerSecrets
from actors.dead_letter_records import DeadLetterItem
from actors.deadlines import lowered
from actors.effects import AfterFlush, Effect, Send, Trace
from actors.errors import ErrorCode
from actors.limits import Limits
from actors.messages import (
    CreateTopicResponse, DescribeGroupRequest, DescribeGroupResponse, DescribeSharePartitionsRequest,
    DescribeSharePartitionsResponse, ErrorResponse, FetchResponse, GroupSummary, InitProducerIdResponse,
    ListOffsetsResponse, MetadataResponse, OffsetEntry, PeerDisconnected, ProduceResponse,
    ShareAcknowledgeRequest, ShareAcquireRequest, ShareGroupHeartbeatRequest, ShareGroupSettings, TimerFired,
)
from actors.share_dead_letters import DeadLetterWriter
from actors.share_group_deadlines import ShareDeadlines
from actors.share_group_delivery import REFRESH_TIMER, ParkedAcquire, ShareDelivery
from actors.share_group_membership import DEAD_LETTER_SUFFIX, ShareGroup, ShareMembership
from actors.share_leaders import Outbound, PartitionLeaders
from actors.share_descriptions import describe_members, describe_partitions
from actors.share_partition import DEAD_LETTERING, SharePartition


class ShareGroups(ShareMembership, ShareDelivery, ShareDeadlines):
    def __init__(self, *, state: Any, coordinator: str, limits: Limits, rng: random.Random,
                 is_classic_group: Callable[[str], bool], secrets: MemberSecrets = MemberSecrets()) -> None:
        self.state = state
        self.limits = limits
        self.rng = rng
        self.secrets = secrets  # a member's requests carry its secret (actors/client_secrets.py)
        # The dead-letter writer's producer ids are the cluster's like any producer's: it derives
        # their secrets under the same key, so a restart needs none stored.
        self.producer_secrets = ProducerSecrets(secrets.key)
        self.is_classic_group = is_classic_group
        self.groups: dict[str, ShareGroup] = {}
        self.parked: dict[tuple[str, str, int], list[ParkedAcquire]] = {}
        # (group, member) -> (sender, heartbeat without its names, since when): one waits per member.
        self.waiting_heartbeats: dict[tuple[str, str], tuple[Any, ShareGroupHeartbeatRequest, int]] = {}
        self.members_bytes = 0  # ids and subscriptions of every member (ShareMemberState.held_bytes)
        # Topic name -> members subscribing to it, over every group (`share_subscribed_topics_max`).
        self.subscribed: dict[str, int] = {}
        # Records in flight over every share-partition (`share_records_in_flight_total_max`),
        # counted again whenever a share-partition changed (`persist`, `put_many`).
        self.records_in_flight = 0
        # ... of which groups hold beyond their reservations
        # (`share_records_in_flight_reserved_per_group`): what they take of the shared rest.
        self.pooled_in_flight = 0
        self.wrote = False  # something was put during this step: replies wait for the flush
        # Share-partitions changed during this step, put once at its end (`_finish`): a step that
        # acquires, acknowledges and serves parked acquires changes one window several times.
        self.unpersisted: dict[tuple[str, str, int], tuple[str, SharePartition]] = {}
        # The earliest deadline at the end of the last step (`_finish`), for the coordinator's
        # timer: every change to share state is made in a step that ends there. Sessions, locks
        # and parked acquires can be many (members, share-partitions, parked acquires), so a step
        # does not look at each: it lowers a floor for each kind as deadlines are born (members
        # joining, locks taken, acquires parked, delayed releases and high-watermark reads of
        # parked partitions), and the tick sets the floors exactly again. A floor at or before now
        # makes the coordinator tick at once.
        self.next_deadline_ns: int | None = None
        self.session_floor_ns: int | None = None
        self.lock_floor_ns: int | None = None
        self.parked_floor_ns: int | None = None
        self.step_ns = 0  # the time of the step in progress
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
                self._count_records(group, share_partition)

    def _count_records(self, group: ShareGroup, share_partition: SharePartition) -> None:
        size = len(share_partition.records)
        self._add_in_flight(group, size - share_partition.counted_records)
        share_partition.counted_records = size

    def _add_in_flight(self, group: ShareGroup, records: int) -> None:
        reserved = self.limits.share_records_in_flight_reserved_per_group
        pooled_before = max(0, group.records_in_flight - reserved)
        group.records_in_flight += records
        self.records_in_flight += records
        self.pooled_in_flight += max(0, group.records_in_flight - reserved) - pooled_before

    def persist(self, group_id: str, share_partition: SharePartition) -> None:
        """Put the share-partition's change before anyone hears of it: at the end of this step,
        before the flush its replies wait for."""
        self._count_records(self.groups[group_id], share_partition)
        if share_partition.changed:
            self.unpersisted[(group_id, share_partition.topic, share_partition.partition)] = (group_id, share_partition)
            self.wrote = True

    def _put_unpersisted(self) -> None:
        for group_id, share_partition in self.unpersisted.values():
            if share_partition.changed:
                self.state.put(_partition_key(group_id, share_partition), share_partition.stored())
                share_partition.changed = False
        self.unpersisted.clear()

    def put_many(self, items: list[tuple[str, Any]], touched: list[tuple[str, SharePartition]]) -> None:
        """Several changes that must survive a crash together (a dead-letter write's outcome)."""
        for group_id, share_partition in touched:
            self._count_records(self.groups[group_id], share_partition)
            items.append((_partition_key(group_id, share_partition), share_partition.stored()))
            share_partition.changed = False
        self.state.put_many(items)
        self.wrote = True

    def _settle(self, group_id: str, share_partition: SharePartition) -> None:
        """After any change: persist it, hand new dead letters to the writer, and lower the floors
        by the deadlines it made (a lock taken, a delayed release an acquire waits for)."""
        self.dead_letters.enqueue(group_id, share_partition)
        self.persist(group_id, share_partition)
        self.lock_floor_ns = lowered(self.lock_floor_ns, share_partition.next_lock_deadline_ns, self.step_ns)
        key = (group_id, share_partition.topic, share_partition.partition)
        if key in self.parked:
            self.parked_floor_ns = lowered(self.parked_floor_ns, share_partition.next_available_ns(self.step_ns),
                                            self.step_ns)

    def _parked_floor_for(self, key: tuple[str, str, int]) -> None:
        """Lower the parked floor by one waiting partition's deadlines (an acquire just parked, a
        high-watermark read answered or refused)."""
        for deadline_ns in self._parked_deadlines_of(key):
            self.parked_floor_ns = lowered(self.parked_floor_ns, deadline_ns, self.step_ns)

    def _finish(self, effects: list[Effect], now_ns: int) -> list[Effect]:
        effects += self.dead_letters.advance(now_ns)
        self._put_unpersisted()
        self.next_deadline_ns = self._next_deadline(now_ns)
        if self.wrote:
            self.wrote = False
            return [AfterFlush(self.state, tuple(effects))]
        return effects

    # ------------------------------------------------------------------ the coordinator's hooks

    def owns(self, group_id: str) -> bool:
        return group_id in self.groups

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect] | None:
        self.step_ns = now_ns
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

    def tick(self, now_ns: int) -> list[Effect]:
        self.step_ns = now_ns
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
        self._set_floors(now_ns)
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
            self.unpersisted.pop((group_id, share_partition.topic, share_partition.partition), None)
            self._add_in_flight(group, -share_partition.counted_records)
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
        members = describe_members([member for _, member in sorted(group.members.items())], self._partitions_of,
                                   self.limits.share_describe_bytes_max, now_ns)
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
        partitions = describe_partitions([share_partition for _, share_partition in sorted(group.partitions.items())],
                                         self.limits.share_describe_bytes_max)
        return DescribeSharePartitionsResponse(
            correlation_id=request.correlation_id, group_id=request.group_id, settings=group.settings,
            partitions=partitions)

    def invariants(self) -> None:
        parked = sum(len(waiting) for waiting in self.parked.values())
        assert parked <= self.limits.share_acquires_parked_max, f"{parked} parked acquires"
        assert not self.unpersisted, "a share-partition changed in a step that ended without putting it"
        held = in_flight = pooled = 0
        reserved = self.limits.share_records_in_flight_reserved_per_group
        for group in self.groups.values():
            members = group.members
            assert len(members) <= self.limits.share_group_members_max, f"{group.group_id}: too many members"
            in_group = sum([member.held_bytes() for member in members.values()])
            assert in_group == group.members_bytes, (
                f"{group.group_id}: members hold {in_group:,} bytes, counted {group.members_bytes:,}")
            held += in_group
            in_group = 0
            for share_partition in group.partitions.values():
                share_partition.invariants(members)  # and no lock is held by a departed member
                in_group += len(share_partition.records)
            assert in_group == group.records_in_flight, (
                f"{group.group_id}: {in_group} records in flight, counted {group.records_in_flight}")
            in_flight += in_group
            pooled += max(0, in_group - reserved)
        subscribed = Counter(topic for group in self.groups.values() for member in group.members.values()
                             for topic in member.topics)
        assert subscribed == self.subscribed and len(subscribed) <= self.limits.share_subscribed_topics_max, (
            f"{len(subscribed):,} names subscribed, counted {len(self.subscribed):,}")
        assert held == self.members_bytes <= self.limits.groups_membership_bytes_max, (
            f"share members hold {held:,} bytes, counted {self.members_bytes:,}")
        assert in_flight == self.records_in_flight, f"{in_flight} records in flight, counted {self.records_in_flight}"
        assert pooled == self.pooled_in_flight, (
            f"{pooled} records beyond reservations, counted {self.pooled_in_flight}")
        self.dead_letters.invariants()

    def _on_metadata(self, response: MetadataResponse, now_ns: int) -> list[Effect]:
        self.dead_letters.on_metadata(response)
        self.leaders.observe_metadata(response)
        effects: list[Effect] = []
        for topic in response.topics:
            if topic.error == ErrorCode.NONE and topic.topic_id:
                effects += self._start_again_where_made_again(topic.name, topic.topic_id)
        effects += self._answer_waiting_heartbeats(now_ns, {topic.name for topic in response.topics})
        return effects + self._refresh_waiting(now_ns)

    def _start_again_where_made_again(self, topic: str, topic_id: int) -> list[Effect]:
        """`topic` was deleted and made again under its name (metadata names another id): the
        windows of its share-partitions are offsets of the old topic, and kept they would skip
        the new one's first records. Each starts again as a new share-partition
        (auto_offset_reset); the old one's locks are void. One still dead-lettering a record
        waits for that write to finish (exactly once) and starts again at a later metadata."""
        effects: list[Effect] = []
        for group in self.groups.values():
            for key, share_partition in list(group.partitions.items()):
                if key[0] != topic or share_partition.topic_id == topic_id:
                    continue
                if not share_partition.topic_id:  # stored before ids were kept: this topic's, as far as known
                    share_partition.topic_id, share_partition.changed = topic_id, True
                    self.persist(group.group_id, share_partition)
                    continue
                if any(record.state == DEAD_LETTERING for record in share_partition.records.values()):
                    continue
                fresh = group.partitions[key] = SharePartition(*key, group.settings, self.limits)
                fresh.topic_id, fresh.changed = topic_id, True
                self._add_in_flight(group, -share_partition.counted_records)
                self.leaders.forget_watch(key)
                self.persist(group.group_id, fresh)
                effects.append(Trace("share-partition-of-a-deleted-topic", {
                    "group": group.group_id, "topic": topic, "partition": key[1], "old_topic_id": share_partition.topic_id,
                    "topic_id": topic_id, "start_offset": share_partition.start_offset}))
        return effects

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
        return configured or f"{item.topic}{DEAD_LETTER_SUFFIX}"

    def after_archive(self, item: DeadLetterItem, now_ns: int) -> list[Effect]:
        """Archived records may move the start offset, which makes room for parked acquires."""
        key = (item.group_id, item.topic, item.partition)
        return self._serve_parked(key, now_ns) if key in self.parked else []


def _partition_key(group_id: str, share_partition: SharePartition) -> str:
    return f"share-partition/{group_id}/{share_partition.topic}/{share_partition.partition}"
