"""Prometheus metrics for the whole cluster, and for each node, with names a Kafka operator knows.

`/metrics` is the cluster; `/nodes/N/metrics` is node N's share — what one broker's exporter
would show: its replicas, the partitions it leads (under-replicated counts, as Kafka's
ReplicaManager counts them, are over the partitions a broker leads), its log sizes, and its
actors' counters. Nodes are not processes of their own in railmq (a node is the set of replica
processes under `node-N/`), so the console serves each node's page.

Where the numbers come from: metadata (offsets, ISR, storage health), the trace (elections, ISR
shrinks and expands: counted since the console started reading the trace), offsets seen over
time (messages in = growth of each leader's log end offset; bytes in = growth of the leader's
segment files, so it needs the data directory), each actor's runtime counters (messages, frames
rejected by reason, and the time from each request's arrival to its answer per request type:
transport/request_timing.py), and the console's own requests (their latency as a client sees it).

Each metric's help text names the Kafka metric it corresponds to.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from transport.request_timing import BUCKETS_S

REJECTION_COUNTERS = (
    "rejected_unauthenticated",
    "rejected_fault_control",
    "dropped_in_by_fault",
    "dropped_out_by_fault",
)
PARTITION = ["topic", "partition"]
REPLICA = ["topic", "partition", "node"]
GROUP_PARTITION = ["group", "topic", "partition"]


def _node_of(actor: str) -> int | None:
    if actor.startswith("replica/") and "/n" in actor:
        try:
            return int(actor.rsplit("/n", 1)[1])
        except ValueError:
            return None
    return None


class _Families:
    """One scrape: every family, built from the collector's current state (node: one node's share)."""

    def __init__(self, collector: Any, node: int | None) -> None:
        self.collector = collector
        self.node = node

    def collect(self) -> Iterator[Metric]:
        snapshot = self.collector.snapshot
        partitions = [view for view in snapshot.partitions if self._ours(view)]
        yield from self._cluster(snapshot, partitions)
        yield from self._partitions(partitions)
        yield from self._replicas(partitions)
        yield from self._trace_counters()
        yield from self._groups(snapshot)
        yield from self._actors()
        if self.node is None:
            yield self._latency()
        yield self._served()

    def _ours(self, view: Any) -> bool:
        return self.node is None or any(replica.node == self.node for replica in view.replicas)

    def _led(self, view: Any) -> bool:
        return self.node is None or view.leader == self.node

    def _cluster(self, snapshot: Any, partitions: list[Any]) -> Iterator[Metric]:
        led = [view for view in partitions if self._led(view)]
        yield GaugeMetricFamily(
            "railmq_under_replicated_partitions",
            "Partitions (led here) whose ISR is smaller "
            "than the replica set. Kafka: ReplicaManager UnderReplicatedPartitions.",
            value=sum(view.under_replicated for view in led),
        )
        yield GaugeMetricFamily(
            "railmq_under_min_isr_partition_count",
            "Partitions (led here) whose ISR is below "
            "min_insync_replicas. Kafka: ReplicaManager UnderMinIsrPartitionCount.",
            value=sum(view.under_min_isr for view in led),
        )
        yield GaugeMetricFamily(
            "railmq_offline_partitions_count",
            "Partitions without a leader. Kafka: " "KafkaController OfflinePartitionsCount.",
            value=sum(view.offline for view in partitions),
        )
        yield GaugeMetricFamily(
            "railmq_partition_count",
            "Partition replicas hosted (here). Kafka: ReplicaManager " "PartitionCount.",
            value=sum(
                1 for view in partitions for replica in view.replicas if self.node in (None, replica.node)
            ),
        )
        yield GaugeMetricFamily(
            "railmq_leader_count",
            "Partitions led (here). Kafka: ReplicaManager LeaderCount.",
            value=sum(1 for view in partitions if not view.offline and self._led(view)),
        )
        if self.node is None:
            yield GaugeMetricFamily(
                "railmq_cluster_reachable",
                "1 when the coordinator answered the console's last " "metadata request.",
                value=int(snapshot.reachable),
            )

    def _partitions(self, partitions: list[Any]) -> Iterator[Metric]:
        end = GaugeMetricFamily(
            "railmq_log_log_end_offset",
            "The leader's log end offset. Kafka: Log LogEndOffset.",
            labels=PARTITION,
        )
        start = GaugeMetricFamily(
            "railmq_log_log_start_offset",
            "The leader's log start offset. Kafka: Log " "LogStartOffset.",
            labels=PARTITION,
        )
        high = GaugeMetricFamily(
            "railmq_partition_high_watermark",
            "The high watermark: consumers read below it.",
            labels=PARTITION,
        )
        isr = GaugeMetricFamily(
            "railmq_partition_in_sync_replicas",
            "ISR size. Kafka: Partition InSyncReplicasCount.",
            labels=PARTITION,
        )
        under = GaugeMetricFamily(
            "railmq_partition_under_replicated",
            "1 when the ISR is smaller than the replica " "set. Kafka: Partition UnderReplicated.",
            labels=PARTITION,
        )
        epoch = GaugeMetricFamily("railmq_partition_leader_epoch", "The leader epoch.", labels=PARTITION)
        leader = GaugeMetricFamily(
            "railmq_partition_leader", "The leading node, -1 when offline.", labels=PARTITION
        )
        for view in partitions:
            labels = [view.topic, str(view.partition)]
            for family, value in (
                (end, view.log_end_offset),
                (start, view.log_start_offset),
                (high, view.high_watermark),
                (isr, len(view.isr)),
                (under, int(view.under_replicated)),
                (epoch, view.leader_epoch),
                (leader, view.leader),
            ):
                family.add_metric(labels, value)
        yield from (end, start, high, isr, under, epoch, leader)
        counters = self.collector.counters
        with counters.lock:
            messages, size_in = dict(counters.messages_in), dict(counters.bytes_in)
        keys = {(view.topic, view.partition) for view in partitions if self._led(view)}
        for name, table, words in (
            (
                "railmq_messages_in",
                messages,
                "Messages appended to leaders' logs (growth of "
                "their log end offsets). Kafka: BrokerTopicMetrics MessagesInPerSec.",
            ),
            (
                "railmq_bytes_in",
                size_in,
                "Bytes appended to leaders' logs (growth of their "
                "segment files). Kafka: BrokerTopicMetrics BytesInPerSec.",
            ),
        ):
            family = CounterMetricFamily(name, words, labels=PARTITION)
            for (topic, number), value in sorted(table.items()):
                if self.node is None or (topic, number) in keys:
                    family.add_metric([topic, str(number)], value)
            yield family

    def _replicas(self, partitions: list[Any]) -> Iterator[Metric]:
        size = GaugeMetricFamily(
            "railmq_log_size_bytes", "Bytes of a replica's segment files. Kafka: Log Size.", labels=REPLICA
        )
        lag = GaugeMetricFamily(
            "railmq_replica_lag_messages",
            "How far a replica's log end is behind its leader's. "
            "Kafka: ReplicaFetcherManager MaxLag (per replica).",
            labels=REPLICA,
        )
        alive = GaugeMetricFamily(
            "railmq_replica_alive", "1 when the coordinator hears the replica's heartbeats.", labels=REPLICA
        )
        storage = GaugeMetricFamily(
            "railmq_replica_storage_state",
            "1 for the replica's storage state " "(ok, new, damaged, repairing).",
            labels=REPLICA + ["state"],
        )
        for view in partitions:
            for replica in view.replicas:
                if self.node not in (None, replica.node):
                    continue
                labels = [view.topic, str(view.partition), str(replica.node)]
                if replica.log_size_bytes is not None:
                    size.add_metric(labels, replica.log_size_bytes)
                lag.add_metric(labels, replica.behind_leader)
                alive.add_metric(labels, int(replica.alive))
                storage.add_metric(labels + [replica.storage_state], 1)
        yield from (size, lag, alive, storage)

    def _trace_counters(self) -> Iterator[Metric]:
        counters = self.collector.counters
        tables = (
            (
                "railmq_isr_shrinks",
                counters.isr_shrinks,
                "ISR shrinks. Kafka: ReplicaManager IsrShrinksPerSec.",
            ),
            (
                "railmq_isr_expands",
                counters.isr_expands,
                "ISR expansions. Kafka: ReplicaManager IsrExpandsPerSec.",
            ),
            (
                "railmq_leader_elections",
                counters.elections,
                "Leader elections. Kafka: ControllerStats " "LeaderElectionRateAndTimeMs.",
            ),
            (
                "railmq_unclean_leader_elections",
                counters.unclean_elections,
                "Unclean leader elections. Kafka: " "ControllerStats UncleanLeaderElectionsPerSec.",
            ),
            (
                "railmq_partition_offline_events",
                counters.offline_events,
                "Times a partition lost its last " "eligible leader.",
            ),
            ("railmq_log_truncations", counters.truncations, "Follower truncations by leader epoch."),
            (
                "railmq_storage_damage_found",
                counters.storage_damage,
                "Replicas that found damage in their log.",
            ),
        )
        if self.node is not None:
            return  # the controller's view: cluster-wide only
        with counters.lock:
            copies = [(name, dict(table), words) for name, table, words in tables]
            rebalances, dead = dict(counters.rebalances), dict(counters.dead_lettered)
            faults = dict(counters.faults)
        for name, table, words in copies:
            family = CounterMetricFamily(
                name, words + " Counted from the trace since the console started.", labels=PARTITION
            )
            for (topic, number), value in sorted(table.items()):
                family.add_metric([topic, str(number)], value)
            yield family
        for name, table, label, words in (
            ("railmq_consumergroup_rebalances", rebalances, "group", "Rebalances started, per group."),
            (
                "railmq_dead_lettered_records",
                dead,
                "topic",
                "Records share groups dead-lettered, per " "dead-letter topic.",
            ),
            ("railmq_console_faults", faults, "action", "Fault buttons pressed on the console."),
        ):
            family = CounterMetricFamily(name, words, labels=[label])
            for key, value in sorted(table.items()):
                family.add_metric([key], value)
            yield family

    def _groups(self, snapshot: Any) -> Iterator[Metric]:
        if self.node is not None:
            return
        lag = GaugeMetricFamily(
            "railmq_consumergroup_lag",
            "High watermark minus committed offset. " "kafka_exporter: kafka_consumergroup_lag.",
            labels=GROUP_PARTITION,
        )
        seconds = GaugeMetricFamily(
            "railmq_consumergroup_lag_seconds", "Age of the oldest unconsumed record.", labels=GROUP_PARTITION
        )
        current = GaugeMetricFamily(
            "railmq_consumergroup_current_offset",
            "The committed offset. kafka_exporter: " "kafka_consumergroup_current_offset.",
            labels=GROUP_PARTITION,
        )
        members = GaugeMetricFamily(
            "railmq_consumergroup_members",
            "Live members. kafka_exporter: " "kafka_consumergroup_members.",
            labels=["group"],
        )
        for group in snapshot.groups:
            members.add_metric([group.group_id], len(group.members))
            for row in group.partitions:
                labels = [group.group_id, row.topic, str(row.partition)]
                if row.lag_messages is not None:
                    lag.add_metric(labels, row.lag_messages)
                if row.lag_seconds is not None:
                    seconds.add_metric(labels, row.lag_seconds)
                if row.committed_offset is not None:
                    current.add_metric(labels, row.committed_offset)
        depth = GaugeMetricFamily(
            "railmq_dead_letter_depth",
            "Records in a dead-letter topic (log start to high " "watermark).",
            labels=["topic"],
        )
        for topic in snapshot.topics:
            if topic.dead_letter:
                depth.add_metric([topic.name], topic.depth)
        yield from (lag, seconds, current, members, depth)

    def _actors(self) -> Iterator[Metric]:
        stats = self.collector.slow.stats
        messages_in = CounterMetricFamily(
            "railmq_actor_messages_in",
            "Messages an actor received (every request "
            "type). Kafka: RequestMetrics RequestsPerSec, all types.",
            labels=["actor"],
        )
        messages_out = CounterMetricFamily(
            "railmq_actor_messages_out", "Messages an actor sent.", labels=["actor"]
        )
        flushes = CounterMetricFamily("railmq_actor_flushes", "fsyncs an actor made.", labels=["actor"])
        rejected = CounterMetricFamily(
            "railmq_rejected_frames",
            "Frames an actor refused, by reason (decode errors "
            "by code, unauthenticated, fault switch). Kafka: NetworkProcessor "
            "invalid-request counts.",
            labels=["actor", "reason"],
        )
        dropped = CounterMetricFamily(
            "railmq_trace_lines_dropped", "Trace lines an actor could not write.", labels=["actor"]
        )
        for name, answer in sorted(stats.items()):
            if self.node is not None and _node_of(name) != self.node:
                continue
            counters = answer.counters
            messages_in.add_metric([name], counters.get("messages_in", 0))
            messages_out.add_metric([name], counters.get("messages_out", 0))
            flushes.add_metric([name], counters.get("flushes", 0))
            dropped.add_metric([name], counters.get("trace_lines_dropped", 0))
            for key, value in sorted(counters.items()):
                if key.startswith("decode_error_"):
                    rejected.add_metric([name, key.removeprefix("decode_error_")], value)
                elif key in REJECTION_COUNTERS:
                    rejected.add_metric([name, key], value)
        yield from (messages_in, messages_out, flushes, rejected, dropped)

    def _served(self) -> Metric:
        """Per request type and process (a node's replicas together, as one broker's figure)."""
        family = HistogramMetricFamily(
            "railmq_request_latency_seconds",
            "Time from a request's arrival at an actor to its answer, per request type (Kafka: "
            "RequestMetrics TotalTimeMs; a long poll's wait and an acks=all wait included).",
            labels=["request", "process"],
        )
        totals: dict[tuple[str, str], tuple[list[int], int]] = {}
        for name, answer in self.collector.slow.stats.items():
            node = _node_of(name)
            if self.node is not None and node != self.node:
                continue
            process = f"node-{node}" if node is not None else name
            for request, latency in answer.latency.items():
                if len(latency.counts) != len(BUCKETS_S) + 1:
                    continue  # another version's buckets: not added up with these
                counts, sum_us = totals.get((request, process), ([0] * len(latency.counts), 0))
                totals[(request, process)] = ([a + b for a, b in zip(counts, latency.counts)], sum_us + latency.sum_us)
        bounds = [repr(bound) for bound in BUCKETS_S] + ["+Inf"]
        for (request, process), (counts, sum_us) in sorted(totals.items()):
            running, buckets = 0, []
            for bound, count in zip(bounds, counts):
                running += count
                buckets.append((bound, running))
            family.add_metric([request, process], buckets, sum_us / 1e6)
        return family

    def _latency(self) -> Metric:
        family = HistogramMetricFamily(
            "railmq_console_request_latency_seconds",
            "Time from the console's request "
            "to the answer, per request type (a probe; Kafka: RequestMetrics TotalTimeMs).",
            labels=["request", "outcome"],
        )
        for request, outcome, buckets, total in self.collector.latency.series():
            family.add_metric([request, outcome], buckets, total)
        return family


class ClusterMetrics:
    def __init__(self, collector: Any) -> None:
        self.collector = collector

    def exposition(self, node: int | None = None) -> tuple[bytes, str]:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(self.collector, node))
        return generate_latest(registry), CONTENT_TYPE_LATEST
