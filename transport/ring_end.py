"""One end of a shared-memory ring: opening the segment, claiming the end, watching the peer,
sleeping on the doorbell and closing. `RingWriter` and `RingReader` (transport/ring.py) are the
two kinds of end; the segment's bytes are described in transport/ring_layout.py.

An end belongs to one thread, and stores only the header words its own role owns. Every wait has
a deadline and looks at the peer's pid and start time, so a peer killed with SIGKILL surfaces as
`PeerGone` within one liveness interval; a wait never spins.

Memory ordering. Header words are read and written through a memoryview cast to 'Q', which
CPython turns into one aligned 8-byte load or store: a position is never seen half-written. The
data copy and the position store are separate C calls made in program order, so no compiler can
swap them. On x86-64 (TSO) stores become visible in program order and loads are not reordered
with older loads, which is all that publishing needs. TSO does let a load pass an older store,
which matters for the doorbell handshake (a waiter stores "wants doorbell" then loads the
position; the other end stores the position then loads the flag): both sides put a full fence
between the two (`_full_fence`: a private lock released and re-acquired, i.e. LOCK-prefixed
instructions). On weakly ordered CPUs (aarch64, POWER) stores and loads may be reordered too, so
there the same fence also runs before a position is published and after one is read
(`FENCE_ORDERS_MEMORY`); a lock release followed by an acquire orders memory there, but that path
has only been exercised on x86-64. A C extension with explicit acquire/release atomics would be
the sturdier route on such machines. The record checks turn any ordering failure into
`RingCorrupt`, not bad data.
"""

from __future__ import annotations

import platform
import secrets
import threading
import time
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from typing import Callable, ClassVar

from transport.doorbell import Doorbell, ZmqDoorbell
from transport.ring_layout import (
    ENDPOINT_BYTES_MAX,
    HEADER_BYTES,
    READER_WORDS,
    RECORD_ALIGN_BYTES,
    RECORD_HEADER_BYTES,
    WRITER_WORDS,
    EndWords,
    PeerGone,
    RingBusy,
    RingClosed,
    RingCorrupt,
    RingError,
    RingKeyMismatch,
    read_layout,
    write_layout,
)
from transport.shm import (
    ProcessIdentity,
    attach_segment,
    create_segment,
    current_process_identity,
    process_alive,
    unlink_segment,
)

# A ring must hold at least one small record; one ring must not take a large share of /dev/shm.
RING_CAPACITY_BYTES_MIN = 64
RING_CAPACITY_BYTES_MAX = 1 << 30
# How often a waiting end checks that its peer still runs: how late a SIGKILL is noticed, versus
# reading /proc (about 50 µs) too often. A lost doorbell ring also costs at most this long.
LIVENESS_CHECK_INTERVAL_MS = 100

FENCE_ORDERS_MEMORY = platform.machine().lower() not in {"x86_64", "amd64", "i386", "i686"}


@dataclass
class RingStats:
    """Counters one end keeps about itself (in its own process, not in the segment)."""

    records: int = 0
    payload_bytes: int = 0
    full_refusals: int = 0  # try_write found no room
    wait_slices: int = 0  # times this end went to sleep on its doorbell
    doorbells_rung: int = 0  # times this end woke its peer


class RingEnd:
    """What both ends share: opening, claiming an end, peer checks, waiting, closing.

    An end belongs to one thread. The process that created the segment unlinks it (`unlink`,
    or leaving a `with` block); `close` only detaches.
    """

    _own: ClassVar[EndWords]
    _peer: ClassVar[EndWords]
    _role: ClassVar[str]
    _peer_role: ClassVar[str]

    def __init__(self, name: str, segment: SharedMemory, created: bool, doorbell: Doorbell | None,
                 liveness_check_interval_ms: int, clock_ns: Callable[[], int]) -> None:
        self.capacity_bytes, self.payload_crc, self.key = read_layout(name, segment)
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
        write_layout(segment, capacity_bytes, payload_crc)
        return cls._open(name, segment, True, doorbell, liveness_check_interval_ms, clock_ns)

    @classmethod
    def attach(cls, name: str, *, doorbell: Doorbell | None = None,
               liveness_check_interval_ms: int = LIVENESS_CHECK_INTERVAL_MS,
               clock_ns: Callable[[], int] = time.monotonic_ns, key: int | None = None):
        """Map an existing ring and hold this end; a restarted process re-attaches this way.

        A writer carries on after the last published record (a record it was writing when it
        died is discarded); a reader starts at the first unreleased record, so records read
        but not released before a crash are delivered again. With `key`, the end is held only
        if it is the ring's (RingKeyMismatch, and the end stays free, otherwise).
        """
        return cls._open(name, attach_segment(name), False, doorbell, liveness_check_interval_ms, clock_ns, key)

    @classmethod
    def _open(cls, name, segment, created, doorbell, liveness_check_interval_ms, clock_ns, key=None):
        end = None
        try:
            end = cls(name, segment, created, doorbell, liveness_check_interval_ms, clock_ns)
            if key is not None and key != end.key:
                raise RingKeyMismatch(f"ring {name}: the key given is not the ring's")
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

    def _identity(self, end: EndWords) -> ProcessIdentity:
        return ProcessIdentity(self._words[end.pid], self._words[end.start_time_ms])

    @property
    def record_bytes_max(self) -> int:
        """The largest payload one record may carry."""
        return self.capacity_bytes - RECORD_HEADER_BYTES

    @property
    def used_bytes(self) -> int:
        """Bytes published and not yet released (record headers and padding included)."""
        return self._used_between(self._words[WRITER_WORDS.position], self._words[READER_WORDS.position])

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

    def peer_gone(self) -> bool:
        """Whether the peer closed its end or its process died, looked up now (`check_peer`
        looks at most once per liveness interval)."""
        if self._words[self._peer.closed]:
            return True
        peer = self._identity(self._peer)
        return bool(peer.pid) and not process_alive(peer)

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
