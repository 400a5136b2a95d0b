"""One process, both ends: records, wrap-around, backpressure, checks, re-attaching, closing."""

from __future__ import annotations

import array
import mmap
import struct

import pytest

from transport.ring import (
    HEADER_BYTES,
    RECORD_HEADER_BYTES,
    PeerGone,
    RecordTooLarge,
    RingBusy,
    RingClosed,
    RingCorrupt,
    RingReader,
    RingWriter,
    record_footprint,
    unlink_orphaned_rings,
)
from transport.shm import ProcessIdentity, attach_segment, create_segment, current_process_identity

WRITE_POSITION_OFFSET = 8 * 8
READ_POSITION_OFFSET = 16 * 8
READER_PID_OFFSET = 17 * 8
WORD = struct.Struct("<Q")


@pytest.fixture
def ring(ring_name):
    writer = RingWriter.create(ring_name, 256)
    reader = RingReader.attach(ring_name)
    try:
        yield writer, reader
    finally:
        reader.close()
        writer.close()
        writer.unlink()


def _poke(name: str, offset: int, data: bytes) -> None:
    segment = attach_segment(name)
    try:
        segment.buf[offset:offset + len(data)] = data
    finally:
        segment.close()


def _peek(name: str, offset: int, size: int) -> bytes:
    segment = attach_segment(name)
    try:
        return bytes(segment.buf[offset:offset + size])
    finally:
        segment.close()


def test_a_record_written_from_several_buffers_is_read_as_one(ring):
    writer, reader = ring
    header, body = b"HEAD", memoryview(b"the body of the record")
    numbers = array.array("I", [1, 2, 3])

    assert writer.try_write(header, body, numbers)
    record = reader.try_read()

    assert bytes(record) == b"HEAD" + b"the body of the record" + numbers.tobytes()
    assert reader.try_read() is None


def test_an_empty_record_is_a_record(ring):
    writer, reader = ring
    assert writer.try_write()
    assert bytes(reader.try_read()) == b""
    assert reader.try_read() is None


def test_records_wrap_around_the_end_of_the_data_area_intact(ring):
    writer, reader = ring
    for index in range(200):  # many laps of a 256-byte ring, every split point of header and payload
        payload = bytes([index % 256]) * (index * 13 % 150)
        assert writer.try_write(payload[:5], payload[5:])
        assert bytes(reader.try_read()) == payload
        reader.release()
    assert writer.used_bytes == 0


def test_a_contiguous_record_is_a_view_into_the_ring_not_a_copy(ring):
    writer, reader = ring
    writer.try_write(b"abc")
    assert isinstance(reader.try_read().obj, mmap.mmap)


def test_only_a_record_that_wraps_is_joined_into_a_private_buffer(ring):
    writer, reader = ring
    writer.try_write(b"a" * 200)  # 224 bytes: the next record starts 32 bytes before the end
    reader.try_read()
    reader.release()
    writer.try_write(b"wrapped payload")
    record = reader.try_read()
    assert isinstance(record.obj, bytes)
    assert bytes(record) == b"wrapped payload"


def test_a_full_ring_refuses_the_write_and_keeps_unread_bytes(ring):
    writer, reader = ring
    payload = b"x" * (record_footprint(0) + 16)
    written = 0
    while writer.try_write(payload, bytes([written])):
        written += 1

    assert writer.free_bytes < record_footprint(len(payload) + 1)
    assert writer.stats.full_refusals == 1
    for index in range(written):
        assert bytes(reader.try_read()) == payload + bytes([index])
    assert reader.try_read() is None
    assert not writer.try_write(payload, b"!")  # read but not released: still reserved

    reader.release()
    assert writer.free_bytes == writer.capacity_bytes
    assert writer.try_write(payload, b"!")


def test_used_and_free_bytes_count_headers_and_padding(ring):
    writer, reader = ring
    writer.try_write(b"12345")
    assert writer.used_bytes == reader.used_bytes == record_footprint(5) == 32
    assert writer.free_bytes == 256 - 32


def test_a_record_larger_than_the_ring_is_refused_with_a_typed_error(ring):
    writer, reader = ring
    with pytest.raises(RecordTooLarge) as refused:
        writer.try_write(b"x" * (writer.record_bytes_max - 10), b"y" * 11)
    assert refused.value.record_bytes_max == 256 - RECORD_HEADER_BYTES

    assert writer.try_write(b"z" * writer.record_bytes_max)  # exactly the maximum fits an empty ring
    assert len(reader.try_read()) == writer.record_bytes_max


def test_a_released_view_cannot_be_used(ring):
    writer, reader = ring
    writer.try_write(b"abc")
    record = reader.try_read()
    reader.release()
    with pytest.raises(ValueError):
        bytes(record)


def test_a_flipped_payload_byte_is_detected(ring, ring_name):
    writer, reader = ring
    writer.try_write(b"payload bytes")
    _poke(ring_name, HEADER_BYTES + RECORD_HEADER_BYTES + 3, b"X")
    with pytest.raises(RingCorrupt, match="payload CRC"):
        reader.try_read()


