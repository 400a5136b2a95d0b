"""Clients against a hostile, buggy or stale server: every answer is a claim, checked before use.

The consumer, producer, group member and share member actors run in the harness (the shells
get their notices by hand); the test plays the servers and sends what a confused or malicious
one might: answers for another batch or from another endpoint, batches that overlap or run past
the high watermark, more bytes or records than were asked for, negative offsets, metadata that
does not describe partitions 0..n-1, assignments the member never subscribed to, voters naming
each other. The rule each test guards: no bare exception, nothing delivered twice, out of order,
from the wrong place or not at all, nothing acknowledged or committed that the server did not
confirm, no request loop at network speed, and no buffer or map that grows past its bound.
"""

from __future__ import annotations


import msgspec
import pytest
import zmq

from actors.actor import MS
from actors.assignors import Subscription
from actors.client_metadata import SERVER_TEXT_CHARS_MAX
from actors.client_metadata import UNREACHABLE_ENDPOINTS_MAX as UNREACHABLE_ENDPOINTS_MAX_CLIENT
from actors.consumer_client import ConsumerClient, ConsumerSettings
from actors.consumer_member import JOIN_BACKOFF_MS
from actors.controller_endpoints import ControllerEndpoints
from actors.client_metadata import checked_topic
from actors.effects import Notify, Send
from actors.errors import ErrorCode, RailmqError
from actors.limit_rules import limit_problems
from actors.limits import (
    DEFAULT_LIMITS, LONG_LIST_MAX, PARTITIONS_PER_TOPIC_CEILING, SHARE_LOCK_CEILING_MS, Limits,
)
from actors.messages import (
    AcquiredRecords, ClientCommand, ConsumerAssignment, ErrorResponse, FetchRequest, FetchResponse, GroupMember,
    HeartbeatRequest, HeartbeatResponse, InitProducerIdRequest, InitProducerIdResponse, JoinGroupRequest,
    JoinGroupResponse, ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetEntry, OffsetFetchRequest, OffsetFetchResponse,
    PartitionMetadata, PeerDisconnected, ProduceRequest, ProduceResponse, SendBatch, ShareAcknowledgeRequest,
    ShareAcknowledgeResponse, ShareAcknowledgementResult, ShareAcquireRequest, ShareAcquireResponse,
    ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, SyncGroupRequest, SyncGroupResponse, TopicMetadata,
)
from actors.producer_client import CHASE_INTERVAL_MS, ProducerClient, ProducerSettings
from actors.producer_sequences import PRODUCER_EPOCH_MAX
from actors.share_member import ShareMember, ShareMemberSettings
from railmq.client_shell import ERRORS_KEPT_MAX as CLIENT_ERRORS_KEPT_MAX
from railmq.consumer import Consumer
from railmq.producer import Producer
from railmq.records import decode_fetched_prefix
from railmq.share_consumer import decode_acquired
from storage.batch import compute_crc, encode_batch, parse_header, verify_batch
from tests.helpers import bytes_held_from
from tests.unit.actor_harness import Harness, messages, notices, only
from tests.unit.test_client_engine import Idle
from tests.unit.test_consumer_client import LEADER, Stage as ConsumerStage
from tests.unit.test_consumer_member import (
    GROUPS, HEARTBEAT_MS, Stage as MemberStage, assignment as consumer_assignment,
)
from tests.unit.test_producer_client import (
    DELIVERY_TIMEOUT_MS, Stage as ProducerStage, idempotent_stage, leader,
)
from transport.codec import Codec, DecodeFailure
from transport.runtime import Runtime

def stamped(base_offset: int, count: int, value_bytes: int = 8) -> bytes:
    records = [(i, b"k", b"v" * value_bytes, None) for i in range(count)]
    return bytes(encode_batch(records, 1_000, base_offset=base_offset, leader_epoch=4))


def delivered_offsets(stage: ConsumerStage, position: int) -> list[int]:
    """What the user would see: the shell decodes every "records" notice from `position` on."""
    offsets: list[int] = []
    for topic, partition, _, records, _, _ in stage.notified("records"):
        decoded, corrupt = decode_fetched_prefix(topic, partition, records, position)
        assert corrupt is None, corrupt
        offsets += [record.offset for record in decoded]
        if decoded:
            position = decoded[-1].offset + 1
    return offsets


def answer(stage: ConsumerStage, request: FetchRequest, records: bytes, high_watermark: int = 100) -> list:
    response = FetchResponse(correlation_id=request.correlation_id, topic=request.topic,
                             partition=request.partition, high_watermark=high_watermark, records=records)
    return stage.harness.deliver("consumer", response, LEADER)


# ---------------------------------------------------------------------------- fetch answers


def test_batches_that_overlap_in_one_answer_never_deliver_an_offset_twice():
    stage = ConsumerStage()
    request = stage.assigned_at(10)

    answer(stage, request, stamped(10, 5) + stamped(12, 5))  # CRC-valid, but 12..14 again

    offsets = delivered_offsets(stage, 10)
    assert offsets == sorted(set(offsets)) and offsets[0] == 10
    follow_up = only(stage.sent(FetchRequest), FetchRequest)
    assert follow_up.offset == offsets[-1] + 1  # the next fetch starts right after what was delivered


def test_a_batch_that_goes_backwards_is_not_delivered_and_the_position_does_not_move_back():
    stage = ConsumerStage()
    request = stage.assigned_at(10)

    answer(stage, request, stamped(10, 5) + stamped(3, 2))

    assert delivered_offsets(stage, 10) == [10, 11, 12, 13, 14]
    assert only(stage.sent(FetchRequest), FetchRequest).offset == 15


def test_records_at_or_past_the_answers_high_watermark_are_not_delivered():
    stage = ConsumerStage()
    request = stage.assigned_at(10)

    answer(stage, request, stamped(10, 5) + stamped(15, 5), high_watermark=15)

    assert delivered_offsets(stage, 10) == [10, 11, 12, 13, 14]
    assert only(stage.sent(FetchRequest), FetchRequest).offset == 15


def test_an_answer_holding_only_batches_below_the_fetch_offset_moves_nothing_and_backs_off():
    stage = ConsumerStage()
    request = stage.assigned_at(10)

    answer(stage, request, stamped(2, 3) + stamped(5, 3))

    assert delivered_offsets(stage, 10) == []
    assert stage.sent(FetchRequest) == []  # not asked again at once: a confused leader is not hammered
    stage.harness.advance(200)
    stage.metadata()  # the leader it trusted is asked about again
    assert {request.offset for request in stage.sent(FetchRequest)} == {10}


def test_an_answer_larger_than_the_fetch_asked_for_is_not_buffered_beyond_it():
    stage = ConsumerStage(buffer_bytes_max=64 * 1024, fetch_partition_bytes_max=64 * 1024)
    request = stage.assigned_at(0)
    one = stamped(0, 1, value_bytes=16 * 1024)
    batches = b"".join(stamped(offset, 1, value_bytes=16 * 1024) for offset in range(40))  # ~10x what was asked

    answer(stage, request, batches, high_watermark=1_000)

    handed = sum(len(records) for _, _, _, records, _, _ in stage.notified("records"))
    assert handed <= request.max_bytes
    assert stage.consumer.buffered_bytes <= request.max_bytes
    assert handed >= len(one)  # the whole batches that fit still come


def test_a_first_batch_larger_than_the_fetch_still_comes_whole_so_the_consumer_progresses():
    stage = ConsumerStage(buffer_bytes_max=64 * 1024, fetch_partition_bytes_max=64 * 1024)
    request = stage.assigned_at(0)
    big = stamped(0, 1, value_bytes=100 * 1024)

    answer(stage, request, big + stamped(1, 1), high_watermark=1_000)

    assert delivered_offsets(stage, 0) == [0]


