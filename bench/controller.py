"""The controller quorum: failover of the metadata and the group quorum, node loss, metadata rate.

    python -m bench.controller [--json PATH] [--kills N] [--quick] [--node-mb MB]

On a 3-node cluster with the quorums (LocalCluster's default):

- controller failover: N times, kill -9 the active controller and time from the kill to the
  first metadata change accepted again (a CreateTopic answered without error, retried at once on
  any refusal or timeout). Figures: controller_failover_p50_ms / _p99_ms / _max_ms.
- group failover: a member commits in a closed loop; N times, kill -9 the active group voter and
  time from the kill to the first commit accepted after it. group_failover_p50_ms / _p99_ms.
- node loss: `--node-mb` MB (default 100) acknowledged (acks=all) into a one-partition RF 3 topic,
  so each replica holds that much, then every process of the
  node whose controller is active killed and its directory deleted; time until every partition has
  its full ISR again with the node's replicas holding the whole log (node_loss_full_isr_s), and
  how many acknowledged records were lost afterwards (must be 0).
- metadata changes per second, with the quorum and, alternately in the same run, with the single
  coordinator (`controllers=0`): topics created one after another (each also starts a replica
  process) and topic config changes (the metadata path alone), each acknowledged once durable:
  topics_created_per_s_quorum / _single / _ratio, config_changes_per_s_quorum / _single / _ratio.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

from bench.common import parse_args, percentile, phase, report

CREATE_TIMEOUT_MS = 1_000  # one attempt; the loop retries at once until the quorum answers


def create_when_possible(admin, name: str) -> float:
    """Create `name`, retrying until accepted; returns when it was (time.perf_counter)."""
    from actors.errors import ErrorCode, RailmqError

    while True:
        try:
            admin.create_topic(name, partitions=1, replication_factor=1, wait=False)
            return time.perf_counter()
        except RailmqError as error:
            if error.code == ErrorCode.TOPIC_ALREADY_EXISTS:  # an attempt that timed out had landed
                return time.perf_counter()
            time.sleep(0.005)


def controller_failover(cluster, kills: int) -> list[float]:
    from railmq.admin import Admin

    samples = []
    with Admin(cluster.bootstrap, timeout_ms=CREATE_TIMEOUT_MS) as admin:
        create_when_possible(admin, "warm-up")
        for kill in range(kills):
            victim = cluster.active_controller()
            phase(f"controller kill {kill + 1} of {kills}: {victim}")
            moment = time.perf_counter()
            cluster.kill(victim)
            accepted = create_when_possible(admin, f"after-kill-{kill}")
            samples.append((accepted - moment) * 1000)
            wait_all_voters(cluster)
    return samples


def wait_all_voters(cluster, timeout_s: float = 30.0) -> None:
    """Every voter of both quorums running again and caught up, so the next kill starts even."""
    from railmq.admin import Admin

    deadline = time.monotonic() + timeout_s
    with Admin(cluster.bootstrap, timeout_ms=2_000) as admin:
        while time.monotonic() < deadline:
            alive = all(cluster.actor(name).alive for name in cluster.controller_names() + cluster.group_voter_names())
            status = admin.quorum_status(timeout_s=1.0)
            if alive and len({entry.commit_index for entry in status}) == 1 and any(e.active for e in status):
                return
            time.sleep(0.05)


def group_failover(cluster, kills: int) -> list[float]:
    from actors.errors import RailmqError
    from railmq.admin import Admin
    from railmq.consumer import Consumer
    from railmq.records import TopicPartition

    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("group-bench", partitions=1, replication_factor=3)
    accepted: list[tuple[float, float]] = []  # (commit called, commit acknowledged)
    lock = threading.Lock()
    stop = threading.Event()

    def commit_loop() -> None:
        # An explicit offset: a commit with nothing to commit (no assignment during a rejoin)
        # would return at once without asking anyone, and measure nothing.
        offsets = {TopicPartition("group-bench", 0): 1}
        with Consumer(cluster.bootstrap, group_id="bench-group", auto_offset_reset="earliest") as member:
            member.subscribe(["group-bench"])
            while not stop.is_set():
                member.poll(20)
                started = time.perf_counter()
                try:
                    member.commit(offsets)
                except RailmqError:
                    continue
                with lock:
                    accepted.append((started, time.perf_counter()))

    thread = threading.Thread(target=commit_loop, daemon=True)
    thread.start()
    samples = []
    try:
        deadline = time.monotonic() + 30
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.05)
        for kill in range(kills):
            victim = active_group_voter(cluster)
            phase(f"group-coordinator kill {kill + 1} of {kills}: {victim}")
            moment = time.perf_counter()
            cluster.kill(victim)
            deadline = time.monotonic() + 30
            first = None
            while first is None and time.monotonic() < deadline:
                with lock:  # a commit asked after the kill (one in flight may be answered by the dying voter)
                    first = next((done for started, done in accepted if started > moment), None)
                time.sleep(0.002)
            if first is not None:
                samples.append((first - moment) * 1000)
            wait_all_voters(cluster)
    finally:
        stop.set()
        thread.join(10)
    return samples


def active_group_voter(cluster, timeout_s: float = 10.0) -> str:
    """The group voter that says it is active (not what metadata may still name)."""
    from actors.messages import ControllerStatusRequest
    from transport.rpc import RequestTimeout, RpcClient

    rpc = RpcClient(identity="bench")
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for name in cluster.group_voter_names():
                endpoint = cluster.actor(name).endpoint
                if not endpoint:
                    continue  # restarting
                try:
                    status = rpc.request(endpoint, ControllerStatusRequest(correlation_id=0), 500)
                except RequestTimeout:
                    continue
                if getattr(status, "active", False):
                    return name
            time.sleep(0.02)
    finally:
        rpc.close()
    raise TimeoutError("no group voter is active")


def node_loss(cluster, megabytes: int) -> dict[str, float]:
    from railmq.admin import Admin
    from railmq.consumer import Consumer
    from railmq.producer import Producer

    record = os.urandom(1024)
    count = megabytes * 1024
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("node-loss", partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        admin.wait_for_leaders("node-loss", full_isr=True)
    phase(f"node loss: {megabytes} MB acknowledged at acks=all")
    with Producer(cluster.bootstrap, acks="all", linger_ms=5) as producer:
        for start in range(0, count, 1000):
            producer.send_batch("node-loss", [record] * min(1000, count - start))
        producer.flush(600)
    with Consumer(cluster.bootstrap) as reader:
        ends = {tp[1]: offset for tp, offset in reader.end_offsets([("node-loss", 0)]).items()}
    node = int(cluster.active_controller().rsplit("/", 1)[1])
    phase(f"node loss: node {node} (the active controller's) killed and wiped")
    moment = time.perf_counter()
    cluster.lose_node(node)
    with Admin(cluster.bootstrap, timeout_ms=5_000) as admin:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                partitions = admin.describe_topic("node-loss").partitions
            except Exception:  # noqa: BLE001 - the controller is failing over
                time.sleep(0.05)
                continue
            back = all(node in p.isr and any(info.node == node and info.alive and info.storage.state == "ok"
                                             and info.log_end_offset >= ends[p.partition]
                                             for info in p.replica_info) for p in partitions)
            if back:
                break
            time.sleep(0.05)
    recovered_s = time.perf_counter() - moment
    phase("node loss: reading every acknowledged record back")
    seen = 0
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest", max_poll_records=10_000) as consumer:
        consumer.assign([("node-loss", partition) for partition in ends])
        deadline = time.monotonic() + 300
        while seen < sum(ends.values()) and time.monotonic() < deadline:
            seen += len(consumer.poll(500))
    return {"node_loss_mb_per_replica": megabytes, "node_loss_full_isr_s": recovered_s,
            "node_loss_acknowledged": sum(ends.values()), "node_loss_lost": max(0, sum(ends.values()) - seen)}


def metadata_rates(controllers: int, topics: int, changes: int) -> tuple[float, float]:
    """(topics created per second, config changes per second), one after another, each
    acknowledged once durable (committed on a majority, or flushed by the single coordinator).
    Creating a topic also starts its replica process, which the figure includes; a config change
    is the metadata path alone."""
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster

    data_dir = tempfile.mkdtemp(prefix="railmq-bench-")
    try:
        with LocalCluster(nodes=3, data_dir=data_dir, trace=False, controllers=controllers) as cluster, \
                Admin(cluster.bootstrap) as admin:
            create_when_possible(admin, "warm-up")
            started = time.perf_counter()
            for index in range(topics):
                admin.create_topic(f"t{index}", partitions=1, replication_factor=1, wait=False)
            created = topics / (time.perf_counter() - started)
            admin.wait_for_leaders("warm-up")
            started = time.perf_counter()
            for index in range(changes):
                admin.alter_topic_config("warm-up", {"retention_ms": 3_600_000 + index})
            return created, changes / (time.perf_counter() - started)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (p.add_argument("--kills", type=int, default=0),
                                                           p.add_argument("--node-mb", type=int, default=0)))
    from railmq.cluster import LocalCluster

    kills = args.kills or (5 if args.quick else 20)
    megabytes = args.node_mb or (10 if args.quick else 100)
    topics = 30 if args.quick else 100
    changes = 100 if args.quick else 500
    figures: dict[str, float] = {}
    phase("metadata changes per second: the quorum and the single coordinator, alternately")
    quorum_rates, single_rates = [], []
    for _ in range(args.repeat):
        quorum_rates.append(metadata_rates(3, topics, changes))
        single_rates.append(metadata_rates(0, topics, changes))
    for index, name in enumerate(("topics_created_per_s", "config_changes_per_s")):
        figures[f"{name}_quorum"] = percentile([rates[index] for rates in quorum_rates], 0.5)
        figures[f"{name}_single"] = percentile([rates[index] for rates in single_rates], 0.5)
        figures[f"{name}_ratio"] = figures[f"{name}_quorum"] / figures[f"{name}_single"]
    phase("starting a 3-node cluster with its quorums")
    with LocalCluster(nodes=3, trace=False) as cluster:
        controller = controller_failover(cluster, kills)
        groups = group_failover(cluster, kills)
        figures.update({
            "controller_failover_p50_ms": percentile(controller, 0.5),
            "controller_failover_p99_ms": percentile(controller, 0.99),
            "controller_failover_max_ms": max(controller),
            "controller_kills": len(controller),
            "group_failover_p50_ms": percentile(groups, 0.5) if groups else -1,
            "group_failover_p99_ms": percentile(groups, 0.99) if groups else -1,
            "group_kills": len(groups),
        })
        figures.update(node_loss(cluster, megabytes))
    report("bench.controller", figures, args, {"controller_samples_ms": controller, "group_samples_ms": groups})


if __name__ == "__main__":
    main()
