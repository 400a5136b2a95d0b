"""The consumer's fetch logic: keep one long-poll fetch in flight per assigned partition.

The user-facing `railmq.Consumer` owns the *consumed* position of each partition (what `poll`
has returned). This actor owns the *fetch* position (how far it has asked the leader) and the
buffer in between, which is bounded in bytes: the records waiting for `poll` and what the
fetches in flight may bring (each asks for `max_bytes`) together stay within
`buffer_bytes_max`, so a consumer of a thousand partitions holds no more than one of four. Each
partition may claim an equal share of the buffer, up to `fetch_partition_bytes_max` and at
least `FETCH_SHARE_MIN_BYTES`; a partition without room waits for the next answer to free some,
and rounds start after the partition last fetched, so none starves. Fetching stops while the
buffer is full and resumes when the shell reports records consumed (the broker never pushes; a
slow consumer only slows itself).

Each partition has a `session` number that every seek bumps; fetched data carries it, so data
fetched before a seek is dropped by the shell instead of being returned. Positions that are not
known yet (a new assignment, `seek_to_beginning`, an out-of-range offset with an
`auto_offset_reset` policy) are resolved with ListOffsets at the leader.

Commands from the shell arrive as `ClientCommand`; results go back as `Notify` effects:
("records", (topic, partition, session, batches, high_watermark)), ("position", (topic,
partition, session, offset)), ("result", (token, value, error)), ("partition-error",
(topic, partition, error)), ("metadata", topics), ("unreadable", (topic, partition, session,
offset, reason)).

A fetched batch whose header does not parse ends the readable part of a response: the batches
before it go to the shell, then an "unreadable" notice naming the offset where the bad batch
starts, and the partition is *held* (no more fetches) until the shell starts a new session with
a seek. The shell checks CRCs and records itself and holds a partition the same way, with the
"hold" command, so a bad batch is never fetched again and again, nor silently stepped over.
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.actor import MS
from actors.client_metadata import checked_topic, clipped, distrust, remember_topic
from actors.controller_endpoints import ControllerEndpoints
from actors.effects import Effect, Notify, Send, SetTimer, Trace
from actors.errors import RETRIABLE, ErrorCode, RailmqError
from actors.fetch_answers import readable_batches
from actors.messages import (
    ClientCommand, ErrorResponse, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
    MetadataRequest, MetadataResponse, PeerDisconnected, RefreshMetadata, Stop, TimerFired, TopicMetadata,
)

EARLIEST, LATEST = -2, -1
LEADERSHIP_ERRORS = frozenset({ErrorCode.NOT_LEADER, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.FENCED_LEADER_EPOCH,
                               ErrorCode.UNKNOWN_LEADER_EPOCH})  # answers that mean: ask metadata who leads
RETRY_BACKOFF_MS = 100
# A fetch asks for at least this much (its share of the buffer when many partitions share it),
# unless the whole buffer is smaller: tiny fetches would cost a round trip per few records.
FETCH_SHARE_MIN_BYTES = 64 * 1024


class ConsumerSettings(msgspec.Struct, frozen=True, kw_only=True):
    auto_offset_reset: str = "latest"  # earliest | latest | none
    fetch_max_wait_ms: int = 500
    fetch_min_bytes: int = 1  # a leader holds the answer until this many bytes (or fetch_max_wait_ms)
    fetch_partition_bytes_max: int = 4 * 1024 * 1024
    buffer_bytes_max: int = 64 * 1024 * 1024
    request_timeout_ms: int = 30_000


class PartitionFetch:
    __slots__ = ("topic", "partition", "position", "reset", "paused", "session", "correlation", "sent_ns",
                 "retry_at_ns", "reset_correlation", "endpoint", "reported", "held", "asked", "reset_ns",
                 "resetting_out_of_range", "failing")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.position = -1  # next offset to fetch; -1: unknown, see `reset`
        self.reset: int | None = None  # a ListOffsets timestamp to resolve the position with
        self.paused = False
        self.session = (0, 0)  # (seek epoch from the shell, resets done here since): see railmq/consumer.py
        self.correlation = 0  # the fetch in flight, 0 if none
        self.sent_ns = 0
        self.retry_at_ns = 0
        self.reset_correlation = 0
        self.endpoint = ""  # where the fetch or reset in flight went
        self.reported = False  # the shell was told this partition has no position
        self.held = False  # an unreadable batch is at `position`: no fetch until a seek
        self.asked = 0  # the max_bytes of the fetch in flight (its claim on the buffer)
        # When a reset after OFFSET_OUT_OF_RANGE gave the position (None: the position came
        # otherwise), and whether the reset in progress is one.
        self.reset_ns: int | None = None
        self.resetting_out_of_range = False
        self.failing = 0  # the error no retry cures that the leader answers with, told once (0: none)


class ConsumerClient:
    def __init__(self, *, bootstrap: str, settings: ConsumerSettings, name: str = "consumer") -> None:
        self.name = name
        self.controllers = ControllerEndpoints(bootstrap)
        self.metadata_topics: list[str] = []
        self.settings = settings
        self.topics: dict[str, TopicMetadata] = {}
        self.fetches: dict[tuple[str, int], PartitionFetch] = {}
        self.by_correlation: dict[int, tuple[str, Any]] = {}
        self.buffered_bytes = 0
        self.fetch_turn = 0  # where the next round of fetches starts (rotates, so none starves)
        self.correlation = 0
        self.metadata_correlation = 0
        self.metadata_answered_ns = -(1 << 62)  # when the last metadata request was answered
        self.member: Any = None  # the group membership state machine, when the consumer is in a group
        self.unreachable: dict[str, int] = {}  # endpoint -> until when metadata naming it is not trusted

    def start(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = [SetTimer("tick", now_ns + 100 * MS)]
        if self.member is not None:
            effects += self.member.start(now_ns)
        return effects

    def invariants(self) -> None:
        assert self.buffered_bytes >= 0, "negative buffered bytes"
        for fetch in self.fetches.values():
            assert fetch.position >= 0 or fetch.reset is not None or fetch.position == -1

    # ------------------------------------------------------------------ dispatch

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        match message:
            case FetchResponse():
                return self._on_fetch_response(message, sender, now_ns)
            case ListOffsetsResponse():
                return self._on_list_offsets(message, sender, now_ns)
            case MetadataResponse():
                return self._on_metadata(message, now_ns)
            case ClientCommand():
                return self._on_command(message, now_ns)
            case RefreshMetadata():
                return self.request_metadata(message.topics)
            case TimerFired(name="tick"):
                return self._on_tick(now_ns)
            case ErrorResponse():
                return self._on_error_response(message, sender, now_ns)
            case PeerDisconnected():
                return self._on_disconnect(message, now_ns)
            case Stop():
                return self.member.stop(now_ns) if self.member is not None else []
        if self.member is not None:
            return self.member.handle(message, sender, now_ns)
        return []

    def _on_command(self, command: ClientCommand, now_ns: int) -> list[Effect]:
        arguments = command.arguments
        match command.command:
            case "assign":
                return self.assign([tuple(tp) for tp in arguments["partitions"]], now_ns,
                                   epoch=arguments.get("epoch", 0))
            case "seek":
                return self.seek(arguments["topic"], arguments["partition"], arguments["offset"], now_ns,
                                 arguments["epoch"])
            case "reset":
                return self.seek_reset(arguments["topic"], arguments["partition"], arguments["timestamp"], now_ns,
                                       arguments["epoch"])
            case "pause" | "resume":
                for topic, partition in arguments["partitions"]:
                    fetch = self.fetches.get((topic, partition))
                    if fetch is not None:
                        fetch.paused = command.command == "pause"
                return self._fetch_all(now_ns)
            case "consumed":
                self.buffered_bytes -= arguments["bytes"]
                return self._fetch_all(now_ns)
            case "hold":
                return self._hold(arguments["topic"], arguments["partition"], tuple(arguments["session"]))
            case "list-offsets":
                return self._list_offsets_for_user(command, now_ns)
        if self.member is not None:
            return self.member.on_command(command, now_ns)
        return [Notify("result", (command.token, None, RailmqError(ErrorCode.INVALID_REQUEST,
                                                                     f"unknown command {command.command!r}")))]

    # ------------------------------------------------------------------ assignment and positions

    def assign(self, partitions: list[tuple[str, int]], now_ns: int,
               positions: dict[tuple[str, int], int] | None = None, epoch: int = 0) -> list[Effect]:
        """Replace the assignment. Kept partitions keep their position; new ones start from
        `positions` or from `auto_offset_reset`."""
        wanted = set(partitions)
        for key in [key for key in self.fetches if key not in wanted]:
            fetch = self.fetches.pop(key)
            if fetch.correlation:
                self.by_correlation.pop(fetch.correlation, None)
        effects: list[Effect] = []
        for key in sorted(wanted):
            if key not in self.fetches:
                fetch = self.fetches[key] = PartitionFetch(*key)
                fetch.session = (epoch, 0)
                position = (positions or {}).get(key)
                if position is not None and position >= 0:
                    fetch.position = position
                    effects.append(Notify("position", (key[0], key[1], fetch.session, position)))
                else:
                    fetch.reset = self._default_reset()
        topics = sorted({topic for topic, _ in wanted if topic not in self.topics})
        return effects + (self.request_metadata(topics) if topics else []) + self._fetch_all(now_ns)

    def _default_reset(self) -> int | None:
        return {"earliest": EARLIEST, "latest": LATEST}.get(self.settings.auto_offset_reset)

    def seek(self, topic: str, partition: int, offset: int, now_ns: int, epoch: int) -> list[Effect]:
        fetch = self.fetches.get((topic, partition))
        if fetch is None:
            return [Notify("partition-error", (topic, partition, RailmqError(
                ErrorCode.INVALID_REQUEST, f"{topic}/{partition} is not assigned to this consumer")))]
        self._new_session(fetch, epoch)
        fetch.position, fetch.reset = offset, None
        return [Notify("position", (topic, partition, fetch.session, offset))] + self._fetch_all(now_ns)

    def seek_reset(self, topic: str, partition: int, timestamp: int, now_ns: int, epoch: int) -> list[Effect]:
        fetch = self.fetches.get((topic, partition))
        if fetch is None:
            return []
        self._new_session(fetch, epoch)
        fetch.position, fetch.reset = -1, timestamp
        return self._fetch_all(now_ns)

    def _hold(self, topic: str, partition: int, session: tuple[int, int]) -> list[Effect]:
        """The shell found an unreadable batch in this session's data: stop fetching until a seek."""
        fetch = self.fetches.get((topic, partition))
        if fetch is not None and tuple(fetch.session) == session:
            fetch.held = True
            if fetch.correlation:
                self.by_correlation.pop(fetch.correlation, None)
                fetch.correlation = 0
        return []

    def _new_session(self, fetch: PartitionFetch, epoch: int | None = None) -> None:
        """A seek from the shell starts session (epoch, 0); a reset decided here bumps the second part."""
        fetch.session = (epoch, 0) if epoch is not None else (fetch.session[0], fetch.session[1] + 1)
        fetch.held = False
        if epoch is not None:  # the shell moved the partition: where it goes is the user's choice
            fetch.reset_ns, fetch.resetting_out_of_range = None, False
        if fetch.correlation:
            self.by_correlation.pop(fetch.correlation, None)
            fetch.correlation = 0
        if fetch.reset_correlation:
            self.by_correlation.pop(fetch.reset_correlation, None)
            fetch.reset_correlation = 0

    # ------------------------------------------------------------------ fetching

    def _leader(self, topic: str, partition: int, now_ns: int = 0) -> tuple[str, int]:
        metadata = self.topics.get(topic)
        if metadata is None or not 0 <= partition < len(metadata.partitions):
            return "", -1
        entry = metadata.partitions[partition]
        if self.unreachable.get(entry.leader_endpoint, 0) > now_ns:
            return "", -1
        return entry.leader_endpoint, entry.leader_epoch

    def _fetch_all(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        missing: set[str] = set()
        fetches = list(self.fetches.values())
        order = [(self.fetch_turn + step) % len(fetches) for step in range(len(fetches))]
        ready = [(index, fetches[index]) for index in order if not (
            fetches[index].paused or fetches[index].held or fetches[index].correlation
            or fetches[index].reset_correlation or now_ns < fetches[index].retry_at_ns)]
        # Each partition that fetches may claim an equal part of the buffer (up to its own limit).
        active = sum(1 for fetch in fetches if not (fetch.paused or fetch.held))
        share = min(self.settings.fetch_partition_bytes_max,
                    max(FETCH_SHARE_MIN_BYTES, self.settings.buffer_bytes_max // max(1, active)))
        room = self._fetch_room()
        for index, fetch in ready:
            endpoint, epoch = self._leader(fetch.topic, fetch.partition, now_ns)
            if not endpoint:
                missing.add(fetch.topic)
                continue
            if fetch.position < 0:
                if fetch.reset is None:
                    if not fetch.reported:
                        fetch.reported = True
                        effects.append(Notify("partition-error", (fetch.topic, fetch.partition, RailmqError(
                            ErrorCode.OFFSET_OUT_OF_RANGE,
                            f"{fetch.topic}/{fetch.partition} has no committed offset and auto_offset_reset=none: "
                            "seek it to a position"))))
                    continue
                effects.append(self._send_reset(fetch, endpoint, epoch))
                continue
            asked = min(share, room)
            if asked <= 0 or (asked < min(share, FETCH_SHARE_MIN_BYTES) and room < self.settings.buffer_bytes_max):
                continue  # no room for a useful fetch while others are out or buffered: the next answer makes some
            room -= asked
            self.fetch_turn = index + 1  # the next round starts after this one: every partition gets its turn
            self.correlation += 1
            fetch.correlation, fetch.sent_ns, fetch.endpoint, fetch.asked = self.correlation, now_ns, endpoint, asked
            self.by_correlation[self.correlation] = ("fetch", fetch)
            effects.append(Send(endpoint, FetchRequest(
                correlation_id=self.correlation, topic=fetch.topic, partition=fetch.partition,
                topic_id=self._topic_id(fetch.topic),
                offset=fetch.position, max_bytes=asked,
                max_wait_ms=self.settings.fetch_max_wait_ms, min_bytes=self.settings.fetch_min_bytes,
                leader_epoch=epoch)))
        if missing and now_ns - self.metadata_answered_ns >= RETRY_BACKOFF_MS * MS:
            # Not at once after an answer that named no usable leader (the controller may not
            # know of the death yet): the tick asks again, as Kafka's retry.backoff.ms waits.
            effects += self.request_metadata(sorted(missing))
        return effects

    def _fetch_room(self) -> int:
        """Bytes the buffer can still take: what `poll` has not consumed and what the fetches in
        flight may bring both count, so the two together stay within `buffer_bytes_max` (a
        first batch larger than a fetch's share still comes whole, as Kafka's fetches do)."""
        in_flight = sum(fetch.asked for fetch in self.fetches.values() if fetch.correlation)
        return self.settings.buffer_bytes_max - self.buffered_bytes - in_flight

    def _send_reset(self, fetch: PartitionFetch, endpoint: str, epoch: int) -> Send:
        fetch.endpoint = endpoint
        self.correlation += 1
        fetch.reset_correlation = self.correlation
        self.by_correlation[self.correlation] = ("reset", fetch)
        return Send(endpoint, ListOffsetsRequest(correlation_id=self.correlation, topic=fetch.topic,
                                                 partition=fetch.partition, topic_id=self._topic_id(fetch.topic),
                                                 timestamp_ms=fetch.reset, leader_epoch=epoch))

    def _topic_id(self, topic: str) -> int:
        known = self.topics.get(topic)
        return known.topic_id if known is not None else 0

    @staticmethod
    def _misdirected(response: Any, fetch: PartitionFetch) -> bool:
        """An answer naming another partition than the one asked (a stale endpoint now serving
        something else): nothing in it is about ours."""
        return response.error == ErrorCode.NONE and (response.topic, response.partition) != (fetch.topic, fetch.partition)

    def _take_answer(self, correlation_id: int, sender: Any) -> tuple[str, Any] | None:
        """The request an answer is for, if the answer came from where that request went; an
        answer from elsewhere (a server reusing or guessing a correlation id) is not about it."""
        entry = self.by_correlation.get(correlation_id)
        if entry is None:
            return None
        kind, target = entry
        if sender != (target[3] if kind == "user" else target.endpoint):
            return None
        return self.by_correlation.pop(correlation_id)

    def _on_fetch_response(self, response: FetchResponse, sender: Any, now_ns: int) -> list[Effect]:
        entry = self._take_answer(response.correlation_id, sender)
        if entry is None:
            return []
        fetch: PartitionFetch = entry[1]
        fetch.correlation = 0
        if self._misdirected(response, fetch):
            return self._on_partition_error(fetch, ErrorCode.NOT_LEADER, "the answer names another partition", now_ns)
        if response.error == ErrorCode.NONE:
            fetch.failing = 0
            effects: list[Effect] = []
            records = response.records
            if len(records):
                taken = readable_batches(records, fetch.position, response.high_watermark, fetch.asked)
                if taken.last is not None:
                    fetch.position = taken.last.next_offset
                    self.buffered_bytes += taken.size
                    effects.append(Notify("records", (fetch.topic, fetch.partition, fetch.session,
                                                      records if taken.size == len(records) else records[:taken.size],
                                                      response.high_watermark)))
                if taken.unreadable:
                    fetch.held = True
                    effects.append(Notify("unreadable", (fetch.topic, fetch.partition, fetch.session,
                                                         fetch.position, taken.unreadable)))
                if taken.refused:
                    effects.append(Trace("fetch-answer-refused", {
                        "topic": fetch.topic, "partition": fetch.partition, "offset": fetch.position,
                        "reason": taken.refused}))
                    if taken.last is None:  # nothing in it was usable: a confused leader, not a slow one
                        return effects + self._on_partition_error(fetch, ErrorCode.NOT_LEADER, taken.refused, now_ns)
            return effects + self._fetch_all(now_ns)
        return self._on_partition_error(fetch, response.error, response.error_message, now_ns)

    def _on_partition_error(self, fetch: PartitionFetch, code: int, text: str, now_ns: int) -> list[Effect]:
        text = clipped(text)  # a leader's sentence, handed to the user
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            reset = self._default_reset()
            if reset is None:
                fetch.retry_at_ns = now_ns + 10 * RETRY_BACKOFF_MS * MS
                return [Notify("partition-error", (fetch.topic, fetch.partition, RailmqError(
                    code, f"{text}; auto_offset_reset=none, so seek somewhere valid")))]
            recent = fetch.reset_ns is not None and now_ns - fetch.reset_ns < RETRY_BACKOFF_MS * MS
            self._new_session(fetch)
            fetch.position, fetch.reset, fetch.resetting_out_of_range = -1, reset, True
            if recent:
                # The offset the last reset gave is out of range at once, again: the leader
                # contradicts itself, and asking at once would only loop.
                fetch.retry_at_ns = now_ns + RETRY_BACKOFF_MS * MS
                self._forget_leader(fetch.topic, fetch.partition)
                return self.request_metadata([fetch.topic])
            return self._fetch_all(now_ns)
        effects: list[Effect] = []
        if code in RETRIABLE or code == ErrorCode.STORAGE_ERROR:
            fetch.retry_at_ns = now_ns + RETRY_BACKOFF_MS * MS
        else:
            # No retry cures it (a request the leader calls invalid, a code this version does not
            # know): the user hears of it once per streak, and the partition is asked again slowly.
            fetch.retry_at_ns = now_ns + 10 * RETRY_BACKOFF_MS * MS
            if fetch.failing != code:
                fetch.failing = code
                effects.append(Notify("partition-error", (fetch.topic, fetch.partition, RailmqError(code, text))))
        self._forget_leader(fetch.topic, fetch.partition)
        return effects + self.request_metadata([fetch.topic])

    def _on_list_offsets(self, response: ListOffsetsResponse, sender: Any, now_ns: int) -> list[Effect]:
        entry = self._take_answer(response.correlation_id, sender)
        if entry is None:
            return []
        kind, target = entry
        if kind == "user":
            token, topic, partition, _ = target
            if response.error == ErrorCode.NONE and (response.topic, response.partition) != (topic, partition):
                response = msgspec.structs.replace(response, error=ErrorCode.NOT_LEADER,
                                                   error_message="the answer names another partition")
            elif response.error == ErrorCode.NONE and response.offset < 0:  # no log has such an offset
                response = msgspec.structs.replace(response, error=ErrorCode.NOT_LEADER,
                                                   error_message=f"the answer gives offset {response.offset}")
            if response.error != ErrorCode.NONE:
                effects: list[Effect] = [Notify("result", (token, None, RailmqError(response.error, response.error_message)))]
                if response.error in LEADERSHIP_ERRORS:  # the caller retries: let it find the current leader
                    self._forget_leader(topic, partition)
                    effects += self.request_metadata([topic])
                return effects
            return [Notify("result", (token, (response.offset, response.timestamp_ms), None))]
        fetch: PartitionFetch = target
        fetch.reset_correlation = 0
        if self._misdirected(response, fetch):
            return self._on_partition_error(fetch, ErrorCode.NOT_LEADER, "the answer names another partition", now_ns)
        if response.error != ErrorCode.NONE:
            return self._on_partition_error(fetch, response.error, response.error_message, now_ns)
        if response.offset < 0:  # no log has such an offset: ask again, later, whoever leads then
            return [Trace("list-offsets-refused", {"topic": fetch.topic, "partition": fetch.partition,
                                                   "offset": response.offset})] + self._on_partition_error(
                fetch, ErrorCode.NOT_LEADER, f"the answer gives offset {response.offset}", now_ns)
        fetch.position, fetch.reset = response.offset, None
        fetch.reset_ns = now_ns if fetch.resetting_out_of_range else None
        fetch.resetting_out_of_range = False
        return [Notify("position", (fetch.topic, fetch.partition, fetch.session, response.offset))] + self._fetch_all(now_ns)

    def _list_offsets_for_user(self, command: ClientCommand, now_ns: int) -> list[Effect]:
        arguments = command.arguments
        endpoint, epoch = self._leader(arguments["topic"], arguments["partition"])
        if not endpoint:
            effects = self.request_metadata([arguments["topic"]])
            return effects + [Notify("result", (command.token, None, RailmqError(
                ErrorCode.LEADER_NOT_AVAILABLE, f"no known leader for {arguments['topic']}/{arguments['partition']}")))]
        self.correlation += 1
        self.by_correlation[self.correlation] = ("user", (command.token, arguments["topic"], arguments["partition"],
                                                          endpoint))
        return [Send(endpoint, ListOffsetsRequest(correlation_id=self.correlation, topic=arguments["topic"],
                                                  partition=arguments["partition"],
                                                  topic_id=self._topic_id(arguments["topic"]),
                                                  timestamp_ms=arguments["timestamp"], leader_epoch=epoch))]

    @property
    def bootstrap(self) -> str:
        """Where metadata is asked for: the active controller, as far as known."""
        return self.controllers.current

    def _on_error_response(self, response: ErrorResponse, sender: Any, now_ns: int) -> list[Effect]:
        if response.correlation_id == self.metadata_correlation and self.controllers.take(response):
            self.metadata_correlation = 0  # a voter that does not lead: ask the one it named
            return self.request_metadata(self.metadata_topics) if self.controllers.follow_at_once() else []
        if response.correlation_id in self.by_correlation:
            entry = self._take_answer(response.correlation_id, sender)
            if entry is None:
                return []  # about a request that went elsewhere
        else:
            return self.member.handle(response, sender, now_ns) if self.member is not None else []
        kind, target = entry
        if kind == "user":
            return [Notify("result", (target[0], None, RailmqError(response.error, response.error_message)))]
        target.correlation = target.reset_correlation = 0
        return self._on_partition_error(target, response.error, response.error_message, now_ns)

    def _on_disconnect(self, message: PeerDisconnected, now_ns: int) -> list[Effect]:
        """A leader's process is gone: refetch from whoever leads now."""
        distrust(self.unreachable, message.endpoint, now_ns + 3000 * MS, now_ns)
        effects: list[Effect] = []
        for fetch in self.fetches.values():
            if fetch.endpoint == message.endpoint and (fetch.correlation or fetch.reset_correlation):
                self.by_correlation.pop(fetch.correlation, None)
                self.by_correlation.pop(fetch.reset_correlation, None)
                fetch.correlation = fetch.reset_correlation = 0
                fetch.retry_at_ns = now_ns + RETRY_BACKOFF_MS * MS
                self._forget_leader(fetch.topic, fetch.partition)
                effects = self.request_metadata([fetch.topic])
        if self.member is not None:
            effects += self.member.on_disconnect(message.endpoint, now_ns)
        return effects

    def _on_tick(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = [SetTimer("tick", now_ns + 100 * MS)]
        limit_ns = (self.settings.fetch_max_wait_ms + self.settings.request_timeout_ms) * MS
        for fetch in self.fetches.values():
            if fetch.correlation and now_ns - fetch.sent_ns > limit_ns:
                self.by_correlation.pop(fetch.correlation, None)
                fetch.correlation = 0
                self._forget_leader(fetch.topic, fetch.partition)
        if self.metadata_correlation:
            self.metadata_correlation = 0
            self.controllers.rotate()  # unanswered for a whole tick: that voter may be gone
        effects += self._fetch_all(now_ns)
        if self.member is not None:
            effects += self.member.tick(now_ns)
        return effects

    # ------------------------------------------------------------------ metadata

    def request_metadata(self, topics: list[str]) -> list[Effect]:
        if self.metadata_correlation:
            return []
        self.correlation += 1
        self.metadata_correlation = self.correlation
        self.metadata_topics = list(topics)
        return [Send(self.bootstrap, MetadataRequest(correlation_id=self.correlation, topics=topics or None))]

    def _on_metadata(self, response: MetadataResponse, now_ns: int) -> list[Effect]:
        self.controllers.learn(response.controller_endpoints)
        if self.metadata_correlation and response.correlation_id == self.metadata_correlation:
            self.metadata_correlation = 0
            self.metadata_answered_ns = now_ns
        checked = [checked_topic(topic) for topic in response.topics]
        in_use = {topic for topic, _ in self.fetches} | set(self.metadata_topics) | set(
            self.member.topics if self.member is not None else ())
        for topic in checked:
            if topic.error == ErrorCode.NONE:
                remember_topic(self.topics, topic, in_use)
        effects: list[Effect] = [Notify("metadata", checked)]
        if self.member is not None:
            effects += self.member.on_metadata(msgspec.structs.replace(response, topics=checked), now_ns)
        return effects + self._fetch_all(now_ns)

    def _forget_leader(self, topic: str, partition: int) -> None:
        metadata = self.topics.get(topic)
        if metadata is not None and 0 <= partition < len(metadata.partitions):
            metadata.partitions[partition].leader_endpoint = ""
