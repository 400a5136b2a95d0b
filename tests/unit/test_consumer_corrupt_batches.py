"""An unreadable batch: a typed error naming its offset, an explicit skip, never a loop.

Given fetched bytes whose second batch is damaged (a flipped payload byte under a valid header,
records that are not records, or a header that does not parse), when a consumer reads them, then
it returns the records of the good batch before it, raises `CorruptBatchError` naming the topic,
partition and offset on every poll after that (it neither skips the batch on its own nor fetches
it again and again), and `skip_corrupt_batch` or `seek` moves past it.
"""

from __future__ import annotations

import msgspec
import pytest

from actors.consumer_client import ConsumerClient, ConsumerSettings
from actors.errors import ErrorCode, RailmqError
from actors.messages import ClientCommand, FetchRequest
from railmq.consumer import Consumer
from railmq.records import CorruptBatchError, decode_fetched, decode_fetched_prefix
from storage.batch import CRC_FIELD, CRC_START, HEADER, FORMAT_VERSION, encode_batch
from storage.checksum import crc32
from tests.unit.actor_harness import notices, only
from tests.unit.test_consumer_client import Stage

NOBODY = "tcp://127.0.0.1:9"  # the unit tests drive the consumer's notices themselves


def batch(base_offset: int, count: int) -> bytes:
    records = [(i, b"k", f"value-{base_offset + i}".encode(), None) for i in range(count)]
    return bytes(encode_batch(records, 1_000, base_offset=base_offset, leader_epoch=1))


def flipped_payload(base_offset: int, count: int) -> bytes:
    damaged = bytearray(batch(base_offset, count))
    damaged[-1] ^= 0xFF  # the header still parses; the CRC no longer matches
    return bytes(damaged)


def not_records(base_offset: int, count: int) -> bytes:
    """A batch with a valid header and CRC whose payload is a msgpack string, not records."""
    payload = msgspec.msgpack.encode("this is not a list of records")
    out = bytearray(HEADER.size + len(payload))
    HEADER.pack_into(out, 0, base_offset, 1, 0, FORMAT_VERSION, 0, -1, len(payload), -1, -1, count, 1_000, 1_000)
    out[HEADER.size:] = payload
    CRC_FIELD.pack_into(out, 12, crc32(memoryview(out)[CRC_START:]))
    return bytes(out)


def unreadable_header() -> bytes:
    return b"\x00" * 8 + b"\xff" * 60  # version byte 0xff: the header does not parse


@pytest.mark.parametrize("damage", [flipped_payload, not_records], ids=["crc", "not-records"])
def test_decoding_stops_at_the_damaged_batch_and_names_where_it_starts_and_ends(damage):
    records, corrupt = decode_fetched_prefix("orders", 2, batch(10, 3) + damage(13, 4) + batch(17, 1), 11)

    assert [record.offset for record in records] == [11, 12]
    assert isinstance(corrupt, CorruptBatchError) and isinstance(corrupt, RailmqError)
    assert (corrupt.topic, corrupt.partition, corrupt.offset, corrupt.next_offset) == ("orders", 2, 13, 17)
    assert corrupt.code == ErrorCode.CORRUPT_MESSAGE and "orders/2" in str(corrupt) and "offset 13" in str(corrupt)
    with pytest.raises(CorruptBatchError):
        decode_fetched("orders", 2, batch(10, 3) + damage(13, 4), 10)


def test_a_batch_holding_fewer_records_than_its_header_claims_is_refused():
    honest = bytearray(batch(0, 2))
    HEADER.pack_into(honest, 0, *HEADER.unpack_from(honest)[:9], 3, 1_000, 1_000)  # claims 3 records
    CRC_FIELD.pack_into(honest, 12, crc32(memoryview(honest)[CRC_START:]))

    records, corrupt = decode_fetched_prefix("orders", 0, bytes(honest), 0)

    assert records == [] and corrupt.offset == 0 and "claims 3" in corrupt.reason


def test_an_unreadable_header_names_the_offset_after_the_good_batches_and_no_next_offset():
    records, corrupt = decode_fetched_prefix("orders", 0, batch(5, 2) + unreadable_header(), 5)

    assert [record.offset for record in records] == [5, 6]
    assert (corrupt.offset, corrupt.next_offset) == (7, None)


def test_the_fetch_loop_hands_over_the_good_batches_and_holds_the_partition_at_a_bad_header():
    stage = Stage()
    first = stage.assigned_at(10)

    effects = stage.answer_fetch(first, batch(10, 3) + unreadable_header())

    [(_, _, _, handed, _, _)] = notices(effects, "records")
    assert bytes(handed) == batch(10, 3)
    [(topic, partition, session, offset, reason)] = notices(effects, "unreadable")
    assert (topic, partition, session, offset) == ("orders", 0, (0, 0), 13) and "version" in reason
    stage.harness.advance(2_000)
    assert stage.sent(FetchRequest) == [], "the unreadable batch was fetched again"

    stage.command("seek", topic="orders", partition=0, offset=20, epoch=5)
    assert only(stage.sent(FetchRequest), FetchRequest).offset == 20


