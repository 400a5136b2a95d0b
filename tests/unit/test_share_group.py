"""Share groups in the group coordinator (actors/share_group.py), against the real cluster actors.

The world runs in the deterministic harness: the real coordinator, real partition replicas on
memory logs (started by the test as a node agent would, whenever the coordinator places a new
topic, dead-letter topics included) and the real group coordinator over a DurableState on a
MemoryFileSystem. Members are played by the test: it sends their requests and reads the answers.
A "crash" of the group coordinator forgets everything it never flushed and starts a new one over
the same file system.
"""

from __future__ import annotations

import random
import sys
from typing import Callable

import msgspec
import pytest

from actors.coordinator import Coordinator
from actors.errors import ErrorCode
from actors.group_coordinator import GroupCoordinator
from actors.limits import Limits
from actors.messages import (
    ClientCommand, CreatePartitionsRequest, CreateTopicRequest, CreateTopicResponse, DeleteTopicRequest,
    DescribeGroupRequest,
    DescribeGroupResponse,
    DescribeSharePartitionsRequest, DescribeSharePartitionsResponse, FetchRequest, JoinGroupRequest,
    JoinGroupResponse, ListGroupsRequest, ListGroupsResponse, ListOffsetsResponse, MetadataRequest, MetadataResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetEntry,
    PeerDisconnected, ProduceRequest, ProduceResponse,
    ShareAcknowledgement, ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareAcquireRequest,
    ShareAcquireResponse, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, ShareGroupSettings, TimerFired,
    TopicConfig,
)
from actors.partition_replica import PartitionReplica
from actors.share_dead_letters import DEAD_LETTER_TOPIC_RETRY_MS
from actors.share_member import ShareMember, ShareMemberSettings
from railmq.idempotent import IdempotentStore, offset_message_id
from railmq.share_consumer import decode_acquired
from railmq.share_member_process import ShareMemberOptions, parse_duration_ms, run_share_member
from storage.batch import SEQUENCE_MAX, decode_records, encode_batch, iter_batches
from storage.log import LogConfig
from storage.memory import MemoryFileSystem, open_memory_log
from storage.state import DurableState
from tests.unit.actor_harness import MS, Envelope, Harness, flushed_messages, only, unflushed_messages

COORDINATOR, GROUP, PRODUCER = "coordinator", "group-coordinator", "producer"
LIMITS = Limits(group_initial_rebalance_delay_ms=50, share_acquires_parked_max=4)
VISIBILITY_MS = 1000
SESSION_MS = 3000
WHOLE_LOG_BYTES = 1 << 30


def replica_endpoint(topic: str, partition: int, node: int) -> str:
    return f"tcp://replica/{topic}/{partition}/n{node}"


