"""A bounded single-producer single-consumer byte ring in shared memory, with a ZeroMQ doorbell.

Co-located actors hand bulk bytes (record batches) to each other through a ring instead of
copying them through a socket; ZeroMQ carries only a tiny doorbell message (transport/doorbell.py,
whose `Doorbell` and `ZmqDoorbell` this module re-exports), and only to a peer that said it is
going to sleep. One process holds the `RingWriter` end, one the `RingReader`.

Segment layout. Header fields are aligned u64 words, one cache line per owner:

    word 0-3    magic, layout version, capacity in bytes, flags (bit 0: payload CRC)   fixed
    word 8-12   write position, writer pid, writer start ms, writer closed, writer wants doorbell
    word 16-20  read position,  reader pid, reader start ms, reader closed, reader wants doorbell
    byte 256    the writer's doorbell endpoint (64 bytes, NUL padded); byte 320: the reader's
    byte 512    the data area, `capacity` bytes

Positions are byte counters that only grow (index = position % capacity). A record is a 24-byte
header (payload length u32, CRC-32 of the payload or 0, the record's own position u64, CRC-32
of those 16 bytes u32, 4 bytes padding; CRCs from storage.checksum, which uses ISA-L when it is
installed) and the payload, padded to 8 bytes, wrapping around the end of the data area when it
must (split copy). The position stamp makes a stale record from an earlier lap, or a torn
header, fail the check instead of being delivered.

Invariants: 0 <= write - read <= capacity; only the writer stores the write position, only the
reader the read position; a record's bytes are all written before the write position covers
them, and read before the read position frees them; a full ring refuses a write (backpressure)
and never overwrites unreleased bytes. Every wait has a deadline and looks at the peer's pid and
start time, so a peer killed with SIGKILL surfaces as `PeerGone` within one liveness interval.

Memory ordering. Header words are read and written through a memoryview cast to 'Q', which
CPython turns into one aligned 8-byte load or store: a position is never seen half-written. The
data copy and the position store are separate C calls made in program order, so no compiler can
swap them. On x86-64 (TSO) stores become visible in program order and loads are not reordered
with older loads, which is all that publishing needs. TSO does let a load pass an older store,
which matters for the doorbell handshake (a waiter stores "wants doorbell" then loads the
position; the other end stores the position then loads the flag): both sides put a full fence
between the two (`_full_fence`: a private lock released and re-acquired, i.e. LOCK-prefixed
instructions). On weakly ordered CPUs (aarch64, POWER) stores and loads may be reordered too, so
there the same fence also runs before a position is published and after one is read; a lock
release followed by an acquire orders memory there, but that path has only been exercised on
x86-64. A C extension with explicit acquire/release atomics would be the sturdier route on such
machines. The record checks turn any ordering failure into `RingCorrupt`, not bad data.
"""

from __future__ import annotations

import platform
import secrets
import struct
import threading
import time
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from typing import Callable, ClassVar, NamedTuple

from storage.checksum import crc32
from transport.doorbell import (  # re-exported: ring users import the doorbell from here
    DOORBELL_LINGER_MS,
    DOORBELL_PEERS_MAX,
    DOORBELL_QUEUE_MAX,
    Doorbell,
    ZmqDoorbell,
)
from transport.shm import (
    ProcessIdentity,
    attach_segment,
    create_segment,
    current_process_identity,
    list_segments,
    process_alive,
    unlink_segment,
)

RING_MAGIC = int.from_bytes(b"RLMQRING", "little")
LAYOUT_VERSION = 1
FLAG_PAYLOAD_CRC = 1
HEADER_BYTES = 512
RECORD_HEADER = struct.Struct("<IIQI4x")  # payload length, payload CRC, position stamp, header CRC
RECORD_HEADER_BYTES = RECORD_HEADER.size
RECORD_CHECKED = struct.Struct("<IIQ")  # the part of the record header its CRC covers
RECORD_ALIGN_BYTES = 8
ENDPOINT_BYTES_MAX = 64

