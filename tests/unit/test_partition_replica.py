"""A partition replica leading its partition (actors/partition_replica.py, actors/replica_leader.py).

Node 1 leads `orders/0` (replicas [1, 2, 3], leader epoch 1) over an in-memory log. The test plays
everyone else: the coordinator sends states and answers ISR changes, followers 2 and 3 send their
fetches by hand (so the test decides exactly how far each has copied), and clients produce,
fetch and list offsets. Replies to clients land in the harness outbox.
"""

from __future__ import annotations

import pytest

from actors.client_secrets import ProducerSecrets
from actors.effects import AfterFlush, Crash, Exit
from actors.errors import ErrorCode
from actors.limits import Limits
from actors.messages import (
    AlterIsrRequest, AlterIsrResponse, ErrorResponse, FetchRequest, FetchResponse, JoinGroupRequest,
    ListOffsetsRequest, ListOffsetsResponse, PartitionState, ProduceRequest, ProduceResponse,
    ReplicaHeartbeat, ReplicaHeartbeatResponse, TopicConfig,
)
from actors.partition_replica import PartitionReplica
from storage.batch import encode_batch, iter_batches
from storage.errors import LogClosed
from storage.log import LogConfig
from storage.memory import MemoryFileSystem, open_memory_log
from storage.segment import Segment
from tests.helpers import producer_secret_of
from tests.unit.actor_harness import Harness, at_once, flushed, messages, only

LEADER, COORDINATOR, CLIENT = "tcp://127.0.0.1:1/orders/0/n1", "coordinator", "client"
TOPIC_ID = 4242
LIMITS = Limits()  # lag 1500 ms, ISR check every 100 ms, heartbeat every 100 ms


def follower(node: int) -> str:
    return f"tcp://127.0.0.1:1/orders/0/n{node}"


def records(count: int, tag: str = "r", timestamp_step_ms: int = 0) -> list:
    return [(i * timestamp_step_ms, f"{tag}-key-{i}".encode(), f"{tag}-value-{i}".encode(), None)
            for i in range(count)]


def batch(count: int = 1, *, first_timestamp_ms: int = 1_000, tag: str = "r", **producer) -> bytes:
    return bytes(encode_batch(records(count, tag), first_timestamp_ms, **producer))


class Stage:
    """Node 1 leading orders/0, with the coordinator, followers and clients played by the test."""

    def __init__(self, *, isr=(1, 2, 3), min_insync_replicas: int = 2, limits: Limits = LIMITS,
                 log_config: LogConfig = LogConfig(), **config) -> None:
        self.fs = MemoryFileSystem()
        self.log = open_memory_log(log_config, now_ms=0, fs=self.fs)
        self.config = TopicConfig(min_insync_replicas=min_insync_replicas, **config)
        self.harness = Harness()
        self.replica = PartitionReplica(
            topic="orders", topic_id=TOPIC_ID, partition=0, node=1, endpoint=LEADER, coordinator=COORDINATOR,
            log=self.log, config=self.config, incarnation=101, limits=limits)
        self.harness.add(LEADER, self.replica)
        self.correlation = 100
        self.leader_epoch, self.partition_epoch = 1, 1
        self.set_state(leader=1, isr=list(isr))

    def set_state(self, *, leader: int, isr: list[int], leader_epoch: int | None = None,
                  partition_epoch: int | None = None) -> list:
        self.leader_epoch = leader_epoch if leader_epoch is not None else self.leader_epoch
        self.partition_epoch = partition_epoch if partition_epoch is not None else self.partition_epoch
        state = self.state(leader=leader, isr=isr)
        return self.harness.deliver(LEADER, ReplicaHeartbeatResponse(state=state), COORDINATOR)

    def state(self, *, leader: int, isr: list[int]) -> PartitionState:
        endpoint = LEADER if leader == 1 else (follower(leader) if leader > 0 else "")
        return PartitionState(topic="orders", topic_id=TOPIC_ID, partition=0, leader=leader,
                              leader_endpoint=endpoint, leader_epoch=self.leader_epoch,
                              partition_epoch=self.partition_epoch, replicas=[1, 2, 3], isr=list(isr),
                              config=self.config)

    def next_correlation(self) -> int:
        self.correlation += 1
        return self.correlation

    def produce(self, payload: bytes | None = None, *, acks: int = 1, timeout_ms: int = 30_000,
                count: int = 1, sender: str = CLIENT, secret: bytes | None = None) -> list:
        """`secret`: the producer secret sent (None: the one the batch's producer was handed)."""
        payload = payload if payload is not None else batch(count)
        request = ProduceRequest(correlation_id=self.next_correlation(), topic="orders", partition=0,
                                 acks=acks, timeout_ms=timeout_ms, batch=payload,
                                 producer_secret=producer_secret_of(payload) if secret is None else secret)
        return self.harness.deliver(LEADER, request, sender)

    def follower_fetch(self, node: int, offset: int | None = None, *, last_fetched_epoch: int | None = None,
                       max_wait_ms: int = 0, leader_epoch: int | None = None, incarnation: int = 0) -> list:
        """Follower `node` reports it holds everything below `offset` (default: the leader's end)."""
        request = FetchRequest(
            correlation_id=self.next_correlation(), topic="orders", partition=0,
            offset=self.log.log_end_offset if offset is None else offset, max_wait_ms=max_wait_ms,
            leader_epoch=self.leader_epoch if leader_epoch is None else leader_epoch, replica=node,
            last_fetched_epoch=self.leader_epoch if last_fetched_epoch is None else last_fetched_epoch,
            incarnation=incarnation or 200 + node)
        return self.harness.deliver(LEADER, request, follower(node))

    def catch_up(self, *nodes: int) -> None:
        for node in nodes or (2, 3):
            self.follower_fetch(node)

    def consumer_fetch(self, offset: int, *, max_wait_ms: int = 0, leader_epoch: int = -1,
                       max_bytes: int = 1 << 20, min_bytes: int = 1) -> list:
        request = FetchRequest(correlation_id=self.next_correlation(), topic="orders", partition=0,
                               offset=offset, max_wait_ms=max_wait_ms, leader_epoch=leader_epoch,
                               max_bytes=max_bytes, min_bytes=min_bytes)
        return self.harness.deliver(LEADER, request, CLIENT)

    def list_offsets(self, timestamp_ms: int, leader_epoch: int = -1) -> ListOffsetsResponse:
        request = ListOffsetsRequest(correlation_id=self.next_correlation(), topic="orders", partition=0,
                                     timestamp_ms=timestamp_ms, leader_epoch=leader_epoch)
        return only(self.harness.deliver(LEADER, request, CLIENT), ListOffsetsResponse)

    def replies(self, kind=ProduceResponse) -> list:
        return self.harness.take(CLIENT, kind)

    def alter_requests(self) -> list[AlterIsrRequest]:
        return self.harness.take(COORDINATOR, AlterIsrRequest)


