"""The record batch: the unit that producers encode, leaders stamp, logs store and consumers decode.

A batch is a fixed 56-byte little-endian header followed by a MessagePack payload holding the
records. The layout (offsets in bytes):

    0   base_offset         int64    stamped by the leader
    8   leader_epoch        int32    stamped by the leader
    12  crc                 uint32   CRC-32 (zlib) of bytes [16, 56 + payload_length)
    16  version             uint8    FORMAT_VERSION
    17  attributes          uint8    bit 0-2 compression (0 = none), bit 4 control batch
    18  producer_epoch      int16    -1 when the producer is not idempotent
    20  payload_length      uint32   length of the records payload
    24  producer_id         int64    -1 when the producer is not idempotent
    32  base_sequence       int32    -1 when the producer is not idempotent
    36  record_count        uint32   > 0
    40  first_timestamp_ms  int64
    48  max_timestamp_ms    int64
    56  payload: MessagePack array of records, each [timestamp_delta_ms, key, value, headers]
        (key and value are bin or nil; headers is nil or an array of [str, bin] pairs)

The CRC covers what the producer wrote and not the two fields the leader stamps, so a leader
assigns offsets by overwriting 12 bytes and never re-hashes the payload (Kafka's v2 format makes
the same choice). Records carry no offset: record i of a batch has offset base_offset + i.

Encoding and decoding are one msgspec call each over the whole payload; nothing here loops over
records in Python. Validation happens in steps, cheapest first: `parse_header` checks the
header's lengths, count and version without touching the payload; `verify_batch` adds the CRC;
`validate_producer_batch`, run by the leader on every batch a producer sends, checks that the
payload is what the header claims (Kafka's LogValidator): exactly `record_count` well-typed
records, timestamp deltas that put every record between the header's first and max timestamps
and reach the max, producer fields that agree, and no attribute a producer may not set. A header
is a claim; the payload is the truth.
"""

from __future__ import annotations

import struct
from typing import Annotated, Iterator, NamedTuple, Sequence

import msgspec

from storage.checksum import crc32
from storage.errors import BatchTooLarge, CorruptBatch, InvalidBatch, UnsupportedVersion

FORMAT_VERSION = 1
HEADER = struct.Struct("<qiIBBhIqiIqq")
HEADER_SIZE = HEADER.size  # 56
CRC_START = 16  # the CRC covers everything from the version byte to the end of the payload
STAMP = struct.Struct("<qi")
CRC_FIELD = struct.Struct("<I")  # base_offset, leader_epoch: the two fields the leader writes
COMPRESSION_MASK = 0x07
CONTROL_FLAG = 0x10

# Why these bounds: a batch must fit a ZeroMQ frame and a log segment comfortably; anything
# claiming more than this is garbage or an attack, and is refused before it is read.
BATCH_BYTES_MAX_DEFAULT = 16 * 1024 * 1024
RECORD_COUNT_MAX = 1_000_000
# The header's int32 holds a batch's first sequence number, and its last must fit too: the
# producer's next batch starts one past it. A producer whose numbers run out starts over from 0
# under its next epoch (actors/producer_sequences.py) rather than wrapping as Kafka's does.
SEQUENCE_MAX = 2**31 - 1
# A record's timestamp is its batch's first timestamp plus a delta of 0..this (~24.8 days): a
# record earlier than its batch's first, or later than this past it, needs a batch of its own.
TIMESTAMP_DELTA_MAX = 2**31 - 1

assert HEADER_SIZE == 56


# A record on the wire and in the log: (timestamp_delta_ms, key, value, headers).
RecordTuple = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]] | None]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[RecordTuple])
_timestamp_decoder = msgspec.msgpack.Decoder(list[tuple[int, msgspec.Raw, msgspec.Raw, msgspec.Raw]])
# The validating decoder: deltas are non-negative 32-bit ints, keys and values bytes or nil,
# headers [str, bytes] pairs. Bytes are decoded as views of the payload (no copy).
_TimestampDelta = Annotated[int, msgspec.Meta(ge=0, le=TIMESTAMP_DELTA_MAX)]
_validator = msgspec.msgpack.Decoder(
    list[tuple[_TimestampDelta, memoryview | None, memoryview | None, list[tuple[str, memoryview]] | None]])
PRODUCER_ATTRIBUTES = 0  # no attribute bit is a producer's to set (no compression codecs yet)


class BatchHeader(NamedTuple):
    base_offset: int
    leader_epoch: int
    crc: int
    version: int
    attributes: int
    producer_epoch: int
    payload_length: int
    producer_id: int
    base_sequence: int
    record_count: int
    first_timestamp_ms: int
    max_timestamp_ms: int

    @property
    def size(self) -> int:
        """Total bytes of the batch: header plus payload."""
        return HEADER_SIZE + self.payload_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)


