"""What the simulator checks once a run is over: liveness after heal, then the chaos checker.

After the faults are healed and the recovery window has passed, every partition must have a
live leader and the consumer group must have settled on one generation covering every partition.
The leader's log below its high watermark becomes the run's `final-read`, each replica's committed
prefix a `replica-log`, and the whole history goes through `chaos.checker` — the same rules the
real-process chaos harness is judged by. With share members, the dead-letter topic's committed log
is read too (the `railmq.dlq.*` headers name each record's source) and chaos/sim_share.py checks
that every record below the high watermark was accepted or dead-lettered, and dead-lettered once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chaos.checker import check_history
from railmq.records import decode_fetched

if TYPE_CHECKING:
    from chaos.simulator import Simulator

READ_BYTES_MAX = 1 << 30


def log_entries(log: Any, topic: str, partition: int, end_offset: int, decoded: dict | None = None) -> list[list]:
    """[offset, key, value] of the log's records below `end_offset`. `decoded` remembers the
    entries of bytes already decoded: replicas in sync hold the same bytes, decoded once."""
    if end_offset <= log.log_start_offset:
        return []
    data = log.read(log.log_start_offset, READ_BYTES_MAX, max_offset=end_offset)
    key = (topic, partition, log.log_start_offset, data)
    if decoded is not None and key in decoded:
        return [list(entry) for entry in decoded[key]]
    entries = [[r.offset, r.key.decode() if r.key is not None else None,
                r.value.decode() if r.value is not None else None]
               for r in decode_fetched(topic, partition, data, log.log_start_offset)]
    if decoded is not None:
        decoded[key] = [list(entry) for entry in entries]
    return entries


def final_checks(sim: "Simulator") -> None:
    from chaos.sim_config import DEAD_LETTER_TOPIC, SHARE_GROUP, TOPIC

    coordinator = sim.coordinator()
    if coordinator is None:
        sim.problems.append("no coordinator (no active controller) is running after the recovery window")
        return
    now = sim.now_ns
    high_watermarks: dict[int, int] = {}
    decoded: dict = {}
    for partition in range(sim.config.partitions):
        record = coordinator.partitions.get((TOPIC, partition))
        if record is None:
            sim.problems.append(f"{TOPIC}/{partition} does not exist after the run")
            continue
        leader = sim.hosts.get(f"replica/{TOPIC}/{partition}/n{record.leader}")
        if leader is None or not leader.alive or leader.actor.leader is None:
            sim.problems.append(f"{TOPIC}/{partition} has no working leader after the recovery window "
                                f"(recorded leader {record.leader}, epoch {record.leader_epoch})")
            continue
        replica = leader.actor
        high_watermarks[partition] = replica.high_watermark
        sim.history.append({"type": "final-read", "time_ns": now, "topic": TOPIC, "partition": partition,
                            "entries": log_entries(replica.log, TOPIC, partition, replica.high_watermark, decoded)})
        for host in sim.hosts.values():
            if host.kind == "replica" and host.alive and host.state["topic_partition"] == (TOPIC, partition) \
                    and host.actor.storage.healthy:  # a replica still repairing has no whole committed prefix
                sim.history.append({
                    "type": "replica-log", "time_ns": now, "topic": TOPIC, "partition": partition,
                    "replica": f"n{host.node}", "high_watermark": host.actor.high_watermark,
                    "entries": log_entries(host.actor.log, TOPIC, partition, host.actor.high_watermark, decoded)})
    _check_group_settled(sim)
    _check_in_sync(sim, TOPIC)
    _check_send_order(sim, TOPIC)
    _check_producers_settled(sim)
    if sim.config.share_members and len(high_watermarks) == sim.config.partitions:
        dead_letters = _dead_letter_sources(sim, DEAD_LETTER_TOPIC)
        if dead_letters is not None:
            from chaos.sim_share import dead_lettering

            sim.share.final_check(SHARE_GROUP, TOPIC, high_watermarks, dead_letters,
                                  dead_lettering(sim.hosts["group-coordinator"], SHARE_GROUP))
    result = check_history(sim.history)
    sim.problems.extend(result.violations)


def _dead_letter_sources(sim: "Simulator", topic: str) -> list[tuple[str, str, int, int]] | None:
    """(group, source topic, partition, offset) of every committed dead-letter record, or None
    (a problem) when the dead-letter partition has no working leader."""
    record = sim.coordinator().partitions.get((topic, 0))
    leader = sim.hosts.get(f"replica/{topic}/0/n{record.leader}") if record is not None else None
    if leader is None or not leader.alive or leader.actor.leader is None:
        sim.problems.append(f"{topic}/0 has no working leader after the recovery window")
        return None
    log, end = leader.actor.log, leader.actor.high_watermark
    if end <= log.log_start_offset:
        return []
    sources = []
    for found in decode_fetched(topic, 0, log.read(log.log_start_offset, READ_BYTES_MAX, max_offset=end),
                                log.log_start_offset):
        headers = {name: value.decode() for name, value in found.headers or []}
        sources.append((headers["railmq.dlq.group"], headers["railmq.dlq.source_topic"],
                        int(headers["railmq.dlq.source_partition"]), int(headers["railmq.dlq.source_offset"])))
    return sources


def _check_group_settled(sim: "Simulator") -> None:
    members = [host.actor.member for host in sim.hosts.values() if host.kind == "consumer" and host.alive]
    generations = {member.generation for member in members}
    owned = sorted(tp for member in members for tp in member.owned)
    states = sorted({member.state for member in members})
    if len(generations) != 1 or states != ["stable"] or len(owned) != sim.config.partitions or len(set(owned)) != len(owned):
        sim.problems.append(f"the consumer group did not settle: states {states}, generations {sorted(generations)}, "
                            f"owned {owned}")


def _check_producers_settled(sim: "Simulator") -> None:
    """After the heal and the recovery window every batch a running producer sent has an outcome:
    a producer that cannot get past a gap in its sequence numbers (a batch that ended undelivered,
    as on a full disk) would retry the batches behind it until their delivery timeout."""
    from chaos.sim_workload import ProducerShell

    for name, shell in sim.shells.items():
        if isinstance(shell, ProducerShell) and sim.hosts[name].alive and shell.pending:
            records = sum(map(len, shell.pending.values()))
            sim.problems.append(f"{name}: {len(shell.pending)} batches ({records} records) sent before "
                                f"the heal have no outcome {sim.config.recovery_ms} ms after it")


def _check_in_sync(sim: "Simulator", topic: str) -> None:
    """After the heal and the recovery window every replica is back: running, and in the ISR."""
    coordinator = sim.coordinator()
    for partition in range(sim.config.partitions):
        record = coordinator.partitions.get((topic, partition))
        replicas = coordinator.topics[topic].replicas[partition] if topic in coordinator.topics else []
        if record is not None and sorted(record.isr) != sorted(replicas):
            outside = sorted(set(replicas) - set(record.isr))
            sim.problems.append(f"{topic}/{partition}: replicas {outside} are not back in the ISR {record.isr} "
                                "after the recovery window")


def _check_send_order(sim: "Simulator", topic: str) -> None:
    """An idempotent producer's acknowledged writes to a partition are in the order it sent them
    (its retries go out in sequence order): offsets rise with each producer's value sequence."""
    sends: dict[tuple[str, int], list[tuple[int, int, str]]] = {}
    for line in sim.history:
        if line.get("type") == "ok" and line.get("f") == "send" and line.get("topic") == topic:
            sequence = int(line["value"].rsplit(":", 1)[1])
            sends.setdefault((line["process"], line["partition"]), []).append((sequence, line["offset"], line["value"]))
    for (process, partition), acknowledged in sorted(sends.items()):
        acknowledged.sort()
        for (_, offset, value), (_, later_offset, later) in zip(acknowledged, acknowledged[1:]):
            if later_offset <= offset:
                sim.problems.append(f"{process}'s writes to {topic}/{partition} are out of send order: {later} "
                                    f"at offset {later_offset}, {value} (sent before it) at {offset}")
                break