def offsets_in(records_bytes) -> list[int]:
    return [offset for _, header in iter_batches(records_bytes, verify=True)
            for offset in range(header.base_offset, header.next_offset)]


def only_alter(stage: Stage) -> AlterIsrRequest:
    requests = stage.alter_requests()
    assert len(requests) == 1, f"expected one ISR change request, got {requests}"
    return requests[0]


@pytest.fixture
def stage() -> Stage:
    return Stage()


# ---------------------------------------------------------------------------- roles


def test_a_new_replica_heartbeats_and_refuses_produce_until_it_learns_its_role():
    harness = Harness()
    log = open_memory_log(LogConfig(), fs=MemoryFileSystem())
    replica = PartitionReplica(topic="orders", topic_id=TOPIC_ID, partition=0, node=1, endpoint=LEADER,
                               coordinator=COORDINATOR, log=log, config=TopicConfig(), incarnation=7)
    harness.add(LEADER, replica)

    beat = only(harness.received(COORDINATOR), ReplicaHeartbeat)
    request = ProduceRequest(correlation_id=1, topic="orders", partition=0, batch=batch())
    effects = harness.deliver(LEADER, request)

    assert (beat.node, beat.incarnation, beat.endpoint, beat.leader_epoch) == (1, 7, LEADER, -1)
    assert only(effects, ProduceResponse).error == ErrorCode.NOT_LEADER
    assert log.log_end_offset == 0


def test_the_leader_records_its_epoch_at_the_log_end_when_it_takes_over(stage):
    assert stage.replica.role == "leader"
    assert stage.log.epoch_entries() == [(1, 0)]


def test_an_older_state_is_ignored(stage):
    stage.set_state(leader=1, isr=[1, 2, 3], leader_epoch=3, partition_epoch=5)

    stage.set_state(leader=2, isr=[1, 2, 3], leader_epoch=2, partition_epoch=9)

    assert stage.replica.role == "leader"
    assert stage.replica.state.leader_epoch == 3


def test_a_deleted_topic_stops_the_replica_for_good(stage):
    effects = stage.harness.deliver(LEADER, ReplicaHeartbeatResponse(deleted=True), COORDINATOR)

    assert any(isinstance(effect, Exit) for effect in effects)
    assert stage.replica.role == "stopped"
    assert LEADER not in stage.harness.actors
    with pytest.raises(LogClosed):  # the graceful stop closed the log
        stage.log.read(0, 1)


def test_an_unknown_message_from_a_peer_gets_a_typed_error(stage):
    request = JoinGroupRequest(correlation_id=5, group_id="g")

    response = only(stage.harness.deliver(LEADER, request, b"peer-routing-id"), ErrorResponse)

    assert (response.correlation_id, response.error) == (5, ErrorCode.UNKNOWN_MESSAGE)


# ---------------------------------------------------------------------------- produce


def test_acks_1_is_answered_once_the_leader_has_appended(stage):
    effects = stage.produce(count=3, acks=1)

    response = only(effects, ProduceResponse)
    assert (response.error, response.base_offset, response.last_offset, response.leader_epoch) == (0, 0, 2, 1)
    assert stage.log.log_end_offset == 3
    assert stage.replica.high_watermark == 0


def test_acks_0_appends_and_never_answers(stage):
    effects = stage.produce(count=2, acks=0)

    assert messages(effects) == []
    assert stage.log.log_end_offset == 2


def test_acks_0_refusals_are_not_answered_either(stage):
    effects = stage.produce(b"not a batch", acks=0)

    assert messages(effects) == []
    assert stage.log.log_end_offset == 0


def test_acks_all_waits_until_every_isr_member_has_fetched_past_the_batch(stage):
    stage.produce(count=2, acks=-1)
    assert stage.replies() == []

    stage.follower_fetch(2)
    assert stage.replies() == [], "answered before follower 3 had the batch"
    assert stage.replica.high_watermark == 0

    stage.follower_fetch(3)
    response = only(stage.harness.steps[-1].effects, ProduceResponse)
    assert (response.error, response.base_offset, response.last_offset) == (0, 0, 1)
    assert stage.replica.high_watermark == 2


def test_the_high_watermark_is_the_slowest_isr_members_position(stage):
    stage.produce(count=5, acks=1)
    stage.follower_fetch(2, 5)
    stage.follower_fetch(3, 2)

    assert stage.replica.high_watermark == 2


def test_acks_all_is_refused_without_appending_when_the_isr_is_below_min_insync():
    stage = Stage(isr=[1], min_insync_replicas=2)

    refused = only(stage.produce(acks=-1), ProduceResponse)
    accepted = only(stage.produce(acks=1), ProduceResponse)

    assert refused.error == ErrorCode.NOT_ENOUGH_REPLICAS
    assert accepted.error == ErrorCode.NONE and accepted.base_offset == 0
    assert stage.log.log_end_offset == 1


def test_an_acks_all_request_not_replicated_in_time_times_out(stage):
    stage.produce(acks=-1, timeout_ms=300)

    stage.harness.advance(299)
    assert stage.replies() == []
    stage.harness.advance(1)

    response = only(stage.replies(), ProduceResponse)
    assert response.error == ErrorCode.REQUEST_TIMED_OUT
    assert response.base_offset == 0


