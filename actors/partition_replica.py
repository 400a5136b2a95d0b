"""One replica of one partition: leader or follower of its log, in its own process.

The replica learns its role from the coordinator (heartbeat responses and pushes carrying a
`PartitionState`); the state with the higher (leader epoch, partition epoch) wins, older ones are
ignored. Roles:

    unknown --state--> leader | follower      (after start, before the coordinator answers)
    leader  --state with a newer epoch naming another node--> follower
    follower --state naming this node--> leader
    any     --deleted / not a replica any more--> stopped

Leader behaviour is in `replica_leader.py`, follower behaviour in `replica_follower.py`; this
module owns what both share: the log, the high watermark, heartbeats, parked (long-poll)
fetches, retention and flushing, and the dispatch. Consumers only ever see offsets below the
high watermark. Storage errors that leave the disk state unknown (a failed fsync) end in a
`Crash` effect: the process dies and restarts from what is on disk, never retries the fsync.
"""

from __future__ import annotations

from typing import Any

from actors.actor import MS
from actors.effects import AfterFlush, Crash, Effect, Exit, Send, SetTimer, Trace
from actors.errors import ErrorCode
from actors.limits import DEFAULT_LIMITS, Limits
from actors.messages import (
    AlterIsrResponse, EpochEndOffset, ErrorResponse, FetchRequest, FetchResponse, ListOffsetsRequest,
    ListOffsetsResponse, PartitionState, PeerDisconnected, ProduceRequest, ProduceResponse, ReplicaHeartbeat,
    ReplicaHeartbeatResponse, Stop, TimerFired, TopicConfig,
)
from actors.producer_state import ProducerStateTable
from actors.replica_follower import FollowerRole
from actors.replica_leader import LeaderRole
from storage.errors import CorruptLog, FsyncFailed, OffsetOutOfRange, StorageError

RETENTION_CHECK_INTERVAL_MS = 5000  # retention deletes whole segments: no need to look often
LATEST, EARLIEST = -1, -2


class ParkedFetch:
    __slots__ = ("sender", "request", "deadline_ns")

    def __init__(self, sender: Any, request: FetchRequest, deadline_ns: int) -> None:
        self.sender = sender
        self.request = request
        self.deadline_ns = deadline_ns


