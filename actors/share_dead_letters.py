"""The share groups' dead-letter writer: exactly-once writes of dead-lettered records (KIP-932).

A record whose delivery attempts ran out, or that a member rejected, leaves its share-partition
as a `DeadLetterItem` (actors/share_partition.py). `DeadLetterWriter` carries it to its
dead-letter topic and only then archives it. The coordinator writes dead-letter records itself,
as an idempotent producer (KIP-98) with one write in flight per dead-letter partition:

- The write (producer id, sequence, records) is stored before it is sent, so a restarted
  coordinator sends it again with the same sequence and the broker drops the copy.
- Records are archived only once a write is acknowledged, in the same stored step that clears it
  (`ShareGroups.put_many`), so a crash between the two can neither lose a record nor write it
  twice.
- A source record that retention deleted first is archived without a write; in a stored write
  it keeps its place as an empty record, so the re-sent write has the same record count.

It owns the dead-letter partitions' producer state (stored under `share-dlq/`). Share-partitions
belong to `ShareGroups` (actors/share_group.py), which hands it new dead letters after every
change, routes its answers to `on_response` and calls `advance` after each message and tick;
metadata, leaders and the requests in flight belong to `PartitionLeaders`
(actors/share_leaders.py). Bounded: writes in flight (`share_dead_letter_writes_max`), records
per write and bytes per source fetch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from actors.actor import MS
from actors.dead_letter_records import (
    DEAD_LETTER_HEADERS_BYTES_MAX, DeadLetterItem, dead_letter_batch, dead_letter_bytes, source_records,
)
from actors.deadlines import lowered
from actors.effects import Effect, Trace
from actors.errors import RETRIABLE, ErrorCode
from actors.messages import (
    INT64_MAX, CreateTopicRequest, ErrorResponse, FetchRequest, FetchResponse, InitProducerIdRequest,
    MetadataResponse, ProduceRequest, ProduceResponse, TopicConfig,
)
from actors.share_leaders import Outbound, PartitionLeaders
from actors.share_partition import SharePartition
from storage.batch import HEADER_SIZE, SEQUENCE_MAX
from storage.errors import CorruptBatch

if TYPE_CHECKING:  # the writer's owner, which imports this module
    from actors.share_group import ShareGroups


class DeadLetterTarget:
    """One dead-letter partition: its producer id and next sequence, the write in flight (stored
    before it is sent) and the records queued for the next one."""

    __slots__ = ("topic", "partition", "producer_id", "producer_epoch", "next_sequence", "pending", "batch",
                 "queue", "stage", "retry_at_ns", "found", "fetching")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.producer_id = -1  # -1: ask the coordinator for one before writing
        self.producer_epoch = 0
        self.next_sequence = 0  # the base sequence of the next write (pending or not)
        self.pending: list[DeadLetterItem] = []  # the stored write, sent and not yet acknowledged
        self.batch: bytes | None = None  # the pending write's bytes, None until (re)built
        self.queue: list[DeadLetterItem] = []
        self.stage = ""  # the request in flight: "" | "producer-id" | "fetching" | "producing"
        self.retry_at_ns = 0
        self.found: dict[int, Any] = {}  # source records fetched for the write being built
        self.fetching: list[DeadLetterItem] = []

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition

    def stored(self) -> dict[str, Any]:
        return {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                "next_sequence": self.next_sequence, "pending": [msgspec.to_builtins(item) for item in self.pending]}


# A dead-letter step that cannot go on (no leader, no data yet, a refused write) waits this long.
DEAD_LETTER_RETRY_MS = 200
# A dead-letter topic the controller refused to create is asked for again after this long: the
# refusal may last (a name too long, a limit reached), and asked again at each refusal it was a
# loop of requests between the two processes as fast as they could go.
DEAD_LETTER_TOPIC_RETRY_MS = 5_000
NEW_PRODUCER_CODES = frozenset({ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID,
                                 ErrorCode.INVALID_PRODUCER_EPOCH})


class DeadLetterWriter:
    """Writes dead-lettered records to their dead-letter topics, each exactly once.

    Per record: route it to its dead-letter partition (creating the topic if needed: the source's
    partition count, replication factor min(3, the source's), partition = source partition),
    fetch its bytes from the source leader, store the write, send it with acks=-1 as an idempotent
    producer, and archive the record once the write is acknowledged. After OUT_OF_ORDER_SEQUENCE /
    UNKNOWN_PRODUCER_ID (the broker forgot the producer, so the write was not appended) the target
    takes a new producer id and starts again at sequence 0.
    """

    def __init__(self, groups: ShareGroups, leaders: PartitionLeaders) -> None:
        self.groups = groups
        self.leaders = leaders
        self.targets: dict[tuple[str, int], DeadLetterTarget] = {}
        self.unrouted: list[DeadLetterItem] = []  # waiting for their dead-letter topic's metadata
        self.creating: set[str] = set()  # dead-letter topics with a CreateTopic in flight
        # Dead-letter topics the controller refused to create -> when to ask again (ns).
        self.refused: dict[str, int] = {}
        self.missing: set[str] = set()  # topics metadata says do not exist
        # No write waits for a retry time before this (a lower bound between the coordinator's
        # ticks, which set it exactly; None: none waits).
        self.retry_floor_ns: int | None = None

    def deadlines(self) -> list[int]:
        """When a write waiting for its retry time may go, and when a refused dead-letter topic
        that records wait for may be asked for again (see `advance`)."""
        deadlines = [target.retry_at_ns for target in self.targets.values()
                     if not target.stage and (target.pending or target.queue)]
        if self.refused and self.unrouted:
            deadlines += self.refused.values()
        return deadlines

    def _retry_later(self, target: DeadLetterTarget, now_ns: int) -> None:
        target.retry_at_ns = now_ns + DEAD_LETTER_RETRY_MS * MS
        self.retry_floor_ns = lowered(self.retry_floor_ns, target.retry_at_ns, now_ns)

    def load(self) -> None:
        for key, value in self.groups.state.items("share-dlq/"):
            topic, partition = key[len("share-dlq/"):].rsplit("/", 1)
            target = self.targets[(topic, int(partition))] = DeadLetterTarget(topic, int(partition))
            target.producer_id, target.producer_epoch = int(value["producer_id"]), int(value["producer_epoch"])
            target.next_sequence = int(value["next_sequence"])
            target.pending = [msgspec.convert(item, DeadLetterItem) for item in value["pending"]]

    def _store(self, target: DeadLetterTarget) -> None:
        self.groups.state.put(f"share-dlq/{target.topic}/{target.partition}", target.stored())
        self.groups.wrote = True

    def enqueue(self, group_id: str, share_partition: SharePartition) -> None:
        items = share_partition.take_new_dead_letters(group_id)
        if not items:
            return
        written = {item.source for target in self.targets.values() for item in target.pending}
        self.unrouted += [item for item in items if item.source not in written]

    def invariants(self) -> None:
        in_flight = sum(1 for target in self.targets.values() if target.stage)
        assert in_flight <= self.groups.limits.share_dead_letter_writes_max, (
            f"{in_flight} dead-letter writes in flight")
        for target in self.targets.values():
            assert len(target.pending) <= self.groups.limits.share_dead_letter_batch_records_max, "write too large"
            assert not (target.batch is not None and not target.pending), "a batch with no pending write"

    # ------------------------------------------------------------------ the pipeline

    def advance(self, now_ns: int) -> list[Effect]:
        """Move every target that can move one step (called after each message and tick)."""
        effects = self._route(now_ns)
        busy = sum(1 for target in self.targets.values() if target.stage)
        for key in sorted(self.targets):
            target = self.targets[key]
            if busy >= self.groups.limits.share_dead_letter_writes_max:
                break
            if target.stage or now_ns < target.retry_at_ns or not (target.pending or target.queue):
                continue
            effects += self._step(target, now_ns)
            busy += 1 if target.stage else 0
        return effects

    def _route(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        waiting: list[DeadLetterItem] = []
        for item in self.unrouted:
            topic = self.groups.dead_letter_topic(item)
            metadata = self.leaders.topics.get(topic)
            if metadata is None:
                waiting.append(item)
                effects += self._find_topic(topic, item.topic, now_ns)
                continue
            key = (topic, item.partition % len(metadata.partitions))
            self.targets.setdefault(key, DeadLetterTarget(*key)).queue.append(item)
        self.unrouted = waiting
        return effects

    def _find_topic(self, topic: str, source_topic: str, now_ns: int) -> list[Effect]:
        if topic in self.creating or self.refused.get(topic, 0) > now_ns:
            return []
        source = self.leaders.topics.get(source_topic)
        if topic not in self.missing or source is None:
            return self.leaders.request_metadata([topic, source_topic], now_ns)
        self.creating.add(topic)
        self.refused.pop(topic, None)  # asked again now; a refusal sets it again
        replicas = len(source.partitions[0].replicas) if source.partitions else 1
        replication = max(1, min(3, replicas))
        # Batches larger than the source's by the dead-letter headers' bound, or a record near the
        # source's limit never fits (railmq/retry.py makes a classic group's the same way).
        batch_bytes_max = source.config.batch_bytes_max + DEAD_LETTER_HEADERS_BYTES_MAX
        config = TopicConfig(min_insync_replicas=min(source.config.min_insync_replicas, replication),
                             batch_bytes_max=min(batch_bytes_max, self.groups.limits.fetch_bytes_max))
        request = CreateTopicRequest(correlation_id=0, name=topic, partitions=len(source.partitions),
                                     replication_factor=replication, config=config)
        return [Trace("share-dead-letter-topic-created", {"topic": topic, "source": source_topic}),
                self.leaders.send_request("create-topic", topic, self.leaders.coordinator, request, now_ns)]

    def on_metadata(self, response: MetadataResponse) -> None:
        for topic in response.topics:
            if topic.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                self.missing.add(topic.name)
            else:
                self.missing.discard(topic.name)

    def _step(self, target: DeadLetterTarget, now_ns: int) -> list[Effect]:
        if target.producer_id < 0:
            target.stage = "producer-id"
            return [self.leaders.send_request("producer-id", target.key, self.leaders.coordinator,
                                             InitProducerIdRequest(correlation_id=0), now_ns)]
        if target.pending and target.batch is not None:
            return self._produce(target, now_ns)
        if target.pending:
            items = [item for item in target.pending if item.offset not in target.found]
            if not items:
                return self._build_if_complete(target)
        else:
            items = self._next_items(target)
        source = items[0]
        topic_id = self._source_topic_id(source)
        if self._source_topic_gone(source, topic_id):
            target.fetching = items
            return self._source_gone(target, INT64_MAX, now_ns)
        endpoint = self.leaders.leader_endpoint(source.topic, source.partition, now_ns)
        if not endpoint:
            self._retry_later(target, now_ns)
            return self.leaders.refresh_leaders(source.topic, now_ns)
        target.stage, target.fetching = "fetching", items
        request = FetchRequest(correlation_id=0, topic=source.topic, partition=source.partition,
                               topic_id=topic_id, offset=min(item.offset for item in items), max_wait_ms=0,
                               max_bytes=self.groups.limits.share_dead_letter_fetch_bytes_max)
        return [self.leaders.send_request("dlq-fetch", target.key, endpoint, request, now_ns)]

    def _source_topic_id(self, item: DeadLetterItem) -> int:
        """The id of the topic the record was delivered from (0: not known)."""
        share_partition = self.groups.share_partition_of(item)
        return share_partition.topic_id if share_partition is not None else 0

    def _source_topic_gone(self, item: DeadLetterItem, topic_id: int) -> bool:
        """Metadata says the record's topic was deleted (and maybe made again under its name, with
        another id): the record went with it. Fetched by name and offset, the new topic's record
        there was written as the dead letter (one the group was delivered as well); the fetch
        names the topic's id too, so a leader of the new topic refuses it (UNKNOWN_TOPIC_ID) and
        metadata is asked again."""
        if item.topic in self.missing:
            return True
        metadata = self.leaders.topics.get(item.topic)
        return bool(topic_id and metadata is not None and metadata.topic_id and metadata.topic_id != topic_id)

    def _next_items(self, target: DeadLetterTarget) -> list[DeadLetterItem]:
        """Queued records of the first queued record's source partition, lowest offsets first."""
        first = target.queue[0]
        source = (first.topic, first.partition)
        same = sorted((item for item in target.queue if (item.topic, item.partition) == source),
                      key=lambda item: item.offset)
        return same[:self.groups.limits.share_dead_letter_batch_records_max]

    def _produce(self, target: DeadLetterTarget, now_ns: int) -> list[Effect]:
        endpoint = self.leaders.leader_endpoint(target.topic, target.partition, now_ns)
        if not endpoint:
            self._retry_later(target, now_ns)
            if target.topic in self.missing:
                # Deleted since the write was routed here: made again as at first, the write goes
                # on there (its producer id is new to that topic's leader, which answers it as in
                # `_on_refused`). Waiting for its leader, it waited for good, and the records
                # stayed dead-lettering, holding their share-partitions' start back.
                return self._find_topic(target.topic, target.pending[0].topic, now_ns)
            return self.leaders.refresh_leaders(target.topic, now_ns)
        target.stage = "producing"
        request = ProduceRequest(correlation_id=0, topic=target.topic, partition=target.partition, acks=-1,
                                 timeout_ms=self.groups.limits.share_request_timeout_ms, batch=target.batch,
                                 producer_secret=self.groups.producer_secrets.of(target.producer_id))
        return [self.leaders.send_request("dlq-produce", target.key, endpoint, request, now_ns)]

    # ------------------------------------------------------------------ answers

    def on_response(self, outbound: Outbound, response: Any, now_ns: int) -> list[Effect]:
        if outbound.kind == "create-topic":
            self.creating.discard(outbound.key)
            if response.error not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                again_ns = self.refused[outbound.key] = now_ns + DEAD_LETTER_TOPIC_RETRY_MS * MS
                self.retry_floor_ns = lowered(self.retry_floor_ns, again_ns, now_ns)
                return [Trace("share-dead-letter-topic-refused", {"topic": outbound.key, "error": response.error,
                                                                  "message": response.error_message,
                                                                  "retry_in_ms": DEAD_LETTER_TOPIC_RETRY_MS})]
            self.refused.pop(outbound.key, None)
            self.missing.discard(outbound.key)
            return self.leaders.request_metadata([outbound.key], now_ns)
        target = self.targets[outbound.key]
        target.stage = ""
        if isinstance(response, ErrorResponse) or response.error != ErrorCode.NONE:
            return self._on_refused(target, outbound.kind, response, now_ns)
        if outbound.kind == "producer-id":
            target.producer_id, target.producer_epoch = response.producer_id, response.producer_epoch
            target.next_sequence, target.batch = 0, None
            self._store(target)
            return []
        if outbound.kind == "dlq-fetch":
            return self._on_fetched(target, response, now_ns)
        return self._on_written(target, response, now_ns)

    def _on_refused(self, target: DeadLetterTarget, kind: str, response: Any, now_ns: int) -> list[Effect]:
        code = response.error
        self._retry_later(target, now_ns)
        if kind == "dlq-produce" and code == ErrorCode.MESSAGE_TOO_LARGE:
            # One letter larger than its dead-letter topic takes (a topic made by hand with a lower
            # limit): nothing changes until the topic does, so it is not re-sent five times a second.
            target.retry_at_ns = now_ns + DEAD_LETTER_TOPIC_RETRY_MS * MS
        if kind == "dlq-fetch" and code == ErrorCode.OFFSET_OUT_OF_RANGE and isinstance(response, FetchResponse):
            return self._source_gone(target, response.log_start_offset, now_ns)
        if kind == "dlq-produce" and code in NEW_PRODUCER_CODES:
            target.producer_id, target.next_sequence, target.batch = -1, 0, None
            self._store(target)
        trace = Trace("share-dead-letter-retry", {"topic": target.topic, "partition": target.partition, "step": kind,
                                                  "error": code, "message": response.error_message})
        if code in RETRIABLE and kind in ("dlq-fetch", "dlq-produce"):
            source = target.fetching[0] if kind == "dlq-fetch" else None
            topic, partition = (source.topic, source.partition) if source is not None else target.key
            self.leaders.forget_leader(topic, partition)
            return [trace] + self.leaders.refresh_leaders(topic, now_ns)
        return [trace]

    def _source_gone(self, target: DeadLetterTarget, log_start_offset: int, now_ns: int) -> list[Effect]:
        """Retention deleted source records before they were dead-lettered (or their topic was
        deleted: every offset is below INT64_MAX): nothing left to write."""
        gone = [item for item in target.fetching if item.offset < log_start_offset]
        if target.pending:  # a stored write: it is re-sent with the same record count, gone ones empty
            for item in gone:
                target.found.setdefault(item.offset, (-1, None, None, None))
            target.retry_at_ns = 0
            return self._build_if_complete(target)
        target.queue = [item for item in target.queue if item not in gone]
        return self._archive(gone, now_ns, "source-gone")

    def _on_fetched(self, target: DeadLetterTarget, response: FetchResponse, now_ns: int) -> list[Effect]:
        wanted = {item.offset for item in target.fetching}
        try:
            target.found.update(source_records(response.records, wanted))
        except CorruptBatch as error:
            self._retry_later(target, now_ns)
            return [Trace("share-dead-letter-corrupt-source",
                          {"topic": target.fetching[0].topic, "error": str(error)})]
        if response.log_start_offset > min(wanted):
            return self._source_gone(target, response.log_start_offset, now_ns)
        if target.pending:
            return self._build_if_complete(target)
        included = self._fitting(target, [item for item in target.fetching if item.offset in target.found])
        if not included:
            self._retry_later(target, now_ns)
            return []
        target.found = {item.offset: target.found[item.offset] for item in included}
        target.queue = [item for item in target.queue if item not in included]
        target.pending = included
        return self._build_if_complete(target)

    def _fitting(self, target: DeadLetterTarget, items: list[DeadLetterItem]) -> list[DeadLetterItem]:
        """The first of `items` whose dead letters fit one batch of the dead-letter topic (at least
        one: a letter too large alone is refused MESSAGE_TOO_LARGE and waits, see `_on_refused`).
        Up to 100 letters of a source batch near its limit, each with its headers, can be larger
        than any batch the dead-letter topic takes: written as one, the write was refused for good."""
        metadata = self.leaders.topics.get(target.topic)
        config = metadata.config if metadata is not None else TopicConfig()
        room = config.batch_bytes_max - HEADER_SIZE
        for count, item in enumerate(items):
            room -= dead_letter_bytes(item, target.found.get(item.offset))
            if room < 0:
                return items[:max(1, count)]
        return items

    def _build_if_complete(self, target: DeadLetterTarget) -> list[Effect]:
        if any(item.offset not in target.found for item in target.pending):
            return []  # the next step fetches the rest
        if target.next_sequence + len(target.pending) - 1 > SEQUENCE_MAX:
            # The header holds sequence numbers as an int32 and this target's only grow: past it
            # the write goes under a new producer id from 0 (the next step asks for one). Never
            # sent under the old numbers, which no header holds, so nothing is written twice.
            target.producer_id, target.next_sequence = -1, 0
            self._store(target)
            return []
        target.batch = dead_letter_batch(target.pending, target.found, producer_id=target.producer_id,
                                         producer_epoch=target.producer_epoch, base_sequence=target.next_sequence)
        target.found = {}
        self._store(target)  # stored before it is sent: the send waits for the flush
        return []

    def _on_written(self, target: DeadLetterTarget, response: ProduceResponse, now_ns: int) -> list[Effect]:
        written, target.pending, target.batch = target.pending, [], None
        target.next_sequence += len(written)
        effects = self._archive(written, now_ns, "written", stored_with=target)
        return effects + [Trace("share-dead-lettered", {
            "topic": target.topic, "partition": target.partition, "base_offset": response.base_offset,
            "records": [[item.group_id, item.topic, item.partition, item.offset, item.reason] for item in written]})]

    def _archive(self, items: list[DeadLetterItem], now_ns: int, why: str,
                 stored_with: DeadLetterTarget | None = None) -> list[Effect]:
        touched: dict[tuple[str, str, int], tuple[str, SharePartition]] = {}
        for item in items:
            share_partition = self.groups.share_partition_of(item)
            if share_partition is not None:
                share_partition.archive([item.offset])
                touched[(item.group_id, item.topic, item.partition)] = (item.group_id, share_partition)
        stored = [] if stored_with is None else [(f"share-dlq/{stored_with.topic}/{stored_with.partition}",
                                                  stored_with.stored())]
        self.groups.put_many(stored, list(touched.values()))
        effects: list[Effect] = [] if why == "written" else [Trace("share-dead-letter-source-gone", {
            "records": [[item.group_id, item.topic, item.partition, item.offset] for item in items]})]
        for item in {(item.group_id, item.topic, item.partition): item for item in items}.values():
            effects += self.groups.after_archive(item, now_ns)
        return effects
