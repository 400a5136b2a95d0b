"""How long a replica that lost or damaged its disk takes to repair from its peers.

    python -m bench.repair [--json PATH] [--repeat N] [--quick] [--megabytes 100]

A 3-node cluster; one topic with one partition, RF 3, min in-sync 2, holding `--megabytes` of
1 KB records. Then, for each fault and each repeat, on a follower's directory:

- `wipe`: the replica is killed and its whole directory deleted (a replaced disk); it restarts
  empty and must fetch everything;
- `corrupt`: one byte of an early batch is flipped in place while the replica runs (bit rot); the
  scrubber finds it, the replica truncates below it and fetches the rest again. The cluster runs
  with a scrub pass every second (`scrub_pass_interval_ms=1000`; the default, 10 minutes, bounds
  the scrubber's reading on a box of many large replicas), and `found_corrupt_ms` is the time to
  the damage being found.

The figure is the time from the fault to the replica being back in the ISR with its storage `ok`
(and, for `corrupt`, to the damage being found). The baseline in the same run is the time to
produce the data in the first place (acks=all), so the ratio says how repair compares with
writing the partition. Nothing is asserted: a benchmark prints figures.
"""

from __future__ import annotations

import random
import time

from bench.common import median_of, parse_args, phase, report

RECORD_BYTES = 1000


def produce(bootstrap: str, topic: str, megabytes: int) -> float:
    from railmq.producer import Producer

    count = megabytes * 1_000_000 // RECORD_BYTES
    value = b"r" * RECORD_BYTES
    started = time.perf_counter()
    with Producer(bootstrap, acks="all", linger_ms=5) as producer:
        for start in range(0, count, 10_000):
            producer.send_batch(topic, [value] * min(10_000, count - start), partition=0)
        producer.flush(600)
    return (time.perf_counter() - started) * 1000


def repaired(admin, topic: str, node: int) -> bool:
    partition = admin.describe_topic(topic).partitions[0]
    info = next(info for info in partition.replica_info if info.node == node)
    return node in partition.isr and info.alive and info.storage.state == "ok" and \
        info.log_end_offset == next(i.log_end_offset for i in partition.replica_info if i.node == partition.leader)


def wait(predicate, timeout_s: float = 600.0) -> float:
    started = time.perf_counter()
    while not predicate():
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError("the replica did not repair in time")
        time.sleep(0.02)
    return (time.perf_counter() - started) * 1000


def one_repair(cluster, admin, topic: str, fault: str, rng: random.Random) -> float:
    from chaos.nemesis import flip_payload_byte, wipe_directory
    from transport.actor_main import replica_directory

    metadata = admin.describe_topic(topic)
    partition = metadata.partitions[0]
    node = next(n for n in partition.replicas if n != partition.leader)
    directory = replica_directory(cluster.data_dir, node, topic, 0, metadata.topic_id)
    name = cluster.replica_name(topic, 0, node)
    started = time.perf_counter()
    if fault == "wipe":
        cluster.kill(name)
        wipe_directory(directory)
        wait(lambda: not repaired(admin, topic, node))
    else:
        flip_payload_byte(directory, rng)
        found_ms.append(wait(lambda: next(i for i in admin.describe_topic(topic).partitions[0].replica_info
                                          if i.node == node).storage.state != "ok"))
    wait(lambda: repaired(admin, topic, node))
    return (time.perf_counter() - started) * 1000


found_ms: list[float] = []  # per corrupt repair: the time until the scrubber found the damage


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: p.add_argument("--megabytes", type=int, default=100))
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster

    megabytes = 10 if args.quick else args.megabytes
    rng = random.Random(7)
    figures: dict = {"megabytes": megabytes}
    from actors.limits import Limits

    with LocalCluster(nodes=3, trace=False, limits=Limits(scrub_pass_interval_ms=1000)) as cluster, \
            Admin(cluster.bootstrap) as admin:
        admin.create_topic("repair", partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        admin.wait_for_leaders("repair", full_isr=True)
        phase(f"producing {megabytes} MB (acks=all): the baseline")
        figures["produce_ms"] = round(produce(cluster.bootstrap, "repair", megabytes))
        wait(lambda: all(repaired(admin, "repair", node) for node in (1, 2, 3)))
        for fault in ("wipe", "corrupt"):
            samples = median_of(args.repeat, lambda: one_repair(cluster, admin, "repair", fault, rng),
                                label=f"repairing a follower after {fault}")
            figures[f"repair_{fault}_ms"] = round(samples)
            figures[f"repair_{fault}_vs_produce"] = round(samples / figures["produce_ms"], 2)
        figures["found_corrupt_ms"] = round(sorted(found_ms)[len(found_ms) // 2])
    report("bench.repair", figures, args)


if __name__ == "__main__":
    main()