def encode_batch(
    records: Sequence[RecordTuple],
    first_timestamp_ms: int,
    max_timestamp_ms: int | None = None,
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
    base_offset: int = 0,
    leader_epoch: int = -1,
) -> bytearray:
    """Encode records (already in delta form) into one batch, CRC included.

    `max_timestamp_ms` defaults to `first_timestamp_ms` plus the largest delta, which costs a
    pass over the records; producers that track it as they append should pass it.
    """
    if not records:
        raise ValueError("a batch holds at least one record")
    if max_timestamp_ms is None:
        max_timestamp_ms = first_timestamp_ms + max(record[0] for record in records)
    # One buffer, no copies: msgspec writes the payload after room left for the header.
    batch = bytearray(HEADER_SIZE)
    _encoder.encode_into(records, batch, HEADER_SIZE)
    payload_length = len(batch) - HEADER_SIZE
    HEADER.pack_into(
        batch, 0, base_offset, leader_epoch, 0, FORMAT_VERSION, attributes, producer_epoch,
        payload_length, producer_id, base_sequence, len(records), first_timestamp_ms, max_timestamp_ms,
    )
    CRC_FIELD.pack_into(batch, 12, crc32(memoryview(batch)[CRC_START:]))
    return batch


def parse_header(
    buffer: bytes | bytearray | memoryview,
    position: int = 0,
    *,
    batch_bytes_max: int = BATCH_BYTES_MAX_DEFAULT,
    available: int | None = None,
) -> BatchHeader:
    """Decode and validate a header without touching the payload.

    `available` is how many bytes from `position` the caller has (default: the rest of the
    buffer); a header whose payload would run past it raises `CorruptBatch` (a torn batch).
    """
    if available is None:
        available = len(buffer) - position
    if available < HEADER_SIZE:
        raise CorruptBatch(f"truncated header: {available} of {HEADER_SIZE} bytes")
    header = BatchHeader._make(HEADER.unpack_from(buffer, position))
    if header.version != FORMAT_VERSION:
        raise UnsupportedVersion(f"unknown batch format version {header.version}")
    if header.record_count == 0 or header.record_count > RECORD_COUNT_MAX:
        raise CorruptBatch(f"record count {header.record_count} is not in 1..{RECORD_COUNT_MAX}")
    if header.attributes & COMPRESSION_MASK:
        raise CorruptBatch(f"compression codec {header.attributes & COMPRESSION_MASK} is not supported")
    if header.base_offset < 0:
        raise CorruptBatch(f"negative base offset {header.base_offset}")
    if header.size > batch_bytes_max:
        raise BatchTooLarge(f"batch of {header.size} bytes exceeds the limit of {batch_bytes_max}")
    if header.size > available:
        raise CorruptBatch(f"truncated batch: header promises {header.size} bytes, {available} present")
    if header.max_timestamp_ms < header.first_timestamp_ms:
        raise CorruptBatch("max timestamp precedes first timestamp")
    return header


def compute_crc(buffer: bytes | bytearray | memoryview, position: int, header: BatchHeader) -> int:
    view = memoryview(buffer)[position + CRC_START: position + header.size]
    return crc32(view)


def verify_batch(
    buffer: bytes | bytearray | memoryview,
    position: int = 0,
    *,
    batch_bytes_max: int = BATCH_BYTES_MAX_DEFAULT,
    available: int | None = None,
) -> BatchHeader:
    """Validate header and CRC of the batch at `position`; return its header."""
    header = parse_header(buffer, position, batch_bytes_max=batch_bytes_max, available=available)
    actual = compute_crc(buffer, position, header)
    if actual != header.crc:
        raise CorruptBatch(f"CRC mismatch: header says {header.crc:#010x}, bytes give {actual:#010x}")
    return header


