"""A header is a claim, the payload is the truth: what a leader refuses from a producer
(storage/batch.py `validate_producer_batch`, run by `PartitionLog.append_producer_batch`).

Every forged batch here has a correct CRC — an attacker computes it as easily as a producer —
so only the content checks stand between it and the log.
"""

from __future__ import annotations

import msgspec
import pytest

from storage.batch import (CONTROL_FLAG, CRC_FIELD, CRC_START, HEADER, HEADER_SIZE, encode_batch, parse_header,
                           validate_producer_batch)
from storage.checksum import crc32
from storage.errors import CorruptBatch, InvalidBatch
from storage.log import LogConfig
from storage.memory import open_memory_log

FIELDS = ("base_offset", "leader_epoch", "crc", "version", "attributes", "producer_epoch", "payload_length",
          "producer_id", "base_sequence", "record_count", "first_timestamp_ms", "max_timestamp_ms")


def records(count: int) -> list:
    return [(index, f"k{index}".encode(), f"value-{index}".encode(), None) for index in range(count)]


def forge(batch: bytes | bytearray, payload: bytes | None = None, **header_fields) -> bytes:
    """Rewrite header fields (and optionally the payload), then give it a valid CRC."""
    header = parse_header(batch)._asdict()
    body = bytes(batch[HEADER_SIZE:]) if payload is None else payload
    header.update(header_fields)
    header["payload_length"] = header_fields.get("payload_length", len(body))
    forged = bytearray(HEADER.pack(*(header[name] for name in FIELDS)) + body)
    CRC_FIELD.pack_into(forged, 12, crc32(memoryview(forged)[CRC_START:]))
    return bytes(forged)


def append(batch: bytes):
    log = open_memory_log(LogConfig())
    try:
        return log.append_producer_batch(batch, 1, 0)
    finally:
        assert log.log_end_offset in (0, parse_header(batch).record_count)


def refused(batch: bytes, match: str) -> None:
    log = open_memory_log(LogConfig())
    with pytest.raises(InvalidBatch, match=match):
        log.append_producer_batch(batch, 1, 0)
    assert log.log_end_offset == 0, "nothing of a refused batch may be written"


def test_an_honest_batch_is_accepted():
    result = append(bytes(encode_batch(records(3), 1_000)))

    assert (result.base_offset, result.last_offset) == (0, 2)


def test_a_header_claiming_fewer_records_than_the_payload_holds_is_refused():
    refused(forge(encode_batch(records(3), 1_000), record_count=1), "claims 1 records, the payload holds 3")


def test_a_header_claiming_more_records_than_the_payload_holds_is_refused():
    refused(forge(encode_batch(records(1), 1_000), record_count=50), "claims 50 records, the payload holds 1")


@pytest.mark.parametrize("payload", [
    msgspec.msgpack.encode("not records"),
    msgspec.msgpack.encode([[0, "key-as-str", b"v", None]]),
    msgspec.msgpack.encode([[0, b"k", b"v"]]),
    msgspec.msgpack.encode([[-5, b"k", b"v", None]]),
    msgspec.msgpack.encode([[0, b"k", b"v", [["h", 7]]]]),
    msgspec.msgpack.encode([[0, b"k", b"v", None]]) + b"\x00",
    b"\x91" * 5000 + b"\xc0",
], ids=["a-string", "str-key", "three-fields", "negative-delta", "int-header-value", "trailing-byte", "deep"])
def test_a_payload_that_is_not_well_typed_records_is_refused(payload):
    batch = forge(encode_batch(records(1), 1_000), payload=payload, record_count=1)

    refused(batch, "payload")


def test_a_control_batch_from_a_producer_is_refused():
    refused(forge(encode_batch(records(2), 1_000), attributes=CONTROL_FLAG), "control batch")


def test_unknown_attribute_bits_are_refused():
    refused(forge(encode_batch(records(2), 1_000), attributes=0x40), "attributes")


@pytest.mark.parametrize("fields, match", [
    ({"producer_id": -1, "producer_epoch": 0, "base_sequence": -1}, "must have producer epoch"),
    ({"producer_id": -7}, "must have producer epoch"),
    ({"producer_id": 5, "producer_epoch": -1, "base_sequence": 0}, "must be >= 0"),
    ({"producer_id": 5, "producer_epoch": 0, "base_sequence": -3}, "must be >= 0"),
])
def test_producer_fields_that_disagree_are_refused(fields, match):
    refused(forge(encode_batch(records(2), 1_000), **fields), match)


def test_a_max_timestamp_the_records_do_not_reach_is_refused():
    refused(forge(encode_batch(records(3), 1_000), max_timestamp_ms=9_999), "max timestamp")


def test_a_negative_first_timestamp_is_refused():
    batch = encode_batch(records(3), 1_000)
    refused(forge(batch, first_timestamp_ms=-10, max_timestamp_ms=-8), "negative")


def test_a_crc_mismatch_is_still_corruption_not_an_invalid_record():
    batch = bytearray(encode_batch(records(2), 1_000))
    batch[-1] ^= 0xFF

    with pytest.raises(CorruptBatch):
        open_memory_log(LogConfig()).append_producer_batch(bytes(batch), 1, 0)


def test_validation_reads_the_payload_in_place():
    batch = encode_batch(records(4), 1_000)
    view = memoryview(batch)

    validate_producer_batch(view, parse_header(view))  # no copy, no exception