class PartitionReplica:
    def __init__(self, *, topic: str, topic_id: int, partition: int, node: int, endpoint: str,
                 coordinator: str, log: Any, config: TopicConfig, incarnation: int, pid: int = 0,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self.name = f"replica/{topic}/{partition}/n{node}"
        self.topic, self.topic_id, self.partition, self.node = topic, topic_id, partition, node
        self.endpoint, self.coordinator = endpoint, coordinator
        self.log = log
        self.config = config
        self.incarnation, self.pid = incarnation, pid
        self.limits = limits
        self.role = "unknown"
        self.state: PartitionState | None = None
        self.leader: LeaderRole | None = None
        self.follower: FollowerRole | None = None
        self.high_watermark = 0
        self.correlation = 0
        self.parked: list[ParkedFetch] = []
        self.producers = ProducerStateTable()
        self.counters_appended = 0
        self._rebuild_producer_state()

    def _rebuild_producer_state(self) -> None:
        for header in self.log.iter_headers(self.log.log_start_offset):
            self.producers.record(header.producer_id, header.producer_epoch, header.base_sequence,
                                  header.record_count, header.base_offset)

    # ------------------------------------------------------------------ lifecycle

    def start(self, now_ns: int) -> list[Effect]:
        return [
            *self._heartbeat(now_ns),
            SetTimer("retention", now_ns + RETENTION_CHECK_INTERVAL_MS * MS),
            Trace("replica-started", {"topic": self.topic, "partition": self.partition, "node": self.node,
                                      "log_end_offset": self.log.log_end_offset,
                                      "recovery": str(getattr(self.log, "recovery", ""))}),
        ]

    def invariants(self) -> None:
        assert 0 <= self.high_watermark <= self.log.log_end_offset or self.log.log_end_offset == 0, (
            f"{self.name}: high watermark {self.high_watermark} outside [0, {self.log.log_end_offset}]")
        assert (self.role == "leader") == (self.leader is not None), f"{self.name}: role {self.role} without its state"
        assert (self.role == "follower") == (self.follower is not None), f"{self.name}: role {self.role} without its state"
        if self.leader is not None:
            self.leader.invariants()
        assert len(self.parked) <= self.limits.purgatory_fetch_max

    # ------------------------------------------------------------------ dispatch

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        if self.role == "stopped" and not isinstance(message, Stop):
            return self._refuse(message, sender, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "this replica has stopped")
        match message:
            case ProduceRequest():
                return self._on_produce(message, sender, now_ns)
            case FetchRequest():
                return self._on_fetch(message, sender, now_ns)
            case FetchResponse():
                return self.follower.on_fetch_response(message, now_ns) if self.follower else []
            case ListOffsetsRequest():
                return [Send(sender, self._list_offsets(message))]
            case ReplicaHeartbeatResponse():
                return self._on_heartbeat_response(message, now_ns)
            case AlterIsrResponse():
                return self._on_alter_isr_response(message, now_ns)
            case TimerFired():
                return self._on_timer(message.name, now_ns)
            case ErrorResponse():
                return [Trace("peer-error", {"error": message.error, "message": message.error_message})]
            case PeerDisconnected():
                if self.follower is not None and message.endpoint == self.follower.leader_endpoint:
                    return self.follower.retry_later(now_ns)
                return []
            case Stop():
                return self._on_stop()
            case _:
                return self._refuse(message, sender, ErrorCode.UNKNOWN_MESSAGE,
                                    f"a partition replica does not handle {type(message).__name__}")

    def _refuse(self, message: Any, sender: Any, code: ErrorCode, text: str) -> list[Effect]:
        if isinstance(sender, bytes) and hasattr(message, "correlation_id"):
            return [Send(sender, ErrorResponse(correlation_id=message.correlation_id, error=code, error_message=text))]
        return []

    def _on_timer(self, name: str, now_ns: int) -> list[Effect]:
        match name:
            case "heartbeat":
                return self._heartbeat(now_ns)
            case "isr-check":
                if self.leader is None:
                    return []
                return self.leader.check_isr(now_ns) + [SetTimer("isr-check", now_ns + self.limits.isr_check_interval_ms * MS)]
            case "produce-expiry":
                return self.leader.expire_produces(now_ns) if self.leader else []
            case "fetch-expiry":
                return self._expire_parked(now_ns)
            case "follower-fetch-timeout":
                return self.follower.on_timeout(now_ns) if self.follower else []
            case "follower-retry":
                return self.follower.on_retry(now_ns) if self.follower else []
            case "flush":
                return self._on_flush_timer(now_ns)
            case "retention":
                return self._on_retention(now_ns)
        raise AssertionError(f"{self.name}: unknown timer {name!r}")

    # ------------------------------------------------------------------ coordinator

    def _heartbeat(self, now_ns: int) -> list[Effect]:
        state = self.state
        beat = ReplicaHeartbeat(
            topic=self.topic, topic_id=self.topic_id, partition=self.partition, node=self.node,
            endpoint=self.endpoint, pid=self.pid, incarnation=self.incarnation,
            leader_epoch=state.leader_epoch if state else -1, partition_epoch=state.partition_epoch if state else -1,
            log_start_offset=self.log.log_start_offset, log_end_offset=self.log.log_end_offset,
            high_watermark=self.high_watermark)
        return [Send(self.coordinator, beat),
                SetTimer("heartbeat", now_ns + self.limits.replica_heartbeat_interval_ms * MS)]

    def _on_heartbeat_response(self, response: ReplicaHeartbeatResponse, now_ns: int) -> list[Effect]:
        if response.deleted:
            return self._stop_for_good("the topic was deleted or this replica was removed")
        if response.state is None:
            return []
        return self.apply_state(response.state, now_ns)

    def apply_state(self, state: PartitionState, now_ns: int) -> list[Effect]:
        current = self.state
        if current is not None and (state.leader_epoch, state.partition_epoch) < (current.leader_epoch, current.partition_epoch):
            return []  # older news
        if self.node not in state.replicas:
            return self._stop_for_good("this node no longer holds a replica of the partition")
        self.state = state
        self.config = state.config
        new_epoch = current is None or state.leader_epoch != current.leader_epoch
        if state.leader == self.node:
            if self.role != "leader" or new_epoch:
                return self._become_leader(now_ns)
            return self._leader_isr_updated(now_ns)
        if self.role != "follower" or new_epoch:
            return self._become_follower(now_ns)
        if state.leader_endpoint and state.leader_endpoint != self.follower.leader_endpoint:
            return self.follower.leader_moved(state.leader_endpoint, now_ns)
        return []  # an empty endpoint only means the coordinator has not heard from the leader yet

    def _become_leader(self, now_ns: int) -> list[Effect]:
        effects = self._leave_role(ErrorCode.NOT_LEADER, "leadership moved")
        self.log.assign_epoch(self.state.leader_epoch, self.log.log_end_offset)
        self.role = "leader"
        self.leader = LeaderRole(self, now_ns)
        effects.append(Trace("became-leader", {"topic": self.topic, "partition": self.partition, "node": self.node,
                                               "leader_epoch": self.state.leader_epoch,
                                               "log_end_offset": self.log.log_end_offset,
                                               "high_watermark": self.high_watermark}))
        effects += self.leader.after_log_growth(now_ns)
        return effects + [SetTimer("isr-check", now_ns + self.limits.isr_check_interval_ms * MS),
                          *self._flush_timer(now_ns)]

    def _leader_isr_updated(self, now_ns: int) -> list[Effect]:
        self.leader.pending_isr = None
        return self.leader.after_log_growth(now_ns) + self.leader.complete_purgatory()

    def _become_follower(self, now_ns: int) -> list[Effect]:
        effects = self._leave_role(ErrorCode.NOT_LEADER, "this replica is no longer the leader")
        self.role = "follower"
        self.follower = FollowerRole(self)
        effects.append(Trace("became-follower", {"topic": self.topic, "partition": self.partition, "node": self.node,
                                                 "leader": self.state.leader, "leader_epoch": self.state.leader_epoch}))
        return effects + self.follower.begin(now_ns) + self._flush_timer(now_ns)

    def _leave_role(self, code: ErrorCode, text: str) -> list[Effect]:
        effects: list[Effect] = []
        if self.leader is not None:
            effects += self.leader.abandon(code, text)
            self.leader = None
        self.follower = None
        effects += self._answer_parked(lambda parked: self._fetch_error(parked.request, code, text))
        self.role = "unknown"
        return effects

    def _stop_for_good(self, reason: str) -> list[Effect]:
        effects = self._leave_role(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, reason)
        self.role = "stopped"
        return effects + [Trace("replica-stopped", {"reason": reason}), Exit(reason)]

    def _on_alter_isr_response(self, response: AlterIsrResponse, now_ns: int) -> list[Effect]:
        if self.leader is None or not self.leader.isr_answered(response.correlation_id):
            return []
        if response.state is not None:
            return self.apply_state(response.state, now_ns)
        return []

    # ------------------------------------------------------------------ produce

    def _on_produce(self, request: ProduceRequest, sender: Any, now_ns: int) -> list[Effect]:
        if self.leader is None:
            return self.produce_error(request, sender, ErrorCode.NOT_LEADER, self._not_leader_text())
        return self.leader.on_produce(request, sender, now_ns)

    def produce_error(self, request: ProduceRequest, sender: Any, code: ErrorCode, text: str) -> list[Effect]:
        if request.acks == 0:
            return [Trace("produce-refused", {"error": code.name, "message": text})]
        return [Send(sender, ProduceResponse(correlation_id=request.correlation_id, topic=self.topic,
                                             partition=self.partition, error=code, error_message=text))]

    def durable_reply(self, sender: Any, response: Any) -> list[Effect]:
        """Replies that promise the data is written wait for the flush when the topic asks for it."""
        if self.config.flush_policy == "every_batch":
            return [AfterFlush(self.log, (Send(sender, response),))]
        return [Send(sender, response)]

    def storage_failure(self, error: StorageError) -> list[Effect]:
        return [Trace("storage-failure", {"error": repr(error)}), Crash(f"storage failure: {error}")]

    def _not_leader_text(self) -> str:
        if self.state is None:
            return f"node {self.node} does not know the leader of {self.topic}/{self.partition} yet"
        return f"node {self.node} is not the leader of {self.topic}/{self.partition}; node {self.state.leader} is"

    # ------------------------------------------------------------------ fetch

    def _on_fetch(self, request: FetchRequest, sender: Any, now_ns: int) -> list[Effect]:
        problem = self._check_fetch(request, now_ns)
        if problem is not None:
            return [Send(sender, problem)]
        effects: list[Effect] = []
        if request.replica >= 0:
            diverging = self._diverging(request)
            if diverging is not None:
                return [Send(sender, self._fetch_response(request, diverging=diverging))]
            self.leader.on_follower_fetch(request, now_ns)
            effects = self.leader.after_log_growth(now_ns)
        if self._has_data(request) or request.max_wait_ms <= 0:
            return effects + [Send(sender, self._read(request))]
        if len(self.parked) >= self.limits.purgatory_fetch_max:
            return effects + [Send(sender, self._fetch_error(request, ErrorCode.BUSY, "too many waiting fetches"))]
        wait_ms = min(request.max_wait_ms, self.limits.fetch_wait_max_ms)
        self.parked.append(ParkedFetch(sender, request, now_ns + wait_ms * MS))
        return effects + [SetTimer("fetch-expiry", min(parked.deadline_ns for parked in self.parked))]

    def _check_fetch(self, request: FetchRequest, now_ns: int) -> FetchResponse | None:
        if self.leader is None:
            return self._fetch_error(request, ErrorCode.NOT_LEADER, self._not_leader_text())
        epoch = self.leader.epoch
        if request.leader_epoch >= 0 and request.leader_epoch < epoch:
            return self._fetch_error(request, ErrorCode.FENCED_LEADER_EPOCH,
                                     f"epoch {request.leader_epoch} is older than the leader's {epoch}")
        if request.leader_epoch > epoch:
            return self._fetch_error(request, ErrorCode.UNKNOWN_LEADER_EPOCH,
                                     f"epoch {request.leader_epoch} is newer than this leader's {epoch}")
        if request.max_bytes <= 0 or request.max_wait_ms < 0 or request.min_bytes < 0:
            return self._fetch_error(request, ErrorCode.INVALID_REQUEST,
                                     "max_bytes must be positive, max_wait_ms and min_bytes not negative")
        if request.replica >= 0:
            if request.replica not in self.state.replicas or request.replica == self.node:
                return self._fetch_error(request, ErrorCode.INVALID_REQUEST,
                                         f"node {request.replica} is not a follower of this partition")
            if request.offset < self.log.log_start_offset and request.last_fetched_epoch < 0:
                return self._out_of_range(request)
            return None
        if not self.log.log_start_offset <= request.offset <= self.log.log_end_offset:
            return self._out_of_range(request)
        return None

    def _diverging(self, request: FetchRequest) -> EpochEndOffset | None:
        """KIP-595-style divergence check for a follower fetch (truncation by epoch)."""
        if request.last_fetched_epoch < 0:
            if request.offset > self.log.log_end_offset:
                return EpochEndOffset(epoch=-1, end_offset=self.log.log_start_offset)
            return None
        epoch, end_offset = self.log.end_offset_for_epoch(request.last_fetched_epoch)
        if epoch != request.last_fetched_epoch or end_offset < request.offset:
            return EpochEndOffset(epoch=epoch, end_offset=end_offset)
        return None

    def _has_data(self, request: FetchRequest) -> bool:
        """Enough to answer now: any data, or with `min_bytes` above 1 that many bytes of whole
        batches (Kafka's fetch.min.bytes: fewer, larger answers for a consumer that can wait)."""
        end = self.log.log_end_offset if request.replica >= 0 else self.high_watermark
        if end <= request.offset:
            return False
        return request.min_bytes <= 1 or self._bytes_ready(request.offset, end, request.min_bytes) >= request.min_bytes

    def _bytes_ready(self, offset: int, end: int, enough: int) -> int:
        """Bytes of the whole batches from the one holding `offset` up to `end`, counted to `enough`."""
        total = 0
        try:
            for header in self.log.iter_headers(offset):
                if header.base_offset >= end:
                    break
                total += header.size
                if total >= enough:
                    break
        except (OffsetOutOfRange, CorruptLog):
            return enough  # answer now: the read reports the problem
        return total

    def _read(self, request: FetchRequest) -> FetchResponse:
        bound = None if request.replica >= 0 else self.high_watermark
        max_bytes = min(request.max_bytes, self.limits.fetch_bytes_max)
        try:
            records = self.log.read(request.offset, max_bytes, max_offset=bound)
        except OffsetOutOfRange:
            return self._out_of_range(request)
        except CorruptLog as error:
            return self._fetch_error(request, ErrorCode.STORAGE_ERROR, f"refusing corrupt range: {error}")
        return self._fetch_response(request, records=records)

    def _fetch_response(self, request: FetchRequest, *, records: Any = b"",
                        diverging: EpochEndOffset | None = None) -> FetchResponse:
        return FetchResponse(
            correlation_id=request.correlation_id, topic=self.topic, partition=self.partition,
            high_watermark=self.high_watermark, log_start_offset=self.log.log_start_offset,
            log_end_offset=self.log.log_end_offset, leader_epoch=self.leader.epoch if self.leader else -1,
            diverging_epoch=diverging, records=records)

    def _fetch_error(self, request: FetchRequest, code: ErrorCode, text: str) -> FetchResponse:
        return FetchResponse(
            correlation_id=request.correlation_id, topic=self.topic, partition=self.partition, error=code,
            error_message=text, high_watermark=self.high_watermark, log_start_offset=self.log.log_start_offset,
            log_end_offset=self.log.log_end_offset)

    def _out_of_range(self, request: FetchRequest) -> FetchResponse:
        return self._fetch_error(request, ErrorCode.OFFSET_OUT_OF_RANGE, (
            f"offset {request.offset} is outside [{self.log.log_start_offset}, {self.log.log_end_offset}]"))

    def wake_parked_fetches(self, now_ns: int) -> list[Effect]:
        if not self.parked:
            return []
        return self._answer_parked(lambda parked: self._read(parked.request) if self._has_data(parked.request) else None)

    def _expire_parked(self, now_ns: int) -> list[Effect]:
        effects = self._answer_parked(
            lambda parked: self._read(parked.request) if parked.deadline_ns <= now_ns else None)
        if self.parked:
            effects.append(SetTimer("fetch-expiry", min(parked.deadline_ns for parked in self.parked)))
        return effects

    def _answer_parked(self, answer: Any) -> list[Effect]:
        effects: list[Effect] = []
        waiting: list[ParkedFetch] = []
        for parked in self.parked:
            response = answer(parked)
            if response is None:
                waiting.append(parked)
            else:
                effects.append(Send(parked.sender, response))
        self.parked = waiting
        return effects

    # ------------------------------------------------------------------ offsets

    def _list_offsets(self, request: ListOffsetsRequest) -> ListOffsetsResponse:
        base = dict(correlation_id=request.correlation_id, log_start_offset=self.log.log_start_offset,
                    high_watermark=self.high_watermark, log_end_offset=self.log.log_end_offset)
        if self.leader is None:
            return ListOffsetsResponse(**base, error=ErrorCode.NOT_LEADER, error_message=self._not_leader_text())
        epoch = self.leader.epoch
        if 0 <= request.leader_epoch < epoch:  # the caller's metadata is older than this leader (KIP-320)
            return ListOffsetsResponse(**base, error=ErrorCode.FENCED_LEADER_EPOCH,
                                       error_message=f"epoch {request.leader_epoch} is older than the leader's {epoch}")
        if request.leader_epoch > epoch:  # this replica has not heard of the caller's leader yet
            return ListOffsetsResponse(**base, error=ErrorCode.UNKNOWN_LEADER_EPOCH,
                                       error_message=f"epoch {request.leader_epoch} is newer than this leader's {epoch}")
        if request.timestamp_ms == EARLIEST:
            offset = self.log.log_start_offset
        elif request.timestamp_ms == LATEST:
            offset = self.high_watermark
        elif request.timestamp_ms < 0:
            return ListOffsetsResponse(**base, error=ErrorCode.INVALID_REQUEST,
                                       error_message=f"timestamp {request.timestamp_ms} is not -1, -2 or a time")
        else:
            found = self.log.offset_for_timestamp(request.timestamp_ms)
            offset = self.high_watermark if found is None else min(found, self.high_watermark)
        timestamp = self.log.batch_timestamp(offset) if offset < self.high_watermark else None
        return ListOffsetsResponse(**base, offset=offset, leader_epoch=self.leader.epoch,
                                   timestamp_ms=-1 if timestamp is None else timestamp)

    # ------------------------------------------------------------------ housekeeping

    def _flush_timer(self, now_ns: int) -> list[Effect]:
        if self.config.flush_policy != "interval":
            return []
        return [SetTimer("flush", now_ns + self.config.flush_interval_ms * MS)]

    def _on_flush_timer(self, now_ns: int) -> list[Effect]:
        try:
            self.log.flush()
        except FsyncFailed as error:
            return self.storage_failure(error)
        return self._flush_timer(now_ns)

    def _on_retention(self, now_ns: int) -> list[Effect]:
        deleted = self.log.apply_retention(now_ns // MS)
        effects: list[Effect] = [SetTimer("retention", now_ns + RETENTION_CHECK_INTERVAL_MS * MS)]
        if deleted:
            effects.append(Trace("retention", {"topic": self.topic, "partition": self.partition,
                                               "segments_deleted": deleted, "log_start_offset": self.log.log_start_offset}))
        return effects

    def _on_stop(self) -> list[Effect]:
        effects = self._leave_role(ErrorCode.NOT_LEADER, "the replica is shutting down")
        self.role = "stopped"
        self.log.close()
        return effects
