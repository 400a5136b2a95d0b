"""The time series a chaos report draws, computed from a history and the cluster trace.

Per whole second of the run (history time, seconds since its origin): how many sends were
acknowledged, and the p50 and p99 of their latency (ok time minus invoke time); around each fault
(from a second before it to two seconds after it ends) the same in 100 ms bins (`bins`), since a
one-second bin flattens a 100 ms failover into a dent; the fault bands
(a `fault` start line to its `stop` line, or a short mark for an instantaneous fault such as a
kill); the `heal` time; and the leader changes the coordinator traced (`leader-elected`,
`unclean-election`), moved from wall-clock to history time with the run's `wall_origin_ns`.

It also measures failover the way bench/failover.py does: from a fault that takes a leader away
to the first acknowledgement on that partition of a send *invoked after* the fault. The
checker's figure (first acknowledgement completed after the fault) also counts answers that were
already on their way when the fault struck, which makes a pause look like a sub-millisecond
failover; both are reported.

Pure over its inputs: it reads files and returns data; it draws nothing.
"""

from __future__ import annotations

import json
import math
import os
from bisect import bisect_right
from typing import Any, Iterable

import msgspec

from chaos.history import iter_history

# Around a fault, acknowledgements are binned this finely, from this long before it to this long after.
FINE_BIN_S = 0.1
FINE_BEFORE_S, FINE_AFTER_S = 1.0, 2.0
# An instantaneous fault is drawn as a band this wide so it can be seen and labelled.
INSTANT_FAULT_S = 0.25
# Faults of one step start within this of each other (one nemesis call, several targets).
SIMULTANEOUS_S = 0.1
LEADER_EVENTS = ("leader-elected", "unclean-election")


class Second(msgspec.Struct, frozen=True):
    second: int
    acknowledged: int
    latency_ms_p50: float | None
    latency_ms_p99: float | None


class Bin(msgspec.Struct, frozen=True):
    """Acknowledgements completed in [start_s, start_s + width_s): a second, or 100 ms near a fault."""

    start_s: float
    width_s: float
    acknowledged: int
    latency_ms_p50: float | None
    latency_ms_p99: float | None

    @property
    def rate_per_s(self) -> float:
        return self.acknowledged / self.width_s


class FaultBand(msgspec.Struct, frozen=True):
    start_s: float
    end_s: float
    label: str
    instantaneous: bool


class LeaderChange(msgspec.Struct, frozen=True):
    time_s: float
    label: str
    unclean: bool


class Timeline(msgspec.Struct):
    seconds: list[Second]
    faults: list[FaultBand]
    leader_changes: list[LeaderChange]
    heal_s: float | None
    end_s: float
    failover_ms: list[float | None] = []  # per leader fault; None: no later send was acknowledged
    bins: list[Bin] = []  # `seconds`, with the seconds near faults split into 100 ms bins

    def drawn_bins(self) -> list[Bin]:
        """What a chart draws: the fine bins, or one bin per second when there are none."""
        return self.bins or [Bin(float(second.second), 1.0, second.acknowledged, second.latency_ms_p50,
                                 second.latency_ms_p99) for second in self.seconds]


def failover_after_fault(fault_lines: list[dict[str, Any]],
                         acknowledged: dict[tuple[str, int], list[tuple[int, int]]]) -> list[float | None]:
    """Per leader fault, ms to the first ok on its partition of a send invoked after it.

    `acknowledged` maps (topic, partition) to (invoke_ns, ok_ns) pairs. Leader faults are the
    ones the checker measures: phase start, a topic and partition, role absent or `leader`.
    """
    earliest: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    for key, pairs in acknowledged.items():
        pairs = sorted(pairs)
        suffix_min, best = [0] * len(pairs), None
        for index in range(len(pairs) - 1, -1, -1):
            best = pairs[index][1] if best is None else min(best, pairs[index][1])
            suffix_min[index] = best
        earliest[key] = ([invoke for invoke, _ in pairs], suffix_min)
    samples: list[float | None] = []
    for line in fault_lines:
        if line.get("phase", "start") != "start" or line.get("role") not in (None, "leader"):
            continue
        if line.get("topic") is None or line.get("partition") is None:
            continue
        invokes, suffix_min = earliest.get((line["topic"], line["partition"]), ([], []))
        index = bisect_right(invokes, line["time_ns"])
        samples.append((suffix_min[index] - line["time_ns"]) / 1e6 if index < len(invokes) else None)
    return samples


