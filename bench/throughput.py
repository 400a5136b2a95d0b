"""Produce and consume throughput through a real cluster, beside a raw pyzmq baseline.

    python -m bench.throughput [--json PATH] [--records N] [--quick]

Figures (medians over --repeat runs):
- produce_records_per_s / consume_records_per_s: 1 KB records, acks=1, batched (`send_batch`,
  1,000 records a call), through a 3-node LocalCluster, for a 1-partition and a 4-partition
  topic (the headline figures are the better of the two, each also reported);
  produce_send_per_record_records_per_s_*: the same with one `send` call per record;
- produce_ack_p50_us / produce_ack_p99_us: one small record at a time, send -> acknowledgement;
- zmq_pushpull_records_per_s: the same 1 KB payloads through a bare PUSH/PULL pair over
  tcp://127.0.0.1 between two processes, one record per message (the cost of moving the bytes
  with no broker at all), and zmq_pushpull_batched_mb_per_s with 1 MiB messages;
- zmq_roundtrip_p50_us / zmq_roundtrip_p99_us: the floor under produce_ack_*: a Python DEALER
  sends 100 bytes to a Python ROUTER in another process over loopback TCP, which sends them
  straight back, one at a time (no log, no I/O thread hand-off); produce_ack_p50_ratio_to_zmq_roundtrip
  says how many such round trips one acknowledged send costs.
"""

from __future__ import annotations

import multiprocessing
import os
import time

import zmq

from bench.common import median_of, parse_args, percentile, phase, plain_consume_rate, report

RECORD_BYTES = 1000


def _pull(endpoint: str, count: int, ready) -> None:
    context = zmq.Context()
    socket = context.socket(zmq.PULL)
    socket.connect(endpoint)
    ready.set()
    for _ in range(count):
        socket.recv(copy=False)
    socket.close()
    context.term()


def zmq_pushpull(count: int, size: int) -> float:
    """Messages per second from one process to another through PUSH/PULL over loopback TCP."""
    context = zmq.Context()
    socket = context.socket(zmq.PUSH)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    child = spawn.Process(target=_pull, args=(f"tcp://127.0.0.1:{port}", count, ready))
    child.start()
    ready.wait(30)
    payload = os.urandom(size)
    started = time.perf_counter()
    for _ in range(count):
        socket.send(payload, copy=size < 65536)
    child.join()
    elapsed = time.perf_counter() - started
    socket.close(linger=0)
    context.term()
    return count / elapsed


def _echo(endpoint: str, ready) -> None:
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    socket.connect(endpoint)
    ready.set()
    while True:
        frames = socket.recv_multipart(copy=False)
        if frames[-1].bytes == b"stop":
            break
        socket.send_multipart(frames, copy=False)
    socket.close(linger=0)
    context.term()


def zmq_roundtrip(samples: int) -> list[float]:
    """Microseconds per request -> reply between two Python processes (DEALER -> ROUTER echo)."""
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    port = socket.bind_to_random_port("tcp://127.0.0.1")  # the echo connects: no port to race for
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    child = spawn.Process(target=_echo, args=(f"tcp://127.0.0.1:{port}", ready))
    child.start()
    try:
        ready.wait(30)
        payload = b"x" * 100
        for _ in range(50):
            socket.send(payload)
            socket.recv()
        latencies = []
        for _ in range(samples):
            started = time.perf_counter()
            socket.send(payload)
            socket.recv(copy=False)
            latencies.append((time.perf_counter() - started) * 1e6)
        socket.send(b"stop")
        return latencies
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()
        socket.close(linger=0)
        context.term()


