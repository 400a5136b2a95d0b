"""The console's engine: two threads that watch a cluster and publish what they see.

The fast thread follows the trace file (every `TRACE_POLL_MS`) and asks the coordinator for
metadata every refresh — at once after a trace event that changes the topology (an election, an
ISR change, a replica start) or a button press, so a failover reaches the page in the time it
takes the trace line to be written and one metadata request to be answered. It builds the
`Snapshot`, records the journal, and publishes to subscribers. The slow thread (chaos/console/
poller.py) reads groups, lag timestamps, counters and log sizes once a second.

Subscribers are callables `(kind, payload)` with kind "snapshot" (payload: the snapshot as JSON
bytes) or "events" (a list of `TimelineEntry`); they are called from the collector's threads and
must return quickly. Counters derived from the trace (elections, ISR shrinks and expands, ...)
and from offsets (messages appended) live in `EventCounters` for /metrics; they count from the
moment the console started reading, including the trace tail it read at start.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any, Callable

import msgspec

from actors.errors import RailmqError
from actors.messages import MetadataResponse
from chaos.console import events as timeline_events
from chaos.console.counters import EventCounters, discover_data_dir
from chaos.console.events import TimelineEntry, fault_entry
from chaos.console.faults import (
    ACTIONS,
    ActorProcess,
    FaultController,
    FaultOutcome,
    FaultRefused,
    actors_from_metadata,
    read_secret,
)
from chaos.console.journal import Journal, PartitionSample
from chaos.console.latency import LatencyHistogram
from chaos.console.poller import SlowFacts, SlowPoller
from chaos.console.snapshot import (
    RateMeter,
    ServiceView,
    Snapshot,
    commit_rates,
    group_views,
    leader_info,
    topology,
    totals,
)
from chaos.console.traces import TraceTail
from railmq.admin import Admin

REFRESH_MS_DEFAULT = 500
SLOW_REFRESH_MS = 1000
TRACE_POLL_MS = 100
METADATA_TIMEOUT_MS = 1000
TIMELINE_MAX = 2000
Subscriber = Callable[[str, Any], None]


class Collector:
    def __init__(
        self,
        bootstrap: str,
        *,
        data_dir: str = "",
        cluster: Any = None,
        refresh_ms: int = REFRESH_MS_DEFAULT,
        slow_refresh_ms: int = SLOW_REFRESH_MS,
    ) -> None:
        self.bootstrap = bootstrap
        self.cluster = cluster
        self.refresh_s = refresh_ms / 1000
        self.slow_refresh_s = slow_refresh_ms / 1000
        self.data_dir = data_dir or (cluster.data_dir if cluster is not None else "")
        self.latency = LatencyHistogram()
        self.counters = EventCounters()
        self.journal = Journal()
        self.metadata: MetadataResponse | None = None
        self.snapshot = Snapshot(time_ns=time.time_ns(), bootstrap=bootstrap, reachable=False)
        self.snapshot_json = msgspec.json.encode(self.snapshot)
        self.slow = SlowFacts()
        self.notes: list[str] = []  # how the console found what it knows, for the page
        self._admin = Admin(bootstrap, timeout_ms=METADATA_TIMEOUT_MS)
        self._poller = SlowPoller(bootstrap, self.latency)
        self._timeline: deque[TimelineEntry] = deque(maxlen=TIMELINE_MAX)
        self._sequence = 0
        self.trace_events_malformed = 0  # trace lines that parsed but not as an event reads
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._meters = (RateMeter(), RateMeter(), RateMeter())  # produce, commit, actor messages in
        self.group_rates: dict[str, float] = {}
        self.actor_rates: dict[str, float] = {}
        self._last_leader_end: dict[tuple[str, int], int] = {}
        self._last_leader_size: dict[tuple[str, int], tuple[int, int]] = {}  # key -> (leader node, bytes)
        self._known_partitions: set[tuple[str, int]] = set()  # in the last metadata
        self._services: dict[str, ActorProcess] = {}
        self._tail: TraceTail | None = None
        self.faults: FaultController | None = None

    # ------------------------------------------------------------------ life

    def start(self) -> "Collector":
        self._refresh_metadata()
        self._settle_data_dir()
        secret = b""
        if self.cluster is None and self.data_dir:
            try:
                secret = read_secret(self.data_dir)
            except FaultRefused as refused:
                self.notes.append(f"isolate buttons are off: {refused}")
        self.faults = FaultController(
            self.bootstrap, self.actor_processes, secret=secret, cluster=self.cluster
        )
        for target, name in ((self._fast_loop, "console-fast"), (self._slow_loop, "console-slow")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _settle_data_dir(self) -> None:
        if not self.data_dir:
            coordinator = self._services.get("coordinator")
            self.data_dir = discover_data_dir(coordinator.pid) if coordinator is not None else ""
            if self.data_dir:
                self.notes.append(f"data directory {self.data_dir} found from the coordinator's trace file")
            else:
                self.notes.append(
                    "no data directory: no event timeline, log sizes or isolate buttons "
                    "(give --data-dir DIR)"
                )
        trace_path = os.path.join(self.data_dir, "trace.jsonl") if self.data_dir else ""
        if trace_path:
            self._tail = TraceTail(trace_path)
            self._consume_events(self._tail.poll())

    @property
    def trace_path(self) -> str:
        return self._tail.path if self._tail is not None else ""

    def stop(self) -> list[str]:
        self._stopping.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=10)
        problems = self.faults.close() if self.faults is not None else []
        self._poller.close()
        self._admin.close()
        if self._tail is not None:
            self._tail.close()
        return problems

    def subscribe(self, subscriber: Subscriber) -> None:
        with self._lock:
            self._subscribers.append(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        with self._lock:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

    def _publish(self, kind: str, payload: Any) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            subscriber(kind, payload)

    def refresh_now(self) -> None:
        self._wake.set()

    # ------------------------------------------------------------------ timeline

    def timeline(self, after: int = 0, limit: int = TIMELINE_MAX) -> list[TimelineEntry]:
        with self._lock:
            entries = [entry for entry in self._timeline if entry.sequence > after]
        return entries[-limit:]

    def _add_entries(self, entries: list[TimelineEntry]) -> list[TimelineEntry]:
        with self._lock:
            for entry in entries:
                self._sequence += 1
                entry.sequence = self._sequence
                self._timeline.append(entry)
        return entries

    def post(self, entry: TimelineEntry) -> None:
        """Put an entry of the console's own (a button, a lab) on the timeline."""
        self._publish("events", self._add_entries([entry]))

    def _consume_events(self, raw: list[dict[str, Any]]) -> bool:
        """Count and keep trace events; True when one of them changed the topology."""
        entries, topology_changed = [], False
        for event in raw:
            try:
                entry = timeline_events.to_entry(event)
                topology_changed |= event.get("event") in timeline_events.TOPOLOGY_EVENTS
                self.counters.count_event(event)
            except (TypeError, ValueError, KeyError, AttributeError):
                # A line that parses but holds another type where a list or a number belongs (a
                # torn write that still parses, another version's actor) is skipped and counted,
                # as a torn line is: raised here, it ended the fast thread and the timeline.
                self.trace_events_malformed += 1
                continue
            if entry is not None:
                entries.append(entry)
        if entries:
            self._publish("events", self._add_entries(entries))
        return topology_changed

    # ------------------------------------------------------------------ faults

    def perform_fault(self, action: str, kind: str, name: str = "") -> FaultOutcome:
        assert self.faults is not None, "the collector is not started"
        outcome = self.faults.perform(action, kind, name)
        if action in ACTIONS:  # a label per action a POST invents would grow /metrics without end
            with self.counters.lock:
                self.counters.faults[action] = self.counters.faults.get(action, 0) + 1
        self.post(
            fault_entry(
                time.time_ns(), outcome.action, outcome.target, outcome.sentence, failed=not outcome.ok
            )
        )
        self.refresh_now()
        return outcome

    def actor_processes(self) -> list[ActorProcess]:
        """Every actor with a pid and endpoint, for the fault buttons."""
        if self.cluster is not None:
            return [
                ActorProcess(actor["name"], actor["pid"], actor["endpoint"], actor["node"] or 0)
                for actor in self.cluster.actors()
                if actor["pid"] and actor["endpoint"]
            ]
        return actors_from_metadata(self.metadata, list(self._services.values()))

    # ------------------------------------------------------------------ loops

    def _fast_loop(self) -> None:
        next_refresh = 0.0
        while not self._stopping.is_set():
            changed = self._consume_events(self._tail.poll()) if self._tail is not None else False
            now = time.monotonic()
            if changed or self._wake.is_set() or now >= next_refresh:
                self._wake.clear()
                self._refresh_metadata()
                self._build_and_publish()
                next_refresh = time.monotonic() + self.refresh_s
            self._wake.wait(min(TRACE_POLL_MS / 1000, max(0.0, next_refresh - time.monotonic())))

    def _slow_loop(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            skip = set(self.faults.paused) if self.faults is not None else set()
            try:
                self.slow = self._poller.round(
                    self.metadata, self._stat_endpoints(), self.data_dir, self.slow, skip
                )
                self._observe_slow(self.slow)
            except Exception as error:  # one bad round must not end the console; say it on the page
                self.slow.problems = [f"the console's slow poll failed: {error!r}"]
            self._stopping.wait(max(0.05, self.slow_refresh_s - (time.monotonic() - started)))

    def _stat_endpoints(self) -> dict[str, str]:
        return {actor.name: actor.endpoint for actor in self.actor_processes() if actor.endpoint}

    def _observe_slow(self, facts: SlowFacts) -> None:
        now = facts.time_ns
        for description in facts.descriptions:
            for entry in description.offsets:
                self.journal.record_commit(
                    description.group_id, entry.topic, entry.partition, now, entry.offset
                )
        if facts.group_ids is not None:  # a deleted group's commits and counts go with it
            self.journal.forget_groups(facts.group_ids)
            self.counters.forget_groups(facts.group_ids)
        self.group_rates = commit_rates(facts.descriptions, self._meters[1], now)
        meter = self._meters[2]
        for name in facts.answering:
            meter.observe(name, now, facts.stats[name].counters.get("messages_in", 0))
        meter.forget_missing(set(facts.stats))
        self.actor_rates = {name: rate for name in facts.stats if (rate := meter.rate(name)) is not None}
        metadata = self.metadata
        for topic in (metadata.topics if metadata else []):
            for partition in topic.partitions:
                key = (topic.name, partition.partition)
                size = facts.sizes.get((topic.name, partition.partition, partition.leader))
                if size is None:
                    continue
                previous = self._last_leader_size.get(key)
                if previous is not None and previous[0] == partition.leader:
                    self.counters.add(self.counters.bytes_in, key, size - previous[1])
                self._last_leader_size[key] = (partition.leader, size)

    def _refresh_metadata(self) -> None:
        try:
            with self.latency.timed("Metadata"):
                self.metadata = self._admin.metadata()
            self._reachable = True
        except (RailmqError, TimeoutError) as error:
            self._reachable = False
            self._metadata_problem = f"the coordinator at {self.bootstrap} did not answer: {error}"
            return
        self._services = self._service_processes(self.metadata)
        now = time.time_ns()
        for topic in self.metadata.topics:
            for partition in topic.partitions:
                self._record(topic.name, partition, now)
        self._forget_deleted(
            {(topic.name, number.partition) for topic in self.metadata.topics for number in topic.partitions}
        )

    def _forget_deleted(self, present: set[tuple[str, int]]) -> None:
        """Drop what is kept per partition for partitions that no longer exist (a deleted topic):
        kept, 2,000 topics created and deleted left 2,000 journals, offsets and /metrics series
        for ever (4.4 MiB, and a busy partition's journal alone holds up to ~1 MB)."""
        self.journal.forget(present)
        gone = self._known_partitions - present
        self._known_partitions = present
        if not gone:
            return
        for table in (self._last_leader_end, self._last_leader_size):
            for key in gone:
                table.pop(key, None)
        self.counters.forget(gone, {topic for topic, _ in present})

    _reachable = False
    _metadata_problem = ""

    def _record(self, topic: str, partition: Any, now_ns: int) -> None:
        leader = leader_info(partition) if partition.leader >= 0 else None
        ends = tuple(sorted((info.node, info.log_end_offset) for info in partition.replica_info))
        self.journal.record_partition(
            topic,
            partition.partition,
            PartitionSample(
                now_ns,
                partition.leader,
                partition.leader_epoch,
                leader.high_watermark if leader else -1,
                ends,
            ),
        )
        if leader is not None:
            key = (topic, partition.partition)
            previous = self._last_leader_end.get(key)
            if previous is not None:
                self.counters.add(self.counters.messages_in, key, leader.log_end_offset - previous)
            self._last_leader_end[key] = leader.log_end_offset

    def _service_processes(self, metadata: MetadataResponse) -> dict[str, ActorProcess]:
        """The coordinators' pids: the supervisor's when in-process, else their RuntimeStats answers."""
        endpoints = {"coordinator": self.bootstrap, "group-coordinator": metadata.group_coordinator_endpoint}
        found = {}
        for name, endpoint in endpoints.items():
            stats = self.slow.stats.get(name)
            pid = (
                stats.pid if stats is not None else self._services.get(name, ActorProcess(name, 0, "", 0)).pid
            )
            if not pid and endpoint:
                try:
                    with self.latency.timed("RuntimeStats"):
                        pid = self._admin.runtime_stats(endpoint).pid
                except (RailmqError, TimeoutError):
                    pid = 0
            if endpoint:
                found[name] = ActorProcess(name, pid, endpoint, 0)
        return found

    def _build_and_publish(self) -> None:
        snapshot = self.build_snapshot()
        self.snapshot = snapshot
        self.snapshot_json = msgspec.json.encode(snapshot)
        self._publish("snapshot", self.snapshot_json)

    def build_snapshot(self) -> Snapshot:
        now = time.time_ns()
        metadata, slow = self.metadata, self.slow
        paused = set(self.faults.paused) if self.faults is not None else set()
        problems = list(slow.problems)
        if not self._reachable:
            problems.insert(
                0, self._metadata_problem or f"the coordinator at {self.bootstrap} has not answered yet"
            )
        if metadata is None:
            return Snapshot(
                time_ns=now,
                bootstrap=self.bootstrap,
                reachable=False,
                problems=problems,
                notes=list(self.notes),
            )
        topics, partitions, nodes = topology(metadata, self._meters[0], now, sizes=slow.sizes, paused=paused)
        services = [
            ServiceView(
                name=name,
                endpoint=process.endpoint,
                pid=process.pid,
                answering=name in slow.answering or (name == "coordinator" and self._reachable),
                messages_in_per_s=self.actor_rates.get(name),
                paused=name in paused,
            )
            for name, process in sorted(self._services.items())
        ]
        return Snapshot(
            time_ns=now,
            cluster_id=metadata.cluster_id,
            bootstrap=self.bootstrap,
            reachable=self._reachable,
            nodes=nodes,
            services=services,
            topics=topics,
            partitions=partitions,
            groups=group_views(slow.descriptions, partitions, slow.oldest_timestamps, now),
            group_rates=dict(self.group_rates),
            problems=problems,
            notes=list(self.notes),
            actor_rates=dict(self.actor_rates),
            controls={
                "kill": True,
                "pause": True,
                "isolate": bool(self.faults and self.faults.can_isolate),
                "labs": self.cluster is not None,
            },
            paused=sorted(paused),
            isolated=sorted(self.faults.isolated) if self.faults is not None else [],
            **totals(partitions),
        )
