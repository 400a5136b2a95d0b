"""Nobody spins: a sleeping end is woken by its peer's doorbell, and only a sleeping end is rung.

The waiting end runs in a thread with a liveness interval of ten seconds, so if it woke up
promptly, it was the doorbell that woke it, not the periodic look at the peer.
"""

from __future__ import annotations

import threading
import time

import pytest

from transport.ring import DOORBELL_PEERS_MAX, RingClosed, RingFull, RingReader, RingWriter, ZmqDoorbell

SLOW_LIVENESS_MS = 10_000
WAKE_WITHIN_S = 2.0


class Waiting(threading.Thread):
    """Runs `call` in a thread and keeps what it returned or raised, and when it finished."""

    def __init__(self, call) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.result = None
        self.error: BaseException | None = None
        self.finished_at = 0.0

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            self.error = error
        self.finished_at = time.monotonic()


@pytest.fixture
def slow_ring(ring_name):
    writer = RingWriter.create(ring_name, 1024, liveness_check_interval_ms=SLOW_LIVENESS_MS)
    reader = RingReader.attach(ring_name, liveness_check_interval_ms=SLOW_LIVENESS_MS)
    try:
        yield writer, reader
    finally:
        reader.close()
        writer.close()
        writer.unlink()


def _start_and_let_it_sleep(thread: Waiting, end) -> None:
    thread.start()
    deadline = time.monotonic() + WAKE_WITHIN_S
    while end.stats.wait_slices == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert end.stats.wait_slices == 1, "the waiting end should be asleep on its doorbell"


def test_a_sleeping_reader_is_woken_by_the_writer(slow_ring):
    writer, reader = slow_ring
    waiting = Waiting(lambda: bytes(reader.read(timeout_ms=SLOW_LIVENESS_MS)))
    _start_and_let_it_sleep(waiting, reader)

    written_at = time.monotonic()
    assert writer.try_write(b"wake up")
    waiting.join(SLOW_LIVENESS_MS / 1000)

    assert waiting.error is None and waiting.result == b"wake up"
    assert waiting.finished_at - written_at < WAKE_WITHIN_S
    assert writer.stats.doorbells_rung == 1
    assert reader.stats.wait_slices == 1


def test_a_writer_blocked_on_a_full_ring_is_woken_by_a_release(slow_ring):
    writer, reader = slow_ring
    assert writer.try_write(b"x" * writer.record_bytes_max)
    waiting = Waiting(lambda: writer.write(b"next", timeout_ms=SLOW_LIVENESS_MS))
    _start_and_let_it_sleep(waiting, writer)

    reader.try_read()
    released_at = time.monotonic()
    reader.release()
    waiting.join(SLOW_LIVENESS_MS / 1000)

    assert waiting.error is None
    assert waiting.finished_at - released_at < WAKE_WITHIN_S
    assert reader.stats.doorbells_rung == 1
    assert bytes(reader.try_read()) == b"next"


def test_an_awake_peer_is_never_rung(slow_ring):
    writer, reader = slow_ring
    for _ in range(100):
        assert writer.try_write(b"record")
        reader.try_read()
        reader.release()
    assert writer.stats.doorbells_rung == 0
    assert reader.stats.doorbells_rung == 0


def test_closing_the_writer_wakes_a_sleeping_reader_with_ring_closed(slow_ring):
    writer, reader = slow_ring
    waiting = Waiting(lambda: reader.read(timeout_ms=SLOW_LIVENESS_MS))
    _start_and_let_it_sleep(waiting, reader)

    closed_at = time.monotonic()
    writer.close()
    waiting.join(SLOW_LIVENESS_MS / 1000)

    assert isinstance(waiting.error, RingClosed)
    assert waiting.finished_at - closed_at < WAKE_WITHIN_S


def test_a_read_with_nothing_to_read_times_out_with_none(slow_ring):
    _, reader = slow_ring
    started = time.monotonic()
    assert reader.read(timeout_ms=150) is None
    assert time.monotonic() - started >= 0.14


def test_a_write_into_a_full_ring_times_out_with_ring_full(slow_ring):
    writer, _ = slow_ring
    writer.try_write(b"x" * writer.record_bytes_max)
    started = time.monotonic()
    with pytest.raises(RingFull):
        writer.write(b"y", timeout_ms=150)
    assert time.monotonic() - started >= 0.14


def test_one_doorbell_can_serve_several_rings(segments):
    shared = ZmqDoorbell()
    ends = []
    try:
        names = [segments.name("a"), segments.name("b")]
        writers = [RingWriter.create(name, 256) for name in names]
        ends += writers
        readers = [RingReader.attach(name, doorbell=shared) for name in names]
        ends += readers
        for reader in readers:
            assert reader.arm_doorbell() is False
        writers[1].try_write(b"for b")

        assert shared.wait(int(WAKE_WITHIN_S * 1000)) is True
        for reader in readers:
            reader.disarm_doorbell(slept=True)
        assert readers[0].try_read() is None
        assert bytes(readers[1].try_read()) == b"for b"
    finally:
        for end in ends:
            end.close()
        assert not shared.socket.closed  # an end closes only the doorbell it made itself
        shared.close()


