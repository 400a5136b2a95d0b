"""What a consumer gets back: `ConsumerRecord`, decoded from whole batches in one msgspec call.

A fetch returns whole batches starting at the batch that holds the requested offset, so the
first batch can begin before the position: `decode_fetched` skips those records. Each batch's
CRC is checked before its records are decoded (Kafka's check.crcs), unless the caller opts out,
and a batch must hold exactly the `record_count` records its header claims.

A batch that fails any of these checks is never half-read: `decode_fetched_prefix` returns the
records of the good batches before it and a `CorruptBatchError` naming the partition and the
offset where the bad batch starts (and, when its header is readable, where the next one
starts), so a consumer can report it and let its user skip it on purpose.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import msgspec

from actors.errors import ErrorCode, RailmqError
from actors.messages import INT64_MAX
from storage.batch import HEADER_SIZE, RecordTuple, compute_crc, parse_header
from storage.errors import StorageError


class TopicPartition(NamedTuple):
    topic: str
    partition: int


def topic_names(topics: Any) -> list[str]:
    """A subscription's topics, sorted: an iterable of str names, never a str itself (whose letters
    would each be taken for a topic) nor a name of another type (sent on as its repr, or not at all)."""
    if isinstance(topics, (str, bytes, bytearray)):
        raise TypeError(f"subscribe to a list of topic names, not one {type(topics).__name__} {topics!r:.80}")
    names = list(topics)
    for name in names:
        if name.__class__ is not str:
            raise TypeError(f"a topic name is a str, not {type(name).__name__}")
    return sorted(set(names))


def partition_of(value: Any) -> TopicPartition:
    """A TopicPartition from one, or from a (str topic, int partition) pair; anything else is a
    TypeError, never coerced (a topic None became "None", a partition 0.5 became 0)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"a partition is a TopicPartition or a (topic, partition) pair, not {value!r:.80}")
    topic, partition = value
    if topic.__class__ is not str:
        raise TypeError(f"a topic name is a str, not {type(topic).__name__}")
    return TopicPartition(topic, integer(partition, "partition numbers"))


def integer(value: Any, what: str) -> int:
    """`value` as an int if it is one (a bool, a float or a str is not), else a TypeError naming `what`."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{what} are ints, not {type(value).__name__}")


class ConsumerRecord(msgspec.Struct, array_like=True, gc=False):
    """One record. The first four fields are the wire layout of a record inside a batch."""

    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None
    topic: str = ""
    partition: int = -1
    offset: int = -1
    # The id of the topic it was read from (0: not known). A topic deleted and made again under
    # its name numbers its records from 0 again: topic, partition and offset name two records then.
    topic_id: int = 0

    @property
    def text(self) -> str | None:
        """The value as UTF-8 text (None for a null value); raises on non-UTF-8 bytes."""
        return None if self.value is None else self.value.decode("utf-8")


class CorruptBatchError(RailmqError):
    """A fetched batch that cannot be read: its header, CRC or records do not check out.

    `offset` is where the bad batch starts; `next_offset` is where the batch after it starts,
    or None when the header itself is unreadable (then nobody knows how long the batch is).
    A consumer raises this from every `poll` until its user moves the partition's position:
    `Consumer.skip_corrupt_batch(error)` seeks to `next_offset`, `Consumer.seek` anywhere else.
    """

    def __init__(self, topic: str, partition: int, offset: int, next_offset: int | None, reason: str) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        self.next_offset, self.reason = next_offset, reason
        if next_offset is not None:
            way_out = (f"skip it with consumer.skip_corrupt_batch(error) or "
                       f"consumer.seek(({topic!r}, {partition}), {next_offset})")
        else:
            way_out = "its header is unreadable, so seek past it to an offset you choose"
        super().__init__(ErrorCode.CORRUPT_MESSAGE,
                         f"{topic}/{partition}: the batch at offset {offset} cannot be read ({reason}); {way_out}")

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


_records_decoder = msgspec.msgpack.Decoder(list[RecordTuple])


def decode_fetched_prefix(topic: str, partition: int, batches: bytes | memoryview, position: int,
                          *, check_crcs: bool = True, topic_id: int = 0,
                          ) -> tuple[list[ConsumerRecord], CorruptBatchError | None]:
    """Records at or after `position` from concatenated whole batches, up to the first batch that
    does not check out, and the error naming that batch (None when every batch was good)."""
    view = memoryview(batches)
    out: list[ConsumerRecord] = []
    start, end, expected = 0, len(view), position
    while start < end:
        try:
            header = parse_header(view, start, available=end - start)
        except StorageError as error:
            return out, CorruptBatchError(topic, partition, max(expected, position), None, str(error))
        try:
            if check_crcs and compute_crc(view, start, header) != header.crc:
                raise StorageError(f"CRC mismatch: the header says {header.crc:#010x}, the bytes give "
                                   f"{compute_crc(view, start, header):#010x}")
            tuples = None
            if header.next_offset > position and not header.is_control:
                tuples = _records_decoder.decode(view[start + HEADER_SIZE: start + header.size])
                if len(tuples) != header.record_count:
                    raise StorageError(f"it holds {len(tuples)} records, its header claims {header.record_count}")
        except (StorageError, msgspec.DecodeError) as error:
            return out, CorruptBatchError(topic, partition, header.base_offset, header.next_offset, str(error))
        if tuples is not None:
            # Decoding to tuples and building the records in one comprehension is the cheapest way
            # to give each record its offset and absolute timestamp (~0.35 us a record).
            first = header.first_timestamp_ms
            skip = max(0, position - header.base_offset)
            out.extend([ConsumerRecord(delta + first, key, value, headers, topic, partition, offset, topic_id)
                        for offset, (delta, key, value, headers) in enumerate(tuples[skip:] if skip else tuples,
                                                                             header.base_offset + skip)])
        expected = header.next_offset
        start += header.size
    return out, None


def decode_fetched(topic: str, partition: int, batches: bytes | memoryview, position: int,
                   *, check_crcs: bool = True) -> list[ConsumerRecord]:
    """Records at or after `position` from concatenated whole batches; `CorruptBatchError` at
    the first batch that does not check out."""
    records, corrupt = decode_fetched_prefix(topic, partition, batches, position, check_crcs=check_crcs)
    if corrupt is not None:
        raise corrupt
    return records


def checked_int64(value: Any, what: str) -> int:
    """An offset or a timestamp as the protocol carries it: an int64, never negative."""
    value = integer(value, what)
    if not 0 <= value <= INT64_MAX:
        raise ValueError(f"{what} are 0 to {INT64_MAX} (an int64), got {value}")
    return value


def checked_offsets(offsets: dict[Any, int] | None) -> dict[TopicPartition, int] | None:
    """A commit's offsets by partition, each checked (None: the consumer's positions)."""
    return None if offsets is None else {
        partition_of(key): checked_int64(offset, "offsets") for key, offset in offsets.items()}
