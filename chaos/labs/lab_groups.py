"""Labs 6 and 10: what moving partitions costs — keys that change partition, members that pause.

- lab 6: a topic grows from 4 to 6 partitions while keyed records keep coming. hash mod N sends
  two thirds of the keys elsewhere (1 − min/lcm, the same 66.7% as 20 → 30); a group then reads
  the backlog with one member per partition, and only keys that moved come out of order;
- lab 10: a third member joins a group of two while records flow. An eager assignor (range)
  revokes every partition first, so every partition stops; cooperative-sticky (KIP-429) moves only
  the partitions the new member gets, and only those stop.
"""

from __future__ import annotations

import math
import time

from chaos.labs.framework import ARTICLE_GUIDE, Band, Lab, LabContext, LabResult, Measure, Plot, Series
from chaos.labs.lab_backlog import COLORS, start_group, stop_all
from chaos.labs.tools import CappedMember, RateProducer, produce, wait_for
from railmq.admin import Admin
from railmq.partitioner import partition_for_key
from railmq.sizing import moved_fraction_formula, user_keys


# --------------------------------------------------------------------------- lab 6


def partition_count_change(context: LabContext, result: LabResult) -> None:
    keys, rounds, before, after = (60, 6, 4, 6) if context.quick else (200, 10, 4, 6)
    names = user_keys(keys)
    half = rounds // 2
    topic = context.topic("keyed", partitions=before)
    context.say(f"{keys} keys, {half} records each on {before} partitions; then {after} partitions and "
                f"{half} more each")
    produce(context.bootstrap, topic, [f"{name}:{seq}" for seq in range(half) for name in names],
            keys=[name for _ in range(half) for name in names], acks=1)
    with Admin(context.bootstrap) as admin:
        admin.create_partitions(topic, after)
    produce(context.bootstrap, topic, [f"{name}:{seq}" for seq in range(half, rounds) for name in names],
            keys=[name for _ in range(half, rounds) for name in names], acks=1)
    _, members = start_group(context, topic, after, 100.0, partitions=after)
    total = keys * rounds
    wait_for(lambda: sum(len(member.handled) for member in members) >= total, 60,
             "the group to read everything")
    stop_all(members)
    handled = sorted((t, partition, value) for member in members for t, partition, _, value in member.handled)
    partitions_of: dict[str, set[int]] = {}
    order: dict[str, list[int]] = {}
    for _, partition, value in handled:
        name, seq = value.rsplit(":", 1)
        partitions_of.setdefault(name, set()).add(partition)
        order.setdefault(name, []).append(int(seq))
    moved = {name for name, owned in partitions_of.items() if len(owned) > 1}
    predicted = {name for name in names
                 if partition_for_key(name.encode(), before) != partition_for_key(name.encode(), after)}
    out_of_order = {name for name, seqs in order.items() if seqs != sorted(seqs)}
    fraction = moved_fraction_formula(before, after)
    sigma = (fraction * (1 - fraction) / keys) ** 0.5
    context.say(f"  {len(moved)} of {keys} keys moved ({len(moved) / keys:.1%}); {len(out_of_order)} keys "
                f"handled out of order, {len(out_of_order - moved)} of them keys that did not move")
    result.measures += [
        Measure("share of keys that moved", fraction, Band.around(fraction, 3.5 * sigma), len(moved) / keys,
                how=f"1 − min/lcm = 1 − {min(before, after)}/{math.lcm(before, after)}"),
        Measure("keys that moved but murmur2 did not predict, or the reverse", 0, Band.exactly(0),
                len(moved ^ predicted)),
        Measure("keys out of order that did not move", 0, Band.exactly(0), len(out_of_order - moved)),
        Measure("moved keys handled out of order", len(moved), Band(1, len(moved)), len(out_of_order & moved),
                how="their newer records sit in a shorter partition, so they can be read first"),
    ]
    example = sorted(out_of_order & moved)[:1]
    if example:
        name = example[0]
        result.facts.append(f"{name} moved from partition {partition_for_key(name.encode(), before)} to "
                            f"{partition_for_key(name.encode(), after)}; it was handled in the order "
                            f"{order[name]}.")
    result.plots.append(Plot("keys after the partition count changed", "", "keys", kind="bar",
                             categories=["stayed", "moved", "moved, out of order", "stayed, out of order"],
                             series=[Series("keys", [(0, keys - len(moved)), (1, len(moved)),
                                                     (2, len(out_of_order & moved)),
                                                     (3, len(out_of_order - moved))], COLORS[1])]))


# --------------------------------------------------------------------------- lab 10


def _ownerless(members: list[CappedMember], since: float, end: float) -> dict[int, float]:
    """Per partition revoked after `since`: seconds until some member was given it again."""
    revoked: dict[int, float] = {}
    for member in members:
        for t, partitions in member.revoked:
            if t >= since:
                for partition in partitions:
                    revoked[partition] = min(revoked.get(partition, t), t)
    given: dict[int, float] = {}
    for member in members:
        for t, partitions in member.assigned:
            for partition in partitions:
                if partition in revoked and t >= revoked[partition]:
                    given[partition] = min(given.get(partition, t), t)
    return {partition: given.get(partition, end) - t for partition, t in revoked.items()}


