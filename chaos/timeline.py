"""The time series a chaos report draws, computed from a history and the cluster trace.

Per whole second of the run (history time, seconds since its origin): how many sends were
acknowledged, and the p50 and p99 of their latency (ok time minus invoke time); the fault bands
(a `fault` start line to its `stop` line, or a short mark for an instantaneous fault such as a
kill); the `heal` time; and the leader changes the coordinator traced (`leader-elected`,
`unclean-election`), moved from wall-clock to history time with the run's `wall_origin_ns`.

Pure over its inputs: it reads files and returns data; it draws nothing.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable

import msgspec

from chaos.history import iter_history

# An instantaneous fault is drawn as a band this wide so it can be seen and labelled.
INSTANT_FAULT_S = 0.25
LEADER_EVENTS = ("leader-elected", "unclean-election")


class Second(msgspec.Struct, frozen=True):
    second: int
    acknowledged: int
    latency_ms_p50: float | None
    latency_ms_p99: float | None


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


def _percentile(ordered: list[float], fraction: float) -> float | None:
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
        seconds.append(Second(second, len(samples), _percentile(samples, 0.50), _percentile(samples, 0.99)))
    return seconds


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
    lasting = {(line.get("nemesis"), line.get("target")) for line in fault_lines if line.get("phase") == "stop"}
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
    return sorted(bands, key=lambda band: band.start_s)


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
        elif kind == "fault":
            faults.append(line)
        elif kind == "heal" and heal_s is None:
            heal_s = line["time_ns"] / 1e9
        elif kind == "config" and wall_origin_ns is None:
            wall_origin_ns = line.get("wall_origin_ns")
    end_s = max([end_ns / 1e9] + [at for at, _ in latencies])
    changes = leader_changes(trace_path, wall_origin_ns) if wall_origin_ns is not None else []
    return Timeline(per_second(latencies, end_s), fault_bands(faults, end_s), changes, heal_s, end_s)
