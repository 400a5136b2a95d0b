"""Capacity arithmetic for a partitioned log: the design articles' worked example, from any inputs.

    report = size(SizingInputs())            # the articles' inputs: 50,000 msg/s, 1,000 B, 7 days, ...
    report.quantity("bandwidth").value       # 50_000_000.0 (bytes per second)

Everything here is arithmetic over `SizingInputs`, plus railmq's own partitioner for the two
figures that depend on a real hash (the hot partition, the keys a partition-count change moves).
Each result is a `Quantity` carrying its formula in words and, when the articles state one, the
article's figure, so `railmq size` can print one beside the other and tests can pin both.
The duplicates figure is computed here by formula only (`expected_duplicates`); `railmq size`
also *runs* it on railmq's consumer state machines (chaos/labs/duplicates_sim.py), which this
module may not import (railmq never imports chaos).

Units are decimal, as the articles use them: 1 MB = 10^6 bytes, 1 TB = 10^12 bytes.
Nothing here reads a clock, a socket or global randomness.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from railmq.partitioner import murmur2, partition_for_key, to_positive

SECONDS_PER_DAY = 86_400
MB = 1_000_000
TB = 1_000_000_000_000
# Keys and partitions are hashed and counted one by one (the hot partition, the remap): 10**18
# partitions, from a peak of 10**22 msg/s, ended in a MemoryError.
COUNT_MAX = 1_000_000
KEYS_MAX = 100_000
# The remap's large sample: 100 keys for each one asked for, up to a million (10 million for
# 100,000 keys took a minute and a half, and a million is within 0.1% of the formula).
LARGE_SAMPLE_KEYS_PER_KEY = 100
LARGE_SAMPLE_KEYS_MAX = 1_000_000

# The articles' figures, as they print them (000 = the interview guide, 004 = the question guide).
ARTICLE = {
    "bandwidth": 50 * MB,
    "messages_per_day": 4_320_000_000,
    "bytes_per_day": 4_320_000_000_000,
    "retained_one_copy": 30_240_000_000_000,
    "retained_all_copies": 90_720_000_000_000,
    "partitions_minimum": 10,
    "partitions": 20,
    "consumers": 20,
    "even_share": 0.05,
    "hottest_share": 0.1726,
    "coolest_share": 0.0275,
    "hottest_rate": 8_631,
    "hottest_behind": 6_131,
    "duplicates_per_message_commit": 10_028,
    "backlog": 30_000_000,
    "drain_minutes_30_consumers": 20,
    "keys_remapped": 0.667,
    "doubled_bandwidth": 100 * MB,
    "doubled_partitions": 40,
    "doubled_consumers": 40,
}


class SizingError(ValueError):
    """Inputs that describe no workload (a rate of zero, a negative size, ...)."""


class SizingInputs(msgspec.Struct, frozen=True, kw_only=True):
    peak_messages_per_s: float | None = 50_000  # None: daily_messages / 86,400 × peak_factor
    daily_messages: float | None = None
    peak_factor: float = 1.0
    message_bytes: float = 1_000
    retention_days: float = 7
    replication_factor: int = 3
    partition_mb_per_s: float = 5
    consumer_messages_per_s: float = 2_500
    headroom: float = 2
    keys: int = 1_000  # user keys with traffic ∝ 1/rank, for the hot partition
    outage_minutes: float = 10
    drain_consumers: tuple[int, ...] = (20, 25, 30, 40)
    partitions_from: int = 20  # the partition-count change
    partitions_to: int = 30
    crash_probability: float = 0.01
    commit_batch_messages: int = 100
    duplicates_messages: int = 1_000_000

    def __post_init__(self) -> None:
        if self.peak_messages_per_s is None and self.daily_messages is None:
            raise SizingError("give a peak rate, or a daily volume and a peak factor")
        positive = {"message_bytes": self.message_bytes, "retention_days": self.retention_days,
                    "replication_factor": self.replication_factor,
                    "partition_mb_per_s": self.partition_mb_per_s,
                    "consumer_messages_per_s": self.consumer_messages_per_s, "keys": self.keys,
                    "partitions_from": self.partitions_from, "partitions_to": self.partitions_to,
                    "commit_batch_messages": self.commit_batch_messages,
                    "duplicates_messages": self.duplicates_messages, "peak_factor": self.peak_factor}
        if self.peak_messages_per_s is not None:
            positive["peak_messages_per_s"] = self.peak_messages_per_s
        if self.daily_messages is not None:
            positive["daily_messages"] = self.daily_messages
        for name, value in positive.items():
            if not value > 0:
                raise SizingError(f"{name} must be positive, got {value}")
        counts = {"keys": (self.keys, KEYS_MAX), "partitions_from": (self.partitions_from, COUNT_MAX),
                  "partitions_to": (self.partitions_to, COUNT_MAX)}
        for name, (value, bound) in counts.items():
            if value > bound:
                raise SizingError(f"{name} is at most {bound:,}, got {value:,}")
        if self.headroom < 1:
            raise SizingError(f"headroom is a factor of at least 1, got {self.headroom}")
        if self.outage_minutes < 0 or any(count < 1 for count in self.drain_consumers):
            raise SizingError("the outage is not negative and every consumer count is at least 1")
        if not 0 <= self.crash_probability < 1:
            raise SizingError(f"the crash probability is in [0, 1), got {self.crash_probability}")

    @property
    def peak(self) -> float:
        if self.peak_messages_per_s is not None:
            return float(self.peak_messages_per_s)
        return float(self.daily_messages) / SECONDS_PER_DAY * self.peak_factor


class Quantity(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    value: float
    unit: str  # "B/s", "messages", "B", "partitions", "consumers", "fraction", "msg/s", "s", ...
    formula: str
    article: float | None = None


class HotPartition(msgspec.Struct, frozen=True, kw_only=True):
    keys: int
    partitions: int
    shares: list[float]  # per partition, summing to 1
    hottest_partition: int
    hottest_keys: list[str]  # the most popular keys the hash put on the hottest partition
    rank_one_share: float  # the single most popular key's share of all traffic


class Drain(msgspec.Struct, frozen=True, kw_only=True):
    consumers: int
    partitions: int
    busy_consumers: int  # a classic group uses at most one member per partition
    spare_messages_per_s: float
    drain_s: float | None  # None: never drains


class Remap(msgspec.Struct, frozen=True, kw_only=True):
    partitions_from: int
    partitions_to: int
    keys: int
    keys_moved: int
    traffic_moved: float  # the fraction of messages (∝ 1/rank) whose key moved
    formula_moved: float  # 1 − min/lcm: hash-mod-N on uniformly spread hashes
    minimal_moved: float  # what an ideal consistent scheme must move: the new partitions' share


class SimulatedDuplicates(msgspec.Struct, frozen=True, kw_only=True):
    """Duplicates counted by running the consumer state machines (filled in by the caller)."""

    commit_every: int
    messages_simulated: int
    processings: int
    crashes: int
    scaled_to: int  # the figure below is per this many messages

    @property
    def duplicates(self) -> int:
        return self.processings - self.messages_simulated

    @property
    def scaled_duplicates(self) -> float:
        return self.duplicates * self.scaled_to / self.messages_simulated


class SizingReport(msgspec.Struct, frozen=True, kw_only=True):
    inputs: SizingInputs
    quantities: list[Quantity]
    hot: HotPartition
    drains: list[Drain]
    remap: Remap
    remap_large_sample: Remap

    def quantity(self, name: str) -> Quantity:
        for quantity in self.quantities:
            if quantity.name == name:
                return quantity
        raise KeyError(f"no quantity named {name!r}")


# --------------------------------------------------------------------------- the arithmetic


def partitions_for(bandwidth_bytes_per_s: float, partition_mb_per_s: float, headroom: float) -> tuple[int,
                                                                                                      int]:
    """(minimum partitions for the bandwidth, partitions with headroom). A topic has at least one:
    a bandwidth under a billionth of a partition's rounded to 0, and 1 ÷ partitions raised."""
    minimum = max(1, math.ceil(bandwidth_bytes_per_s / (partition_mb_per_s * MB) - 1e-9))
    return minimum, math.ceil(minimum * headroom - 1e-9)