def test_a_small_answer_padded_to_megabytes_is_not_held_whole_behind_its_few_counted_bytes():
    """A leader's answer arrives as frames the runtime reads without copying, and what the
    consumer hands the shell is a slice of the records frame: two small batches padded with
    megabytes (after a batch it refuses) kept every megabyte alive in the shell's buffer while
    `buffered_bytes` counted the one batch taken. 16 answers of 4 MiB held 67 MB for 1,168 bytes
    counted; now what is taken of a frame is copied out, and the frame goes."""
    stage = ConsumerStage()
    request = stage.assigned_at(0)
    codec = Codec()
    buffered = []  # what the shell holds until the user polls
    with bytes_held_from(__file__, at_most=2 * 1024 * 1024) as held:
        for offset in range(16):
            padded = stamped(offset, 1) + stamped(offset + 1, 1) + bytes(4 * 1024 * 1024)
            header, payload = codec.encode(FetchResponse(
                correlation_id=request.correlation_id, topic="orders", partition=0,
                high_watermark=offset + 1, records=padded))  # the second batch ends past the high watermark
            arrived = codec.decode([header, zmq.Frame(payload, copy=False)])  # as the runtime reads it
            del padded, payload
            effects = stage.consumer.handle(arrived, LEADER, stage.harness.now_ns)
            del arrived
            buffered += [effect.payload for effect in effects if isinstance(effect, Notify)
                         and effect.kind == "records"]
            request = only([effect.message for effect in effects if isinstance(effect, Send)
                            and isinstance(effect.message, FetchRequest)], FetchRequest)
        del effects
    assert len(buffered) == 16 and stage.consumer.buffered_bytes < 16 * 1024
    assert held[0] < 2 * 1024 * 1024, f"{held[0]:,} bytes held for {stage.consumer.buffered_bytes:,} counted"


# ---------------------------------------------------------------------------- produce answers


def producer_stage(**settings) -> ProducerStage:
    stage = ProducerStage(**settings)
    stage.send(count=3)
    stage.metadata({0: 1})
    return stage


def produce_answer(stage: ProducerStage, request: ProduceRequest, **fields) -> list:
    response = ProduceResponse(correlation_id=request.correlation_id, topic="orders", partition=request.partition,
                               **fields)
    return stage.harness.deliver("producer", response, leader(1))


@pytest.mark.parametrize("offsets", [
    {},  # a success that names no offset at all
    {"base_offset": -1, "last_offset": 1},
    {"base_offset": 5, "last_offset": 5},  # one record: the answer of another batch
    {"base_offset": 5, "last_offset": 9},  # five records
    {"base_offset": 7, "last_offset": 5},  # backwards
], ids=["no-offsets", "negative-base", "one-record", "five-records", "backwards"])
def test_a_success_whose_offsets_do_not_span_this_batch_is_not_an_acknowledgement(offsets):
    stage = producer_stage()
    request = only(stage.requests(), ProduceRequest)

    produce_answer(stage, request, **offsets)

    assert stage.done() == []  # not acknowledged: retried, as an answer lost would be
    stage.harness.advance(200)
    stage.metadata({0: 1})
    again = only(stage.requests(), ProduceRequest)
    assert again.batch == request.batch
    produce_answer(stage, again, base_offset=40, last_offset=42)
    assert [(batch_id, offset, error) for batch_id, _, offset, error in stage.done()] == [(1, 40, None)]


def test_a_success_after_the_delivery_deadline_that_spans_another_batch_fails_the_batch_with_a_typed_error():
    stage = producer_stage()
    request = only(stage.requests(), ProduceRequest)
    stage.harness.now_ns += (DELIVERY_TIMEOUT_MS + 1) * MS

    produce_answer(stage, request, base_offset=5, last_offset=5)

    [(batch_id, _, offset, error)] = stage.done()
    assert (batch_id, offset) == (1, -1) and isinstance(error, RailmqError)


def test_an_error_code_nobody_knows_fails_the_batch_with_a_typed_error():
    stage = producer_stage()
    request = only(stage.requests(), ProduceRequest)

    produce_answer(stage, request, error=(1 << 31) - 1, error_message="?")

    [(_, _, offset, error)] = stage.done()
    assert offset == -1 and isinstance(error, RailmqError) and error.code == (1 << 31) - 1


def test_a_second_answer_to_an_acknowledged_request_changes_nothing():
    stage = producer_stage()
    request = only(stage.requests(), ProduceRequest)
    produce_answer(stage, request, base_offset=0, last_offset=2)

    produce_answer(stage, request, base_offset=100, last_offset=102)

    assert [(batch_id, offset) for batch_id, _, offset, _ in stage.done()] == [(1, 0)]


# ---------------------------------------------------------------------------- positions


@pytest.mark.parametrize("offset", [-7, -(1 << 63)])
def test_a_negative_offset_from_list_offsets_is_not_taken_as_a_position(offset):
    stage = ConsumerStage(auto_offset_reset="earliest")
    stage.command("assign", partitions=[("orders", 0)])
    stage.metadata()

    stage.answer_reset(offset)  # the harness checks the consumer's invariants after each step

    assert stage.notified("position") == []
    assert stage.sent(FetchRequest) == []
    stage.harness.advance(200)
    stage.metadata()
    stage.answer_reset(3)  # asked again; a sane answer is taken
    assert [payload[3] for payload in stage.notified("position")] == [3]


# ---------------------------------------------------------------------------- group assignments


def member_synced(assignment_bytes: bytes) -> MemberStage:
    """A member that joined as a follower and is handed `assignment_bytes` by the coordinator."""
    stage = MemberStage()
    stage.command("subscribe", topics=["orders"])
    stage.metadata()
    stage.join_as_follower(1, assignment_bytes)
    return stage


def test_an_assignment_that_does_not_decode_makes_the_member_join_again_after_a_backoff():
    stage = member_synced(b"\xc1 not an assignment")

    assert stage.client.fetches == {}
    assert stage.harness.take(GROUPS, JoinGroupRequest) == [], "asked again within the round trip"
    stage.harness.advance(JOIN_BACKOFF_MS)
    assert stage.to_groups(JoinGroupRequest).member_id == "c1-m"


def _joins_in_two_seconds(answer) -> tuple[int, list]:
    """JoinGroups a member sends in 2 s to a coordinator answering each at once with
    `answer(join)` (and each SyncGroup with an assignment that does not decode)."""
    stage = MemberStage()
    stage.command("subscribe", topics=["orders"])
    stage.metadata()
    joins, syncs = 0, []
    for _ in range(400):
        for request in stage.harness.take(GROUPS):
            if isinstance(request, JoinGroupRequest):
                joins += 1
                stage.answer(answer(request))
            elif isinstance(request, SyncGroupRequest):
                syncs.append(request)
                stage.answer(SyncGroupResponse(correlation_id=request.correlation_id, assignment=b"\xc1"))
        stage.harness.advance(5)
    return joins, syncs


@pytest.mark.parametrize("answer", [
    lambda join: JoinGroupResponse(correlation_id=join.correlation_id, generation=1, protocol_name="range",
                                   leader="x", member_id=""),
    lambda join: JoinGroupResponse(correlation_id=join.correlation_id, generation=-4, protocol_name="range",
                                   leader="x", member_id="c1-m"),
    lambda join: JoinGroupResponse(correlation_id=join.correlation_id, generation=1, protocol_name="range",
                                   leader="x", member_id="c1-m"),
], ids=["success-without-a-member-id", "negative-generation", "assignments-that-never-decode"])
def test_a_coordinator_that_keeps_breaking_the_protocol_is_asked_again_with_a_doubling_backoff(answer):
    """A hostile coordinator answering every JoinGroup with a success that names no member (or an
    impossible generation), or every SyncGroup with an assignment that does not decode, was asked
    again once per round trip: 200 joins in 2 s here. The member now waits a backoff doubling from
    JOIN_BACKOFF_MS to a second (KIP-580's retry.backoff.max.ms) before each new join, and never
    syncs as nobody."""
    joins, syncs = _joins_in_two_seconds(answer)

    assert 2 <= joins <= 7, f"{joins} JoinGroups in 2 s"
    assert all(sync.member_id and sync.generation >= 0 for sync in syncs)


def test_a_member_subscription_that_does_not_decode_gets_that_member_nothing():
    stage = MemberStage()
    stage.command("subscribe", topics=["orders"])
    stage.metadata()
    join = stage.to_groups(JoinGroupRequest)
    members = [GroupMember(member_id="c1-m", metadata=join.protocols[0].metadata),
               GroupMember(member_id="garbled", metadata=b"\xc1\xc1")]

    stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=1, protocol_name="range",
                                   leader="c1-m", member_id="c1-m", members=members))

    sync = stage.to_groups(SyncGroupRequest)
    given = {entry.member_id: msgspec.msgpack.decode(entry.assignment, type=ConsumerAssignment).partitions
             for entry in sync.assignments}
    assert sorted(given["c1-m"]) == [("orders", 0), ("orders", 1)] and not given.get("garbled")


