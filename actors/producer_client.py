"""The producer's logic: sealed batches in, produce requests out, acknowledgements back.

The user-facing `railmq.Producer` accumulates records into per-partition batches (in the
caller's thread) and hands each sealed batch to this actor as `SendBatch`. The actor encodes the
batch once (storage/batch.py), sends it to the partition's leader, keeps at most
`max_in_flight` requests per partition, and reports each batch's fate with a `Notify` effect:
("batch-done", (batch_id, partition, base_offset, error or None)).

Retries: a retriable error (NOT_LEADER, a timeout, NOT_ENOUGH_REPLICAS, ...) refreshes metadata
and re-sends after `retry_backoff_ms`, until the batch's delivery deadline. Without idempotence a
retry after a timeout can write the batch twice — the original may have been appended before the
answer was lost — and with several requests in flight a retried batch can land after a later one.
With `idempotent=True` the actor asks the coordinator for a producer id, numbers each
partition's batches, and the leader drops duplicates (actors/producer_state.py); re-sends then
go out in sequence order, so order per partition holds across retries.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any

import msgspec

from actors.actor import MS
from actors.client_metadata import clipped, distrust
from actors.controller_endpoints import ControllerEndpoints
from actors.deadlines import DeadlineTimer
from actors.effects import Effect, Notify, Send
from actors.errors import RETRIABLE, ErrorCode, RailmqError
from actors.limits import DEFAULT_LIMITS, Limits
from actors.messages import (
    ErrorResponse, InitProducerIdRequest, InitProducerIdResponse, MetadataResponse,
    PeerDisconnected, ProduceRequest, ProduceResponse, RefreshMetadata, SendBatch, Stop, TimerFired, TopicMetadata,
)
from actors.producer_metadata import ProducerMetadata
from actors.producer_sequences import PartitionSequences, Pending
from storage.batch import encode_batch, renumber_into


CHASE_INTERVAL_MS = 50  # how often metadata or a producer id still wanted is asked for again
UNREACHABLE_MS = 3000  # a dead leader's endpoint is distrusted this long (ports are not reused sooner)


class ProducerSettings(msgspec.Struct, frozen=True, kw_only=True):
    acks: int = 1
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    max_in_flight: int = 5
    idempotent: bool = False
    metadata_max_age_ms: int = 5 * 60_000


class ProducerClient(ProducerMetadata):
    def __init__(self, *, bootstrap: str, settings: ProducerSettings, name: str = "producer",
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self.name = name
        self.controllers = ControllerEndpoints(bootstrap)
        self.settings = settings
        self.limits = limits
        self.topics: dict[str, TopicMetadata] = {}
        self.waiting: dict[tuple[str, int], deque[Pending]] = {}
        self.in_flight: dict[int, Pending] = {}
        self.in_flight_count: dict[tuple[str, int], int] = {}
        self.sent_to: dict[int, str] = {}  # correlation id -> endpoint
        self.unreachable: dict[str, int] = {}  # endpoint -> until when metadata naming it is not trusted
        self.sequences = PartitionSequences()  # idempotent: each partition's numbers and epoch
        self.batches_taken = 0
        self.correlation = 0
        self.metadata_correlation = 0
        self.metadata_wanted: dict[str, int] = {}  # name -> when last wanted (most recent last)
        self.metadata_asked: set[str] = set()  # the topics the request in flight asks for
        self.metadata_rounds = 0  # requests made: whose turn it is when batches' topics do not fit one
        self.metadata_answered_ns = -(1 << 62)
        self.metadata_refreshed_ns = -1  # when every known topic was last asked for (-1: not yet sent to)
        self.producer_id = -1
        self.producer_secret = b""  # handed out with producer_id; a leader takes its batches only with it
        self.producer_id_correlation = 0
        self.new_producer_id_correlation = 0  # asking for an id for partitions whose epochs are spent
        self.timer = DeadlineTimer()  # at the next timeout, retry, delivery deadline or re-ask
        self.chase_at_ns = 0  # when metadata or a producer id still wanted is asked for again (0: none wanted)

    @property
    def bootstrap(self) -> str:
        """Where metadata and producer ids are asked for: the active controller, as far as known."""
        return self.controllers.current

    # ------------------------------------------------------------------ lifecycle

    def start(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        if self.settings.idempotent:
            self.correlation += 1
            self.producer_id_correlation = self.correlation
            effects.append(Send(self.bootstrap, InitProducerIdRequest(correlation_id=self.correlation)))
        return effects + self._arm(now_ns)

    def invariants(self) -> None:
        for key, count in self.in_flight_count.items():
            assert 0 <= count <= self.settings.max_in_flight, f"{key}: {count} requests in flight"
        assert sum(self.in_flight_count.values()) == len(self.in_flight)
        for key, unsettled in self.sequences.unsettled.items():
            assert self.sequences.sent[key] - min(unsettled) <= self.settings.max_in_flight, (
                f"{key}: batch {min(unsettled)} unsettled with {self.sequences.sent[key]} sent: "
                "the leader may forget it")
        missed = self.timer.uncovered(self._deadlines())
        assert missed is None, f"{self.name}: the timer would fire after the deadline at {missed} ns"

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        return self._handle(message, sender, now_ns) + self._arm(now_ns)

    def _chasing(self) -> bool:
        return bool(self.metadata_wanted) or (self.settings.idempotent and self.producer_id < 0) \
            or bool(self.sequences.epochs_spent)

    def _arm(self, now_ns: int) -> list[Effect]:
        """End of every step: the timer at the next deadline. An idle producer sets none; a busy
        one wakes for a timeout, a retry's backoff, a delivery deadline, or to ask again for
        metadata or a producer id it still lacks."""
        if not self._chasing():
            self.chase_at_ns = 0
        elif not self.chase_at_ns:
            self.chase_at_ns = now_ns + CHASE_INTERVAL_MS * MS
            self.timer.want(self.chase_at_ns)
        return self.timer.arm(now_ns)

    def _deadlines(self):
        """Every time something falls due: what the timer must not fire after."""
        timeout_ns = self.settings.request_timeout_ms * MS
        for pending in self.in_flight.values():
            yield pending.sent_ns + timeout_ns + 1
        for queue in self.waiting.values():
            for pending in queue:
                yield pending.batch.deadline_ns
                yield pending.retry_at_ns
        if self.chase_at_ns:
            yield self.chase_at_ns

    def _handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        match message:
            case SendBatch():
                return self._on_send_batch(message, now_ns)
            case ProduceResponse():
                return self._on_produce_response(message, sender, now_ns)
            case MetadataResponse():
                return self._on_metadata(message, now_ns)
            case InitProducerIdResponse():
                return self._on_producer_id(message, now_ns)
            case RefreshMetadata():
                return self._request_metadata(message.topics, now_ns)
            case TimerFired():
                return self._on_tick(now_ns)
            case ErrorResponse():
                return self._on_error_response(message, sender, now_ns)
            case PeerDisconnected():
                return self._on_disconnect(message.endpoint, now_ns)
            case Stop():
                return self._fail_everything(ErrorCode.REQUEST_TIMED_OUT, "the producer closed before delivery")
        return []

    # ------------------------------------------------------------------ sending

    def _on_send_batch(self, batch: SendBatch, now_ns: int) -> list[Effect]:
        key = (batch.topic, batch.partition)
        self.batches_taken += 1
        self.waiting.setdefault(key, deque()).append(Pending(batch, self.batches_taken))
        self.timer.want(batch.deadline_ns)
        return self._refresh_when_old(now_ns) + self._dispatch(key, now_ns)

    def _dispatch(self, key: tuple[str, int], now_ns: int) -> list[Effect]:
        """Send waiting batches of one partition while there is room in flight."""
        queue = self.waiting.get(key)
        if not queue:
            return []
        if self.settings.idempotent and self.producer_id < 0:
            return []
        endpoint = self._leader_endpoint(key, now_ns)
        if not endpoint:
            return self._request_metadata([key[0]], now_ns, backoff=True)
        effects: list[Effect] = []
        sequences = self.sequences
        while queue and self.in_flight_count.get(key, 0) < self.settings.max_in_flight:
            if queue[0].retry_at_ns > now_ns:
                break
            if queue[0].sequence < 0 and self.settings.idempotent:
                if not sequences.fits(key, queue[0].record_count):
                    sequences.numbers_spent(key)  # past the header's int32: start over as behind a gap
                if sequences.waiting_for_start_over(key) and not self._start_over(key, queue):
                    effects += self._ask_new_producer_id(key)
                    break  # numbered again once the batches still numbered under the old epoch are settled
            if queue[0].index < 0 and self.settings.idempotent \
                    and not sequences.may_send_new(key, self.settings.max_in_flight):
                break  # an older batch is unsettled: the leader must still remember it at its retry
            pending = queue.popleft()
            effects += self._send(pending, endpoint, now_ns)
        return effects

    def _start_over(self, key: tuple[str, int], queue: deque[Pending]) -> bool:
        """Number the partition again under its next epoch, once nothing numbered under this one
        is left to settle."""
        if self.in_flight_count.get(key, 0) or any(pending.sequence >= 0 for pending in queue):
            return False
        return self.sequences.start_over(key)

    def _ask_new_producer_id(self, key: tuple[str, int]) -> list[Effect]:
        """The partition's epochs are spent: ask for a producer id to go on under (once; the
        chase asks again while it is wanted)."""
        if key not in self.sequences.epochs_spent or self.new_producer_id_correlation:
            return []
        self.correlation += 1
        self.new_producer_id_correlation = self.correlation
        return [Send(self.bootstrap, InitProducerIdRequest(correlation_id=self.correlation))]

    def _ended_undelivered(self, key: tuple[str, int], pending: Pending) -> None:
        if self.settings.idempotent:
            self.sequences.ended_undelivered(key, pending.sequence, pending.epoch)
            self.sequences.settled(key, pending.index)

    def _send(self, pending: Pending, endpoint: str, now_ns: int) -> list[Effect]:
        batch = pending.batch
        key = (batch.topic, batch.partition)
        producer_id, producer_secret = self.sequences.producer_id(key, self.producer_id, self.producer_secret)
        if pending.encoded is not None and self.settings.idempotent and pending.sequence < 0:
            pending.sequence, pending.epoch = self.sequences.take(key, pending.record_count)
            # behind a gap: numbered again
            renumber_into(pending.encoded, producer_id, pending.epoch, pending.sequence)
        if pending.encoded is None:
            idempotent = self.settings.idempotent
            sequence = self.sequences.next_sequence.get(key, 0) if idempotent else pending.sequence
            try:
                pending.encoded = encode_batch(
                    batch.records, batch.first_timestamp_ms, batch.max_timestamp_ms,
                    producer_id=producer_id if idempotent else -1,
                    producer_epoch=self.sequences.epoch(key) if idempotent else -1,
                    base_sequence=sequence)
            except (OverflowError, ValueError, TypeError, struct.error, msgspec.EncodeError) as error:
                # What the application passed cannot be written (a timestamp past 64 bits, a
                # header name UTF-8 cannot hold): this batch fails, and takes no sequence numbers.
                failure = RailmqError(ErrorCode.INVALID_RECORD, f"the batch cannot be encoded: {error}")
                return [Notify("batch-done", (batch.batch_id, batch.partition, -1, failure))]
            if idempotent:
                pending.sequence, pending.epoch = self.sequences.take(key, len(batch.records))
                pending.index = self.sequences.first_sent(key)
            batch.records = []  # encoded now: let the tuples go
        self.correlation += 1
        pending.correlation_id = self.correlation
        pending.attempts += 1
        pending.sent_ns = now_ns
        self.timer.want(now_ns + self.settings.request_timeout_ms * MS + 1)
        self.in_flight[pending.correlation_id] = pending
        self.sent_to[pending.correlation_id] = endpoint
        self.in_flight_count[key] = self.in_flight_count.get(key, 0) + 1
        known = self.topics.get(batch.topic)
        request = ProduceRequest(
            correlation_id=pending.correlation_id, topic=batch.topic, partition=batch.partition,
            topic_id=known.topic_id if known is not None else 0,
            acks=self.settings.acks, timeout_ms=self.settings.request_timeout_ms, batch=pending.encoded,
            producer_secret=producer_secret if self.settings.idempotent else b"")
        effects: list[Effect] = [Send(endpoint, request)]
        if self.settings.acks == 0:
            effects += self._finish(pending, -1, None, now_ns, dispatch=False)  # the caller's loop sends the next
        return effects

    def _finish(self, pending: Pending, base_offset: int, error: RailmqError | None, now_ns: int,
                dispatch: bool = True) -> list[Effect]:
        self.in_flight.pop(pending.correlation_id, None)
        self.sent_to.pop(pending.correlation_id, None)
        key = (pending.batch.topic, pending.batch.partition)
        self.in_flight_count[key] -= 1
        if error is not None:
            self._ended_undelivered(key, pending)
        elif self.settings.idempotent:
            self.sequences.settled(key, pending.index)
        done = Notify("batch-done", (pending.batch.batch_id, pending.batch.partition, base_offset, error))
        return [done] + (self._dispatch(key, now_ns) if dispatch else [])

    # ------------------------------------------------------------------ answers

    def _in_flight_to(self, correlation_id: int, sender: Any) -> Pending | None:
        """The batch an answer is about, if the answer came from where the batch went (not from
        a server reusing or guessing a correlation id)."""
        if self.sent_to.get(correlation_id) != sender:
            return None
        return self.in_flight.get(correlation_id)

    def _on_produce_response(self, response: ProduceResponse, sender: Any, now_ns: int) -> list[Effect]:
        pending = self._in_flight_to(response.correlation_id, sender)
        if pending is None:
            return []  # answer to a request we already gave up on, or not from where it went
        code = response.error
        if code == ErrorCode.NONE:
            unconfirmed = self._unconfirmed(response, pending)
            if unconfirmed:
                # Not an acknowledgement of this batch (a stale endpoint, a confused leader):
                # what happened to ours is unknown, as if the answer were lost.
                return self._retry_or_fail(pending, ErrorCode.NOT_LEADER, unconfirmed, now_ns)
            return self._finish(pending, response.base_offset, None, now_ns)
        if code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and self.settings.idempotent:
            if self.sequences.behind_gap((pending.batch.topic, pending.batch.partition), pending.sequence,
                                         pending.epoch):
                pending.sequence = pending.epoch = -1  # it takes new numbers once they start over
            code = ErrorCode.NOT_LEADER  # an earlier batch is being retried: go again, in order
        elif code == ErrorCode.UNKNOWN_PRODUCER_ID and self.settings.idempotent:
            self._unknown_to_leader(pending)
            code = ErrorCode.NOT_LEADER
        return self._retry_or_fail(pending, code, response.error_message, now_ns)

    def _unknown_to_leader(self, pending: Pending) -> None:
        """The leader has no state for this producer and takes it only from sequence 0. With an
        older batch of the partition still unsettled, that one goes first (the leader has not
        seen it yet). With none, the leader forgot the producer: this batch and the ones after it
        are numbered again from 0 under the partition's next epoch, once nothing numbered before
        is in flight."""
        key = (pending.batch.topic, pending.batch.partition)
        older = [other for other in (*self.in_flight.values(), *self.waiting.get(key, ()))
                 if (other.batch.topic, other.batch.partition) == key and other.epoch == pending.epoch
                 and 0 <= other.sequence < pending.sequence]
        if not older and pending.sequence >= 0:
            self.sequences.forgotten_from(key, pending.sequence, pending.epoch)
            pending.sequence = pending.epoch = -1

    @staticmethod
    def _unconfirmed(response: ProduceResponse, pending: Pending) -> str:
        """Why a success answer does not confirm this batch ("" when it does): it must name the
        batch's partition and give offsets `base_offset..last_offset` spanning its records."""
        batch = pending.batch
        if (response.topic, response.partition) != (batch.topic, batch.partition):
            return f"the answer names {response.topic}/{response.partition}, not {batch.topic}/{batch.partition}"
        if response.base_offset < 0 or response.last_offset != response.base_offset + pending.record_count - 1:
            return (f"the answer's offsets {response.base_offset}..{response.last_offset} are not those of "
                    f"this batch's {pending.record_count} records")
        return ""

    def _on_error_response(self, response: ErrorResponse, sender: Any, now_ns: int) -> list[Effect]:
        if self.controllers.take(response):
            return self._ask_controller_again(response.correlation_id, now_ns)
        pending = self._in_flight_to(response.correlation_id, sender)
        if pending is None:
            return []
        return self._retry_or_fail(pending, response.error, response.error_message, now_ns)

    def _retry_or_fail(self, pending: Pending, code: int, text: str, now_ns: int) -> list[Effect]:
        batch = pending.batch
        text = clipped(text)  # kept with the batch until it is delivered or fails
        pending.last_error = f"{RailmqError(code, text)}"
        if code not in RETRIABLE or now_ns >= batch.deadline_ns:
            if code in RETRIABLE:
                text = f"delivery timed out after {pending.attempts} attempts; last error: {text}"
            return self._finish(pending, -1, RailmqError(code, text), now_ns)
        self.in_flight.pop(pending.correlation_id, None)
        self.sent_to.pop(pending.correlation_id, None)
        key = (batch.topic, batch.partition)
        self.in_flight_count[key] -= 1
        pending.retry_at_ns = now_ns + self.settings.retry_backoff_ms * MS
        self.timer.want(pending.retry_at_ns)
        self.timer.want(batch.deadline_ns)
        queue = self.waiting.setdefault(key, deque())
        queue.append(pending)
        if self.settings.idempotent:
            ordered = sorted(queue, key=lambda item: (item.sequence < 0, item.sequence, item.order))
            queue.clear()
            queue.extend(ordered)
        else:
            queue.rotate(1)  # the retried batch goes first
        self._forget_leader(key)
        return self._request_metadata([batch.topic], now_ns)

    def _on_disconnect(self, endpoint: str, now_ns: int) -> list[Effect]:
        """The leader's process is gone: its in-flight requests will never be answered, and
        metadata still naming it (the coordinator may not know yet) is not trusted for a while."""
        distrust(self.unreachable, endpoint, now_ns + UNREACHABLE_MS * MS, now_ns)
        effects: list[Effect] = []
        for correlation_id in [c for c, sent in self.sent_to.items() if sent == endpoint]:
            pending = self.in_flight.get(correlation_id)
            if pending is not None:
                effects += self._retry_or_fail(pending, ErrorCode.NOT_LEADER,
                                               f"lost the connection to {endpoint}; the batch may have been written", now_ns)
        return effects

    def _on_tick(self, now_ns: int) -> list[Effect]:
        self.timer.fired()
        effects: list[Effect] = []
        timeout_ns = self.settings.request_timeout_ms * MS
        for pending in [p for p in self.in_flight.values() if now_ns - p.sent_ns > timeout_ns]:
            effects += self._retry_or_fail(pending, ErrorCode.REQUEST_TIMED_OUT,
                                           "no answer from the leader in time; the batch may have been written", now_ns)
        for key, queue in list(self.waiting.items()):
            expired = [p for p in queue if now_ns >= p.batch.deadline_ns]
            for pending in expired:
                queue.remove(pending)
                self._ended_undelivered(key, pending)
                last = f"; last error: {pending.last_error}" if pending.last_error else ""
                effects.append(Notify("batch-done", (pending.batch.batch_id, pending.batch.partition, -1, RailmqError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"not delivered before the delivery timeout ({pending.attempts} attempts){last}"))))
            effects += self._dispatch(key, now_ns)
        if self.chase_at_ns and now_ns >= self.chase_at_ns:
            self.chase_at_ns = 0  # _arm sets the next one while something is still wanted
            effects += self._chase(now_ns)
        self.timer.want_all(self._deadlines(), now_ns)
        return effects

    def _fail_everything(self, code: ErrorCode, text: str) -> list[Effect]:
        effects: list[Effect] = []
        for pending in list(self.in_flight.values()) + [p for queue in self.waiting.values() for p in queue]:
            effects.append(Notify("batch-done", (pending.batch.batch_id, pending.batch.partition, -1, RailmqError(code, text))))
        self.in_flight.clear()
        self.sent_to.clear()
        self.waiting.clear()
        self.in_flight_count.clear()
        return effects
