"""The console's view of a cluster at one instant: what the page, `railmq top` and /metrics draw.

Built from facts the collector gathered (metadata with per-replica offsets and storage health,
the services' counters, each group's description and commits), plus `RateMeter`s that turn
offsets seen over time into rates. Pure: facts in, a `Snapshot` out; no request is made here.

Definitions, in Kafka's words where Kafka has them:
- high watermark and log end offset of a partition are its leader's (a follower's are shown per
  replica, with how far behind the leader's log end it is);
- under-replicated: the ISR is smaller than the replica set; under min ISR: smaller than the
  topic's min_insync_replicas (acks=all writes are refused); offline: no leader;
- produce rate: messages per second appended to the leader's log (its log end offset over the
  last `RATE_WINDOW_S`); consume rate: a group's committed offset over the same window;
- lag (railmq/lag.py): high watermark − committed offset, and in seconds the age of the oldest
  unconsumed record; a partition is hot by lag or by arrival rate against its topic's others.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import msgspec

from actors.messages import DescribeGroupResponse, MetadataResponse, PartitionMetadata, TopicMetadata
from railmq.dlq import is_dead_letter_topic
from railmq.lag import GroupLag, HotRule, build_group_lag, hot_flags

# Rates are measured over the last this many seconds: long enough to smooth the 200 ms steps of
# replica heartbeats, short enough that a stall shows within a few seconds.
RATE_WINDOW_S = 5.0
RATE_SAMPLES_MAX = 64


class RateMeter:
    """Per key, the rate of a counter that only grows (an offset); a fall (truncation, a reset,
    a recreated topic) restarts that key's history instead of showing a negative rate."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_ns = int(window_s * 1e9)
        self._samples: dict[Any, deque[tuple[int, int]]] = {}

    def observe(self, key: Any, now_ns: int, value: int) -> None:
        samples = self._samples.setdefault(key, deque(maxlen=RATE_SAMPLES_MAX))
        if samples and value < samples[-1][1]:
            samples.clear()
        samples.append((now_ns, value))
        while len(samples) > 2 and now_ns - samples[1][0] >= self.window_ns:
            samples.popleft()

    def rate(self, key: Any) -> float | None:
        samples = self._samples.get(key)
        if not samples or len(samples) < 2 or samples[-1][0] == samples[0][0]:
            return None
        (start_ns, start), (end_ns, end) = samples[0], samples[-1]
        return (end - start) * 1e9 / (end_ns - start_ns)

    def forget_missing(self, keys: set[Any]) -> None:
        for key in [key for key in self._samples if key not in keys]:
            del self._samples[key]


class ServiceView(msgspec.Struct, kw_only=True):
    name: str  # "coordinator" | "group-coordinator"
    endpoint: str = ""
    pid: int = 0
    answering: bool = False  # it answered the console's last request
    messages_in_per_s: float | None = None
    paused: bool = False


class ReplicaView(msgspec.Struct, kw_only=True):
    node: int
    actor: str
    role: str  # "leader" | "follower"
    alive: bool
    in_isr: bool
    eligible: bool = False  # KIP-966: out of the ISR but holding every acknowledged write
    pid: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0
    behind_leader: int = 0  # leader's log end − this replica's
    storage_state: str = "ok"
    storage_detail: str = ""
    storage_damage: list[tuple[int, int]] = []
    clean_shutdown: bool = False
    log_size_bytes: int | None = None  # from the data directory, when the console knows it
    paused: bool = False


class PartitionView(msgspec.Struct, kw_only=True):
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: list[ReplicaView]
    isr: list[int]
    eligible_leader_replicas: list[int] = []
    offline_reason: str = ""
    log_start_offset: int = 0
    log_end_offset: int = 0
    high_watermark: int = 0
    under_replicated: bool = False
    under_min_isr: bool = False
    offline: bool = False
    produce_rate_per_s: float | None = None
    hot: bool = False


class TopicView(msgspec.Struct, kw_only=True):
    name: str
    partitions: int
    replication_factor: int
    min_insync_replicas: int
    dead_letter: bool = False
    depth: int = 0  # records between log start and high watermark, every partition
    produce_rate_per_s: float | None = None


