"""Counts for /metrics that the cluster does not keep itself: trace events (elections, ISR
shrinks and expands, truncations, rebalances, dead letters) and growth seen in offsets and log
sizes (messages and bytes appended). Monotonic per console process, keyed by label tuples;
Prometheus' rate() handles the reset when a console restarts. Also: finding a cluster's data
directory from a running actor.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import psutil


def discover_data_dir(pid: int) -> str:
    """The data directory of the actor with this pid, from the trace file it keeps open ("" when
    it cannot be seen: another user's process, another machine, tracing off)."""
    try:
        for opened in psutil.Process(pid).open_files():
            if os.path.basename(opened.path) == "trace.jsonl":
                return os.path.dirname(opened.path)
    except (psutil.Error, OSError):
        pass
    return ""


class EventCounters:
    """Monotonic counts for /metrics, keyed by label tuples."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.elections: dict[tuple[str, int], int] = {}
        self.unclean_elections: dict[tuple[str, int], int] = {}
        self.offline_events: dict[tuple[str, int], int] = {}
        self.isr_shrinks: dict[tuple[str, int], int] = {}
        self.isr_expands: dict[tuple[str, int], int] = {}
        self.truncations: dict[tuple[str, int], int] = {}
        self.storage_damage: dict[tuple[str, int], int] = {}
        self.rebalances: dict[str, int] = {}
        self.dead_lettered: dict[str, int] = {}  # dead-letter topic -> records
        self.messages_in: dict[tuple[str, int], int] = {}
        self.bytes_in: dict[tuple[str, int], int] = {}
        self.faults: dict[str, int] = {}  # console action -> presses

    def count_event(self, event: dict[str, Any]) -> None:
        name = event.get("event")
        key = (
            str(event.get("topic", "")),
            int(event.get("partition", -1)) if isinstance(event.get("partition"), int) else -1,
        )
        table = {
            "leader-elected": self.elections,
            "unclean-election": self.unclean_elections,
            "partition-offline": self.offline_events,
            "follower-truncated": self.truncations,
            "storage-damage-found": self.storage_damage,
        }.get(str(name))
        with self.lock:
            if table is not None:
                table[key] = table.get(key, 0) + 1
            elif name == "isr-changed":
                grew = len(event.get("isr") or []) - len(event.get("previous_isr") or [])
                target = self.isr_shrinks if grew < 0 else self.isr_expands if grew > 0 else None
                if target is not None:
                    target[key] = target.get(key, 0) + 1
            elif name == "rebalance-started":
                group = str(event.get("group", ""))
                self.rebalances[group] = self.rebalances.get(group, 0) + 1
            elif name == "share-dead-lettered":
                self.dead_lettered[key[0]] = self.dead_lettered.get(key[0], 0) + len(
                    event.get("records") or []
                )

    def forget(self, gone: set[tuple[str, int]], topics: set[str]) -> None:
        """Drop the series of partitions that no longer exist (`gone`) and of dead-letter topics
        not among `topics`: a deleted topic's counters would stay in /metrics for ever."""
        with self.lock:
            for table in (
                self.elections,
                self.unclean_elections,
                self.offline_events,
                self.isr_shrinks,
                self.isr_expands,
                self.truncations,
                self.storage_damage,
                self.messages_in,
                self.bytes_in,
            ):
                for key in gone:
                    table.pop(key, None)
            for topic in {topic for topic, _ in gone} - topics:
                self.dead_lettered.pop(topic, None)

    def forget_groups(self, keep: set[str]) -> None:
        """Drop the rebalance counts of groups that no longer exist (a /metrics series each)."""
        with self.lock:
            for group in [group for group in self.rebalances if group not in keep]:
                del self.rebalances[group]

    def add(self, table: dict, key: Any, amount: int) -> None:
        if amount > 0:
            with self.lock:
                table[key] = table.get(key, 0) + amount
