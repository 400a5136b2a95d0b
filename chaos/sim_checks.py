"""What the simulator checks once a run is over: liveness after heal, then the chaos checker.

After the faults are healed and the recovery window has passed, every partition must have a
live leader and the consumer group must have settled on one generation covering every partition.
The leader's log below its high watermark becomes the run's `final-read`, each replica's committed
prefix a `replica-log`, and the whole history goes through `chaos.checker` — the same rules the
real-process chaos harness is judged by.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chaos.checker import check_history
from railmq.records import decode_fetched

if TYPE_CHECKING:
    from chaos.simulator import Simulator

READ_BYTES_MAX = 1 << 30


def log_entries(log: Any, topic: str, partition: int, end_offset: int) -> list[list]:
    if end_offset <= log.log_start_offset:
        return []
    data = log.read(log.log_start_offset, READ_BYTES_MAX, max_offset=end_offset)
    return [[r.offset, r.key.decode() if r.key is not None else None, r.value.decode() if r.value is not None else None]
            for r in decode_fetched(topic, partition, data, log.log_start_offset)]


def final_checks(sim: "Simulator") -> None:
    from chaos.simulator import TOPIC

    coordinator = sim.hosts["coordinator"]
    if not coordinator.alive:
        sim.problems.append("the coordinator is not running after the recovery window")
        return
    now = sim.now_ns
    for partition in range(sim.config.partitions):
        record = coordinator.actor.partitions.get((TOPIC, partition))
        if record is None:
            sim.problems.append(f"{TOPIC}/{partition} does not exist after the run")
            continue
        leader = sim.hosts.get(f"replica/{TOPIC}/{partition}/n{record.leader}")
        if leader is None or not leader.alive or leader.actor.leader is None:
            sim.problems.append(f"{TOPIC}/{partition} has no working leader after the recovery window "
                                f"(recorded leader {record.leader}, epoch {record.leader_epoch})")
            continue
        replica = leader.actor
        sim.history.append({"type": "final-read", "time_ns": now, "topic": TOPIC, "partition": partition,
                            "entries": log_entries(replica.log, TOPIC, partition, replica.high_watermark)})
        for host in sim.hosts.values():
            if host.kind == "replica" and host.alive and host.state["topic_partition"] == (TOPIC, partition) \
                    and host.actor.storage.healthy:  # a replica still repairing has no whole committed prefix
                sim.history.append({
                    "type": "replica-log", "time_ns": now, "topic": TOPIC, "partition": partition,
                    "replica": f"n{host.node}", "high_watermark": host.actor.high_watermark,
                    "entries": log_entries(host.actor.log, TOPIC, partition, host.actor.high_watermark)})
    _check_group_settled(sim)
    result = check_history(sim.history)
    sim.problems.extend(result.violations)


def _check_group_settled(sim: "Simulator") -> None:
    members = [host.actor.member for host in sim.hosts.values() if host.kind == "consumer" and host.alive]
    generations = {member.generation for member in members}
    owned = sorted(tp for member in members for tp in member.owned)
    states = sorted({member.state for member in members})
    if len(generations) != 1 or states != ["stable"] or len(owned) != sim.config.partitions or len(set(owned)) != len(owned):
        sim.problems.append(f"the consumer group did not settle: states {states}, generations {sorted(generations)}, "
                            f"owned {owned}")