class NodeView(msgspec.Struct, kw_only=True):
    node: int
    replicas: int = 0
    replicas_alive: int = 0
    leaders: int = 0
    log_size_bytes: int | None = None


class Snapshot(msgspec.Struct, kw_only=True):
    time_ns: int
    cluster_id: str = ""
    bootstrap: str = ""
    reachable: bool = True
    nodes: list[NodeView] = []
    services: list[ServiceView] = []
    topics: list[TopicView] = []
    partitions: list[PartitionView] = []
    groups: list[GroupLag] = []
    group_rates: dict[str, float] = {}  # "group|topic|partition" -> committed offsets per second
    offline_partitions: int = 0
    under_replicated_partitions: int = 0
    under_min_isr_partitions: int = 0
    produce_rate_per_s: float | None = None
    problems: list[str] = []  # what could not be read this round, in sentences
    notes: list[str] = []  # how the console found what it knows (its data directory, ...)
    actor_rates: dict[str, float] = {}  # actor name -> messages it received per second
    controls: dict[str, bool] = {}  # which buttons work: kill, pause, isolate, labs
    paused: list[str] = []  # actors the console paused and has not resumed
    isolated: list[str] = []  # targets the console isolated and has not healed ("node 2", an actor name)


def replica_actor(topic: str, partition: int, node: int) -> str:
    return f"replica/{topic}/{partition}/n{node}"  # transport/node_agent.py's replica_actor_name


def leader_info(partition: PartitionMetadata) -> Any:
    for info in partition.replica_info:
        if info.node == partition.leader:
            return info
    return None


def partition_view(
    topic: TopicMetadata,
    partition: PartitionMetadata,
    sizes: dict[tuple[str, int, int], int],
    paused: set[str],
) -> PartitionView:
    leader = leader_info(partition) if partition.leader >= 0 else None
    leader_end = (
        leader.log_end_offset
        if leader is not None
        else max((info.log_end_offset for info in partition.replica_info), default=0)
    )
    replicas = []
    for info in partition.replica_info:
        actor = replica_actor(topic.name, partition.partition, info.node)
        replicas.append(
            ReplicaView(
                node=info.node,
                actor=actor,
                role="leader" if info.node == partition.leader else "follower",
                alive=info.alive,
                in_isr=info.node in partition.isr,
                eligible=info.node in partition.eligible_leader_replicas,
                pid=info.pid,
                log_start_offset=info.log_start_offset,
                log_end_offset=info.log_end_offset,
                behind_leader=max(0, leader_end - info.log_end_offset),
                storage_state=info.storage.state,
                storage_detail=info.storage.detail,
                storage_damage=[tuple(item) for item in info.storage.damage],
                clean_shutdown=info.storage.clean_shutdown,
                log_size_bytes=sizes.get((topic.name, partition.partition, info.node)),
                paused=actor in paused,
            )
        )
    offline = partition.leader < 0 or not partition.leader_endpoint
    return PartitionView(
        topic=topic.name,
        partition=partition.partition,
        leader=partition.leader,
        leader_epoch=partition.leader_epoch,
        partition_epoch=partition.partition_epoch,
        replicas=replicas,
        isr=list(partition.isr),
        eligible_leader_replicas=list(partition.eligible_leader_replicas),
        offline_reason=partition.offline_reason,
        log_start_offset=leader.log_start_offset if leader is not None else 0,
        log_end_offset=leader_end,
        high_watermark=leader.high_watermark if leader is not None else 0,
        under_replicated=len(partition.isr) < len(partition.replicas),
        under_min_isr=len(partition.isr) < topic.config.min_insync_replicas,
        offline=offline,
    )


