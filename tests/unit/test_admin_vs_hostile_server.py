"""The synchronous admin clients (railmq/admin.py, railmq/lag.py) against a stale or hostile server.

Whatever listens on a leader's port (a stale process, another local program) answers what it
likes. An answer is a claim: offsets a tool will commit for a group, or stop a redrive at, must be
the asked partition's, and an offset no log has is no answer. The test plays the controller and
the partition's leader on one ROUTER in a thread, and stops it (and closes its socket) whatever
happens.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Any, Callable

import pytest
import zmq

from actors.controller_endpoints import ENDPOINTS_MAX, named_endpoint
from actors.errors import ErrorCode, RailmqError
from actors.messages import (
    FetchRequest, FetchResponse, HeartbeatResponse, ListOffsetsRequest, ListOffsetsResponse, MetadataRequest,
    MetadataResponse, PartitionMetadata, TopicMetadata,
)
from railmq.admin import Admin
from railmq.group_admin import EARLIEST, LATEST, LOG_START_FOLLOWS_MAX, GroupAdminClient
from storage.batch import encode_batch
from transport.codec import Codec

pytestmark = pytest.mark.timeout(60)


class HostileServer:
    """The controller and the leader of orders/0, answering every ListOffsets with `offsets`."""

    def __init__(self, voters: list[str] | None = None, answer: Callable[[Any, str], Any] | None = None,
                 **offsets) -> None:
        """`answer(request, endpoint)`, when given, answers every request instead (None: no answer)."""
        self.voters = voters or []
        self.offsets = offsets
        self.answer = answer
        self.requests: list[Any] = []
        self.router = zmq.Context.instance().socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        codec = Codec()
        while not self.stopping.is_set():
            if not self.router.poll(20):
                continue
            identity, *frames = self.router.recv_multipart()
            request = codec.decode(frames)
            self.requests.append(request)
            if self.answer is not None:
                answer = self.answer(request, self.endpoint)
                if answer is not None:
                    self.router.send_multipart([identity, *codec.encode(answer)])
                continue
            if isinstance(request, MetadataRequest):
                answer = MetadataResponse(correlation_id=request.correlation_id,
                                          controller_endpoints=self.voters, topics=[TopicMetadata(
                    name="orders", topic_id=7, partitions=[PartitionMetadata(
                        partition=0, leader=1, leader_endpoint=self.endpoint)])])
            else:
                answer = ListOffsetsResponse(correlation_id=request.correlation_id, **self.offsets)
            self.router.send_multipart([identity, *codec.encode(answer)])

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.router.close(linger=0)


@pytest.fixture
def serve():
    servers: list[HostileServer] = []

    def start(voters: list[str] | None = None, answer: Callable[[Any, str], Any] | None = None,
              **offsets) -> HostileServer:
        servers.append(HostileServer(voters, answer, **offsets))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def metadata_naming(request: Any, endpoint: str, *, leader: str, coordinator: str = "",
                    voters: list[str] | None = None, name: str = "orders") -> MetadataResponse:
    return MetadataResponse(
        correlation_id=request.correlation_id, group_coordinator_endpoint=coordinator,
        controller_endpoints=voters or [], topics=[TopicMetadata(name=name, topic_id=7, partitions=[
            PartitionMetadata(partition=0, leader=1, leader_endpoint=leader)])])


CLAIMS = [
    {"topic": "payments", "partition": 0, "offset": 10**12, "high_watermark": 10**12},  # another topic
    {"topic": "orders", "partition": 3, "offset": 10**12, "high_watermark": 10**12},  # another partition
    {"topic": "orders", "partition": 0, "offset": -7, "high_watermark": -7},  # no log has it
]
CLAIM_IDS = ["another-topic", "another-partition", "negative"]


@pytest.mark.parametrize("claim", CLAIMS, ids=CLAIM_IDS)
def test_an_offset_a_group_tool_would_commit_is_not_taken_from_an_answer_about_elsewhere(serve, claim):
    """`railmq groups reset-offsets --to-latest` plans each partition's new offset from its
    leader's ListOffsets answer and commits it for the group. An answer naming another partition
    (or an offset below 0) was taken as orders/0's: the plan read 10**12 (or -7), and the group
    would have resumed there, skipping every record of orders/0. Such an answer is refused as
    NOT_LEADER, as the consumer refuses it."""
    server = serve(**claim)
    with GroupAdminClient(server.endpoint, timeout_ms=500) as client:
        for timestamp in (LATEST, EARLIEST):
            with pytest.raises(RailmqError) as refused:
                client.list_offset("orders", 0, timestamp)
            assert refused.value.code == ErrorCode.NOT_LEADER, refused.value
            with pytest.raises(RailmqError):
                client.list_offsets([("orders", 0)], timestamp)


@pytest.mark.parametrize("claim", CLAIMS, ids=CLAIM_IDS)
def test_partition_bounds_are_not_taken_from_an_answer_about_elsewhere(serve, claim):
    """`Admin.list_offsets` gives the bounds a dead-letter redrive stops at and `dlq inspect`
    reads up to: an answer about another partition was returned as orders/0's."""
    server = serve(**claim)
    with Admin(server.endpoint, timeout_ms=500) as admin:
        with pytest.raises(RailmqError) as refused:
            admin.list_offsets("orders", 0, LATEST)
    assert refused.value.code in (ErrorCode.NOT_LEADER, ErrorCode.LEADER_NOT_AVAILABLE), refused.value


