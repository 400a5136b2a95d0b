"""The producer actor (actors/producer_client.py): sealed batches in, produce requests out.

The producer runs in the harness; the test plays the coordinator (metadata, producer ids) and the
partition leaders (produce responses), so it decides which answers come back and when. Each
batch's fate comes back to the embedding shell as a ("batch-done", ...) notification.
"""

from __future__ import annotations

import pytest

from actors.errors import ErrorCode
from actors.messages import (
    ErrorResponse, InitProducerIdRequest, InitProducerIdResponse, MetadataRequest, MetadataResponse,
    PartitionMetadata, PeerDisconnected, ProduceRequest, ProduceResponse, SendBatch, Stop, TimerFired, TopicMetadata,
)
from actors.producer_client import CHASE_INTERVAL_MS, ProducerClient, ProducerSettings
from storage.batch import decode_records, verify_batch
from tests.unit.actor_harness import MS, Harness, messages, notices, only

PRODUCER, BOOTSTRAP = "producer", "bootstrap"
DELIVERY_TIMEOUT_MS = 10_000


def leader(node: int) -> str:
    return f"tcp://127.0.0.1:9/leader-{node}"


class Stage:
    def __init__(self, **settings) -> None:
        self.settings = ProducerSettings(**settings)
        self.harness = Harness()
        self.producer = ProducerClient(bootstrap=BOOTSTRAP, settings=self.settings)
        self.harness.add(PRODUCER, self.producer)
        self.batch_ids = 0

    def send(self, count: int = 1, partition: int = 0, *, deadline_ms: int = DELIVERY_TIMEOUT_MS) -> list:
        self.batch_ids += 1
        records = [(i, f"key-{self.batch_ids}-{i}".encode(), b"value", None) for i in range(count)]
        batch = SendBatch(batch_id=self.batch_ids, topic="orders", partition=partition, records=records,
                          first_timestamp_ms=1_000, max_timestamp_ms=1_000 + count,
                          deadline_ns=self.harness.now_ns + deadline_ms * MS)
        return self.harness.deliver(PRODUCER, batch)

    def metadata(self, leaders: dict[int, int]) -> list:
        """Answer the latest metadata request (if any): partition -> leader node (0: no leader)."""
        asked = self.harness.take(BOOTSTRAP, MetadataRequest)
        correlation_id = asked[-1].correlation_id if asked else 0
        partitions = [PartitionMetadata(partition=p, leader=node or -1,
                                        leader_endpoint=leader(node) if node else "",
                                        error=0 if node else ErrorCode.LEADER_NOT_AVAILABLE)
                      for p, node in sorted(leaders.items())]
        response = MetadataResponse(correlation_id=correlation_id,
                                    topics=[TopicMetadata(name="orders", partitions=partitions)])
        return self.harness.deliver(PRODUCER, response, BOOTSTRAP)

    def requests(self, node: int = 1) -> list[ProduceRequest]:
        return self.harness.take(leader(node), ProduceRequest)

    def answer(self, request: ProduceRequest, *, error: int = 0, base_offset: int = 0, node: int = 1) -> list:
        count = verify_batch(request.batch).record_count
        response = ProduceResponse(correlation_id=request.correlation_id, topic="orders",
                                   partition=request.partition, error=error,
                                   base_offset=base_offset if not error else -1,
                                   last_offset=base_offset + count - 1 if not error else -1)
        return self.harness.deliver(PRODUCER, response, leader(node))

    def done(self) -> list[tuple]:
        return [notice.payload for _, notice in self.harness.notified if notice.kind == "batch-done"]


def keys_of(request: ProduceRequest) -> list[bytes]:
    header = verify_batch(request.batch)
    return [record[1] for record in decode_records(request.batch, header)]


@pytest.fixture
def stage() -> Stage:
    return Stage()


# ---------------------------------------------------------------------------- the happy path


def test_the_first_batch_asks_for_metadata_then_goes_to_the_partitions_leader(stage):
    effects = stage.send(count=3)
    assert only(effects, MetadataRequest).topics == ["orders"]
    assert stage.harness.received(leader(1)) == []

    stage.metadata({0: 1})

    request = only(stage.requests(), ProduceRequest)
    assert (request.topic, request.partition, request.acks) == ("orders", 0, 1)
    assert keys_of(request) == [b"key-1-0", b"key-1-1", b"key-1-2"]
    assert verify_batch(request.batch).producer_id == -1