# A ring must hold at least one small record; one ring must not take a large share of /dev/shm.
RING_CAPACITY_BYTES_MIN = 64
RING_CAPACITY_BYTES_MAX = 1 << 30
# How often a waiting end checks that its peer still runs: how late a SIGKILL is noticed, versus
# reading /proc (about 50 µs) too often. A lost doorbell ring also costs at most this long.
LIVENESS_CHECK_INTERVAL_MS = 100

_FENCE_ORDERS_MEMORY = platform.machine().lower() not in {"x86_64", "amd64", "i386", "i686"}
_MAGIC, _VERSION, _CAPACITY, _FLAGS = 0, 1, 2, 3


class _EndWords(NamedTuple):
    position: int
    pid: int
    start_time_ms: int
    closed: int
    wants_doorbell: int
    endpoint_offset: int


_WRITER = _EndWords(8, 9, 10, 11, 12, 256)
_READER = _EndWords(16, 17, 18, 19, 20, 320)
_WRITE_POSITION, _READ_POSITION = _WRITER.position, _READER.position  # the hot words, as plain ints


class RingError(Exception):
    """Base class of every error the ring raises on purpose."""


class RecordTooLarge(RingError):
    """The record would not fit even an empty ring."""

    def __init__(self, payload_bytes: int, record_bytes_max: int) -> None:
        super().__init__(f"record of {payload_bytes} bytes exceeds the ring's maximum of {record_bytes_max}")
        self.payload_bytes = payload_bytes
        self.record_bytes_max = record_bytes_max


class RingFull(RingError):
    """No room for the record before the deadline: the reader is behind (backpressure)."""


class RingCorrupt(RingError):
    """The segment's header or a record fails its check; the ring must be recreated."""


class RingClosed(RingError):
    """The peer closed its end cleanly (for a reader: and every record has been read)."""


class RingBusy(RingError):
    """Another live process already holds this end of the ring."""


class PeerGone(RingError):
    """The process holding the other end died without closing it."""

    def __init__(self, role: str, identity: ProcessIdentity) -> None:
        super().__init__(f"the {role} (pid {identity.pid}) is gone")
        self.role = role
        self.identity = identity


def record_footprint(payload_bytes: int) -> int:
    """Bytes a record of `payload_bytes` occupies in the ring: header and payload, padded."""
    unpadded = RECORD_HEADER_BYTES + payload_bytes
    return (unpadded + RECORD_ALIGN_BYTES - 1) // RECORD_ALIGN_BYTES * RECORD_ALIGN_BYTES


@dataclass
class RingStats:
    """Counters one end keeps about itself (in its own process, not in the segment)."""

    records: int = 0
    payload_bytes: int = 0
    full_refusals: int = 0  # try_write found no room
    wait_slices: int = 0  # times this end went to sleep on its doorbell
    doorbells_rung: int = 0  # times this end woke its peer


def _flat_bytes(buffer: object) -> bytes | bytearray | memoryview:
    """`buffer` as something whose len() is its size in bytes, without copying it."""
    if type(buffer) is bytes or type(buffer) is bytearray:
        return buffer
    view = memoryview(buffer)  # type: ignore[arg-type]
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _read_layout(name: str, segment: SharedMemory) -> tuple[int, bool]:
    """Check the fixed header and the positions; returns (capacity_bytes, payload_crc)."""
    words = segment.buf[:HEADER_BYTES].cast("Q") if segment.size >= HEADER_BYTES else None
    try:
        if words is None or words[_MAGIC] != RING_MAGIC or words[_VERSION] != LAYOUT_VERSION:
            raise RingCorrupt(f"segment {name} is not a ring of layout version {LAYOUT_VERSION}")
        capacity_bytes = words[_CAPACITY]
        if capacity_bytes % RECORD_ALIGN_BYTES or HEADER_BYTES + capacity_bytes > segment.size:
            raise RingCorrupt(f"segment {name} declares {capacity_bytes} bytes of capacity it lacks")
        if not 0 <= words[_WRITER.position] - words[_READER.position] <= capacity_bytes:
            raise RingCorrupt(f"segment {name} has positions out of order")
        return capacity_bytes, bool(words[_FLAGS] & FLAG_PAYLOAD_CRC)
    finally:
        if words is not None:
            words.release()


