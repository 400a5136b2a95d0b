"""What a stale, buggy or hostile local client can do to a live cluster with raw ZeroMQ frames.

Every actor listens on a TCP port any local process can reach. Each story is one of the attacks
an adversarial test found (docs/security.md): the frame or request is refused with a typed error,
nothing it should not change changes, and the actor that got it keeps running.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import msgspec
import psutil
import pytest
import zmq

from actors.errors import ErrorCode, RailmqError
from actors.messages import (
    ErrorResponse, FaultControlRequest, FaultControlResponse, FetchRequest, FetchResponse, GroupProtocol,
    JoinGroupRequest, LinkFault, ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, PartitionState,
    ProduceRequest, ProduceResponse, ReplicaHeartbeatResponse, ShareAcknowledgement, ShareAcknowledgeRequest,
    ShareGroupHeartbeatRequest, TopicConfig,
)
from railmq.admin import Admin
from railmq.producer import Producer
from railmq.share_consumer import ShareConsumer
from storage.batch import CONTROL_FLAG, encode_batch, parse_header
from tests.conftest import TEST_LIMITS
from tests.helpers import closed_by_peer, idle_zmtp_connection, read_values, unfinished_message, wait_for
from tests.integration.test_share_groups import poll_until, produce, share_state
from tests.storage.test_batch_validation import forge
from transport.codec import Codec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CODEC = Codec()


class RawClient:
    """A DEALER that sends whatever frames it is given (no railmq client logic, no secret)."""

    def __init__(self, endpoint: str, codec: Codec = CODEC) -> None:
        self.codec = codec
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTING_ID, f"attacker-{uuid.uuid4().hex[:8]}".encode())
        self.socket.connect(endpoint)

    def send_frames(self, frames: list[bytes]) -> None:
        self.socket.send_multipart(frames)

    def ask(self, message, timeout_s: float = 5.0):
        self.socket.send_multipart(self.codec.encode(message))
        return self.answer(timeout_s)

    def answer(self, timeout_s: float = 5.0):
        if not self.socket.poll(int(timeout_s * 1000)):
            raise AssertionError("no answer")
        return self.codec.decode(self.socket.recv_multipart())

    def close(self) -> None:
        self.context.destroy(linger=0)


def topic_on(cluster, name: str, **config) -> object:
    """A topic whose every replica has reported (so metadata knows each one's endpoint) and whose
    leaders answer as leaders: metadata may name a leader a moment before the state that makes it
    one has reached it (the controller announces a decision once it is committed), and a request
    it refuses as NOT_LEADER would test nothing of what it checks."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=2, replication_factor=3,
                           config={"min_insync_replicas": 2, **config})
        wait_for(lambda: _all_reported(admin.describe_topic(name)), timeout_s=20, what="every replica reporting")
        for partition in range(2):
            admin.list_offsets(name, partition, -1)  # retried until the leader answers as the leader
        return wait_for(lambda: _all_reported(admin.describe_topic(name)), timeout_s=20,
                        what="every replica reporting")


def test_a_flood_of_idle_connections_costs_a_leader_a_bounded_number_and_clients_still_get_in(
        fresh_cluster, unique_name):
    """Two local processes holding ~20,000 connections that had only sent a ZeroMQ greeting took a
    leader to its open-files limit: a new producer's flush timed out, for as long as they held
    them. The leader now keeps at most `client_connections_max` connections that no cluster process
    made, closing the quietest; its followers' connections are the cluster's and stay."""
    bound = 16
    cluster = fresh_cluster(limits=msgspec.structs.replace(TEST_LIMITS, client_connections_max=bound))
    topic = unique_name()
    metadata = topic_on(cluster, topic, min_insync_replicas=3).partitions[0]
    leader = psutil.Process(actor_pid(cluster, cluster.replica_name(topic, 0, metadata.leader)))
    descriptors_before = leader.num_fds()
    flood = [idle_zmtp_connection(metadata.leader_endpoint) for _ in range(8 * bound)]
    try:
        closed = wait_for(lambda: sum(map(closed_by_peer, flood)) >= 7 * bound and leader.num_fds(), timeout_s=30,
                          what=f"the leader to close all but {bound} of {8 * bound} idle connections")
        descriptors_flooded = leader.num_fds()
        with Producer(cluster.bootstrap, acks="all", request_timeout_ms=5_000) as producer:
            for index in range(50):
                producer.send(topic, f"in-flood-{index}".encode(), partition=0)
            producer.flush(30)
        wanted = {f"in-flood-{index}".encode() for index in range(50)}
        read = read_values(cluster.bootstrap, topic, 1, wanted, timeout_s=30)
        with Admin(cluster.bootstrap) as admin:
            after = admin.describe_topic(topic).partitions[0]
    finally:
        for connection in flood:
            connection.close()

    assert closed and descriptors_flooded <= descriptors_before + bound + 4, (
        f"the leader holds {descriptors_flooded} descriptors, {descriptors_before} before the flood")
    assert read >= wanted
    assert (after.leader, sorted(after.isr)) == (metadata.leader, [1, 2, 3]), "a follower's connection was closed"
    assert leader.is_running()