@pytest.mark.parametrize("stray", [("payments", 0), ("orders", -1)])
def test_an_assignment_naming_a_topic_not_subscribed_or_an_impossible_partition_is_refused(stray):
    stage = member_synced(consumer_assignment(("orders", 0), stray))

    assert stage.client.fetches == {} and stage.member.owned == []
    assert stage.harness.received(GROUPS, OffsetFetchRequest) == []
    stage.harness.advance(JOIN_BACKOFF_MS)
    assert stage.to_groups(JoinGroupRequest)  # it asks the group again, as Kafka's consumer does


PARTITIONS_MAX = PARTITIONS_PER_TOPIC_CEILING  # a partition numbered past it is in no cluster


def test_an_assignment_of_partitions_no_topic_has_is_refused_not_fetched():
    """A coordinator (or a process on its port) may hand a member partitions of its topic that no
    cluster has. A SyncGroup answer naming orders/0..999,999 (12.9 MB) was taken whole: the
    member owned a million partitions, 495 MB held after 13 s of the I/O thread's time, and
    every later step of the consumer took 1.5 s. Partition numbers past `PARTITIONS_PER_TOPIC_CEILING`
    are refused as negative ones are, and an assignment of more partitions than a list of the
    protocol holds (`LONG_LIST_MAX`) does not decode."""
    stage = member_synced(consumer_assignment(("orders", 0), *(("orders", p) for p in range(
        PARTITIONS_MAX, PARTITIONS_MAX + 2_000))))

    assert stage.client.fetches == {} and stage.member.owned == []
    assert stage.harness.received(GROUPS, OffsetFetchRequest) == []
    stage.harness.advance(JOIN_BACKOFF_MS)
    assert stage.to_groups(JoinGroupRequest)  # it asks the group again, as Kafka's consumer does


def test_a_partition_a_cluster_with_raised_limits_has_is_taken():
    """Clients do not know a cluster's limits: one configured with more partitions per topic than
    the defaults (the directory names allow it with shorter topic names) has partitions past the
    default's 1,000, and its members must take them. The bound a member checks is the ceiling no
    configuration passes, `PARTITIONS_PER_TOPIC_CEILING`."""
    assert not limit_problems(Limits(partitions_per_topic_max=PARTITIONS_PER_TOPIC_CEILING,
                                     topic_name_length_max=200))
    with pytest.raises(ValueError, match="partitions_per_topic_max"):
        Limits(partitions_per_topic_max=PARTITIONS_PER_TOPIC_CEILING + 1, topic_name_length_max=200)
    last = PARTITIONS_PER_TOPIC_CEILING - 1
    stage = member_synced(consumer_assignment(("orders", 1_500), ("orders", last)))

    assert stage.to_groups(OffsetFetchRequest), "taken: its committed offsets are asked for"


def test_metadata_of_a_topic_past_the_default_partition_bound_is_taken_by_clients():
    """The same for metadata: a client checked a topic's partition count against the default
    limits, so every client of a cluster configured for more took its larger topics as having no
    leader (LEADER_NOT_AVAILABLE) for good."""
    wide = TopicMetadata(name="orders", topic_id=7, partitions=[
        PartitionMetadata(partition=index, leader=1, leader_endpoint="tcp://127.0.0.1:9", leader_epoch=1)
        for index in range(1_500)])

    assert checked_topic(wide).error == ErrorCode.NONE
    assert len(checked_topic(wide).partitions) == 1_500


def test_an_assignment_longer_than_any_list_of_the_protocol_does_not_decode():
    many = [("orders", p % PARTITIONS_MAX) for p in range(LONG_LIST_MAX + 1)]
    stage = member_synced(consumer_assignment(*many))

    assert stage.client.fetches == {} and stage.member.owned == []
    assert stage.harness.received(GROUPS, OffsetFetchRequest) == []


def test_a_partition_named_twice_in_an_assignment_is_owned_once():
    stage = member_synced(consumer_assignment(("orders", 0), ("orders", 0)))
    fetch = stage.to_groups(OffsetFetchRequest)
    stage.answer(OffsetFetchResponse(correlation_id=fetch.correlation_id, offsets=[]))

    assert stage.member.owned == [("orders", 0)]
    [(_, _, owned, added)] = stage.notified("assigned")
    assert owned == added == [("orders", 0)]


def test_a_negative_partition_never_borrows_the_leader_of_the_last_partition():
    stage = ConsumerStage()
    stage.command("assign", partitions=[("orders", -1)])
    stage.metadata(partitions=2)

    assert stage.harness.received(LEADER) == []


# ---------------------------------------------------------------------------- metadata


def partition(index: int, node: int) -> PartitionMetadata:
    return PartitionMetadata(partition=index, leader=node, leader_endpoint=leader(node), leader_epoch=1)


def producer_metadata(stage: ProducerStage, *topics: TopicMetadata) -> list:
    asked = stage.harness.take("bootstrap", MetadataRequest)
    response = MetadataResponse(correlation_id=asked[-1].correlation_id if asked else 0, topics=list(topics))
    return stage.harness.deliver("producer", response, "bootstrap")


def test_partitions_listed_out_of_order_still_send_each_batch_to_its_own_leader():
    stage = ProducerStage()
    stage.send(partition=0)

    producer_metadata(stage, TopicMetadata(name="orders", partitions=[partition(1, 2), partition(0, 1)]))

    assert [request.partition for request in stage.requests(node=1)] == [0]
    assert stage.requests(node=2) == []


@pytest.mark.parametrize("partitions", [
    [],  # a topic with no partitions: a key's hash modulo zero
    [partition(0, 1), partition(2, 2)],  # a gap: which one is partition 1?
    [partition(0, 1), partition(0, 2)],  # partition 0 twice
    [partition(index, 1) for index in range(PARTITIONS_PER_TOPIC_CEILING + 1)],  # more than can exist
], ids=["none", "gap", "twice", "too-many"])
def test_metadata_that_does_not_describe_partitions_0_to_n_is_not_used(partitions):
    stage = ProducerStage()
    stage.send(partition=0)

    producer_metadata(stage, TopicMetadata(name="orders", partitions=partitions))

    assert stage.requests(node=1) == [] and stage.requests(node=2) == []
    told = [topic for _, notice in stage.harness.notified if notice.kind == "metadata" for topic in notice.payload]
    assert all(topic.error != 0 for topic in told)  # the shell never counts its partitions
    stage.harness.advance(200)
    producer_metadata(stage, TopicMetadata(name="orders", partitions=[partition(0, 1)]))  # asked again
    assert [request.partition for request in stage.requests(node=1)] == [0]


def test_topics_nobody_asked_about_are_not_kept():
    stage = ProducerStage()
    stage.send(partition=0)

    producer_metadata(stage, TopicMetadata(name="orders", partitions=[partition(0, 1)]),
                      *[TopicMetadata(name=f"invented-{n}", partitions=[partition(0, 1)]) for n in range(500)])

    assert sorted(stage.producer.topics) == ["orders"]


def test_the_consumer_keeps_no_more_topics_than_a_cluster_can_hold():
    stage = ConsumerStage()
    stage.command("assign", partitions=[("orders", 0)])
    names = [f"invented-{n}" for n in range(DEFAULT_LIMITS.topics_max + 100)]

    for start in range(0, len(names), 2_500):  # answer after answer, each naming new topics
        stage.harness.deliver("consumer", MetadataResponse(correlation_id=0, topics=[
            TopicMetadata(name=name, partitions=[PartitionMetadata(partition=0)])
            for name in names[start:start + 2_500]]),
            "bootstrap")
    stage.metadata()

    assert len(stage.consumer.topics) <= DEFAULT_LIMITS.topics_max
    assert "orders" in stage.consumer.topics  # what it fetches is always kept


def test_a_producer_told_of_a_topic_without_partitions_raises_a_typed_error_not_a_division_by_zero():
    producer = Producer("tcp://127.0.0.1:9", max_block_ms=50, request_timeout_ms=100)
    try:
        producer._on_notify("metadata", [TopicMetadata(name="orders", partitions=[])])
        with pytest.raises(RailmqError):
            producer.send("orders", b"value", key=b"key")
    finally:
        producer._closed = True
        producer._engine.stop()


# ---------------------------------------------------------------------------- endpoints