def consumers_for(messages_per_s: float, consumer_messages_per_s: float) -> int:
    return math.ceil(messages_per_s / consumer_messages_per_s - 1e-9)


def capacity(inputs: SizingInputs) -> list[Quantity]:
    """The worked example's table: bandwidth, volume, storage, partitions, consumers, doubled peak."""
    peak = inputs.peak
    bandwidth = peak * inputs.message_bytes
    per_day = peak * SECONDS_PER_DAY
    one_copy = per_day * inputs.message_bytes * inputs.retention_days
    minimum, partitions = partitions_for(bandwidth, inputs.partition_mb_per_s, inputs.headroom)
    doubled_minimum, doubled_partitions = partitions_for(2 * bandwidth, inputs.partition_mb_per_s,
                                                         inputs.headroom)
    peak_formula = ("given" if inputs.peak_messages_per_s is not None else
                    f"{inputs.daily_messages:,.0f} msg/day ÷ 86,400 × peak factor {inputs.peak_factor:g}")
    return [
        Quantity(name="peak", value=peak, unit="msg/s", formula=peak_formula),
        Quantity(name="bandwidth", value=bandwidth, unit="B/s", article=ARTICLE["bandwidth"],
                 formula="peak × bytes per message"),
        Quantity(name="messages_per_day", value=per_day, unit="messages", article=ARTICLE["messages_per_day"],
                 formula="peak × 86,400 s"),
        Quantity(name="bytes_per_day", value=per_day * inputs.message_bytes, unit="B",
                 article=ARTICLE["bytes_per_day"], formula="messages per day × bytes per message"),
        Quantity(name="retained_one_copy", value=one_copy, unit="B", article=ARTICLE["retained_one_copy"],
                 formula=f"bytes per day × {inputs.retention_days:g} days"),
        Quantity(name="retained_all_copies", value=one_copy * inputs.replication_factor, unit="B",
                 article=ARTICLE["retained_all_copies"],
                 formula=f"one copy × replication factor {inputs.replication_factor}"),
        Quantity(name="partitions_minimum", value=minimum, unit="partitions",
                 article=ARTICLE["partitions_minimum"],
                 formula=f"⌈bandwidth ÷ {inputs.partition_mb_per_s:g} MB/s per partition⌉"),
        Quantity(name="partitions", value=partitions, unit="partitions", article=ARTICLE["partitions"],
                 formula=f"minimum × headroom {inputs.headroom:g}"),
        Quantity(name="consumers", value=consumers_for(peak, inputs.consumer_messages_per_s),
                 unit="consumers",
                 article=ARTICLE["consumers"],
                 formula=f"⌈peak ÷ {inputs.consumer_messages_per_s:,.0f} msg/s per consumer⌉"),
        Quantity(name="even_share", value=1 / partitions, unit="fraction", article=ARTICLE["even_share"],
                 formula="1 ÷ partitions"),
        Quantity(name="doubled_bandwidth", value=2 * bandwidth, unit="B/s",
                 article=ARTICLE["doubled_bandwidth"],
                 formula="2 × bandwidth"),
        Quantity(name="doubled_partitions", value=doubled_partitions, unit="partitions",
                 article=ARTICLE["doubled_partitions"],
                 formula=f"⌈2 × bandwidth ÷ {inputs.partition_mb_per_s:g} MB/s⌉ × headroom "
                         f"{inputs.headroom:g}"),
        Quantity(name="doubled_consumers", value=consumers_for(2 * peak, inputs.consumer_messages_per_s),
                 unit="consumers", article=ARTICLE["doubled_consumers"],
                 formula=f"⌈2 × peak ÷ {inputs.consumer_messages_per_s:,.0f} msg/s⌉"),
    ]