class _RingEnd:
    """What both ends share: opening, claiming an end, peer checks, waiting, closing.

    An end belongs to one thread. The process that created the segment unlinks it (`unlink`,
    or leaving a `with` block); `close` only detaches.
    """

    _own: ClassVar[_EndWords]
    _peer: ClassVar[_EndWords]
    _role: ClassVar[str]
    _peer_role: ClassVar[str]

    def __init__(self, name: str, segment: SharedMemory, created: bool, doorbell: Doorbell | None,
                 liveness_check_interval_ms: int, clock_ns: Callable[[], int]) -> None:
        self.capacity_bytes, self.payload_crc = _read_layout(name, segment)
        self.name = name
        self.created = created
        self.stats = RingStats()
        self._owns_doorbell = doorbell is None
        self.doorbell: Doorbell = doorbell if doorbell is not None else ZmqDoorbell()
        self._segment = segment
        self._words = segment.buf[:HEADER_BYTES].cast("Q")
        self._data = segment.buf[HEADER_BYTES:HEADER_BYTES + self.capacity_bytes]
        self._liveness_interval_ms = liveness_check_interval_ms
        self._clock_ns = clock_ns
        self._next_liveness_check_ns = 0
        # The peer rings at most once per arm generation, and a waiter moves to a new generation
        # only after it has slept: so rings cannot pile up (one is in flight at most, a stale one
        # costs a single spurious wake-up), and a ring that got lost costs one sleep, not more.
        self._arm_generation = secrets.randbits(48) + 1  # unique across restarts
        self._last_rung_generation = 0
        self._fence_lock = threading.Lock()
        self._fence_lock.acquire()  # held for life: a fence is a release followed by an acquire
        self._closed = False

    @classmethod
    def create(cls, name: str, capacity_bytes: int, *, payload_crc: bool = True, replace: bool = False,
               doorbell: Doorbell | None = None, liveness_check_interval_ms: int = LIVENESS_CHECK_INTERVAL_MS,
               clock_ns: Callable[[], int] = time.monotonic_ns):
        """Create the segment and hold this end; `replace` first unlinks a leftover of that name.

        `payload_crc=False` keeps only the record header check, for payloads that carry their
        own checksum (record batches).
        """
        in_range = RING_CAPACITY_BYTES_MIN <= capacity_bytes <= RING_CAPACITY_BYTES_MAX
        if capacity_bytes % RECORD_ALIGN_BYTES or not in_range:
            raise ValueError(f"capacity_bytes={capacity_bytes} must be a multiple of {RECORD_ALIGN_BYTES} "
                             f"in [{RING_CAPACITY_BYTES_MIN}, {RING_CAPACITY_BYTES_MAX}]")
        if replace:
            unlink_segment(name)
        segment = create_segment(name, HEADER_BYTES + capacity_bytes)
        words = segment.buf[:HEADER_BYTES].cast("Q")
        words[_VERSION] = LAYOUT_VERSION
        words[_CAPACITY] = capacity_bytes
        words[_FLAGS] = FLAG_PAYLOAD_CRC if payload_crc else 0
        words[_MAGIC] = RING_MAGIC  # last: whoever sees the magic sees the rest
        words.release()
        return cls._open(name, segment, True, doorbell, liveness_check_interval_ms, clock_ns)

    @classmethod
    def attach(cls, name: str, *, doorbell: Doorbell | None = None,
               liveness_check_interval_ms: int = LIVENESS_CHECK_INTERVAL_MS,
               clock_ns: Callable[[], int] = time.monotonic_ns):
        """Map an existing ring and hold this end; a restarted process re-attaches this way.

        A writer carries on after the last published record (a record it was writing when it
        died is discarded); a reader starts at the first unreleased record, so records read
        but not released before a crash are delivered again.
        """
        return cls._open(name, attach_segment(name), False, doorbell, liveness_check_interval_ms, clock_ns)

    @classmethod
    def _open(cls, name, segment, created, doorbell, liveness_check_interval_ms, clock_ns):
        end = None
        try:
            end = cls(name, segment, created, doorbell, liveness_check_interval_ms, clock_ns)
            end._claim()
            return end
        except BaseException:
            if end is not None:
                end._unmap()
            else:
                segment.close()
            if created:
                unlink_segment(name)
            raise

    def _claim(self) -> None:
        holder = self._identity(self._own)
        if holder.pid and not self._words[self._own.closed] and process_alive(holder):
            raise RingBusy(f"the {self._role} end of {self.name} is held by pid {holder.pid}")
        endpoint = self.doorbell.endpoint.encode("ascii")
        if len(endpoint) >= ENDPOINT_BYTES_MAX:
            raise ValueError(f"doorbell endpoint {self.doorbell.endpoint!r} is too long")
        offset = self._own.endpoint_offset
        self._segment.buf[offset:offset + ENDPOINT_BYTES_MAX] = endpoint.ljust(ENDPOINT_BYTES_MAX, b"\0")
        me = current_process_identity()
        self._words[self._own.wants_doorbell] = 0
        self._words[self._own.closed] = 0
        self._words[self._own.start_time_ms] = me.start_time_ms
        self._words[self._own.pid] = me.pid

    def _identity(self, end: _EndWords) -> ProcessIdentity:
        return ProcessIdentity(self._words[end.pid], self._words[end.start_time_ms])

    @property
    def record_bytes_max(self) -> int:
        """The largest payload one record may carry."""
        return self.capacity_bytes - RECORD_HEADER_BYTES

    @property
    def used_bytes(self) -> int:
        """Bytes published and not yet released (record headers and padding included)."""
        return self._used_between(self._words[_WRITER.position], self._words[_READER.position])

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def _used_between(self, write_position: int, read_position: int) -> int:
        used = write_position - read_position
        if not 0 <= used <= self.capacity_bytes:
            raise RingCorrupt(f"ring {self.name}: write position {write_position}, "
                              f"read position {read_position}")
        return used

    def check_peer(self) -> None:
        """Raise RingClosed if the peer closed its end, PeerGone if its process died.

        The closed flag is read every time; the process lookup at most once per liveness
        interval. An end nobody has attached yet is neither closed nor gone.
        """
        if self._words[self._peer.closed]:
            raise RingClosed(f"the {self._peer_role} closed {self.name}")
        now_ns = self._clock_ns()
        if now_ns < self._next_liveness_check_ns:
            return
        self._next_liveness_check_ns = now_ns + self._liveness_interval_ms * 1_000_000
        peer = self._identity(self._peer)
        if peer.pid and not process_alive(peer):
            raise PeerGone(self._peer_role, peer)

    def _arm(self) -> None:
        self._words[self._own.wants_doorbell] = self._arm_generation
        self._full_fence()

    def disarm_doorbell(self, slept: bool) -> None:
        """This end is awake again; `slept`: it did sleep on its doorbell since it armed."""
        self._words[self._own.wants_doorbell] = 0
        if slept:
            self._arm_generation += 1

    def _wait_until(self, ready: Callable[[], bool], timeout_ms: int) -> bool:
        """Sleep on the doorbell until `ready()`; False at the deadline. Never spins."""
        deadline_ns = self._clock_ns() + timeout_ms * 1_000_000
        while not ready():
            try:
                self.check_peer()
            except RingError:
                if ready():  # the peer published or freed its last bytes, then closed or died
                    return True
                raise
            remaining_ms = (deadline_ns - self._clock_ns()) // 1_000_000
            if remaining_ms <= 0:
                return False
            self._arm()
            slept = False
            try:
                if ready():
                    return True
                self.stats.wait_slices += 1
                slept = True
                self.doorbell.wait(min(remaining_ms, self._liveness_interval_ms))
            finally:
                self.disarm_doorbell(slept)
        return True

    def _notify_peer_if_waiting(self) -> None:
        self._full_fence()
        wanted = self._words[self._peer.wants_doorbell]
        if wanted and wanted != self._last_rung_generation and self._ring_peer():
            self._last_rung_generation = wanted

    def _ring_peer(self) -> bool:
        offset = self._peer.endpoint_offset
        endpoint = bytes(self._segment.buf[offset:offset + ENDPOINT_BYTES_MAX]).rstrip(b"\0")
        if not endpoint or not self.doorbell.ring(endpoint.decode("ascii")):
            return False
        self.stats.doorbells_rung += 1
        return True

    def _full_fence(self) -> None:
        self._fence_lock.release()
        self._fence_lock.acquire()

    def close(self) -> None:
        """Mark this end closed, wake the peer so it notices, unmap. Does not unlink."""
        if self._closed:
            return
        self._words[self._own.wants_doorbell] = 0
        self._words[self._own.closed] = 1
        self._full_fence()
        self._ring_peer()
        self._unmap()

    def _unmap(self) -> None:
        self._closed = True
        self._release_views()
        self._data.release()
        self._words.release()
        self._segment.close()
        if self._owns_doorbell:
            self.doorbell.close()

    def _release_views(self) -> None:
        """Invalidate views handed out into the segment (the reader has some)."""

    def unlink(self) -> bool:
        """Remove the segment's name; ends that mapped it keep working. True if it existed."""
        return unlink_segment(self.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        if self.created:
            self.unlink()


class RingWriter(_RingEnd):
    """The producing end: copies a record in, publishes it, rings a sleeping reader."""

    _own = _WRITER
    _peer = _READER
    _role = "writer"
    _peer_role = "reader"

    def _claim(self) -> None:
        super()._claim()
        self._position: int = self._words[_WRITER.position]

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
        if footprint > self.capacity_bytes - self._used_between(position, self._words[_READ_POSITION]):
            self.stats.full_refusals += 1
            return False
        self._copy_record(position, parts, payload_bytes)
        if _FENCE_ORDERS_MEMORY:
            self._full_fence()
        self._position = position + footprint
        self._words[_WRITE_POSITION] = self._position
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


class RingReader(_RingEnd):
    """The consuming end: hands records out as views, frees their bytes on `release`."""

    _own = _READER
    _peer = _WRITER
    _role = "reader"
    _peer_role = "writer"

    def __init__(self, *args, **kwargs) -> None:
        self._unreleased: list[memoryview] = []
        super().__init__(*args, **kwargs)

    def _claim(self) -> None:
        super()._claim()
        self._cursor: int = self._words[_READER.position]

    def try_read(self) -> memoryview | None:
        """The next record's payload, or None if there is none yet.

        The view points into the ring (no copy) unless the record wraps around the end of the
        data area; then it is joined into a private buffer. The record's bytes stay reserved
        until `release()`, which also invalidates the view: copy what must outlive it.
        Raises RingCorrupt if the record fails its check.
        """
        cursor = self._cursor
        available = self._used_between(self._words[_WRITE_POSITION], cursor)
        if available == 0:
            return None
        if _FENCE_ORDERS_MEMORY:
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
        if self._cursor == self._words[_READ_POSITION]:
            return
        if _FENCE_ORDERS_MEMORY:
            self._full_fence()
        self._words[_READ_POSITION] = self._cursor
        self._notify_peer_if_waiting()

    def arm_doorbell(self) -> bool:
        """Ask the writer to ring on its next record; True if one is already readable.

        For a runtime that sleeps in its own poller on `doorbell.socket` rather than in `read`;
        it calls `disarm_doorbell` when it wakes.
        """
        self._arm()
        return self._readable()

    def _readable(self) -> bool:
        return self._words[_WRITE_POSITION] != self._cursor

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
    not rings are left alone.
    """
    removed = []
    for name in list_segments(prefix):
        try:
            segment = attach_segment(name)
        except FileNotFoundError:
            continue
        try:
            _read_layout(name, segment)
            words = segment.buf[:HEADER_BYTES].cast("Q")
            holders = [ProcessIdentity(words[end.pid], words[end.start_time_ms])
                       for end in (_WRITER, _READER) if not words[end.closed]]
            words.release()
        except RingCorrupt:
            continue
        finally:
            segment.close()
        if not any(process_alive(holder) for holder in holders) and unlink_segment(name):
            removed.append(name)
    return removed
