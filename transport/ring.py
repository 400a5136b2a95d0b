"""A bounded single-producer single-consumer byte ring in shared memory, with a ZeroMQ doorbell.

Co-located actors hand bulk bytes (record batches) to each other through a ring instead of
copying them through a socket; ZeroMQ carries only a tiny doorbell message (transport/doorbell.py,
whose `Doorbell` and `ZmqDoorbell` this module re-exports), and only to a peer that said it is
going to sleep. One process holds the `RingWriter` end, one the `RingReader`. This module owns
what each end does with records; what both share (opening, claiming, peer checks, waiting,
closing, memory ordering) is `RingEnd` in transport/ring_end.py, and the segment's layout and
record format are transport/ring_layout.py.

Invariants: 0 <= write - read <= capacity; only the writer stores the write position, only the
reader the read position; a record's bytes are all written before the write position covers
them, and read before the read position frees them; a full ring refuses a write (backpressure)
and never overwrites unreleased bytes. Every wait has a deadline and looks at the peer's pid and
start time, so a peer killed with SIGKILL surfaces as `PeerGone` within one liveness interval.
"""

from __future__ import annotations

from storage.checksum import crc32
from transport.doorbell import (  # re-exported: ring users import the doorbell from here
    DOORBELL_LINGER_MS,
    DOORBELL_PEERS_MAX,
    DOORBELL_QUEUE_MAX,
    Doorbell,
    ZmqDoorbell,
)
from transport.ring_end import FENCE_ORDERS_MEMORY, RingEnd
from transport.ring_layout import (
    HEADER_BYTES,
    READ_POSITION,
    READER_WORDS,
    RECORD_CHECKED,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    WRITE_POSITION,
    WRITER_WORDS,
    PeerGone,
    RecordTooLarge,
    RingBusy,
    RingClosed,
    RingCorrupt,
    RingError,
    RingFull,
    RingKeyMismatch,
    read_layout,
    record_footprint,
)
from transport.shm import ProcessIdentity, attach_segment, list_segments, process_alive, unlink_segment

__all__ = [  # the ring's public names, some of them defined in transport/ring_layout.py and doorbell.py
    "DOORBELL_LINGER_MS", "DOORBELL_PEERS_MAX", "DOORBELL_QUEUE_MAX", "HEADER_BYTES", "RECORD_HEADER_BYTES",
    "Doorbell", "PeerGone", "RecordTooLarge", "RingBusy", "RingClosed", "RingCorrupt", "RingError", "RingFull",
    "RingKeyMismatch", "RingReader", "RingWriter", "ZmqDoorbell", "record_footprint", "unlink_orphaned_rings",
]


