"""A running cluster: keyed round trips, typed errors, malformed frames, restarts.

Given a 3-node cluster of real actor processes, when clients produce and consume, then records
come back in per-key order with their offsets, and bad input gets typed errors without harming
anyone."""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq

from actors.errors import ErrorCode, RailmqError
from actors.messages import ErrorResponse, MetadataRequest, MetadataResponse
from railmq.admin import Admin
from railmq.consumer import Consumer
from railmq.partitioner import partition_for_key
from railmq.producer import Producer
from tests.conftest import TEST_LIMITS
from tests.helpers import consecutive_free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 20) -> list:
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        records: list = []
        deadline = time.monotonic() + timeout_s
        while len(records) < expected and time.monotonic() < deadline:
            records += consumer.poll(200)
        return records


def test_keyed_records_round_trip_in_per_key_order(cluster, admin, unique_name):
    topic = unique_name()
    admin.create_topic(topic, partitions=3, replication_factor=1)
    with Producer(cluster.bootstrap, acks=1, linger_ms=2) as producer:
        futures = [(f"k{i % 7}", i, producer.send(topic, f"{i}", key=f"k{i % 7}")) for i in range(700)]
        producer.flush(20)
        acks = [(key, i, future.result(5)) for key, i, future in futures]
    for key, _, ack in acks:
        assert ack.partition == partition_for_key(key.encode(), 3), "the key picks the partition (murmur2)"
    records = consume_all(cluster.bootstrap, topic, 3, 700)
    assert len(records) == 700
    by_key: dict[bytes, list[int]] = {}
    for record in records:
        by_key.setdefault(record.key, []).append(int(record.value))
    for key, values in by_key.items():
        assert values == sorted(values), f"key {key!r} out of order"
    acked = {(ack.partition, ack.offset): str(i) for _, i, ack in acks}
    for record in records:
        assert acked[(record.partition, record.offset)] == record.value.decode()


def test_headers_timestamps_and_null_values_survive(cluster, admin, unique_name):
    topic = unique_name()
    admin.create_topic(topic, partitions=1)
    with Producer(cluster.bootstrap) as producer:
        producer.send(topic, None, key="tombstone", headers=[("trace", b"abc")], timestamp_ms=1234).result(10)
        producer.send(topic, b"\x00\xff", timestamp_ms=5678).result(10)
    first, second = consume_all(cluster.bootstrap, topic, 1, 2)
    assert (first.key, first.value, first.headers, first.timestamp_ms) == (b"tombstone", None, [("trace", b"abc")], 1234)
    assert (second.key, second.value, second.timestamp_ms) == (None, b"\x00\xff", 5678)


def test_a_timestamp_no_batch_can_hold_is_refused_at_send_and_the_producer_goes_on(cluster, admin, unique_name):
    """`send(timestamp_ms=10**30)` was taken, and the producer's I/O thread died encoding it:
    that send and every later one on the producer were lost (Kafka refuses a negative timestamp
    at send, and a record's timestamp is an int64)."""
    topic = unique_name()
    admin.create_topic(topic, partitions=1)
    with Producer(cluster.bootstrap) as producer:
        for timestamp in (10**30, 2**63, -1):
            with pytest.raises(RailmqError) as refused:
                producer.send(topic, b"x", timestamp_ms=timestamp)
            assert refused.value.code == ErrorCode.INVALID_TIMESTAMP
            with pytest.raises(RailmqError) as refused:
                producer.send_batch(topic, [b"x"], timestamp_ms=timestamp)
            assert refused.value.code == ErrorCode.INVALID_TIMESTAMP
        producer.send(topic, b"after", timestamp_ms=2_000).result(10)
    (record,) = consume_all(cluster.bootstrap, topic, 1, 1)
    assert (record.value, record.timestamp_ms) == (b"after", 2_000)


