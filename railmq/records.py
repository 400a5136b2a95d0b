"""What a consumer gets back: `ConsumerRecord`, decoded from whole batches in one msgspec call.

A fetch returns whole batches starting at the batch that holds the requested offset, so the
first batch can begin before the position: `decode_fetched` skips those records. Each batch's
CRC is checked before its records are decoded (Kafka's check.crcs), unless the caller opts out.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from storage.batch import HEADER_SIZE, RecordTuple, iter_batches


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class ConsumerRecord(msgspec.Struct, array_like=True, gc=False):
    """One record. The first four fields are the wire layout of a record inside a batch."""

    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None
    topic: str = ""
    partition: int = -1
    offset: int = -1

    @property
    def text(self) -> str | None:
        """The value as UTF-8 text (None for a null value); raises on non-UTF-8 bytes."""
        return None if self.value is None else self.value.decode("utf-8")


_records_decoder = msgspec.msgpack.Decoder(list[RecordTuple])


def decode_fetched(topic: str, partition: int, batches: bytes | memoryview, position: int,
                   *, check_crcs: bool = True) -> list[ConsumerRecord]:
    """Records at or after `position` from concatenated whole batches."""
    view = memoryview(batches)
    out: list[ConsumerRecord] = []
    for start, header in iter_batches(view, verify=check_crcs):
        if header.next_offset <= position or header.is_control:
            continue
        # Decoding to tuples and building the records in one comprehension is the cheapest way
        # to give each record its offset and absolute timestamp (~0.35 us a record).
        tuples = _records_decoder.decode(view[start + HEADER_SIZE: start + header.size])
        first = header.first_timestamp_ms
        skip = max(0, position - header.base_offset)
        out.extend([ConsumerRecord(delta + first, key, value, headers, topic, partition, offset)
                    for offset, (delta, key, value, headers) in enumerate(tuples[skip:] if skip else tuples,
                                                                         header.base_offset + skip)])
    return out