class LossyHarness(Harness):
    """The harness, able to lose the messages a rule picks (until `heal`)."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.lose: Callable[[Envelope], bool] | None = None

    def heal(self) -> None:
        super().heal()
        self.lose = None

    def _send(self, envelope: Envelope) -> None:
        if self.lose is not None and self.lose(envelope):
            self.dropped.append(envelope)
            return
        super()._send(envelope)


class World:
    def __init__(self) -> None:
        self.harness = LossyHarness(now_ns=1_000_000 * MS)
        self.coordinator = Coordinator(state=DurableState.open("/c/state", fs=MemoryFileSystem()), nodes=[1, 2, 3],
                                       rng=random.Random(5), limits=LIMITS)
        self.harness.add(COORDINATOR, self.coordinator)
        self.group_fs = MemoryFileSystem()
        self.group = self._new_group_coordinator(incarnation=1)
        self.harness.add(GROUP, self.group)
        self.replicas: dict[tuple[str, int, int], PartitionReplica] = {}
        self.correlation = 0
        self.secrets: dict[str, bytes] = {}  # member id -> the secret its join answer gave
        self.settle(LIMITS.coordinator_election_grace_ms + 100)

    def _new_group_coordinator(self, incarnation: int) -> GroupCoordinator:
        return GroupCoordinator(state=DurableState.open("/g/groups.state", fs=self.group_fs), coordinator=COORDINATOR,
                                endpoint=GROUP, incarnation=incarnation, limits=LIMITS,
                                rng=random.Random(incarnation))

    def crash_group_coordinator(self) -> None:
        self.harness.remove(GROUP)
        self.group_fs.crash()
        self.group = self._new_group_coordinator(incarnation=2)
        self.harness.add(GROUP, self.group)

    def next_id(self) -> int:
        self.correlation += 1
        return self.correlation

    # -- the cluster ----------------------------------------------------------------------------
    def start_placed_replicas(self) -> None:
        """What a node agent does: run every replica the coordinator placed."""
        for name, record in self.coordinator.topics.items():
            for partition, nodes in enumerate(record.replicas):
                for node in nodes:
                    if (name, partition, node) not in self.replicas:
                        replica = PartitionReplica(
                            topic=name, topic_id=record.topic_id, partition=partition, node=node,
                            endpoint=replica_endpoint(name, partition, node), coordinator=COORDINATOR,
                            log=open_memory_log(LogConfig(), fs=MemoryFileSystem()), config=record.config,
                            incarnation=node * 1000 + partition, limits=LIMITS)
                        self.replicas[(name, partition, node)] = replica
                        self.harness.add(replica.endpoint, replica)

    def settle(self, milliseconds: int) -> None:
        for _ in range(0, milliseconds, 50):
            self.start_placed_replicas()
            self.harness.advance(50)
            self.group.share.invariants()

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1) -> None:
        self.harness.deliver(COORDINATOR, CreateTopicRequest(correlation_id=self.next_id(), name=name,
                                                             partitions=partitions,
                                                             replication_factor=replication_factor,
                                                             config=TopicConfig()), PRODUCER)
        assert self.harness.take(PRODUCER, CreateTopicResponse)[-1].error == ErrorCode.NONE
        self.settle(LIMITS.replica_heartbeat_interval_ms * 5)

    def leader(self, topic: str, partition: int = 0) -> PartitionReplica:
        node = self.coordinator.partitions[(topic, partition)].leader
        return self.replicas[(topic, partition, node)]

    def produce(self, topic: str, values: list[str], partition: int = 0) -> None:
        records = [(index, f"k-{value}".encode(), value.encode(), [("origin", b"test")])
                   for index, value in enumerate(values)]
        request = ProduceRequest(correlation_id=self.next_id(), topic=topic, partition=partition, acks=-1,
                                 batch=bytes(encode_batch(records, 1_000)))
        self.harness.deliver(self.leader(topic, partition).endpoint, request, PRODUCER)
        self.settle(100)
        assert self.harness.take(PRODUCER, ProduceResponse)[-1].error == ErrorCode.NONE

    def log_records(self, topic: str, partition: int = 0) -> list[tuple]:
        log = self.leader(topic, partition).log
        if log.log_end_offset == log.log_start_offset:
            return []
        data = log.read(log.log_start_offset, WHOLE_LOG_BYTES)
        return [record for position, header in iter_batches(data)
                for record in decode_records(data, header, position)]

    # -- members --------------------------------------------------------------------------------
    def join(self, member: str, topics: list[str], group: str = "g", **settings) -> ShareGroupHeartbeatResponse:
        return self.heartbeat(member, "", topics, group, settings=ShareGroupSettings(
            **{"visibility_timeout_ms": VISIBILITY_MS, "max_delivery_attempts": 3, **settings}))

    def heartbeat(self, member: str, member_id: str, topics: list[str], group: str = "g",
                  **extra) -> ShareGroupHeartbeatResponse:
        self.harness.deliver(GROUP, ShareGroupHeartbeatRequest(
            correlation_id=self.next_id(), group_id=group, member_id=member_id, client_id=member, topics=topics,
            session_timeout_ms=SESSION_MS, member_secret=self.secrets.get(member_id, b""), **extra), member)
        self.settle(50)
        response = self.harness.take(member, ShareGroupHeartbeatResponse)[-1]
        if response.member_id:
            self.secrets[response.member_id] = response.member_secret
        return response

    def keep_alive(self, member: str, member_id: str, topics: list[str], milliseconds: int) -> None:
        """Let time pass while the member heartbeats."""
        for _ in range(0, milliseconds, 1000):
            self.settle(1000)
            assert self.heartbeat(member, member_id, topics).error == ErrorCode.NONE

    def acquire(self, member: str, member_id: str, topic: str, max_records: int = 100, wait_ms: int = 0,
                partition: int = 0, group: str = "g") -> list:
        """Effects of the acquire (the answer may be parked: read it with `acquired`)."""
        return self.harness.deliver(GROUP, ShareAcquireRequest(
            correlation_id=self.next_id(), group_id=group, member_id=member_id, topic=topic, partition=partition,
            max_records=max_records, max_wait_ms=wait_ms, member_secret=self.secrets.get(member_id, b"")),
            member)

    def acquired(self, member: str) -> list[ShareAcquireResponse]:
        self.harness.run()
        return self.harness.take(member, ShareAcquireResponse)

    def acquire_now(self, member: str, member_id: str, topic: str, **options) -> ShareAcquireResponse:
        """Acquire and wait for the answer (a long poll: the coordinator may have to read the high
        watermark first)."""
        self.acquire(member, member_id, topic, **{"wait_ms": 500, **options})
        self.settle(100)
        (response,) = self.acquired(member)
        return response

    def answer(self, member: str, member_id: str, topic: str, first: int, last: int, kind: str,
               topic_id: int = 0, **extra) -> ShareAcknowledgeResponse:
        self.harness.deliver(GROUP, ShareAcknowledgeRequest(
            correlation_id=self.next_id(), group_id="g", member_id=member_id, topic=topic, partition=0,
            member_secret=self.secrets.get(member_id, b""), topic_id=topic_id,
            acknowledgements=[ShareAcknowledgement(first_offset=first, last_offset=last, kind=kind, **extra)]),
            member)
        self.settle(50)
        return self.harness.take(member, ShareAcknowledgeResponse)[-1]

    def describe(self, group: str = "g") -> DescribeSharePartitionsResponse:
        self.harness.deliver(GROUP, DescribeSharePartitionsRequest(correlation_id=self.next_id(), group_id=group),
                             PRODUCER)
        return self.harness.take(PRODUCER, DescribeSharePartitionsResponse)[-1]


def acquired_offsets(response: ShareAcquireResponse) -> list[tuple[int, int]]:
    return [(offset, ranged.delivery_count) for ranged in response.acquired
            for offset in range(ranged.first_offset, ranged.last_offset + 1)]


@pytest.fixture
def world() -> World:
    world = World()
    world.create_topic("orders")
    return world


# ---------------------------------------------------------------------------- membership


def test_the_first_join_fixes_the_settings_and_later_members_get_them_back(world):
    world.create_topic("wide", partitions=3)
    first = world.join("a", ["wide"], visibility_timeout_ms=2000, max_delivery_attempts=7)
    second = world.join("b", ["wide"], visibility_timeout_ms=9999, max_delivery_attempts=2)

    assert first.error == second.error == ErrorCode.NONE
    assert first.member_id.startswith("a-") and second.member_id.startswith("b-")
    assert (second.settings.visibility_timeout_ms, second.settings.max_delivery_attempts) == (2000, 7)
    assert first.partitions == second.partitions == [("wide", 0), ("wide", 1), ("wide", 2)], "everyone reads all"
    assert first.heartbeat_interval_ms == SESSION_MS // 3


def test_a_new_group_is_durable_before_its_first_member_hears_of_it(world):
    world.join("b", ["orders"], group="other")  # the topic's metadata is known from here on
    world.harness.deliver(GROUP, ShareGroupHeartbeatRequest(
        correlation_id=1, group_id="durable", client_id="a", topics=["orders"], session_timeout_ms=SESSION_MS), "a")
    world.harness.run()
    step = world.harness.steps_of(GROUP, ShareGroupHeartbeatRequest)[-1]
    assert flushed_messages(step.effects, ShareGroupHeartbeatResponse)
    assert not unflushed_messages(step.effects, ShareGroupHeartbeatResponse)


def test_a_member_of_a_topic_that_does_not_exist_yet_gets_no_partitions_for_it(world):
    joined = world.join("a", ["orders", "later"])
    assert (joined.error, joined.partitions) == (ErrorCode.NONE, [("orders", 0)])
    world.create_topic("later", partitions=2)
    world.settle(100)
    again = world.heartbeat("a", joined.member_id, ["orders", "later"])
    assert again.partitions == [("later", 0), ("later", 1), ("orders", 0)]


def test_share_and_classic_groups_do_not_share_an_id(world):
    assert world.join("a", ["orders"], group="queue").error == ErrorCode.NONE
    world.harness.deliver(GROUP, JoinGroupRequest(correlation_id=1, group_id="queue", client_id="c"), "c")
    assert only(world.harness.take("c"), JoinGroupResponse).error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL

    world.harness.deliver(GROUP, JoinGroupRequest(correlation_id=2, group_id="classic", client_id="c",
                                                  session_timeout_ms=SESSION_MS), "c")
    world.settle(200)
    assert world.join("a", ["orders"], group="classic").error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_an_offset_commit_to_a_share_groups_id_is_refused_and_the_share_group_goes_on(world):
    """An administrative commit (no member, generation -1) needs no membership: to a share group's
    id it made a classic group of that id, and from then on every heartbeat of the share group was
    refused (INCONSISTENT_GROUP_PROTOCOL), so its members left and nothing more was delivered."""
    world.produce("orders", ["a", "b"])
    member = world.join("a", ["orders"], group="queue").member_id
    world.harness.deliver(GROUP, OffsetCommitRequest(
        correlation_id=world.next_id(), group_id="queue",
        offsets=[OffsetEntry(topic="orders", partition=0, offset=2)]), "admin")
    world.settle(50)

    assert only(world.harness.take("admin"), OffsetCommitResponse).error == (
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
    assert world.heartbeat("a", member, ["orders"], group="queue").error == ErrorCode.NONE
    assert acquired_offsets(world.acquire_now("a", member, "orders", group="queue")) == [(0, 1), (1, 1)]


def test_bad_settings_and_unknown_members_are_refused(world):
    assert world.join("a", ["orders"], group="bad", visibility_timeout_ms=1).error == ErrorCode.INVALID_CONFIG
    assert world.heartbeat("a", "nobody-1", ["orders"], group="ghost").error == ErrorCode.UNKNOWN_MEMBER_ID
    member = world.join("a", ["orders"]).member_id
    assert world.heartbeat("a", "nobody-2", ["orders"]).error == ErrorCode.UNKNOWN_MEMBER_ID
    world.answer("a", member, "orders", 0, 0, "accept")
    world.harness.deliver(GROUP, ShareAcknowledgeRequest(correlation_id=9, group_id="g", member_id="nobody-3",
                                                         topic="orders", partition=0), "x")
    assert only(world.harness.take("x"), ShareAcknowledgeResponse).error == ErrorCode.UNKNOWN_MEMBER_ID


def test_describe_and_list_show_share_groups(world):
    world.produce("orders", ["a", "b"])
    member = world.join("a", ["orders"]).member_id
    world.acquire_now("a", member, "orders", max_records=1)
    world.harness.deliver(GROUP, DescribeGroupRequest(correlation_id=1, group_id="g"), "admin")
    world.harness.deliver(GROUP, ListGroupsRequest(correlation_id=2), "admin")
    described = only(world.harness.received("admin"), DescribeGroupResponse)
    assert (described.kind, described.state) == ("share", "Stable")
    assert [m.member_id for m in described.members] == [member]
    assert [(o.topic, o.partition, o.offset) for o in described.offsets] == [("orders", 0, 0)]
    listed = world.harness.take("admin", ListGroupsResponse)[-1]
    assert [(g.group_id, g.kind, g.members) for g in listed.groups] == [("g", "share", 1)]
    ranges = world.describe().partitions[0].records
    assert [(r.first_offset, r.last_offset, r.state, r.member_id) for r in ranges] == [(0, 0, "acquired", member)]


# ---------------------------------------------------------------------------- acquire


def test_acquire_hands_out_what_the_leader_holds_and_only_after_the_state_is_durable(world):
    world.produce("orders", ["a", "b", "c"])
    member = world.join("a", ["orders"]).member_id

    response = world.acquire_now("a", member, "orders", wait_ms=500)
    assert acquired_offsets(response) == [(0, 1), (1, 1), (2, 1)]
    assert response.lock_deadline_ms > world.harness.now_ns // MS
    acquire_steps = [step for step in world.harness.steps if flushed_messages(step.effects, ShareAcquireResponse)]
    assert acquire_steps and not any(unflushed_messages(step.effects, ShareAcquireResponse)
                                     for step in world.harness.steps)


def test_an_empty_acquire_waits_and_is_answered_when_records_arrive(world):
    member = world.join("a", ["orders"]).member_id
    world.acquire("a", member, "orders", wait_ms=5_000)
    world.settle(300)
    assert world.acquired("a") == [], "nothing to acquire yet: the acquire is parked"

    world.produce("orders", ["late"])
    world.settle(100)
    (response,) = world.acquired("a")
    assert acquired_offsets(response) == [(0, 1)]


def test_a_parked_acquire_with_nothing_to_give_gets_an_empty_answer_at_its_deadline(world):
    member = world.join("a", ["orders"]).member_id
    world.acquire("a", member, "orders", wait_ms=400)
    world.settle(300)
    assert world.acquired("a") == []
    world.settle(200)
    (response,) = world.acquired("a")
    assert (response.error, response.acquired) == (ErrorCode.NONE, [])


def test_a_parked_acquire_is_answered_when_its_wait_ends_to_the_millisecond(world):
    member = world.join("a", ["orders"]).member_id
    world.acquire("a", member, "orders", wait_ms=437)
    asked_ns = world.harness.now_ns
    world.harness.advance_to(asked_ns + 437 * MS - 1)
    assert world.acquired("a") == []
    world.harness.advance_to(asked_ns + 437 * MS)
    (response,) = world.acquired("a")
    assert (response.error, response.acquired) == (ErrorCode.NONE, [])


def test_a_lock_nobody_answers_is_released_when_it_expires_to_the_millisecond(world):
    world.produce("orders", ["x"])
    a = world.join("a", ["orders"]).member_id
    response = world.acquire_now("a", a, "orders")
    share_partition = world.group.share.groups["g"].partitions[("orders", 0)]
    deadline_ns = share_partition.next_lock_deadline_ns
    assert deadline_ns // MS == response.lock_deadline_ms
    world.harness.advance_to(deadline_ns - 1)
    assert share_partition.records[0].state == "acquired"
    world.harness.advance_to(deadline_ns)
    assert share_partition.records[0].state == "available", "a lock held past its deadline"


def test_parked_acquires_are_bounded(world):
    member = world.join("a", ["orders"]).member_id
    for _ in range(LIMITS.share_acquires_parked_max):
        world.acquire("a", member, "orders", wait_ms=5_000)
    world.acquire("a", member, "orders", wait_ms=5_000)
    assert [response.error for response in world.acquired("a")] == [ErrorCode.BUSY]


def test_two_members_get_disjoint_records(world):
    world.produce("orders", [str(n) for n in range(6)])
    a = world.join("a", ["orders"]).member_id
    b = world.join("b", ["orders"]).member_id
    first = acquired_offsets(world.acquire_now("a", a, "orders", max_records=4))
    second = acquired_offsets(world.acquire_now("b", b, "orders", max_records=4))
    assert first == [(0, 1), (1, 1), (2, 1), (3, 1)] and second == [(4, 1), (5, 1)]


def test_a_member_id_read_from_a_description_does_not_let_another_client_act_as_that_member(world):
    """DescribeSharePartitions names each lock's holder. Before member secrets, a client that read
    it accepted another member's records (never handled, and never delivered again), acquired in
    its name, changed its subscription and made it leave (its locks released)."""
    world.produce("orders", ["x", "y"])
    a = world.join("a", ["orders"]).member_id
    world.acquire_now("a", a, "orders")
    holder = world.describe().partitions[0].records[0].member_id
    assert holder == a

    def mallory(request, kind):
        world.harness.deliver(GROUP, request, "mallory")
        world.settle(50)
        return world.harness.take("mallory", kind)[-1]

    def heartbeat(**extra) -> ShareGroupHeartbeatRequest:
        return ShareGroupHeartbeatRequest(correlation_id=world.next_id(), group_id="g", member_id=holder,
                                          client_id="a", session_timeout_ms=SESSION_MS, **extra)

    refused = [
        mallory(ShareAcknowledgeRequest(
            correlation_id=world.next_id(), group_id="g", member_id=holder, topic="orders", partition=0,
            acknowledgements=[ShareAcknowledgement(first_offset=0, last_offset=1, kind="accept")]),
            ShareAcknowledgeResponse),
        mallory(ShareAcquireRequest(correlation_id=world.next_id(), group_id="g", member_id=holder,
                                    topic="orders", partition=0), ShareAcquireResponse),
        mallory(heartbeat(topics=[]), ShareGroupHeartbeatResponse),
        mallory(heartbeat(topics=["orders"], leaving=True), ShareGroupHeartbeatResponse),
    ]

    assert [answer.error for answer in refused] == [ErrorCode.UNKNOWN_MEMBER_ID] * 4
    assert all("secret" in answer.error_message for answer in refused)
    held = world.describe().partitions[0].records
    assert [(ranged.first_offset, ranged.last_offset, ranged.state, ranged.member_id) for ranged in held] == [
        (0, 1, "acquired", a)]
    assert world.group.share.groups["g"].members[a].topics == ["orders"]
    assert world.answer("a", a, "orders", 0, 1, "accept").results[0].error == ErrorCode.NONE


def test_an_expired_lock_is_redelivered_to_anyone_with_its_count_grown(world):
    world.produce("orders", ["x"])
    a = world.join("a", ["orders"]).member_id
    b = world.join("b", ["orders"]).member_id
    world.acquire_now("a", a, "orders")
    world.settle(VISIBILITY_MS + 100)
    world.heartbeat("a", a, ["orders"])
    world.heartbeat("b", b, ["orders"])

    assert acquired_offsets(world.acquire_now("b", b, "orders")) == [(0, 2)]
    assert world.answer("a", a, "orders", 0, 0, "accept").results[0].error == ErrorCode.INVALID_RECORD_STATE
    assert world.answer("b", b, "orders", 0, 0, "accept").results[0].error == ErrorCode.NONE


def test_an_answer_to_an_expired_delivery_is_refused_even_when_the_same_member_holds_the_record_again(world):
    world.produce("orders", ["x"])
    a = world.join("a", ["orders"]).member_id
    assert acquired_offsets(world.acquire_now("a", a, "orders")) == [(0, 1)]
    world.settle(VISIBILITY_MS + 100)
    world.heartbeat("a", a, ["orders"])
    assert acquired_offsets(world.acquire_now("a", a, "orders")) == [(0, 2)], "the slow member took it back"

    late = world.answer("a", a, "orders", 0, 0, "accept", delivery_count=1).results[0]
    current = world.answer("a", a, "orders", 0, 0, "accept", delivery_count=2).results[0]

    assert late.error == ErrorCode.INVALID_RECORD_STATE and "delivered again (delivery 2)" in late.error_message
    assert current.error == ErrorCode.NONE


def test_a_member_whose_session_ends_loses_its_locks_and_the_records_go_to_others(world):
    world.produce("orders", ["x", "y"])
    gone = world.join("gone", ["orders"]).member_id
    live = world.join("live", ["orders"]).member_id
    world.acquire_now("gone", gone, "orders")
    for _ in range(SESSION_MS // 1000 + 1):
        world.settle(900)
        world.heartbeat("live", live, ["orders"])

    assert world.heartbeat("gone", gone, ["orders"]).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert acquired_offsets(world.acquire_now("live", live, "orders")) == [(0, 2), (1, 2)]
    assert [trace["why"] for trace in world.harness.trace_events("share-member-removed")] == ["session timeout"]


def test_a_leaving_member_releases_what_it_held_at_once(world):
    world.produce("orders", ["x"])
    a = world.join("a", ["orders"]).member_id
    b = world.join("b", ["orders"]).member_id
    world.acquire_now("a", a, "orders")
    assert world.heartbeat("a", a, ["orders"], leaving=True).error == ErrorCode.NONE
    assert acquired_offsets(world.acquire_now("b", b, "orders")) == [(0, 2)]


def test_a_delayed_release_is_not_redelivered_before_its_delay(world):
    world.produce("orders", ["x"])
    a = world.join("a", ["orders"]).member_id
    world.acquire_now("a", a, "orders")
    world.answer("a", a, "orders", 0, 0, "release", delay_ms=600)
    world.acquire("a", a, "orders", wait_ms=2_000)
    world.settle(500)
    assert world.acquired("a") == []
    world.settle(200)
    (response,) = world.acquired("a")
    assert acquired_offsets(response) == [(0, 2)]


def test_a_parked_acquire_gets_a_delayed_release_the_moment_its_delay_ends(world):
    """The release is the only thing due before the parked acquire's own end: the coordinator must
    wake for it (a floor lowered when the release was made), not for the acquire's 5 s wait."""
    world.produce("orders", ["x"])
    a = world.join("a", ["orders"]).member_id
    b = world.join("b", ["orders"]).member_id
    world.acquire_now("a", a, "orders")
    world.acquire("b", b, "orders", wait_ms=5_000)
    world.harness.run()
    world.harness.deliver(GROUP, ShareAcknowledgeRequest(
        correlation_id=world.next_id(), group_id="g", member_id=a, member_secret=world.secrets[a],
        topic="orders", partition=0,
        acknowledgements=[ShareAcknowledgement(first_offset=0, last_offset=0, kind="release", delay_ms=333)]), "a")
    released_ns = world.harness.now_ns
    world.harness.advance_to(released_ns + 333 * MS - 1)
    assert world.acquired("b") == []
    world.harness.advance_to(released_ns + 333 * MS)
    (response,) = world.acquired("b")
    assert acquired_offsets(response) == [(0, 2)]