def validate_producer_batch(buffer: bytes | bytearray | memoryview, header: BatchHeader) -> None:
    """Raise InvalidBatch unless the batch (header and CRC already checked) holds exactly what
    its header says and nothing a producer may not write."""
    if header.attributes & ~PRODUCER_ATTRIBUTES:
        what = "a control batch" if header.is_control else f"attributes {header.attributes:#04x}"
        raise InvalidBatch(f"{what}: only the broker may set these attribute bits")
    if header.producer_id < 0:
        if header.producer_id != -1 or header.producer_epoch != -1 or header.base_sequence != -1:
            raise InvalidBatch("a batch without a producer id (-1) must have producer epoch and base sequence -1, "
                               f"got {header.producer_epoch} and {header.base_sequence}")
    elif header.producer_epoch < 0 or header.base_sequence < 0:
        raise InvalidBatch(f"producer {header.producer_id} sent epoch {header.producer_epoch} and base sequence "
                           f"{header.base_sequence}; both must be >= 0")
    elif header.base_sequence + header.record_count - 1 > SEQUENCE_MAX:
        raise InvalidBatch(f"producer {header.producer_id}'s sequence numbers {header.base_sequence}.."
                           f"{header.base_sequence + header.record_count - 1} run past {SEQUENCE_MAX}: "
                           "start again from 0 under the next producer epoch")
    if header.first_timestamp_ms < 0:
        raise InvalidBatch(f"first timestamp {header.first_timestamp_ms} is negative")
    payload = memoryview(buffer)[HEADER_SIZE: header.size]
    try:
        records = _validator.decode(payload)
    except Exception as error:  # noqa: BLE001 - DecodeError, ValidationError, RecursionError
        raise InvalidBatch(f"the payload is not a list of records: {str(error)[:200]}") from None
    if len(records) != header.record_count:
        raise InvalidBatch(f"the header claims {header.record_count} records, the payload holds {len(records)}")
    largest = max(record[0] for record in records)
    if header.first_timestamp_ms + largest != header.max_timestamp_ms:
        raise InvalidBatch(f"the header's max timestamp {header.max_timestamp_ms} is not the records' latest "
                           f"({header.first_timestamp_ms} + {largest})")


_PRODUCER_EPOCH = struct.Struct("<h")  # at byte 18
_PRODUCER_ID = struct.Struct("<q")  # at byte 24
_BASE_SEQUENCE = struct.Struct("<i")  # at byte 32


def renumber_into(batch: bytearray, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
    """Give an encoded producer batch another producer id, epoch and first sequence number, and
    its CRC again (the fields are the producer's, inside what the CRC covers). For a batch that was
    never appended and never will be under its old numbers (actors/producer_client.py)."""
    _PRODUCER_ID.pack_into(batch, 24, producer_id)
    _PRODUCER_EPOCH.pack_into(batch, 18, producer_epoch)
    _BASE_SEQUENCE.pack_into(batch, 32, base_sequence)
    CRC_FIELD.pack_into(batch, 12, crc32(memoryview(batch)[CRC_START:]))


def stamp(batch: bytes | bytearray, base_offset: int, leader_epoch: int) -> bytes:
    """Return the batch with base offset and leader epoch written; the CRC stays valid."""
    return STAMP.pack(base_offset, leader_epoch) + bytes(memoryview(batch)[STAMP.size:])


def stamp_into(batch: bytearray, base_offset: int, leader_epoch: int) -> None:
    """Stamp in place (no copy) when the caller owns a mutable buffer."""
    STAMP.pack_into(batch, 0, base_offset, leader_epoch)


def decode_records(batch: bytes | bytearray | memoryview, header: BatchHeader | None = None,
                   position: int = 0) -> list[RecordTuple]:
    """Decode the records of one batch in a single msgspec call (no CRC check: see verify_batch)."""
    if header is None:
        header = parse_header(batch, position)
    payload = memoryview(batch)[position + HEADER_SIZE: position + header.size]
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as error:
        raise CorruptBatch(f"records payload does not decode: {error}") from None


def record_timestamps(batch: bytes | bytearray | memoryview, header: BatchHeader) -> list[int]:
    """Each record's timestamp, in order, without copying keys, values or headers (no CRC check:
    see verify_batch)."""
    payload = memoryview(batch)[HEADER_SIZE: header.size]
    try:
        records = _timestamp_decoder.decode(payload)
    except msgspec.DecodeError as error:
        raise CorruptBatch(f"records payload does not decode: {error}") from None
    first = header.first_timestamp_ms
    return [first + record[0] for record in records]


def iter_batches(
    buffer: bytes | bytearray | memoryview,
    *,
    verify: bool = True,
    batch_bytes_max: int = BATCH_BYTES_MAX_DEFAULT,
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each whole batch in a buffer of concatenated batches.

    Raises `CorruptBatch` at the first batch that fails its checks; a caller that wants the
    valid prefix catches it and uses the last position yielded.
    """
    position = 0
    end = len(buffer)
    check = verify_batch if verify else parse_header
    while position < end:
        header = check(buffer, position, batch_bytes_max=batch_bytes_max, available=end - position)
        yield position, header
        position += header.size


def split_batches(buffer: bytes | bytearray | memoryview, *, verify: bool = True) -> list[tuple[BatchHeader, memoryview]]:
    """Split concatenated batches into (header, view) pairs, checking each."""
    view = memoryview(buffer)
    return [(header, view[position: position + header.size])
            for position, header in iter_batches(buffer, verify=verify)]