@pytest.mark.parametrize("endpoint", ["garbage", "tcp://a host:1", ""])
def test_a_leader_endpoint_that_is_no_address_is_dropped_and_counted_not_fatal(endpoint):
    context = zmq.Context()
    runtime = Runtime(Idle(), identity="client", context=context)
    try:
        runtime.apply([Send(endpoint, MetadataRequest(correlation_id=1))])

        assert runtime.counters.get("dropped_out_bad_endpoint") == 1
        assert endpoint not in runtime._dealers
    finally:
        runtime.close()
        context.destroy(linger=0)


LOCAL_ENDPOINTS = ["ipc:///tmp/railmq-hostile", "inproc://railmq-hostile", "IPC:///tmp/railmq-hostile",
                   "tcp://127.0.0.1:5;127.0.0.1:6", "tcp://" + "a" * 10_000 + ":1", "tcp://127.0.0.1:1\n"]
LOCAL_ENDPOINT_IDS = ["ipc", "inproc", "IPC", "source-address", "10-KB-host", "newline"]


def sent_to(harness: Harness, endpoint: str) -> list:
    return [envelope.message for envelope in harness.outbox if envelope.to == endpoint]


@pytest.mark.parametrize("endpoint", LOCAL_ENDPOINTS, ids=LOCAL_ENDPOINT_IDS)
def test_no_client_connects_where_an_answer_names_a_local_socket_a_source_address_or_a_huge_name(endpoint):
    """A cluster's processes listen on TCP, and name themselves by host and port. Metadata naming
    a leader, a group coordinator or a voter at `ipc://` or `inproc://` (a local socket the server
    picked), at `tcp://A;B` (ZeroMQ binds the client's side of the connection to A first: a port a
    restarting broker needs) or at a 10 KB host was connected to: the consumer asked it for offsets,
    the producer sent it batches, the member joined its group there and NOT_CONTROLLER hints were
    followed. Each is taken as no leader, no coordinator, no voter."""
    consumer = ConsumerStage()
    consumer.command("assign", partitions=[("orders", 0)])
    consumer.metadata(endpoint=endpoint)
    consumer.harness.deliver("consumer", ErrorResponse(
        correlation_id=-1, error=ErrorCode.NOT_CONTROLLER, controller_endpoint=endpoint), "bootstrap")
    consumer.harness.advance(2_000)
    assert sent_to(consumer.harness, endpoint) == []

    producer = ProducerStage()
    producer.send(count=1)
    producer_metadata(producer, TopicMetadata(name="orders", partitions=[
        PartitionMetadata(partition=0, leader=1, leader_endpoint=endpoint, leader_epoch=1)]))
    producer.harness.advance(2_000)
    assert sent_to(producer.harness, endpoint) == []

    member = MemberStage()
    member.command("subscribe", topics=["orders"])
    asked = member.harness.take("bootstrap", MetadataRequest)
    member.harness.deliver("c1", MetadataResponse(
        correlation_id=asked[-1].correlation_id, group_coordinator_endpoint=endpoint,
        controller_endpoints=["bootstrap", endpoint]), "bootstrap")
    member.harness.advance(2_000)
    assert sent_to(member.harness, endpoint) == []

    share = ShareStage(coordinator=endpoint)
    share.harness.advance(2_000)
    assert sent_to(share.harness, endpoint) == []

    controllers = ControllerEndpoints("tcp://127.0.0.1:1")
    controllers.learn(["tcp://127.0.0.1:1", endpoint])
    controllers.redirect(endpoint)
    assert endpoint not in controllers and controllers.current == "tcp://127.0.0.1:1"


# ---------------------------------------------------------------------------- who answers


OTHER_SERVER = "tcp://127.0.0.1:9/someone-else"


def test_a_fetch_answer_from_a_server_the_fetch_did_not_go_to_is_ignored():
    stage = ConsumerStage()
    request = stage.assigned_at(10)
    forged = FetchResponse(correlation_id=request.correlation_id, topic="orders", partition=0,
                           high_watermark=100, records=stamped(10, 5))

    stage.harness.deliver("consumer", forged, OTHER_SERVER)

    assert stage.notified("records") == []
    answer(stage, request, stamped(10, 2))  # the real leader's answer is still taken
    assert delivered_offsets(stage, 10) == [10, 11]


def test_a_list_offsets_answer_or_error_from_elsewhere_is_ignored():
    stage = ConsumerStage()
    stage.command("assign", partitions=[("orders", 0)])
    stage.metadata()
    request = stage.pending_reset()

    stage.harness.deliver("consumer", ListOffsetsResponse(correlation_id=request.correlation_id, topic="orders",
                                                          partition=0, offset=99), OTHER_SERVER)
    stage.harness.deliver("consumer", ErrorResponse(correlation_id=request.correlation_id,
                                                    error=ErrorCode.NOT_LEADER), OTHER_SERVER)

    assert stage.notified("position") == []
    stage.answer_reset(7)
    assert [payload[3] for payload in stage.notified("position")] == [7]


def test_a_produce_answer_from_a_server_the_batch_did_not_go_to_acknowledges_nothing():
    stage = producer_stage()
    request = only(stage.requests(), ProduceRequest)
    forged = ProduceResponse(correlation_id=request.correlation_id, topic="orders", partition=0,
                             base_offset=0, last_offset=2)

    stage.harness.deliver("producer", forged, OTHER_SERVER)
    stage.harness.deliver("producer", ErrorResponse(correlation_id=request.correlation_id,
                                                    error=ErrorCode.INVALID_REQUEST), OTHER_SERVER)

    assert stage.done() == []
    produce_answer(stage, request, base_offset=50, last_offset=52)
    assert [(batch_id, offset, error) for batch_id, _, offset, error in stage.done()] == [(1, 50, None)]


# ---------------------------------------------------------------------------- share groups


SHARE_GROUPS, SHARE_LEADER = "tcp://127.0.0.1:5/groups", "tcp://127.0.0.1:6/orders/0"


class ShareStage:
    """One share member; the test is its cluster coordinator, group coordinator and leader."""

    def __init__(self, partitions: list[tuple[str, int]] | None = None,
                 coordinator: str = SHARE_GROUPS, answer_join: bool = True) -> None:
        """`coordinator`: the group coordinator the metadata names (SHARE_GROUPS: it joins there,
        and the join is answered unless `answer_join` is False)."""
        self.harness = Harness()
        self.member = ShareMember(bootstrap="bootstrap", settings=ShareMemberSettings(
            group_id="g", prefetch_records_max=100))
        self.harness.add("member", self.member)
        self.harness.deliver("member", ClientCommand(command="subscribe", arguments={"topics": ["orders"]}, token=1))
        asked = self.harness.take("bootstrap", MetadataRequest)[-1]
        self.harness.deliver("member", MetadataResponse(
            correlation_id=asked.correlation_id, group_coordinator_endpoint=coordinator,
            topics=[TopicMetadata(name="orders", partitions=[
                PartitionMetadata(partition=0, leader=1, leader_endpoint=SHARE_LEADER)])]),
            "bootstrap")
        if coordinator != SHARE_GROUPS or not answer_join:
            return
        beat = self.harness.take(SHARE_GROUPS, ShareGroupHeartbeatRequest)[-1]
        self.harness.deliver("member", ShareGroupHeartbeatResponse(
            correlation_id=beat.correlation_id, member_id="m1",
            partitions=partitions if partitions is not None else [("orders", 0)]), SHARE_GROUPS)

    def acquire_answer(self, *ranges: tuple[int, int], topic: str = "orders", partition: int = 0) -> list:
        request = only(self.harness.take(SHARE_GROUPS, ShareAcquireRequest), ShareAcquireRequest)
        return self.harness.deliver("member", ShareAcquireResponse(
            correlation_id=request.correlation_id, topic=topic, partition=partition, lock_deadline_ms=10**12,
            acquired=[AcquiredRecords(first_offset=first, last_offset=last, delivery_count=1)
                      for first, last in ranges]), SHARE_GROUPS)

    def fetch_answer(self, records: bytes, sender: str = SHARE_LEADER) -> list:
        request = self.harness.received(SHARE_LEADER, FetchRequest)[-1]
        return self.harness.deliver("member", FetchResponse(
            correlation_id=request.correlation_id, topic="orders", partition=0, high_watermark=1_000,
            records=records), sender)

    def handed(self) -> list:
        return [notice.payload for _, notice in self.harness.notified if notice.kind == "share-records"]

    def held(self) -> int:
        return sum(len(held) for held in self.member.held.values())