def test_a_share_member_that_stops_heartbeating_is_removed_when_its_session_ends_to_the_millisecond(world):
    gone = world.join("gone", ["orders"]).member_id
    member = world.group.share.groups["g"].members[gone]
    ends_ns = member.last_seen_ns + member.session_timeout_ms * MS
    world.harness.advance_to(ends_ns)
    assert gone in world.group.share.groups["g"].members
    world.harness.advance_to(ends_ns + 1)
    assert gone not in world.group.share.groups["g"].members, "kept a member past its session"


def test_after_a_coordinator_crash_locks_are_void_counts_kept_and_accepted_records_stay_done(world):
    world.produce("orders", ["a", "b", "c"])
    member = world.join("a", ["orders"]).member_id
    world.acquire_now("a", member, "orders")
    world.answer("a", member, "orders", 0, 0, "accept")

    world.crash_group_coordinator()
    world.settle(200)
    assert world.heartbeat("a", member, ["orders"]).error == ErrorCode.UNKNOWN_MEMBER_ID
    again = world.join("a", ["orders"]).member_id
    assert acquired_offsets(world.acquire_now("a", again, "orders")) == [(1, 2), (2, 2)]


@pytest.mark.parametrize("connection_drop_seen", [True, False], ids=["disconnect-seen", "silent-death"])
def test_a_leader_failover_costs_a_retry_never_share_state(connection_drop_seen):
    world = World()
    world.create_topic("orders", replication_factor=3)
    world.produce("orders", ["a", "b"])
    member = world.join("a", ["orders"]).member_id
    assert acquired_offsets(world.acquire_now("a", member, "orders", max_records=1)) == [(0, 1)]
    world.answer("a", member, "orders", 0, 0, "accept")
    old = world.leader("orders")
    world.harness.remove(old.endpoint)
    if connection_drop_seen:  # what the runtime tells an actor whose peer's process died
        world.harness.deliver(GROUP, PeerDisconnected(endpoint=old.endpoint), b"")
    world.keep_alive("a", member, ["orders"], LIMITS.replica_session_timeout_ms + 500)
    assert world.leader("orders") is not old
    world.produce("orders", ["c"])
    if not connection_drop_seen:  # the ListOffsets sent to the dead leader times out first
        world.keep_alive("a", member, ["orders"], LIMITS.share_request_timeout_ms)
    offsets = acquired_offsets(world.acquire_now("a", member, "orders"))
    offsets += acquired_offsets(world.acquire_now("a", member, "orders"))
    assert offsets == [(1, 1), (2, 1)], "offset 2 is read from the new leader"
    assert world.describe().partitions[0].start_offset == 1


def test_retention_passing_a_backlog_is_seen_while_the_group_still_has_records_to_take(world):
    """The coordinator read the leader's log start only once its share-partition had caught up with
    the high watermark: a group with a backlog never saw retention move the start. It handed out
    offsets the log no longer held, which members could not fetch and dropped, locked until their
    visibility timeout, redelivered first, and so again until their attempts ran out and they
    were dead-lettered as gone: `max_delivery_attempts` visibility timeouts for each window of
    deleted records before the group reached one it could read."""
    for value in range(20):
        world.produce("orders", [f"v{value}"])  # a batch each: the log start can stop at any of them
    member = world.join("a", ["orders"]).member_id
    first = world.acquire_now("a", member, "orders", max_records=5)
    assert acquired_offsets(first) == [(offset, 1) for offset in range(5)]
    assert world.answer("a", member, "orders", 0, 4, "accept").error == ErrorCode.NONE

    world.leader("orders").log.delete_records_before(15)  # retention: the segments below 15 went
    world.keep_alive("a", member, ["orders"], LIMITS.share_log_start_refresh_ms + 1_000)
    world.acquire_now("a", member, "orders", max_records=5)  # the first after the move may still be stale
    world.keep_alive("a", member, ["orders"], 1_000)
    later = world.acquire_now("a", member, "orders", max_records=5)

    assert acquired_offsets(later) == [(offset, 1) for offset in range(15, 20)]
    assert world.group.share.groups["g"].partitions[("orders", 0)].start_offset == 15


