"""The slow facts, gathered once a second in a thread of their own so a paused or isolated
coordinator can delay them without freezing the topology: every group's description and
commits, the timestamp of the oldest unconsumed record of each lagging partition (for lag in
seconds), every actor's runtime counters, and each replica's log size on disk.

Each request has a short timeout and its own failure: what could not be read is reported as a
sentence in `problems`, and the previous value is kept (marked by the time it was read).
"""

from __future__ import annotations

import os
import time
from typing import Any

from actors.errors import ErrorCode, RailmqError
from actors.messages import DescribeGroupResponse, MetadataResponse, RuntimeStatsResponse
from chaos.console.latency import LatencyHistogram
from railmq.group_admin import GroupAdminClient

REQUEST_TIMEOUT_MS = 800
GROUPS_MAX = 64  # groups described per round; more are listed as a problem
LAG_TIMESTAMPS_PER_ROUND_MAX = 32  # fetches for lag in seconds per round (cached by committed offset)
TIMESTAMP_CACHE_MAX = 4096


def replica_sizes(data_dir: str, topic_ids: dict[str, int]) -> dict[tuple[str, int, int], int]:
    """(topic, partition, node) -> bytes of its segment files, for the topics' current ids
    (a deleted topic's directory waiting for removal is not counted)."""
    by_suffix = {f"{topic_id:x}": topic for topic, topic_id in topic_ids.items()}
    sizes: dict[tuple[str, int, int], int] = {}
    try:
        node_dirs = [name for name in os.listdir(data_dir) if name.startswith("node-")]
    except OSError:
        return sizes
    for node_dir in node_dirs:
        try:
            node = int(node_dir.removeprefix("node-"))
            replicas = os.listdir(os.path.join(data_dir, node_dir))
        except (ValueError, OSError):
            continue
        for name in replicas:
            parts = name.rsplit("-", 2)
            if len(parts) != 3 or by_suffix.get(parts[2]) != parts[0] or not parts[1].isdigit():
                continue
            sizes[(parts[0], int(parts[1]), node)] = _segment_bytes(os.path.join(data_dir, node_dir, name))
    return sizes


def _segment_bytes(directory: str) -> int:
    total = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.endswith(".log"):
                    try:
                        total += entry.stat().st_size
                    except FileNotFoundError:
                        pass  # retention removed it meanwhile
    except OSError:
        pass
    return total


class SlowFacts:
    """What the last round read. Replaced whole each round (readers take the reference)."""

    def __init__(self) -> None:
        self.time_ns = 0
        self.descriptions: list[DescribeGroupResponse] = []
        self.oldest_timestamps: dict[tuple[str, int, int], int] = {}
        self.stats: dict[str, RuntimeStatsResponse] = {}  # actor name -> its last answer
        self.sizes: dict[tuple[str, int, int], int] = {}
        self.answering: set[str] = set()  # actors that answered RuntimeStats this round
        self.problems: list[str] = []
        self.group_ids: set[str] | None = None  # every group the coordinator listed (None: not listed)