def test_acks_all_written_before_the_isr_shrank_below_min_insync_gets_not_enough_replicas_after_append(stage):
    stage.produce(acks=-1)

    stage.set_state(leader=1, isr=[1], partition_epoch=2)

    response = only(stage.replies(), ProduceResponse)
    assert response.error == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    assert response.base_offset == 0


def test_a_batch_whose_crc_does_not_match_is_refused_as_corrupt(stage):
    damaged = bytearray(batch(2))
    damaged[-1] ^= 0xFF

    response = only(stage.produce(bytes(damaged)), ProduceResponse)

    assert response.error == ErrorCode.CORRUPT_MESSAGE
    assert stage.log.log_end_offset == 0


@pytest.mark.parametrize("payload", [b"", b"short", batch() + b"trailing bytes"])
def test_malformed_batches_are_refused_as_corrupt(stage, payload):
    assert only(stage.produce(payload), ProduceResponse).error == ErrorCode.CORRUPT_MESSAGE
    assert stage.log.log_end_offset == 0


def test_a_batch_over_the_topics_limit_is_refused_as_too_large():
    stage = Stage(batch_bytes_max=200)

    response = only(stage.produce(batch(20)), ProduceResponse)

    assert response.error == ErrorCode.MESSAGE_TOO_LARGE
    assert stage.log.log_end_offset == 0


@pytest.mark.parametrize("acks", [2, -2])
def test_acks_outside_0_1_all_is_an_invalid_request(stage, acks):
    assert only(stage.produce(acks=acks), ProduceResponse).error == ErrorCode.INVALID_REQUEST
    assert stage.log.log_end_offset == 0


def test_too_many_waiting_acks_all_requests_are_refused_as_busy():
    stage = Stage(limits=Limits(purgatory_produce_max=2))
    stage.produce(acks=-1)
    stage.produce(acks=-1)

    response = only(stage.produce(acks=-1), ProduceResponse)

    assert response.error == ErrorCode.BUSY
    assert stage.log.log_end_offset == 2


def test_a_follower_refuses_produce_and_names_the_leader(stage):
    stage.set_state(leader=2, isr=[1, 2, 3], leader_epoch=2, partition_epoch=2)

    response = only(stage.produce(), ProduceResponse)

    assert response.error == ErrorCode.NOT_LEADER
    assert "node 2" in response.error_message


# ---------------------------------------------------------------------------- idempotence


def idempotent(count: int, sequence: int, *, producer_id: int = 77, producer_epoch: int = 0,
               tag: str = "r") -> bytes:
    return batch(count, tag=tag, producer_id=producer_id, producer_epoch=producer_epoch,
                 base_sequence=sequence)


def reopened_as_leader(stage: Stage) -> Harness:
    """A new process of the replica over the stage's log, leading in the next epoch."""
    reopened = PartitionReplica(topic="orders", topic_id=TOPIC_ID, partition=0, node=1, endpoint=LEADER,
                                coordinator=COORDINATOR, log=stage.log, config=stage.config, incarnation=102)
    harness = Harness()
    harness.add(LEADER, reopened)
    stage.leader_epoch += 1
    harness.deliver(LEADER, ReplicaHeartbeatResponse(state=stage.state(leader=1, isr=[1, 2, 3])), COORDINATOR)
    return harness


def test_a_batch_naming_a_producer_id_without_that_producers_secret_is_refused_and_nothing_is_stored(stage):
    """Every batch an idempotent producer stored names its id, which any consumer reads. Before
    producer secrets, a client that read it wrote under it: it took the producer's next sequence
    numbers (the producer's own batch then failed) or fenced the producer with a higher epoch."""
    stage.produce(idempotent(2, 0))
    end = stage.log.log_end_offset

    answers = [only(stage.produce(forged, secret=secret), ProduceResponse) for forged, secret in [
        (idempotent(1, 2, tag="next numbers"), b""),
        (idempotent(1, 0, producer_epoch=1, tag="higher epoch"), b""),
        (idempotent(1, 2, tag="another's secret"), ProducerSecrets().of(78)),
    ]]
    mine = only(stage.produce(idempotent(1, 2)), ProduceResponse)

    assert [answer.error for answer in answers] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED] * 3
    assert all("producer secret" in answer.error_message for answer in answers)
    assert (mine.error, mine.base_offset) == (ErrorCode.NONE, end), "its own numbers and epoch were left"
    assert stage.log.log_end_offset == end + 1


def test_a_retried_idempotent_batch_is_answered_with_its_original_offsets_and_not_rewritten(stage):
    stage.produce(batch(2))
    first = only(stage.produce(idempotent(3, 0)), ProduceResponse)
    end = stage.log.log_end_offset

    again = only(stage.produce(idempotent(3, 0)), ProduceResponse)

    assert (again.error, again.base_offset, again.last_offset) == (0, first.base_offset, first.last_offset)
    assert (first.base_offset, first.last_offset) == (2, 4)
    assert stage.log.log_end_offset == end


def test_a_retried_acks_all_duplicate_waits_for_replication_like_the_original(stage):
    stage.produce(idempotent(1, 0), acks=-1)
    stage.produce(idempotent(1, 0), acks=-1)
    assert stage.replies() == []

    stage.catch_up()

    replies = stage.replies()
    assert [(r.error, r.base_offset) for r in replies] == [(0, 0), (0, 0)]
    assert stage.log.log_end_offset == 1


def test_a_batch_under_a_stored_batchs_numbers_but_with_other_records_is_refused_not_acknowledged(stage):
    """Producer id, epoch and sequence numbers are the header's claim: a client that read a
    producer's id from the log can send a batch of its own under that producer's next numbers. The
    producer's own batch under the same numbers is then not a retry of it, and an answer with the
    stored batch's offsets would acknowledge records that are not in the log."""
    stage.produce(idempotent(2, 0, tag="mine"))
    stage.produce(idempotent(2, 2, tag="forged"))
    end = stage.log.log_end_offset

    response = only(stage.produce(idempotent(2, 2, tag="mine")), ProduceResponse)

    assert response.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    assert "other records" in response.error_message
    assert stage.log.log_end_offset == end
    retry = only(stage.produce(idempotent(2, 2, tag="forged")), ProduceResponse)
    assert (retry.error, retry.base_offset) == (0, 2), "a true retry is still answered with its offsets"