def test_connections_that_never_finish_a_message_cost_a_leader_a_bounded_number_of_bytes(fresh_cluster, unique_name):
    """libzmq allocates a message's declared size at its header and holds what arrives until the
    last byte: 20 connections that each sent 60 MiB of a message and stopped took 1.2 GB of a
    leader. Past `client_inbound_bytes_max` the connections holding the most are closed."""
    cluster = fresh_cluster(nodes=1, limits=msgspec.structs.replace(TEST_LIMITS, client_inbound_bytes_max=64 << 20))
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=1)
        metadata = admin.wait_for_leaders(topic).partitions[0]
    leader = psutil.Process(actor_pid(cluster, cluster.replica_name(topic, 0, metadata.leader)))
    before = leader.memory_info().rss
    attackers = []
    try:
        for _ in range(8):
            try:
                attackers.append(unfinished_message(metadata.leader_endpoint, 60 << 20, 40 << 20))
            except OSError:  # closed while sending: the bound at work
                pass
        time.sleep(1)
        grown_mb = (leader.memory_info().rss - before) / 2**20
        closed = sum(map(closed_by_peer, attackers))
        with Producer(cluster.bootstrap, acks=1) as producer:
            producer.send(topic, b"still served", partition=0).result(10)
    finally:
        for connection in attackers:
            connection.close()

    # 8 x 40 MiB would be 320 MiB; the budget is 64 MiB, and a check comes every 200 ms.
    assert grown_mb < 160, f"the leader grew by {grown_mb:.0f} MiB"
    assert closed + (8 - len(attackers)) >= 6


def test_the_node_agents_reports_socket_is_bounded_like_an_actors(fresh_cluster, unique_name):
    """The node agent runs in the process that owns every actor of its nodes, and its reports
    socket is a port any local process reaches: connections that never finished a message
    (8 x 40 MiB) or only greeted (a hundred) were held there without bound."""
    bound = 16
    cluster = fresh_cluster(limits=msgspec.structs.replace(TEST_LIMITS, client_connections_max=bound,
                                                           client_inbound_bytes_max=64 << 20))
    agent = cluster.agent
    me = psutil.Process()
    before = me.memory_info().rss
    greeted = [idle_zmtp_connection(agent.endpoint) for _ in range(6 * bound)]
    unfinished, cut_while_sending = [], 0
    try:
        for _ in range(8):
            try:
                unfinished.append(unfinished_message(agent.endpoint, 60 << 20, 40 << 20))
            except OSError:  # closed while sending: the bound at work
                cut_while_sending += 1
        # 104 connections: at most 16 stay, and of the 320 MiB the unfinished ones hold, at most 64.
        wait_for(lambda: sum(map(closed_by_peer, greeted + unfinished)) + cut_while_sending >= 104 - bound
                 and sum(map(closed_by_peer, unfinished)) + cut_while_sending >= 7, timeout_s=10,
                 what="the agent to close all but 16 connections, and those holding the most bytes")
        # libzmq frees a closed connection's buffers in its I/O thread, after the peer sees the
        # close: what the agent holds is measured once that is done (within seconds), not while
        # the memory of connections already cut is on its way back.
        deadline = time.monotonic() + 5
        while (grown_mb := (me.memory_info().rss - before) / 2**20) >= 160 and time.monotonic() < deadline:
            time.sleep(0.1)
        topic = topic_on(cluster, unique_name())  # replicas start and report through the same socket
    finally:
        for connection in greeted + unfinished:
            connection.close()

    assert grown_mb < 160, f"the node process grew by {grown_mb:.0f} MiB"
    assert agent.counters["connections_closed_over_bytes"] >= 6
    assert all(len(partition.isr) == 3 for partition in topic.partitions)


def _all_reported(topic):
    ready = all(p.leader_endpoint and all(info.endpoint and info.alive for info in p.replica_info)
                for p in topic.partitions)
    return topic if ready else None


def actor_pid(cluster, name: str) -> int:
    return next(actor["pid"] for actor in cluster.actors() if actor["name"] == name)