class SlowPoller:
    def __init__(self, bootstrap: str, latency: LatencyHistogram) -> None:
        self.client = GroupAdminClient(bootstrap, timeout_ms=REQUEST_TIMEOUT_MS)
        self.latency = latency
        self._timestamps: dict[tuple[str, int, int], int] = {}

    def close(self) -> None:
        self.client.close()

    def round(
        self,
        metadata: MetadataResponse | None,
        endpoints: dict[str, str],
        data_dir: str,
        previous: SlowFacts,
        skip: set[str] = frozenset(),
    ) -> SlowFacts:
        """One round. `endpoints`: actor name -> endpoint to ask for counters; `skip`: actors not
        to ask (the ones this console paused: each would cost a timeout)."""
        facts = SlowFacts()
        facts.time_ns = time.time_ns()
        facts.descriptions = self._groups(facts, previous.descriptions, metadata)
        facts.oldest_timestamps = self._lag_timestamps(facts.descriptions, metadata)
        facts.stats = self._stats(endpoints, skip, previous.stats, facts.answering)
        if data_dir and metadata is not None:
            facts.sizes = replica_sizes(data_dir, {topic.name: topic.topic_id for topic in metadata.topics})
        return facts

    def _groups(
        self, facts: SlowFacts, previous: list[DescribeGroupResponse], metadata: MetadataResponse | None
    ) -> list[DescribeGroupResponse]:
        problems = facts.problems
        if metadata is None or not metadata.group_coordinator_endpoint:
            return previous
        try:
            with self.latency.timed("ListGroups"):
                summaries = self.client.list_groups()
        except (RailmqError, TimeoutError) as error:
            problems.append(f"the group coordinator did not list its groups: {error}")
            return previous
        facts.group_ids = {summary.group_id for summary in summaries}
        if len(summaries) > GROUPS_MAX:
            problems.append(f"{len(summaries)} groups: the console describes the first {GROUPS_MAX}")
        descriptions = []
        for summary in sorted(summaries, key=lambda item: item.group_id)[:GROUPS_MAX]:
            try:
                with self.latency.timed("DescribeGroup"):
                    descriptions.append(self.client.describe_group(summary.group_id))
            except RailmqError as error:
                if error.code != ErrorCode.GROUP_ID_NOT_FOUND:
                    problems.append(f"group {summary.group_id} could not be described: {error}")
                    kept = [item for item in previous if item.group_id == summary.group_id]
                    descriptions += kept
        return descriptions

    def _lag_timestamps(
        self, descriptions: list[DescribeGroupResponse], metadata: MetadataResponse | None
    ) -> dict[tuple[str, int, int], int]:
        """The record timestamp at each lagging committed offset (cached: it never changes, unless
        the offset is below the log start, where it is the oldest record left's, read each round)."""
        leaders = {
            (topic.name, partition.partition): [
                info for info in partition.replica_info if info.node == partition.leader
            ]
            for topic in (metadata.topics if metadata else [])
            for partition in topic.partitions
        }
        ends = {key: max((info.high_watermark for info in infos), default=0)
                for key, infos in leaders.items()}
        starts = {key: max((info.log_start_offset for info in infos), default=0)
                  for key, infos in leaders.items()}
        wanted = {
            (entry.topic, entry.partition, entry.offset)
            for description in descriptions
            for entry in description.offsets
            if ends.get((entry.topic, entry.partition), 0) > entry.offset >= 0
        }
        for key in wanted:
            if key[2] < starts.get(key[:2], 0):
                # Retention passed the commit: the record it stands for moves with the log start.
                self._timestamps.pop(key, None)
        self.client._topics.clear()  # leaders move: read them fresh each round
        fetched = 0
        for key in sorted(wanted - set(self._timestamps)):
            if fetched >= LAG_TIMESTAMPS_PER_ROUND_MAX:
                break
            fetched += 1
            try:
                with self.latency.timed("Fetch"):
                    timestamp = self.client.timestamp_at(*key)
            except (RailmqError, TimeoutError):
                continue  # no leader right now: next round
            if timestamp is not None:
                self._timestamps[key] = timestamp
        if len(self._timestamps) > TIMESTAMP_CACHE_MAX:
            self._timestamps = {key: value for key, value in self._timestamps.items() if key in wanted}
        return {key: self._timestamps[key] for key in wanted if key in self._timestamps}

    def _stats(
        self,
        endpoints: dict[str, str],
        skip: set[str],
        previous: dict[str, RuntimeStatsResponse],
        answering: set[str],
    ) -> dict[str, Any]:
        # An actor not asked or silent keeps its last answer (counters only grow); gone ones go.
        stats = {name: previous[name] for name in endpoints if name in previous}
        for name, endpoint in sorted(endpoints.items()):
            if name in skip:
                continue
            try:
                with self.latency.timed("RuntimeStats"):
                    stats[name] = self.client.admin.runtime_stats(endpoint)
                answering.add(name)
            except (RailmqError, TimeoutError):
                continue  # its previous answer stays; `answering` says it is stale
        return stats