def user_keys(count: int) -> list[str]:
    """The key of popularity rank r (1 = the most popular) is `user-r`."""
    return [f"user-{rank}" for rank in range(1, count + 1)]


def zipf_weights(count: int) -> list[float]:
    """Traffic share of each rank when traffic ∝ 1/rank, summing to 1."""
    harmonic = sum(1 / rank for rank in range(1, count + 1))
    return [1 / rank / harmonic for rank in range(1, count + 1)]


def hot_partition(keys: int, partitions: int) -> HotPartition:
    """Hash `keys` Zipf-popular user keys with railmq's partitioner (Kafka's murmur2)."""
    names = user_keys(keys)
    weights = zipf_weights(keys)
    shares = [0.0] * partitions
    placed: dict[int, list[str]] = {}
    for name, weight in zip(names, weights):
        partition = partition_for_key(name.encode(), partitions)
        shares[partition] += weight
        placed.setdefault(partition, []).append(name)
    hottest = max(range(partitions), key=lambda index: shares[index])
    return HotPartition(keys=keys, partitions=partitions, shares=shares, hottest_partition=hottest,
                        hottest_keys=placed.get(hottest, [])[:5], rank_one_share=weights[0])


def hot_quantities(inputs: SizingInputs, hot: HotPartition) -> list[Quantity]:
    hottest, coolest = max(hot.shares), min(hot.shares)
    rate = hottest * inputs.peak
    return [
        Quantity(name="hottest_share", value=hottest, unit="fraction", article=ARTICLE["hottest_share"],
                 formula=f"{hot.keys:,} keys ∝ 1/rank, murmur2 mod {hot.partitions}: "
                         "the largest partition sum"),
        Quantity(name="coolest_share", value=coolest, unit="fraction", article=ARTICLE["coolest_share"],
                 formula="the smallest partition sum"),
        Quantity(name="hottest_rate", value=rate, unit="msg/s", article=ARTICLE["hottest_rate"],
                 formula="hottest share × peak"),
        Quantity(name="hottest_behind", value=rate - inputs.consumer_messages_per_s, unit="msg/s",
                 article=ARTICLE["hottest_behind"],
                 formula=f"hottest rate − {inputs.consumer_messages_per_s:,.0f} msg/s "
                         "its one consumer handles"),
    ]