def leader_end(cluster, topic: str, partition: int = 0) -> int:
    with Admin(cluster.bootstrap) as admin:
        return admin.list_offsets(topic, partition, -1).log_end_offset


def runtime_counter(endpoint: str, name: str) -> int:
    """One of the counters of the actor at `endpoint` (any client may ask for them)."""
    from actors.messages import RuntimeStatsRequest

    client = RawClient(endpoint)
    try:
        return client.ask(RuntimeStatsRequest(correlation_id=1)).counters.get(name, 0)
    finally:
        client.close()


def nested(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


# ---------------------------------------------------------------------------- one frame


def test_a_deeply_nested_1_kb_frame_kills_no_actor(cluster, unique_name):
    topic = unique_name()
    topic_on(cluster, topic)
    targets = [actor for actor in cluster.actors() if actor["alive"] and actor["endpoint"]]
    before = {actor["name"]: actor["pid"] for actor in targets}
    frame = (b"\x82" + msgspec.msgpack.encode("type") + msgspec.msgpack.encode("MetadataRequest")
             + msgspec.msgpack.encode("correlation_id") + nested(1000))
    assert len(frame) < 1100

    answers = []
    for actor in targets:
        client = RawClient(actor["endpoint"])
        try:
            client.send_frames([frame])
            answers.append(client.answer())
        finally:
            client.close()

    assert all(isinstance(a, ErrorResponse) and a.error == ErrorCode.MALFORMED_FRAME for a in answers), answers
    time.sleep(0.5)
    after = {actor["name"]: actor["pid"] for actor in cluster.actors() if actor["name"] in before}
    assert after == before, "an actor died and was restarted"


def test_a_bool_correlation_id_is_never_echoed(cluster):
    client = RawClient(cluster.controller_endpoint())
    try:
        client.send_frames([msgspec.msgpack.encode({"type": "MetadataRequest", "correlation_id": True})])
        answer = client.answer()
    finally:
        client.close()

    assert isinstance(answer, ErrorResponse) and answer.correlation_id == -1


def test_a_metadata_request_repeating_one_name_costs_the_controller_nothing(cluster, unique_name):
    """A MetadataRequest naming one topic 1,000,000 times (2 MB) took the active controller 47 s
    and 3.5 GB to answer (its quorum elected another leader meanwhile); 200,000 times took 8 s.
    Now a request naming more than `topics_max` topics is refused at once, one naming more than
    any request may carry (LONG_LIST_MAX) before its names are built, and repeats are answered
    once."""
    topic = unique_name()
    topic_on(cluster, topic)
    with Admin(cluster.bootstrap) as admin:
        leader_before = admin.metadata().controller_id
    client = RawClient(cluster.controller_endpoint())
    try:
        started = time.monotonic()
        refused = client.ask(MetadataRequest(correlation_id=7, topics=[topic] * 50_000), timeout_s=30)
        refused_s = time.monotonic() - started
        unread = client.ask(MetadataRequest(correlation_id=9, topics=[topic] * 1_000_000), timeout_s=30)
        repeated = client.ask(MetadataRequest(correlation_id=8, topics=[topic] * 10_000), timeout_s=30)
    finally:
        client.close()
    with Admin(cluster.bootstrap) as admin:
        leader_after = admin.metadata().controller_id

    assert refused.error == ErrorCode.INVALID_REQUEST and "topics_max" in refused.error_message, refused
    assert refused_s < 2.0, f"the refusal took {refused_s:.1f} s"
    assert unread.error == ErrorCode.MALFORMED_FRAME and "length <= 100000" in unread.error_message, unread
    assert [t.name for t in repeated.topics] == [topic] and repeated.error == ErrorCode.NONE
    assert leader_after == leader_before, "the active controller was deposed while it answered"


# ---------------------------------------------------------------------------- the receiver


@pytest.mark.parametrize("named", [("other", 1), ("no-such-topic", 0), (None, 99)])
def test_a_request_naming_another_partition_is_refused_by_whoever_receives_it(cluster, unique_name, named):
    topic = unique_name()
    metadata = topic_on(cluster, topic)
    leader = metadata.partitions[0].leader_endpoint
    end_before = leader_end(cluster, topic)
    name, partition = named
    batch = bytes(forge(bytes(__import__("storage.batch", fromlist=["encode_batch"]).encode_batch(
        [(0, b"k", b"v", None)], 1_000))))
    client = RawClient(leader)
    try:
        produced = client.ask(ProduceRequest(correlation_id=1, topic=name or topic, partition=partition, acks=1,
                                             batch=batch))
        listed = client.ask(ListOffsetsRequest(correlation_id=2, topic=name or topic, partition=partition,
                                               timestamp_ms=-1))
        fetched = client.ask(FetchRequest(correlation_id=3, topic=name or topic, partition=partition, offset=0,
                                          max_wait_ms=0))
    finally:
        client.close()

    assert produced.error == ErrorCode.NOT_LEADER and (produced.topic, produced.partition) == (name or topic, partition)
    assert listed.error == ErrorCode.NOT_LEADER and (listed.topic, listed.partition) == (name or topic, partition)
    assert fetched.error == ErrorCode.NOT_LEADER and not len(fetched.records)
    assert leader_end(cluster, topic) == end_before, "nothing was appended to the partition that received it"


def test_a_stale_topic_id_is_refused(cluster, unique_name):
    topic = unique_name()
    metadata = topic_on(cluster, topic)
    client = RawClient(metadata.partitions[0].leader_endpoint)
    try:
        answer = client.ask(FetchRequest(correlation_id=1, topic=topic, partition=0, topic_id=metadata.topic_id + 1,
                                         offset=0, max_wait_ms=0))
    finally:
        client.close()

    assert answer.error == ErrorCode.UNKNOWN_TOPIC_ID


# ---------------------------------------------------------------------------- batches


def honest_batch(count: int) -> bytes:
    return bytes(encode_batch([(0, f"k{i}".encode(), f"v{i}".encode(), None) for i in range(count)], 1_000))


@pytest.mark.parametrize("forged, why", [
    (lambda: forge(honest_batch(3), record_count=1), "claims 1 records"),
    (lambda: forge(honest_batch(1), record_count=50), "claims 50 records"),
    (lambda: forge(honest_batch(1), payload=msgspec.msgpack.encode("not records"), record_count=1), "payload"),
    (lambda: forge(honest_batch(2), attributes=CONTROL_FLAG), "control batch"),
], ids=["fewer-claimed", "more-claimed", "not-records", "control-attribute"])
def test_a_forged_batch_header_is_refused_and_nothing_is_appended(cluster, unique_name, forged, why):
    topic = unique_name()
    metadata = topic_on(cluster, topic)
    client = RawClient(metadata.partitions[0].leader_endpoint)
    try:
        answer = client.ask(ProduceRequest(correlation_id=1, topic=topic, partition=0, acks=1, batch=forged()))
    finally:
        client.close()

    assert answer.error == ErrorCode.INVALID_RECORD and why in answer.error_message
    assert leader_end(cluster, topic) == 0


def test_a_client_that_reads_a_producers_id_from_the_log_cannot_write_under_it(cluster, unique_name):
    """An idempotent producer's id is in every batch it stored, which any consumer reads. Before
    producer secrets, a client sent a batch of its own under that producer's next sequence numbers:
    it was stored, and the producer's own next batch failed DUPLICATE_SEQUENCE_NUMBER (earlier
    still, it was acknowledged without being stored). A batch under the id with a higher epoch
    fenced the producer. Now both are refused, nothing is stored, and the producer goes on."""
    topic = unique_name()
    metadata = topic_on(cluster, topic)
    producer = Producer(cluster.bootstrap, idempotent=True, acks=-1)
    client = RawClient(metadata.partitions[0].leader_endpoint)
    try:
        producer.send(topic, b"first", partition=0).result(timeout=20)
        read = client.ask(FetchRequest(correlation_id=1, topic=topic, partition=0, offset=0))
        stored = parse_header(read.records)
        answers = []
        next_numbers = (stored.producer_epoch, stored.base_sequence + 1)
        higher_epoch = (stored.producer_epoch + 1, 0)
        for epoch, sequence in [next_numbers, higher_epoch]:
            forged = bytes(encode_batch([(0, None, b"forged", None)], 1_000, producer_id=stored.producer_id,
                                        producer_epoch=epoch, base_sequence=sequence))
            answers.append(client.ask(ProduceRequest(correlation_id=2, topic=topic, partition=0, acks=-1,
                                                     batch=forged)))
        second = producer.send(topic, b"second", partition=0).result(timeout=20)
    finally:
        client.close()
        producer.close()

    assert [answer.error for answer in answers] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED] * 2
    assert all("producer secret" in answer.error_message for answer in answers)
    assert second.offset == 1
    assert read_values(cluster.bootstrap, topic, 2, {b"first", b"second"}, timeout_s=20) == {
        b"first", b"second"}


