"""What a partition costs: processes, memory, idle CPU, readiness and throughput at 3, 30 and 100 partitions.

For each size, one 3-node cluster with one RF 3 topic of that many partitions:

- `processes_<n>p`: the cluster's processes (coordinator, group coordinator, one per replica);
- `rss_mb_per_replica_<n>p`, `uss_mb_per_replica_<n>p`: median resident and unique (private) memory
  of a replica process (psutil's USS: what the process alone costs the machine);
- `ready_s_<n>p`: from the create request to every partition led with its full ISR;
- `idle_cpu_cores_<n>p`: CPU of every process of the cluster (and of this process, which runs the
  supervisor and the node agent) over `--idle-s` seconds with nothing produced or consumed, in cores;
- `produce_records_per_s_<n>p`, `consume_records_per_s_<n>p`: 1 KB records across all partitions
  (bench.throughput's producer and plain consumer, RF 3, acks=1).

In the same run, the baseline: bench.throughput's 4-partition produce figure on its own cluster
(`baseline_produce_records_per_s_4p`), and `produce_ratio_to_4p_<n>p`. Targets on the 2-core
machine: 100 partitions ready in <= 20 s, idle CPU at 30 partitions <= 0.05 cores, unique memory
<= 8 MB per replica, produce across 30 partitions >= the 4-partition baseline.

    python -m bench.scale [--sizes 3,30,100] [--idle-s 30] [--records N] [--json PATH]
"""

from __future__ import annotations

import os
import statistics
import time

import psutil

from bench.common import parse_args, phase, report
from bench.throughput import RECORD_BYTES, consume, produce


def _arguments(parser) -> None:
    parser.add_argument("--sizes", default="3,30,100", help="partition counts to measure (default 3,30,100)")
    parser.add_argument("--idle-s", type=float, default=30.0, help="seconds of idle CPU measured (default 30)")
    parser.add_argument("--records", type=int, default=0, help="records produced per size (default 200,000)")


def cluster_processes(cluster) -> list[psutil.Process]:
    found = []
    for actor in cluster.actors():
        if actor["pid"]:
            try:
                found.append(psutil.Process(actor["pid"]))
            except psutil.Error:
                pass
    return found


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def idle_cpu_cores(cluster, seconds: float) -> float:
    """Cores the cluster uses with nothing to do: its actors plus this process (supervisor, node agent)."""
    processes = cluster_processes(cluster) + [psutil.Process()]
    before, started = cpu_seconds(processes), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(processes) - before) / (time.monotonic() - started)


def replica_memory_mb(cluster) -> tuple[float, float]:
    rss, uss = [], []
    for actor in cluster.actors():
        if actor["kind"] != "replica" or not actor["pid"]:
            continue
        try:
            info = psutil.Process(actor["pid"]).memory_full_info()
        except psutil.Error:
            continue
        rss.append(info.rss / 2**20)
        uss.append(info.uss / 2**20)
    return statistics.median(rss), statistics.median(uss)


def measure_size(partitions: int, args, records: int, payload: bytes) -> dict[str, float]:
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster

    figures: dict[str, float] = {}
    suffix = f"{partitions}p"
    with LocalCluster(nodes=3, trace=False) as cluster, Admin(cluster.bootstrap) as admin:
        phase(f"{partitions} partitions: create and wait for every leader and a full ISR")
        started = time.monotonic()
        admin.create_topic("scale", partitions=partitions, replication_factor=3, wait=False,
                           config={"segment_bytes": 64 * 1024 * 1024})
        admin.wait_for_leaders("scale", timeout_s=max(120.0, partitions * 2.0), full_isr=True)
        figures[f"ready_s_{suffix}"] = time.monotonic() - started
        figures[f"processes_{suffix}"] = len(cluster_processes(cluster))
        phase(f"{partitions} partitions: settling, then {args.idle_s:.0f} s of idle CPU")
        time.sleep(5)
        figures[f"idle_cpu_cores_{suffix}"] = idle_cpu_cores(cluster, args.idle_s)
        rss, uss = replica_memory_mb(cluster)
        figures[f"rss_mb_per_replica_{suffix}"] = rss
        figures[f"uss_mb_per_replica_{suffix}"] = uss
        phase(f"{partitions} partitions: produce and consume {records:,} records")
        figures[f"produce_records_per_s_{suffix}"] = produce(cluster.bootstrap, "scale", records, payload)
        figures[f"consume_records_per_s_{suffix}"] = consume(cluster.bootstrap, "scale", partitions, records)
    return figures


def baseline_produce_4p(records: int, payload: bytes) -> float:
    """bench.throughput's 4-partition figure (RF 1, its own cluster), for the ratio."""
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster

    phase("baseline: bench.throughput's 4-partition produce")
    with LocalCluster(nodes=3, trace=False) as cluster, Admin(cluster.bootstrap) as admin:
        admin.create_topic("baseline", partitions=4, replication_factor=1,
                           config={"segment_bytes": 256 * 1024 * 1024})
        return produce(cluster.bootstrap, "baseline", records, payload)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], _arguments)
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    records = args.records or (50_000 if args.quick else 200_000)
    if args.quick:
        args.idle_s = min(args.idle_s, 10.0)
    payload = os.urandom(RECORD_BYTES)
    figures: dict[str, float] = {"baseline_produce_records_per_s_4p": baseline_produce_4p(records, payload)}
    for partitions in sizes:
        figures.update(measure_size(partitions, args, records, payload))
        figures[f"produce_ratio_to_4p_{partitions}p"] = (
            figures[f"produce_records_per_s_{partitions}p"] / figures["baseline_produce_records_per_s_4p"])
    report("bench.scale", figures, args, {"sizes": sizes, "record_bytes": RECORD_BYTES, "records": records,
                                          "idle_s": args.idle_s, "replication_factor": 3, "nodes": 3})


if __name__ == "__main__":
    main()
