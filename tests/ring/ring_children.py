"""Code that runs in spawned child processes during the ring tests.

Children report through a multiprocessing Pipe (`connection`) and never unlink what they did not
create: the parent test owns cleanup. Each function plays one role in one story.
"""

from __future__ import annotations

import random
import struct
import time

from transport.ring import RingReader, RingWriter
from transport.shm import attach_segment, create_segment

HANG_S = 60  # a child told to hang is always killed long before this
WAIT_MS = 10_000
PAUSE_S = 0.05
NUMBER = struct.Struct("<Q")


def stress_payload(seed: int, index: int) -> bytes:
    """Record `index` of a stress stream: sizes from empty to 3000 bytes, content from the seed."""
    chooser = random.Random(seed * 1_000_003 + index)
    size = chooser.choice((0, 1, 7, 8, 100, 1000, chooser.randrange(3000)))
    return chooser.randbytes(size)


def split_buffers(payload: bytes, index: int) -> list[memoryview]:
    """The payload cut into one to three buffers, as a writer with a header and a body would."""
    chooser = random.Random(index)
    cuts = sorted(chooser.randrange(len(payload) + 1) for _ in range(chooser.randrange(3)))
    view = memoryview(payload)
    edges = [0, *cuts, len(payload)]
    return [view[start:end] for start, end in zip(edges, edges[1:])]


def numbered_payload(index: int, size_bytes: int = 600) -> bytes:
    return NUMBER.pack(index) + bytes([index % 251]) * (size_bytes - NUMBER.size)


def attach_then_exit(name: str, connection) -> None:
    segment = attach_segment(name)
    connection.send(bytes(segment.buf[:4]))
    segment.close()


def create_then_exit(name: str, size_bytes: int, connection) -> None:
    segment = create_segment(name, size_bytes)
    segment.buf[:4] = b"kept"
    segment.close()
    connection.send("created")


def sleep_forever(connection) -> None:
    connection.send("started")
    time.sleep(HANG_S)


def stress_writer(name: str, seed: int, count: int, pause_every: int, connection) -> None:
    """Write the stress stream, pausing now and then so the reader surely finds it empty."""
    with RingWriter.attach(name) as writer:
        connection.send("attached")
        for index in range(count):
            writer.write(*split_buffers(stress_payload(seed, index), index), timeout_ms=WAIT_MS)
            if index % pause_every == pause_every - 1:
                time.sleep(PAUSE_S)
        connection.send(writer.stats)


def write_numbered(name: str, first_index: int, count: int, connection) -> None:
    """A (re)started writer: attach, say so, write records first_index.., close cleanly."""
    with RingWriter.attach(name) as writer:
        connection.send("attached")
        for index in range(first_index, first_index + count):
            writer.write(numbered_payload(index), timeout_ms=WAIT_MS)
        connection.send("written")


def writer_dies_mid_record(name: str, complete_records: int, connection) -> None:
    """Write some records, then hang halfway through copying the next one (the test kills us)."""
    writer = RingWriter.attach(name)
    for index in range(complete_records):
        writer.write(numbered_payload(index), timeout_ms=WAIT_MS)

    def copy_half_then_hang(position, parts, payload_bytes):
        half = bytes(parts[0])[: payload_bytes // 2]
        writer._copy_wrapping(position, b"\xff" * 24)  # a header that is not yet valid
        writer._copy_wrapping(position + 24, half)
        connection.send("mid-record")
        time.sleep(HANG_S)

    writer._copy_record = copy_half_then_hang
    writer.write(numbered_payload(complete_records), timeout_ms=WAIT_MS)


def reader_dies_holding_record(name: str, released_records: int, connection) -> None:
    """Read and release some records, read one more without releasing it, then hang."""
    reader = RingReader.attach(name)
    for _ in range(released_records):
        assert reader.read(timeout_ms=WAIT_MS) is not None
        reader.release()
    held = reader.read(timeout_ms=WAIT_MS)
    connection.send(("holding", NUMBER.unpack_from(held)[0]))
    time.sleep(HANG_S)


def creator_dies(name: str, capacity_bytes: int, connection) -> None:
    """Create a ring as its writer, publish one record, then hang (the test kills us)."""
    writer = RingWriter.create(name, capacity_bytes)
    writer.write(numbered_payload(0), timeout_ms=WAIT_MS)
    connection.send("created")
    time.sleep(HANG_S)


def fetcher_offers_a_ring(cluster_id: str, connection) -> None:
    """A fetching client: make a ring, hand the parent the fetch that offers it, then hang (the
    parent kills it, as kill -9 kills a consumer)."""
    from actors.messages import FetchRequest
    from transport.ring_link import RingLinks

    links = RingLinks(actor_id=f"doomed-{random.getrandbits(32):x}", cluster_id=cluster_id,
                      capacity_bytes=64 * 1024, zero_copy=False, counters={})
    request = links.outgoing("tcp://127.0.0.1:1", FetchRequest(correlation_id=1, topic="t", partition=0,
                                                                offset=0, max_bytes=8 << 20, replica=2))
    connection.send(request)
    time.sleep(HANG_S)