# ---------------------------------------------------------------------------- posing as cluster processes


def test_a_client_posing_as_a_follower_cannot_move_the_high_watermark(cluster, unique_name):
    """With both followers paused, an acks=all write must not be acknowledged because a client
    claims to be them."""
    topic = unique_name()
    metadata = topic_on(cluster, topic)
    partition = metadata.partitions[0]
    followers = [node for node in partition.replicas if node != partition.leader]
    paused = [cluster.replica_name(topic, 0, node) for node in followers]
    for name in paused:
        cluster.pause(name)
    try:
        with Producer(cluster.bootstrap, acks="all", request_timeout_ms=1500, delivery_timeout_ms=4000,
                      retry_backoff_ms=100) as producer:
            future = producer.send(topic, b"only the leader has this", partition=0)
            time.sleep(0.3)
            client = RawClient(partition.leader_endpoint)
            try:
                answers = [client.ask(FetchRequest(correlation_id=index, topic=topic, partition=0, offset=1,
                                                   replica=node, leader_epoch=partition.leader_epoch,
                                                   last_fetched_epoch=partition.leader_epoch, max_wait_ms=0))
                           for index, node in enumerate(followers, 1)]
            finally:
                client.close()
            with pytest.raises(RailmqError):
                future.result(10)
    finally:
        for name in paused:
            cluster.resume(name)

    assert all(isinstance(a, ErrorResponse) and a.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED for a in answers)