@pytest.mark.parametrize("ranges", [
    [(0, 1_000)],  # a thousand records for an acquire of at most 100
    [(5, 2)],  # backwards
    [(-3, 1)],  # below any log
    [(0, 4), (3, 6)],  # overlapping
], ids=["too-many", "backwards", "negative", "overlapping"])
def test_an_acquire_answer_claiming_records_not_asked_for_is_refused(ranges):
    stage = ShareStage()

    stage.acquire_answer(*ranges)

    assert stage.held() == 0
    assert stage.harness.received(SHARE_LEADER, FetchRequest) == []


def test_an_acquire_answer_for_another_partition_is_refused():
    stage = ShareStage()

    stage.acquire_answer((0, 4), partition=1)

    assert stage.held() == 0 and stage.harness.received(SHARE_LEADER, FetchRequest) == []


def test_a_share_fetch_answer_with_an_unreadable_header_is_retried_not_fatal():
    stage = ShareStage()
    stage.acquire_answer((0, 4))

    stage.fetch_answer(b"\x00" * 10)  # fewer bytes than a header

    assert stage.handed() == []
    stage.harness.advance(200)
    assert stage.harness.received(SHARE_LEADER, FetchRequest)[-1].offset == 0  # asked again


def test_a_share_fetch_answer_from_a_server_the_fetch_did_not_go_to_is_ignored():
    stage = ShareStage()
    stage.acquire_answer((0, 4))

    stage.fetch_answer(stamped(0, 5), sender=OTHER_SERVER)
    assert stage.handed() == []
    stage.fetch_answer(stamped(0, 5))
    assert len(stage.handed()) == 1


def test_a_share_assignment_naming_topics_not_subscribed_or_impossible_partitions_is_not_read():
    stage = ShareStage(partitions=[("orders", 0), ("payments", 0), ("orders", -1)])

    assert sorted(stage.member.readers) == [("orders", 0)]


def test_a_share_assignment_of_partitions_no_topic_has_makes_no_readers():
    """The same for a share member: a heartbeat answer naming orders/0..299,999 made 300,000
    readers (136 MB held); 32 MiB of such names would make about 3 million."""
    nowhere = [("orders", p) for p in range(PARTITIONS_MAX, PARTITIONS_MAX + 2_000)]
    stage = ShareStage(partitions=[("orders", 0), *nowhere])

    assert sorted(stage.member.readers) == [("orders", 0)]


def test_a_share_heartbeat_advice_of_a_millisecond_is_not_followed():
    """A heartbeat answer advising 1 ms was followed: ~1,000 heartbeats a second to the group
    coordinator every group shares. The member heartbeats at most ten times as often as its own
    setting asks (the real coordinator advises a third of the session, which is never less)."""
    stage = ShareStage()
    beat = stage.harness.take(SHARE_GROUPS, ShareGroupHeartbeatRequest)
    stage.harness.advance(1_100)
    beat = stage.harness.take(SHARE_GROUPS, ShareGroupHeartbeatRequest)[-1]
    stage.harness.deliver("member", ShareGroupHeartbeatResponse(
        correlation_id=beat.correlation_id, member_id="m1", member_secret=b"s", partitions=[("orders", 0)],
        heartbeat_interval_ms=1), SHARE_GROUPS)

    sent = 0
    for _ in range(100):  # one simulated second, answering each heartbeat at once
        stage.harness.advance(10)
        for beat in stage.harness.take(SHARE_GROUPS, ShareGroupHeartbeatRequest):
            sent += 1
            stage.harness.deliver("member", ShareGroupHeartbeatResponse(
                correlation_id=beat.correlation_id, member_id="m1", member_secret=b"s",
                partitions=[("orders", 0)], heartbeat_interval_ms=1), SHARE_GROUPS)

    configured = stage.member.settings.heartbeat_interval_ms
    assert 1 <= sent <= 1_000 // (configured // 10) + 1, f"{sent} heartbeats in a second"


def test_a_lock_deadline_past_any_visibility_timeout_is_not_believed():
    """An acquire answer with `lock_deadline_ms` 2**62 was taken as given: the member held those
    records as locked for ever, though the coordinator locks a record for the group's visibility
    timeout, and never dropped what it had not fetched in time. No deadline further away than that
    (nor than `SHARE_LOCK_CEILING_MS`, which no configuration passes) is believed."""
    stage = ShareStage()
    request = only(stage.harness.take(SHARE_GROUPS, ShareAcquireRequest), ShareAcquireRequest)
    now_ms = stage.harness.now_ns // 1_000_000
    stage.harness.deliver("member", ShareAcquireResponse(
        correlation_id=request.correlation_id, topic="orders", partition=0, lock_deadline_ms=2**62,
        acquired=[AcquiredRecords(first_offset=0, last_offset=4, delivery_count=1)]), SHARE_GROUPS)

    longest = stage.member.group_settings.visibility_timeout_ms  # what the group's locks last
    deadlines = set(stage.member.held[("orders", 0)].values())
    assert deadlines == {now_ms + longest}
    assert stage.member.readers[("orders", 0)].lock_deadline_ms == now_ms + longest
    stage.fetch_answer(stamped(0, 5))
    stage.harness.advance(10_000)
    stage.harness.deliver("member", ClientCommand(command="acknowledge", token=7, arguments={
        "acknowledgements": [["orders", 0, 0, 4, "renew", 0, "", 1]]}))
    request = only(stage.harness.take(SHARE_GROUPS, ShareAcknowledgeRequest), ShareAcknowledgeRequest)
    stage.harness.deliver("member", ShareAcknowledgeResponse(correlation_id=request.correlation_id, results=[
        ShareAcknowledgementResult(first_offset=0, last_offset=4, lock_deadline_ms=2**62)]), SHARE_GROUPS)
    renewed = set(stage.member.held[("orders", 0)].values())
    assert renewed == {now_ms + 10_000 + longest}, "renewed for the group's timeout, not for ever"
    with pytest.raises(ValueError, match="share_visibility_timeout_max_ms"):
        Limits(share_visibility_timeout_max_ms=SHARE_LOCK_CEILING_MS + 1)


def test_a_share_assignment_longer_than_any_list_of_the_protocol_does_not_decode():
    """Refused by the decoder before a list is built (the runtime drops and counts such a frame;
    the heartbeat it answered times out)."""
    many = [("orders", p % PARTITIONS_MAX) for p in range(LONG_LIST_MAX + 1)]
    answer = ShareGroupHeartbeatResponse(correlation_id=3, member_id="m1", partitions=many)

    with pytest.raises(DecodeFailure, match="length <= 100000"):
        Codec().decode(Codec().encode(answer))


def test_overlapping_batches_deliver_each_acquired_offset_once():
    records = decode_acquired("orders", 0, stamped(10, 5) + stamped(12, 5), [[10, 16, 1]], 10**12)

    assert [record.offset for record in records] == [10, 11, 12, 13, 14, 15, 16]


def test_a_batch_holding_more_records_than_its_header_claims_lends_none_of_them_other_offsets():
    forged = bytearray(stamped(10, 5))
    header = parse_header(forged)
    # Claim two records (a CRC computed over the forged header, as a lying server would).
    forged[36:40] = (2).to_bytes(4, "little")  # record_count (storage/batch.py's layout)
    forged[12:16] = compute_crc(forged, 0, parse_header(forged)).to_bytes(4, "little")
    assert header.record_count == 5

    records = decode_acquired("orders", 0, bytes(forged), [[10, 14, 1]], 10**12)

    assert records == []  # its records cannot be placed: not delivered (the locks lapse, and they come again)


def test_group_answers_and_rebalance_notices_count_only_from_the_group_coordinator():
    stage = MemberStage()
    stage.joined_alone()
    stage.harness.advance(HEARTBEAT_MS)
    beat = stage.to_groups(HeartbeatRequest)

    for forged in (HeartbeatResponse(correlation_id=beat.correlation_id, error=ErrorCode.ILLEGAL_GENERATION),
                   ErrorResponse(correlation_id=beat.correlation_id, error=ErrorCode.UNKNOWN_MEMBER_ID),
                   HeartbeatResponse(correlation_id=0, error=ErrorCode.REBALANCE_IN_PROGRESS)):
        stage.harness.deliver("c1", forged, OTHER_SERVER)

    assert stage.member.state == "stable" and stage.member.generation == 1
    assert sorted(stage.client.fetches) == [("orders", 0), ("orders", 1)]


# ---------------------------------------------------------------------------- producer ids