# ---------------------------------------------------------------------------- dead letters


def dead_letters(world: World, topic: str = "orders.dlq") -> list[tuple]:
    if (topic, 0) not in world.coordinator.partitions:
        return []
    return world.log_records(topic)


def test_a_rejected_record_lands_in_the_dead_letter_topic_once_with_its_headers(world):
    world.produce("orders", ["good", "poison", "good2"])
    member = world.join("a", ["orders"]).member_id
    world.acquire_now("a", member, "orders")
    world.answer("a", member, "orders", 1, 1, "reject", error="cannot parse")
    world.answer("a", member, "orders", 0, 0, "accept")
    world.answer("a", member, "orders", 2, 2, "accept")
    world.settle(1_500)

    created = world.coordinator.topics["orders.dlq"]
    assert (len(created.replicas), len(created.replicas[0])) == (1, 1), "source partitions, min(3, source RF)"
    (record,) = dead_letters(world)
    _, key, value, headers = record
    assert (key, value) == (b"k-poison", b"poison")
    fields = dict(headers)
    assert {name: fields[f"railmq.dlq.{name}"] for name in ("source_topic", "source_partition", "source_offset",
                                                            "group", "attempts", "reason", "last_error")} == {
        "source_topic": b"orders", "source_partition": b"0", "source_offset": b"1", "group": b"g",
        "attempts": b"1", "reason": b"rejected", "last_error": b"cannot parse"}
    assert [name for name, _ in headers][-1] == "origin", "the source record's headers follow"
    assert fields["railmq.dlq.source_timestamp_ms"] == b"1001"
    assert world.describe().partitions[0].start_offset == 3, "archived: the start moved past it"


def test_the_last_attempt_goes_to_the_dead_letter_topic_while_the_partition_keeps_draining(world):
    world.produce("orders", ["poison", "fine"])
    member = world.join("a", ["orders"], max_delivery_attempts=2).member_id
    world.acquire_now("a", member, "orders")
    world.answer("a", member, "orders", 0, 0, "release", error="boom 1")
    world.answer("a", member, "orders", 1, 1, "accept")
    assert acquired_offsets(world.acquire_now("a", member, "orders")) == [(0, 2)]
    world.answer("a", member, "orders", 0, 0, "release", error="boom 2")
    world.settle(1_500)

    ((_, _, value, headers),) = dead_letters(world)
    fields = dict(headers)
    assert (value, fields["railmq.dlq.reason"], fields["railmq.dlq.attempts"], fields["railmq.dlq.last_error"]) == (
        b"poison", b"max-attempts", b"2", b"boom 2")
    assert world.describe().partitions[0].start_offset == 2


def test_a_dead_letter_write_lost_in_a_crash_is_sent_again_and_stored_once(world):
    world.produce("orders", ["poison"])
    member = world.join("a", ["orders"]).member_id
    world.acquire_now("a", member, "orders")
    world.harness.lose = lambda envelope: envelope.to == GROUP and isinstance(envelope.message, ProduceResponse)
    world.answer("a", member, "orders", 0, 0, "reject", error="bad")
    world.settle(1_500)
    assert len(dead_letters(world)) == 1, "the write was appended, its acknowledgement lost"
    assert world.describe().partitions[0].records[0].state == "dead-lettering"

    world.harness.heal()
    world.crash_group_coordinator()
    world.settle(1_500)

    assert len(dead_letters(world)) == 1, "the broker recognised the re-sent write as a duplicate"
    assert world.describe().partitions[0].start_offset == 1
    assert world.describe().partitions[0].records == []


def first_dead_letter_then_second(world, renumber: Callable) -> tuple:
    """Dead-letter p1, let `renumber` change the writer's target for orders.dlq/0, then
    dead-letter p2: (the target, the producer id it wrote p1 under)."""
    world.produce("orders", ["p1", "p2"])
    member = world.join("a", ["orders"]).member_id
    world.acquire_now("a", member, "orders")
    world.answer("a", member, "orders", 0, 0, "reject")
    world.settle(1_500)
    target = world.group.share.dead_letters.targets[("orders.dlq", 0)]
    first_producer = target.producer_id
    renumber(target)
    assert acquired_offsets(world.acquire_now("a", member, "orders")) == [(1, 2)], "its first lock expired meanwhile"
    world.answer("a", member, "orders", 1, 1, "reject")
    world.settle(1_500)
    return target, first_producer


def test_a_write_refused_as_out_of_order_restarts_under_a_new_producer_id(world):
    def forgotten(target) -> None:  # as if the broker had forgotten this producer's writes
        target.next_sequence += 7

    target, first_producer = first_dead_letter_then_second(world, forgotten)

    assert [value for _, _, value, _ in dead_letters(world)] == [b"p1", b"p2"]
    assert target.producer_id != first_producer and target.next_sequence == 1


def test_a_dead_letter_partition_whose_sequence_numbers_are_spent_goes_on_under_a_new_producer_id(world):
    """The writer numbers each dead-letter partition's records from 0 for as long as the cluster
    lives, and stores the next number; the batch header holds it as an int32. Before, once 2**31
    had been written the next write's encoding raised `struct.error` out of the group
    coordinator's handle(): it crashed, and its restart read the same number and crashed again.
    Now a write whose numbers would run past 2**31 - 1 takes a new producer id from sequence 0."""
    def spent(target) -> None:  # as after 2**31 dead letters to this partition
        target.next_sequence = SEQUENCE_MAX + 1

    target, first_producer = first_dead_letter_then_second(world, spent)

    assert [value for _, _, value, _ in dead_letters(world)] == [b"p1", b"p2"]
    assert target.producer_id != first_producer and target.next_sequence == 1
    assert world.describe().partitions[0].start_offset == 2


def delete_topic(world: World, name: str) -> None:
    world.harness.deliver(COORDINATOR, DeleteTopicRequest(correlation_id=world.next_id(), name=name),
                          PRODUCER)
    for key in [key for key in world.replicas if key[0] == name]:
        world.harness.remove(world.replicas.pop(key).endpoint)
    world.settle(200)


def test_a_dead_letter_topic_deleted_after_its_first_write_is_made_again_for_the_next(world):
    """The dead-letter topic was made for the first dead letter, then deleted. The next dead letter
    waited for its leader for good: it stayed dead-lettering, the share-partition's start stayed
    below it (and once its window was full, the partition delivered nothing more), and the group
    could not be deleted."""
    world.produce("orders", ["p1", "fine", "p2", "fine2"])
    member = world.join("a", ["orders"]).member_id
    world.acquire_now("a", member, "orders")
    world.answer("a", member, "orders", 0, 0, "reject")
    world.answer("a", member, "orders", 1, 1, "accept")
    world.settle(1_500)
    assert [value for _, _, value, _ in dead_letters(world)] == [b"p1"]
    delete_topic(world, "orders.dlq")

    assert acquired_offsets(world.acquire_now("a", member, "orders")) == [(2, 2), (3, 2)], (
        "their first locks expired")
    world.answer("a", member, "orders", 2, 2, "reject")
    world.answer("a", member, "orders", 3, 3, "accept")
    for _ in range(10):
        world.keep_alive("a", member, ["orders"], 1_000)
        if world.describe().partitions[0].start_offset == 4:
            break

    assert world.describe().partitions[0].start_offset == 4, "the second dead letter was written and archived"
    assert [value for _, _, value, _ in dead_letters(world)] == [b"p2"], "in the dead-letter topic made again"


def test_a_record_dead_lettered_as_its_topic_is_made_again_does_not_take_the_new_topics_record(world):
    """The dead-letter writer fetched the rejected record by topic name and offset. Its topic was
    deleted and made again before the fetch: it fetched the new topic's record at that offset (one
    the group was delivered and accepted as well) and wrote it to the dead-letter topic as the
    rejected one. The rejected record went with its topic: nothing is written for it."""
    world.produce("orders", ["old-0", "old-1", "old-2"])
    member = world.join("a", ["orders"]).member_id
    world.acquire_now("a", member, "orders")
    world.harness.lose = lambda envelope: (envelope.sender == GROUP
                                           and isinstance(envelope.message, FetchRequest))
    world.answer("a", member, "orders", 1, 1, "reject", error="poison")
    world.answer("a", member, "orders", 0, 0, "accept")
    world.answer("a", member, "orders", 2, 2, "accept")
    world.settle(500)
    assert world.describe().partitions[0].records[0].state == "dead-lettering"
    delete_topic(world, "orders")
    world.harness.heal()
    world.create_topic("orders")
    world.produce("orders", ["new-0", "new-1", "new-2", "new-3"])

    delivered: set[int] = set()
    for _ in range(40):
        assert world.heartbeat("a", member, ["orders"]).error == ErrorCode.NONE
        world.acquire("a", member, "orders", max_records=100, wait_ms=200)
        world.settle(300)
        for response in world.acquired("a"):
            for offset, _ in acquired_offsets(response):
                delivered.add(offset)
                world.answer("a", member, "orders", offset, offset, "accept")
        if len(delivered) == 4:
            break

    assert sorted(delivered) == [0, 1, 2, 3], "every record of the new topic, from its start"
    assert [value for _, _, value, _ in dead_letters(world)] == [], "no record of the new topic dead-lettered"
    assert world.harness.trace_events("share-dead-letter-source-gone")