def test_records_sent_out_of_time_order_are_all_delivered_with_their_timestamps(cluster, admin, unique_name):
    """Event times out of order, a backfill weeks old and a clock stepped back, sent without
    waiting: the producer put them in one batch, whose timestamps only go forward from its first,
    and the leader refused all six records (INVALID_RECORD), the in-order ones too."""
    topic = unique_name()
    admin.create_topic(topic, partitions=1)
    now_ms = int(time.time() * 1000)
    sent = [now_ms, now_ms - 1_000, now_ms - 40 * 24 * 3_600_000, now_ms, 0, now_ms + 5]
    with Producer(cluster.bootstrap, linger_ms=50) as producer:
        futures = [producer.send(topic, f"{index}", timestamp_ms=timestamp)
                   for index, timestamp in enumerate(sent)]
        producer.flush(10)
        assert [future.result(10).offset for future in futures] == list(range(len(sent)))
    records = consume_all(cluster.bootstrap, topic, 1, len(sent))
    assert [(record.value, record.timestamp_ms) for record in records] == [
        (f"{index}".encode(), timestamp) for index, timestamp in enumerate(sent)]


def test_records_sent_together_to_a_topic_of_small_batches_are_all_delivered(cluster, admin, unique_name):
    """A topic's `batch_bytes_max` of 4 KiB and ten records of 1,000 bytes sent without waiting:
    the producer made one 10 KB batch (its own limit is 1 MiB), and the leader refused all ten
    with MESSAGE_TOO_LARGE though each fitted."""
    topic = unique_name()
    admin.create_topic(topic, partitions=1, config={"batch_bytes_max": 4096})
    with Producer(cluster.bootstrap, linger_ms=50) as producer:
        futures = [producer.send(topic, b"v" * 1_000) for _ in range(10)]
        producer.flush(10)
        assert sorted(future.result(10).offset for future in futures) == list(range(10))
    assert len(consume_all(cluster.bootstrap, topic, 1, 10)) == 10


def test_unknown_topic_and_partition_are_typed_errors(cluster, admin, unique_name):
    with Producer(cluster.bootstrap, max_block_ms=3000) as producer:
        with pytest.raises(RailmqError) as unknown:
            producer.send(unique_name("missing"), b"x")
        assert unknown.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        topic = unique_name()
        admin.create_topic(topic, partitions=2)
        with pytest.raises(RailmqError) as bad_partition:
            producer.send(topic, b"x", partition=5)
        assert bad_partition.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(RailmqError) as described:
        admin.describe_topic(unique_name("missing"))
    assert described.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_admin_refuses_bad_topic_requests(cluster, admin, unique_name):
    topic = unique_name()
    admin.create_topic(topic, partitions=1)
    cases = [
        (dict(name=topic, partitions=1), ErrorCode.TOPIC_ALREADY_EXISTS),
        (dict(name="bad name!", partitions=1), ErrorCode.INVALID_REQUEST),
        (dict(name=unique_name(), partitions=0), ErrorCode.INVALID_PARTITIONS),
        (dict(name=unique_name(), partitions=1, replication_factor=4), ErrorCode.INVALID_REPLICATION_FACTOR),
        (dict(name=unique_name(), partitions=1, replication_factor=2, config={"min_insync_replicas": 3}),
         ErrorCode.INVALID_CONFIG),
    ]
    for arguments, code in cases:
        with pytest.raises(RailmqError) as refused:
            admin.create_topic(**arguments, wait=False)
        assert refused.value.code == code, arguments
    assert topic in admin.list_topics()


def test_the_longest_topic_name_allowed_works_and_one_longer_is_refused(cluster, admin, unique_name):
    """A replica's directory is `<topic>-<partition>-<topic id>`: with Kafka's 249 characters it
    passed the 255 bytes a file name may have, so a topic was created whose replicas could never
    start (restarted for ever, LEADER_NOT_AVAILABLE to every client)."""
    longest = TEST_LIMITS.topic_name_length_max
    name = (unique_name() + "-" + "n" * longest)[:longest]
    admin.create_topic(name, partitions=2, replication_factor=3)
    with Producer(cluster.bootstrap, acks="all") as producer:
        producer.send(name, b"far", partition=1).result(20)

    assert [record.value for record in consume_all(cluster.bootstrap, name, 2, 1)] == [b"far"]
    with pytest.raises(RailmqError) as refused:
        admin.create_topic(name + "n", partitions=1, wait=False)
    assert refused.value.code == ErrorCode.INVALID_REQUEST


