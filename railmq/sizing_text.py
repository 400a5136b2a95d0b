"""The words and numbers `railmq size` prints: pure functions from a `SizingReport` to lines.

Numbers are printed the way the articles print them (50 MB/s, 4,320,000,000, 4.32 TB, 5%,
66.7%), so the default run reads line by line against the worked example. Decimal units.
"""

from __future__ import annotations

import math

from railmq.sizing import SimulatedDuplicates, SizingReport, duplicates_sigma, expected_duplicates

BYTE_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))
LABELS = {
    "peak": "peak rate",
    "bandwidth": "incoming bandwidth",
    "messages_per_day": "messages per day",
    "bytes_per_day": "data per day, one copy",
    "retained_one_copy": "retained, one copy",
    "retained_all_copies": "retained, every copy",
    "partitions_minimum": "minimum partitions",
    "partitions": "partitions with headroom",
    "consumers": "consumers",
    "even_share": "even share of one partition",
    "doubled_bandwidth": "doubled peak: bandwidth",
    "doubled_partitions": "doubled peak: partitions",
    "doubled_consumers": "doubled peak: consumers",
}
WHY_THEY_DIFFER = (
    "Why the figures differ: the hottest partition is wherever the most popular key lands "
    "({top} of all traffic by itself), plus whatever other keys the hash puts beside it. railmq's "
    "murmur2 puts {beside} on that partition; the articles' hash put other keys there. A different "
    "hash, or other key names, moves the hottest keys together or apart, so the exact share belongs "
    "to the hash and the keys, not to the design. Both show the lesson: the hottest partition gets "
    "about three times its even share and its one consumer falls behind while others idle.")


def trim(number: float, decimals: int = 2) -> str:
    """1,234.50 -> '1,234.5'; 50.00 -> '50'."""
    text = f"{number:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def bytes_text(value: float) -> str:
    for scale, unit in BYTE_UNITS:
        if value >= scale:
            return f"{trim(value / scale)} {unit}"
    return f"{trim(value)} B"


def percent(fraction: float, decimals: int = 2, *, fixed: bool = False) -> str:
    """5% for 0.05; with `fixed`, always `decimals` places (16.00%, as the articles print shares)."""
    return f"{fraction * 100:,.{decimals}f}%" if fixed else f"{trim(fraction * 100, decimals)}%"


def duration(seconds: float | None) -> str:
    if seconds is None or math.isinf(seconds):
        return "never"
    if seconds >= 3600:
        return f"{trim(seconds / 3600, 1)} h"
    if seconds >= 60:
        return f"{trim(seconds / 60, 1)} min"
    return f"{trim(seconds, 1)} s"


def value_text(value: float, unit: str) -> str:
    if unit == "B/s":
        return f"{bytes_text(value)}/s"
    if unit == "B":
        return bytes_text(value)
    if unit == "fraction":
        return percent(value)
    if unit == "msg/s":
        return f"{value:,.0f} msg/s"
    if unit == "s":
        return duration(value)
    return f"{value:,.0f}"


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[index]) for row in [header] + rows) for index in range(len(header))]
    rule = ["-" * width for width in widths]
    return [_row(header, widths), _row(rule, widths)] + [_row(row, widths) for row in rows]


def capacity_lines(report: SizingReport) -> list[str]:
    inputs = report.inputs
    lines = [
        "railmq size: the capacity arithmetic of a partitioned log",
        f"inputs: {inputs.peak:,.0f} msg/s at peak, {trim(inputs.message_bytes)} B per message, "
        f"{trim(inputs.retention_days)} days retained, {inputs.replication_factor} copies, "
        f"{trim(inputs.partition_mb_per_s)} MB/s per partition, {inputs.consumer_messages_per_s:,.0f} msg/s "
        f"per consumer, {trim(inputs.headroom)}x headroom",
        "",
    ]
    rows = []
    for quantity in report.quantities:
        if quantity.name not in LABELS:
            continue
        label = LABELS[quantity.name]
        if quantity.name.startswith("retained"):
            label = f"{trim(inputs.retention_days)} days {label}"
        article = "" if quantity.article is None else value_text(quantity.article, quantity.unit)
        rows.append([label, value_text(quantity.value, quantity.unit), quantity.formula, article])
    return lines + table(["quantity", "value", "formula", "articles"], rows)