def percentile_of_sorted(ordered: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of an ascending list (the checker's rule), None when empty."""
    if not ordered:
        return None
    rank = max(1, math.ceil(fraction * len(ordered) - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


def per_second(latencies: Iterable[tuple[float, float]], end_s: float) -> list[Second]:
    """Buckets of (ok time s, latency ms) pairs, one per second from 0 to `end_s`."""
    buckets: dict[int, list[float]] = {}
    for at_s, latency_ms in latencies:
        buckets.setdefault(int(at_s), []).append(latency_ms)
    seconds = []
    for second in range(int(math.ceil(end_s)) or 1):
        samples = sorted(buckets.get(second, []))
        seconds.append(Second(second, len(samples), percentile_of_sorted(samples, 0.50),
                              percentile_of_sorted(samples, 0.99)))
    return seconds


def fine_seconds(bands: list[FaultBand], end_s: float) -> set[int]:
    """The whole seconds that lie within FINE_BEFORE_S before to FINE_AFTER_S after a fault."""
    seconds: set[int] = set()
    for band in bands:
        first = max(0, int(math.floor(band.start_s - FINE_BEFORE_S)))
        last = min(int(math.ceil(end_s)), int(math.ceil(band.end_s + FINE_AFTER_S)))
        seconds.update(range(first, last))
    return seconds


def binned(latencies: Iterable[tuple[float, float]], end_s: float, fine: set[int]) -> list[Bin]:
    """One bin per second, except 100 ms bins within the seconds in `fine`."""
    per_bin: dict[tuple[int, int], list[float]] = {}
    steps = int(round(1 / FINE_BIN_S))
    for at_s, latency_ms in latencies:
        second = int(at_s)
        slot = min(steps - 1, int((at_s - second) / FINE_BIN_S)) if second in fine else 0
        per_bin.setdefault((second, slot), []).append(latency_ms)
    out = []
    for second in range(int(math.ceil(end_s)) or 1):
        slots = range(steps) if second in fine else range(1)
        width = FINE_BIN_S if second in fine else 1.0
        for slot in slots:
            samples = sorted(per_bin.get((second, slot), []))
            out.append(Bin(round(second + slot * width, 3), width, len(samples), percentile_of_sorted(samples, 0.50),
                           percentile_of_sorted(samples, 0.99)))
    return out


def fault_label(line: dict[str, Any]) -> str:
    """"kill leader replica/chaos/1/n2", "kill coordinator": what, whom, in which role."""
    parts = [line.get("nemesis"), line.get("role"), line.get("target")]
    if parts[1] == parts[2]:
        parts[1] = None
    return " ".join(str(part) for part in parts if part)


def fault_bands(fault_lines: list[dict[str, Any]], end_s: float) -> list[FaultBand]:
    """Pair each start with the next stop of the same nemesis and target."""
    open_faults: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    bands: list[FaultBand] = []
    lasting = {(line.get("nemesis"), line.get("target"))
               for line in fault_lines if line.get("phase") == "stop"}
    for line in fault_lines:
        key = (line.get("nemesis"), line.get("target"))
        at_s = line["time_ns"] / 1e9
        if line.get("phase", "start") == "start":
            if key in lasting:
                open_faults.setdefault(key, []).append(line)
            else:
                bands.append(FaultBand(at_s, at_s + INSTANT_FAULT_S, fault_label(line), True))
        elif open_faults.get(key):
            start = open_faults[key].pop(0)
            bands.append(FaultBand(start["time_ns"] / 1e9, at_s, fault_label(start), False))
    for starts in open_faults.values():
        bands += [FaultBand(start["time_ns"] / 1e9, end_s, fault_label(start), False) for start in starts]
    return merge_simultaneous(sorted(bands, key=lambda band: band.start_s))


def short_target(label: str) -> str:
    """The target of a fault label without its actor kind and topic: "replica/t/1/n2" -> "1/n2"."""
    target = label.split(" ")[-1]
    return "/".join(target.split("/")[2:]) if target.startswith("replica/") else target


def merge_simultaneous(bands: list[FaultBand]) -> list[FaultBand]:
    """One band for faults that are one step (a node's replicas restarted together, the
    followers paused together): same nemesis, start within `SIMULTANEOUS_S`, same kind."""
    merged: list[FaultBand] = []
    for band in bands:
        previous = merged[-1] if merged else None
        if (previous is not None and band.start_s - previous.start_s <= SIMULTANEOUS_S
                and band.instantaneous == previous.instantaneous
                and band.label.split(" ")[0] == previous.label.split(" ")[0]):
            joiner = " + " if "+" not in previous.label else ", "
            label = f"{previous.label}{joiner}{short_target(band.label)}"
            merged[-1] = FaultBand(previous.start_s, max(previous.end_s, band.end_s), label,
                                   previous.instantaneous)
        else:
            merged.append(band)
    return merged


def leader_changes(trace_path: str, wall_origin_ns: int) -> list[LeaderChange]:
    """Elections from the cluster trace, on the history's time axis."""
    if not trace_path or not os.path.exists(trace_path):
        return []
    changes = []
    with open(trace_path, encoding="utf-8") as handle:
        for raw in handle:
            try:
                event = json.loads(raw)
            except json.JSONDecodeError:
                continue  # an actor killed mid-line leaves a torn trace line: not ours to judge
            if event.get("event") not in LEADER_EVENTS or "time_ns" not in event:
                continue
            label = f"{event.get('topic', '?')}/{event.get('partition', '?')} → n{event.get('leader', '?')}"
            changes.append(LeaderChange((event["time_ns"] - wall_origin_ns) / 1e9, label,
                                        event["event"] == "unclean-election"))
    return sorted(changes, key=lambda change: change.time_s)


def build_timeline(history_path: str, trace_path: str = "", wall_origin_ns: int | None = None) -> Timeline:
    invoked_ns: dict[Any, int] = {}
    latencies: list[tuple[float, float]] = []
    acknowledged: dict[tuple[str, int], list[tuple[int, int]]] = {}
    faults: list[dict[str, Any]] = []
    heal_s: float | None = None
    end_ns = 0
    for line in iter_history(history_path):
        kind, operation = line["type"], line.get("f")
        end_ns = max(end_ns, line["time_ns"])
        if operation == "send" and kind == "invoke":
            invoked_ns[line.get("value")] = line["time_ns"]
        elif operation == "send" and kind == "ok":
            start_ns = invoked_ns.pop(line.get("value"), None)
            if start_ns is not None:
                latencies.append((line["time_ns"] / 1e9, (line["time_ns"] - start_ns) / 1e6))
                if line.get("partition") is not None:
                    key = (line.get("topic"), line["partition"])
                    acknowledged.setdefault(key, []).append((start_ns, line["time_ns"]))
        elif kind == "fault":
            faults.append(line)
        elif kind == "heal" and heal_s is None:
            heal_s = line["time_ns"] / 1e9
        elif kind == "config" and wall_origin_ns is None:
            wall_origin_ns = line.get("wall_origin_ns")
    end_s = max([end_ns / 1e9] + [at for at, _ in latencies])
    changes = leader_changes(trace_path, wall_origin_ns) if wall_origin_ns is not None else []
    bands = fault_bands(faults, end_s)
    return Timeline(per_second(latencies, end_s), bands, changes, heal_s, end_s,
                    failover_after_fault(faults, acknowledged), binned(latencies, end_s, fine_seconds(bands, end_s)))