def test_members_with_megabytes_of_subscription_metadata_are_refused_by_the_group_coordinator(cluster, unique_name):
    """A 2 MiB subscription per member: without a byte bound each join was kept in memory (and in
    the leader's join answer), up to 1,000 groups of 1,000 members."""
    with Admin(cluster.bootstrap) as admin:
        endpoint = wait_for(lambda: admin.metadata().group_coordinator_endpoint, timeout_s=20,
                            what="a group coordinator in metadata")
    client = RawClient(endpoint)
    try:
        answer = client.ask(JoinGroupRequest(correlation_id=1, group_id=unique_name(), client_id="bomb",
                                             protocols=[GroupProtocol(name="range", metadata=bytes(2 * 2**20))]))
        small = client.ask(JoinGroupRequest(correlation_id=2, group_id=unique_name(), client_id="fine",
                                            protocols=[GroupProtocol(name="range", metadata=b"subscription")]))
    finally:
        client.close()

    assert answer.error == ErrorCode.LIMIT_REACHED and "group_member_bytes_max" in answer.error_message
    assert small.error == ErrorCode.NONE and small.member_id


def test_a_client_that_reads_a_share_members_id_can_neither_accept_its_records_nor_make_it_leave(
        cluster, unique_name):
    """DescribeSharePartitions names each lock's holder. Before member secrets, a client that read
    it accepted the holder's records (never handled, and never delivered again: the member's own
    commit then failed) or made the member leave."""
    topic, group = unique_name(), unique_name("g")
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic)
        endpoint = wait_for(lambda: admin.metadata().group_coordinator_endpoint, timeout_s=20,
                            what="a group coordinator in metadata")
    produce(cluster.bootstrap, topic, ["a", "b", "c"])
    with ShareConsumer(cluster.bootstrap, group, max_poll_records=3) as consumer:
        consumer.subscribe([topic])
        poll_until(consumer, 3)
        held = share_state(cluster.bootstrap, group).partitions[0].records
        client = RawClient(endpoint)
        try:
            accepted = client.ask(ShareAcknowledgeRequest(
                correlation_id=1, group_id=group, member_id=held[0].member_id, topic=topic, partition=0,
                acknowledgements=[ShareAcknowledgement(first_offset=0, last_offset=2)]))
            left = client.ask(ShareGroupHeartbeatRequest(
                correlation_id=2, group_id=group, member_id=held[0].member_id, topics=[topic], leaving=True))
        finally:
            client.close()
        committed = consumer.commit()

    assert [(each.first_offset, each.last_offset, each.state) for each in held] == [(0, 2, "acquired")]
    assert [accepted.error, left.error] == [ErrorCode.UNKNOWN_MEMBER_ID] * 2
    assert "secret" in accepted.error_message
    assert committed == {(topic, 0, offset): ErrorCode.NONE for offset in range(3)}, "still the member's"


