"""End-to-end effect of the shared-memory ring in a real cluster (used by bench.ring).

Replication: RF=3, acks=all, 1 KB records sent with send_batch to one partition; the followers'
fetches carry the batches through rings when shared memory is on, through ZeroMQ when it is off.
Consumer fetch: the same records read back from the beginning by an assigned consumer with and
without its own rings. Each pair runs in fresh clusters in the same process, one after the other.
"""

from __future__ import annotations

import os
import time

from bench.common import phase, plain_consume_rate

RECORD_BYTES = 1000


def replication_and_fetch(records: int, shared_memory: bool) -> tuple[float, float]:
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster
    from railmq.producer import Producer

    values = [os.urandom(RECORD_BYTES)] * 1000
    with LocalCluster(nodes=3, trace=False, shared_memory=shared_memory) as cluster, Admin(cluster.bootstrap) as admin:
        admin.create_topic("rep", partitions=1, replication_factor=3,
                           config={"min_insync_replicas": 2, "segment_bytes": 512 * 1024 * 1024})
        admin.wait_for_leaders("rep", full_isr=True)
        with Producer(cluster.bootstrap, acks="all", linger_ms=5) as producer:
            producer.partitions_for("rep")
            started = time.perf_counter()
            for _ in range(records // 1000):
                producer.send_batch("rep", values)
            producer.flush(300)
            produce_rate = records / (time.perf_counter() - started)
        fetch_rate = plain_consume_rate(cluster.bootstrap, "rep", 1, records, shared_memory=shared_memory,
                                        fetch_partition_bytes_max=4 * 1024 * 1024)
    return produce_rate, fetch_rate


def cluster_figures(records: int, repeat: int) -> dict[str, float]:
    runs = {True: [], False: []}
    for run in range(repeat):
        for shared_memory in (False, True):
            phase(f"replication and consumer fetch, shared memory {'on' if shared_memory else 'off'} "
                  f"(run {run + 1} of {repeat})")
            runs[shared_memory].append(replication_and_fetch(records, shared_memory))
    figures = {}
    for shared_memory, label in ((True, "on"), (False, "off")):
        samples = runs[shared_memory]
        figures[f"replication_records_per_s_ring_{label}"] = sorted(s[0] for s in samples)[len(samples) // 2]
        figures[f"consumer_fetch_records_per_s_ring_{label}"] = sorted(s[1] for s in samples)[len(samples) // 2]
    figures["replication_ring_on_to_off_ratio"] = (figures["replication_records_per_s_ring_on"]
                                                   / figures["replication_records_per_s_ring_off"])
    figures["consumer_fetch_ring_on_to_off_ratio"] = (figures["consumer_fetch_records_per_s_ring_on"]
                                                      / figures["consumer_fetch_records_per_s_ring_off"])
    return figures