def idempotent_producer() -> tuple[ProducerStage, InitProducerIdRequest]:
    stage = ProducerStage(idempotent=True)
    init = only(stage.harness.take("bootstrap", InitProducerIdRequest), InitProducerIdRequest)
    return stage, init


def test_a_second_producer_id_answer_does_not_renumber_a_producer_mid_stream():
    stage, init = idempotent_producer()
    stage.harness.deliver("producer", InitProducerIdResponse(correlation_id=init.correlation_id, producer_id=900,
                                                             producer_epoch=3), "bootstrap")
    stage.send(count=2)
    stage.metadata({0: 1})
    first = only(stage.requests(), ProduceRequest)

    for stale in (InitProducerIdResponse(correlation_id=init.correlation_id, producer_id=77),
                  InitProducerIdResponse(correlation_id=init.correlation_id + 1000, producer_id=78)):
        stage.harness.deliver("producer", stale, "bootstrap")
    produce_answer(stage, first, base_offset=0, last_offset=1)
    stage.send(count=1)

    header = verify_batch(only(stage.requests(), ProduceRequest).batch)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (900, 3, 2)


@pytest.mark.parametrize("answer", [
    {"producer_id": -1},
    {"producer_id": 5, "producer_epoch": -1},
], ids=["no-id", "no-epoch"])
def test_a_success_that_gives_no_producer_id_is_not_taken_and_is_asked_again(answer):
    stage, init = idempotent_producer()
    stage.send()
    stage.metadata({0: 1})

    effects = stage.harness.deliver("producer", InitProducerIdResponse(correlation_id=init.correlation_id, **answer),
                                    "bootstrap")

    assert stage.producer.producer_id < 0 and stage.requests() == []
    assert not messages(effects, InitProducerIdRequest), "asked again at the next tick, not at once"
    stage.harness.take("bootstrap", InitProducerIdRequest)
    stage.harness.advance(2 * CHASE_INTERVAL_MS)  # the next tick, at most two intervals away
    assert stage.harness.take("bootstrap", InitProducerIdRequest)


PAST_THE_HEADER = [{"producer_id": 900, "producer_epoch": PRODUCER_EPOCH_MAX + 1},
                   {"producer_id": 2**63, "producer_epoch": 0}]
PAST_THE_HEADER_IDS = ["epoch-past-int16", "id-past-int64"]


@pytest.mark.parametrize("answer", PAST_THE_HEADER, ids=PAST_THE_HEADER_IDS)
def test_a_producer_id_the_batch_header_cannot_hold_is_not_taken_and_is_asked_again(answer):
    """A batch header holds the producer id as an int64 and its epoch as an int16. An answer
    giving an epoch of 32,768 (or an id of 2**63) was taken: every batch of the producer then
    failed INVALID_RECORD ("the batch cannot be encoded"), 3 of 3 here, for the producer's life."""
    stage, init = idempotent_producer()
    stage.send()
    stage.metadata({0: 1})

    stage.harness.deliver("producer", InitProducerIdResponse(correlation_id=init.correlation_id, **answer),
                          "bootstrap")
    stage.send()

    assert stage.producer.producer_id < 0 and stage.requests() == [] and stage.done() == []
    stage.harness.take("bootstrap", InitProducerIdRequest)
    stage.harness.advance(2 * CHASE_INTERVAL_MS)
    init = stage.harness.take("bootstrap", InitProducerIdRequest)[-1]  # asked again, by the chase
    stage.harness.deliver("producer", InitProducerIdResponse(
        correlation_id=init.correlation_id, producer_id=900, producer_epoch=3), "bootstrap")
    for request in stage.requests():
        produce_answer(stage, request, base_offset=0, last_offset=0)
    assert [error for _, _, _, error in stage.done()] == [None, None]


