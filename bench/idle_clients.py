"""What idle clients cost: CPU of a producer, group consumers, share consumers and the group
coordinator while nothing is produced.

    python -m bench.idle_clients [--idle-s 20] [--json PATH] [--quick]

A 3-node cluster with one topic of 3 partitions (RF 3). Each client runs in a process of its own
(spawned): one producer that sent one record and waits, two consumers of one group polling, and
two share consumers of one share group polling (each `poll(1000)` in a loop). Once the groups
are stable, the CPU of every process is read over `--idle-s` seconds:

- `client_cpu_cores`: the five client processes together, in cores;
- `group_coordinator_cpu_cores`: the group coordinator's processes (its voters);
- `cluster_cpu_cores`: every process of the cluster and this one (supervisor, node agents).

What is left when nothing moves is what the protocols need: heartbeats, the consumers' long polls
(each partition's fetch is answered empty every `fetch_max_wait_ms`) and the share members'
parked acquires. Before the clients and the group coordinator kept timers at their next
deadline, a consumer ticked every 100 ms, a share member every 50 ms, and the group coordinator
every 50 ms while a group had members.
"""

from __future__ import annotations

import multiprocessing
import time

import psutil

from bench.common import parse_args, phase, report
from bench.scale import cluster_processes, cpu_seconds

TOPIC = "idle"


def _arguments(parser) -> None:
    parser.add_argument("--idle-s", type=float, default=20.0, help="seconds of idle CPU measured (default 20)")


def _client(role: str, bootstrap: str, ready, stop) -> None:
    """One client process: settle into the idle state its role has, then wait to be stopped."""
    if role == "producer":
        from railmq.producer import Producer

        producer = Producer(bootstrap, acks="all")
        producer.send(TOPIC, b"one record, then nothing").result(30)
        ready.set()
        stop.wait()
        producer.close()
        return
    if role == "consumer":
        from railmq.consumer import Consumer

        client = Consumer(bootstrap, group_id="idle-group", auto_offset_reset="earliest")
    else:
        from railmq.share_consumer import ShareConsumer

        client = ShareConsumer(bootstrap, "idle-share-group")
    client.subscribe([TOPIC])
    while not stop.is_set():
        for record in client.poll(1000):
            if role == "share":
                client.acknowledge(record)
        if not ready.is_set() and _settled(client, role):
            ready.set()
    client.close()


def _settled(client, role: str) -> bool:
    if role == "consumer":
        return bool(client.assignment())
    return True


def measure(args) -> dict[str, float]:
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster

    context = multiprocessing.get_context("spawn")
    roles = ["producer", "consumer", "consumer", "share", "share"]
    with LocalCluster(nodes=3, trace=False) as cluster, Admin(cluster.bootstrap) as admin:
        phase("create the topic and wait for its leaders")
        admin.create_topic(TOPIC, partitions=3, replication_factor=3, wait=False)
        admin.wait_for_leaders(TOPIC, timeout_s=60, full_isr=True)
        stop = context.Event()
        readies = [context.Event() for _ in roles]
        clients = [context.Process(target=_client, args=(role, cluster.bootstrap, ready, stop), daemon=True)
                   for role, ready in zip(roles, readies)]
        try:
            phase("start a producer, two group consumers and two share consumers")
            for process in clients:
                process.start()
            for ready in readies:
                if not ready.wait(60):
                    raise RuntimeError("a client did not settle within 60 s")
            time.sleep(5)  # the groups' rebalances and first heartbeats pass
            phase(f"{args.idle_s:.0f} s of idle CPU")
            client_processes = [psutil.Process(process.pid) for process in clients]
            groups = [psutil.Process(actor["pid"]) for actor in cluster.actors()
                      if actor["pid"] and actor["kind"] == "group-coordinator"]
            everything = cluster_processes(cluster) + [psutil.Process()]
            measured = [client_processes, groups, everything]
            before, started = [cpu_seconds(each) for each in measured], time.monotonic()
            time.sleep(args.idle_s)
            elapsed = time.monotonic() - started
            clients_s, groups_s, cluster_s = [(cpu_seconds(each) - was) / elapsed
                                              for each, was in zip(measured, before)]
        finally:
            stop.set()
            for process in clients:
                process.join(15)
                if process.is_alive():
                    process.kill()
                    process.join(5)
    return {"client_cpu_cores": clients_s, "group_coordinator_cpu_cores": groups_s, "cluster_cpu_cores": cluster_s,
            "group_coordinator_processes": len(groups)}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], _arguments)
    if args.quick:
        args.idle_s = min(args.idle_s, 8.0)
    figures = measure(args)
    report("idle clients", figures, args, {"idle_s": args.idle_s, "clients": "1 producer, 2 consumers, 2 share"})


if __name__ == "__main__":
    main()