def test_the_shell_can_hold_a_partition_whose_data_it_found_damaged():
    stage = Stage()
    stage.assigned_at(0)
    stage.command("hold", topic="orders", partition=0, session=[0, 0])
    stage.harness.advance(2_000)
    assert stage.sent(FetchRequest) == []
    stage.command("hold", topic="orders", partition=0, session=[9, 0])  # a stale session: ignored
    stage.command("seek", topic="orders", partition=0, offset=3, epoch=1)
    assert only(stage.sent(FetchRequest), FetchRequest).offset == 3


@pytest.fixture
def consumer():
    """A real Consumer whose I/O-thread notices the test delivers itself."""
    consumer = Consumer(NOBODY, request_timeout_ms=500, fetch_max_wait_ms=50)
    try:
        consumer.assign([("orders", 0)])
        session = consumer._sessions[("orders", 0)]
        consumer._on_notify("position", ("orders", 0, session, 10))
        yield consumer
    finally:
        consumer.close()


def deliver(consumer: Consumer, data: bytes) -> None:
    consumer._on_notify("records", ("orders", 0, consumer._sessions[("orders", 0)], data, 100, 0))


def test_poll_returns_the_good_records_then_raises_on_every_poll_until_skipped(consumer):
    deliver(consumer, batch(10, 3) + flipped_payload(13, 4))

    assert [record.offset for record in consumer.poll(200)] == [10, 11, 12]
    for _ in range(3):  # the same typed error each time: the user decides, nothing loops silently
        with pytest.raises(CorruptBatchError) as raised:
            consumer.poll(50)
        assert (raised.value.offset, raised.value.next_offset) == (13, 17)
    assert consumer.position(("orders", 0)) == 13

    assert consumer.skip_corrupt_batch(raised.value) == 17
    assert consumer.position(("orders", 0)) == 17
    deliver(consumer, batch(17, 2))
    assert [record.offset for record in consumer.poll(200)] == [17, 18]


def test_the_partition_is_held_and_its_later_data_is_not_returned_past_the_bad_batch(consumer, monkeypatch):
    submitted: list[ClientCommand] = []
    submit = consumer._engine.submit
    monkeypatch.setattr(consumer._engine, "submit", lambda command: (submitted.append(command), submit(command)))
    deliver(consumer, not_records(10, 2))
    deliver(consumer, batch(12, 2))  # fetched ahead before the shell found the damage

    with pytest.raises(CorruptBatchError):
        consumer.poll(50)
    with pytest.raises(CorruptBatchError):
        consumer.poll(50)
    holds = [command.arguments for command in submitted if command.command == "hold"]
    assert holds == [{"topic": "orders", "partition": 0, "session": list(consumer._sessions[("orders", 0)])}]

    consumer.seek(("orders", 0), 12)  # seek works as well as skip_corrupt_batch
    assert consumer.poll(50) == []


def test_an_unreadable_header_cannot_be_skipped_blindly_but_can_be_seeked_past(consumer):
    consumer._on_notify("unreadable", ("orders", 0, consumer._sessions[("orders", 0)], 10, "bad version"))

    with pytest.raises(CorruptBatchError) as raised:
        consumer.poll(50)
    assert raised.value.next_offset is None
    with pytest.raises(RailmqError, match="unreadable"):
        consumer.skip_corrupt_batch(raised.value)
    consumer.seek(("orders", 0), 11)
    assert consumer.poll(50) == []
    with pytest.raises(RailmqError, match="not held"):
        consumer.skip_corrupt_batch(("orders", 0))


def test_the_command_line_says_where_the_unreadable_batch_is_and_how_to_move_past_it():
    from railmq.member_process import corrupt_batch_sentence

    error = CorruptBatchError("orders", 1, 40, 44, "CRC mismatch")
    assert corrupt_batch_sentence(error) == ("orders/1: the batch at offset 40 cannot be read (CRC mismatch); "
                                             "read past it with -p 1 -o 44")
    sentence = corrupt_batch_sentence(error, "billing")
    assert "railmq groups reset-offsets billing --topic orders:1 --to-offset 44 --execute" in sentence
    unreadable_header = CorruptBatchError("orders", 1, 40, None, "bad version")
    assert "choose a later offset" in corrupt_batch_sentence(unreadable_header, "billing")
