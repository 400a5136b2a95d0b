"""Why each lost message was lost, told from the history and the cluster trace.

The checker knows *that* an acknowledged message is missing from the final read; the trace knows
what the replicas did. For each lost message `explain_losses` finds, on the history's time axis:

- the acknowledgement: when the send was answered, and which replica led the partition then (the
  last `became-leader` of that partition before it, with its leader epoch);
- what took that leadership away: the first `leader-elected` or `unclean-election` of the
  partition after the acknowledgement (an unclean one names the ISR it bypassed);
- what removed the record: the first `follower-truncated` (or `follower-reset`) of the partition
  after the acknowledgement whose cut covers the offset — which replica, from which log end to
  which, following which epoch.

It reads files and returns data (`LossExplanation`, one sentence each); what it cannot find it
does not guess: the sentence falls back to the checker's reason. Trace time is wall-clock; the
history's origin (`wall_origin_ns`) puts both on one axis.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

import msgspec

from chaos.history import iter_history
from chaos.verdict import LostMessage

ELECTION_EVENTS = ("leader-elected", "unclean-election")
TRUNCATION_EVENTS = ("follower-truncated", "follower-reset")


class LossExplanation(msgspec.Struct, kw_only=True):
    topic: str
    partition: int | None
    offset: int | None
    value: Any
    acknowledged_s: float | None = None
    leader: int | None = None  # the node that led the partition when the send was acknowledged
    leader_epoch: int | None = None
    election: str = ""  # what took leadership away afterwards
    truncation: str = ""  # what removed the record
    sentence: str = ""


def _node(actor: str) -> int | None:
    tail = actor.rsplit("/", 1)[-1]
    return int(tail[1:]) if tail.startswith("n") and tail[1:].isdigit() else None


def _acknowledgement_times(history_path: str, values: set[Any]) -> dict[Any, int]:
    times: dict[Any, int] = {}
    for line in iter_history(history_path):
        if line.get("type") == "ok" and line.get("f") == "send" and line.get("value") in values:
            times.setdefault(line["value"], line["time_ns"])
    return times


def _trace_events(trace_path: str, partitions: set[tuple[str, int]], wall_origin_ns: int) -> list[dict[str, Any]]:
    """Events that matter for these partitions, on the history's time axis, in time order."""
    if not trace_path or not os.path.exists(trace_path):
        return []
    wanted = ("became-leader",) + ELECTION_EVENTS + TRUNCATION_EVENTS
    events = []
    with open(trace_path, encoding="utf-8") as handle:
        for raw in handle:
            try:
                event = json.loads(raw)
            except json.JSONDecodeError:
                continue  # an actor killed mid-line leaves a torn line
            if event.get("event") not in wanted or "time_ns" not in event:
                continue
            if (event.get("topic"), event.get("partition")) not in partitions:
                continue
            events.append({**event, "at_ns": event["time_ns"] - wall_origin_ns})
    return sorted(events, key=lambda event: event["at_ns"])


def _leader_at(events: list[dict], at_ns: int) -> dict | None:
    found = None
    for event in events:
        if event["at_ns"] > at_ns:
            break
        if event["event"] == "became-leader":
            found = event
    return found


def _election_after(events: list[dict], at_ns: int) -> str:
    for event in events:
        if event["at_ns"] <= at_ns or event["event"] not in ELECTION_EVENTS:
            continue
        when = f"{event['at_ns'] / 1e9:.2f} s"
        if event["event"] == "unclean-election":
            return (f"an unclean election at {when} made n{event.get('leader', '?')} leader although it was "
                    f"outside the ISR {event.get('isr_before', '?')}")
        return (f"n{event.get('leader', '?')} was elected leader in epoch {event.get('leader_epoch', '?')} "
                f"at {when}")
    return ""


def _truncation_of(events: list[dict], at_ns: int, offset: int | None) -> str:
    for event in events:
        if event["at_ns"] <= at_ns or event["event"] not in TRUNCATION_EVENTS:
            continue
        start, end = event.get("to"), event.get("from")
        if not isinstance(start, int) or not isinstance(end, int):
            continue
        if offset is not None and not start <= offset < end:
            continue
        who = f"n{_node(event.get('actor', ''))}" if _node(event.get("actor", "")) is not None else event.get("actor")
        when = f"{event['at_ns'] / 1e9:.2f} s"
        if event["event"] == "follower-reset":
            return f"{who} dropped its log from {start} to {end} at {when} (it was behind the new leader's start)"
        following = event.get("leader_epoch")
        why = f", the end of epoch {following} on the new leader" if isinstance(following, int) and following >= 0 else ""
        return f"{who} truncated its log from offset {end} back to {start} at {when}{why}"
    return ""


def explain_losses(lost: Iterable[LostMessage], history_path: str, trace_path: str = "",
                   wall_origin_ns: int | None = None) -> list[LossExplanation]:
    lost = list(lost)
    if not lost:
        return []
    times = _acknowledgement_times(history_path, {message.value for message in lost})
    partitions = {(message.topic, message.partition) for message in lost if message.partition is not None}
    events = _trace_events(trace_path, partitions, wall_origin_ns) if wall_origin_ns is not None else []
    by_partition: dict[tuple[str, int], list[dict]] = {}
    for event in events:
        by_partition.setdefault((event["topic"], event["partition"]), []).append(event)
    return [_explain(message, times.get(message.value), by_partition.get((message.topic, message.partition), []))
            for message in lost]


def _explain(message: LostMessage, acked_ns: int | None, events: list[dict]) -> LossExplanation:
    out = LossExplanation(topic=message.topic, partition=message.partition, offset=message.offset,
                          value=message.value, acknowledged_s=None if acked_ns is None else acked_ns / 1e9)
    if acked_ns is None:
        out.sentence = message.reason
        return out
    leader = _leader_at(events, acked_ns)
    if leader is not None:
        out.leader, out.leader_epoch = _node(leader.get("actor", "")), leader.get("leader_epoch")
    out.election = _election_after(events, acked_ns)
    out.truncation = _truncation_of(events, acked_ns, message.offset)
    parts = [f"acknowledged at {acked_ns / 1e9:.2f} s" + (f" by n{out.leader} as leader in epoch {out.leader_epoch}"
                                                          if out.leader is not None else "")]
    parts += [part for part in (out.election, out.truncation) if part]
    if not out.election and not out.truncation:
        parts.append(message.reason)
    out.sentence = "; ".join(parts)
    return out