def test_a_dead_letter_topic_that_cannot_be_made_is_asked_for_again_later_not_at_once(monkeypatch):
    """A dead-letter topic the controller refuses to make (here: the cluster holds its maximum of
    topics; first found with a source topic of 234 characters, whose `<topic>.dlq` is too long,
    which a heartbeat now refuses). Its first dead letter made the group coordinator ask the
    controller to create it again at each refusal, as fast as they came back: live, 7,812
    CreateTopic refusals (and trace lines) in 7 s, the controller and the group coordinator at 40%
    CPU each, for as long as the record waited."""
    monkeypatch.setattr(sys.modules[__name__], "LIMITS", msgspec.structs.replace(LIMITS, topics_max=1))
    world = World()
    name = "orders"
    world.create_topic(name)
    world.produce(name, ["fine", "poison"])
    member = world.join("a", [name]).member_id
    world.acquire_now("a", member, name)
    world.answer("a", member, name, 0, 0, "accept")
    world.answer("a", member, name, 1, 1, "reject")
    world.keep_alive("a", member, [name], 10_000)

    refusals = world.harness.trace_events("share-dead-letter-topic-refused")
    assert 1 <= len(refusals) <= 10_000 // DEAD_LETTER_TOPIC_RETRY_MS + 1, f"{len(refusals)} refusals in 10 s"
    assert world.describe().partitions[0].records[0].state == "dead-lettering", "waiting, not dropped"


def test_a_topic_too_long_for_its_default_dead_letter_topic_needs_a_group_that_names_one(world):
    """`<topic>.dlq` of a topic of 231-234 characters is past topic_name_length_max: the controller
    refused to make it, and a record rejected there stayed dead-lettering for good, its
    share-partition stalling at share_records_in_flight_max. A heartbeat subscribing such a topic
    in a group without a dead_letter_topic is refused, saying what to set; one that names it works."""
    longest = LIMITS.topic_name_length_max
    fits, too_long = "f" * (longest - len(".dlq")), "t" * (longest - len(".dlq") + 1)
    world.create_topic(fits)
    world.create_topic(too_long)
    world.produce(too_long, ["poison"])

    refused = world.join("a", [too_long], group="default-dlq")
    existing = world.join("b", ["orders"], group="g")
    widened = world.heartbeat("b", existing.member_id, ["orders", too_long], group="g")
    named = world.join("c", [too_long], group="named", dead_letter_topic="long.dlq")

    assert refused.error == widened.error == ErrorCode.INVALID_CONFIG
    assert "dead_letter_topic" in refused.error_message and f"{longest}" in refused.error_message
    assert "default-dlq" not in world.group.share.groups, "no group made for a refused join"
    assert world.join("d", [fits], group="fits").error == ErrorCode.NONE, "<topic>.dlq of 234 characters fits"
    assert named.error == ErrorCode.NONE
    acquired = world.acquire_now("c", named.member_id, too_long, group="named")
    world.harness.deliver(GROUP, ShareAcknowledgeRequest(
        correlation_id=world.next_id(), group_id="named", member_id=named.member_id,
        member_secret=named.member_secret, topic=too_long, partition=0,
        acknowledgements=[ShareAcknowledgement(first_offset=0, last_offset=0, kind="reject")]), "c")
    world.settle(1_500)
    assert acquired_offsets(acquired) == [(0, 1)]
    assert [value for _, _, value, _ in dead_letters(world, "long.dlq")] == [b"poison"]
    assert world.describe("named").partitions[0].start_offset == 1, "archived, not stuck"


def produce_values(world: World, topic: str, values: list[bytes]) -> None:
    """One batch of records with these values (key b"k", one header), acknowledged."""
    records = [(index, b"k", value, [("origin", b"test")]) for index, value in enumerate(values)]
    request = ProduceRequest(correlation_id=world.next_id(), topic=topic, partition=0, acks=-1,
                             batch=bytes(encode_batch(records, 1_000)))
    world.harness.deliver(world.leader(topic).endpoint, request, PRODUCER)
    world.settle(100)
    assert world.harness.take(PRODUCER, ProduceResponse)[-1].error == ErrorCode.NONE


def test_a_record_near_its_topics_batch_limit_is_dead_lettered_whole(world):
    """The writer made `<topic>.dlq` with the default settings, so a dead letter (the source
    record plus its railmq.dlq.* headers) of a record near its topic's batch_bytes_max never fit:
    the write was refused MESSAGE_TOO_LARGE for good, 8 MiB sent five times a second, and the
    record stayed dead-lettering, holding its share-partition's start back. The dead-letter
    topic now takes batches larger than its source's by the headers' bound."""
    limit = TopicConfig().batch_bytes_max
    overhead = len(encode_batch([(0, b"k", b"x" * 100_000, [("origin", b"test")])], 1_000)) - 100_000
    produce_values(world, "orders", [b"x" * (limit - overhead)])
    member = world.join("a", ["orders"]).member_id
    assert acquired_offsets(world.acquire_now("a", member, "orders")) == [(0, 1)]
    world.answer("a", member, "orders", 0, 0, "reject", error="too big to handle")
    world.settle(1_500)

    ((_, _, value, headers),) = dead_letters(world)
    assert len(value) == limit - overhead and dict(headers)["railmq.dlq.last_error"] == b"too big to handle"
    assert world.describe().partitions[0].start_offset == 1, "archived, not stuck"


def test_dead_letters_whose_headers_outgrow_the_topics_headroom_go_in_several_writes(world):
    """A hundred records rejected at once with the longest error text, from a topic with a long
    name: their dead letters carry ~90 KB of headers more than the source batch, past what the
    dead-letter topic takes beyond its source's limit. The writer packed them into one write,
    refused for good; it now cuts its writes to what the dead-letter topic takes."""
    topic = "t" * 200
    world.create_topic(topic)
    limit, count = TopicConfig().batch_bytes_max, 100
    size = (limit - 4 * 1024) // count
    produce_values(world, topic, [bytes([index]) * size for index in range(count)])
    member = world.join("a", [topic]).member_id
    assert len(acquired_offsets(world.acquire_now("a", member, topic, max_records=count))) == count
    world.answer("a", member, topic, 0, count - 1, "reject", error="e" * LIMITS.share_error_text_bytes_max)
    world.settle(3_000)

    letters = dead_letters(world, f"{topic}.dlq")
    assert [value for _, _, value, _ in letters] == [bytes([index]) * size for index in range(count)]
    assert world.describe().partitions[0].start_offset == count


def test_a_dead_letter_too_large_for_a_topic_made_by_hand_waits_instead_of_being_resent_at_once(world):
    """Someone made `orders.dlq` with a lower batch limit than `orders`: a letter larger than it
    takes can only wait for the topic to change. It was sent again every 200 ms (the retry after a
    passing refusal), megabytes each time; it now waits as long as a refused topic does."""
    world.harness.deliver(COORDINATOR, CreateTopicRequest(
        correlation_id=world.next_id(), name="orders.dlq", partitions=1, replication_factor=1,
        config=TopicConfig(batch_bytes_max=1024 * 1024)), PRODUCER)
    assert world.harness.take(PRODUCER, CreateTopicResponse)[-1].error == ErrorCode.NONE
    world.settle(500)
    produce_values(world, "orders", [b"x" * (2 * 1024 * 1024)])
    member = world.join("a", ["orders"]).member_id
    world.acquire_now("a", member, "orders")
    world.answer("a", member, "orders", 0, 0, "reject")
    world.settle(DEAD_LETTER_TOPIC_RETRY_MS - 500)

    refusals = world.harness.trace_events("share-dead-letter-retry")
    assert [event["error"] for event in refusals] == [ErrorCode.MESSAGE_TOO_LARGE], "once, not every 200 ms"
    assert world.describe().partitions[0].records[0].state == "dead-lettering", "it waits; nothing is lost"
    world.settle(1_000)
    assert len(world.harness.trace_events("share-dead-letter-retry")) == 2, "and is tried again"


# ---------------------------------------------------------------------------- the member's side


def start_member(world: World, name: str, topics: list[str], **options) -> ShareMember:
    settings = ShareMemberSettings(group_id="g", client_id=name, group=ShareGroupSettings(
        visibility_timeout_ms=VISIBILITY_MS, max_delivery_attempts=3), session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=500, acquire_max_wait_ms=300, **options)
    member = ShareMember(bootstrap=COORDINATOR, settings=settings, name=name)
    world.harness.add(name, member)
    world.harness.deliver(name, ClientCommand(command="subscribe", arguments={"topics": topics}), b"")
    world.settle(200)
    return member


def delivered(world: World, name: str) -> list[tuple[int, int]]:
    """(offset, delivery count) of every record the member handed to its shell, oldest first."""
    found = []
    for address, notify in world.harness.notified:
        if address == name and notify.kind == "share-records":
            _, topic, partition, batches, ranges, deadline_ms, _ = notify.payload
            found += [(record.offset, record.delivery_count)
                      for record in decode_acquired(topic, partition, batches, ranges, deadline_ms)]
    return found


def answer_as(world: World, name: str, entries: list[list], token: int = 7) -> list[list]:
    world.harness.deliver(name, ClientCommand(command="acknowledge", arguments={"acknowledgements": entries},
                                              token=token), b"")
    world.settle(100)
    results = [notify.payload for address, notify in world.harness.notified
               if address == name and notify.kind == "result" and notify.payload[0] == token]
    return results[-1][1]


def test_a_member_joins_acquires_fetches_from_the_leader_and_hands_over_only_its_records(world):
    world.produce("orders", ["a", "b", "c"])
    member = start_member(world, "m1", ["orders"])

    assert member.state == "stable" and member.member_id.startswith("m1-")
    assert delivered(world, "m1") == [(0, 1), (1, 1), (2, 1)]
    memberships = [n.payload for a, n in world.harness.notified if a == "m1" and n.kind == "membership"]
    assert [(number, member_id) for number, member_id, _ in memberships] == [(1, member.member_id)]
    assert sorted(member.held[("orders", 0)]) == [0, 1, 2]


