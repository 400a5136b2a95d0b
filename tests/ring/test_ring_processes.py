"""Two real processes: a stress run that checks every record, and SIGKILL of either end.

Each story ends by checking /dev/shm: once the owner (or the supervisor, here the test acting
as one) has unlinked, nothing with the test's prefix is left.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.ring import ring_children
from transport.ring import PeerGone, RingClosed, RingReader, RingWriter, unlink_orphaned_rings
from transport.shm import unlink_segments

CHILD_TIMEOUT_S = 20
WAIT_MS = 10_000
# A dead peer must be noticed within a few liveness intervals (100 ms), not after the timeout.
NOTICE_WITHIN_S = 2.0


def _expect(connection, message):
    assert connection.poll(CHILD_TIMEOUT_S), f"child never said {message!r}"
    received = connection.recv()
    assert received == message or (isinstance(received, tuple) and received[0] == message), received
    return received


def test_two_processes_hand_over_every_record_intact(segments, processes):
    name, seed, count, pause_every = segments.name(), 20240611, 10_000, 2500
    with RingReader.create(name, 16 * 1024) as reader:
        ours, theirs = processes.pipe()
        writer_process = processes.start(ring_children.stress_writer, name, seed, count, pause_every, theirs)
        _expect(ours, "attached")
        for index in range(count):
            record = reader.read(timeout_ms=WAIT_MS)
            assert record is not None, f"record {index} never came"
            assert bytes(record) == ring_children.stress_payload(seed, index), f"record {index} differs"
            if index % 3 == 2:  # release in small batches, as a consumer that works on a few at once
                reader.release()
            if index % pause_every == pause_every // 2:  # stall, so the writer surely fills the ring
                time.sleep(ring_children.PAUSE_S)
        reader.release()
        assert ours.poll(CHILD_TIMEOUT_S)
        writer_stats = ours.recv()
        writer_process.join(CHILD_TIMEOUT_S)
        with pytest.raises(RingClosed):
            reader.read(timeout_ms=WAIT_MS)

        assert writer_stats.records == reader.stats.records == count
        assert writer_stats.full_refusals > 0, "a 16 KiB ring must have pushed back on the writer"
        # Both ends slept on their doorbells and were rung awake by the other: nobody spun.
        assert writer_stats.wait_slices > 0 and reader.stats.wait_slices > 0
        assert writer_stats.doorbells_rung > 0 and reader.stats.doorbells_rung > 0
    assert segments.existing() == []


def test_a_writer_killed_mid_record_leaves_only_whole_records_and_a_restart_carries_on(segments, processes):
    name = segments.name()
    with RingReader.create(name, 8 * 1024) as reader:
        ours, theirs = processes.pipe()
        doomed = processes.start(ring_children.writer_dies_mid_record, name, 5, theirs)
        _expect(ours, "mid-record")
        os.kill(doomed.pid, signal.SIGKILL)

        received = [_number(reader.read(timeout_ms=WAIT_MS)) for _ in range(5)]
        started = time.monotonic()
        with pytest.raises(PeerGone) as gone:
            reader.read(timeout_ms=WAIT_MS)
        assert time.monotonic() - started < NOTICE_WITHIN_S
        assert gone.value.identity.pid == doomed.pid
        assert received == [0, 1, 2, 3, 4]

        # Until a new writer claims the end, the reader keeps hearing that the writer is gone.
        with pytest.raises(PeerGone):
            reader.read(timeout_ms=WAIT_MS)
        # The writer restarts, re-attaches, and writes over the half-copied record.
        reader.release()
        processes.start(ring_children.write_numbered, name, 5, 20, theirs)
        _expect(ours, "attached")
        received = []
        for _ in range(20):
            received.append(_number(reader.read(timeout_ms=WAIT_MS)))
            reader.release()
        _expect(ours, "written")
        assert received == list(range(5, 25))
    assert segments.existing() == []


def test_a_reader_killed_holding_a_record_frees_the_writer_and_a_restart_gets_it_again(segments, processes):
    name = segments.name()
    with RingWriter.create(name, 4 * 1024) as writer:
        ours, theirs = processes.pipe()
        for index in range(4):
            writer.write(ring_children.numbered_payload(index), timeout_ms=WAIT_MS)
        doomed = processes.start(ring_children.reader_dies_holding_record, name, 2, theirs)
        assert _expect(ours, "holding") == ("holding", 2)
        os.kill(doomed.pid, signal.SIGKILL)

        started = time.monotonic()
        with pytest.raises(PeerGone) as gone:
            for index in range(4, 100):  # fills the ring; record 2 and later were never released
                writer.write(ring_children.numbered_payload(index), timeout_ms=WAIT_MS)
        assert time.monotonic() - started < NOTICE_WITHIN_S
        assert gone.value.role == "reader"

        with RingReader.attach(name) as restarted:
            first = _number(restarted.read(timeout_ms=WAIT_MS))
            assert first == 2  # read before the crash, never released: delivered again
    assert segments.existing() == []


def test_when_the_creator_dies_the_supervisor_sweep_leaves_nothing_behind(segments, processes):
    name = segments.name()
    ours, theirs = processes.pipe()
    doomed = processes.start(ring_children.creator_dies, name, 4 * 1024, theirs)
    _expect(ours, "created")
    reader = RingReader.attach(name)
    try:
        assert _number(reader.read(timeout_ms=WAIT_MS)) == 0
        reader.release()
        os.kill(doomed.pid, signal.SIGKILL)
        with pytest.raises(PeerGone):
            reader.read(timeout_ms=WAIT_MS)
        assert unlink_orphaned_rings(segments.prefix) == []  # this reader still holds it open
    finally:
        reader.close()
    assert unlink_orphaned_rings(segments.prefix) == [name]
    assert segments.existing() == []


def test_the_supervisor_unlinks_a_dead_actors_segments_by_prefix(segments, processes):
    name = segments.name()
    ours, theirs = processes.pipe()
    doomed = processes.start(ring_children.creator_dies, name, 4 * 1024, theirs)
    _expect(ours, "created")
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.join(CHILD_TIMEOUT_S)

    assert segments.existing() == [name]
    assert unlink_segments(segments.prefix) == [name]
    assert segments.existing() == []


def _number(record) -> int:
    return ring_children.NUMBER.unpack_from(record)[0]
