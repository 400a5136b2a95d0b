"""Leader failover under acks=all load, and replicated produce throughput.

    python -m bench.failover [--json PATH] [--kills N] [--quick]

A 3-node cluster with default settings; topic RF=3, min in-sync 2. A producer thread sends
acks=all records continuously (idempotent, so retries write nothing twice). N times: kill -9 the
partition's leader, measure the time from the kill to the first acknowledgement that arrives
after it of a record sent after it (only the new leader can acknowledge that), then wait until
the killed replica is back in the ISR.

Figures: failover_p50_ms, failover_p99_ms, failover_max_ms; acknowledged and lost (acknowledged
writes missing from the log afterwards: must be 0); produce_rf3_acks_all_records_per_s and
produce_rf1_acks_1_records_per_s (1 KB records, send_batch) measured in the same run.
"""

from __future__ import annotations

import os
import threading
import time

from bench.common import parse_args, percentile, phase, report
from bench.throughput import RECORD_BYTES

OUTSTANDING_RECORDS_MAX = 200


class AckRecorder:
    def __init__(self, bootstrap: str, topic: str) -> None:
        from railmq.producer import Producer

        self.producer = Producer(bootstrap, acks="all", idempotent=True, request_timeout_ms=1000,
                                 retry_backoff_ms=20, linger_ms=0)
        self.topic = topic
        self.acks: list[tuple[float, int, str, float]] = []  # (acknowledged, offset, value, invoked)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        # Closed loop: at most this many records unacknowledged, so a record sent after a kill
        # does not queue behind a backlog and the figure measures failover, not queueing.
        self.outstanding = threading.BoundedSemaphore(OUTSTANDING_RECORDS_MAX)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        sequence = 0
        while not self.stop.is_set():
            value = f"v{sequence}"
            sequence += 1
            while not self.outstanding.acquire(timeout=0.1):
                if self.stop.is_set():
                    return
            invoked = time.perf_counter()
            future = self.producer.send(self.topic, value, partition=0)
            future.add_done_callback(lambda done, value=value, invoked=invoked: self._on_ack(done, value, invoked))

    def _on_ack(self, future, value: str, invoked: float) -> None:
        self.outstanding.release()
        if future.exception(0) is None:
            with self.lock:
                self.acks.append((time.perf_counter(), future.result(0).offset, value, invoked))

    def first_ack_after(self, moment: float, timeout_s: float = 30.0) -> float | None:
        """The first acknowledgement of a record sent after `moment`: only a new leader can give it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                later = [when for when, _, _, invoked in self.acks[-5000:] if invoked > moment]
            if later:
                return min(later)
            time.sleep(0.002)
        return None

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.producer.close(60)


def wait_full_isr(admin, topic: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        partition = admin.describe_topic(topic).partitions[0]
        if partition.leader_endpoint and len(partition.isr) == len(partition.replicas):
            return
        time.sleep(0.05)
    raise TimeoutError(f"the ISR did not recover: {admin.describe_topic(topic).partitions[0]}")


def throughput(bootstrap: str, topic: str, acks, count: int) -> float:
    from railmq.producer import Producer

    values = [os.urandom(RECORD_BYTES)] * 1000
    with Producer(bootstrap, acks=acks, linger_ms=5) as producer:
        producer.partitions_for(topic)
        started = time.perf_counter()
        for _ in range(count // 1000):
            producer.send_batch(topic, values)
        producer.flush(300)
        return count / (time.perf_counter() - started)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: p.add_argument("--kills", type=int, default=0))
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster
    from railmq.consumer import Consumer

    kills = args.kills or (5 if args.quick else 20)
    count = 50_000 if args.quick else 200_000
    samples: list[float] = []
    phase("starting a 3-node cluster")
    with LocalCluster(nodes=3, trace=False) as cluster, Admin(cluster.bootstrap) as admin:
        admin.create_topic("rf3", partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        admin.create_topic("rf1", partitions=1, replication_factor=1)
        wait_full_isr(admin, "rf3")
        phase(f"baseline: {count:,} records to rf3 (acks=all) and rf1 (acks=1)")
        figures: dict[str, float] = {
            "produce_rf3_acks_all_records_per_s": throughput(cluster.bootstrap, "rf3", "all", count),
            "produce_rf1_acks_1_records_per_s": throughput(cluster.bootstrap, "rf1", 1, count),
        }
        admin.create_topic("failover", partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        wait_full_isr(admin, "failover")
        recorder = AckRecorder(cluster.bootstrap, "failover")
        recorder.thread.start()
        time.sleep(1.0)
        for kill in range(kills):
            wait_full_isr(admin, "failover")
            time.sleep(0.3)
            leader = cluster.leader_of("failover", 0)
            phase(f"kill {kill + 1} of {kills}: {leader}")
            moment = time.perf_counter()
            cluster.kill(leader)
            first = recorder.first_ack_after(moment)
            if first is not None:
                samples.append((first - moment) * 1000)
            print(f"kill {kill + 1}/{kills}: {leader} -> first ack after {samples[-1]:.0f} ms", flush=True)
        recorder.close()
        phase("reading back every acknowledged record")
        acked = {value: offset for _, offset, value, _ in recorder.acks}
        with Consumer(cluster.bootstrap, auto_offset_reset="earliest", max_poll_records=10_000) as consumer:
            consumer.assign([("failover", 0)])
            end = consumer.end_offsets([("failover", 0)])[("failover", 0)]
            seen: dict[str, int] = {}
            deadline = time.monotonic() + 60
            while len(seen) < end and time.monotonic() < deadline:
                for record in consumer.poll(500):
                    seen[record.value.decode()] = record.offset
    lost = [value for value, offset in acked.items() if seen.get(value) != offset]
    figures.update({
        "failover_p50_ms": percentile(samples, 0.5),
        "failover_p99_ms": percentile(samples, 0.99),
        "failover_max_ms": max(samples),
        "kills": len(samples),
        "acknowledged": len(acked),
        "lost": len(lost),
        "rf3_to_rf1_ratio": figures["produce_rf3_acks_all_records_per_s"] / figures["produce_rf1_acks_1_records_per_s"],
    })
    report("bench.failover", figures, args, {"samples_ms": samples})


if __name__ == "__main__":
    main()
