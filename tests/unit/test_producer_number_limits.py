"""An idempotent producer's numbers at their limits: sequence numbers are the batch header's int32
and producer epochs its int16 (storage/batch.py), and both only grow while a producer lives.

The state is set just below each limit rather than reached by billions of records. The producer
runs in the harness (tests/unit/test_producer_client.py's stage); a `ProducerStateTable` plays the
leader's rule for producers (actors/producer_state.py), so what the producer sends is also what a
leader takes.
"""

from __future__ import annotations

from actors.client_secrets import ProducerSecrets
from actors.errors import ErrorCode
from actors.messages import InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse
from actors.producer_sequences import PRODUCER_EPOCH_MAX, SEQUENCE_MAX
from actors.producer_state import ProducerStateTable
from storage.batch import verify_batch
from tests.unit.actor_harness import only
from tests.unit.test_producer_client import BOOTSTRAP, PRODUCER, idempotent_stage
from tests.unit.test_partition_replica import Stage as LeaderStage
from tests.unit.test_partition_replica import batch as leader_batch

KEY = ("orders", 0)
SECRETS = ProducerSecrets()


class Leader:
    """Answers produce requests as a leader would, by the producer-state rule."""

    def __init__(self, stage, *, appended_sequences: int = 0) -> None:
        """`appended_sequences`: records of producer 900 (epoch 3) the leader already holds."""
        self.stage = stage
        self.table = ProducerStateTable(producers_max=100)
        self.end = appended_sequences
        self.headers = []
        if appended_sequences:
            self.table.record(900, 3, 0, appended_sequences, 0, base_offset=0)

    def answer_all(self) -> None:
        for request in self.stage.requests():
            header = verify_batch(request.batch)
            self.headers.append(header)
            verdict = self.table.check(header.producer_id, header.producer_epoch, header.base_sequence,
                                       header.record_count, header.crc)
            if verdict.error:
                self.stage.answer(request, error=verdict.error)
                continue
            self.table.record(header.producer_id, header.producer_epoch, header.base_sequence,
                              header.record_count, header.crc, self.end)
            self.stage.answer(request, base_offset=self.end)
            self.end += header.record_count


def test_sequence_numbers_that_would_pass_int32_start_over_under_the_next_epoch():
    """A producer numbers each partition's records from 0 and the header holds the first one as an
    int32. Before, past 2**31 - 1 records to one partition the next batch's numbers ran past it
    (the leader took a batch numbered 2**31 - 1..2**31, expecting 2**31 next), and the batch after
    could not be encoded: it failed INVALID_RECORD ("the batch cannot be encoded"), and so did
    every later batch to the partition, for good. Now the numbering starts over from 0 under the
    partition's next epoch, as behind a gap, once the batches numbered before are settled."""
    stage = idempotent_stage(retry_backoff_ms=50)
    leader = Leader(stage, appended_sequences=SEQUENCE_MAX - 2)  # 2**31 - 3 records sent already
    stage.producer.sequences.next_sequence[KEY] = SEQUENCE_MAX - 2
    stage.send(count=2)  # SEQUENCE_MAX - 2 .. SEQUENCE_MAX - 1
    stage.metadata({0: 1})
    stage.send(count=2)  # would be SEQUENCE_MAX .. SEQUENCE_MAX + 1
    stage.send(count=1)
    for _ in range(4):
        leader.answer_all()
        stage.harness.advance(60)
        stage.metadata({0: 1})

    assert [error for _, _, _, error in stage.done()] == [None, None, None], stage.done()
    numbers = [(h.producer_epoch, h.base_sequence, h.base_sequence + h.record_count - 1)
               for h in leader.headers]
    assert numbers == [(3, SEQUENCE_MAX - 2, SEQUENCE_MAX - 1), (4, 0, 1), (4, 2, 2)], numbers