def test_a_new_replica_tells_a_retry_from_another_batch_under_the_same_numbers():
    stage = Stage()
    stage.produce(idempotent(2, 0, tag="forged"))
    harness = reopened_as_leader(stage)

    mine = idempotent(2, 0, tag="mine")
    request = ProduceRequest(correlation_id=1, topic="orders", partition=0, batch=mine,
                             producer_secret=producer_secret_of(mine))
    response = only(harness.deliver(LEADER, request), ProduceResponse)

    assert response.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    assert stage.log.log_end_offset == 2


def test_an_unknown_producers_first_batch_must_start_at_sequence_0(stage):
    """A producer the leader has no state for starts at sequence 0. Its batches 0-26 refused
    NOT_ENOUGH_REPLICAS, the next one (27-35) came when the ISR was back and was taken as a new
    producer's first: the earlier ones could never be appended after it (the simulator, seed 5056
    of the dense sweep). A producer the leader forgot (retention, or more producers than it keeps)
    is told UNKNOWN_PRODUCER_ID too, and starts its numbering again."""
    refused = only(stage.produce(idempotent(2, 27)), ProduceResponse)
    first = only(stage.produce(idempotent(2, 0)), ProduceResponse)

    assert refused.error == ErrorCode.UNKNOWN_PRODUCER_ID and "sequence 0" in refused.error_message
    assert (first.error, first.base_offset) == (0, 0)
    assert stage.log.log_end_offset == 2


def test_an_idempotent_batch_with_a_gap_in_its_sequence_is_refused(stage):
    stage.produce(idempotent(2, 0))

    response = only(stage.produce(idempotent(1, 5)), ProduceResponse)

    assert response.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert stage.log.log_end_offset == 2


def test_an_older_producer_epoch_is_fenced(stage):
    stage.produce(idempotent(1, 0, producer_epoch=3))

    response = only(stage.produce(idempotent(1, 1, producer_epoch=2)), ProduceResponse)

    assert response.error == ErrorCode.INVALID_PRODUCER_EPOCH


def test_producer_state_is_rebuilt_from_the_log_so_a_new_replica_recognises_retries():
    stage = Stage()
    first = only(stage.produce(idempotent(2, 0)), ProduceResponse)
    harness = reopened_as_leader(stage)

    request = ProduceRequest(correlation_id=1, topic="orders", partition=0, batch=idempotent(2, 0),
                             producer_secret=producer_secret_of(idempotent(2, 0)))
    again = only(harness.deliver(LEADER, request), ProduceResponse)

    assert (again.base_offset, again.last_offset) == (first.base_offset, first.last_offset)
    assert stage.log.log_end_offset == 2


def test_a_batch_stamped_far_in_the_future_is_refused_so_it_cannot_hold_time_retention_back(stage):
    """Time retention deletes the oldest segment once its newest record is older than retention_ms:
    one record stamped in the year 2100 would keep that segment, and every later one, forever."""
    year_2100_ms = 4_102_444_800_000
    refused = only(stage.produce(batch(first_timestamp_ms=year_2100_ms)), ProduceResponse)
    skewed = only(stage.produce(batch(first_timestamp_ms=LIMITS.record_timestamp_future_max_ms - 1)), ProduceResponse)

    assert refused.error == ErrorCode.INVALID_TIMESTAMP and "future" in refused.error_message
    assert skewed.error == ErrorCode.NONE, "a producer's clock a little ahead of the leader's is fine"
    assert stage.log.log_end_offset == 1


# ---------------------------------------------------------------------------- consumer fetch


def test_consumers_see_only_offsets_below_the_high_watermark(stage):
    stage.produce(count=3)
    stage.produce(count=2)

    before = only(stage.consumer_fetch(0), FetchResponse)
    stage.follower_fetch(2, 3)
    stage.follower_fetch(3, 3)
    partly = only(stage.consumer_fetch(0), FetchResponse)

    assert before.error == ErrorCode.NONE and len(before.records) == 0
    assert (partly.high_watermark, partly.log_end_offset) == (3, 5)
    assert offsets_in(partly.records) == [0, 1, 2]


def test_followers_read_past_the_high_watermark(stage):
    stage.produce(count=3)

    response = only(stage.follower_fetch(2, 0), FetchResponse)

    assert offsets_in(response.records) == [0, 1, 2]
    assert response.high_watermark == 0


def test_a_consumer_long_poll_parks_and_wakes_when_the_high_watermark_passes_it(stage):
    effects = stage.consumer_fetch(0, max_wait_ms=5_000)
    assert messages(effects, FetchResponse) == []
    stage.produce(count=2)
    assert stage.replies(FetchResponse) == [], "woken before the records were committed"

    stage.catch_up()

    woken = only(stage.replies(FetchResponse), FetchResponse)
    assert offsets_in(woken.records) == [0, 1]
    assert woken.high_watermark == 2


def test_a_parked_fetch_with_nothing_new_is_answered_empty_when_its_wait_ends(stage):
    stage.consumer_fetch(0, max_wait_ms=400)

    stage.harness.advance(399)
    assert stage.replies(FetchResponse) == []
    stage.harness.advance(1)

    response = only(stage.replies(FetchResponse), FetchResponse)
    assert response.error == ErrorCode.NONE and len(response.records) == 0


def test_a_fetch_with_min_bytes_waits_until_that_many_bytes_are_committed(stage):
    one_batch = len(batch())
    stage.produce()
    stage.catch_up()

    effects = stage.consumer_fetch(0, max_wait_ms=5_000, min_bytes=2 * one_batch + 1)
    assert messages(effects, FetchResponse) == [], "one batch is not enough"
    stage.produce()
    stage.catch_up()
    assert stage.replies(FetchResponse) == [], "two batches are still one byte short"
    stage.produce()
    stage.catch_up()

    woken = only(stage.replies(FetchResponse), FetchResponse)
    assert offsets_in(woken.records) == [0, 1, 2]