def _flat_bytes(buffer: object) -> bytes | bytearray | memoryview:
    """`buffer` as something whose len() is its size in bytes, without copying it."""
    if type(buffer) is bytes or type(buffer) is bytearray:
        return buffer
    view = memoryview(buffer)  # type: ignore[arg-type]
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class RingWriter(RingEnd):
    """The producing end: copies a record in, publishes it, rings a sleeping reader."""

    _own = WRITER_WORDS
    _peer = READER_WORDS
    _role = "writer"
    _peer_role = "reader"

    def _claim(self) -> None:
        super()._claim()
        self._position: int = self._words[WRITER_WORDS.position]

    def try_write(self, *buffers: object) -> bool:
        """Append one record whose payload is `buffers` concatenated (they are never joined).

        Returns False, writing nothing, when the ring lacks room: that is backpressure.
        Raises RecordTooLarge if the record would not fit even an empty ring.
        """
        parts = [_flat_bytes(buffer) for buffer in buffers]
        payload_bytes = sum(map(len, parts))
        footprint = record_footprint(payload_bytes)
        if footprint > self.capacity_bytes:
            raise RecordTooLarge(payload_bytes, self.record_bytes_max)
        position = self._position
        if footprint > self.capacity_bytes - self._used_between(position, self._words[READ_POSITION]):
            self.stats.full_refusals += 1
            return False
        self._copy_record(position, parts, payload_bytes)
        if FENCE_ORDERS_MEMORY:
            self._full_fence()
        self._position = position + footprint
        self._words[WRITE_POSITION] = self._position
        self.stats.records += 1
        self.stats.payload_bytes += payload_bytes
        self._notify_peer_if_waiting()
        return True

    def write(self, *buffers: object, timeout_ms: int) -> None:
        """Append one record, sleeping on the doorbell while the ring is full.

        Raises RingFull at the deadline, PeerGone if the reader died, RingClosed if it closed.
        """
        if self.try_write(*buffers):
            return
        footprint = record_footprint(sum(len(_flat_bytes(buffer)) for buffer in buffers))
        if not self._wait_until(lambda: self.free_bytes >= footprint, timeout_ms):
            raise RingFull(f"no room for {footprint} bytes in {self.name} after {timeout_ms} ms "
                           f"({self.free_bytes} free)")
        written = self.try_write(*buffers)
        assert written, "only this end adds bytes, so room found while waiting cannot vanish"

    def arm_doorbell(self, payload_bytes: int) -> bool:
        """Ask the reader to ring when it frees room; True if room for the record is already there.

        For a runtime that sleeps in its own poller on `doorbell.socket` rather than in `write`;
        it calls `disarm_doorbell` when it wakes.
        """
        self._arm()
        return self.free_bytes >= record_footprint(payload_bytes)

    def _copy_record(self, position: int, parts: list, payload_bytes: int) -> None:
        payload_crc = 0
        if self.payload_crc:
            for part in parts:
                payload_crc = crc32(part, payload_crc)
        header_crc = crc32(RECORD_CHECKED.pack(payload_bytes, payload_crc, position))
        header = RECORD_HEADER.pack(payload_bytes, payload_crc, position, header_crc)
        index = position % self.capacity_bytes
        if index + RECORD_HEADER_BYTES + payload_bytes <= self.capacity_bytes:
            data = self._data  # the common case: the record does not wrap
            data[index:index + RECORD_HEADER_BYTES] = header
            index += RECORD_HEADER_BYTES
            for part in parts:
                data[index:index + len(part)] = part
                index += len(part)
            return
        position = self._copy_wrapping(position, header)
        for part in parts:
            position = self._copy_wrapping(position, part)

    def _copy_wrapping(self, position: int, part: bytes | bytearray | memoryview) -> int:
        index = position % self.capacity_bytes
        size = len(part)
        first_bytes = self.capacity_bytes - index
        if size <= first_bytes:
            self._data[index:index + size] = part
        else:
            view = memoryview(part)  # slicing a view, unlike bytes, copies nothing
            self._data[index:] = view[:first_bytes]
            self._data[:size - first_bytes] = view[first_bytes:]
        return position + size