@pytest.mark.parametrize("answer", PAST_THE_HEADER, ids=PAST_THE_HEADER_IDS)
def test_a_new_producer_id_the_batch_header_cannot_hold_does_not_end_the_io_thread(answer):
    """A partition whose epochs are spent asks for a new producer id and renumbers its batches
    under it. Given an epoch of 32,768 (or an id of 2**63), the renumbering raised `struct.error`
    out of `handle()`: the producer's I/O thread ended, and every later send failed."""
    stage = idempotent_stage(retry_backoff_ms=50)
    stage.producer.sequences.epochs[("orders", 0)] = PRODUCER_EPOCH_MAX
    stage.send(count=2)
    stage.metadata({0: 1})
    stage.send(count=1)
    first, second = stage.requests()
    stage.answer(first, error=ErrorCode.DISK_FULL)  # a gap: the second batch is numbered again
    stage.answer(second, error=ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    stage.harness.advance(60)
    stage.metadata({0: 1})
    init = stage.harness.take("bootstrap", InitProducerIdRequest)[-1]

    stage.harness.deliver("producer", InitProducerIdResponse(correlation_id=init.correlation_id, **answer),
                          "bootstrap")

    assert stage.requests() == [] and ("orders", 0) in stage.producer.sequences.epochs_spent
    stage.harness.advance(2 * CHASE_INTERVAL_MS)
    init = stage.harness.take("bootstrap", InitProducerIdRequest)[-1]  # asked again, by the chase
    stage.harness.deliver("producer", InitProducerIdResponse(
        correlation_id=init.correlation_id, producer_id=901, producer_epoch=0), "bootstrap")
    header = verify_batch(only(stage.requests(), ProduceRequest).batch)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (901, 0, 0)


def test_acknowledgement_results_that_do_not_match_what_was_acknowledged_are_not_taken():
    stage = ShareStage()
    stage.acquire_answer((0, 4))
    stage.fetch_answer(stamped(0, 5))
    locked_until = set(stage.member.held[("orders", 0)].values())
    stage.harness.deliver("member", ClientCommand(command="acknowledge", token=7, arguments={
        "acknowledgements": [["orders", 0, 0, 4, "renew", 0, "", 1]]}))
    request = only(stage.harness.take(SHARE_GROUPS, ShareAcknowledgeRequest), ShareAcknowledgeRequest)

    stage.harness.deliver("member", ShareAcknowledgeResponse(correlation_id=request.correlation_id, results=[
        ShareAcknowledgementResult(first_offset=0, last_offset=1_000, lock_deadline_ms=5)]), SHARE_GROUPS)

    [(token, results, _)] = [notice.payload for _, notice in stage.harness.notified if notice.kind == "result"]
    assert token == 7 and [result[:4] for result in results] == [["orders", 0, 0, 4]]
    assert results[0][4] != 0  # its outcome is unknown: reported as an error
    assert set(stage.member.held[("orders", 0)].values()) == locked_until != {5}  # no deadline taken from it


def test_a_heartbeat_interval_advice_below_one_millisecond_is_not_followed():
    stage = ShareStage()
    beat = stage.harness.take(SHARE_GROUPS, ShareGroupHeartbeatRequest)
    assert beat == []
    stage.harness.advance(1_000)
    beat = only(stage.harness.take(SHARE_GROUPS, ShareGroupHeartbeatRequest), ShareGroupHeartbeatRequest)

    stage.harness.deliver("member", ShareGroupHeartbeatResponse(correlation_id=beat.correlation_id, member_id="m1",
                                                                partitions=[("orders", 0)], heartbeat_interval_ms=-5),
                          SHARE_GROUPS)

    assert stage.member.heartbeat_interval_ms > 0
    assert stage.harness.take(SHARE_GROUPS, ShareGroupHeartbeatRequest) == []  # not again at once


def test_a_leader_whose_list_offsets_and_fetch_disagree_is_not_asked_in_a_loop():
    stage = ConsumerStage(auto_offset_reset="earliest")
    request = stage.assigned_at(500)
    stage.harness.deliver("consumer", FetchResponse(correlation_id=request.correlation_id, topic="orders",
                                                    partition=0, error=ErrorCode.OFFSET_OUT_OF_RANGE), LEADER)
    stage.answer_reset(10**15)  # reset at once, to an offset the same leader then calls out of range
    request = only(stage.sent(FetchRequest), FetchRequest)

    stage.harness.deliver("consumer", FetchResponse(correlation_id=request.correlation_id, topic="orders",
                                                    partition=0, error=ErrorCode.OFFSET_OUT_OF_RANGE), LEADER)

    assert stage.sent(ListOffsetsRequest) == []  # not at once again: it would answer the same
    stage.harness.advance(200)
    stage.metadata()
    assert stage.sent(ListOffsetsRequest)


def test_an_offset_that_went_out_of_range_after_a_while_is_reset_at_once():
    stage = ConsumerStage(auto_offset_reset="earliest")
    request = stage.assigned_at(10)
    stage.harness.advance(1_000)  # retention moved on meanwhile

    stage.harness.deliver("consumer", FetchResponse(correlation_id=request.correlation_id, topic="orders",
                                                    partition=0, error=ErrorCode.OFFSET_OUT_OF_RANGE), LEADER)

    assert stage.sent(ListOffsetsRequest)


# ---------------------------------------------------------------------------- endpoints seen gone


def disconnects(harness: Harness, address: str, count: int) -> None:
    """Endpoint after endpoint is named and found gone (as metadata naming ever new ones would cause)."""
    for number in range(count):
        harness.deliver(address, PeerDisconnected(endpoint=f"tcp://127.0.0.1:{number}/gone"), b"")
        harness.now_ns += 10 * MS


def test_the_consumer_remembers_a_bounded_number_of_endpoints_it_saw_gone():
    stage = MemberStage()

    disconnects(stage.harness, "c1", 3 * UNREACHABLE_ENDPOINTS_MAX_CLIENT)

    assert len(stage.client.unreachable) <= UNREACHABLE_ENDPOINTS_MAX_CLIENT
    assert len(stage.member.unreachable) <= UNREACHABLE_ENDPOINTS_MAX_CLIENT
    assert "tcp://127.0.0.1:0/gone" not in stage.client.unreachable  # the oldest go first


def test_the_producer_and_the_share_member_remember_a_bounded_number_of_endpoints_they_saw_gone():
    producer, share = ProducerStage(), ShareStage()

    disconnects(producer.harness, "producer", 3 * UNREACHABLE_ENDPOINTS_MAX_CLIENT)
    disconnects(share.harness, "member", 3 * UNREACHABLE_ENDPOINTS_MAX_CLIENT)

    assert len(producer.producer.unreachable) <= UNREACHABLE_ENDPOINTS_MAX_CLIENT
    assert len(share.member.unreachable) <= UNREACHABLE_ENDPOINTS_MAX_CLIENT


def test_an_endpoint_seen_gone_a_moment_ago_is_still_distrusted_whatever_came_before():
    stage = ConsumerStage()
    disconnects(stage.harness, "consumer", 3 * UNREACHABLE_ENDPOINTS_MAX_CLIENT)
    stage.command("assign", partitions=[("orders", 0)])
    stage.harness.deliver("consumer", PeerDisconnected(endpoint=LEADER), b"")

    stage.metadata()  # still names the leader that just went

    assert stage.sent(ListOffsetsRequest) == []


# ---------------------------------------------------------------------------- controllers


VOTER_A, VOTER_B = "tcp://127.0.0.1:7411", "tcp://127.0.0.1:7412"


def ping_pong(harness: Harness, address: str, rounds: int = 50) -> int:
    """Each voter answers every metadata request NOT_CONTROLLER, naming the other; how many
    requests went out before the client stopped asking at once."""
    sent = 0
    for _ in range(rounds):
        asked = [(voter, request) for voter in (VOTER_A, VOTER_B) for request in harness.take(voter, MetadataRequest)]
        if not asked:
            break
        sent += len(asked)
        for voter, request in asked:
            other = VOTER_B if voter == VOTER_A else VOTER_A
            harness.deliver(address, ErrorResponse(correlation_id=request.correlation_id,
                                                   error=ErrorCode.NOT_CONTROLLER, controller_id=2,
                                                   controller_endpoint=other), voter)
    return sent


def test_voters_that_name_each_other_as_the_controller_do_not_keep_the_consumer_asking_at_once():
    harness = Harness()
    consumer = harness.add("consumer", ConsumerClient(bootstrap=f"{VOTER_A},{VOTER_B}", settings=ConsumerSettings()))
    harness.deliver("consumer", ClientCommand(command="assign", arguments={"partitions": [("orders", 0)]}, token=1))

    assert ping_pong(harness, "consumer") <= 4
    harness.advance(1_000)
    # It asks again later.
    assert harness.received(VOTER_A, MetadataRequest) + harness.received(VOTER_B, MetadataRequest)
    assert consumer.topics == {}


def test_voters_that_name_each_other_as_the_controller_do_not_keep_the_producer_asking_at_once():
    harness = Harness()
    harness.add("producer", ProducerClient(bootstrap=f"{VOTER_A},{VOTER_B}", settings=ProducerSettings()))
    harness.deliver("producer", SendBatch(batch_id=1, topic="orders", partition=0, records=[(0, b"k", b"v", None)],
                                          first_timestamp_ms=1, max_timestamp_ms=1, deadline_ns=10**12))

    assert ping_pong(harness, "producer") <= 4
    harness.advance(1_000)
    assert harness.received(VOTER_A, MetadataRequest) + harness.received(VOTER_B, MetadataRequest)


def test_voters_that_name_each_other_as_the_controller_do_not_keep_the_share_member_asking_at_once():
    harness = Harness()
    harness.add("member", ShareMember(bootstrap=f"{VOTER_A},{VOTER_B}", settings=ShareMemberSettings(group_id="g")))
    harness.deliver("member", ClientCommand(command="subscribe", arguments={"topics": ["orders"]}, token=1))

    assert ping_pong(harness, "member") <= 4
    harness.advance(1_000)
    assert harness.received(VOTER_A, MetadataRequest) + harness.received(VOTER_B, MetadataRequest)


# ---------------------------------------------------------------------------- late and repeated answers


def test_a_duplicated_fetch_answer_delivers_its_records_once():
    stage = ConsumerStage()
    request = stage.assigned_at(10)

    answer(stage, request, stamped(10, 3))
    answer(stage, request, stamped(10, 3))

    assert delivered_offsets(stage, 10) == [10, 11, 12]


def test_an_answer_to_a_produce_attempt_that_timed_out_does_not_complete_the_batch_twice():
    stage = producer_stage(request_timeout_ms=1_000)
    first = only(stage.requests(), ProduceRequest)
    stage.harness.advance(1_200)  # no answer in time: retried
    stage.metadata({0: 1})
    stage.harness.advance(200)
    retry = stage.requests()[-1]
    assert retry.correlation_id != first.correlation_id

    produce_answer(stage, first, base_offset=0, last_offset=2)  # the first attempt's, late
    produce_answer(stage, retry, base_offset=3, last_offset=5)

    assert [(batch_id, offset) for batch_id, _, offset, _ in stage.done()] == [(1, 3)]


def test_a_committed_offset_beyond_the_log_end_resets_by_the_policy_instead_of_stalling():
    stage = member_synced(consumer_assignment(("orders", 0)))
    positions = stage.to_groups(OffsetFetchRequest)
    stage.answer(OffsetFetchResponse(correlation_id=positions.correlation_id, offsets=[
        OffsetEntry(topic="orders", partition=0, offset=10)]))  # committed 10; the log is shorter
    fetch = only(stage.harness.take("tcp://127.0.0.1:6/orders/0", FetchRequest), FetchRequest)

    stage.harness.deliver("c1", FetchResponse(correlation_id=fetch.correlation_id, topic="orders", partition=0,
                                              error=ErrorCode.OFFSET_OUT_OF_RANGE), "tcp://127.0.0.1:6/orders/0")

    reset = only(stage.harness.take("tcp://127.0.0.1:6/orders/0", ListOffsetsRequest), ListOffsetsRequest)
    assert reset.timestamp_ms == -2  # the member's consumer resets to the earliest offset


@pytest.mark.parametrize("results", [
    [],  # "done", confirming nothing
    [OffsetEntry(topic="orders", partition=0, offset=99)],  # another offset
    [OffsetEntry(topic="orders", partition=1, offset=15)],  # another partition
], ids=["nothing", "other-offset", "other-partition"])
def test_a_commit_success_that_does_not_confirm_each_offset_committed_is_an_error(results):
    stage = MemberStage()
    stage.joined_alone()
    stage.command("commit", offsets=[("orders", 0, 15, "")])
    commit = stage.to_groups(OffsetCommitRequest)

    effects = stage.answer(OffsetCommitResponse(correlation_id=commit.correlation_id, offsets=results))

    [(token, _, error)] = notices(effects, "result")
    assert token == 9 and isinstance(error, RailmqError)


def test_a_negative_offset_answered_to_the_users_list_offsets_is_an_error_not_a_result():
    stage = ConsumerStage()
    stage.command("assign", partitions=[("orders", 0)])
    stage.metadata()
    stage.sent(ListOffsetsRequest)  # the assignment's own reset: left unanswered
    stage.command("list-offsets", topic="orders", partition=0, timestamp=-1)
    request = only(stage.sent(ListOffsetsRequest), ListOffsetsRequest)

    stage.harness.deliver("consumer", ListOffsetsResponse(correlation_id=request.correlation_id, topic="orders",
                                                          partition=0, offset=-7), LEADER)

    [(_, value, error)] = stage.notified("result")
    assert value is None and isinstance(error, RailmqError) and error.retriable


def test_a_share_heartbeat_success_without_a_member_id_does_not_make_the_member_stable():
    harness = Harness()
    member = harness.add("member", ShareMember(bootstrap="bootstrap", settings=ShareMemberSettings(group_id="g")))
    harness.deliver("member", ClientCommand(command="subscribe", arguments={"topics": ["orders"]}, token=1))
    asked = harness.take("bootstrap", MetadataRequest)[-1]
    harness.deliver("member", MetadataResponse(correlation_id=asked.correlation_id,
                                               group_coordinator_endpoint=SHARE_GROUPS), "bootstrap")
    beat = only(harness.take(SHARE_GROUPS, ShareGroupHeartbeatRequest), ShareGroupHeartbeatRequest)

    # The harness checks the member's invariants (never stable without a member id) after this step.
    harness.deliver("member", ShareGroupHeartbeatResponse(correlation_id=beat.correlation_id, member_id="",
                                                          partitions=[("orders", 0)]), SHARE_GROUPS)

    assert member.state != "stable" and harness.received(SHARE_GROUPS, ShareAcquireRequest) == []


# ---------------------------------------------------------------------------- the consumer's shell


@pytest.fixture
def shell_consumer():
    """A real Consumer whose I/O-thread notices the test delivers itself."""
    consumer = Consumer("tcp://127.0.0.1:9", request_timeout_ms=500, fetch_max_wait_ms=50)
    try:
        consumer.assign([("orders", 0)])
        consumer._on_notify("position", ("orders", 0, consumer._sessions[("orders", 0)], 10))
        yield consumer
    finally:
        consumer.close()


def test_records_fetched_for_a_partition_paused_meanwhile_are_returned_after_resume(shell_consumer):
    consumer = shell_consumer
    session = consumer._sessions[("orders", 0)]
    consumer._on_notify("records", ("orders", 0, session, stamped(10, 3), 100, 0))  # in flight when paused
    consumer.pause([("orders", 0)])

    assert consumer.poll(50) == []
    consumer.resume([("orders", 0)])
    # the fetch goes on from 13
    consumer._on_notify("records", ("orders", 0, session, stamped(13, 2), 100, 0))

    assert [record.offset for record in consumer.poll(200)] == [10, 11, 12, 13, 14]


def test_records_opened_before_a_pause_are_kept_for_after_it(shell_consumer):
    consumer = shell_consumer
    session = consumer._sessions[("orders", 0)]
    consumer._on_notify("records", ("orders", 0, session, stamped(10, 4), 100, 0))

    assert [record.offset for record in consumer.poll(200, max_records=1)] == [10]
    consumer.pause([("orders", 0)])
    assert consumer.poll(50) == []
    consumer.resume([("orders", 0)])

    assert [record.offset for record in consumer.poll(200)] == [11, 12, 13]


# ---------------------------------------------------------------------------- what a server says


HUGE_TEXT = "x" * 1_000_000


def test_a_leaders_huge_error_text_is_not_kept_whole_with_each_waiting_batch():
    stage = producer_stage()
    request = only(stage.requests(), ProduceRequest)

    produce_answer(stage, request, error=ErrorCode.NOT_LEADER, error_message=HUGE_TEXT)

    [pending] = [p for queue in stage.producer.waiting.values() for p in queue]
    assert len(pending.last_error) <= 2 * SERVER_TEXT_CHARS_MAX
    stage.harness.now_ns += (DELIVERY_TIMEOUT_MS + 1) * MS
    stage.harness.advance(100)
    [(_, _, _, error)] = stage.done()
    assert len(str(error)) <= 4 * SERVER_TEXT_CHARS_MAX


def test_a_leaders_huge_error_text_reaches_the_consumers_user_clipped():
    stage = ConsumerStage(auto_offset_reset="none")
    stage.command("assign", partitions=[("orders", 0)])
    stage.metadata()
    stage.command("seek", topic="orders", partition=0, offset=500, epoch=1)
    request = only(stage.sent(FetchRequest), FetchRequest)

    stage.harness.deliver(
        "consumer", FetchResponse(correlation_id=request.correlation_id, topic="orders", partition=0,
                                  error=ErrorCode.OFFSET_OUT_OF_RANGE, error_message=HUGE_TEXT), LEADER)

    errors = [error for _, _, error in stage.notified("partition-error")]
    assert any(error.code == ErrorCode.OFFSET_OUT_OF_RANGE for error in errors)
    assert all(len(str(error)) <= 2 * SERVER_TEXT_CHARS_MAX for error in errors)


def test_errors_waiting_for_the_users_next_call_are_bounded(shell_consumer):
    for number in range(5 * CLIENT_ERRORS_KEPT_MAX):
        shell_consumer._on_notify("partition-error", ("orders", 0, RailmqError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                                                                f"report {number}")))

    assert len(shell_consumer._errors) <= CLIENT_ERRORS_KEPT_MAX
    with pytest.raises(RailmqError) as raised:
        shell_consumer.poll(10)
    assert raised.value.code == ErrorCode.OFFSET_OUT_OF_RANGE