def test_an_honest_answer_is_still_taken(serve):
    server = serve(topic="orders", partition=0, offset=42, high_watermark=42)
    with GroupAdminClient(server.endpoint, timeout_ms=500) as client:
        assert client.list_offset("orders", 0, LATEST) == 42
        assert client.list_offsets([("orders", 0)], LATEST) == {("orders", 0): 42}
    with Admin(server.endpoint, timeout_ms=500) as admin:
        assert admin.list_offsets("orders", 0, LATEST).offset == 42


def test_a_quorum_status_asks_no_more_voters_than_a_quorum_has(serve):
    """`railmq cluster status` asks each voter the controller names for its own view, waiting up
    to `timeout_s` for each. A process on the controller's port naming 1,000 voters that never
    answer held it for 1,000 x timeout_s (over 3 minutes at 0.2 s, 33 minutes at the default 2 s),
    with a socket to each. Only the first `ENDPOINTS_MAX` voters named are asked (as every client
    keeps, actors/controller_endpoints.py), each once."""
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # accepts, never answers
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        voters = [f"tcp://127.0.0.1:{port}"] * 3 + [f"tcp://127.0.0.{n // 250 + 2}:{n % 250 + 1}"
                                                     for n in range(1_000)]
        server = serve(voters=voters)
        with Admin(server.endpoint, timeout_ms=500) as admin:
            answers = admin.quorum_status(timeout_s=0.2)
    finally:
        silent.close(linger=0)
    # Each voter asked is listed once (answering or `unreachable`): these and no others were asked.
    assert [answer.endpoint for answer in answers] == list(dict.fromkeys(voters))[:ENDPOINTS_MAX]


# ---------------------------------------------------------------------------- endpoints named


