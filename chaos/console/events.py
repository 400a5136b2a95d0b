"""Trace lines as timeline entries: what happened, to which partition, group or process, in one
sentence an operator can read at a glance, with a category the page filters on and a severity
it colours by.

Categories: `election` (leaders), `isr` (in-sync sets), `storage` (damage, repair, truncation,
retention), `group` (rebalances, members), `dead-letter`, `topic` (create, delete, grow),
`process` (replica starts and stops), `fault` (what the console's buttons did). Events the
timeline does not need (a follower's fetch timing out, a member's internal retry) are dropped
here, so the page never has to know the trace's whole vocabulary.

Pure: dicts in, entries out.
"""

from __future__ import annotations

from typing import Any, Callable

import msgspec

# The timeline keeps its last 2,000 entries for every page. Their strings come from the trace
# (reasons, member and group ids a client chose) and from a button's POST, so each is cut here:
# a POST naming 8,000 characters twice made 32 KB entries, 61 MiB of timeline for 2,000 presses.
TIMELINE_TEXT_BYTES_MAX = 1024  # a sentence read at a glance
TIMELINE_FIELD_BYTES_MAX = 320  # an actor, topic or group name (a replica's name is under 260)


def _clip(text: str, bytes_max: int) -> str:
    """`text` within `bytes_max` UTF-8 bytes, ending in "…" when it was cut."""
    raw = text.encode("utf-8", "backslashreplace")
    if len(raw) <= bytes_max:
        return text
    return raw[: bytes_max - 3].decode("utf-8", "ignore") + "…"


class TimelineEntry(msgspec.Struct, kw_only=True):
    time_ns: int
    event: str
    category: str
    severity: str  # "info" | "warning" | "critical"
    text: str
    actor: str = ""
    topic: str = ""
    partition: int = -1
    group: str = ""
    sequence: int = 0  # assigned by the collector: a strictly increasing id for the page


def _where(event: dict[str, Any]) -> str:
    return f"{event.get('topic', '?')}/{event.get('partition', '?')}"


def _nodes(values: Any) -> str:
    return "[" + ", ".join(f"n{value}" for value in values or []) + "]"


def _leader_elected(event: dict[str, Any]) -> tuple[str, str, str]:
    previous = event.get("previous_leader", -1)
    before = f"n{previous}" if isinstance(previous, int) and previous >= 0 else "none"
    return (
        "election",
        "warning",
        f"{_where(event)}: leader {before} → n{event.get('leader')} (epoch {event.get('leader_epoch')})",
    )


def _offline(event: dict[str, Any]) -> tuple[str, str, str]:
    reason = event.get("reason") or "no eligible replica"
    return "election", "critical", f"{_where(event)} is OFFLINE: {reason}"


def _unclean(event: dict[str, Any]) -> tuple[str, str, str]:
    return (
        "election",
        "critical",
        f"{_where(event)}: UNCLEAN election of n{event.get('leader')} "
        f"(ISR was {_nodes(event.get('isr_before'))}): acknowledged writes may be lost",
    )


def _isr_changed(event: dict[str, Any]) -> tuple[str, str, str]:
    new, old = list(event.get("isr") or []), list(event.get("previous_isr") or [])
    if len(new) < len(old):
        verb, severity = "shrank", "warning"
    elif len(new) > len(old):
        verb, severity = "expanded", "info"
    else:
        verb, severity = "changed", "info"
    return "isr", severity, f"{_where(event)}: ISR {verb} {_nodes(old)} → {_nodes(new)}"


def _truncated(event: dict[str, Any]) -> tuple[str, str, str]:
    return (
        "storage",
        "warning",
        f"{_where(event)}: {_actor_node(event)} truncated its log "
        f"{event.get('from')} → {event.get('to')} (leader epoch {event.get('leader_epoch')})",
    )


def _refused_truncation(event: dict[str, Any]) -> tuple[str, str, str]:
    return (
        "storage",
        "critical",
        f"{_where(event)}: n{event.get('node')} refused to truncate below its "
        f"committed offset {event.get('committed_offset')} (target {event.get('target')})",
    )


def _storage(event: dict[str, Any]) -> tuple[str, str, str]:
    name = event["event"]
    severity = (
        "critical"
        if name == "storage-damage-found"
        else ("info" if name == "storage-repaired" else "warning")
    )
    words = {
        "storage-damage-found": "found damage in its log",
        # also sent when a new or restarted replica first catches up: its log is whole from then on
        "storage-repaired": f"caught up with its leader (log end {event.get('log_end_offset', '?')})",
        "repair-truncated": "cut its log below damage to repair it",
    }[name]
    detail = f" (state {event.get('state')})" if event.get("state") else ""
    return "storage", severity, f"{_where(event)}: n{event.get('node')} {words}{detail}"


def _replica_storage(event: dict[str, Any]) -> tuple[str, str, str] | None:
    if event.get("state") in ("ok", "new"):
        return None  # the healthy reports arrive with every start: the page shows them in the topology
    return (
        "storage",
        "warning",
        f"{_where(event)}: n{event.get('node')} reports storage {event.get('state')}: "
        f"{event.get('detail', '')}",
    )


def _replica_started(event: dict[str, Any]) -> tuple[str, str, str]:
    storage = event.get("storage", "?")
    severity = "warning" if storage not in ("ok", "new") else "info"
    return (
        "process",
        severity,
        f"{_where(event)}: n{event.get('node')} started (log end {event.get('log_end_offset')}, "
        f"storage {storage}{', clean shutdown' if event.get('clean_shutdown') else ''})",
    )