def test_offsets_seek_and_list_offsets(cluster, admin, unique_name):
    topic = unique_name()
    admin.create_topic(topic, partitions=1)
    with Producer(cluster.bootstrap) as producer:
        for i in range(10):
            producer.send(topic, f"{i}", timestamp_ms=1000 + i * 100)
        producer.flush(10)
    with Consumer(cluster.bootstrap, auto_offset_reset="latest") as consumer:
        consumer.assign([(topic, 0)])
        assert consumer.position((topic, 0)) == 10
        assert consumer.beginning_offsets([(topic, 0)]) == {(topic, 0): 0}
        assert consumer.end_offsets([(topic, 0)]) == {(topic, 0): 10}
        assert consumer.offsets_for_times({(topic, 0): 1450})[(topic, 0)][0] >= 0
        consumer.seek((topic, 0), 7)
        records = []
        deadline = time.monotonic() + 10
        while len(records) < 3 and time.monotonic() < deadline:
            records += consumer.poll(200)
        assert [r.offset for r in records] == [7, 8, 9]
        consumer.seek_to_beginning()
        assert consumer.position((topic, 0)) == 0
        # Offsets and timestamps are int64s: a seek to 10**30 was taken, and every fetch after it
        # failed to encode.
        for value in (-5, 2**63, 10**30):
            with pytest.raises(ValueError, match="offsets are 0 to"):
                consumer.seek((topic, 0), value)
            with pytest.raises(ValueError, match="timestamps are 0 to"):
                consumer.offsets_for_times({(topic, 0): value})
            for commit in (consumer.commit, consumer.commit_async):
                with pytest.raises(ValueError, match="offsets are 0 to"):
                    commit({(topic, 0): value})
        assert consumer.position((topic, 0)) == 0


def _raw_request(endpoint: str, frames: list[bytes], timeout_ms: int = 3000) -> list[bytes]:
    context = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    try:
        socket.send_multipart(frames)
        assert socket.poll(timeout_ms), f"{endpoint} did not answer"
        return socket.recv_multipart()
    finally:
        socket.close()


@pytest.mark.parametrize("frames, code", [
    ([b"\xc1not msgpack"], ErrorCode.MALFORMED_FRAME),
    ([msgspec.msgpack.encode([1, 2, 3])], ErrorCode.MALFORMED_FRAME),
    ([msgspec.msgpack.encode({"type": "NoSuchMessage", "correlation_id": 9})], ErrorCode.UNKNOWN_MESSAGE),
    ([msgspec.msgpack.encode({"type": "TimerFired", "name": "heartbeat"})], ErrorCode.UNKNOWN_MESSAGE),
    ([msgspec.msgpack.encode({"type": "FetchRequest", "correlation_id": 4, "topic": 5})], ErrorCode.INVALID_REQUEST),
    ([msgspec.msgpack.encode({"type": "ProduceRequest", "correlation_id": 5, "topic": "x", "partition": 0})],
     ErrorCode.INVALID_REQUEST),  # a produce request without its batch frame
    ([msgspec.msgpack.encode({"type": "ProduceRequest", "correlation_id": 6, "topic": "x", "partition": 0}),
      b"garbage batch"], None),  # decodes; the actor itself refuses it
])
def test_malformed_frames_get_typed_errors_from_every_actor(cluster, admin, unique_name, frames, code):
    topic = unique_name()
    admin.create_topic(topic, partitions=1, replication_factor=3)
    deadline = time.monotonic() + 10
    while True:
        actors = [actor for actor in cluster.actors() if actor["alive"]]
        if all(actor["endpoint"] for actor in actors) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    endpoints = [actor["endpoint"] for actor in actors]
    assert len(endpoints) >= 5 and all(endpoints)  # coordinator, group coordinator, three replicas
    for endpoint in endpoints:
        reply = msgspec.msgpack.decode(_raw_request(endpoint, frames)[0])
        if code is None:
            assert reply["error"] != 0, (endpoint, reply)
        else:
            assert reply["error"] == code, (endpoint, reply)
            assert reply["type"] == "ErrorResponse" and reply["error_message"]
        if "correlation_id" in reply and code in (ErrorCode.UNKNOWN_MESSAGE, ErrorCode.INVALID_REQUEST):
            assert reply["correlation_id"] in (-1, 4, 5, 9)
    # every actor still serves
    for endpoint in endpoints:
        stats = admin.runtime_stats(endpoint)
        assert stats.pid > 0
    assert admin.describe_topic(topic).partitions[0].leader_endpoint