def test_an_acknowledgement_completes_the_batch_with_its_offset(stage):
    stage.send()
    stage.metadata({0: 1})

    stage.answer(stage.requests()[0], base_offset=41)

    assert stage.done() == [(1, 0, 41, None)]
    assert stage.producer.in_flight == {}


def test_batches_go_to_each_partitions_own_leader(stage):
    stage.send(partition=0)
    stage.metadata({0: 1, 1: 2})
    stage.send(partition=1)

    assert [r.partition for r in stage.requests(1)] == [0]
    assert [r.partition for r in stage.requests(2)] == [1]


def test_no_more_than_max_in_flight_requests_per_partition():
    stage = Stage(max_in_flight=2)
    stage.send()
    stage.metadata({0: 1})
    for _ in range(3):
        stage.send()

    first = stage.requests()
    assert len(first) == 2
    stage.answer(first[0])
    second = stage.requests()

    assert len(second) == 1
    assert keys_of(second[0]) == [b"key-3-0"]
    assert stage.producer.in_flight_count[("orders", 0)] == 2


def test_acks_0_completes_each_batch_as_soon_as_it_is_sent():
    stage = Stage(acks=0, max_in_flight=1)
    stage.send()
    stage.metadata({0: 1})
    stage.send()

    assert [r.acks for r in stage.requests()] == [0, 0]
    assert stage.done() == [(1, 0, -1, None), (2, 0, -1, None)]
    assert stage.producer.in_flight == {}


def test_acks_0_with_many_batches_waiting_for_metadata_sends_them_all():
    stage = Stage(acks=0, max_in_flight=1)
    waiting = 500  # a burst of small batches sealed while the first metadata request is out
    for _ in range(waiting):
        stage.send()

    stage.metadata({0: 1})

    assert len(stage.requests()) == waiting
    assert len(stage.done()) == waiting


# ---------------------------------------------------------------------------- errors and retries


def test_a_retriable_error_refreshes_metadata_and_resends_the_same_bytes_after_the_backoff():
    stage = Stage(retry_backoff_ms=100)
    stage.send(count=2)
    stage.metadata({0: 1})
    first = stage.requests()[0]

    effects = stage.answer(first, error=ErrorCode.NOT_LEADER)

    assert only(effects, MetadataRequest).topics == ["orders"]
    assert stage.done() == []
    stage.metadata({0: 2})
    assert stage.requests(2) == [], "re-sent before the retry backoff"
    stage.harness.advance(100)
    retried = only(stage.requests(2), ProduceRequest)
    assert bytes(retried.batch) == bytes(first.batch)
    assert retried.correlation_id != first.correlation_id
    stage.answer(retried, base_offset=7, node=2)
    assert stage.done() == [(1, 0, 7, None)]


@pytest.mark.parametrize("code", [ErrorCode.CORRUPT_MESSAGE, ErrorCode.MESSAGE_TOO_LARGE,
                                  ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_PRODUCER_EPOCH])
def test_a_non_retriable_error_fails_the_batch_with_that_error(stage, code):
    stage.send()
    stage.metadata({0: 1})

    stage.answer(stage.requests()[0], error=code)

    [(batch_id, partition, offset, error)] = stage.done()
    assert (batch_id, partition, offset) == (1, 0, -1)
    assert error.code == code and not error.retriable
    assert stage.harness.received(BOOTSTRAP, MetadataRequest) == []


def test_an_error_response_to_a_produce_request_is_treated_like_its_code(stage):
    stage.send()
    stage.metadata({0: 1})
    request = stage.requests()[0]

    stage.harness.deliver(PRODUCER, ErrorResponse(correlation_id=request.correlation_id,
                                                  error=ErrorCode.UNKNOWN_MESSAGE), leader(1))

    assert stage.done()[0][3].code == ErrorCode.UNKNOWN_MESSAGE


def test_a_request_with_no_answer_is_retried_after_the_request_timeout():
    stage = Stage(request_timeout_ms=1_000, retry_backoff_ms=50)
    stage.send()
    stage.metadata({0: 1})
    first = stage.requests()[0]

    stage.harness.advance(1_100)
    stage.metadata({0: 1})
    stage.harness.advance(100)

    retried = stage.requests()
    assert len(retried) == 1 and bytes(retried[0].batch) == bytes(first.batch)
    assert stage.done() == []