def test_records_handed_over_name_their_topics_id_so_an_idempotent_consumer_tells_a_topic_made_again_apart(
        world, tmp_path):
    """A share group starts a topic made again under its name from its start: its records come at
    offsets an idempotent store had seen for the old topic. Handed over without the topic's id, they
    had the old records' message ids and were skipped as redeliveries, never applied."""
    world.produce("orders", ["a"])
    start_member(world, "m1", ["orders"])
    [(_, topic, partition, batches, ranges, deadline_ms, topic_id)] = [
        notify.payload for address, notify in world.harness.notified
        if address == "m1" and notify.kind == "share-records"]
    [record] = decode_acquired(topic, partition, batches, ranges, deadline_ms, topic_id=topic_id)

    assert record.topic_id == world.coordinator.topics["orders"].topic_id != 0
    assert offset_message_id(record) == f"orders/0/0@{record.topic_id}"
    with IdempotentStore(str(tmp_path / "ids.db")) as store:
        made_again = msgspec.structs.replace(record, topic_id=record.topic_id + 1)
        assert [store.process(each, lambda *_: None) for each in (record, record, made_again)] == [
            True, False, True]


def test_a_member_answers_records_of_a_topic_made_again_apart_from_the_new_ones_at_their_offsets(world):
    """The member's shell names the topic id of the records it answers, and the member sends it:
    the old topic's records are refused UNKNOWN_TOPIC_ID and the new ones at the same offsets stay
    to be answered (before, a late reject of old 0..1 dead-lettered the new 0..1)."""
    old_topic_id = world.coordinator.topics["orders"].topic_id
    world.produce("orders", ["old-0", "old-1"])
    start_member(world, "m1", ["orders"], request_timeout_ms=2_000)  # its fetch to the old leader times out
    assert delivered(world, "m1") == [(0, 1), (1, 1)]
    new_topic_id = made_again_with(world, ["new-0", "new-1"])

    def first_deliveries_of_the_new_topic() -> list[int]:
        return [offset for topic_id, offset, count in delivered_with_topic_ids(world, "m1")
                if (topic_id, count) == (new_topic_id, 1)]

    for _ in range(100):
        world.settle(200)
        if first_deliveries_of_the_new_topic() == [0, 1]:
            break
    assert first_deliveries_of_the_new_topic() == [0, 1], "the new topic's records, from its start"

    [late] = answer_as(world, "m1", [["orders", 0, 0, 1, "reject", 0, "old", 1, old_topic_id]], token=7)
    [current] = answer_as(world, "m1", [["orders", 0, 0, 1, "accept", 0, "", 1, new_topic_id]], token=8)
    world.settle(1_500)

    assert late[4] == ErrorCode.UNKNOWN_TOPIC_ID and current[4] == ErrorCode.NONE
    assert dead_letters(world) == []


def test_records_acquired_in_a_deleted_topics_share_partition_are_not_fetched_from_the_new_topic(world):
    """The coordinator had not yet seen the topic made again when it handed the member offsets 0..1
    of the old share-partition (their third delivery); the member fetched them with its metadata,
    which named the new topic, and handed the new topic's records 0..1 to its user under the old
    share-partition's locks and delivery count. A fetch names the topic id the records were
    acquired under, so the new topic's leader refuses it, and the new topic's records are handed
    out only by the new share-partition, from their first delivery."""
    world.produce("orders", ["old-0", "old-1"])
    start_member(world, "m1", ["orders"], request_timeout_ms=2_000)  # its fetch to the old leader times out
    new_topic_id = made_again_with(world, ["new-0", "new-1"])
    world.settle(12_000)

    assert world.harness.trace_events("share-partition-of-a-deleted-topic")
    new_deliveries = [count for topic_id, offset, count in delivered_with_topic_ids(world, "m1")
                      if topic_id == new_topic_id and offset == 0]
    assert new_deliveries[:3] == [1, 2, 3], "the new share-partition's deliveries, from the first"


def made_again_with(world: World, values: list[str]) -> int:
    """Delete `orders` (its replicas gone with it), make it again and produce `values` into it:
    the new topic's id."""
    world.harness.deliver(COORDINATOR, DeleteTopicRequest(correlation_id=world.next_id(), name="orders"),
                          PRODUCER)
    for key in [key for key in world.replicas if key[0] == "orders"]:
        world.harness.remove(world.replicas.pop(key).endpoint)
    world.settle(200)
    world.create_topic("orders")
    world.produce("orders", values)
    return world.coordinator.topics["orders"].topic_id


def acquired_until(world: World, member: str, count: int) -> list[int]:
    """Member "a" heartbeats and acquires in rounds until it has been handed `count` offsets (at
    most 30 rounds): the offsets, sorted."""
    offsets: set[int] = set()
    for _ in range(30):
        assert world.heartbeat("a", member, ["orders"]).error == ErrorCode.NONE
        world.acquire("a", member, "orders", max_records=100, wait_ms=200)
        world.settle(300)
        offsets |= {offset for response in world.acquired("a") for offset, _ in acquired_offsets(response)}
        if len(offsets) >= count:
            break
    return sorted(offsets)


def delivered_with_topic_ids(world: World, name: str) -> list[tuple[int, int, int]]:
    """(topic id, offset, delivery count) of every record the member handed to its shell."""
    found = []
    for address, notify in world.harness.notified:
        if address == name and notify.kind == "share-records":
            _, topic, partition, batches, ranges, deadline_ms, topic_id = notify.payload
            found += [(topic_id, record.offset, record.delivery_count)
                      for record in decode_acquired(topic, partition, batches, ranges, deadline_ms)]
    return found


def test_a_member_holding_its_prefetch_bound_acquires_no_more_until_it_answers(world):
    world.produce("orders", [str(n) for n in range(10)])
    member = start_member(world, "m1", ["orders"], prefetch_records_max=4)
    assert delivered(world, "m1") == [(n, 1) for n in range(4)]
    world.settle(500)
    assert len(delivered(world, "m1")) == 4, "holding 4 locks: nothing more is taken from the others"

    results = answer_as(world, "m1", [["orders", 0, 0, 3, "accept", 0, ""]])
    assert results == [["orders", 0, 0, 3, ErrorCode.NONE, 0]]
    assert delivered(world, "m1")[4:] == [(n, 1) for n in range(4, 8)]
    assert member.holding() == 4


def test_answers_come_back_per_range_and_a_refused_range_says_why(world):
    world.produce("orders", ["a", "b"])
    start_member(world, "m1", ["orders"])
    results = answer_as(world, "m1", [["orders", 0, 0, 0, "renew", 0, ""], ["orders", 0, 1, 1, "accept", 0, ""],
                                      ["orders", 0, 1, 1, "accept", 0, ""]])
    (renewed, accepted, again) = results
    assert renewed[4] == ErrorCode.NONE and renewed[5] > world.harness.now_ns // MS
    assert accepted[4] == ErrorCode.NONE
    assert again[4] == ErrorCode.INVALID_RECORD_STATE, "an answered record is no longer held"


def test_closing_releases_what_the_member_held_and_leaves(world):
    world.produce("orders", ["a", "b"])
    first = start_member(world, "m1", ["orders"])
    member_id = first.member_id
    world.harness.deliver("m1", ClientCommand(command="close", token=3), b"")
    world.settle(100)
    assert [n.payload for a, n in world.harness.notified if a == "m1" and n.kind == "result"] == [(3, None, None)]
    assert member_id not in world.group.share.groups["g"].members
    start_member(world, "m2", ["orders"])
    assert delivered(world, "m2") == [(0, 2), (1, 2)], "released at once, not after the visibility timeout"


def test_after_the_coordinator_forgets_a_member_it_joins_again_and_drops_what_it_held(world):
    world.produce("orders", ["a"])
    member = start_member(world, "m1", ["orders"])
    first_id = member.member_id
    world.crash_group_coordinator()
    world.settle(800)

    assert member.member_id and member.member_id != first_id
    memberships = [n.payload[0] for a, n in world.harness.notified if a == "m1" and n.kind == "membership"]
    assert memberships[-1] > memberships[0], "a new membership: the shell drops records of the old one"
    assert delivered(world, "m1") == [(0, 1), (0, 2)], "the restart voided the first lock, not its count"


def test_records_whose_lock_expired_before_their_bytes_came_are_not_handed_over(world):
    world.produce("orders", ["a"])
    world.harness.lose = lambda envelope: isinstance(envelope.message, FetchRequest) and envelope.sender == "m1"
    member = start_member(world, "m1", ["orders"], request_timeout_ms=5000)
    world.settle(VISIBILITY_MS + 200)
    world.harness.heal()
    world.settle(5_000)
    assert all(count > 1 for _, count in delivered(world, "m1")), "the first delivery expired unseen"
    assert member.invariants() is None


def member_wakes(world: World, name: str) -> list[int]:
    return [index for index, step in enumerate(world.harness.steps)
            if step.address == name and isinstance(step.message, TimerFired)]


def test_an_unsubscribed_member_sets_no_timer(world):
    member = ShareMember(bootstrap=COORDINATOR, settings=ShareMemberSettings(group_id="g"), name="idle")
    world.harness.add("idle", member)
    world.settle(10_000)
    assert world.harness.timers["idle"].deadline("tick") is None and member_wakes(world, "idle") == []


def test_a_stable_member_wakes_for_its_heartbeats_and_its_locks_not_every_50_ms(world):
    """Nothing to acquire and no lock held: the member's timer is at the next heartbeat (and the
    parked acquire's request timeout), so a quiet second costs about two wakes, not twenty."""
    member = start_member(world, "m1", ["orders"])
    assert member.state == "stable"
    before = len(member_wakes(world, "m1"))
    world.settle(1_000)
    assert len(member_wakes(world, "m1")) - before <= 3, "woke while nothing was due"
    assert member.invariants() is None


def test_a_held_lock_is_dropped_at_its_deadline(world):
    world.produce("orders", ["a"])
    member = start_member(world, "m1", ["orders"])
    [deadline_ms] = set(member.held[("orders", 0)].values())
    world.harness.advance_to(deadline_ms * MS - 1)
    assert 0 in member.held[("orders", 0)]
    world.harness.advance_to(deadline_ms * MS)
    assert member.held[("orders", 0)].get(0) != deadline_ms, "kept a lock past its deadline"  # (or took it anew)