def test_a_fetch_with_min_bytes_gets_what_there_is_when_its_wait_ends(stage):
    stage.produce()
    stage.catch_up()
    stage.consumer_fetch(0, max_wait_ms=300, min_bytes=1 << 20)

    stage.harness.advance(299)
    assert stage.replies(FetchResponse) == []
    stage.harness.advance(1)

    assert offsets_in(only(stage.replies(FetchResponse), FetchResponse).records) == [0]


def test_a_fetch_asking_for_more_bytes_than_any_answer_holds_costs_a_bounded_walk(stage):
    """Whether a fetch with `min_bytes` could be answered was judged by walking the batch headers
    from its offset until that many bytes were counted: `min_bytes=2**62` at offset 0 walked the
    whole log (0.15 s for 100,000 small batches) on arrival, and again for each such fetch parked
    at every append. A fetch is ready once what one answer may carry is there, and the walk stops
    after `fetch_ready_batches_max` batches."""
    for _ in range(600):
        stage.produce()
    stage.catch_up()
    walked = []
    iter_headers = stage.log.iter_headers

    def counting(offset):
        for header in iter_headers(offset):
            walked.append(header.base_offset)
            yield header

    stage.log.iter_headers = counting

    stage.consumer_fetch(0, max_wait_ms=30_000, min_bytes=2**62)
    behind = stage.replies(FetchResponse)
    for _ in range(20):
        stage.consumer_fetch(600, max_wait_ms=30_000, min_bytes=2**62)
    stage.produce()
    stage.catch_up()

    assert offsets_in(only(behind, FetchResponse).records)[0] == 0
    assert stage.replies(FetchResponse) == [], "fetches at the end wait for more than one new batch"
    assert len(walked) <= LIMITS.fetch_ready_batches_max + 20, f"{len(walked)} headers walked"


def headers_read_by_one_commit(stage: Stage, monkeypatch, parked: int) -> int:
    """Headers the leader reads for one batch committed (its append and both followers' fetches)
    while `parked` consumer fetches wait at the high watermark for more than any answer holds."""
    for _ in range(parked):
        stage.consumer_fetch(stage.replica.high_watermark, max_wait_ms=30_000, min_bytes=2**62)
    stage.produce()
    stage.catch_up()  # each parked fetch now has one new batch to count
    read = []
    batches_from = Segment.batches_from

    def counting(segment, position):
        for found in batches_from(segment, position):
            read.append(found)
            yield found

    monkeypatch.setattr(Segment, "batches_from", counting)
    stage.produce()
    stage.catch_up()
    monkeypatch.setattr(Segment, "batches_from", batches_from)
    assert len(stage.replica.parked) == parked, "the fetches still wait for their bytes"
    return len(read)


def test_fetches_waiting_for_min_bytes_cost_an_append_one_walk_not_one_each(monkeypatch):
    """Every append and every follower fetch asked each parked fetch whether its `min_bytes` were
    there, each walking the batch headers from its own offset (from the index entry below it, up to
    `fetch_ready_batches_max` batches): 10,000 fetches parked at the high watermark with
    `min_bytes=2**62` (the purgatory's bound) made each batch committed read 0.2-1.4 million
    headers, 2-2.5 s of the leader per append. One walk of the headers serves every parked fetch."""
    few, many = Stage(), Stage()
    for stage in (few, many):
        for _ in range(300):
            stage.produce()
        stage.catch_up()

    with_few = headers_read_by_one_commit(few, monkeypatch, parked=2)
    with_many = headers_read_by_one_commit(many, monkeypatch, parked=200)

    assert with_many <= with_few + 10, f"{with_many} headers read with 200 parked fetches, {with_few} with 2"


def test_a_list_offsets_long_poll_and_a_fetch_counting_bytes_wait_and_wake_together(stage):
    stage.produce()
    stage.catch_up()
    stage.consumer_fetch(0, max_wait_ms=30_000, min_bytes=2 * len(batch()))
    poll = ListOffsetsRequest(correlation_id=stage.next_correlation(), topic="orders", partition=0,
                              timestamp_ms=-1, max_wait_ms=30_000, wait_past_offset=1)
    stage.harness.deliver(LEADER, poll, CLIENT)
    assert stage.replies(FetchResponse) == [] and stage.replies(ListOffsetsResponse) == []

    stage.produce()
    stage.catch_up()

    assert offsets_in(only(stage.replies(FetchResponse), FetchResponse).records) == [0, 1]
    assert only(stage.replies(ListOffsetsResponse), ListOffsetsResponse).offset == 2


def test_a_negative_min_bytes_is_an_invalid_request(stage):
    response = only(stage.consumer_fetch(0, min_bytes=-1), FetchResponse)
    assert response.error == ErrorCode.INVALID_REQUEST


def test_a_parked_follower_fetch_wakes_when_the_log_grows(stage):
    stage.follower_fetch(2, max_wait_ms=1_000)

    stage.produce(count=1)

    woken = only(stage.harness.received(follower(2), FetchResponse), FetchResponse)
    assert offsets_in(woken.records) == [0]


def test_too_many_parked_fetches_are_refused_as_busy():
    stage = Stage(limits=Limits(purgatory_fetch_max=1))
    stage.consumer_fetch(0, max_wait_ms=1_000)

    response = only(stage.consumer_fetch(0, max_wait_ms=1_000), FetchResponse)

    assert response.error == ErrorCode.BUSY


def test_clients_filling_the_purgatory_do_not_stop_a_follower_parking():
    """A hostile or merely numerous set of consumers can fill the purgatory; replication must not
    degrade to polling for it: a follower's fetch has a seat of its own."""
    stage = Stage(limits=Limits(purgatory_fetch_max=2))
    stage.consumer_fetch(0, max_wait_ms=1_000)
    stage.consumer_fetch(0, max_wait_ms=1_000)
    assert only(stage.consumer_fetch(0, max_wait_ms=1_000), FetchResponse).error == ErrorCode.BUSY

    stage.follower_fetch(2, max_wait_ms=1_000)
    assert stage.harness.received(follower(2), FetchResponse) == []  # parked, not refused
    stage.produce(count=1)

    woken = only(stage.harness.received(follower(2), FetchResponse), FetchResponse)
    assert woken.error == ErrorCode.NONE
    assert offsets_in(woken.records) == [0]