def test_a_lost_connection_to_the_leader_retries_its_in_flight_batches_at_once(stage):
    stage.send()
    stage.metadata({0: 1})
    stage.requests()

    effects = stage.harness.deliver(PRODUCER, PeerDisconnected(endpoint=leader(1)), b"")

    assert messages(effects, MetadataRequest)
    assert stage.producer.in_flight == {}
    stage.metadata({0: 1})  # stale metadata still naming the dead leader
    stage.harness.advance(200)
    assert stage.requests() == [], "re-sent to the endpoint that just went away"
    stage.metadata({0: 2})
    stage.harness.advance(200)
    assert len(stage.requests(2)) == 1


def test_a_batch_that_cannot_be_delivered_before_its_deadline_fails_with_a_timeout(stage):
    stage.send(deadline_ms=500)
    stage.metadata({0: 0})  # no leader

    stage.harness.advance(600)

    [(batch_id, _, offset, error)] = stage.done()
    assert (batch_id, offset) == (1, -1)
    assert error.code == ErrorCode.REQUEST_TIMED_OUT
    assert not stage.producer.waiting[("orders", 0)]


def test_a_retriable_error_after_the_deadline_fails_the_batch_and_names_the_last_error(stage):
    stage.send(deadline_ms=500)
    stage.metadata({0: 1})
    request = stage.requests()[0]
    stage.harness.advance(600)

    stage.answer(request, error=ErrorCode.NOT_ENOUGH_REPLICAS)

    error = stage.done()[0][3]
    assert error.code == ErrorCode.NOT_ENOUGH_REPLICAS
    assert "delivery timed out" in str(error)


def test_metadata_without_a_leader_is_asked_again_only_after_the_retry_backoff():
    stage = Stage(retry_backoff_ms=100)
    stage.send()

    effects = stage.metadata({0: 0})

    assert messages(effects, MetadataRequest) == []


def test_stop_fails_every_batch_still_waiting_or_in_flight():
    stage = Stage(max_in_flight=1)
    stage.send()
    stage.metadata({0: 1})
    stage.send()

    effects = stage.harness.deliver(PRODUCER, Stop(), b"")

    outcomes = notices(effects, "batch-done")
    assert sorted(batch_id for batch_id, _, _, _ in outcomes) == [1, 2]
    assert all(error.code == ErrorCode.REQUEST_TIMED_OUT for _, _, _, error in outcomes)


# ---------------------------------------------------------------------------- idempotence


def idempotent_stage(**settings) -> Stage:
    stage = Stage(idempotent=True, max_in_flight=5, **settings)
    request = only(stage.harness.take(BOOTSTRAP, InitProducerIdRequest), InitProducerIdRequest)
    answer = InitProducerIdResponse(correlation_id=request.correlation_id, producer_id=900, producer_epoch=3)
    stage.harness.deliver(PRODUCER, answer, BOOTSTRAP)
    return stage


def test_an_idempotent_producer_sends_nothing_before_it_has_a_producer_id():
    stage = Stage(idempotent=True)
    init = only(stage.harness.take(BOOTSTRAP, InitProducerIdRequest), InitProducerIdRequest)
    stage.send()
    stage.metadata({0: 1})
    assert stage.requests() == []

    stage.harness.deliver(PRODUCER, InitProducerIdResponse(correlation_id=init.correlation_id, producer_id=5),
                          BOOTSTRAP)

    header = verify_batch(only(stage.requests(), ProduceRequest).batch)
    assert (header.producer_id, header.base_sequence) == (5, 0)


def test_an_idempotent_producer_numbers_each_partitions_records_in_order():
    stage = idempotent_stage()
    stage.send(count=3)
    stage.metadata({0: 1, 1: 1})
    stage.send(count=2)
    stage.send(count=1, partition=1)

    headers = [verify_batch(r.batch) for r in stage.requests()]

    assert [(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) for h in headers] == [
        (900, 3, 0, 3), (900, 3, 3, 2), (900, 3, 0, 1)]


