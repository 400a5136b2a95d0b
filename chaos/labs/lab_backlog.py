"""Labs 3, 5 and 15: arrival, capacity and lag — the arithmetic of a queue that backs up.

Producers send at a fixed rate (`RateProducer`); group members handle at most a fixed rate each
(`CappedMember`); `LagSampler` reads each partition's lag in messages and seconds the way
`railmq groups lag` does. The expected figures are the sizing arithmetic (railmq/sizing.py):

- lab 15: one partition, arrival above capacity — lag grows in a straight line at λ − μ;
- lab 3: a skewed key space on 6 partitions — the partition holding the hottest keys (its share
  from railmq's murmur2 partitioner) falls behind at share × λ − μ while the others keep up;
- lab 5: more members than partitions — the extra members sit idle and the backlog drains no
  faster; only more partitions (and members) drain it faster.
"""

from __future__ import annotations

import random
import time
from statistics import median

from chaos.labs.framework import (
    ARTICLE_GUIDE, ARTICLE_QUESTIONS, Band, Lab, LabContext, LabResult, Measure, Plot, Series,
)
from chaos.labs.tools import CappedMember, LagSampler, RateProducer, produce, slope, wait_for
from railmq.sizing import drain, hot_partition, user_keys, zipf_weights

# Seconds of production before the lag is fitted: the group and the producer settle first.
SETTLE_S = 1.0
# A consumer that keeps up is behind by what arrived since its last commit (every 0.2 s) plus a
# fetch in flight; half a second of arrivals bounds that on a loaded machine.
KEEPING_UP_S = 0.5
COLORS = ["#d9822b", "#1f5fa8", "#137333", "#6b3fa0", "#b3261e", "#8a5a00", "#39404f", "#7aa6d8"]