def drain(backlog: float, arrival_per_s: float, consumers: int, partitions: int,
          consumer_messages_per_s: float) -> Drain:
    """Time to drain `backlog` while `arrival_per_s` keeps arriving, with `consumers` members of
    one classic group on `partitions` partitions (at most one busy member per partition)."""
    busy = min(consumers, partitions)
    spare = busy * consumer_messages_per_s - arrival_per_s
    seconds = backlog / spare if spare > 0 else (0.0 if backlog == 0 else None)
    return Drain(consumers=consumers, partitions=partitions, busy_consumers=busy,
                 spare_messages_per_s=spare, drain_s=seconds)


def backlog_quantities(inputs: SizingInputs, partitions: int) -> tuple[list[Quantity], list[Drain]]:
    backlog = inputs.peak * inputs.outage_minutes * 60
    drains = []
    for consumers in inputs.drain_consumers:
        for count in sorted({partitions, max(partitions, consumers)}):
            drains.append(drain(backlog, inputs.peak, consumers, count, inputs.consumer_messages_per_s))
    thirty = drain(backlog, inputs.peak, 30, max(30, partitions), inputs.consumer_messages_per_s)
    quantities = [
        Quantity(name="backlog", value=backlog, unit="messages", article=ARTICLE["backlog"],
                 formula=f"peak × {inputs.outage_minutes:g} min outage"),
        Quantity(name="drain_30_consumers", value=thirty.drain_s if thirty.drain_s is not None else math.inf,
                 unit="s", article=ARTICLE["drain_minutes_30_consumers"] * 60,
                 formula="backlog ÷ (30 × per-consumer rate − peak), with at least 30 partitions"),
    ]
    return quantities, drains


def moved_fraction_formula(partitions_from: int, partitions_to: int) -> float:
    """Share of uniformly hashed keys whose hash mod N changes: h mod a = h mod b holds for
    min(a, b) residues out of every lcm(a, b), so 1 − min/lcm move (20 → 30: 1 − 20/60)."""
    smaller = min(partitions_from, partitions_to)
    return 1 - smaller / math.lcm(partitions_from, partitions_to)


def remap(keys: int, partitions_from: int, partitions_to: int) -> Remap:
    """Which of the user keys land elsewhere after the change, with railmq's partitioner."""
    weights = zipf_weights(keys)
    # partition_for_key is the positive hash mod the count: one hash serves both counts.
    hashes = [to_positive(murmur2(name.encode())) for name in user_keys(keys)]
    moved = [value % partitions_from != value % partitions_to for value in hashes]
    larger = max(partitions_from, partitions_to)
    return Remap(partitions_from=partitions_from, partitions_to=partitions_to, keys=keys,
                 keys_moved=sum(moved),
                 traffic_moved=sum(weight for weight, went in zip(weights, moved) if went),
                 formula_moved=moved_fraction_formula(partitions_from, partitions_to),
                 minimal_moved=abs(partitions_to - partitions_from) / larger)