class RingReader(RingEnd):
    """The consuming end: hands records out as views, frees their bytes on `release`."""

    _own = READER_WORDS
    _peer = WRITER_WORDS
    _role = "reader"
    _peer_role = "writer"

    def __init__(self, *args, **kwargs) -> None:
        self._unreleased: list[memoryview] = []
        super().__init__(*args, **kwargs)

    def _claim(self) -> None:
        super()._claim()
        self._cursor: int = self._words[READER_WORDS.position]

    def try_read(self) -> memoryview | None:
        """The next record's payload, or None if there is none yet.

        The view points into the ring (no copy) unless the record wraps around the end of the
        data area; then it is joined into a private buffer. The record's bytes stay reserved
        until `release()`, which also invalidates the view: copy what must outlive it.
        Raises RingCorrupt if the record fails its check.
        """
        cursor = self._cursor
        available = self._used_between(self._words[WRITE_POSITION], cursor)
        if available == 0:
            return None
        if FENCE_ORDERS_MEMORY:
            self._full_fence()
        payload_bytes, payload_crc = self._read_record_header(cursor, available)
        payload = self._payload_view(cursor + RECORD_HEADER_BYTES, payload_bytes)
        if self.payload_crc and crc32(payload) != payload_crc:
            payload.release()
            raise RingCorrupt(f"record at position {cursor} of {self.name} fails its payload CRC")
        self._cursor = cursor + record_footprint(payload_bytes)
        self._unreleased.append(payload)
        self.stats.records += 1
        self.stats.payload_bytes += payload_bytes
        return payload

    def read(self, *, timeout_ms: int) -> memoryview | None:
        """Like try_read, but sleeps on the doorbell until a record comes; None at the deadline.

        Raises PeerGone if the writer died, RingClosed if it closed, once nothing is left.
        """
        record = self.try_read()
        if record is None and self._wait_until(self._readable, timeout_ms):
            record = self.try_read()
            assert record is not None, "only this end consumes, so a record found while waiting stays"
        return record

    def release(self) -> None:
        """Hand every record read so far back to the writer; their views become unusable."""
        self._release_views()
        if self._cursor == self._words[READ_POSITION]:
            return
        if FENCE_ORDERS_MEMORY:
            self._full_fence()
        self._words[READ_POSITION] = self._cursor
        self._notify_peer_if_waiting()

    def arm_doorbell(self) -> bool:
        """Ask the writer to ring on its next record; True if one is already readable.

        For a runtime that sleeps in its own poller on `doorbell.socket` rather than in `read`;
        it calls `disarm_doorbell` when it wakes.
        """
        self._arm()
        return self._readable()

    def _readable(self) -> bool:
        return self._words[WRITE_POSITION] != self._cursor

    def _read_record_header(self, cursor: int, available: int) -> tuple[int, int]:
        if available < RECORD_HEADER_BYTES:
            raise RingCorrupt(f"{available} bytes at position {cursor} of {self.name} cannot hold a record")
        index = cursor % self.capacity_bytes
        if index + RECORD_HEADER_BYTES <= self.capacity_bytes:
            fields = RECORD_HEADER.unpack_from(self._data, index)
        else:
            wrapped_bytes = index + RECORD_HEADER_BYTES - self.capacity_bytes
            fields = RECORD_HEADER.unpack(bytes(self._data[index:]) + bytes(self._data[:wrapped_bytes]))
        payload_bytes, payload_crc, stamp, header_crc = fields
        if crc32(RECORD_CHECKED.pack(payload_bytes, payload_crc, stamp)) != header_crc:
            raise RingCorrupt(f"record header at position {cursor} of {self.name} fails its CRC")
        if stamp != cursor:
            raise RingCorrupt(f"record at position {cursor} of {self.name} is stamped {stamp} "
                              f"(stale or foreign)")
        if record_footprint(payload_bytes) > available:
            raise RingCorrupt(f"record at position {cursor} of {self.name} claims {payload_bytes} bytes, "
                              f"more than the {available} published")
        return payload_bytes, payload_crc

    def _payload_view(self, position: int, payload_bytes: int) -> memoryview:
        index = position % self.capacity_bytes
        if index + payload_bytes <= self.capacity_bytes:
            return self._data[index:index + payload_bytes]
        wrapped_bytes = index + payload_bytes - self.capacity_bytes
        return memoryview(b"".join((self._data[index:], self._data[:wrapped_bytes])))  # one copy

    def _release_views(self) -> None:
        for view in self._unreleased:
            view.release()
        self._unreleased.clear()


def unlink_orphaned_rings(prefix: str) -> list[str]:
    """Unlink the rings under `prefix` that no live process holds open at either end.

    For start-up after the whole process tree died and no supervisor was left to clean up; call
    it only when nothing under `prefix` can be creating a ring at that moment. Segments that are
    not rings, or not ours alone, or cannot be mapped (an empty file a kill between creating and
    sizing a segment leaves) are left alone: the prefix is known to every client, and any user
    may put a file under it, which must not stop a start.
    """
    removed = []
    for name in list_segments(prefix):
        try:
            segment = attach_segment(name)
        except (OSError, ValueError):  # gone, another user's, not a file, or empty (mmap refuses)
            continue
        try:
            read_layout(name, segment)
            words = segment.buf[:HEADER_BYTES].cast("Q")
            holders = [ProcessIdentity(words[end.pid], words[end.start_time_ms])
                       for end in (WRITER_WORDS, READER_WORDS) if not words[end.closed]]
            words.release()
        except RingCorrupt:
            continue
        finally:
            segment.close()
        if not any(process_alive(holder) for holder in holders) and unlink_segment(name):
            removed.append(name)
    return removed