def start_group(context: LabContext, topic: str, members: int, rate_per_s: float, *, partitions: int,
                prefix: str = "m", assignor: str = "range",
                from_start: bool = True) -> tuple[str, list[CappedMember]]:
    """Start `members` capped members of a new group and wait until the partitions are shared out.
    With `from_start` off the group reads only what is produced after it joined (a topic can then
    serve several runs: creating a topic's replica processes is the slow part of a lab)."""
    group = context.name("g")
    reset = "earliest" if from_start else "latest"
    started = [CappedMember(context.bootstrap, group, topic, rate_per_s=rate_per_s, name=f"{prefix}{index}",
                            assignor=assignor, auto_offset_reset=reset).start() for index in range(members)]
    for member in started:
        context.on_cleanup(member.stop)

    def settled() -> bool:
        owned = [len(member.assignment()) for member in started]
        generations = {member.consumer.generation() for member in started if member.assignment()}
        return sum(owned) == partitions and len(generations) == 1 and max(owned) <= -(-partitions // members)

    wait_for(settled, 30, f"{members} members to share {partitions} partitions")
    return group, started


def stop_all(members: list[CappedMember]) -> None:
    for member in members:
        member.stop()


def _fitted(points: list[tuple[float, float]], start_s: float, end_s: float) -> tuple[float, float]:
    return slope([(t, value) for t, value in points if start_s <= t <= end_s])


# --------------------------------------------------------------------------- lab 15


def _one_run(context: LabContext, arrival: float, capacity: float, seconds: float) -> tuple[LagSampler,
                                                                                            float]:
    topic = context.topic("flow")
    group, members = start_group(context, topic, 1, capacity, partitions=1)
    sampler = LagSampler(context.bootstrap, group, interval_s=0.5).start()
    producer = RateProducer(context.bootstrap, topic, arrival, key_for=lambda n: None,
                            partition_for=lambda n: 0)
    started = time.monotonic()
    producer.start()
    time.sleep(seconds)
    producer.stop()
    elapsed = time.monotonic() - started
    sampler.stop()
    stop_all(members)
    return sampler, producer.sent / elapsed


def queue_is_not_faster(context: LabContext, result: LabResult) -> None:
    arrival, slow, fast = 150.0, 90.0, 300.0
    seconds = 5.0 if context.quick else 10.0
    context.say(f"one partition, {arrival:.0f} msg/s arriving; a consumer that handles {slow:.0f} msg/s, "
                f"then one that handles {fast:.0f} msg/s, {seconds:.0f} s each")
    behind, measured_arrival = _one_run(context, arrival, slow, seconds)
    keeping_up, _ = _one_run(context, arrival, fast, seconds)
    lag = behind.series(0)
    fitted, r_squared = _fitted(lag, SETTLE_S, seconds)
    expected = measured_arrival - slow
    final_fast = keeping_up.series(0)[-1][1] if keeping_up.samples else None
    context.say(f"  arrival measured {measured_arrival:.1f} msg/s; lag grew {fitted:.1f} msg/s (r² "
                f"{r_squared:.3f}); the faster consumer ended {final_fast} behind")
    result.measures += [
        Measure("lag growth (msg/s), capacity below arrival", expected, Band.relative(expected, 0.3), fitted,
                how="arrival − capacity"),
        Measure("straightness of the lag line (r²)", 1.0, Band(0.9, 1.0), r_squared),
        Measure("lag at the end (messages), capacity above arrival", 0, Band(0, KEEPING_UP_S * arrival),
                final_fast, how="it keeps up: at most half a second of arrivals waits for the next commit"),
    ]
    result.facts.append(f"In {seconds:.0f} s the slow consumer fell {lag[-1][1] if lag else 0:.0f} messages "
                        "behind; the queue absorbed the excess and nobody was told: a queue moves the work, "
                        "it does not do it.")
    result.plots.append(Plot("lag when arrival exceeds capacity", "seconds", "lag (messages)", series=[
        Series(f"capacity {slow:.0f} msg/s", lag, COLORS[0]),
        Series(f"predicted: {expected:.0f} msg/s × t", [(0, 0), (seconds, expected * seconds)], COLORS[0],
               dashed=True),
        Series(f"capacity {fast:.0f} msg/s", keeping_up.series(0), COLORS[2])]))


# --------------------------------------------------------------------------- lab 3


def _zipf_keys(seed: int, keys: int, count: int, block: int = 1000) -> list[str]:
    """Keys to send, ∝ 1/rank: each block of `block` sends holds every key its share of times
    (largest remainders), shuffled, so the traffic really has the shares the arithmetic uses."""
    names, weights = user_keys(keys), zipf_weights(keys)
    exact = [weight * block for weight in weights]
    counts = [int(value) for value in exact]
    by_remainder = sorted(range(keys), key=lambda index: exact[index] - counts[index], reverse=True)
    for index in by_remainder[:block - sum(counts)]:
        counts[index] += 1
    pattern = [name for name, times in zip(names, counts) for _ in range(times)]
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        rng.shuffle(pattern)
        out += pattern
    return out[:count]


def hot_key(context: LabContext, result: LabResult) -> None:
    partitions, keys, arrival, capacity = 6, 1000, 300.0, 70.0
    seconds = 6.0 if context.quick else 12.0
    hot = hot_partition(keys, partitions)
    hottest = hot.hottest_partition
    share = hot.shares[hottest]
    context.say(f"{keys} user keys ∝ 1/rank, {arrival:.0f} msg/s onto {partitions} partitions, one member "
                f"per partition handling {capacity:.0f} msg/s; murmur2 puts {share:.1%} of the traffic on "
                f"partition {hottest}")
    topic = context.topic("hot", partitions=partitions)
    group, members = start_group(context, topic, partitions, capacity, partitions=partitions)
    drawn = _zipf_keys(context.seed, keys, int(arrival * seconds * 2) + 1000)
    sampler = LagSampler(context.bootstrap, group, interval_s=0.5).start()
    producer = RateProducer(context.bootstrap, topic, arrival, key_for=lambda n: drawn[n % len(drawn)])
    started = time.monotonic()
    producer.start()
    time.sleep(seconds)
    producer.stop()
    measured_arrival = producer.sent / (time.monotonic() - started)
    sampler.stop()
    stop_all(members)
    lag_messages = sampler.series(hottest)
    lag_seconds = sampler.series(hottest, seconds=True)
    fitted_messages, _ = _fitted(lag_messages, SETTLE_S, seconds)
    fitted_seconds, _ = _fitted(lag_seconds, SETTLE_S, seconds)
    hot_rate = share * measured_arrival
    # A partition that keeps up has a lag that does not grow: its median over the window the hot
    # partition's growth is fitted in stays within half a second of arrivals, while the hot one's
    # is half its final lag. (One sample can catch a member stalled for a second by a loaded
    # machine; the median of a growing lag grows with it.)
    others = [median([value for t, value in sampler.series(partition) if SETTLE_S <= t <= seconds] or [0])
              for partition in range(partitions) if partition != hottest]
    flagged = sampler.hot_flags[-1] if sampler.hot_flags else []
    busiest_other = measured_arrival * max(share for index, share in enumerate(hot.shares)
                                           if index != hottest)
    result.measures += [
        Measure(f"hot partition {hottest}: lag growth (msg/s)", hot_rate - capacity,
                Band.relative(hot_rate - capacity, 0.35), fitted_messages,
                how=f"{share:.1%} × {measured_arrival:.0f} msg/s − {capacity:.0f} msg/s"),
        Measure(f"hot partition {hottest}: lag growth (s per s)", 1 - capacity / hot_rate,
                Band.around(1 - capacity / hot_rate, 0.15), fitted_seconds,
                how="1 − capacity ÷ the hot partition's arrival rate"),
        Measure("largest median lag of the other partitions (messages)", 0, Band(0, KEEPING_UP_S * busiest_other),
                max(others), how=f"they keep up: from {SETTLE_S:.0f} s on, about half a second of arrivals waits at most"),
        Measure("partitions railmq.lag flags as hot", 1, Band.exactly(1), len(flagged)),
    ]
    total_lag = sum(sampler.samples[-1][1].values()) if sampler.samples else 0
    result.facts.append(f"At the end the group was {total_lag} messages behind in all — and "
                        f"{lag_messages[-1][1] if lag_messages else 0:.0f} of them on partition {hottest}: "
                        "aggregate lag hides which partition is stuck.")
    series = [Series(f"partition {partition}" + (" (hot)" if partition == hottest else ""),
                     sampler.series(partition), COLORS[partition % len(COLORS)])
              for partition in range(partitions)]
    result.plots.append(Plot("lag per partition (messages)", "seconds", "lag (messages)", series=series))
    result.plots.append(Plot(f"partition {hottest}: how old the oldest unconsumed message is", "seconds",
                             "lag (seconds)", series=[Series("lag in seconds", lag_seconds, COLORS[0])]))


# --------------------------------------------------------------------------- lab 5


def _drain(context: LabContext, topic: str, partitions: int, members: int, backlog: int,
           capacity: float) -> tuple[float, int]:
    """(seconds from the first handled record to the last, idle members) for one new group that
    joins first and then gets a backlog of its own."""
    _, group = start_group(context, topic, members, capacity, partitions=partitions, from_start=False)
    wait_for(lambda: all(member.consumer.position(tp, timeout=0.2) >= 0 for member in group
                         for tp in member.assignment()), 20, "the members to know their positions")
    produce(context.bootstrap, topic, [f"job-{index}" for index in range(backlog)],
            keys=[f"k{index}" for index in range(backlog)], acks=1)
    wait_for(lambda: len({(p, o) for m in group for _, p, o, _ in m.handled}) >= backlog, 60,
             f"{members} members to drain {backlog} messages")
    times = sorted(t for member in group for t, _, _, _ in member.handled)
    idle = sum(1 for member in group if not member.assignment())
    stop_all(group)
    return times[-1] - times[0], idle


def _slower_band(seconds: float) -> Band:
    """A loaded machine can only slow a capped consumer down: 20% under, 50% over."""
    return Band(seconds * 0.8, seconds * 1.5)


def idle_consumers(context: LabContext, result: LabResult) -> None:
    backlog, capacity = (240, 60.0) if context.quick else (600, 100.0)
    context.say(f"a backlog of {backlog} messages, members handling {capacity:.0f} msg/s each")
    topic = context.topic("drain", partitions=2)
    two, _ = _drain(context, topic, 2, 2, backlog, capacity)
    four, idle = _drain(context, topic, 2, 4, backlog, capacity)
    context.say(f"  2 partitions: 2 members drain it in {two:.2f} s, 4 members in {four:.2f} s ({idle} idle)")
    expected = backlog / (2 * capacity)
    result.measures += [
        Measure("idle members, 4 members on 2 partitions", 2, Band.exactly(2), idle),
        Measure("drain time (s), 2 members, 2 partitions", expected, _slower_band(expected), two,
                how="backlog ÷ (busy members × capacity)"),
        Measure("drain time (s), 4 members, 2 partitions", expected, _slower_band(expected), four,
                how="still 2 busy members: not half"),
        Measure("drain time, 4 members ÷ 2 members", 1.0, Band(0.75, 1.33), four / two if two else None,
                how="the extra members have no partition to read"),
    ]
    bars = [(0, two), (1, four)]
    categories = ["2 members, 2 partitions", "4 members, 2 partitions"]
    if not context.quick:
        wide, _ = _drain(context, context.topic("drain", partitions=4), 4, 4, backlog, capacity)
        context.say(f"  4 partitions: 4 members drain it in {wide:.2f} s")
        result.measures.append(Measure("drain time (s), 4 members, 4 partitions", expected / 2,
                                       _slower_band(expected / 2), wide, how="4 busy members"))
        result.measures.append(Measure("drain time, 4 partitions ÷ 2 partitions", 0.5, Band(0.35, 0.7),
                                       wide / two if two else None, how="twice the busy members"))
        bars.append((2, wide))
        categories.append("4 members, 4 partitions")
    article = drain(30_000_000, 50_000, 30, 20, 2_500)
    result.facts.append("At the articles' scale the same rule: 30 consumers on 20 partitions use "
                        f"{article.busy_consumers} and never drain a 10-minute backlog; on 30 partitions "
                        "they drain it in 20 minutes.")
    result.plots.append(Plot("time to drain the backlog", "", "seconds", kind="bar", categories=categories,
                             series=[Series("drain time", bars, COLORS[1])]))


LABS = [
    Lab(15, "queue-is-not-faster", "a queue does not make the work faster", ARTICLE_QUESTIONS,
        "\"A queue does not make the work faster. It moves the work out of the request path. If the total "
        "processing capacity is insufficient, a queue converts a fast, visible failure into a slow, "
        "invisible backlog.\"", queue_is_not_faster,
        "the lag line: straight, with the slope arrival − capacity; flat when capacity is above arrival"),
    Lab(3, "hot-key", "a hot key overloads one partition while the others idle", ARTICLE_GUIDE,
        "\"Take 1,000 user keys whose traffic is proportional to one over the key's popularity rank ... The "
        "hottest one then gets 8,631 messages per second, far above the 2,500 its single consumer handles, "
        "so it falls behind ... while others sit near idle.\" The question guide: \"aggregate lag hides a "
        "single hot partition.\"", hot_key,
        "one partition's lag (messages and seconds) climbs at share × arrival − capacity; the rest stay "
        "near 0"),
    Lab(5, "idle-consumers", "more consumers than partitions sit idle", ARTICLE_GUIDE,
        "\"If a topic has 20 partitions ..., a classic group can use at most 20 busy members; a twenty-first "
        "sits idle.\" And for a backlog: \"30 consumers drain it in 20 minutes, but only if the topic has at "
        "least 30 partitions.\"", idle_consumers,
        "idle members = members − partitions; the drain time does not halve until the partitions double"),
]