def test_a_client_posing_as_the_coordinator_changes_no_replica(cluster, unique_name):
    topic = unique_name()
    metadata = topic_on(cluster, topic)
    partition = metadata.partitions[0]
    follower = next(node for node in partition.replicas if node != partition.leader)
    follower_name = cluster.replica_name(topic, 0, follower)
    endpoint = next(info.endpoint for info in partition.replica_info if info.node == follower)
    pid = actor_pid(cluster, follower_name)
    coup = PartitionState(topic=topic, topic_id=metadata.topic_id, partition=0, leader=follower,
                          leader_endpoint=endpoint, leader_epoch=partition.leader_epoch + 1000,
                          partition_epoch=partition.partition_epoch + 1000, replicas=list(partition.replicas),
                          isr=[follower], config=TopicConfig(min_insync_replicas=1))
    client = RawClient(endpoint)
    try:
        answers = [client.ask(ReplicaHeartbeatResponse(correlation_id=7, state=coup)),
                   client.ask(ReplicaHeartbeatResponse(correlation_id=8, deleted=True))]
    finally:
        client.close()

    assert all(a.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED for a in answers)
    time.sleep(0.5)
    assert actor_pid(cluster, follower_name) == pid, "the replica exited"
    listed = RawClient(endpoint)
    try:
        answer = listed.ask(ListOffsetsRequest(correlation_id=9, topic=topic, partition=0, timestamp_ms=-1))
    finally:
        listed.close()
    assert answer.error == ErrorCode.NOT_LEADER, "the follower did not become a second leader"


def test_the_fault_switch_obeys_only_the_chaos_harness_of_its_cluster(cluster):
    client = RawClient(cluster.controller_endpoint())
    try:
        answer = client.ask(FaultControlRequest(correlation_id=1, links=[LinkFault(peers=["*"])], disk_full=True))
        after = client.ask(MetadataRequest(correlation_id=2))
    finally:
        client.close()

    assert isinstance(answer, FaultControlResponse) and answer.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert after.error == ErrorCode.NONE, "the coordinator still answers everyone"


def test_a_fault_plan_with_an_empty_peer_prefix_is_refused_and_the_actor_stays_reachable(cluster):
    with Admin(cluster.bootstrap, secret=cluster.secret) as admin:
        with pytest.raises(RailmqError) as refused:
            admin.set_faults(cluster.bootstrap, [LinkFault(peers=[""])])
        assert admin.list_topics() is not None, "the coordinator was not cut off from everyone"

    assert refused.value.code == ErrorCode.INVALID_REQUEST and "non-empty" in str(refused.value)


def test_on_a_cluster_not_started_for_chaos_even_its_own_secret_does_not_open_the_fault_switch(fresh_cluster):
    cluster = fresh_cluster(fault_injection=False)
    with Admin(cluster.bootstrap, secret=cluster.secret) as admin:
        with pytest.raises(RailmqError) as refused:
            admin.set_faults(cluster.bootstrap, [LinkFault(peers=["*"])])

    assert refused.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED


# ---------------------------------------------------------------------------- memory


def test_a_client_that_never_reads_its_socket_costs_a_leader_a_bounded_number_of_bytes(fresh_cluster, unique_name):
    cluster = fresh_cluster()
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=1)
        metadata = admin.wait_for_leaders(topic)
    with Producer(cluster.bootstrap, acks=1, linger_ms=5) as producer:
        for _ in range(40 * 64):
            producer.send(topic, b"x" * 16_000, partition=0)
        producer.flush(60)
    leader = psutil.Process(actor_pid(cluster, cluster.replica_name(topic, 0, metadata.partitions[0].leader)))
    before = leader.memory_info().rss
    client = RawClient(metadata.partitions[0].leader_endpoint)
    client.socket.setsockopt(zmq.RCVHWM, 1)
    client.socket.setsockopt(zmq.RCVBUF, 4096)
    try:
        for index in range(60):
            client.send_frames(CODEC.encode(FetchRequest(correlation_id=index + 1, topic=topic, partition=0,
                                                         offset=0, max_bytes=32 * 1024 * 1024, max_wait_ms=0)))
        time.sleep(3)
        grown_mb = (leader.memory_info().rss - before) / 2**20
    finally:
        client.close()

    # 60 answers of 32 MiB each would be ~1.9 GiB; the per-peer budget is 64 MiB.
    assert grown_mb < 150, f"the leader grew by {grown_mb:.0f} MiB for a client that reads nothing"