def test_a_lock_deadline_the_member_timer_would_miss_breaks_its_invariants(world):
    world.produce("orders", ["a"])
    member = start_member(world, "m1", ["orders"])
    [deadline_ms] = set(member.held[("orders", 0)].values())
    member.timer.armed_ns = deadline_ms * MS + 1  # as if the lock's deadline was never wanted
    with pytest.raises(AssertionError, match="timer would fire after"):
        member.invariants()


@pytest.mark.parametrize("text, milliseconds", [("500ms", 500), ("30s", 30_000), ("2m", 120_000), ("1h", 3_600_000),
                                                (" 7 s ", 7_000)])
def test_durations_parse_with_their_unit(text, milliseconds):
    assert parse_duration_ms(text) == milliseconds


@pytest.mark.parametrize("text", ["30", "1.5s", "-2s", "5 minutes", ""])
def test_durations_without_a_unit_or_with_an_unknown_one_are_refused(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration_ms(text)


@pytest.mark.parametrize("bad", [dict(topics=[]), dict(handler="no_such_module_here:handle"), dict(handler=42),
                                 dict(max_delivery_attempts=0), dict(auto_offset_reset="middle")])
def test_run_share_member_refuses_options_that_cannot_work_with_a_usage_error(bad, capsys):
    options = ShareMemberOptions(**{"bootstrap": "tcp://127.0.0.1:1", "group_id": "g", "topics": ["orders"], **bad})
    assert run_share_member(options) == 2
    assert "railmq consume: error:" in capsys.readouterr().err


# ---------------------------------------------------------------------------- deleting a share group


def test_a_share_group_without_members_can_be_deleted_with_its_state(world):
    from actors.messages import DeleteGroupRequest, DeleteGroupResponse

    member = world.join("a", ["orders"]).member_id
    assert world.heartbeat("a", member, ["orders"], leaving=True).error == ErrorCode.NONE

    answer = only(world.harness.deliver(GROUP, DeleteGroupRequest(correlation_id=1, group_id="g"), "admin"),
                  DeleteGroupResponse)

    assert answer.error == ErrorCode.NONE
    assert not world.group.share.owns("g")
    assert world.group.state.items("share-group/") == []
    assert world.group.state.items("share-partition/g/") == []


def test_a_share_group_with_members_is_not_deleted(world):
    from actors.messages import DeleteGroupRequest, DeleteGroupResponse

    world.join("a", ["orders"])

    answer = only(world.harness.deliver(GROUP, DeleteGroupRequest(correlation_id=1, group_id="g"), "admin"),
                  DeleteGroupResponse)

    assert answer.error == ErrorCode.NON_EMPTY_GROUP
    assert world.group.share.owns("g")


def test_a_share_groups_requests_to_the_controllers_follow_not_controller_hints():
    """Producer ids and dead-letter topics are asked of the controller quorum like metadata: a voter
    that does not lead names the one that does, and the next request goes there (before this, a
    dead-letter writer asking a follower controller retried at that follower forever)."""
    from actors.errors import ErrorCode as Code
    from actors.messages import ErrorResponse, InitProducerIdRequest
    from actors.share_leaders import PartitionLeaders

    leaders = PartitionLeaders(coordinator="tcp://c1,tcp://c2,tcp://c3", limits=Limits(), topics_in_use=set)
    sent = leaders.send_request("producer-id", ("t.dlq", 0), leaders.coordinator,
                                InitProducerIdRequest(correlation_id=0), 0)
    assert sent.to == "tcp://c1"
    leaders.answered(sent.message.correlation_id, ErrorResponse(
        correlation_id=sent.message.correlation_id, error=Code.NOT_CONTROLLER, controller_id=3,
        controller_endpoint="tcp://c3"))
    assert leaders.coordinator == "tcp://c3"
    again = leaders.send_request("producer-id", ("t.dlq", 0), leaders.coordinator,
                                 InitProducerIdRequest(correlation_id=0), 0)
    leaders.answered(again.message.correlation_id, ErrorResponse(
        correlation_id=again.message.correlation_id, error=Code.REQUEST_TIMED_OUT))
    assert leaders.coordinator != "tcp://c3", "a voter that did not answer is passed over"


# ---------------------------------------------------------------------------- bounds


def test_records_in_flight_over_every_share_partition_stop_at_the_coordinators_bound(monkeypatch):
    """Each share-partition holds at most share_records_in_flight_max records in flight, but
    share-partitions can be 10,000 (groups x partitions): 20 million records, gigabytes. Over
    all of them the coordinator holds at most share_records_in_flight_total_max; past it only
    redeliveries are handed out, until records complete."""
    monkeypatch.setattr(sys.modules[__name__], "LIMITS",
                        msgspec.structs.replace(LIMITS, share_records_in_flight_total_max=30,
                                                share_records_in_flight_reserved_per_group=0))
    world = World()
    world.create_topic("orders")
    world.produce("orders", [f"v{index}" for index in range(50)])
    first = world.join("a", ["orders"], group="g").member_id
    second = world.join("b", ["orders"], group="h").member_id

    taken_first = acquired_offsets(world.acquire_now("a", first, "orders", group="g", max_records=20))
    capped = world.acquire_now("b", second, "orders", group="h", max_records=20)
    world.answer("a", first, "orders", 0, 19, "accept")
    freed = world.acquire_now("b", second, "orders", group="h", max_records=20)

    assert len(taken_first) == 20
    assert [offset for offset, _ in acquired_offsets(capped)] == list(range(10)), "only 10 more fit"
    assert [offset for offset, _ in acquired_offsets(freed)] == list(range(10, 30)), "room again once accepted"
    share = world.group.share
    assert share.records_in_flight == sum(len(partition.records) for group in share.groups.values()
                                          for partition in group.partitions.values()) <= 30


def test_a_group_holding_its_most_records_in_flight_leaves_room_for_another_group(monkeypatch):
    """One bound over every share group let the first group that held its records (a long
    visibility timeout, many attempts) take all of it: another group then got only redeliveries,
    nothing new, until the first one's records completed. Each group holds at most
    share_records_in_flight_per_group_max, at most half the coordinator's bound."""
    monkeypatch.setattr(sys.modules[__name__], "LIMITS", msgspec.structs.replace(
        LIMITS, share_records_in_flight_total_max=30, share_records_in_flight_per_group_max=15,
        share_records_in_flight_reserved_per_group=0))
    world = World()
    world.create_topic("wide", partitions=2)
    for partition in (0, 1):
        world.produce("wide", [f"v{index}" for index in range(40)], partition=partition)
    holder = world.join("a", ["wide"], group="g").member_id
    other = world.join("b", ["wide"], group="h").member_id

    held = acquired_offsets(world.acquire_now("a", holder, "wide", group="g", max_records=20))
    world.acquire("a", holder, "wide", group="g", max_records=20, partition=1, wait_ms=300)
    world.settle(400)
    (more,) = world.acquired("a")
    taken = acquired_offsets(world.acquire_now("b", other, "wide", group="h", max_records=20))

    assert (len(held), more.acquired) == (15, []), "the holder stops at its group's bound, waiting in vain"
    assert [offset for offset, _ in taken] == list(range(15)), "the other group still gets new records"
    share = world.group.share
    assert [share.groups[group].records_in_flight for group in ("g", "h")] == [15, 15]
    assert share.records_in_flight <= 30


def test_groups_holding_their_most_records_in_flight_leave_every_other_group_its_reservation(monkeypatch):
    """Enough groups holding their most records in flight (an hour's visibility timeout, many
    attempts: anyone may make share groups) filled the coordinator's whole bound, and a new group
    got nothing at all until their records completed. Every group may now hold
    share_records_in_flight_reserved_per_group whatever the others hold: the coordinator keeps that
    many aside for each group it may have, and the groups share only the rest."""
    monkeypatch.setattr(sys.modules[__name__], "LIMITS", msgspec.structs.replace(
        LIMITS, share_records_in_flight_total_max=30, share_records_in_flight_per_group_max=15,
        share_records_in_flight_reserved_per_group=5, share_groups_max=3))
    world = World()
    world.create_topic("orders")
    world.produce("orders", [f"v{index}" for index in range(60)])
    holders = {group: world.join(group, ["orders"], group=group).member_id for group in ("g", "h", "k")}

    held = {group: acquired_offsets(world.acquire_now(group, holders[group], "orders", group=group,
                                                      max_records=20)) for group in ("g", "h")}
    late = acquired_offsets(world.acquire_now("k", holders["k"], "orders", group="k", max_records=20))

    assert [len(held["g"]), len(held["h"])] == [15, 10], "15 of the shared 15 and h's own 5 leave k its 5"
    assert [offset for offset, _ in late] == list(range(5)), "the last group still gets its reservation"
    share = world.group.share
    assert share.records_in_flight == 30
    assert share.pooled_in_flight == 15, "10 of g's and 5 of h's are beyond their reservations"


def test_members_subscribing_to_many_names_do_not_keep_the_coordinator_from_its_leaders(monkeypatch):
    """The group coordinator asks the controller about every topic its share members subscribe
    to, in one metadata request, and the controller refuses a request naming more than
    `topics_max` topics. Members may subscribe to names that are no topic (200 members of 10,000
    each): the coordinator's every request was refused, it learnt no leader, and no share group
    got a record. It asks about at most `topics_max` names at a time: the topics it knows and was
    asked about first, the other names in turn."""
    monkeypatch.setattr(sys.modules[__name__], "LIMITS", msgspec.structs.replace(LIMITS, topics_max=3))
    world = World()
    world.create_topic("orders")
    world.produce("orders", ["a", "b"])
    world.join("junk", ["nothing-1", "nothing-2", "nothing-3"], group="h")
    member = world.join("a", ["orders"]).member_id

    taken = acquired_offsets(world.acquire_now("a", member, "orders", max_records=10))
    asked = [step.message.topics for step in world.harness.steps_of(COORDINATOR, MetadataRequest)]

    assert [offset for offset, _ in taken] == [0, 1]
    assert asked and all(len(topics) <= 3 for topics in asked), asked


def test_a_topic_deleted_and_made_again_under_its_name_is_shared_from_its_start():
    """The share group had delivered offsets 0..29 of the old topic. The new one got 40 records:
    its window must start again (auto_offset_reset=earliest), not at 30."""
    world = World()
    world.create_topic("orders")
    world.produce("orders", [f"old-{index}" for index in range(30)])
    member = world.join("a", ["orders"]).member_id
    assert len(acquired_offsets(world.acquire_now("a", member, "orders", max_records=30))) == 30
    world.answer("a", member, "orders", 0, 29, "accept")
    made_again_with(world, [f"new-{index}" for index in range(40)])

    # The leader of the old topic is gone: the coordinator's request to it times out first.
    assert acquired_until(world, member, 40) == list(range(40)), (
        "every record of the new topic, from its start")
    assert world.harness.trace_events("share-partition-of-a-deleted-topic")


def test_an_answer_to_a_record_of_the_deleted_topic_does_not_settle_the_new_topics_record_there():
    """The member held offsets 0..29 of the old topic; the topic was deleted and made again, and
    the same member acquired the new topic's 0..39 (each a first delivery, as the old ones were).
    Its user's late answer to the old records, rejecting 0..9, was taken for the new records at
    those offsets: 10 healthy records of the new topic archived and dead-lettered, never handled.
    An answer names the topic id its records came from, and one of another id settles nothing."""
    world = World()
    world.create_topic("orders")
    old_topic_id = world.coordinator.topics["orders"].topic_id
    world.produce("orders", [f"old-{index}" for index in range(30)])
    member = world.join("a", ["orders"]).member_id
    assert len(acquired_offsets(world.acquire_now("a", member, "orders", max_records=30))) == 30
    new_topic_id = made_again_with(world, [f"new-{index}" for index in range(40)])
    assert acquired_until(world, member, 40) == list(range(40)) and old_topic_id != new_topic_id

    late = world.answer("a", member, "orders", 0, 9, "reject", topic_id=old_topic_id, delivery_count=1,
                        error="the old topic's record")
    current = world.answer("a", member, "orders", 0, 39, "accept", topic_id=new_topic_id, delivery_count=1)
    world.settle(1_500)

    assert late.error == ErrorCode.UNKNOWN_TOPIC_ID
    assert [result.error for result in current.results] == [ErrorCode.NONE], "all 40 held, then accepted"
    assert dead_letters(world) == [], "no record of the new topic dead-lettered"


def test_a_partition_the_topic_gained_while_the_group_read_it_is_shared_from_its_start():
    """auto_offset_reset=latest is for a group new to a topic. The topic gained a partition while
    the group read it, and 3 records were written there: its window started at their end, and the
    group never got them (KAFKA-12261). A partition the topic had when the group came still starts
    at its end."""
    world = World()
    world.create_topic("orders", partitions=2)
    world.produce("orders", ["before"], partition=1)
    member = world.join("a", ["orders"], auto_offset_reset="latest").member_id

    def take(partition: int) -> list[int]:
        world.acquire("a", member, "orders", wait_ms=300, partition=partition)
        world.settle(600)
        return [offset for response in world.acquired("a") for offset, _ in acquired_offsets(response)]

    assert take(0) == [] and take(1) == [], "both partitions the group came to start at their end"
    world.harness.deliver(COORDINATOR, CreatePartitionsRequest(correlation_id=world.next_id(), name="orders",
                                                               total_partitions=3), PRODUCER)
    world.settle(LIMITS.replica_heartbeat_interval_ms * 5)
    world.produce("orders", ["gained-0", "gained-1", "gained-2"], partition=2)
    for _ in range(10):
        if len(world.heartbeat("a", member, ["orders"]).partitions) == 3:
            break
        world.settle(1_000)

    assert take(2) == [0, 1, 2], "every record of the partition the topic gained"
    world.crash_group_coordinator()
    assert world.group.share.groups["g"].partitions[("orders", 0)].topic_partitions == 2, (
        "kept through a restart")


def test_a_share_partition_keeps_the_id_of_its_topic_through_a_coordinator_crash(world):
    world.produce("orders", ["a", "b"])
    member = world.join("a", ["orders"]).member_id
    world.acquire_now("a", member, "orders")
    topic_id = world.coordinator.topics["orders"].topic_id

    world.crash_group_coordinator()

    assert world.group.share.groups["g"].partitions[("orders", 0)].topic_id == topic_id != 0


def test_an_answer_about_the_old_topic_arriving_after_it_was_made_again_is_dropped():
    world = World()
    world.create_topic("orders")
    member = world.join("a", ["orders"]).member_id
    world.acquire("a", member, "orders", wait_ms=5_000)  # nothing to acquire: parked, the leader's
    world.settle(100)                                      # high watermark is read in a long poll
    leaders = world.group.share.leaders
    in_flight = leaders.watches[("orders", 0)].correlation
    assert in_flight in leaders.pending
    old = world.group.share.groups["g"].partitions[("orders", 0)]
    changed = msgspec.structs.replace(leaders.topics["orders"], topic_id=old.topic_id + 1)

    [ask] = [effect.message for effect in leaders.request_metadata(["orders"], world.harness.now_ns)
             if isinstance(getattr(effect, "message", None), MetadataRequest)]
    world.harness.deliver(GROUP, MetadataResponse(correlation_id=ask.correlation_id, topics=[changed]), COORDINATOR)
    world.harness.deliver(GROUP, ListOffsetsResponse(correlation_id=in_flight, topic="orders", partition=0,
                                                     offset=2, high_watermark=2, log_start_offset=0), "leader")

    fresh = world.group.share.groups["g"].partitions[("orders", 0)]
    assert fresh is not old and fresh.topic_id == old.topic_id + 1 and not fresh.initialized


def test_one_acknowledgement_request_covers_at_most_what_a_member_can_hold():
    """2,000 ranges, each renewing the same 2,000 held records, were 8 million steps of the one
    group coordinator every group shares (seconds of CPU per request of ~50 KB). A request naming
    more offsets than a share-partition can hold in flight is refused whole, and changes nothing."""
    monkey_limits = msgspec.structs.replace(LIMITS, share_records_in_flight_max=200)
    world = World()
    world.group.share.limits = monkey_limits
    world.create_topic("orders")
    world.produce("orders", [f"v{index}" for index in range(200)])
    member = world.join("a", ["orders"]).member_id
    held = world.acquire_now("a", member, "orders", max_records=200)
    assert len(acquired_offsets(held)) == 200
    renew = ShareAcknowledgement(first_offset=0, last_offset=199, kind="renew")

    world.harness.deliver(GROUP, ShareAcknowledgeRequest(
        correlation_id=world.next_id(), group_id="g", member_id=member, member_secret=world.secrets[member],
        topic="orders", partition=0, acknowledgements=[renew] * 2), "a")
    answer = world.harness.take("a", ShareAcknowledgeResponse)[-1]
    within = world.answer("a", member, "orders", 0, 199, "renew")

    assert answer.error == ErrorCode.INVALID_REQUEST and "offsets" in answer.error_message and not answer.results
    assert within.error == ErrorCode.NONE


def test_a_description_of_share_partitions_stays_within_its_byte_bound(monkeypatch):
    """Each in-flight record released with its own error text is a range of its own in a
    description: 100,000 records in flight with 256-byte texts, held by a member with a
    200-character client id, made an answer of 56 MB, past the 32 MiB frame a client decodes. A
    description holds at most share_describe_bytes_max of ranges and says how many in-flight
    offsets it leaves out."""
    monkeypatch.setattr(sys.modules[__name__], "LIMITS",
                        msgspec.structs.replace(LIMITS, share_describe_bytes_max=4096))
    world = World()
    world.create_topic("orders")
    world.produce("orders", [f"v{index}" for index in range(40)])
    member_id = world.join("a", ["orders"]).member_id
    assert len(acquired_offsets(world.acquire_now("a", member_id, "orders", max_records=40))) == 40
    for offset in range(40):
        world.answer("a", member_id, "orders", offset, offset, "release", error=f"{offset:03d}" + "e" * 200)

    [partition] = world.describe().partitions

    shown = sum(ranged.last_offset - ranged.first_offset + 1 for ranged in partition.records)
    assert 0 < shown < 40 and partition.records_omitted == 40 - shown
    assert partition.end_offset - partition.start_offset == 40
    assert len(msgspec.msgpack.encode(partition.records)) <= 4096


def test_a_share_groups_description_lists_members_partitions_within_its_byte_bound(monkeypatch):
    """Every member of a share group is given every partition of its topics, and DescribeGroup
    listed them per member: 200 members of a topic with 750 partitions and a 249-character name
    made a 38 MB answer, past the 32 MiB frame a client decodes. Members' partitions are listed
    while share_describe_bytes_max lasts; a member past it says how many it leaves out."""
    monkeypatch.setattr(sys.modules[__name__], "LIMITS",
                        msgspec.structs.replace(LIMITS, share_describe_bytes_max=300))
    world = World()
    world.create_topic("orders", partitions=6)
    members = [world.join(name, ["orders"]).member_id for name in ("a", "b", "c")]
    world.harness.deliver(GROUP, DescribeGroupRequest(correlation_id=1, group_id="g"), "admin")

    described = only(world.harness.received("admin"), DescribeGroupResponse)

    assert sorted(member.member_id for member in described.members) == sorted(members)
    listed = [member for member in described.members if member.assignment]
    cut = [member for member in described.members if member.assignment_omitted]
    assert listed and cut and len(listed) + len(cut) == 3
    assert all(len(member.assignment) == 6 for member in listed)
    assert all(member.assignment == [] and member.assignment_omitted == 6 for member in cut)