def expected_duplicates(messages: int, crash_probability: float, commit_every: int) -> float:
    """Expected extra processings when a consumer crashes with probability p after processing
    each message, before its commit, and commits after every `commit_every` messages.

    A crash replays everything since the last commit, so a group of B messages is done when B
    processings in a row survive: E[processings per group] = ((1 − p)^−B − 1) / p (the expected
    number of trials to a run of B successes). Per message, B = 1: p / (1 − p), 10,101 per
    million at 1%; per batch of 100 at 1%, 732 per thousand: most batches crash before their commit."""
    p, batch = crash_probability, commit_every
    if p == 0:
        return 0.0
    per_group = ((1 - p) ** -batch - 1) / p
    return messages * (per_group / batch - 1)


def duplicates_sigma(messages: int, crash_probability: float, commit_every: int) -> float:
    """The standard deviation of the duplicate count, for tolerance bands. The processings a
    group of B needs are the trials T to a run of B successes (success 1 − p = q), whose variance
    is (1 − (2B + 1) p q^B − q^(2B+1)) / (p² q^(2B)); the groups are independent."""
    p, batch = crash_probability, commit_every
    if p == 0:
        return 0.0
    q = 1 - p
    variance = (1 - (2 * batch + 1) * p * q ** batch - q ** (2 * batch + 1)) / (p * p * q ** (2 * batch))
    return math.sqrt(max(0.0, variance) * messages / batch)


# --------------------------------------------------------------------------- the report


def size(inputs: SizingInputs) -> SizingReport:
    try:
        quantities = capacity(inputs)
    except OverflowError:
        raise SizingError("these inputs multiply past any number a float holds") from None
    partitions = int(next(q.value for q in quantities if q.name == "partitions"))
    if partitions > COUNT_MAX:
        raise SizingError(f"these inputs need {partitions:,} partitions; the calculator hashes keys into "
                          f"at most {COUNT_MAX:,}")
    hot = hot_partition(inputs.keys, partitions)
    backlog, drains = backlog_quantities(inputs, partitions)
    change = remap(inputs.keys, inputs.partitions_from, inputs.partitions_to)
    try:
        duplicates = duplicates_quantities(inputs)
    except OverflowError:  # (1 − p)^−B: a batch of 2,000 at p = 0.5 is past 10^308
        raise SizingError(f"a commit batch of {inputs.commit_batch_messages:,} with a crash chance of "
                          f"{inputs.crash_probability:g} replays more often than a float counts: lower "
                          "--commit-batch or --crash-probability") from None
    quantities += hot_quantities(inputs, hot) + backlog + [
        Quantity(name="keys_remapped", value=change.formula_moved, unit="fraction",
                 article=ARTICLE["keys_remapped"],
                 formula=f"hash mod N, {inputs.partitions_from} → {inputs.partitions_to}: 1 − min/lcm"),
    ] + duplicates
    return SizingReport(inputs=inputs, quantities=quantities, hot=hot, drains=drains, remap=change,
                        remap_large_sample=remap(large_sample_keys(inputs.keys), inputs.partitions_from,
                                                 inputs.partitions_to))


def duplicates_quantities(inputs: SizingInputs) -> list[Quantity]:
    return [
        Quantity(name="duplicates_per_message_commit",
                 value=expected_duplicates(inputs.duplicates_messages, inputs.crash_probability, 1),
                 unit="messages", article=ARTICLE["duplicates_per_message_commit"],
                 formula=f"{inputs.duplicates_messages:,} × p ÷ (1 − p), p = {inputs.crash_probability:g}"),
        Quantity(name="duplicates_per_batch_commit",
                 value=expected_duplicates(inputs.duplicates_messages, inputs.crash_probability,
                                           inputs.commit_batch_messages),
                 unit="messages",
                 formula=f"{inputs.duplicates_messages:,} × (((1 − p)^−B − 1) ÷ (p B) − 1), "
                         f"B = {inputs.commit_batch_messages}"),
    ]


def large_sample_keys(keys: int) -> int:
    return min(LARGE_SAMPLE_KEYS_PER_KEY * keys, LARGE_SAMPLE_KEYS_MAX)


def report_dict(report: SizingReport) -> dict[str, Any]:
    return msgspec.to_builtins(report)