def test_many_small_answers_to_clients_that_never_read_cost_a_leader_a_bounded_number_of_bytes(
        fresh_cluster, unique_name):
    """Each answer a little under what used to be tracked (64 KiB), thousands of them, on several
    connections: ZeroMQ's queue per peer counts messages, so without a byte count each connection
    held ~430 MiB of unread answers and the leader grew by gigabytes."""
    limits = msgspec.structs.replace(TEST_LIMITS, peer_outbound_bytes_max=8 * 2**20, outbound_bytes_max=32 * 2**20)
    cluster = fresh_cluster(nodes=1, limits=limits)
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=1)
        metadata = admin.wait_for_leaders(topic)
    with Producer(cluster.bootstrap, acks=1, linger_ms=0) as producer:
        for _ in range(200):
            producer.send(topic, b"x" * 15_000, partition=0)
            producer.flush(30)  # one record per batch: a fetch of 60,000 bytes answers ~45-60 KB
    endpoint = metadata.partitions[0].leader_endpoint
    leader = psutil.Process(actor_pid(cluster, cluster.replica_name(topic, 0, metadata.partitions[0].leader)))
    before = leader.memory_info().rss
    attackers: list[RawClient] = []

    def attack(count: int) -> float:
        for _ in range(count):
            client = RawClient(endpoint)
            attackers.append(client)
            client.socket.setsockopt(zmq.RCVHWM, 1)
            client.socket.setsockopt(zmq.RCVBUF, 4096)
            for index in range(3000):
                client.send_frames(CODEC.encode(FetchRequest(
                    correlation_id=index + 1, topic=topic, partition=0, offset=index % 190,
                    max_bytes=60_000, max_wait_ms=0)))
        time.sleep(3)
        return (leader.memory_info().rss - before) / 2**20

    def served() -> bool:
        reader = RawClient(endpoint)
        try:
            answer = reader.ask(FetchRequest(correlation_id=1, topic=topic, partition=0, offset=0, max_bytes=60_000))
        finally:
            reader.close()
        return answer.error == ErrorCode.NONE and bool(answer.records)

    try:
        # Three connections fill their own budgets (8 MiB each), not the leader's (32 MiB).
        grown_by_three = attack(3)
        a_reader_is_served = served()
        # Two more would take 40 MiB: the leader's budget holds.
        grown_by_five = attack(2)
        # The budget is full, and the connections that filled it are still open: the reader is
        # served, in place of those whose answers have waited unread longest.
        served_past_the_budget = served()
        closed = runtime_counter(endpoint, "connections_closed_unread_answers")
    finally:
        for client in attackers:
            client.close()

    # 15,000 answers of ~50 KB would be ~750 MB; besides the budgets, a peer that never reads holds
    # at most `router_send_queue_max` answers under 4 KiB.
    assert grown_by_three < 50, f"the leader grew by {grown_by_three:.0f} MiB for 3 clients that read nothing"
    assert grown_by_five < 60, f"the leader grew by {grown_by_five:.0f} MiB for 5 clients that read nothing"
    assert a_reader_is_served, "a client that reads was refused while the others held only their own budgets"
    assert served_past_the_budget, "clients that never read kept a reader out"
    assert closed >= 1, "the budget was never full: nothing was tested"
    assert wait_for(served, timeout_s=10, what="a reader served once the clients that never read are gone")


def test_a_client_cannot_take_over_a_followers_connection_by_guessing_its_routing_id(fresh_cluster, unique_name):
    """A ROUTER gives a routing id to the newest connection that claims it. Followers' ids were
    their name, pid and a socket counter, all of which `ps` shows any local user: a client that
    connected with them every 200 ms took the followers' connections from the leader, and a
    partition with min ISR 3 acknowledged none of 7 writes in 20 s."""
    cluster = fresh_cluster()
    topic = unique_name()
    metadata = topic_on(cluster, topic, min_insync_replicas=3).partitions[0]
    followers = [cluster.replica_name(topic, 0, node) for node in metadata.replicas if node != metadata.leader]
    guesses = [f"{name}|{actor_pid(cluster, name)}|{number}".encode() for name in followers for number in range(16)]
    context = zmq.Context()
    acknowledged = 0
    try:
        with Producer(cluster.bootstrap, acks="all", request_timeout_ms=5_000) as producer:
            for round_number in range(10):
                impostors = []
                for guess in guesses:
                    impostor = context.socket(zmq.DEALER)
                    impostor.setsockopt(zmq.LINGER, 0)
                    impostor.setsockopt(zmq.ROUTING_ID, guess)
                    impostor.connect(metadata.leader_endpoint)
                    impostors.append(impostor)
                time.sleep(0.2)
                for impostor in impostors:
                    impostor.close()
                producer.send(topic, f"round-{round_number}".encode(), partition=0).result(10)
                acknowledged += 1
    finally:
        context.destroy(linger=0)

    assert acknowledged == 10