def _owners(members: list[CappedMember], since: float) -> dict[int, set[str]]:
    owners: dict[int, set[str]] = {}
    for member in members:
        with member.lock:
            for t, partition, _, _ in member.handled:
                if t >= since:
                    owners.setdefault(partition, set()).add(member.name)
    return owners


def _rebalance(context: LabContext, topic: str, assignor: str, seconds: float) -> tuple[dict[int, float],
                                                                                        int]:
    """(seconds without an owner per revoked partition, partitions whose member changed)."""
    partitions = 6
    _, members = start_group(context, topic, 2, 0, partitions=partitions, assignor=assignor, from_start=False)
    wait_for(lambda: all(member.consumer.position(tp, timeout=0.2) >= 0 for member in members
                         for tp in member.assignment()), 20, "the members to know their positions")
    producer = RateProducer(context.bootstrap, topic, 300, key_for=lambda n: None,
                            partition_for=lambda n: n % partitions).start()
    time.sleep(1.0)
    joined = time.monotonic()
    before = _owners(members, joined - 0.5)
    newcomer = CappedMember(context.bootstrap, members[0].consumer.group_id, topic, name="m-new",
                            assignor=assignor,
                            auto_offset_reset="latest")
    context.on_cleanup(newcomer.stop)
    newcomer.start()
    everyone = members + [newcomer]
    wait_for(lambda: all(member.assignment() for member in everyone), 20, "the new member to get partitions")
    time.sleep(seconds)
    end = time.monotonic()
    producer.stop()
    after = _owners(everyone, end - 0.5)
    moved = sum(1 for partition in range(partitions) if before.get(partition) != after.get(partition))
    ownerless = _ownerless(everyone, joined, end)
    stop_all(everyone)
    return ownerless, moved


def rebalance_pause(context: LabContext, result: LabResult) -> None:
    seconds = 1.0 if context.quick else 2.0
    context.say("6 partitions, 300 msg/s; a third member joins a group of two")
    topic = context.topic("flow", partitions=6)
    eager, eager_moved = _rebalance(context, topic, "range", seconds)
    cooperative, cooperative_moved = _rebalance(context, topic, "cooperative-sticky", seconds)
    longest = {name: max(values.values(), default=0.0) for name,
               values in (("eager", eager), ("coop", cooperative))}
    context.say(f"  eager (range): {len(eager)} partitions revoked, each without a reader for up to "
                f"{longest['eager'] * 1000:.0f} ms; cooperative-sticky: {len(cooperative)} revoked "
                f"({cooperative_moved} moved), up to {longest['coop'] * 1000:.0f} ms")
    result.measures += [
        Measure("partitions that stopped (revoked), eager", 6, Band.exactly(6), len(eager),
                how="an eager assignor revokes everything before it reassigns"),
        Measure("partitions that stopped (revoked), cooperative-sticky", 2, Band.exactly(2), len(cooperative),
                how="only what the new member takes: 6 partitions / 3 members"),
        Measure("partitions that changed member, cooperative-sticky", 2, Band.exactly(2), cooperative_moved),
        Measure("partitions that kept their member and never stopped, cooperative-sticky", 4, Band.exactly(4),
                6 - len(cooperative)),
    ]
    result.facts.append("Eager: every partition went without a reader for up to "
                        f"{longest['eager'] * 1000:.0f} ms ({eager_moved} of them ended with another "
                        "member). Cooperative: 4 partitions never stopped; the 2 that moved waited up to "
                        f"{longest['coop'] * 1000:.0f} ms (two rebalance rounds).")
    result.plots.append(Plot("time without a reader per partition while a member joins", "", "milliseconds",
                             kind="bar",
                             categories=[f"p{p} eager" for p in range(6)] + [f"p{p} coop" for p in range(6)],
                             series=[Series("without a reader",
                                            [(p, eager.get(p, 0.0) * 1000) for p in range(6)]
                                            + [(6 + p, cooperative.get(p, 0.0) * 1000) for p in range(6)],
                                            COLORS[3])]))


LABS = [
    Lab(6, "partition-count-change",
        "changing the partition count breaks per-key order for the keys that move",
        ARTICLE_GUIDE,
        "\"Unlike consistent hashing for a distributed cache, a plain hash-mod-N rule moves most keys when "
        "the partition count changes, so adding partitions later breaks per-key order for the keys that "
        "move\" — \"going from 20 to 30 partitions with a plain hash-mod-N rule remaps 66.7% of keys.\"",
        partition_count_change, "two thirds of the keys move; out-of-order keys are all keys that moved"),
    Lab(10, "rebalance-pause", "a rebalance pauses reading: eager against cooperative-sticky", ARTICLE_GUIDE,
        "\"Rebalancing. When a consumer joins or leaves, partitions move between members and reading pauses "
        "briefly.\" How briefly, and for how many partitions, is the assignor's choice.", rebalance_pause,
        "eager: all 6 partitions stop; cooperative-sticky: only the 2 that move"),
]