class FlakyDoorbell:
    """A real doorbell whose first ring goes wrong: `lost` on the way (reported as sent), or
    `refused` (reported as not sent, as a full socket queue would)."""

    def __init__(self, first_ring: str) -> None:
        self.inner = ZmqDoorbell()
        self.first_ring = first_ring
        self.rings = 0

    @property
    def endpoint(self) -> str:
        return self.inner.endpoint

    def ring(self, peer_endpoint: str) -> bool:
        self.rings += 1
        if self.rings == 1:
            return self.first_ring == "lost"
        return self.inner.ring(peer_endpoint)

    def wait(self, timeout_ms: int) -> bool:
        return self.inner.wait(timeout_ms)

    def close(self) -> None:
        self.inner.close()


SLICE_MS = 1000


@pytest.fixture
def flaky_ring(ring_name, request):
    doorbell = FlakyDoorbell(request.param)
    writer = RingWriter.create(ring_name, 1024, doorbell=doorbell, liveness_check_interval_ms=SLICE_MS)
    reader = RingReader.attach(ring_name, liveness_check_interval_ms=SLICE_MS)
    try:
        yield writer, reader
    finally:
        reader.close()
        writer.close()
        writer.unlink()
        doorbell.close()


def _timed_read(reader, writer, payload: bytes) -> float:
    """Let the reader fall asleep, write `payload`, return how long the reader took to get it."""
    slices_before = reader.stats.wait_slices
    waiting = Waiting(lambda: bytes(reader.read(timeout_ms=10 * SLICE_MS)))
    waiting.start()
    deadline = time.monotonic() + WAKE_WITHIN_S
    while reader.stats.wait_slices == slices_before and time.monotonic() < deadline:
        time.sleep(0.005)
    written_at = time.monotonic()
    writer.try_write(payload)
    waiting.join(10 * SLICE_MS / 1000)
    assert waiting.error is None and waiting.result == payload
    return waiting.finished_at - written_at


@pytest.mark.parametrize("flaky_ring", ["lost"], indirect=True)
def test_a_ring_lost_on_the_way_costs_one_sleep_and_later_rings_arrive(flaky_ring):
    writer, reader = flaky_ring
    assert _timed_read(reader, writer, b"first") >= SLICE_MS / 1000 * 0.5  # woke at the end of its sleep
    assert _timed_read(reader, writer, b"second") < SLICE_MS / 1000 * 0.5  # the doorbell works again


@pytest.mark.parametrize("flaky_ring", ["refused"], indirect=True)
def test_a_ring_the_doorbell_refused_is_sent_again_on_the_next_record(flaky_ring):
    writer, reader = flaky_ring
    waiting = Waiting(lambda: bytes(reader.read(timeout_ms=10 * SLICE_MS)))
    _start_and_let_it_sleep(waiting, reader)
    writer.try_write(b"")  # an empty record: the reader wakes on the next one at the latest
    assert writer.doorbell.rings == 1
    written_at = time.monotonic()
    writer.try_write(b"again")
    waiting.join(10 * SLICE_MS / 1000)
    assert writer.doorbell.rings == 2
    assert waiting.finished_at - written_at < SLICE_MS / 1000 * 0.5


def test_a_writer_sleeping_in_its_own_poller_is_rung_when_room_appears(slow_ring):
    writer, reader = slow_ring
    writer.try_write(b"x" * writer.record_bytes_max)
    assert writer.arm_doorbell(10) is False  # no room yet: the runtime would now poll its sockets
    reader.try_read()
    reader.release()
    assert writer.doorbell.wait(int(WAKE_WITHIN_S * 1000)) is True
    writer.disarm_doorbell(slept=True)
    assert writer.arm_doorbell(10) is True  # room now: no need to sleep
    writer.disarm_doorbell(slept=False)


def test_a_doorbell_keeps_a_bounded_number_of_peer_sockets():
    ringer = ZmqDoorbell()
    peers = [ZmqDoorbell() for _ in range(DOORBELL_PEERS_MAX + 2)]
    try:
        for peer in peers:
            assert ringer.ring(peer.endpoint)
        assert all(peer.wait(int(WAKE_WITHIN_S * 1000)) for peer in peers[-DOORBELL_PEERS_MAX:])
        assert len(ringer._outboxes) == DOORBELL_PEERS_MAX  # the oldest sockets were closed
    finally:
        for doorbell in [ringer, *peers]:
            doorbell.close()


def test_the_peer_process_is_looked_up_at_most_once_per_liveness_interval(slow_ring, monkeypatch):
    writer, _ = slow_ring
    lookups = []
    monkeypatch.setattr("transport.ring_end.process_alive", lambda identity: lookups.append(identity) or True)
    for _ in range(50):
        writer.check_peer()
    assert len(lookups) == 1
