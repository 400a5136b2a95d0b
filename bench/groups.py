"""Consumer-group rebalance pauses (eager vs cooperative) and group consume throughput.

    python -m bench.groups [--json PATH] [--trials N] [--quick]

Rebalance pause: a 3-member group reads a 6-partition topic that a producer keeps writing to
(about 100 records/s per partition). A fourth member joins, or a member leaves, alternately; the
pause of one trial is the longest gap between two deliveries of any one partition from that
moment until the group has settled on a new generation and every partition has flowed for a
second (the floor is the gap between records, ~10-20 ms). Reported per assignor as p50/p99 over
the trials, with the default group timeouts. Eager assignors (range) revoke every partition on every
rebalance; cooperative-sticky moves only the partitions that change owner.

Group consume throughput: one member of a group reads 1 KB records and commits after every
batch it polls (synchronously), beside a plain assigned consumer of the same data in the same run.
"""

from __future__ import annotations

import os
import threading
import time

from bench.common import parse_args, percentile, phase, plain_consume_rate, report

PARTITIONS = 6


class Member:
    """A group member polling in its own thread, noting when each partition last delivered."""

    def __init__(self, bootstrap: str, group: str, topic: str, assignor: str, name: str, board: "Board") -> None:
        from railmq.consumer import Consumer

        self.consumer = Consumer(bootstrap, group_id=group, assignor=assignor, client_id=name,
                                 auto_offset_reset="latest", enable_auto_commit=True)
        self.consumer.subscribe([topic])
        self.board = board
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for record in self.consumer.poll(20):
                self.board.delivered(record.partition)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.consumer.close()


class Board:
    """Delivery times per partition; the pause of a trial is the longest gap between two
    deliveries of one partition inside the trial's window."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: dict[int, list[float]] = {}

    def delivered(self, partition: int) -> None:
        now = time.perf_counter()
        with self.lock:
            self.times.setdefault(partition, []).append(now)

    def pause_ms(self, start: float, end: float) -> float:
        worst = 0.0
        with self.lock:
            for partition in range(PARTITIONS):
                inside = [start] + [t for t in self.times.get(partition, []) if start <= t <= end] + [end]
                worst = max(worst, max(b - a for a, b in zip(inside, inside[1:])))
            self.times = {p: [t for t in ts if t > end] for p, ts in self.times.items()}
        return worst * 1000


def settled(members: list[Member]) -> bool:
    generations = {member.consumer._group.generation for member in members}
    owned = sorted(tp for member in members for tp in member.consumer.assignment())
    return len(generations) == 1 and len(owned) == PARTITIONS and len(set(owned)) == PARTITIONS


def steady_writer(bootstrap: str, topic: str, stop: threading.Event) -> None:
    from railmq.producer import Producer

    with Producer(bootstrap, acks=1, linger_ms=1) as producer:
        while not stop.is_set():
            for partition in range(PARTITIONS):
                producer.send(topic, b"tick", partition=partition)
            time.sleep(0.01)


def rebalance_pauses(bootstrap: str, admin, assignor: str, trials: int) -> list[float]:
    topic = f"pause-{assignor}"
    admin.create_topic(topic, partitions=PARTITIONS)
    stop = threading.Event()
    writer = threading.Thread(target=steady_writer, args=(bootstrap, topic, stop), daemon=True)
    writer.start()
    board = Board()
    members = [Member(bootstrap, topic, topic, assignor, f"m{i}", board) for i in range(3)]
    samples = []
    try:
        time.sleep(3.0)  # let the group settle
        for trial in range(trials):
            start = time.perf_counter()
            if trial % 2 == 0:
                members.append(Member(bootstrap, topic, topic, assignor, f"extra{trial}", board))
            else:
                members.pop().close()
            time.sleep(0.3)
            deadline = time.monotonic() + 30
            while not settled(members) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(1.0)  # every partition has flowed again for a while
            samples.append(board.pause_ms(start, time.perf_counter()))
    finally:
        for member in members:
            member.close()
        stop.set()
        writer.join(10)
    return samples


def consume_throughput(bootstrap: str, admin, count: int) -> tuple[float, float]:
    from railmq.consumer import Consumer
    from railmq.producer import Producer

    admin.create_topic("throughput", partitions=1, config={"segment_bytes": 256 * 1024 * 1024})
    values = [os.urandom(1000)] * 1000
    with Producer(bootstrap, acks=1, linger_ms=5) as producer:
        for _ in range(count // 1000):
            producer.send_batch("throughput", values)
        producer.flush(120)
    with Consumer(bootstrap, group_id="throughput", auto_offset_reset="earliest", enable_auto_commit=False,
                  max_poll_records=10_000, fetch_partition_bytes_max=8 * 1024 * 1024) as member:
        member.subscribe(["throughput"])
        while not member.assignment():
            member.poll(100)
        started, seen = time.perf_counter(), 0
        while seen < count:
            records = member.poll(1000)
            if records:
                seen += len(records)
                member.commit()
        group_rate = seen / (time.perf_counter() - started)
    return group_rate, plain_consume_rate(bootstrap, "throughput", 1, count)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: p.add_argument("--trials", type=int, default=0))
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster

    trials = args.trials or (6 if args.quick else 20)
    figures: dict[str, float] = {}
    notes: dict[str, list[float]] = {}
    with LocalCluster(nodes=3, trace=False) as cluster, Admin(cluster.bootstrap) as admin:
        for label, assignor in (("eager", "range"), ("cooperative", "cooperative-sticky")):
            phase(f"{trials} rebalances with the {assignor} assignor")
            samples = rebalance_pauses(cluster.bootstrap, admin, assignor, trials)
            notes[f"rebalance_pause_ms_{label}"] = samples
            figures[f"rebalance_pause_p50_ms_{label}"] = percentile(samples, 0.5)
            figures[f"rebalance_pause_p99_ms_{label}"] = percentile(samples, 0.99)
        phase("consume throughput: a group member beside an assigned consumer")
        group_rate, plain_rate = consume_throughput(cluster.bootstrap, admin, 100_000 if args.quick else 300_000)
    figures["group_consume_records_per_s"] = group_rate
    figures["assigned_consume_records_per_s"] = plain_rate
    figures["group_to_assigned_ratio"] = group_rate / plain_rate
    report("bench.groups", figures, args, notes)


if __name__ == "__main__":
    main()