def test_idempotent_retries_go_out_again_in_sequence_order_with_the_same_numbers():
    stage = idempotent_stage(retry_backoff_ms=50)
    for _ in range(3):
        stage.send(count=2)
    stage.metadata({0: 1})
    first, second, third = stage.requests()

    stage.answer(first, error=ErrorCode.NOT_LEADER)
    stage.answer(third, error=ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    stage.answer(second, error=ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    stage.metadata({0: 2})
    stage.harness.advance(150)

    resent = stage.requests(2)
    assert [verify_batch(r.batch).base_sequence for r in resent] == [0, 2, 4]
    assert [bytes(r.batch) for r in resent] == [bytes(first.batch), bytes(second.batch), bytes(third.batch)]
    for request, offset in zip(resent, (10, 12, 14)):
        stage.answer(request, base_offset=offset, node=2)
    assert [(batch_id, offset) for batch_id, _, offset, _ in stage.done()] == [(1, 10), (2, 12), (3, 14)]


def test_a_failed_producer_id_request_is_asked_again_at_the_next_tick_not_at_once():
    stage = Stage(idempotent=True)
    refusals = 0
    for _ in range(20):  # a controller that refuses every time, for a second
        for init in stage.harness.take(BOOTSTRAP, InitProducerIdRequest):
            refusals += 1
            effects = stage.harness.deliver(PRODUCER, InitProducerIdResponse(
                correlation_id=init.correlation_id, error=ErrorCode.COORDINATOR_NOT_AVAILABLE), BOOTSTRAP)
            assert not messages(effects, InitProducerIdRequest), "asked again the moment it was refused"
        stage.harness.advance(CHASE_INTERVAL_MS)
    assert 5 <= refusals <= 21, f"{refusals} producer-id requests in a second"
    assert stage.producer.producer_id == -1


# ---------------------------------------------------------------------------- answers are checked


def test_a_success_answer_naming_another_partition_is_not_taken_as_an_acknowledgement(stage):
    """A stale endpoint may now belong to another partition's process: its answer says nothing of
    our batch, which is retried after a metadata refresh."""
    stage.send()
    stage.metadata({0: 1})
    request = only(stage.requests(), ProduceRequest)
    wrong = ProduceResponse(correlation_id=request.correlation_id, topic="payments", partition=0, base_offset=7)

    stage.harness.deliver(PRODUCER, wrong, leader(1))

    assert stage.done() == []
    stage.harness.advance(stage.settings.retry_backoff_ms + 1)
    stage.metadata({0: 1})
    again = only(stage.requests(), ProduceRequest)
    assert again.batch == request.batch
    stage.answer(again, base_offset=3)
    assert stage.done() == [(1, 0, 3, None)]


def test_produce_requests_carry_the_topic_id_from_metadata(stage):
    stage.send()
    asked = stage.harness.take(BOOTSTRAP, MetadataRequest)
    topic = TopicMetadata(name="orders", topic_id=77, partitions=[PartitionMetadata(partition=0, leader=1,
                                                                                    leader_endpoint=leader(1))])
    stage.harness.deliver(PRODUCER, MetadataResponse(correlation_id=asked[-1].correlation_id, topics=[topic]), BOOTSTRAP)

    assert only(stage.requests(), ProduceRequest).topic_id == 77


# ---------------------------------------------------------------------------- timers at deadlines


def wakes(stage: Stage) -> int:
    return len(stage.harness.steps_of(PRODUCER, TimerFired))


def test_an_idle_producer_sets_no_timer():
    stage = Stage()
    assert stage.harness.timers[PRODUCER].deadline("tick") is None
    stage.harness.advance(60_000)
    assert wakes(stage) == 0


def test_a_producer_waiting_on_answers_wakes_only_when_something_falls_due():
    """Requests in flight, nothing else wanted: the timer is at the delivery deadline or the
    request timeout, whichever is first, not every 50 ms."""
    stage = Stage(request_timeout_ms=4_000)
    stage.send(deadline_ms=20_000)
    stage.metadata({0: 1})
    first = stage.requests()[0]
    stage.harness.advance(CHASE_INTERVAL_MS)  # the chase armed while metadata was wanted: one wake, nothing due
    assert stage.harness.timers[PRODUCER].deadline("tick") == first_sent_ns(stage) + 4_000 * MS + 1

    stage.harness.advance(3_800)
    assert wakes(stage) == 1, "woke while nothing was due"
    assert stage.requests() == []
    stage.harness.advance(200)  # the request timed out: retried once metadata answers
    stage.metadata({0: 1})
    stage.harness.advance(150)
    retried = stage.requests()
    assert len(retried) == 1 and bytes(retried[0].batch) == bytes(first.batch)


def first_sent_ns(stage: Stage) -> int:
    [pending] = stage.producer.in_flight.values()
    return pending.sent_ns


def test_a_retry_goes_out_when_its_backoff_ends_not_at_the_next_tick():
    stage = Stage(retry_backoff_ms=130)
    stage.send()
    stage.metadata({0: 1})
    request = stage.requests()[0]
    answered_ns = stage.harness.now_ns
    stage.answer(request, error=ErrorCode.NOT_ENOUGH_REPLICAS)
    stage.metadata({0: 1})

    stage.harness.advance(129)
    assert stage.requests() == []
    stage.harness.advance(1)
    [retried] = stage.requests()
    assert stage.harness.now_ns == answered_ns + 130 * MS and retried.correlation_id != request.correlation_id


def test_a_batch_waiting_for_a_leader_fails_at_its_deadline_to_the_millisecond():
    stage = Stage()
    stage.send(deadline_ms=777)
    stage.metadata({0: 0})  # no leader

    stage.harness.advance(776)
    assert stage.done() == []
    stage.harness.advance(1)
    [(_, _, _, error)] = stage.done()
    assert error.code == ErrorCode.REQUEST_TIMED_OUT


def test_metadata_still_wanted_is_asked_for_every_chase_interval_and_no_more():
    stage = Stage()
    stage.send()
    asked = 0
    for _ in range(20):  # a controller that never answers, for a second
        asked += len(stage.harness.take(BOOTSTRAP, MetadataRequest))
        stage.harness.advance(CHASE_INTERVAL_MS)
    assert 1000 // CHASE_INTERVAL_MS - 1 <= asked <= 1000 // CHASE_INTERVAL_MS + 1
    assert wakes(stage) <= 1000 // CHASE_INTERVAL_MS + 1


def test_a_deadline_the_timer_would_miss_breaks_the_invariants():
    stage = Stage()
    stage.send(deadline_ms=5_000)
    stage.producer.timer.armed_ns = stage.harness.now_ns + 6_000 * MS  # as if the delivery deadline was never wanted
    with pytest.raises(AssertionError, match="timer would fire after"):
        stage.producer.invariants()


@pytest.mark.parametrize("records", [
    [(2**64, b"k", b"v", None)],  # a timestamp delta no varint holds
    [(0, b"k", b"v", [("\ud800", b"x")])],  # a header name UTF-8 cannot encode
])
def test_a_batch_that_cannot_be_encoded_fails_alone_and_the_next_one_goes(records):
    """Producer.send(timestamp_ms=10**30) stopped the producer's I/O thread with struct.error: the
    batch and every later send on that producer were lost. Nothing an application passes may stop it."""
    stage = Stage(idempotent=True)
    stage.harness.codec = None  # the shell hands batches over in-process, never encoded
    stage.harness.deliver(PRODUCER, SendBatch(batch_id=7, topic="orders", partition=0, records=records,
                                              first_timestamp_ms=1_000, max_timestamp_ms=1_000,
                                              deadline_ns=DELIVERY_TIMEOUT_MS * MS))
    stage.metadata({0: 1})
    stage.producer.producer_id, stage.producer.sequences.base_epoch = 9, 0  # as if InitProducerId was answered
    stage.send()
    stage.harness.run()

    failed = [payload for payload in stage.done() if payload[0] == 7]
    assert len(failed) == 1 and failed[0][3].code == ErrorCode.INVALID_RECORD
    request = only(stage.requests(), ProduceRequest)
    assert verify_batch(request.batch).base_sequence == 0, "the failed batch took no sequence numbers"


def test_after_a_batch_fails_for_good_the_partition_is_renumbered_under_a_new_epoch_and_delivers_again():
    """A full disk refused one batch (DISK_FULL, not retriable). The batches after it had sequence
    numbers above the gap it left, so the leader answered each OUT_OF_ORDER_SEQUENCE_NUMBER until
    its delivery timeout, and so for every later batch of the producer: it never delivered to that
    partition again. They cannot have been appended (the leader takes sequences in order) and
    never will be at that epoch, so they go again from sequence 0 under the next epoch, which the
    leader takes as a new start (actors/producer_state.py), in their order."""
    from actors.producer_state import ProducerStateTable

    stage = idempotent_stage(retry_backoff_ms=50)
    table = ProducerStateTable(producers_max=100)
    sent = []

    def leader_answers(request: ProduceRequest, offset: int) -> None:
        header = verify_batch(request.batch)
        sent.append(header)
        verdict = table.check(header.producer_id, header.producer_epoch, header.base_sequence,
                              header.record_count, header.crc)
        if verdict.duplicate_of is not None:
            stage.answer(request, base_offset=verdict.duplicate_of.base_offset)
            return
        if verdict.error:
            stage.answer(request, error=verdict.error)
            return
        table.record(header.producer_id, header.producer_epoch, header.base_sequence, header.record_count,
                     header.crc, offset)
        stage.answer(request, base_offset=offset)

    stage.send(count=2)
    stage.metadata({0: 1})
    leader_answers(only(stage.requests(), ProduceRequest), 0)  # sequences 0-1 appended
    for _ in range(3):
        stage.send(count=2)
    full, after, later = stage.requests()
    stage.answer(full, error=ErrorCode.DISK_FULL)  # sequences 2-3: refused, never appended
    leader_answers(after, 2)
    leader_answers(later, 2)
    stage.send(count=1)  # sent after the failure
    for _ in range(5):
        stage.harness.advance(100)
        stage.metadata({0: 1})
        for request in stage.requests():
            leader_answers(request, 2 + sum(1 for _ in stage.done()))

    outcomes = {batch_id: (offset, error) for batch_id, _, offset, error in stage.done()}
    assert outcomes[2][1] is not None and outcomes[2][1].code == ErrorCode.DISK_FULL
    assert [outcomes[batch_id][1] for batch_id in (1, 3, 4, 5)] == [None] * 4, outcomes
    assert [outcomes[batch_id][0] for batch_id in (3, 4, 5)] == sorted(outcomes[batch_id][0] for batch_id in (3, 4, 5))
    renumbered = [(header.producer_epoch, header.base_sequence) for header in sent if header.producer_epoch == 4]
    assert renumbered == [(4, 0), (4, 2), (4, 4)], "the next epoch, from sequence 0, in order"


def test_batches_numbered_before_a_gap_go_out_as_they_are_before_the_numbering_starts_over():
    """A batch that timed out ended undelivered, but it may have been appended: the batches after
    it keep their numbers and go out as they are until the leader settles each (appended, or out
    of order and so never appended). Only then do the rest take new numbers."""
    stage = idempotent_stage(retry_backoff_ms=50)
    stage.send(count=2, deadline_ms=300)
    stage.metadata({0: 1})
    first = only(stage.requests(), ProduceRequest)
    stage.send(count=2)
    second = only(stage.requests(), ProduceRequest)
    stage.answer(second, error=ErrorCode.NOT_LEADER)  # waits to go again, numbered 2-3
    stage.harness.advance(400)
    stage.answer(first, error=ErrorCode.NOT_LEADER)  # past its deadline: undelivered, and maybe appended
    assert [(batch_id, error is not None) for batch_id, _, _, error in stage.done()] == [(1, True)]
    stage.send(count=1)
    stage.metadata({0: 1})
    again = stage.requests()
    headers = [verify_batch(request.batch) for request in again]
    assert [(h.producer_epoch, h.base_sequence) for h in headers] == [(3, 2)], "as it was, and nothing new yet"
    stage.answer(again[0], base_offset=2)  # the first had been appended after all: so is this one
    stage.harness.advance(100)
    stage.metadata({0: 1})
    last = verify_batch(only(stage.requests(), ProduceRequest).batch)
    assert (last.producer_epoch, last.base_sequence) == (4, 0)


def test_a_batch_whose_answer_was_lost_is_retried_while_the_leader_still_remembers_it():
    """The leader remembers a producer's last 5 batches, so a retry is recognised only while at
    most 4 later batches were appended after it. A batch whose answer was lost stayed in flight for
    its request timeout while the later ones completed and freed their places in flight, so more
    went out: by its retry the leader had forgotten it, answered OUT_OF_ORDER_SEQUENCE_NUMBER
    ("expected 278") every time, and the partition delivered nothing more until the batch's
    delivery timeout (the simulator found 1-4 such batches in a quarter of its seeds). A new batch
    now goes out only while the partition's oldest unsettled one is among the last 5 sent."""
    from actors.producer_state import ProducerStateTable

    stage = idempotent_stage(retry_backoff_ms=50, request_timeout_ms=1000)
    table = ProducerStateTable(producers_max=100)
    offsets = iter(range(0, 1000, 2))

    def leader_answers(request: ProduceRequest, answer_lost: bool = False) -> None:
        header = verify_batch(request.batch)
        verdict = table.check(header.producer_id, header.producer_epoch, header.base_sequence,
                              header.record_count, header.crc)
        if verdict.duplicate_of is not None:
            stage.answer(request, base_offset=verdict.duplicate_of.base_offset)
        elif verdict.error:
            stage.answer(request, error=verdict.error)
        else:
            offset = next(offsets)
            table.record(header.producer_id, header.producer_epoch, header.base_sequence, header.record_count,
                         header.crc, offset)
            if not answer_lost:
                stage.answer(request, base_offset=offset)

    stage.send(count=2)
    stage.metadata({0: 1})
    leader_answers(only(stage.requests(), ProduceRequest), answer_lost=True)  # appended at 0
    for _ in range(12):
        stage.send(count=2)
        for request in stage.requests():
            leader_answers(request)
    stage.harness.advance(1100)  # the lost answer's request times out
    for _ in range(10):
        stage.harness.advance(60)
        stage.metadata({0: 1})
        for request in stage.requests():
            leader_answers(request)

    outcomes = {batch_id: (offset, error) for batch_id, _, offset, error in stage.done()}
    assert outcomes.get(1) == (0, None), "the retry of the first batch is answered with its offsets"
    assert sorted(outcomes) == list(range(1, 14)) and all(error is None for _, error in outcomes.values())


def test_batches_refused_before_a_later_one_reached_a_leader_that_did_not_know_the_producer_go_first():
    """The first batches to a partition were refused NOT_ENOUGH_REPLICAS; a later one, answered
    UNKNOWN_PRODUCER_ID (the leader takes an unknown producer only from sequence 0), waits its
    turn: the earlier ones go again first, and all are delivered in order, under their numbers."""
    stage = idempotent_stage(retry_backoff_ms=50)
    stage.send(count=2)
    stage.metadata({0: 1})
    stage.send(count=2)
    first, second = stage.requests()
    stage.answer(first, error=ErrorCode.NOT_ENOUGH_REPLICAS)
    stage.answer(second, error=ErrorCode.UNKNOWN_PRODUCER_ID)
    stage.harness.advance(60)
    stage.metadata({0: 1})
    again = stage.requests()
    headers = [verify_batch(request.batch) for request in again]

    assert [(header.producer_epoch, header.base_sequence) for header in headers] == [(3, 0), (3, 2)]
    for offset, request in zip((0, 2), again):
        stage.answer(request, base_offset=offset)
    assert [(batch_id, offset, error) for batch_id, _, offset, error in stage.done()] == [
        (1, 0, None), (2, 2, None)]


def test_a_producer_the_leader_forgot_numbers_the_partition_again_from_0():
    """Retention removed every batch of the producer, or the leader keeps state for more producers
    than it may and forgot the one that wrote least recently: its next batch is answered
    UNKNOWN_PRODUCER_ID. Nothing older is unsettled, so that batch and the ones after it take new
    numbers from 0 under the partition's next epoch, which the leader takes as a new start."""
    stage = idempotent_stage(retry_backoff_ms=50)
    stage.send(count=2)
    stage.metadata({0: 1})
    stage.answer(only(stage.requests(), ProduceRequest), base_offset=0)
    stage.send(count=3)
    stage.answer(only(stage.requests(), ProduceRequest), error=ErrorCode.UNKNOWN_PRODUCER_ID)
    stage.harness.advance(60)
    stage.metadata({0: 1})
    again = only(stage.requests(), ProduceRequest)
    header = verify_batch(again.batch)

    assert (header.producer_epoch, header.base_sequence) == (4, 0)
    stage.answer(again, base_offset=90)
    assert [(batch_id, offset, error) for batch_id, _, offset, error in stage.done()] == [
        (1, 0, None), (2, 90, None)]