def test_oversized_message_is_refused_with_a_typed_error(cluster, admin, unique_name):
    topic = unique_name()
    admin.create_topic(topic, partitions=1)
    leader = admin.describe_topic(topic).partitions[0].leader_endpoint
    header = msgspec.msgpack.encode({"type": "ProduceRequest", "correlation_id": 77, "topic": topic, "partition": 0})
    reply = msgspec.msgpack.decode(_raw_request(leader, [header, b"x" * (33 * 1024 * 1024)], timeout_ms=10_000)[0])
    assert reply["error"] == ErrorCode.MESSAGE_TOO_LARGE and reply["correlation_id"] == 77
    counters = admin.runtime_stats(leader).counters
    assert counters.get("decode_error_message_too_large", 0) >= 1


def test_restarting_the_cluster_keeps_topics_and_data(fresh_cluster, unique_name):
    port = consecutive_free_ports(2)  # the controller's and the group voter's, kept across the restart
    first = fresh_cluster(nodes=2, port=port)
    data_dir = first.data_dir
    topic = unique_name()
    with Admin(first.bootstrap) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=2)
    with Producer(first.bootstrap, acks="all") as producer:
        for i in range(50):
            producer.send(topic, f"{i}", key=f"k{i % 3}")
        producer.flush(20)
    first.stop()
    second = fresh_cluster(nodes=2, data_dir=data_dir, port=port)
    with Admin(second.bootstrap) as admin:
        assert topic in admin.list_topics()
        admin.wait_for_leaders(topic, 30)
    records = consume_all(second.bootstrap, topic, 2, 50, timeout_s=30)
    assert sorted(int(r.value) for r in records) == list(range(50))


def test_metadata_request_over_raw_zeromq_matches_the_protocol_document(cluster, admin, unique_name):
    """A client in another language speaks MessagePack maps with a "type" field (docs/protocol.md)."""
    topic = unique_name()
    admin.create_topic(topic, partitions=2)
    request = msgspec.msgpack.encode({"type": "MetadataRequest", "correlation_id": 42, "topics": [topic]})
    answer = _raw_request(cluster.controller_endpoint(), [request])[0]  # the active controller answers metadata
    reply = msgspec.msgpack.decode(answer, type=MetadataResponse | ErrorResponse)
    assert isinstance(reply, MetadataResponse) and reply.correlation_id == 42
    assert [p.partition for p in reply.topics[0].partitions] == [0, 1]
    assert MetadataRequest(correlation_id=1).topics is None


def test_send_batch_larger_than_the_buffer_waits_for_space_and_delivers_everything(cluster, admin, unique_name):
    """A sender waiting for buffer space leaves an empty batch open; the I/O thread must not send it."""
    topic = unique_name()
    admin.create_topic(topic, partitions=2)
    values = [bytes([i % 251]) * 1000 for i in range(3000)]
    with Producer(cluster.bootstrap, acks=1, linger_ms=1, batch_bytes_max=16 * 1024,
                  buffer_bytes_max=64 * 1024) as producer:
        futures = [producer.send_batch(topic, values[i:i + 500], partition=i // 500 % 2) for i in range(0, 3000, 500)]
        producer.flush(60)
        acknowledged = [metadata for future in futures for metadata in future.result(10)]
        assert producer._engine.failure is None
    assert len(acknowledged) == 3000 and len({(m.partition, m.offset) for m in acknowledged}) == 3000
    records = consume_all(cluster.bootstrap, topic, 2, 3000)
    assert sorted(r.value for r in records) == sorted(values)
