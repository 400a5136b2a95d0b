"""Hand bytes from one process to another: the shared-memory ring against pyzmq ipc:// and tcp://.

    python -m bench.ring [--json PATH] [--repeat N] [--quick] [--pace-us N]

Three workloads, each through four transports in the same run:

- 1 KB records streamed as fast as the sender can go (records/s, MB/s);
- 1 MiB batches streamed the same way (MB/s);
- paced 1 KB records, one every `--pace-us`, so the receiver is asleep when each arrives: the
  hand-off latency from the sender's call to the receiver holding the record (p50/p99, µs),
  doorbell wake-up included.

Transports: `ring` (record header check only: the payloads railmq moves are record batches with
a CRC of their own), `ring_crc` (CRC-32 of every payload on both sides as well, with
storage.checksum: ISA-L when installed, zlib otherwise), `zmq_ipc` and
`zmq_tcp` (PUSH/PULL; 1 MiB frames sent with copy=False and received as zero-copy frames).
Nobody spins: ring ends sleep on their ZeroMQ doorbell, zmq receivers in recv(). No receiver
reads the payload bytes (the ring hands out a view, zmq a frame): this measures hand-over.

End to end (bench/ring_cluster.py): RF=3 acks=all replication throughput and consumer fetch
throughput in real clusters with shared memory on and off, in the same run
(`replication_records_per_s_ring_on/off`, `consumer_fetch_records_per_s_ring_on/off`).

To explain the figures, the run also measures in one process what the ring cannot avoid: a
1 MiB memcpy, a 1 MiB CRC-32 (and zlib's, for scale), and the Python cost of one
try_write/try_read of 1 KB. Each
stream reports how often the ring's receiver went to sleep. MB means 10^6 bytes.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import struct
import time
import zlib
from typing import NamedTuple

import zmq

from bench.common import median_of, parse_args, percentile, phase, report
from storage.checksum import IMPLEMENTATION as CRC32_IMPLEMENTATION, crc32
from transport.ring import RingReader, RingWriter
from transport.shm import segment_name, unlink_segment

KIB = 1024
MIB = 1024 * 1024
TRANSPORTS = ("ring", "ring_crc", "zmq_ipc", "zmq_tcp")
STAMP = struct.Struct("<q")
# 1 KB records: about a thousand in flight, like zmq's default high-water mark of 1000 messages.
RING_CAPACITY_BYTES_SMALL = 1 * MIB
# 1 MiB batches: eight in flight; the writer seldom waits and the ring stays in the L3 cache.
RING_CAPACITY_BYTES_LARGE = 8 * MIB
ZERO_COPY_BYTES_MIN = 64 * KIB  # pyzmq copies smaller frames anyway
WAIT_TIMEOUT_MS = 30_000
CHILD_TIMEOUT_S = 60


class Run(NamedTuple):
    seconds: float
    latencies_us: list[float]
    receiver_sleeps: int  # ring only: times the receiver slept on its doorbell
    cpu_seconds: float  # sender and receiver processes together, all their threads


def _extra_arguments(parser) -> None:
    parser.add_argument("--pace-us", type=int, default=500, help="gap between paced records (latency)")


def _receive(transport: str, address: str, count: int, stamped: bool, connection) -> None:
    """Child process: take `count` records; report when the last one came, latencies, sleeps, CPU."""
    cpu_started = time.process_time()
    if transport.startswith("ring"):
        outcome = _receive_from_ring(address, count, stamped, connection)
    else:
        outcome = _receive_from_zmq(address, count, stamped, connection)
    connection.send((*outcome, time.process_time() - cpu_started))
    connection.close()


def _latency_us(record) -> float:
    return (time.perf_counter_ns() - STAMP.unpack_from(record)[0]) / 1000


def _receive_from_ring(name: str, count: int, stamped: bool, connection) -> tuple[int, list[float], int]:
    latencies_us: list[float] = []
    with RingReader.attach(name) as reader:
        connection.send("ready")
        received = 0
        while received < count:
            record = reader.read(timeout_ms=WAIT_TIMEOUT_MS)
            assert record is not None, "the sender stalled"
            while record is not None:  # take what is there, then free it all at once
                if stamped:
                    latencies_us.append(_latency_us(record))
                received += 1
                record = reader.try_read()
            reader.release()
        return time.perf_counter_ns(), latencies_us, reader.stats.wait_slices


def _receive_from_zmq(endpoint: str, count: int, stamped: bool, connection) -> tuple[int, list[float], int]:
    latencies_us: list[float] = []
    context = zmq.Context()
    inbox = context.socket(zmq.PULL)
    try:
        inbox.connect(endpoint)
        connection.send("ready")
        for _ in range(count):
            frame = inbox.recv(copy=False)
            if stamped:
                latencies_us.append(_latency_us(frame.buffer))
        return time.perf_counter_ns(), latencies_us, 0
    finally:
        inbox.close(linger=0)
        context.term()


class _Sender:
    """The parent's end of one transport: made before the child starts, closed after it ends."""

    def __init__(self, transport: str, payload_bytes: int) -> None:
        self._writer: RingWriter | None = None
        self._ipc_path: str | None = None
        tag = f"{transport}-{payload_bytes}"
        if transport.startswith("ring"):
            capacity = RING_CAPACITY_BYTES_LARGE if payload_bytes >= MIB else RING_CAPACITY_BYTES_SMALL
            self.address = segment_name(f"bench-{os.getpid()}", "sender", tag)
            self._writer = RingWriter.create(self.address, capacity, payload_crc=transport == "ring_crc",
                                             replace=True)
            return
        self._context = zmq.Context()
        self._outbox = self._context.socket(zmq.PUSH)
        if transport == "zmq_ipc":
            self._ipc_path = f"/tmp/railmq-bench-{os.getpid()}-{tag}.ipc"
            self._outbox.bind(f"ipc://{self._ipc_path}")
        else:
            self._outbox.bind("tcp://127.0.0.1:*")
        self.address = self._outbox.getsockopt_string(zmq.LAST_ENDPOINT)
        self._copy = payload_bytes < ZERO_COPY_BYTES_MIN

    def send(self, payload) -> None:
        if self._writer is not None:
            self._writer.write(payload, timeout_ms=WAIT_TIMEOUT_MS)
        else:
            self._outbox.send(payload, copy=self._copy)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            unlink_segment(self.address)
            return
        self._outbox.close(linger=0)
        self._context.term()
        if self._ipc_path is not None and os.path.exists(self._ipc_path):
            os.unlink(self._ipc_path)


