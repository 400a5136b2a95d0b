"""A share-group member's client logic (KIP-932): membership, metadata, closing, and the requests
in flight, with acquire/fetch and acknowledge in their own modules.

It runs in the I/O thread of `railmq.ShareConsumer` (transport/client_engine.py), as
actors/consumer_client.py does for a `Consumer`, and keeps to the same rules: pure, fed `now_ns`
(wall clock: lock deadlines are the coordinator's wall-clock times), bounded.

- Membership: it finds the group coordinator through metadata, joins with ShareGroupHeartbeat and
  heartbeats every `heartbeat_interval_ms` (or the coordinator's advice, if shorter). A new member
  id starts a new *membership*: everything held under the old one is void (the coordinator
  released those locks), so data still tagged with it is dropped by the shell.
- Records: per partition, acquired at the coordinator and fetched from the partition leader
  (actors/share_member_fetch.py), while the member holds fewer than `prefetch_records_max` locks
  and its buffer has room (`buffer_bytes_max`, the shell reports what `poll` used up).
- Acknowledgements from the shell go to the coordinator per partition; their per-range results go
  back as one answer (actors/share_member_acknowledgements.py). Closing leaves the group, which
  releases every record still held.

Commands (`ClientCommand`): "subscribe" {topics}; "acknowledge" {acknowledgements: [[topic,
partition, first, last, kind, delay_ms, error, delivery_count, topic_id]]} (the last two optional;
topic_id: of the topic the records were read from) with a token (0: no answer wanted);
"consumed" {bytes}; "close".
Notifications: ("membership", (membership, member_id, settings)), ("share-records", (membership,
topic, partition, batches, [[first, last, delivery_count]], lock_deadline_ms, topic_id)), ("result", (token,
value, error)), ("acknowledged", results of token-0 acknowledgements), ("fatal", error).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from actors.actor import MS
from actors.client_metadata import checked_topic, distrust
from actors.controller_endpoints import ControllerEndpoints, named_endpoint
from actors.deadlines import DeadlineTimer
from actors.effects import Effect, Notify, Send, Trace
from actors.errors import ErrorCode, RailmqError
from actors.limits import PARTITIONS_PER_TOPIC_CEILING
from actors.messages import (
    ClientCommand, ErrorResponse, FetchResponse, MetadataRequest, MetadataResponse, PeerDisconnected,
    ShareAcknowledgeResponse, ShareAcquireResponse, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse,
    ShareGroupSettings, Stop, TimerFired, TopicMetadata,
)
from actors.share_member_acknowledgements import ShareAcknowledging
from actors.share_member_fetch import RETRY_BACKOFF_MS, Reader, ShareFetching

# After a peer's connection drops, metadata naming it is not trusted for this long: the cluster
# coordinator keeps advertising a dead process's endpoint until its session runs out, and a
# request sent there would wait out the whole request timeout.
UNREACHABLE_MS = 3000
# Errors after which the member cannot go on (its settings or the group id are wrong).
FATAL = frozenset({ErrorCode.INCONSISTENT_GROUP_PROTOCOL, ErrorCode.INVALID_CONFIG, ErrorCode.INVALID_SESSION_TIMEOUT,
                   ErrorCode.INVALID_REQUEST, ErrorCode.GROUP_ID_NOT_FOUND})


class ShareMemberSettings(msgspec.Struct, frozen=True, kw_only=True):
    group_id: str
    client_id: str = "share-consumer"
    group: ShareGroupSettings = ShareGroupSettings()  # proposed; the group's own come back on join
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    acquire_max_wait_ms: int = 500
    prefetch_records_max: int = 500
    fetch_partition_bytes_max: int = 4 * 1024 * 1024
    # Fetched bytes waiting for `poll` plus what acquired records may still bring: a classic
    # consumer's bound (ConsumerSettings.buffer_bytes_max), for the same reason.
    buffer_bytes_max: int = 64 * 1024 * 1024
    request_timeout_ms: int = 30_000
    metadata_refresh_ms: int = 5_000


class Pending(NamedTuple):
    kind: str  # "metadata" | "heartbeat" | "acquire" | "fetch" | "acknowledge" | "leave"
    key: Any
    endpoint: str
    deadline_ns: int


class ShareMember(ShareFetching, ShareAcknowledging):
    def __init__(self, *, bootstrap: str, settings: ShareMemberSettings, name: str = "share-consumer") -> None:
        self.name = name
        self.controllers = ControllerEndpoints(bootstrap)
        self.settings = settings
        self.state = "unsubscribed"  # -> unjoined -> joining -> stable; closing; closed; failed
        self.subscription: list[str] = []
        self.topics: dict[str, TopicMetadata] = {}
        self.coordinator = ""
        self.member_id = ""
        self.member_secret = b""  # from the heartbeat answer that named member_id; carried in its requests
        self.membership = 0
        self.group_settings = settings.group
        self.heartbeat_interval_ms = settings.heartbeat_interval_ms
        self.last_heartbeat_ns = 0
        self.heartbeat_in_flight = 0
        self.readers: dict[tuple[str, int], Reader] = {}
        self.buffered_bytes = 0  # handed to the shell and not reported consumed by `poll` yet
        self.held: dict[tuple[str, int], dict[int, int]] = {}  # offsets locked to us -> lock deadline (ms)
        self.pending: dict[int, Pending] = {}
        self.correlation = 0
        self.metadata_correlation = 0
        self.last_metadata_ns = 0
        self.close_token = 0
        self.unreachable: dict[str, int] = {}  # endpoint -> until when metadata naming it is not trusted
        # At the next request timeout, lock expiry, heartbeat, retry or metadata refresh. Lock
        # deadlines are wanted as locks are taken or renewed; the rest after every step.
        self.timer = DeadlineTimer()

    def start(self, now_ns: int) -> list[Effect]:
        return []  # nothing is due before a subscribe

    def invariants(self) -> None:
        assert self.state != "stable" or self.member_id, "stable without a member id"
        assert self.buffered_bytes >= 0, "negative buffered bytes"
        for reader in self.readers.values():
            assert not (reader.acquiring and reader.to_fetch), "an acquire in flight before the last one was fetched"
        # Lock deadlines are wanted as locks are taken or renewed; every other deadline at the end
        # of every step (handle()).
        missed = self.timer.uncovered(self._lock_deadlines())
        assert missed is None, f"{self.name}: the timer would fire after the lock deadline at {missed} ns"

    # ------------------------------------------------------------------ dispatch

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        match message:
            case ClientCommand():
                effects = self._on_command(message, now_ns)
            case TimerFired(name="tick"):
                effects = self._on_tick(now_ns)
            case PeerDisconnected():
                effects = self._on_disconnect(message.endpoint, now_ns)
            case Stop():
                return self._leave(now_ns) if self.state not in ("closed", "failed") else []
            case MetadataResponse() | ShareGroupHeartbeatResponse() | ShareAcquireResponse() | FetchResponse() | \
                    ShareAcknowledgeResponse() | ErrorResponse():
                pending = self.pending.get(message.correlation_id)
                if pending is None or pending.endpoint != sender:
                    return []  # not an answer to anything asked there (a server reusing a correlation id)
                del self.pending[message.correlation_id]
                effects = self._on_response(pending, message, now_ns)
            case _:
                return [Trace("share-member-unexpected", {"message": type(message).__name__})]
        effects += self._pump(now_ns)
        self.timer.want_all(self._deadlines(), now_ns)
        return effects + self.timer.arm(now_ns)

    def _on_command(self, command: ClientCommand, now_ns: int) -> list[Effect]:
        arguments = command.arguments
        match command.command:
            case "subscribe":
                self.subscription = sorted(set(arguments["topics"]))
                if self.state == "unsubscribed":
                    self.state = "unjoined"
                return self._request_metadata(now_ns, force=True)
            case "acknowledge":
                return self._acknowledge(command.token, arguments["acknowledgements"], now_ns)
            case "consumed":  # the shell opened chunks of these many bytes: room for more
                self.buffered_bytes -= arguments["bytes"]
                return []
            case "close":
                return self._close(command.token, now_ns)
        return [Notify("result", (command.token, None, RailmqError(ErrorCode.INVALID_REQUEST,
                                                                     f"unknown command {command.command!r}")))]

    def _send(self, kind: str, key: Any, endpoint: str, message: Any, now_ns: int) -> Send:
        self.correlation += 1
        message = msgspec.structs.replace(message, correlation_id=self.correlation)
        deadline = now_ns + self.settings.request_timeout_ms * MS
        if kind == "acquire":
            deadline += self.settings.acquire_max_wait_ms * MS
        self.pending[self.correlation] = Pending(kind, key, endpoint, deadline)
        return Send(endpoint, message)

    def _on_response(self, pending: Pending, response: Any, now_ns: int) -> list[Effect]:
        match pending.kind:
            case "metadata":
                return self._on_metadata(response, now_ns)
            case "heartbeat" | "leave":
                return self._on_heartbeat(pending, response, now_ns)
            case "acquire":
                return self._on_acquired(pending.key, response, now_ns)
            case "fetch":
                return self._on_fetched(pending.key, response, now_ns)
            case "acknowledge":
                return self._on_acknowledged(pending.key, response, now_ns)
        raise AssertionError(f"{self.name}: a response to an unknown request kind {pending.kind!r}")

    # ------------------------------------------------------------------ metadata and membership

    def _request_metadata(self, now_ns: int, force: bool = False) -> list[Effect]:
        if self.metadata_correlation or (not force and now_ns - self.last_metadata_ns < RETRY_BACKOFF_MS * MS):
            return []
        self.last_metadata_ns = now_ns
        send = self._send("metadata", None, self.bootstrap,
                          MetadataRequest(correlation_id=0, topics=list(self.subscription)), now_ns)
        self.metadata_correlation = send.message.correlation_id
        return [send]

    @property
    def bootstrap(self) -> str:
        """Where metadata is asked for: the active controller, as far as known."""
        return self.controllers.current

    def _on_metadata(self, response: Any, now_ns: int) -> list[Effect]:
        self.metadata_correlation = 0
        if not isinstance(response, MetadataResponse):
            if self.controllers.take(response):
                # Ask the voter it named, at once unless voters keep naming each other.
                return self._request_metadata(now_ns, force=self.controllers.follow_at_once())
            if getattr(response, "error", 0) == ErrorCode.REQUEST_TIMED_OUT:
                self.controllers.rotate()
            return []
        self.controllers.learn(response.controller_endpoints)
        for topic in map(checked_topic, response.topics):
            if topic.error == ErrorCode.NONE and topic.name in self.subscription:
                self.topics[topic.name] = topic  # only the subscribed ones: the map stays bounded
        endpoint = response.group_coordinator_endpoint
        if named_endpoint(endpoint) and self._reachable(endpoint, now_ns):
            self.coordinator = endpoint
        return []

    def _reachable(self, endpoint: str, now_ns: int) -> bool:
        return self.unreachable.get(endpoint, 0) <= now_ns

    def _heartbeat(self, now_ns: int) -> list[Effect]:
        self.last_heartbeat_ns = now_ns
        request = ShareGroupHeartbeatRequest(
            correlation_id=0, group_id=self.settings.group_id, member_id=self.member_id,
            member_secret=self.member_secret, client_id=self.settings.client_id,
            topics=list(self.subscription),
            session_timeout_ms=self.settings.session_timeout_ms, settings=self.settings.group)
        send = self._send("heartbeat", None, self.coordinator, request, now_ns)
        self.heartbeat_in_flight = send.message.correlation_id
        return [send]

    def _on_heartbeat(self, pending: Pending, response: Any, now_ns: int) -> list[Effect]:
        if pending.kind == "leave":
            return self._closed(None)
        self.heartbeat_in_flight = 0
        if self.state in ("closing", "closed", "failed"):
            return []
        if response.error != ErrorCode.NONE:
            return self._on_member_error(response.error, response.error_message, now_ns)
        if not response.member_id:  # a success that names no member: nothing to be a member as
            if self.member_id:
                return self._on_member_error(ErrorCode.UNKNOWN_MEMBER_ID, "the answer names no member id", now_ns)
            self.state = "joining"  # joined again when the next heartbeat is due, not in a loop
            return [Trace("share-heartbeat-refused", {"reason": "the answer names no member id"})]
        effects: list[Effect] = []
        if response.member_id != self.member_id:
            effects += self._new_membership(response.member_id, response.settings)
        self.member_secret = response.member_secret
        self.state = "stable"
        advice = response.heartbeat_interval_ms
        if advice <= 0:  # no advice (or none that makes sense: it would heartbeat in a loop)
            advice = self.settings.heartbeat_interval_ms
        # Never more than ten times as often as configured: the coordinator's advice is a third of
        # the session, and one of 1 ms made ~1,000 heartbeats a second to the process every group
        # shares.
        configured = self.settings.heartbeat_interval_ms
        self.heartbeat_interval_ms = min(configured, max(advice, configured // 10, 1))
        self._assign([tuple(tp) for tp in response.partitions])
        return effects

    def _new_membership(self, member_id: str, settings: ShareGroupSettings) -> list[Effect]:
        """A new member id: what the old one held is gone (the coordinator released it)."""
        self.member_id, self.group_settings = member_id, settings
        self._void_membership()
        return [Notify("membership", (self.membership, member_id, settings)),
                Trace("share-member-joined", {"group": self.settings.group_id, "member": member_id})]

    def _void_membership(self) -> None:
        """Everything held under the previous member id is gone; records the shell still has from
        it carry the old membership number and are dropped there."""
        self.membership += 1
        self.held.clear()
        for reader in self.readers.values():
            self._forget_reader_work(reader)

    def _assign(self, partitions: list[tuple[str, int]]) -> None:
        subscribed = set(self.subscription)
        most = PARTITIONS_PER_TOPIC_CEILING  # no cluster's topic has a partition past it
        partitions = [(topic, partition) for topic, partition in partitions
                      if topic in subscribed and 0 <= partition < most]
        for key in [key for key in self.readers if key not in set(partitions)]:
            self._forget_reader_work(self.readers.pop(key))
            self.held.pop(key, None)
        for key in partitions:
            if key not in self.readers:
                self.readers[key] = Reader(*key)

    def _on_member_error(self, code: int, text: str, now_ns: int) -> list[Effect]:
        effects: list[Effect] = [Trace("share-member-error", {"error": code, "message": text, "state": self.state})]
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id, self.member_secret, self.state = "", b"", "unjoined"
            self._void_membership()
            return effects
        if code in FATAL:
            self.state = "failed"
            return effects + [Notify("fatal", RailmqError(code, text))]
        if code == ErrorCode.BUSY:
            return effects  # a busy group quorum (actors/group_quorum.py): the next heartbeat asks again
        self._lose_coordinator()
        return effects

    def _lose_coordinator(self) -> None:
        """Rediscover the coordinator (it may have restarted elsewhere); membership stays until
        the coordinator says otherwise."""
        self.coordinator = ""
        if self.state in ("stable", "joining"):
            self.state = "unjoined"

    # ------------------------------------------------------------------ closing

    def _close(self, token: int, now_ns: int) -> list[Effect]:
        """Leave: the coordinator releases every lock a leaving member holds (delivery counts
        kept). Releasing them one by one first would let this member's own parked acquire take
        them back, spending a delivery attempt on a member that is going away."""
        self.close_token = token
        effects = self._leave(now_ns)
        return effects if self.state == "closing" else effects + self._closed(None)

    def _leave(self, now_ns: int) -> list[Effect]:
        for reader in self.readers.values():
            self._forget_reader_work(reader)
        if not (self.member_id and self.coordinator):
            self.state = "closed"
            return []
        self.state = "closing"
        request = ShareGroupHeartbeatRequest(correlation_id=0, group_id=self.settings.group_id,
                                             member_id=self.member_id, member_secret=self.member_secret,
                                             client_id=self.settings.client_id,
                                             session_timeout_ms=self.settings.session_timeout_ms, leaving=True)
        return [self._send("leave", None, self.coordinator, request, now_ns)]

    def _closed(self, error: Any) -> list[Effect]:
        self.state, self.member_id, self.member_secret = "closed", "", b""
        token, self.close_token = self.close_token, 0
        return [Notify("result", (token, None, error))] if token else []

    # ------------------------------------------------------------------ time and failures

    def _lock_deadlines(self):
        """When each held lock expires. They can be many (up to `prefetch_records_max`), so a step
        wants theirs only as they are taken or renewed."""
        for held in self.held.values():
            if held:
                yield min(held.values()) * MS  # the first to expire stands for its partition's

    def _deadlines(self):
        """Every other time something falls due: what the timer must not fire after."""
        for pending in self.pending.values():
            yield pending.deadline_ns
        if self.state == "stable":
            yield self.last_metadata_ns + self.settings.metadata_refresh_ms * MS + 1
            for reader in self.readers.values():
                yield reader.retry_at_ns
        if self.state in ("unsubscribed", "closing", "closed", "failed"):
            return
        if not self.coordinator:
            if not self.metadata_correlation:
                yield self.last_metadata_ns + RETRY_BACKOFF_MS * MS
        elif not self.heartbeat_in_flight:
            yield self.last_heartbeat_ns + self.heartbeat_interval_ms * MS

    def _on_tick(self, now_ns: int) -> list[Effect]:
        self.timer.fired()
        effects: list[Effect] = []
        for correlation in [c for c, pending in self.pending.items() if pending.deadline_ns <= now_ns]:
            no_answer = ErrorResponse(correlation_id=correlation, error=ErrorCode.REQUEST_TIMED_OUT,
                                      error_message="no answer in time")
            effects += self._on_response(self.pending.pop(correlation), no_answer, now_ns)
        now_ms = now_ns // MS
        for held in self.held.values():
            for offset in [offset for offset, deadline in held.items() if deadline <= now_ms]:
                del held[offset]  # the lock expired: the record is someone else's to take now
        self.timer.want_all(self._lock_deadlines(), now_ns)  # handle() wants the rest once the tick's work is done
        if self.state == "stable" and now_ns - self.last_metadata_ns > self.settings.metadata_refresh_ms * MS:
            effects += self._request_metadata(now_ns)
        return effects

    def _on_disconnect(self, endpoint: str, now_ns: int) -> list[Effect]:
        """A peer's process is gone: answers to what we sent it will never come."""
        distrust(self.unreachable, endpoint, now_ns + UNREACHABLE_MS * MS, now_ns)
        effects: list[Effect] = []
        for correlation in [c for c, pending in self.pending.items() if pending.endpoint == endpoint]:
            effects += self._on_response(self.pending.pop(correlation), ErrorResponse(
                correlation_id=correlation, error=ErrorCode.NOT_COORDINATOR if endpoint == self.coordinator
                else ErrorCode.NOT_LEADER, error_message=f"{endpoint} disconnected"), now_ns)
        return effects