def hot_lines(report: SizingReport) -> list[str]:
    hot = report.hot
    names = {q.name: q for q in report.quantities}

    def shown(value: float, unit: str) -> str:
        return percent(value, fixed=True) if unit == "fraction" else value_text(value, unit)

    rows = [[label, shown(names[name].value, names[name].unit), shown(names[name].article, names[name].unit)]
            for label, name in (("hottest partition's share", "hottest_share"),
                                ("coolest partition's share", "coolest_share"),
                                ("hottest partition's rate", "hottest_rate"),
                                ("falls behind its one consumer by", "hottest_behind"))]
    beside = [key for key in hot.hottest_keys if key != "user-1"][:3]
    why = WHY_THEY_DIFFER.format(top=percent(hot.rank_one_share),
                                 beside=("user-1 with " + ", ".join(beside)) if beside else "user-1 alone")
    return ([f"hot partition: {hot.keys:,} user keys (user-1 is the most popular; traffic ∝ 1/rank) hashed "
             f"by railmq's partitioner (Kafka's murmur2) onto {hot.partitions} partitions; partition "
             f"{hot.hottest_partition} is the hottest", ""]
            + table(["", "railmq (murmur2)", "articles"], rows) + ["", why])


def duplicates_lines(report: SizingReport, simulated: list[SimulatedDuplicates]) -> list[str]:
    inputs = report.inputs
    messages, p = inputs.duplicates_messages, inputs.crash_probability
    by_commit = {run.commit_every: run for run in simulated}
    rows = []
    for commit_every, article in ((1, "10,028"), (inputs.commit_batch_messages, "")):
        label = ("commit after every message" if commit_every == 1
                 else f"commit once per batch of {commit_every}")
        run = by_commit.get(commit_every)
        measured = "-" if run is None else _simulated_text(run, p)
        rows.append([label, f"{expected_duplicates(messages, p, commit_every):,.0f}", measured, article])
    lines = [f"duplicates per {messages:,} messages, with a {percent(p)} chance of a crash after processing "
             "each message and before its commit", ""]
    lines += table(["", "formula", "simulated on railmq's consumer-group state machines", "articles"], rows)
    if any(run.scaled_to != run.messages_simulated for run in simulated):
        lines.append(f"(simulated runs are scaled to {messages:,}; --simulate-messages {messages} runs "
                     "all of them)")
    return lines


def _simulated_text(run: SimulatedDuplicates, crash_probability: float) -> str:
    spread = duplicates_sigma(run.messages_simulated, crash_probability, run.commit_every)
    spread *= run.scaled_to / run.messages_simulated
    per_crash = run.duplicates / run.crashes if run.crashes else 0.0
    return (f"{run.scaled_duplicates:,.0f} ± {spread:,.0f} (1σ): {run.duplicates:,} in "
            f"{run.messages_simulated:,} messages, {run.crashes:,} crashes, "
            f"{trim(per_crash, 1)} replayed per crash")


def backlog_lines(report: SizingReport) -> list[str]:
    names = {q.name: q for q in report.quantities}
    backlog = names["backlog"]
    rows = [[str(d.consumers), str(d.partitions), str(d.busy_consumers), f"{d.spare_messages_per_s:,.0f}",
             duration(d.drain_s)] for d in report.drains]
    outage = trim(report.inputs.outage_minutes)
    return ([f"backlog after a {outage} min outage: {backlog.value:,.0f} messages ({backlog.formula}; "
             "articles: 30,000,000), drained while the peak keeps arriving:", ""]
            + table(["consumers", "partitions", "busy", "spare msg/s", "drain time"], rows)
            + ["articles: 20 consumers never drain it; 30 drain it in 20 min, on at least 30 partitions"])


def remap_lines(report: SizingReport) -> list[str]:
    change, large = report.remap, report.remap_large_sample
    return [
        f"keys remapped when the partition count goes {change.partitions_from} -> {change.partitions_to}:",
        f"  hash mod N, uniform hashes: {percent(change.formula_moved, 1)} of keys move "
        f"(1 - min/lcm = 1 - {min(change.partitions_from, change.partitions_to)}/"
        f"{math.lcm(change.partitions_from, change.partitions_to)}); articles: 66.7%",
        f"  railmq's partitioner: {change.keys_moved:,} of {change.keys:,} user keys "
        f"({percent(change.keys_moved / change.keys, 1)}), "
        f"{percent(change.traffic_moved, 1)} of their traffic; {large.keys_moved:,} of {large.keys:,} keys "
        f"({percent(large.keys_moved / large.keys, 1)})",
        f"  a scheme that moved only what must move (consistent hashing) would move "
        f"{percent(change.minimal_moved, 1)}",
    ]


def render(report: SizingReport, simulated: list[SimulatedDuplicates]) -> str:
    sections = [capacity_lines(report), hot_lines(report), duplicates_lines(report, simulated),
                backlog_lines(report), remap_lines(report)]
    return "\n\n".join("\n".join(section) for section in sections) + "\n"
