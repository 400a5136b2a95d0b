"""Reading the batch that holds one offset, from the partition's leader, for the explain view.

One fetch (max_bytes=1 returns the whole first batch at or after the offset), parsed with the
storage layer's own header and record decoders; the record's key and value are shown as text,
cut at `VALUE_CHARS_MAX` characters.
"""

from __future__ import annotations

import msgspec

from actors.errors import ErrorCode, RailmqError
from actors.messages import ErrorResponse, FetchRequest
from railmq.admin import Admin
from storage.batch import decode_records, parse_header

EXPLAIN_TIMEOUT_MS = 2000
VALUE_CHARS_MAX = 200


class BatchFacts(msgspec.Struct, kw_only=True):
    base_offset: int
    last_offset: int
    record_count: int
    size_bytes: int
    crc: int
    leader_epoch: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    first_timestamp_ms: int
    max_timestamp_ms: int


class RecordFacts(msgspec.Struct, kw_only=True):
    offset: int
    timestamp_ms: int
    key: str | None = None
    value: str | None = None
    headers: int = 0
    sequence: int = -1


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    shown = bytes(raw).decode("utf-8", "backslashreplace")
    return shown if len(shown) <= VALUE_CHARS_MAX else shown[:VALUE_CHARS_MAX] + "…"


def read_batch(
    admin: Admin, leader_endpoint: str, topic: str, partition: int, offset: int
) -> tuple[BatchFacts, RecordFacts]:
    """The batch holding `offset`, from the leader (which serves only below its high watermark)."""
    reply = admin.rpc.request(
        leader_endpoint,
        FetchRequest(
            correlation_id=0, topic=topic, partition=partition, offset=offset, max_bytes=1, max_wait_ms=0
        ),
        EXPLAIN_TIMEOUT_MS,
    )
    if isinstance(reply, ErrorResponse) or reply.error != ErrorCode.NONE:
        raise RailmqError(reply.error, reply.error_message)
    data = memoryview(reply.records)
    position = 0
    while position < len(data):
        header = parse_header(data, position)
        if header.base_offset <= offset <= header.last_offset:
            records = decode_records(data, header, position)
            delta, key, value, headers = records[offset - header.base_offset]
            sequence = header.base_sequence + offset - header.base_offset if header.base_sequence >= 0 else -1
            return (
                BatchFacts(
                    base_offset=header.base_offset,
                    last_offset=header.last_offset,
                    record_count=header.record_count,
                    size_bytes=header.size,
                    crc=header.crc,
                    leader_epoch=header.leader_epoch,
                    producer_id=header.producer_id,
                    producer_epoch=header.producer_epoch,
                    base_sequence=header.base_sequence,
                    first_timestamp_ms=header.first_timestamp_ms,
                    max_timestamp_ms=header.max_timestamp_ms,
                ),
                RecordFacts(
                    offset=offset,
                    timestamp_ms=header.first_timestamp_ms + delta,
                    key=_text(key),
                    value=_text(value),
                    headers=len(headers or []),
                    sequence=sequence,
                ),
            )
        position += header.size
    raise RailmqError(ErrorCode.OFFSET_OUT_OF_RANGE, f"the leader returned no batch holding offset {offset}")