@pytest.mark.parametrize("protocol, owned", [
    ("no-such-assignor", []),  # a protocol this member never proposed
    ("range", [("orders", 7), ("orders", -3)]),  # a member claiming partitions that cannot exist
    ("cooperative-sticky", [("orders", 7), ("orders", -3), ("orders", 0)]),
], ids=["protocol", "owned", "owned-cooperative"])
def test_a_join_answer_the_leaders_assignor_cannot_use_makes_it_join_again_not_crash(protocol, owned):
    stage = MemberStage(assignor=protocol if protocol in ("range", "cooperative-sticky") else "range")
    stage.command("subscribe", topics=["orders"])
    stage.metadata()
    join = stage.to_groups(JoinGroupRequest)
    other = msgspec.msgpack.encode(Subscription(topics=["orders"], owned=owned))
    members = [GroupMember(member_id="c1-m", metadata=join.protocols[0].metadata),
               GroupMember(member_id="c2-m", metadata=other)]

    stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=1, protocol_name=protocol,
                                   leader="c1-m", member_id="c1-m", members=members))

    syncs = stage.harness.take(GROUPS, SyncGroupRequest)
    assert syncs == [] or all(sorted(p for a in sync.assignments for p in msgspec.msgpack.decode(
        a.assignment, type=ConsumerAssignment).partitions) == [("orders", 0), ("orders", 1)] for sync in syncs)
    assert syncs or stage.harness.take(GROUPS, JoinGroupRequest)


def test_a_leader_handed_back_another_assignment_than_the_one_it_computed_for_itself_joins_again():
    stage = MemberStage()
    stage.command("subscribe", topics=["orders"])
    stage.metadata()
    join = stage.to_groups(JoinGroupRequest)
    members = [GroupMember(member_id="c1-m", metadata=join.protocols[0].metadata),
               GroupMember(member_id="c2-m", metadata=join.protocols[0].metadata)]
    stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=1, protocol_name="range",
                                   leader="c1-m", member_id="c1-m", members=members))
    sync = stage.to_groups(SyncGroupRequest)
    computed = {a.member_id: msgspec.msgpack.decode(a.assignment, type=ConsumerAssignment).partitions
                for a in sync.assignments}
    assert computed["c1-m"] == [("orders", 0)] and computed["c2-m"] == [("orders", 1)]

    stage.answer(SyncGroupResponse(correlation_id=sync.correlation_id,  # c2-m's partition as well
                                   assignment=consumer_assignment(("orders", 0), ("orders", 1))))

    assert stage.member.owned == [] and stage.harness.received(GROUPS, OffsetFetchRequest) == []
    stage.harness.advance(JOIN_BACKOFF_MS)
    assert stage.to_groups(JoinGroupRequest)