def produce(bootstrap: str, topic: str, count: int, payload: bytes, *, bulk: bool = True) -> float:
    """Records per second with `send_batch` (1,000 records a call) or one `send` per record."""
    from railmq.producer import Producer

    with Producer(bootstrap, acks=1, linger_ms=5, batch_bytes_max=1024 * 1024) as producer:
        producer.partitions_for(topic)
        started = time.perf_counter()
        if bulk:
            values = [payload] * 1000
            for _ in range(count // 1000):
                producer.send_batch(topic, values)
        else:
            send = producer.send
            for _ in range(count):
                send(topic, payload)
        producer.flush(120)
        return count / (time.perf_counter() - started)


def consume(bootstrap: str, topic: str, partitions: int, count: int) -> float:
    return plain_consume_rate(bootstrap, topic, partitions, count)


def ack_latency(bootstrap: str, topic: str, samples: int) -> list[float]:
    from railmq.producer import Producer

    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        for _ in range(50):
            producer.send(topic, b"warm").result(10)
        latencies = []
        for _ in range(samples):
            started = time.perf_counter()
            producer.send(topic, b"x" * 100).result(10)
            latencies.append((time.perf_counter() - started) * 1e6)
        return latencies


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: p.add_argument("--records", type=int, default=0))
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster

    count = args.records or (50_000 if args.quick else 300_000)
    payload = os.urandom(RECORD_BYTES)
    figures: dict[str, float] = {}
    figures["zmq_pushpull_records_per_s"] = median_of(args.repeat, lambda: zmq_pushpull(count, RECORD_BYTES),
                                                      "baseline: 1 KB messages through PUSH/PULL")
    figures["zmq_pushpull_batched_mb_per_s"] = median_of(args.repeat, lambda: zmq_pushpull(300, 1 << 20),
                                                         "baseline: 1 MiB messages") * (1 << 20) / 1e6
    phase("baseline: DEALER/ROUTER round trips")
    roundtrips = zmq_roundtrip(500 if args.quick else 3000)
    phase("starting a 3-node cluster")
    figures["zmq_roundtrip_p50_us"] = percentile(roundtrips, 0.50)
    figures["zmq_roundtrip_p99_us"] = percentile(roundtrips, 0.99)
    with LocalCluster(nodes=3, trace=False) as cluster, Admin(cluster.bootstrap) as admin:
        # Latency first, on a quiet cluster: after the throughput runs the kernel is still writing
        # back hundreds of MB of page cache, which is the disk's latency, not the broker's.
        admin.create_topic("bench-latency", partitions=1, replication_factor=1)
        phase("acknowledgement latency on a quiet cluster")
        latencies = ack_latency(cluster.bootstrap, "bench-latency", 500 if args.quick else 3000)
        for partitions in (1, 4):
            runs = []
            for run in range(args.repeat):
                topic = f"bench-{partitions}p-{run}"
                phase(f"produce and consume {count:,} records, {partitions} partition{'s' if partitions > 1 else ''} "
                      f"(run {run + 1} of {args.repeat})")
                admin.create_topic(topic, partitions=partitions, replication_factor=1,
                                   config={"segment_bytes": 256 * 1024 * 1024})
                produced = produce(cluster.bootstrap, topic, count, payload)
                consumed = consume(cluster.bootstrap, topic, partitions, count)
                single = produce(cluster.bootstrap, topic, count // 2, payload, bulk=False)
                runs.append((produced, consumed, single))
                admin.delete_topic(topic)
            figures[f"produce_records_per_s_{partitions}p"] = sorted(r[0] for r in runs)[len(runs) // 2]
            figures[f"consume_records_per_s_{partitions}p"] = sorted(r[1] for r in runs)[len(runs) // 2]
            figures[f"produce_send_per_record_records_per_s_{partitions}p"] = sorted(r[2] for r in runs)[len(runs) // 2]
    figures["produce_records_per_s"] = max(figures["produce_records_per_s_1p"], figures["produce_records_per_s_4p"])
    figures["consume_records_per_s"] = max(figures["consume_records_per_s_1p"], figures["consume_records_per_s_4p"])
    figures["produce_mb_per_s"] = figures["produce_records_per_s"] * RECORD_BYTES / 1e6
    figures["produce_ack_p50_us"] = percentile(latencies, 0.50)
    figures["produce_ack_p99_us"] = percentile(latencies, 0.99)
    figures["produce_ack_p50_ratio_to_zmq_roundtrip"] = figures["produce_ack_p50_us"] / figures["zmq_roundtrip_p50_us"]
    figures["produce_ratio_to_zmq_pushpull"] = figures["produce_records_per_s"] / figures["zmq_pushpull_records_per_s"]
    figures["consume_ratio_to_zmq_pushpull"] = figures["consume_records_per_s"] / figures["zmq_pushpull_records_per_s"]
    report("bench.throughput", figures, args, {"record_bytes": RECORD_BYTES, "records_per_run": count})


if __name__ == "__main__":
    main()