@pytest.fixture
def listeners():
    """A ROUTER on an ipc:// path and one on an inproc:// name of the clients' context, both
    silent: a request that reached either shows the client connected where a server told it to."""
    context = zmq.Context.instance()
    directory = tempfile.mkdtemp(prefix="railmq-hostile-", dir="/tmp")
    sockets = []
    try:
        for endpoint in (f"ipc://{directory}/leader", f"inproc://railmq-hostile-{os.getpid()}"):
            socket = context.socket(zmq.ROUTER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.bind(endpoint)
            sockets.append((endpoint, socket))
        yield sockets
    finally:
        for _, socket in sockets:
            socket.close(linger=0)
        shutil.rmtree(directory, ignore_errors=True)


UNPARSABLE = ["tcp://127.0.0.1:1?0", "tcp://127.0.0.1:-1", "garbage", "udp://127.0.0.1:5",
              "tcp://" + "a" * 10_000 + ":1", "tcp://127.0.0.1:5;127.0.0.1:6", "tcp://:5"]
UNPARSABLE_IDS = ["question-mark", "negative-port", "garbage", "udp", "10-KB-host", "source-address",
                  "no-host"]


def named_endpoints(listeners) -> list[tuple[str, str]]:
    return [(bad, bad[:20]) for bad in UNPARSABLE] + [(endpoint, endpoint[:6]) for endpoint, _ in listeners]


def admin_calls(admin: Admin, groups: GroupAdminClient) -> list[Callable[[], Any]]:
    return [lambda: admin.list_offsets("orders", 0, LATEST), lambda: groups.list_offset("orders", 0, LATEST),
            lambda: groups.list_offsets([("orders", 0)], LATEST), lambda: groups.timestamp_at("orders", 0, 0),
            lambda: groups.describe_group("g")]


def test_an_endpoint_a_server_names_that_is_no_tcp_address_is_refused_not_connected(serve, listeners):
    """Leaders, the group coordinator and voters are named by answers, and an answer is a claim.
    An endpoint ZeroMQ cannot parse raised a bare `zmq.ZMQError` out of every admin call; an
    `ipc://` or `inproc://` one was connected to (a local socket the server picked). Each is now
    refused as a leader, coordinator or voter there is not, with a `RailmqError`."""
    for bad, shown in named_endpoints(listeners):
        server = serve(answer=lambda request, endpoint: metadata_naming(
            request, endpoint, leader=bad, coordinator=bad, voters=[endpoint, bad])
            if isinstance(request, MetadataRequest) else None)
        with Admin(server.endpoint, timeout_ms=300) as admin, \
                GroupAdminClient(server.endpoint, timeout_ms=300) as groups:
            for call in admin_calls(admin, groups):
                with pytest.raises(RailmqError):
                    call()
            listed = [answer.endpoint for answer in admin.quorum_status(timeout_s=0.2)]
            assert listed == [server.endpoint] + ([bad] if named_endpoint(bad) else []), shown
    for endpoint, socket in listeners:
        assert not socket.poll(0), f"a request reached {endpoint}"


# ---------------------------------------------------------------------------- topics described


def metadata_of(*topics: TopicMetadata) -> Callable[[Any, str], Any]:
    return lambda request, _: MetadataResponse(correlation_id=request.correlation_id, topics=list(topics))


def led(name: str, *numbers: int, leader: str = "tcp://127.0.0.1:9") -> TopicMetadata:
    return TopicMetadata(name=name, topic_id=7, partitions=[
        PartitionMetadata(partition=number, leader=1, leader_endpoint=leader) for number in numbers])


@pytest.mark.parametrize("topics", [
    [],  # nothing described
    [led("payments", 0, 1, 2)],  # another topic, every partition led
    [led("orders", 1, 2)],  # not partitions 0..n-1
], ids=["no-topics", "another-topic", "not-0-to-n"])
def test_a_metadata_answer_that_does_not_describe_the_asked_topic_is_not_taken_for_it(serve, topics):
    """`describe_topic` took `topics[0]` of the answer: none was an `IndexError` (a traceback out
    of `topics describe`, `wait_for_leaders`, `list_offsets`), and another topic was returned as
    the one asked for, so `create_topic` reported orders ready when payments was, and
    `list_offsets` asked payments' leader. Partitions not numbered 0..n-1 were taken as they came.
    Each is a retriable `LEADER_NOT_AVAILABLE`, as the clients take such metadata."""
    server = serve(answer=metadata_of(*topics))
    with Admin(server.endpoint, timeout_ms=300) as admin:
        with pytest.raises(RailmqError) as refused:
            admin.describe_topic("orders")
        assert refused.value.code == ErrorCode.LEADER_NOT_AVAILABLE, refused.value
        with pytest.raises(RailmqError) as waited:
            admin.wait_for_leaders("orders", timeout_s=0.3)
        assert waited.value.code == ErrorCode.LEADER_NOT_AVAILABLE, waited.value
        with pytest.raises(RailmqError):
            admin.list_offsets("orders", 0, LATEST)
    assert not any(isinstance(request, ListOffsetsRequest) for request in server.requests)


def test_the_asked_topic_is_found_among_others_and_its_partitions_put_in_order(serve):
    server = serve(answer=metadata_of(led("payments", 0), led("orders", 1, 0)))
    with Admin(server.endpoint, timeout_ms=300) as admin:
        topic = admin.describe_topic("orders")
        with pytest.raises(RailmqError) as refused:  # partitions[-1] was partition 1's leader, asked for -1
            admin.list_offsets("orders", -1, LATEST)
    assert topic.name == "orders" and [entry.partition for entry in topic.partitions] == [0, 1]
    assert refused.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, refused.value


# ---------------------------------------------------------------------------- answers of another kind


def answering_heartbeats(request: Any, endpoint: str) -> Any:
    """Metadata naming this server as leader and coordinator; a HeartbeatResponse to the rest."""
    if isinstance(request, MetadataRequest):
        return metadata_naming(request, endpoint, leader=endpoint, coordinator=endpoint, voters=[endpoint])
    return HeartbeatResponse(correlation_id=request.correlation_id)


def test_an_answer_of_another_kind_is_a_typed_error_not_an_attribute_error_or_a_success(serve):
    """`RpcClient.request` returns whatever carries the request's correlation id. A HeartbeatResponse
    to CreateTopic was an `AttributeError` (`reply.topic`), to AlterTopicConfig, DescribeGroup,
    ListGroups, OffsetDelete or OffsetCommit too, and to DeleteTopic, CreatePartitions or a fault
    switch it was taken as done; a voter's answer to ControllerStatus was listed as its status.
    Each is now a `RailmqError` that names both kinds."""
    server = serve(answer=answering_heartbeats)
    with Admin(server.endpoint, timeout_ms=300) as admin, \
            GroupAdminClient(server.endpoint, timeout_ms=300) as groups:
        calls = [
            lambda: admin.create_topic("orders", wait=False), lambda: admin.delete_topic("orders"),
            lambda: admin.create_partitions("orders", 2, wait=False),
            lambda: admin.alter_topic_config("orders", {"retention_ms": 1}),
            lambda: admin.runtime_stats(server.endpoint), lambda: admin.set_faults(server.endpoint),
            lambda: groups.list_groups(), lambda: groups.describe_group("g"),
            lambda: groups.delete_group("g"),
            lambda: groups.delete_offsets("g", [("orders", 0)]),
            lambda: groups.commit_as_admin("g", {("orders", 0): 1}),
        ]
        for call in calls:
            with pytest.raises(RailmqError) as refused:
                call()
            assert "HeartbeatResponse" in str(refused.value), refused.value
        assert [(status.endpoint, status.role) for status in admin.quorum_status(timeout_s=0.3)] == [
            (server.endpoint, "unreachable")]


def test_a_metadata_request_answered_with_another_kind_is_a_typed_error(serve):
    server = serve(answer=lambda request, _: HeartbeatResponse(correlation_id=request.correlation_id))
    with Admin(server.endpoint, timeout_ms=300) as admin:
        for call in (admin.metadata, admin.list_topics, lambda: admin.describe_topic("orders")):
            with pytest.raises(RailmqError) as refused:
                call()
            assert "HeartbeatResponse" in str(refused.value), refused.value


# ---------------------------------------------------------------------------- record timestamps


def fetches_out_of_range(log_start: Callable[[int], int], records_from: int | None = None):
    """Leader of orders/0: a fetch below `records_from` is OFFSET_OUT_OF_RANGE with the log start
    `log_start(offset)`; one at or past it gets a record stamped 1,234."""
    def answer(request: Any, endpoint: str) -> Any:
        if isinstance(request, MetadataRequest):
            return metadata_naming(request, endpoint, leader=endpoint)
        if records_from is not None and request.offset >= records_from:
            return FetchResponse(correlation_id=request.correlation_id, topic="orders", partition=0,
                                 high_watermark=request.offset + 1, log_start_offset=records_from,
                                 records=bytes(encode_batch([(0, b"k", b"v", None)], 1_234,
                                                            base_offset=request.offset)))
        return FetchResponse(correlation_id=request.correlation_id, topic="orders", partition=0,
                             error=ErrorCode.OFFSET_OUT_OF_RANGE, log_start_offset=log_start(request.offset))
    return answer


def test_a_log_start_that_moves_with_every_fetch_is_followed_a_few_times_not_to_a_recursion_error(serve):
    """`timestamp_at` reads the oldest record left when retention removed the one asked for: it
    called itself with the answer's log start. A leader answering "out of range, the log starts
    at offset + 1" to every fetch took 986 round trips and ended in a `RecursionError`. The log
    start is followed a few times (retention may move it again meanwhile), then it is a typed error."""
    server = serve(answer=fetches_out_of_range(lambda offset: offset + 1))
    with GroupAdminClient(server.endpoint, timeout_ms=2_000) as client:
        with pytest.raises(RailmqError) as refused:
            client.timestamp_at("orders", 0, 0)
    assert refused.value.code == ErrorCode.OFFSET_OUT_OF_RANGE, refused.value
    fetches = [request for request in server.requests if isinstance(request, FetchRequest)]
    assert len(fetches) <= 1 + LOG_START_FOLLOWS_MAX, len(fetches)


def test_a_log_start_past_a_removed_record_is_where_the_oldest_timestamp_is_read(serve):
    server = serve(answer=fetches_out_of_range(lambda offset: 50, records_from=50))
    with GroupAdminClient(server.endpoint, timeout_ms=2_000) as client:
        assert client.timestamp_at("orders", 0, 7) == 1_234
    assert [request.offset for request in server.requests if isinstance(request, FetchRequest)] == [7, 50]
