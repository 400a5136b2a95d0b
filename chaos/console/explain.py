"""Explain an offset: the life of one record, from the producer to the groups that consumed it.

The facts, and where each comes from:
- the batch that holds the offset (one fetch from the leader): the producer id, epoch and
  sequence that wrote it, the batch's offsets, size and CRC, the leader epoch that stamped it,
  and the record's own timestamp (the producer's clock when it was created);
- who led that epoch, and since when: the `became-leader` / `leader-elected` trace events of
  this partition; later elections, unclean elections, truncations and retention likewise;
- when the leader's log, each follower's log and the high watermark passed the offset, and when
  each group's commit did: the console's journal (chaos/console/journal.py), as intervals whose
  width is the resolution of what the console saw;
- what holds it now: each replica's log start and end from metadata.

Nothing is guessed: a fact the console does not have is a `gap` with the reason — the console
was not watching yet, the trace was rotated away (and since when it reaches), there is no trace
file, no leader answers. The actors do not trace individual appends or commits, so times come
from observation, never from a per-record log.
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.errors import RailmqError
from chaos.console.batches import EXPLAIN_TIMEOUT_MS, BatchFacts, RecordFacts, read_batch
from chaos.console.journal import Passage
from chaos.console.traces import coverage, partition_needles, scan
from railmq.admin import Admin
from storage.errors import StorageError

STORY_EVENTS = frozenset(
    {
        "became-leader",
        "leader-elected",
        "unclean-election",
        "partition-offline",
        "follower-truncated",
        "follower-reset",
        "retention",
        "isr-changed",
        "repair-truncated",
    }
)


class Step(msgspec.Struct, kw_only=True):
    what: str
    kind: str = "fact"  # "fact" | "gap" | "warning"
    source: str = ""  # "batch", "trace", "console", "metadata", "group coordinator"
    time_ns: int | None = None  # when, or the end of the interval
    after_ns: int | None = None  # the start of the interval, when the time is one


class Story(msgspec.Struct, kw_only=True):
    topic: str
    partition: int
    offset: int
    error: str = ""
    record: RecordFacts | None = None
    batch: BatchFacts | None = None
    steps: list[Step] = []
    trace_since_ns: int | None = None
    leader_node: int | None = None  # who led the epoch that appended it, when the trace says


def passage_step(what: str, passage: Passage, *, resolution: str) -> Step:
    """A journal answer as a step: an interval, or a gap that says why there is none."""
    if not passage.passed:
        since = f" (watched since {passage.watched_since_ns})" if passage.watched_since_ns else ""
        return Step(what=f"{what}: not yet, as far as the console saw{since}", kind="gap", source="console")
    if passage.before_watching:
        return Step(
            what=f"{what}: already at the console's first sight of it (no earlier sample)",
            kind="gap",
            source="console",
            time_ns=passage.by_ns,
        )
    return Step(
        what=f"{what} (seen between two samples; {resolution})",
        source="console",
        time_ns=passage.by_ns,
        after_ns=passage.after_ns,
    )


def _no_later_than_copies(passages: dict[int, Passage], leader: int) -> Passage:
    """The leader appended a record no later than any follower was seen holding it: reports come
    from separate heartbeats, so a follower's can be newer than the leader's last one."""
    own = passages[leader]
    copies = [
        passage.by_ns
        for node, passage in passages.items()
        if node != leader and passage.passed and passage.by_ns is not None
    ]
    if not copies or (own.passed and own.by_ns is not None and own.by_ns <= min(copies)):
        return own
    earliest = min(copies)
    after = own.after_ns if own.after_ns is not None and own.after_ns < earliest else None
    return Passage(
        passed=True,
        after_ns=after,
        by_ns=earliest,
        before_watching=after is None and own.before_watching,
        watched_since_ns=own.watched_since_ns,
    )


def _offset(event: dict[str, Any], field: str) -> int:
    """An offset of a trace event, 0 when it is missing or not a number (a line that parses but
    is not what an actor writes must not make the explain view answer 500)."""
    value = event.get(field, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class Explainer:
    def __init__(self, collector: Any) -> None:
        self.collector = collector

    def explain(self, topic: str, partition: int, offset: int) -> Story:
        story = Story(topic=topic, partition=partition, offset=offset)
        view = next(
            (
                item
                for item in self.collector.snapshot.partitions
                if item.topic == topic and item.partition == partition
            ),
            None,
        )
        if view is None:
            story.error = f"{topic}/{partition} is not a partition of this cluster"
            return story
        if offset < 0:
            story.error = "an offset is zero or more"
            return story
        self._read_record(story, view)
        events = self._trace_events(story, topic, partition)
        self._leadership(story, events)
        self._replication(story, view)
        self._groups(story)
        self._afterwards(story, view, events)
        return story

    # ------------------------------------------------------------------ the batch

    def _read_record(self, story: Story, view: Any) -> None:
        offset = story.offset
        if offset < view.log_start_offset:
            story.steps.append(
                Step(
                    what=f"offset {offset} is below the log start {view.log_start_offset}: "
                    "retention or DeleteRecords removed it",
                    kind="warning",
                    source="metadata",
                )
            )
            return
        if offset >= view.high_watermark:
            story.steps.append(
                Step(
                    what=f"offset {offset} is not below the high watermark {view.high_watermark}: "
                    "no consumer can read it yet"
                    + (" (it is not written yet)" if offset >= view.log_end_offset else ""),
                    kind="gap",
                    source="metadata",
                )
            )
            return
        leader = next((replica for replica in view.replicas if replica.role == "leader"), None)
        metadata = self.collector.metadata
        endpoint = next(
            (
                info.endpoint
                for t in (metadata.topics if metadata else [])
                if t.name == story.topic
                for p in t.partitions
                if p.partition == story.partition
                for info in p.replica_info
                if leader is not None and info.node == leader.node
            ),
            "",
        )
        if view.offline or not endpoint:
            story.steps.append(
                Step(what="no leader to read the batch from right now", kind="gap", source="metadata")
            )
            return
        admin = Admin(self.collector.bootstrap, timeout_ms=EXPLAIN_TIMEOUT_MS)
        try:
            story.batch, story.record = read_batch(admin, endpoint, story.topic, story.partition, offset)
        except (RailmqError, TimeoutError, StorageError) as error:
            story.steps.append(
                Step(what=f"the leader did not return the batch: {error}", kind="gap", source="batch")
            )
            return
        finally:
            admin.close()
        batch, record = story.batch, story.record
        who = (
            f"producer {batch.producer_id} (epoch {batch.producer_epoch}), sequence {record.sequence}"
            if batch.producer_id >= 0
            else "a producer without idempotence (no producer id)"
        )
        story.steps.append(
            Step(
                what=f"created by {who}, in a batch of {batch.record_count} record(s) at offsets "
                f"{batch.base_offset}..{batch.last_offset} ({batch.size_bytes} bytes, CRC {batch.crc:#010x})",
                source="batch",
                time_ns=record.timestamp_ms * 1_000_000,
            )
        )

    # ------------------------------------------------------------------ traces

    def _trace_events(self, story: Story, topic: str, partition: int) -> list[dict[str, Any]]:
        path = self.collector.trace_path
        if not path:
            story.steps.append(
                Step(
                    what="no trace file (start the console with --data-dir): who led and what "
                    "happened since are unknown",
                    kind="gap",
                    source="trace",
                )
            )
            return []
        story.trace_since_ns = coverage(path).earliest_ns
        return list(
            scan(
                path,
                lambda event: event.get("event") in STORY_EVENTS
                and event.get("topic") == topic
                and event.get("partition") == partition,
                needles=partition_needles(topic, partition),
            )
        )

    def _leadership(self, story: Story, events: list[dict[str, Any]]) -> None:
        if story.batch is None:
            return
        epoch = story.batch.leader_epoch
        became = [
            event
            for event in events
            if event["event"] == "became-leader" and event.get("leader_epoch") == epoch
        ]
        if became:
            event = became[-1]
            story.leader_node = event.get("node")
            story.steps.append(
                Step(
                    what=f"appended by the leader n{event.get('node')} of epoch {epoch}, which led from its "
                    f"log end {event.get('log_end_offset')}",
                    source="trace",
                    time_ns=event["time_ns"],
                )
            )
        else:
            since = story.trace_since_ns
            reason = (
                f"the trace reaches back only to {since}: older events were rotated away"
                if since is not None
                else "the trace holds no event"
            )
            story.steps.append(
                Step(
                    what=f"appended by the leader of epoch {epoch}; which node that was is not in "
                    f"the trace ({reason})",
                    kind="gap",
                    source="trace",
                )
            )

    def _replication(self, story: Story, view: Any) -> None:
        journal, offset = self.collector.journal, story.offset
        resolution = (
            "as each replica reported it in its heartbeats (every 200 ms, each on its own clock), "
            "read by the console every refresh"
        )
        passages = {
            replica.node: journal.replica_passage(story.topic, story.partition, replica.node, offset)
            for replica in view.replicas
        }
        for replica in view.replicas:
            appending = replica.node == story.leader_node
            passage = _no_later_than_copies(passages, replica.node) if appending else passages[replica.node]
            role = "the appending leader" if appending else "replica"
            story.steps.append(
                passage_step(f"n{replica.node} ({role}) had it in its log", passage, resolution=resolution)
            )
        story.steps.append(
            passage_step(
                "the high watermark passed it: consumers could read it",
                journal.high_watermark_passage(story.topic, story.partition, offset),
                resolution=resolution,
            )
        )
        holders = [
            f"n{replica.node}"
            for replica in view.replicas
            if replica.log_start_offset <= offset < replica.log_end_offset
        ]
        missing = [f"n{replica.node}" for replica in view.replicas if f"n{replica.node}" not in holders]
        story.steps.append(
            Step(
                what=f"now held by {', '.join(holders) or 'no replica'}"
                + (f"; not by {', '.join(missing)}" if missing else ""),
                kind="fact" if holders else "warning",
                source="metadata",
            )
        )

    def _groups(self, story: Story) -> None:
        journal, offset = self.collector.journal, story.offset
        committed = {
            description.group_id: entry
            for description in self.collector.slow.descriptions
            for entry in description.offsets
            if (entry.topic, entry.partition) == (story.topic, story.partition)
        }
        groups = sorted(set(committed) | set(journal.groups_of(story.topic, story.partition)))
        if not groups:
            story.steps.append(
                Step(
                    what="no group has committed an offset on this partition",
                    kind="gap",
                    source="group coordinator",
                )
            )
        for group in groups:
            entry = committed.get(group)
            if entry is not None and entry.offset <= offset:
                story.steps.append(
                    Step(
                        what=f"group {group} has not consumed it yet (committed {entry.offset})",
                        kind="gap",
                        source="group coordinator",
                    )
                )
                continue
            passage = journal.commit_passage(group, story.topic, story.partition, offset)
            step = passage_step(
                f"group {group} consumed it and committed past it",
                passage,
                resolution="the console reads commits every second",
            )
            story.steps.append(step)

    def _afterwards(self, story: Story, view: Any, events: list[dict[str, Any]]) -> None:
        """Elections, truncations and retention after the record was written."""
        if story.record is None:
            return
        written_ns = story.record.timestamp_ms * 1_000_000
        for event in events:
            if event["time_ns"] < written_ns:
                continue
            name = event["event"]
            if name == "leader-elected":
                story.steps.append(
                    Step(
                        what=f"then n{event.get('leader')} was elected leader (epoch "
                        f"{event.get('leader_epoch')})",
                        source="trace",
                        time_ns=event["time_ns"],
                    )
                )
            elif name == "unclean-election":
                story.steps.append(
                    Step(
                        what=f"then an UNCLEAN election made n{event.get('leader')} leader: "
                        "acknowledged writes may have been lost",
                        kind="warning",
                        source="trace",
                        time_ns=event["time_ns"],
                    )
                )
            elif name == "follower-truncated" and (
                _offset(event, "to") <= story.offset < _offset(event, "from")
            ):
                story.steps.append(
                    Step(
                        what=f"then {event.get('actor', 'a follower')} truncated its log to "
                        f"{event.get('to')}, removing this offset, and fetched again",
                        kind="warning",
                        source="trace",
                        time_ns=event["time_ns"],
                    )
                )
            elif name == "retention" and _offset(event, "log_start_offset") > story.offset:
                story.steps.append(
                    Step(
                        what=f"then retention deleted it ({event.get('actor')})",
                        kind="warning",
                        source="trace",
                        time_ns=event["time_ns"],
                    )
                )