def test_a_client_cannot_pose_as_a_voter_of_the_controller_quorum(cluster):
    """A vote request with a huge term, and an append claiming leadership, from a process without
    the cluster's secret: refused, and no voter's term or leader moves."""
    from actors.messages import ControllerStatusRequest
    from actors.raft_messages import RaftAppendRequest, RaftVoteRequest

    with Admin(cluster.bootstrap) as admin:
        before = {entry.node: (entry.term, entry.leader) for entry in admin.quorum_status()}
        target = next(entry for entry in admin.quorum_status() if entry.role == "follower")
    client = RawClient(target.endpoint)
    try:
        forged = [RaftVoteRequest(source=1, destination=target.node, term=10**9, last_log_index=10**9,
                                  last_log_term=10**9),
                  RaftAppendRequest(source=1, destination=target.node, term=10**9, prev_log_index=0,
                                    prev_log_term=0, leader_commit=0)]
        answers = [client.ask(message) for message in forged]
        status = client.ask(ControllerStatusRequest(correlation_id=5))
    finally:
        client.close()
    assert all(isinstance(a, ErrorResponse) and a.error == ErrorCode.CLUSTER_AUTHORIZATION_FAILED for a in answers)
    assert (status.term, status.leader) == before[target.node], "a forged Raft message moved a voter"


def test_a_process_with_the_clusters_secret_cannot_pose_as_a_voter_from_another_address(cluster):
    """A second process holding the cluster's secret (a cloned machine) speaking as voter N from
    an address that is not voter N's host (here 127.0.0.2; every voter of this cluster is
    127.0.0.1): its signed Raft messages are dropped and counted, and no voter's term or leader
    moves. Taken, the append would have made the follower adopt a term of 10**9 and a leader that
    is not one."""
    from actors.messages import ControllerStatusRequest, RuntimeStatsRequest
    from actors.raft_messages import RaftAppendRequest, RaftVoteRequest

    with Admin(cluster.bootstrap) as admin:
        before = {entry.node: (entry.term, entry.leader) for entry in admin.quorum_status()}
        target = next(entry for entry in admin.quorum_status() if entry.role == "follower")
    posing_as = next(node for node in before if node != target.node)
    host, _, port = target.endpoint.removeprefix("tcp://").rpartition(":")
    client = RawClient(f"tcp://127.0.0.2:0;{host}:{port}", codec=Codec(secret=cluster.secret))
    try:
        client.send_frames(client.codec.encode(RaftVoteRequest(
            source=posing_as, destination=target.node, term=10**9, last_log_index=10**9, last_log_term=10**9)))
        client.send_frames(client.codec.encode(RaftAppendRequest(
            source=posing_as, destination=target.node, term=10**9, prev_log_index=0, prev_log_term=0,
            leader_commit=0)))
        # One connection: the voter handles these after the forged ones.
        status = client.ask(ControllerStatusRequest(correlation_id=5))
        stats = client.ask(RuntimeStatsRequest(correlation_id=6))
    finally:
        client.close()
    assert (status.term, status.leader) == before[target.node], "a message from the wrong address moved a voter"
    assert stats.counters.get("rejected_wrong_address", 0) >= 2


# ---------------------------------------------------------------------------- a node started twice


def test_a_second_node_agent_for_a_running_node_starts_nothing_and_moves_no_leader(cluster, unique_name, tmp_path):
    """Node 2 started a second time (a cloned machine, `railmq node --node 2` run twice), with the
    cluster's own identity: its agent is refused with DUPLICATE_BROKER_REGISTRATION, naming the
    agent that runs the node, gets no assignments, so it runs no replica, and no leader moves."""
    from transport.node_agent import NodeAgent
    from transport.supervisor import Supervisor

    name = unique_name("twice")
    topic_on(cluster, name)
    with Admin(cluster.bootstrap) as admin:
        before = [(p.leader, p.leader_epoch, sorted(p.isr)) for p in admin.describe_topic(name).partitions]
    supervisor = Supervisor()
    second = NodeAgent(supervisor=supervisor, coordinator=cluster.bootstrap, nodes=[2], data_dir=str(tmp_path),
                       cluster_id=cluster.cluster_id, limits=cluster.limits, secret=cluster.secret,
                       shared_memory=False)
    second.start()
    try:
        refusal = wait_for(lambda: second.refused, timeout_s=10, what="the second agent refused")
        time.sleep(3 * cluster.limits.node_heartbeat_interval_ms / 1000)  # heartbeats keep being refused
        assert "node 2" in refusal and cluster.agent.agent_id in refusal
        assert second.refused and not supervisor.actors, "it started replicas"
        with Admin(cluster.bootstrap) as admin:
            after = [(p.leader, p.leader_epoch, sorted(p.isr)) for p in admin.describe_topic(name).partitions]
        assert after == before
    finally:
        second.stop()
        supervisor.stop_all()