def test_a_batch_filling_the_sequence_numbers_exactly_keeps_its_epoch():
    stage = idempotent_stage()
    leader = Leader(stage, appended_sequences=SEQUENCE_MAX - 1)
    stage.producer.sequences.next_sequence[KEY] = SEQUENCE_MAX - 1
    stage.send(count=2)  # SEQUENCE_MAX - 1 .. SEQUENCE_MAX: the last numbers there are
    stage.metadata({0: 1})
    leader.answer_all()

    assert [(h.producer_epoch, h.base_sequence) for h in leader.headers] == [(3, SEQUENCE_MAX - 1)]
    assert [error for _, _, _, error in stage.done()] == [None]


def test_a_leader_refuses_a_batch_whose_sequence_numbers_run_past_int32():
    """The next batch of the producer would have to start at 2**31, which no header holds: the
    leader refuses such a batch (INVALID_RECORD) instead of expecting a number nobody can send."""
    stage = LeaderStage()
    stage.produce(leader_batch(2, producer_id=77, producer_epoch=0, base_sequence=0))
    stage.replica.producers.record(77, 0, 2, SEQUENCE_MAX - 2, 0, base_offset=2)  # as if 2**31 - 1 were held
    crossing = leader_batch(2, producer_id=77, producer_epoch=0, base_sequence=SEQUENCE_MAX)

    response = only(stage.produce(crossing), ProduceResponse)

    assert response.error == ErrorCode.INVALID_RECORD, response
    assert "sequence" in response.error_message
    assert stage.log.log_end_offset == 2


def test_a_partition_whose_producer_epochs_are_spent_goes_on_under_a_new_producer_id():
    """Each batch that ends undelivered (a full disk, an invalid timestamp, a delivery timeout)
    makes the partition start over under its next producer epoch, an int16. Before, once 32,767
    had been used the producer could not start over: every later batch to that partition waited
    until its delivery timeout and failed REQUEST_TIMED_OUT, for good (until the producer was made
    again). Now it asks for a new producer id, and the partition goes on under it from epoch 0 and
    sequence 0 (Kafka's producer likewise takes a new id once an epoch would overflow, KIP-360),
    carrying the new id's secret; the other partitions keep their id."""
    stage = idempotent_stage(retry_backoff_ms=50)
    stage.producer.sequences.epochs[KEY] = PRODUCER_EPOCH_MAX
    stage.send(count=2)
    stage.metadata({0: 1, 1: 1})
    stage.answer(only(stage.requests(), ProduceRequest), error=ErrorCode.DISK_FULL)  # undelivered: a gap
    stage.send(count=1)
    stage.send(count=1, partition=1)
    stage.harness.advance(60)
    stage.metadata({0: 1, 1: 1})

    asked = stage.harness.take(BOOTSTRAP, InitProducerIdRequest)  # at once, and again by the chase
    assert asked, "no new producer id asked for: the partition's batches wait for their delivery timeout"
    init = asked[-1]
    stage.harness.deliver(PRODUCER, InitProducerIdResponse(
        correlation_id=init.correlation_id, producer_id=901, producer_epoch=0,
        producer_secret=SECRETS.of(901)), BOOTSTRAP)
    requests = stage.requests()

    by_partition = {request.partition: request for request in requests}
    moved = verify_batch(by_partition[0].batch)
    assert (moved.producer_id, moved.producer_epoch, moved.base_sequence) == (901, 0, 0)
    assert by_partition[0].producer_secret == SECRETS.of(901)
    kept = verify_batch(by_partition[1].batch)
    assert (kept.producer_id, kept.producer_epoch, kept.base_sequence) == (900, 3, 0)
    for request in requests:
        stage.answer(request, base_offset=5)
    outcomes = {batch_id: error for batch_id, _, _, error in stage.done()}
    assert outcomes[1] is not None and outcomes[1].code == ErrorCode.DISK_FULL
    assert (outcomes[2], outcomes[3]) == (None, None), outcomes