def test_a_flipped_header_byte_is_detected_even_without_payload_crc(segments):
    name = segments.name("no-crc")
    with RingWriter.create(name, 256, payload_crc=False) as writer, RingReader.attach(name) as reader:
        writer.try_write(b"payload bytes")
        _poke(name, HEADER_BYTES + 1, b"\x7f")  # the length field
        with pytest.raises(RingCorrupt, match="header"):
            reader.try_read()


def test_a_stale_record_from_an_earlier_lap_is_detected(ring, ring_name):
    writer, reader = ring
    for _ in range(8):  # one full lap of 32-byte records
        writer.try_write(b"lap one!")
    while reader.try_read() is not None:
        pass
    reader.release()
    # A writer that published without writing: position 256 now covers lap one's first record.
    _poke(ring_name, WRITE_POSITION_OFFSET, WORD.pack(256 + 32))
    with pytest.raises(RingCorrupt, match="stale"):
        reader.try_read()


def test_a_write_position_beyond_a_lap_ahead_is_detected(ring, ring_name):
    writer, reader = ring
    _poke(ring_name, WRITE_POSITION_OFFSET, WORD.pack(10_000))
    with pytest.raises(RingCorrupt):
        reader.try_read()


def test_a_read_position_ahead_of_the_writer_is_detected(ring, ring_name):
    writer, reader = ring
    _poke(ring_name, READ_POSITION_OFFSET, WORD.pack(64))
    with pytest.raises(RingCorrupt):
        writer.try_write(b"x")


def test_a_segment_that_is_not_a_ring_is_refused(segments):
    name = segments.name("not-a-ring")
    create_segment(name, 4096).close()
    with pytest.raises(RingCorrupt):
        RingReader.attach(name)
    assert segments.existing() == [name]  # attaching never unlinks


def test_capacity_must_be_aligned_and_bounded(ring_name):
    for capacity in (100, 8, 1 << 31):
        with pytest.raises(ValueError):
            RingWriter.create(ring_name, capacity)


def test_an_end_held_by_a_live_process_cannot_be_taken(ring, ring_name):
    with pytest.raises(RingBusy):
        RingReader.attach(ring_name)
    with pytest.raises(RingBusy):
        RingWriter.attach(ring_name)


def test_a_reattached_reader_gets_unreleased_records_again(ring, ring_name):
    writer, reader = ring
    for index in range(3):
        writer.try_write(bytes([index]))
    reader.try_read()
    reader.release()
    reader.try_read()  # read, never released
    reader.close()

    with RingReader.attach(ring_name) as again:
        assert bytes(again.try_read()) == b"\x01"
        assert bytes(again.try_read()) == b"\x02"
        assert again.try_read() is None


def test_a_reattached_writer_carries_on_after_the_last_published_record(ring, ring_name):
    writer, reader = ring
    writer.try_write(b"first")
    writer.close()
    with RingWriter.attach(ring_name) as again:
        again.try_write(b"second")
    assert [bytes(reader.try_read()), bytes(reader.try_read())] == [b"first", b"second"]


def test_a_closed_writer_lets_the_reader_drain_then_says_closed(ring):
    writer, reader = ring
    writer.try_write(b"last words")
    writer.close()
    assert bytes(reader.read(timeout_ms=1000)) == b"last words"
    with pytest.raises(RingClosed):
        reader.read(timeout_ms=1000)


def test_a_dead_peer_recorded_in_the_header_is_reported(ring, ring_name):
    writer, reader = ring
    writer.try_write(b"x" * writer.record_bytes_max)
    _poke(ring_name, READER_PID_OFFSET, WORD.pack(2**22 + 12345))  # beyond any pid_max: not running
    with pytest.raises(PeerGone) as gone:
        writer.write(b"y", timeout_ms=1000)
    assert gone.value.role == "reader"


def test_leaving_the_with_block_unlinks_only_for_the_creator(segments):
    name = segments.name()
    with RingWriter.create(name, 256):
        with RingReader.attach(name):
            pass
        assert segments.existing() == [name]
    assert segments.existing() == []


def test_replace_recreates_over_a_leftover(segments):
    name = segments.name()
    create_segment(name, 4096).close()
    with pytest.raises(FileExistsError):
        RingWriter.create(name, 256)
    with RingWriter.create(name, 256, replace=True) as writer:
        assert writer.capacity_bytes == 256


def test_orphaned_rings_are_unlinked_and_live_ones_kept(segments):
    orphan, live, other = segments.name("orphan"), segments.name("live"), segments.name("other")
    RingWriter.create(orphan, 256).close()
    _poke(orphan, 9 * 8, WORD.pack(2**22 + 12345))  # its writer "died" (pid beyond pid_max)
    create_segment(other, 4096).close()
    with RingWriter.create(live, 256):
        assert unlink_orphaned_rings(segments.prefix) == [orphan]
        assert segments.existing() == sorted([live, other])


def test_the_header_records_who_holds_each_end(ring, ring_name):
    me = current_process_identity()
    for pid_offset in (9 * 8, READER_PID_OFFSET):
        assert ProcessIdentity(*struct.unpack("<QQ", _peek(ring_name, pid_offset, 16))) == me