def measure(transport: str, payload_bytes: int, count: int, pace_us: int = 0) -> Run:
    """Spawn a receiver, send it `count` records of `payload_bytes`, time the hand-over."""
    context = multiprocessing.get_context("spawn")
    sender = _Sender(transport, payload_bytes)
    ours, theirs = context.Pipe()
    child = context.Process(target=_receive, args=(transport, sender.address, count, pace_us > 0, theirs))
    try:
        child.start()
        theirs.close()
        if not ours.poll(CHILD_TIMEOUT_S) or ours.recv() != "ready":
            raise RuntimeError(f"{transport} receiver did not start")
        payload = bytearray(os.urandom(payload_bytes))
        cpu_started = time.process_time()
        start_ns = time.perf_counter_ns()
        for _ in range(count):
            if pace_us:
                time.sleep(pace_us / 1e6)
                STAMP.pack_into(payload, 0, time.perf_counter_ns())
            sender.send(payload)
        if not ours.poll(CHILD_TIMEOUT_S):
            raise RuntimeError(f"{transport} receiver did not finish")
        last_ns, latencies_us, receiver_sleeps, receiver_cpu_s = ours.recv()
        sender_cpu_s = time.process_time() - cpu_started
        return Run((last_ns - start_ns) / 1e9, latencies_us, receiver_sleeps, sender_cpu_s + receiver_cpu_s)
    finally:
        child.join(CHILD_TIMEOUT_S)
        if child.is_alive():
            child.kill()
            child.join()
        ours.close()
        sender.close()


def _mb_per_s(work, payload_bytes: int, rounds: int) -> float:
    started = time.perf_counter()
    for _ in range(rounds):
        work()
    return payload_bytes * rounds / (time.perf_counter() - started) / 1e6


def _microseconds_per_call(work, rounds: int) -> float:
    started = time.perf_counter()
    for _ in range(rounds):
        work()
    return (time.perf_counter() - started) / rounds * 1e6