def test_a_followers_new_fetch_takes_the_seat_of_its_older_parked_one():
    """A follower waits on one fetch at a time; one that gave up and asked again (or a duplicate)
    replaces the older, so a follower never holds more than one seat however often it asks."""
    stage = Stage(limits=Limits(purgatory_fetch_max=1))
    for _ in range(5):
        stage.follower_fetch(2, max_wait_ms=1_000)
        stage.follower_fetch(3, max_wait_ms=1_000)

    assert sorted(parked.replica for parked in stage.replica.parked) == [2, 3]
    stage.consumer_fetch(0, max_wait_ms=1_000)
    assert len(stage.replica.parked) == 3
    stage.replica.invariants()


@pytest.mark.parametrize("epoch, code", [(0, ErrorCode.FENCED_LEADER_EPOCH),
                                         (2, ErrorCode.UNKNOWN_LEADER_EPOCH)])
def test_a_fetch_naming_another_leader_epoch_is_refused(stage, epoch, code):
    stage.produce()
    stage.catch_up()

    response = only(stage.consumer_fetch(0, leader_epoch=epoch), FetchResponse)

    assert response.error == code
    assert len(response.records) == 0


def test_a_fetch_with_the_current_epoch_or_none_is_served(stage):
    stage.produce()
    stage.catch_up()

    assert offsets_in(only(stage.consumer_fetch(0, leader_epoch=1), FetchResponse).records) == [0]
    assert offsets_in(only(stage.consumer_fetch(0, leader_epoch=-1), FetchResponse).records) == [0]


@pytest.mark.parametrize("epoch, code", [(0, ErrorCode.FENCED_LEADER_EPOCH),
                                         (2, ErrorCode.UNKNOWN_LEADER_EPOCH),
                                         (1, ErrorCode.NONE), (-1, ErrorCode.NONE)])
def test_list_offsets_is_fenced_by_the_leader_epoch_like_a_fetch(stage, epoch, code):
    stage.produce(count=3)
    stage.catch_up()

    response = stage.list_offsets(-1, leader_epoch=epoch)  # latest

    assert response.error == code
    assert response.offset == (3 if code == ErrorCode.NONE else -1)


@pytest.mark.parametrize("asked, found", [(999, (0, 1_000)), (1_000, (0, 1_000)), (1_150, (2, 1_200)),
                                          (1_200, (2, 1_200)), (1_401, (5, 1_500)), (2_500, (10, 2_500)),
                                          (2_501, (11, -1))])
def test_list_offsets_by_time_names_the_first_record_at_or_after_the_time_not_its_batchs_first(
        stage, asked, found):
    """Kafka's ListOffsets by time answers the earliest offset whose record is at or after the
    time, with that record's timestamp. The leader answered the first offset of the batch holding
    it and that batch's first timestamp: asked for 1,401 in a batch of records stamped 1,000,
    1,100, ..., it said offset 0 at 1,000, and a consumer starting there read five records from
    before the time it asked for."""
    stage.produce(bytes(encode_batch(records(6, timestamp_step_ms=100), 1_000)))
    stage.produce(bytes(encode_batch(records(5, "s", timestamp_step_ms=100), 2_100)))
    stage.catch_up()

    response = stage.list_offsets(asked)

    assert response.error == ErrorCode.NONE
    assert (response.offset, response.timestamp_ms) == found


@pytest.mark.parametrize("offset", [-1, 4])
def test_a_consumer_fetch_outside_the_log_is_out_of_range(stage, offset):
    stage.produce(count=3)

    response = only(stage.consumer_fetch(offset), FetchResponse)

    assert response.error == ErrorCode.OFFSET_OUT_OF_RANGE
    assert (response.log_start_offset, response.log_end_offset) == (0, 3)


def test_a_fetch_from_a_node_that_is_not_a_follower_is_invalid(stage):
    response = only(stage.follower_fetch(9, 0), FetchResponse)

    assert response.error == ErrorCode.INVALID_REQUEST


def test_a_follower_can_fetch_from_a_follower_only_to_be_told_it_is_not_the_leader(stage):
    stage.set_state(leader=2, isr=[1, 2, 3], leader_epoch=2, partition_epoch=2)

    assert only(stage.consumer_fetch(0), FetchResponse).error == ErrorCode.NOT_LEADER


# ---------------------------------------------------------------------------- list offsets


def test_list_offsets_finds_the_earliest_the_latest_and_by_time(stage):
    stage.produce(batch(2, first_timestamp_ms=1_000))
    stage.produce(batch(2, first_timestamp_ms=5_000))
    stage.produce(batch(2, first_timestamp_ms=9_000))
    stage.follower_fetch(2, 4)
    stage.follower_fetch(3, 4)

    earliest, latest = stage.list_offsets(-2), stage.list_offsets(-1)
    by_time, late, past_end = stage.list_offsets(4_000), stage.list_offsets(8_000), stage.list_offsets(99_000)

    assert (earliest.offset, earliest.timestamp_ms) == (0, 1_000)
    assert latest.offset == 4 and latest.timestamp_ms == -1
    assert (by_time.offset, by_time.timestamp_ms) == (2, 5_000)
    assert late.offset == 4, "a batch above the high watermark is not revealed"
    assert past_end.offset == 4
    assert latest.high_watermark == 4 and latest.log_end_offset == 6


def test_list_offsets_with_a_negative_time_other_than_the_two_markers_is_invalid(stage):
    assert stage.list_offsets(-3).error == ErrorCode.INVALID_REQUEST


def test_list_offsets_at_a_follower_is_not_leader(stage):
    stage.set_state(leader=2, isr=[1, 2, 3], leader_epoch=2, partition_epoch=2)

    assert stage.list_offsets(-1).error == ErrorCode.NOT_LEADER


# ---------------------------------------------------------------------------- ISR maintenance