def topology(
    metadata: MetadataResponse,
    meter: RateMeter,
    now_ns: int,
    *,
    sizes: dict[tuple[str, int, int], int] | None = None,
    paused: set[str] | None = None,
) -> tuple[list[TopicView], list[PartitionView], list[NodeView]]:
    """Topics, partitions (with produce rates, observed into `meter`) and nodes."""
    sizes, paused = sizes or {}, paused or set()
    topics, partitions = [], []
    seen = set()
    for topic in sorted(metadata.topics, key=lambda item: item.name):
        views = [partition_view(topic, partition, sizes, paused) for partition in topic.partitions]
        for view in views:
            key = (view.topic, view.partition)
            seen.add(key)
            if not view.offline:
                meter.observe(key, now_ns, view.log_end_offset)
            view.produce_rate_per_s = meter.rate(key)
        for view, hot in zip(
            views,
            hot_flags(
                [view.produce_rate_per_s for view in views], HotRule().rate_ratio, HotRule().rate_per_s_min
            ),
        ):
            view.hot = hot
        rates = [view.produce_rate_per_s for view in views if view.produce_rate_per_s is not None]
        topics.append(
            TopicView(
                name=topic.name,
                partitions=len(views),
                replication_factor=len(topic.partitions[0].replicas) if topic.partitions else 0,
                min_insync_replicas=topic.config.min_insync_replicas,
                dead_letter=is_dead_letter_topic(topic.name),
                depth=sum(max(0, view.high_watermark - view.log_start_offset) for view in views),
                produce_rate_per_s=sum(rates) if rates else None,
            )
        )
        partitions += views
    meter.forget_missing(seen)
    return topics, partitions, node_views(metadata.nodes, partitions)


def node_views(nodes: list[int], partitions: list[PartitionView]) -> list[NodeView]:
    views = {node: NodeView(node=node) for node in nodes}
    for partition in partitions:
        for replica in partition.replicas:
            view = views.setdefault(replica.node, NodeView(node=replica.node))
            view.replicas += 1
            view.replicas_alive += int(replica.alive)
            view.leaders += int(replica.role == "leader" and not partition.offline)
            if replica.log_size_bytes is not None:
                view.log_size_bytes = (view.log_size_bytes or 0) + replica.log_size_bytes
    return [views[node] for node in sorted(views)]


def commit_rates(
    descriptions: list[DescribeGroupResponse], meter: RateMeter, now_ns: int
) -> dict[str, float]:
    """Committed offsets per second, per "group|topic|partition" (observed into `meter`)."""
    rates, seen = {}, set()
    for description in descriptions:
        for entry in description.offsets:
            key = (description.group_id, entry.topic, entry.partition)
            seen.add(key)
            meter.observe(key, now_ns, entry.offset)
            rate = meter.rate(key)
            if rate is not None:
                rates[f"{description.group_id}|{entry.topic}|{entry.partition}"] = rate
    meter.forget_missing(seen)
    return rates


def group_views(
    descriptions: list[DescribeGroupResponse],
    partitions: list[PartitionView],
    oldest_timestamps: dict[tuple[str, int, int], int],
    now_ns: int,
) -> list[GroupLag]:
    """Each group's lag by railmq/lag.py's rules, with this snapshot's high watermarks and
    arrival rates. `oldest_timestamps`: (topic, partition, committed offset) -> the timestamp of
    the record at that offset."""
    counts: dict[str, int] = {}
    for view in partitions:
        counts[view.topic] = max(counts.get(view.topic, 0), view.partition + 1)
    log_ends = {(view.topic, view.partition): view.high_watermark for view in partitions}
    log_starts = {(view.topic, view.partition): view.log_start_offset for view in partitions}
    arrivals = {
        (view.topic, view.partition): view.produce_rate_per_s
        for view in partitions
        if view.produce_rate_per_s is not None
    }
    groups = []
    for description in descriptions:
        timestamps = {
            (entry.topic, entry.partition): oldest_timestamps[(entry.topic, entry.partition, entry.offset)]
            for entry in description.offsets
            if (entry.topic, entry.partition, entry.offset) in oldest_timestamps
        }
        groups.append(
            build_group_lag(
                description,
                counts,
                log_ends,
                timestamps,
                now_ns // 1_000_000,
                rates=arrivals,
                log_starts=log_starts,
            )
        )
    return groups


def totals(partitions: list[PartitionView]) -> dict[str, Any]:
    rates = [view.produce_rate_per_s for view in partitions if view.produce_rate_per_s is not None]
    return {
        "offline_partitions": sum(view.offline for view in partitions),
        "under_replicated_partitions": sum(view.under_replicated for view in partitions),
        "under_min_isr_partitions": sum(view.under_min_isr for view in partitions),
        "produce_rate_per_s": sum(rates) if rates else None,
    }