def single_process_costs(repeat: int) -> dict[str, float]:
    """What one core spends per hand-over when no other process is involved."""
    source = os.urandom(MIB)
    target = memoryview(bytearray(RING_CAPACITY_BYTES_LARGE))
    slots = RING_CAPACITY_BYTES_LARGE // MIB
    turn = [0]

    def copy() -> None:
        slot = turn[0] = (turn[0] + 1) % slots
        target[slot * MIB:(slot + 1) * MIB] = source

    figures = {
        "memcpy_mb_per_s_1mib": median_of(repeat, lambda: _mb_per_s(copy, MIB, 200)),
        "crc32_mb_per_s_1mib": median_of(repeat, lambda: _mb_per_s(lambda: crc32(source), MIB, 200)),
        "zlib_crc32_mb_per_s_1mib": median_of(repeat, lambda: _mb_per_s(lambda: zlib.crc32(source), MIB, 50)),
    }
    name = segment_name(f"bench-{os.getpid()}", "costs", "ring")
    record = os.urandom(KIB)
    with RingWriter.create(name, RING_CAPACITY_BYTES_SMALL, payload_crc=False, replace=True) as writer:
        with RingReader.attach(name) as reader:
            def write_then_read(rounds: int = 500) -> tuple[float, float]:
                write_us = _microseconds_per_call(lambda: writer.try_write(record), rounds)
                read_us = _microseconds_per_call(reader.try_read, rounds)
                reader.release()
                return write_us, read_us

            samples = [write_then_read() for _ in range(max(3, repeat))]
    figures["ring_try_write_us_1kb"] = sorted(write for write, _ in samples)[len(samples) // 2]
    figures["ring_try_read_us_1kb"] = sorted(read for _, read in samples)[len(samples) // 2]
    return figures


def stream_figures(transport: str, args, counts: dict[str, int]) -> dict[str, float]:
    small = [measure(transport, KIB, counts["records_1kb"]) for _ in range(max(1, args.repeat))]
    large = [measure(transport, MIB, counts["batches_1mib"]) for _ in range(max(1, args.repeat))]
    paced = measure(transport, KIB, counts["paced_1kb"], args.pace_us).latencies_us
    small_s = statistics.median(run.seconds for run in small)
    large_s = statistics.median(run.seconds for run in large)
    figures = {
        f"{transport}_records_per_s_1kb": counts["records_1kb"] / small_s,
        f"{transport}_mb_per_s_1kb": counts["records_1kb"] * KIB / small_s / 1e6,
        f"{transport}_mb_per_s_1mib": counts["batches_1mib"] * MIB / large_s / 1e6,
        f"{transport}_cpu_ms_per_gb_1mib":
            statistics.median(run.cpu_seconds for run in large) * 1000 / (counts["batches_1mib"] * MIB / 1e9),
        f"{transport}_cpu_us_per_record_1kb":
            statistics.median(run.cpu_seconds for run in small) * 1e6 / counts["records_1kb"],
        f"{transport}_latency_p50_us": percentile(paced, 0.50),
        f"{transport}_latency_p99_us": percentile(paced, 0.99),
    }
    if transport.startswith("ring"):
        small_sleeps = statistics.median(run.receiver_sleeps for run in small)
        large_sleeps = statistics.median(run.receiver_sleeps for run in large)
        per_thousand = small_sleeps / counts["records_1kb"] * 1000
        figures[f"{transport}_receiver_sleeps_per_1000_records_1kb"] = per_thousand
        figures[f"{transport}_receiver_sleeps_per_batch_1mib"] = large_sleeps / counts["batches_1mib"]
    return figures


def ratios(figures: dict[str, float]) -> dict[str, float]:
    """Each ring figure over the same figure for each zmq baseline (above 1: the ring wins)."""
    result = {}
    for transport in ("ring", "ring_crc"):
        for baseline in ("zmq_ipc", "zmq_tcp"):
            for unit in ("mb_per_s_1mib", "records_per_s_1kb"):
                result[f"{transport}_vs_{baseline}_{unit}"] = (
                    figures[f"{transport}_{unit}"] / figures[f"{baseline}_{unit}"])
    return result


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], _extra_arguments)
    counts = {
        "records_1kb": 20_000 if args.quick else 200_000,
        "batches_1mib": 200 if args.quick else 2_000,
        "paced_1kb": 300 if args.quick else 2_000,
    }
    figures: dict[str, float] = {}
    for transport in TRANSPORTS:
        phase(f"streaming through {transport}")
        figures.update(stream_figures(transport, args, counts))
    phase("single-process costs: memcpy and CRC-32")
    figures.update(single_process_costs(args.repeat))
    figures.update(ratios(figures))
    from bench.ring_cluster import cluster_figures

    phase("a real cluster with shared memory off and on")
    figures.update(cluster_figures(50_000 if args.quick else 200_000, args.repeat))
    notes = {
        "counts": counts,
        "ring_capacity_bytes": {"1kb": RING_CAPACITY_BYTES_SMALL, "1mib": RING_CAPACITY_BYTES_LARGE},
        "pace_us": args.pace_us,
        "throughput": "median over --repeat runs, each in a fresh receiver process",
        "latency": "one paced run; sender stamps perf_counter_ns (CLOCK_MONOTONIC), receiver subtracts",
        "crc32": CRC32_IMPLEMENTATION,
    }
    report("ring vs pyzmq: one process hands bytes to another", figures, args, notes)


if __name__ == "__main__":
    main()
