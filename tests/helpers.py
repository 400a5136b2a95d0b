"""Small helpers that tests in several folders share (fixtures live in the conftest files).

`wait_for` is how a test waits for a cluster, a process or a file to reach a state: it polls,
never waits past its deadline, and names what it waited for when it gives up.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

# Polling a predicate (often an admin request) more often than this only loads the machine.
WAIT_INTERVAL_S = 0.05
HELD_SETTLE_S = 3.0  # bytes_held_from: how long a released buffer may take to be freed


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str,
             interval_s: float = WAIT_INTERVAL_S) -> T:
    """Call `predicate` every `interval_s` until it returns something true, and return that;
    after `timeout_s` fail the test with "timed out waiting for <what>"."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval_s)


@contextmanager
def bytes_held_from(path: str, at_most: int) -> Iterator[list[int]]:
    """Measure what the block allocates and still holds at its end, counting only allocations made
    with a frame of `path` on the stack: tracemalloc traces every thread, and a thread another test
    left running may allocate meanwhile. A buffer handed to ZeroMQ without copying is let go by
    pyzmq's own thread, later on a loaded machine: the measure is taken again for up to
    HELD_SETTLE_S while it is above `at_most`. The figure is in the yielded list's one item."""
    held = [0]
    only_from = [tracemalloc.Filter(True, path, all_frames=True)]
    tracemalloc.start(32)
    try:
        before = tracemalloc.take_snapshot().filter_traces(only_from)
        yield held
        deadline = time.monotonic() + HELD_SETTLE_S
        while True:
            gc.collect()
            after = tracemalloc.take_snapshot().filter_traces(only_from)
            held[0] = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
            if held[0] <= at_most or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        tracemalloc.stop()


def read_values(bootstrap: str, topic: str, partitions: int, wanted: set[bytes], timeout_s: float = 60.0) -> set[bytes]:
    """Every value a plain consumer reads from the topic's first `partitions` partitions, from the
    start, until it has seen all of `wanted` or `timeout_s` passes (through failovers)."""
    from railmq.consumer import Consumer

    seen: set[bytes] = set()
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, partition) for partition in range(partitions)])
        deadline = time.monotonic() + timeout_s
        while not wanted <= seen and time.monotonic() < deadline:
            seen.update(record.value for record in consumer.poll(300))
    return seen


def idle_zmtp_connection(endpoint: str):
    """A plain TCP socket connected to a ZeroMQ endpoint (`tcp://host:port`) that has sent a whole
    ZMTP 3.0 greeting and READY as a DEALER, so libzmq keeps it open, and nothing else: the cheapest
    connection an attacker can hold (no ZeroMQ context, one descriptor)."""
    import socket

    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    connection = socket.create_connection((host, int(port)), timeout=5)
    greeting = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + bytes(31)
    ready = b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"
    connection.sendall(greeting + bytes([0x04, len(ready)]) + ready)
    return connection


def closed_by_peer(connection) -> bool:
    """Whether the other end of a plain socket has closed it (it only ever sends us a greeting)."""
    connection.setblocking(False)
    try:
        while True:
            data = connection.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True
    finally:
        connection.setblocking(True)


def unfinished_message(endpoint: str, declared: int, sent: int):
    """A connection that sends the header of a `declared`-byte message and `sent` bytes of it: libzmq
    allocates the whole message at the header and holds what comes until the last byte."""
    connection = idle_zmtp_connection(endpoint)
    connection.sendall(b"\x02" + declared.to_bytes(8, "big"))  # one long frame, the last
    chunk = bytes(1 << 20)
    for _ in range(sent >> 20):
        connection.sendall(chunk)
    return connection


def created_again(admin, topic: str) -> bool:
    """Create `topic` with one partition; False while the deletion of a topic of that name is still
    being carried out (ask again)."""
    from actors.errors import RailmqError

    try:
        admin.create_topic(topic, partitions=1)
    except RailmqError as error:
        if "exists" in str(error):
            return False
        raise
    return True


def producer_secret_of(batch: bytes) -> bytes:
    """The secret InitProducerId hands out with the producer id `batch` names, under the key a
    replica built without one has (b""); a batch naming no producer needs none. Tests that play
    an honest idempotent producer send it."""
    from actors.client_secrets import ProducerSecrets
    from storage.batch import parse_header
    from storage.errors import StorageError

    try:
        producer_id = parse_header(batch).producer_id
    except StorageError:  # a batch a test damaged on purpose names no producer
        return b""
    return ProducerSecrets().of(producer_id) if producer_id >= 0 else b""


def consecutive_free_ports(count: int) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1, below Linux's ephemeral range
    (32768-60999). A cluster started on `port` listens on `port`, `port + 1`, ...: a port in the
    ephemeral range next to a bound one is where connect() picks its own ends (even ports, since
    bind(0) takes odd ones), so a restart there found one held ("Address already in use")."""
    import random
    import socket

    for _ in range(1_000):
        base = random.randrange(20_000, 32_000 - count)
        held = []
        try:
            for port in range(base, base + count):
                probe = socket.socket()
                held.append(probe)
                probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for probe in held:
                probe.close()
    raise RuntimeError(f"no {count} consecutive free ports below 32,000")
