"""The consumer's fetch logic: keep one long-poll fetch in flight per assigned partition.

The user-facing `railmq.Consumer` owns the *consumed* position of each partition (what `poll`
has returned). This actor owns the *fetch* position (how far it has asked the leader) and the
buffer in between, which is bounded in bytes: the records waiting for `poll` and what the
fetches in flight may bring (each asks for `max_bytes`) together stay within
`buffer_bytes_max` (the fetch loop, actors/consumer_client_fetch_loop.py, keeps that bound and
shares the buffer fairly between the partitions).

Each partition has a `session` number that every seek bumps; fetched data carries it, so data
fetched before a seek is dropped by the shell instead of being returned. Positions that are not
known yet (a new assignment, `seek_to_beginning`, an out-of-range offset with an
`auto_offset_reset` policy) are resolved with ListOffsets at the leader.

Commands from the shell arrive as `ClientCommand`; results go back as `Notify` effects:
("records", (topic, partition, session, batches, high_watermark, topic_id)), ("position", (topic,
partition, session, offset)), ("result", (token, value, error)), ("partition-error",
(topic, partition, error)), ("metadata", topics), ("unreadable", (topic, partition, session,
offset, reason)).

A fetched batch that cannot be read holds its partition (no more fetches) until the shell starts
a new session with a seek (actors/consumer_client_answers.py reads the leaders' answers). The
shell checks CRCs and records itself and holds a partition the same way, with the "hold"
command, so a bad batch is never fetched again and again, nor silently stepped over.
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.actor import MS
from actors.client_metadata import checked_topic, distrust, remember_topic
from actors.consumer_client_answers import LeaderAnswers
from actors.consumer_client_fetch_loop import RETRY_BACKOFF_MS, FetchLoop
from actors.controller_endpoints import ControllerEndpoints
from actors.deadlines import DeadlineTimer
from actors.effects import Effect, Notify, Send
from actors.errors import ErrorCode, RailmqError
from actors.messages import (
    ClientCommand, ErrorResponse, FetchResponse, ListOffsetsResponse, MetadataRequest, MetadataResponse,
    PeerDisconnected, RefreshMetadata, Stop, TimerFired, TopicMetadata,
)

EARLIEST, LATEST = -2, -1
METADATA_PATIENCE_MS = 100  # a metadata request unanswered this long: its voter may be gone, ask the next


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
                 "resetting_out_of_range", "failing", "epoch_floor", "floor_correlation", "topic_id")

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
        # The leader epoch the committed position was read under (KIP-320; -1: none): no fetch
        # goes out with metadata older than it (a deposed leader may lack the records before the
        # position), unless a metadata answer asked after it was known (after request
        # `floor_correlation`) still names an older epoch: the topic was made again.
        self.epoch_floor = -1
        self.floor_correlation = 0
        # The id of the topic the position belongs to (0: not known yet; the first fetch or
        # reset sent adopts the metadata's). A topic deleted and made again under the same name
        # has another id: the position means nothing there (consumer_client_fetch_loop.py).
        self.topic_id = 0


class ConsumerClient(FetchLoop, LeaderAnswers):
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
        self.metadata_watched = (0, 0)  # (the metadata request in flight, when it was first seen in flight)
        self.leaders_missing = False  # the last fetch round found a partition without a usable leader
        self.metadata_answered_ns = -(1 << 62)  # when the last metadata request was answered
        self.metadata_answered_correlation = 0  # and which request that was
        self.member: Any = None  # the group membership state machine, when the consumer is in a group
        self.unreachable: dict[str, int] = {}  # endpoint -> until when metadata naming it is not trusted
        self.timer = DeadlineTimer()  # at the next fetch timeout, retry, metadata patience or member deadline

    def start(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = self.member.start(now_ns) if self.member is not None else []
        return effects + self._arm(now_ns)

    def invariants(self) -> None:
        assert self.buffered_bytes >= 0, "negative buffered bytes"
        for fetch in self.fetches.values():
            assert fetch.position >= 0 or fetch.reset is not None or fetch.position == -1
        # (The timer needs no check here: every step ends by wanting every deadline, `_arm`.)

    # ------------------------------------------------------------------ dispatch

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        return self._handle(message, sender, now_ns) + self._arm(now_ns)

    def _arm(self, now_ns: int) -> list[Effect]:
        """End of every step: the timer at the next deadline (an idle consumer sets none)."""
        if self.metadata_correlation and self.metadata_correlation != self.metadata_watched[0]:
            self.metadata_watched = (self.metadata_correlation, now_ns)
        self.timer.want_all(self._deadlines(), now_ns)
        return self.timer.arm(now_ns)

    def _deadlines(self):
        """Every time something falls due: what the timer must not fire after. O(partitions), as
        every round of fetches is."""
        limit_ns = (self.settings.fetch_max_wait_ms + self.settings.request_timeout_ms) * MS
        for fetch in self.fetches.values():
            if fetch.correlation:
                yield fetch.sent_ns + limit_ns + 1
            elif not (fetch.paused or fetch.held or fetch.reset_correlation):
                yield fetch.retry_at_ns
        if self.metadata_correlation:
            yield self.metadata_watched[1] + METADATA_PATIENCE_MS * MS
        elif self.leaders_missing:
            yield self.metadata_answered_ns + RETRY_BACKOFF_MS * MS
        if self.member is not None:
            yield from self.member.deadlines()

    def _handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
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
               positions: dict[tuple[str, int], int] | None = None, epoch: int = 0,
               leader_epochs: dict[tuple[str, int], int] | None = None,
               topic_ids: dict[tuple[str, int], int] | None = None,
               resets: dict[tuple[str, int], int] | None = None) -> list[Effect]:
        """Replace the assignment. Kept partitions keep their position; new ones start from
        `positions` (read under `leader_epochs` from the topics of `topic_ids`, when known), or
        from `resets` (EARLIEST or LATEST), or from `auto_offset_reset`."""
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
                    fetch.epoch_floor = (leader_epochs or {}).get(key, -1)
                    fetch.topic_id = (topic_ids or {}).get(key, 0)
                    fetch.floor_correlation = self.correlation
                    effects.append(Notify("position", (key[0], key[1], fetch.session, position)))
                else:
                    fetch.reset = (resets or {}).get(key, self._default_reset())
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
        fetch.position, fetch.reset, fetch.topic_id = offset, None, 0
        return [Notify("position", (topic, partition, fetch.session, offset))] + self._fetch_all(now_ns)

    def seek_reset(self, topic: str, partition: int, timestamp: int, now_ns: int, epoch: int) -> list[Effect]:
        fetch = self.fetches.get((topic, partition))
        if fetch is None:
            return []
        self._new_session(fetch, epoch)
        fetch.position, fetch.reset, fetch.topic_id = -1, timestamp, 0
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

    # ------------------------------------------------------------------ errors, disconnects, the tick

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
        self.timer.fired()
        effects: list[Effect] = []
        limit_ns = (self.settings.fetch_max_wait_ms + self.settings.request_timeout_ms) * MS
        for fetch in self.fetches.values():
            if fetch.correlation and now_ns - fetch.sent_ns > limit_ns:
                self.by_correlation.pop(fetch.correlation, None)
                fetch.correlation = 0
                self._forget_leader(fetch.topic, fetch.partition)
        if self.metadata_correlation and now_ns - self.metadata_watched[1] >= METADATA_PATIENCE_MS * MS:
            self.metadata_correlation = 0
            self.controllers.rotate()  # unanswered for so long: that voter may be gone
        effects += self._fetch_all(now_ns)
        if self.member is not None:
            effects += self.member.tick(now_ns)
        return effects

    # ------------------------------------------------------------------ metadata and leaders

    @property
    def bootstrap(self) -> str:
        """Where metadata is asked for: the active controller, as far as known."""
        return self.controllers.current

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
            self.metadata_answered_correlation = response.correlation_id
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

    def _leader(self, topic: str, partition: int, now_ns: int = 0) -> tuple[str, int]:
        metadata = self.topics.get(topic)
        if metadata is None or not 0 <= partition < len(metadata.partitions):
            return "", -1
        entry = metadata.partitions[partition]
        if self.unreachable.get(entry.leader_endpoint, 0) > now_ns:
            return "", -1
        return entry.leader_endpoint, entry.leader_epoch

    def known_leader_epoch(self, topic: str, partition: int) -> int:
        """The newest leader epoch known for a partition (-1: none): what a commit of its offset
        carries — the metadata's, or the committed one its position started from, if newer (a
        commit made before the metadata caught up must not lower the group's)."""
        fetch = self.fetches.get((topic, partition))
        floor = fetch.epoch_floor if fetch is not None else -1
        metadata = self.topics.get(topic)
        if metadata is None or not 0 <= partition < len(metadata.partitions):
            return floor
        return max(floor, metadata.partitions[partition].leader_epoch)

    def position_topic_id(self, topic: str, partition: int) -> int:
        """The id of the topic a partition's position was read from, for a commit of it (0:
        unknown): the metadata's when no fetch has adopted one yet."""
        fetch = self.fetches.get((topic, partition))
        return fetch.topic_id if fetch is not None and fetch.topic_id else self._topic_id(topic)

    def _topic_id(self, topic: str) -> int:
        known = self.topics.get(topic)
        return known.topic_id if known is not None else 0

    def _forget_leader(self, topic: str, partition: int) -> None:
        metadata = self.topics.get(topic)
        if metadata is not None and 0 <= partition < len(metadata.partitions):
            metadata.partitions[partition].leader_endpoint = ""
