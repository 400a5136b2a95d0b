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

In the same run, the baselines, each on its own cluster: bench.throughput's 4-partition figures
(RF 1: `baseline_produce_records_per_s_4p`, `baseline_consume_records_per_s_4p`) and the same
producer into 4 partitions at RF 3 (`baseline_produce_records_per_s_4p_rf3`: what replication
alone costs, with no more partitions); then `produce_ratio_to_4p_<n>p`,
`produce_ratio_to_4p_rf3_<n>p` and `consume_ratio_to_4p_<n>p`. Produce figures are medians of
`--repeat` runs; each consume starts after an `os.sync()`, so it does not time the write-back of
what was produced. Targets on the 2-core machine: 100 partitions ready in <= 20 s, idle CPU at 30
partitions <= 0.05 cores, unique memory <= 8 MB per replica, produce across 30 partitions >= the
4-partition baseline.

Also measured in the same run, as the floor under the produce figures: `page_cache_new_pages_mb_per_s`
and `page_cache_cached_pages_mb_per_s`, the CPU-time rate of 1 MiB pwrites into pages the kernel must
allocate (a log's new bytes) and into pages it has; and `page_cache_cores_at_produce_<n>p`, the
cores that writing each size's produced bytes three times (RF 3) into new pages takes at that rate.

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
        phase(f"{partitions} partitions: produce ({args.repeat} runs) and consume {records:,} records")
        figures[f"produce_records_per_s_{suffix}"] = produce_median(cluster.bootstrap, "scale", records, payload,
                                                                    args.repeat)
        figures[f"consume_records_per_s_{suffix}"] = consume_after_writeback(cluster.bootstrap, "scale", partitions,
                                                                             records)
    return figures


def page_cache_write_mb_per_s(megabytes: int = 256) -> tuple[float, float]:
    """The floor under every produce figure: MB/s of one process putting bytes into the page cache
    of the filesystem the clusters write to, in 1 MiB pwrites as a leader appends — into pages the
    kernel must first allocate (a log's new bytes: every replica's, so three times the records at
    RF 3) and into pages it already has (the same file written again). CPU seconds, not wall."""
    import tempfile

    block = os.urandom(1 << 20)
    with tempfile.TemporaryDirectory(prefix="railmq-bench-") as directory:
        fd = os.open(os.path.join(directory, "pages"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            rates = []
            for _ in range(2):  # new pages, then the same pages again
                started = time.process_time()
                for index in range(megabytes):
                    os.pwrite(fd, block, index << 20)
                rates.append(megabytes * 1.048576 / max(1e-9, time.process_time() - started))
        finally:
            os.close(fd)
    return rates[0], rates[1]


def consume_after_writeback(bootstrap: str, topic: str, partitions: int, records: int) -> float:
    """The read path alone: the kernel first writes back what the produce runs left dirty (three
    copies at RF 3, one at RF 1), which would otherwise be timed as the consumer's."""
    os.sync()
    return consume(bootstrap, topic, partitions, records)


def produce_median(bootstrap: str, topic: str, records: int, payload: bytes, repeat: int) -> float:
    return statistics.median(produce(bootstrap, topic, records, payload) for _ in range(max(1, repeat)))


def baselines_4p(records: int, payload: bytes, repeat: int) -> dict[str, float]:
    """bench.throughput's 4-partition figures (RF 1), and the same producer at RF 3, for the ratios."""
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster

    figures = {}
    for replication, suffix in ((1, ""), (3, "_rf3")):
        phase(f"baseline: 4 partitions at RF {replication}, produce ({repeat} runs)")
        with LocalCluster(nodes=3, trace=False) as cluster, Admin(cluster.bootstrap) as admin:
            admin.create_topic("baseline", partitions=4, replication_factor=replication,
                               config={"segment_bytes": 256 * 1024 * 1024})
            admin.wait_for_leaders("baseline", timeout_s=60, full_isr=True)
            figures[f"baseline_produce_records_per_s_4p{suffix}"] = produce_median(
                cluster.bootstrap, "baseline", records, payload, repeat)
            if replication == 1:
                figures["baseline_consume_records_per_s_4p"] = consume_after_writeback(cluster.bootstrap, "baseline", 4,
                                                                                       records)
    return figures


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], _arguments)
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    records = args.records or (50_000 if args.quick else 200_000)
    if args.quick:
        args.idle_s = min(args.idle_s, 10.0)
    payload = os.urandom(RECORD_BYTES)
    phase("baseline: writing into new and into cached page-cache pages")
    new_pages, cached_pages = page_cache_write_mb_per_s()
    figures: dict[str, float] = {"page_cache_new_pages_mb_per_s": new_pages,
                                 "page_cache_cached_pages_mb_per_s": cached_pages}
    figures.update(baselines_4p(records, payload, args.repeat))
    for partitions in sizes:
        figures.update(measure_size(partitions, args, records, payload))
        produced, consumed = figures[f"produce_records_per_s_{partitions}p"], figures[f"consume_records_per_s_{partitions}p"]
        figures[f"produce_ratio_to_4p_{partitions}p"] = produced / figures["baseline_produce_records_per_s_4p"]
        figures[f"produce_ratio_to_4p_rf3_{partitions}p"] = produced / figures["baseline_produce_records_per_s_4p_rf3"]
        figures[f"consume_ratio_to_4p_{partitions}p"] = consumed / figures["baseline_consume_records_per_s_4p"]
        # Cores that writing the produced bytes into new page-cache pages alone takes, three copies at RF 3.
        figures[f"page_cache_cores_at_produce_{partitions}p"] = produced * RECORD_BYTES * 3 / 1e6 / new_pages
    report("bench.scale", figures, args, {"sizes": sizes, "record_bytes": RECORD_BYTES, "records": records,
                                          "idle_s": args.idle_s, "replication_factor": 3, "nodes": 3})


if __name__ == "__main__":
    main()
