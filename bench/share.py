"""Share-group throughput on one partition, beside a classic group on the same partition, same run.

    python -m bench.share [--json PATH] [--records N] [--repeat R] [--quick]

A 3-node LocalCluster holds one single-partition topic of 1 KB records. Each run reads it with a
fresh group, every member in a process of its own (spawn).

Figures (medians over --repeat runs), first with members that do no work per record (what the
delivery machinery costs):
- share_records_per_s_1 / _2 / _4: records delivered per second to 1, 2 and 4 members of a share
  group reading the one partition (implicit accept: each poll accepts the previous one's records;
  every acquisition and every acceptance is stored by the group coordinator before it answers);
- classic_records_per_s: one member of a classic group (railmq.consumer.Consumer with group_id)
  on the same partition, the baseline: a classic group gives a partition to one member, so this
  is its ceiling for one partition whatever the member count;
- share_ratio_1_to_classic / _4_to_classic, share_scaling_4_to_1: the ratios.

then with members whose handler takes --handler-ms per record (2 ms by default; 20 records per
poll, so no member hoards what others could handle), over --busy-records records: the case share
groups exist for, where one partition's records are handled in parallel:
- busy_classic_records_per_s, busy_share_records_per_s_1 / _2 / _4, busy_share_ratio_4_to_classic.

Timing starts at the first record any member receives (joining and the classic group's first
rebalance are not counted) and stops when the members together have received every record.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any, NamedTuple

from bench.common import median_of, parse_args, phase, report

RECORD_BYTES = 1000
MEMBER_COUNTS = (1, 2, 4)
RUN_TIMEOUT_S = 300


class Progress:
    """Shared between member processes: records received, and when the first one came."""

    def __init__(self, context: Any) -> None:
        self.received = context.Value("q", 0)
        self.first_at = context.Value("d", 0.0)
        self.first_batch = context.Value("q", 0)
        self.done_at = context.Value("d", 0.0)
        self.done = context.Event()
        self.ready = context.Semaphore(0)
        self.go = context.Event()

    def add(self, count: int, total: int) -> None:
        now = time.perf_counter()
        with self.received.get_lock():
            if self.first_at.value == 0.0:
                self.first_at.value, self.first_batch.value = now, count
            self.received.value += count
            if self.received.value >= total and not self.done.is_set():
                self.done_at.value = now
                self.done.set()

    def rate(self, total: int) -> float:
        return (total - self.first_batch.value) / max(1e-9, self.done_at.value - self.first_at.value)


class Work(NamedTuple):
    """What one run asks of its members."""

    total: int  # records to receive, all members together
    handler_ms: float = 0.0  # time spent per record
    max_poll_records: int = 500


def consume(consumer: Any, topic: str, work: Work, progress: Progress) -> None:
    progress.ready.release()
    progress.go.wait()
    consumer.subscribe([topic])
    while not progress.done.is_set():
        records = consumer.poll(100)
        for _ in records if work.handler_ms else ():
            time.sleep(work.handler_ms / 1000)
        if records:
            progress.add(len(records), work.total)


def share_member(bootstrap: str, topic: str, group: str, work: Work, progress: Progress, name: str) -> None:
    from railmq.share_consumer import ShareConsumer

    with ShareConsumer(bootstrap, group, max_poll_records=work.max_poll_records, client_id=name) as consumer:
        consume(consumer, topic, work, progress)
        consumer.commit()


def classic_member(bootstrap: str, topic: str, group: str, work: Work, progress: Progress, name: str) -> None:
    from railmq.consumer import Consumer

    with Consumer(bootstrap, group_id=group, auto_offset_reset="earliest", max_poll_records=work.max_poll_records,
                  client_id=name) as consumer:
        consume(consumer, topic, work, progress)


def run_group(target: Any, bootstrap: str, topic: str, group: str, members: int, work: Work) -> float:
    """Records per second for `members` processes running `target` in one fresh group."""
    context = multiprocessing.get_context("spawn")
    progress = Progress(context)
    total = work.total
    processes = [context.Process(target=target, args=(bootstrap, topic, group, work, progress, f"{group}-m{index}"))
                 for index in range(members)]
    for process in processes:
        process.start()
    try:
        for _ in processes:
            if not progress.ready.acquire(timeout=60):
                raise RuntimeError("a member process did not start")
        progress.go.set()
        if not progress.done.wait(RUN_TIMEOUT_S):
            raise RuntimeError(f"{group}: {progress.received.value} of {total} records in {RUN_TIMEOUT_S} s")
        return progress.rate(total)
    finally:
        progress.done.set()
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()


def produce(bootstrap: str, topic: str, count: int) -> None:
    from railmq.producer import Producer

    payload = os.urandom(RECORD_BYTES)
    with Producer(bootstrap, acks=1, linger_ms=5, batch_bytes_max=1024 * 1024) as producer:
        values = [payload] * 1000
        for _ in range(count // 1000):
            producer.send_batch(topic, values)
        producer.flush(120)


def arguments(parser: Any) -> None:
    parser.add_argument("--records", type=int, default=0, help="records per run (default 50,000; --quick 10,000)")
    parser.add_argument("--busy-records", type=int, default=0, help="records per busy run (default 2,000)")
    parser.add_argument("--handler-ms", type=float, default=2.0, help="busy runs: handling time per record")


def measure(cluster: Any, topic: str, prefix: str, work: Work, repeat: int, figures: dict[str, float]) -> None:
    runs = iter(range(1_000_000))
    kind = "busy handlers" if prefix else "no handler work"
    figures[f"{prefix}classic_records_per_s"] = median_of(repeat, lambda: run_group(
        classic_member, cluster.bootstrap, topic, f"{prefix}classic-{next(runs)}", 1, work),
        f"one classic member, {kind}")
    for members in MEMBER_COUNTS:
        figures[f"{prefix}share_records_per_s_{members}"] = median_of(repeat, lambda: run_group(
            share_member, cluster.bootstrap, topic, f"{prefix}share-{members}-{next(runs)}", members, work),
            f"a share group of {members}, {kind}")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], arguments)
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster

    total = args.records or (10_000 if args.quick else 50_000)
    total -= total % 1000
    busy_total = args.busy_records or (500 if args.quick else 2_000)
    figures: dict[str, float] = {}
    with LocalCluster(nodes=3, trace=False) as cluster, Admin(cluster.bootstrap) as admin:
        topic = "bench-share"
        admin.create_topic(topic, partitions=1, replication_factor=1, config={"segment_bytes": 256 * 1024 * 1024})
        phase(f"producing {total:,} records")
        produce(cluster.bootstrap, topic, total)
        measure(cluster, topic, "", Work(total), args.repeat, figures)
        measure(cluster, topic, "busy_", Work(busy_total, args.handler_ms, 20), args.repeat, figures)
    for prefix in ("", "busy_"):
        classic = figures[f"{prefix}classic_records_per_s"]
        for members in MEMBER_COUNTS:
            share = figures[f"{prefix}share_records_per_s_{members}"]
            figures[f"{prefix}share_ratio_{members}_to_classic"] = share / classic
        figures[f"{prefix}share_scaling_4_to_1"] = (figures[f"{prefix}share_records_per_s_4"]
                                                    / figures[f"{prefix}share_records_per_s_1"])
    report("bench.share", figures, args, {
        "record_bytes": RECORD_BYTES, "records_per_run": total, "busy_records_per_run": busy_total,
        "busy_handler_ms": args.handler_ms, "partitions": 1, "members": list(MEMBER_COUNTS)})


if __name__ == "__main__":
    main()