def _retention(event: dict[str, Any]) -> tuple[str, str, str]:
    return (
        "storage",
        "info",
        f"{_where(event)}: retention deleted {event.get('segments_deleted')} segment(s), "
        f"log start now {event.get('log_start_offset')}",
    )


def _group(event: dict[str, Any]) -> tuple[str, str, str]:
    name, group = event["event"], event.get("group", "?")
    if name == "rebalance-started":
        return "group", "warning", f"group {group}: rebalance ({event.get('reason', '')})"
    if name == "generation-started":
        members = event.get("members") or []
        return (
            "group",
            "info",
            f"group {group}: generation {event.get('generation')} with {len(members)} "
            f"member(s), protocol {event.get('protocol', '?')}",
        )
    if name == "member-removed":
        return (
            "group",
            "warning",
            f"group {group}: member {event.get('member')} removed ({event.get('reason', '')})",
        )
    if name == "group-empty":
        return "group", "info", f"group {group}: empty (generation {event.get('generation')})"
    if name == "static-member-replaced":
        return (
            "group",
            "info",
            f"group {group}: static member {event.get('old')} replaced by {event.get('new')}",
        )
    if name == "share-member-removed":
        return (
            "group",
            "warning",
            f"share group {group}: member {event.get('member')} removed ({event.get('why', '')})",
        )
    return "group", "info", f"group {group}: {name}"


def _dead_lettered(event: dict[str, Any]) -> tuple[str, str, str]:
    records = event.get("records") or []
    reasons = sorted({str(item[4]) for item in records if isinstance(item, list) and len(item) > 4})
    return (
        "dead-letter",
        "warning",
        f"{len(records)} record(s) dead-lettered to {_where(event)}"
        f"{' (' + ', '.join(reasons) + ')' if reasons else ''}",
    )


def _topic(event: dict[str, Any]) -> tuple[str, str, str]:
    name = event["event"]
    if name == "topic-created":
        return (
            "topic",
            "info",
            f"topic {event.get('topic')} created: {event.get('partitions')} partition(s), "
            f"replication factor {event.get('replication_factor')}",
        )
    if name == "topic-deleted":
        return "topic", "warning", f"topic {event.get('topic')} deleted"
    return "topic", "info", f"topic {event.get('topic')} grown to {event.get('total')} partitions"


def _stopped(event: dict[str, Any]) -> tuple[str, str, str]:
    return "process", "info", f"{event.get('actor')} stopped: {event.get('reason', '')}"


def _storage_failure(event: dict[str, Any]) -> tuple[str, str, str]:
    return "storage", "critical", f"{event.get('actor')}: storage failure, crashing: {event.get('error', '')}"


def _actor_node(event: dict[str, Any]) -> str:
    actor = str(event.get("actor", ""))
    return actor.rsplit("/", 1)[-1] if actor.startswith("replica/") else actor or "a replica"


RENDERERS: dict[str, Callable[[dict[str, Any]], tuple[str, str, str] | None]] = {
    "leader-elected": _leader_elected,
    "partition-offline": _offline,
    "unclean-election": _unclean,
    "isr-changed": _isr_changed,
    "follower-truncated": _truncated,
    "follower-refused-truncation": _refused_truncation,
    "storage-damage-found": _storage,
    "storage-repaired": _storage,
    "repair-truncated": _storage,
    "replica-storage": _replica_storage,
    "replica-started": _replica_started,
    "retention": _retention,
    "rebalance-started": _group,
    "generation-started": _group,
    "member-removed": _group,
    "group-empty": _group,
    "static-member-replaced": _group,
    "share-member-removed": _group,
    "share-dead-lettered": _dead_lettered,
    "topic-created": _topic,
    "topic-deleted": _topic,
    "partitions-created": _topic,
    "replica-stopped": _stopped,
    "storage-failure": _storage_failure,
}
# Events after which the topology has changed: the collector refreshes metadata at once.
TOPOLOGY_EVENTS = frozenset(
    {
        "leader-elected",
        "partition-offline",
        "unclean-election",
        "isr-changed",
        "became-leader",
        "replica-started",
        "storage-damage-found",
        "storage-repaired",
        "topic-created",
        "topic-deleted",
        "partitions-created",
        "replica-storage",
    }
)


def to_entry(event: dict[str, Any]) -> TimelineEntry | None:
    """The timeline entry for a trace event, or None for an event the timeline leaves out."""
    render = RENDERERS.get(str(event.get("event")))
    if render is None:
        return None
    rendered = render(event)
    if rendered is None:
        return None
    category, severity, text = rendered
    partition = event.get("partition")
    return TimelineEntry(
        time_ns=event["time_ns"],
        event=_clip(str(event["event"]), TIMELINE_FIELD_BYTES_MAX),
        category=category,
        severity=severity,
        text=_clip(text, TIMELINE_TEXT_BYTES_MAX),
        actor=_clip(str(event.get("actor", "")), TIMELINE_FIELD_BYTES_MAX),
        topic=_clip(str(event.get("topic", "")), TIMELINE_FIELD_BYTES_MAX),
        partition=partition if isinstance(partition, int) else -1,
        group=_clip(str(event.get("group", "")), TIMELINE_FIELD_BYTES_MAX),
    )


def fault_entry(time_ns: int, action: str, target: str, outcome: str, failed: bool = False) -> TimelineEntry:
    """What a console button did ("kill replica/orders/0/n1: SIGKILL to pid 4242")."""
    return TimelineEntry(
        time_ns=time_ns,
        event=_clip(f"console-{action}", TIMELINE_FIELD_BYTES_MAX),
        category="fault",
        severity="critical" if failed else "warning",
        text=_clip(f"{action} {target}: {outcome}", TIMELINE_TEXT_BYTES_MAX),
        actor="console",
    )
