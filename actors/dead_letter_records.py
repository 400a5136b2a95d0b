"""Dead-letter records: what a share group's dead-letter writer puts in the dead-letter topic.

The format other tools rely on (`railmq dlq`, the classic group's retry policy, `railmq.dlq`): a
dead-letter record keeps the source record's key and value, is stamped with the time it was
dead-lettered, and carries `railmq.dlq.*` headers (UTF-8 values) before the source record's own
headers. `DeadLetterItem` is one record on its way there (actors/share_partition.py makes them,
actors/share_dead_letters.py writes them). Pure: no clock, no I/O.
"""

from __future__ import annotations

import msgspec

from storage.batch import RecordTuple, decode_records, encode_batch, iter_batches


class DeadLetterItem(msgspec.Struct, array_like=True, frozen=True):
    """One record on its way to the dead-letter topic: what its `railmq.dlq.*` headers will say."""

    group_id: str
    topic: str
    partition: int
    offset: int
    reason: str
    attempts: int
    last_error: str
    first_delivery_ms: int
    dead_lettered_ms: int

    @property
    def source(self) -> tuple[str, str, int, int]:
        return self.group_id, self.topic, self.partition, self.offset


HEADER_PREFIX = "railmq.dlq."
# A dead letter is its source record plus the ten railmq.dlq.* headers: their names (~250
# bytes), seven numbers, the reason, a topic name (<= 234), the last error (<= 1000 characters,
# <= 4000 bytes) and the group id. A dead-letter topic takes batches this much larger than its
# source's, or a record near the source's batch_bytes_max could never be dead-lettered
# (MESSAGE_TOO_LARGE, and its consumer never got past it). The group id is the only part without
# a bound of its own: this leaves it some 60 KiB.
DEAD_LETTER_HEADERS_BYTES_MAX = 64 * 1024
# What one record costs in a batch beyond its key, value and headers' bytes (its length, delta,
# the msgpack framing of the tuple and of each field), and each header beyond its name and value:
# generous upper bounds, so a write cut by `dead_letter_bytes` always fits.
RECORD_FRAMING_BYTES = 32
HEADER_FRAMING_BYTES = 12


def dead_letter_headers(item: DeadLetterItem, source_timestamp_ms: int) -> list[tuple[str, bytes]]:
    fields = [("source_topic", item.topic), ("source_partition", item.partition), ("source_offset", item.offset),
              ("group", item.group_id), ("attempts", item.attempts), ("reason", item.reason),
              ("last_error", item.last_error), ("source_timestamp_ms", source_timestamp_ms),
              ("first_delivery_ms", item.first_delivery_ms), ("dead_lettered_ms", item.dead_lettered_ms)]
    return [(HEADER_PREFIX + name, str(value).encode("utf-8")) for name, value in fields]


# A source record as the dead-letter writer needs it: timestamp_ms, key, value, headers.
SourceRecord = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]] | None]


def source_records(batches: bytes | memoryview, wanted: set[int]) -> dict[int, SourceRecord]:
    """The wanted offsets' records from fetched whole batches, each batch's CRC checked first
    (raises storage.errors.CorruptBatch)."""
    found: dict[int, SourceRecord] = {}
    for position, header in iter_batches(batches):
        if header.is_control or not any(header.base_offset <= offset <= header.last_offset for offset in wanted):
            continue
        for index, (delta, key, value, headers) in enumerate(decode_records(batches, header, position)):
            if header.base_offset + index in wanted:
                found[header.base_offset + index] = (header.first_timestamp_ms + delta, key, value, headers)
    return found


def dead_letter_bytes(item: DeadLetterItem, record: SourceRecord | None) -> int:
    """At most what `item`'s dead letter adds to a batch (`record`: its source record; None or
    no key and value: gone)."""
    timestamp_ms, key, value, headers = record or (-1, None, None, None)
    every_header = dead_letter_headers(item, timestamp_ms) + list(headers or [])
    header_bytes = sum(HEADER_FRAMING_BYTES + len(name.encode("utf-8")) + len(data)
                       for name, data in every_header)
    return RECORD_FRAMING_BYTES + len(key or b"") + len(value or b"") + header_bytes


def dead_letter_batch(items: list[DeadLetterItem], found: dict[int, SourceRecord], *, producer_id: int,
                      producer_epoch: int, base_sequence: int) -> bytes:
    """One idempotent batch of dead-letter records, in `items` order. A source record that is gone
    (retention) is written with no key and no value, so a re-sent batch keeps its record count."""
    first_timestamp_ms = min(item.dead_lettered_ms for item in items)
    records: list[RecordTuple] = []
    for item in items:
        timestamp_ms, key, value, headers = found.get(item.offset, (-1, None, None, None))
        records.append((item.dead_lettered_ms - first_timestamp_ms, key, value,
                        dead_letter_headers(item, timestamp_ms) + list(headers or [])))
    return bytes(encode_batch(records, first_timestamp_ms, producer_id=producer_id, producer_epoch=producer_epoch,
                              base_sequence=base_sequence))