def test_a_follower_lagging_longer_than_the_lag_time_is_proposed_out_of_the_isr(stage):
    for _ in range(LIMITS.replica_lag_time_max_ms // 100):
        stage.follower_fetch(2)
        stage.harness.advance(100)
    assert stage.alter_requests() == [], "proposed before the lag time passed"

    stage.follower_fetch(2)
    stage.harness.advance(LIMITS.isr_check_interval_ms + 100)  # the next ISR check after the lag time

    requests = stage.alter_requests()
    assert len(requests) == 1
    request = requests[0]
    assert request.isr == [1, 2]
    assert (request.leader, request.leader_epoch, request.partition_epoch) == (1, 1, 1)
    assert request.isr_incarnations == [101, 202]
    assert stage.replica.state.isr == [1, 2, 3], "the ISR changes only when the coordinator confirms it"


def test_a_follower_that_caught_up_is_proposed_back_into_the_isr_with_its_incarnation():
    stage = Stage(isr=[1, 2])
    stage.produce(count=3)
    stage.follower_fetch(2, 3)
    stage.follower_fetch(3, 3, incarnation=333)

    stage.harness.advance(LIMITS.isr_check_interval_ms)

    request = only_alter(stage)
    assert request.isr == [1, 2, 3]
    assert request.isr_incarnations == [101, 202, 333]


def test_a_follower_whose_fetch_shows_it_caught_up_is_proposed_into_the_isr_at_once():
    """Kafka's maybeExpandIsr runs on the fetch that catches up, not on a periodic check: the
    simulator's seed 20904 had a repaired follower wait up to a check interval for its seat, and
    the disk of the ISR's only member failed in that window, taking the partition offline though
    the repaired follower held every committed record."""
    stage = Stage(isr=[1, 2])
    stage.produce(count=3)
    stage.follower_fetch(2, 3)
    stage.follower_fetch(3, 3, incarnation=333)

    request = only_alter(stage)
    assert request.isr == [1, 2, 3]
    assert request.isr_incarnations == [101, 202, 333]


def test_a_repeated_announcement_of_the_current_isr_does_not_cancel_a_pending_join():
    """The simulator's seed 30482: the coordinator's heartbeat answer repeated the ISR [1, 2] it
    had (same epochs) while the leader's proposal [1, 2, 3] was on its way. The leader took it as
    the answer, forgot its proposal, and moved the high watermark without node 3 — which the
    coordinator then put in the ISR, holding less than what was committed."""
    stage = Stage(isr=[1, 2])
    stage.produce(count=3)
    stage.follower_fetch(2, 3)
    stage.follower_fetch(3, 3, incarnation=333)
    assert only_alter(stage).isr == [1, 2, 3]

    stage.set_state(leader=1, isr=[1, 2])  # the same state again, not an answer
    stage.produce(count=2)
    stage.follower_fetch(2, 5)

    assert stage.replica.high_watermark == 3, "the high watermark passed a member whose join is pending"
    assert stage.replica.leader.pending_isr == [1, 2, 3]


def test_a_follower_still_behind_waits_for_its_seat():
    stage = Stage(isr=[1, 2])
    stage.produce(count=3)
    stage.follower_fetch(2, 3)
    stage.follower_fetch(3, 2, incarnation=333)

    assert stage.harness.take(COORDINATOR, AlterIsrRequest) == []


def test_a_joining_follower_already_counts_for_the_high_watermark_while_its_join_is_pending():
    stage = Stage(isr=[1, 2], min_insync_replicas=1)
    stage.produce(count=2)
    stage.follower_fetch(2, 2)
    stage.follower_fetch(3, 2)
    stage.harness.advance(LIMITS.isr_check_interval_ms)
    assert only_alter(stage).isr == [1, 2, 3]

    stage.produce(count=2)
    stage.follower_fetch(2, 4)

    assert stage.replica.high_watermark == 2, "the high watermark passed a pending ISR member"


def test_a_pending_join_does_not_lift_the_isr_to_min_insync_for_the_high_watermark():
    """The simulator's seed 2220 (denser faults): the leader led an ISR of one, below
    min_insync_replicas, and proposed a caught-up follower back; counting the proposal, the ISR
    looked like two and the high watermark moved to 297 while the coordinator, cut off, still had
    ISR [1] and ELR {3} at 261. The leader died, the ELR member was elected, and 36 committed
    offsets were on no replica the coordinator knew of. The ISR counted for min_insync is the one
    the coordinator confirmed (Kafka's isUnderMinIsr reads the committed ISR); the proposal only
    makes the high watermark wait for the joining member too (its position counts)."""
    stage = Stage(isr=[1], min_insync_replicas=2)
    stage.produce(count=3, acks=1)
    stage.follower_fetch(2, 3)
    assert only_alter(stage).isr == [1, 2]

    stage.follower_fetch(2, 3)

    assert stage.replica.high_watermark == 0, "committed with an ISR of one below min_insync_replicas"
    stage.set_state(leader=1, isr=[1, 2], partition_epoch=2)  # the coordinator's answer
    stage.follower_fetch(2, 3)
    assert stage.replica.high_watermark == 3


def test_a_join_whose_answer_never_came_still_holds_the_high_watermark_back_until_the_coordinator_says():
    """The simulator's seed 4780 (denser faults): the leader proposed node 3 back into an ISR of
    [1, 2]; the coordinator took it, the answer was lost. The request timed out, the leader forgot
    it, a split cut node 3 off, and the leader committed 44 offsets with node 2 alone — while the
    coordinator's ISR held node 3, which it then elected without them. An expansion asked and not
    answered may have been taken: its members hold the high watermark back (they are in the
    maximal ISR) until a state from the coordinator newer than the one the request was based on
    says what the ISR is."""
    stage = Stage(isr=[1, 2], min_insync_replicas=2)
    stage.produce(count=3, acks=1)
    stage.catch_up(2, 3)
    assert only_alter(stage).isr == [1, 2, 3]  # the answer is lost
    stage.harness.advance(LIMITS.alter_isr_timeout_ms + LIMITS.replica_lag_time_max_ms + 200)
    assert stage.alter_requests(), "the leader asks again, to learn what became of its request"

    stage.produce(count=4, acks=1)
    stage.follower_fetch(2)  # node 3 is cut off at 3

    assert stage.replica.high_watermark == 3, "committed without a member the coordinator may have taken in"
    stage.set_state(leader=1, isr=[1, 2], partition_epoch=3)  # the coordinator: node 3 is out after all
    stage.follower_fetch(2)
    assert stage.replica.high_watermark == 7


def test_a_confirmed_shrink_lets_waiting_acks_all_requests_complete(stage):
    stage.produce(acks=-1)
    stage.follower_fetch(2)

    stage.set_state(leader=1, isr=[1, 2], partition_epoch=2)

    response = only(stage.replies(), ProduceResponse)
    assert response.error == ErrorCode.NONE
    assert stage.replica.high_watermark == 1


def test_an_unanswered_isr_change_is_asked_again_after_the_timeout(stage):
    stage.harness.advance(LIMITS.replica_lag_time_max_ms + LIMITS.isr_check_interval_ms)
    first = only_alter(stage)

    stage.harness.advance(LIMITS.alter_isr_timeout_ms - LIMITS.isr_check_interval_ms)
    assert stage.alter_requests() == [], "asked again before the timeout"
    stage.harness.advance(2 * LIMITS.isr_check_interval_ms)  # the first ISR check past the timeout

    again = only_alter(stage)
    assert again.isr == first.isr
    assert again.correlation_id != first.correlation_id


# ---------------------------------------------------------------------------- zombie leaders


def test_a_newer_state_naming_another_leader_answers_waiting_acks_all_requests_with_not_leader(stage):
    stage.produce(count=2, acks=-1)
    stage.follower_fetch(2)

    stage.set_state(leader=2, isr=[1, 2, 3], leader_epoch=2, partition_epoch=2)

    response = only(stage.replies(), ProduceResponse)
    assert response.error == ErrorCode.NOT_LEADER
    assert stage.replica.role == "follower"
    stage.follower_fetch(3)
    assert stage.replies() == [], "a deposed leader acknowledged a write"


def test_a_zombie_leader_cannot_shrink_the_isr_to_itself_and_acknowledge_alone(stage):
    stage.produce(acks=-1)
    stage.harness.advance(LIMITS.replica_lag_time_max_ms + LIMITS.isr_check_interval_ms)  # followers moved on
    request = stage.alter_requests()[0]
    assert request.isr == [1]
    assert stage.replies() == [], "acknowledged on an ISR the coordinator never confirmed"

    stage.leader_epoch, stage.partition_epoch = 2, 2
    refusal = AlterIsrResponse(correlation_id=request.correlation_id, error=ErrorCode.FENCED_LEADER_EPOCH,
                               state=stage.state(leader=2, isr=[2, 3]))
    stage.harness.deliver(LEADER, refusal, COORDINATOR)

    response = only(stage.replies(), ProduceResponse)
    assert response.error == ErrorCode.NOT_LEADER
    assert stage.replica.role == "follower"


def test_an_answer_to_an_isr_change_the_leader_no_longer_waits_for_is_ignored(stage):
    stale_state = stage.state(leader=2, isr=[2])
    stale_state.leader_epoch = 7

    answer = AlterIsrResponse(correlation_id=999, state=stale_state)

    effects = stage.harness.deliver(LEADER, answer, COORDINATOR)

    assert effects == []
    assert stage.replica.role == "leader"


# ---------------------------------------------------------------------------- durability


def test_with_flush_policy_every_batch_replies_wait_for_the_log_flush():
    stage = Stage(flush_policy="every_batch", min_insync_replicas=1, isr=[1])

    effects = stage.produce(count=2, acks=1)

    assert messages(at_once(effects), ProduceResponse) == []
    flush = [effect for effect in effects if isinstance(effect, AfterFlush)]
    assert len(flush) == 1 and flush[0].store is stage.log
    assert only(flushed(effects), ProduceResponse).base_offset == 0
    assert stage.log.flushed_offset == 2


def test_with_flush_policy_never_replies_go_out_at_once(stage):
    effects = stage.produce(acks=1)

    assert not any(isinstance(effect, AfterFlush) for effect in effects)


def test_a_failed_fsync_crashes_the_replica_instead_of_retrying():
    stage = Stage(flush_policy="interval", flush_interval_ms=100)
    stage.produce(count=1)
    stage.fs.faults.fail_next_fsync()

    stage.harness.advance(100)

    assert isinstance(stage.harness.stopped.get(LEADER), Crash)
    assert LEADER not in stage.harness.actors


def test_heartbeats_report_the_position_every_interval(stage):
    stage.harness.take(COORDINATOR)
    stage.produce(count=4)
    stage.catch_up()

    stage.harness.advance(LIMITS.replica_heartbeat_interval_ms)

    beat = stage.harness.take(COORDINATOR, ReplicaHeartbeat)[-1]
    assert (beat.log_end_offset, beat.high_watermark, beat.leader_epoch, beat.partition_epoch) == (4, 4, 1, 1)


def test_a_fetch_answer_fits_the_frame_its_client_decodes_whatever_max_bytes_it_asks():
    """A consumer asking max_bytes of 48 MiB (Kafka's fetch.max.bytes is 50 MiB) was answered up
    to fetch_bytes_max, 64 MiB: past the 32 MiB every client's codec decodes, so it dropped the
    answer, asked again, and never read on. The leader caps an answer to what fits a frame."""
    from transport.codec import Codec

    stage = Stage(isr=(1,), min_insync_replicas=1)
    payload = b"x" * (1 << 20)
    big = bytes(encode_batch([(0, b"k", payload, None)], 1_000))
    for _ in range(40):
        stage.produce(big)

    answer = only(stage.consumer_fetch(0, max_bytes=48 << 20), FetchResponse)

    codec = Codec(LIMITS.frame_bytes_max)
    frames = codec.encode(answer)
    assert answer.error == ErrorCode.NONE and len(answer.records) > 0
    assert sum(map(len, frames)) <= LIMITS.frame_bytes_max, f"an answer of {sum(map(len, frames)):,} bytes"
    codec.decode([bytes(frame) for frame in frames])
