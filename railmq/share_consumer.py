"""`ShareConsumer`: a member of a share group (KIP-932) — queue semantics on a railmq topic.

Every member of a share group reads every partition of its topics; the group coordinator locks
each record to the member it hands it to, for the group's visibility timeout. A member answers
each record:

    records = consumer.poll(1000)
    for record in records:                     # record.delivery_count: 1 on the first delivery
        try:
            handle(record)                     # not acknowledged: accepted by the next poll
        except TemporaryError as error:
            consumer.acknowledge(record, "release", delay_ms=5000, error=str(error))
        except Poison as error:
            consumer.acknowledge(record, "reject", error=str(error))   # dead-lettered now

Implicit mode (KIP-932's default): records the previous poll returned and that were not
acknowledged explicitly are accepted by the next `poll` (or by `commit`). Acknowledgements travel
with the next poll, asynchronously, or at once with `commit()`, which waits and returns each
record's outcome. A record whose lock expired (the handler took longer than the visibility
timeout, and `renew` was not called) is redelivered, maybe to another member; this member's late
answer is then refused with INVALID_RECORD_STATE and changes nothing. After
`max_delivery_attempts` deliveries a record goes to the dead-letter topic (default
`<topic>.dlq`). `close()` releases every record still held: call `commit()` first to accept
the last poll's records.

The I/O thread (transport/client_engine.py) runs actors/share_member.py; `poll` decodes the
fetched batches here, in the caller's thread, keeping only offsets this member holds. Fetched
bytes waiting for `poll` are at most `buffer_bytes_max` (and a batch): past it the member
acquires nothing more until `poll` has used some up.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Iterable

import msgspec

from actors.errors import ErrorCode, RailmqError
from actors.messages import INT64_MAX, ClientCommand, ShareGroupSettings
from actors.share_member import ShareMember, ShareMemberSettings
from railmq.client_shell import ClientShell
from railmq.records import ConsumerRecord, topic_names
from storage.batch import HEADER_SIZE, iter_batches
from storage.errors import StorageError
from transport.client_engine import ClientEngine

ACKNOWLEDGE_KINDS = ("accept", "release", "reject")
ERROR_TEXT_CHARS_MAX = 1024  # an acknowledgement's error text is cut here (the coordinator keeps 256 bytes)
# Outcomes of asynchronous acknowledgements kept for `acknowledgement_failures()`.
FAILURES_KEPT_MAX = 10_000
ANSWER_GRACE_S = 2.0
# A member holds at most this many polls' worth of locks (records being handled, plus the next
# batch fetched meanwhile, so handling and fetching overlap); more would only expire unhandled.
PREFETCH_POLLS = 2


class ShareRecord(ConsumerRecord):
    """A record delivered to a share-group member: a ConsumerRecord plus how often it was delivered."""

    delivery_count: int = 0
    lock_deadline_ms: int = 0  # wall-clock time when this member's lock on it ends (see `renew`)


_records_decoder = msgspec.msgpack.Decoder(list[ShareRecord])
RecordKey = tuple[str, int, int]  # topic, partition, offset
Answer = tuple[str, int, str, int, int]  # kind, delay_ms, error, delivery count, topic id


def decode_acquired(topic: str, partition: int, batches: Any, acquired: list[list[int]], lock_deadline_ms: int,
                    *, check_crcs: bool = True, topic_id: int = 0) -> list[ShareRecord]:
    """The acquired offsets' records from fetched whole batches (each CRC checked), in offset order."""
    counts = {offset: count for first, last, count in acquired for offset in range(first, last + 1)}
    lowest, highest = min(counts), max(counts)
    view = memoryview(batches)
    out: list[ShareRecord] = []
    try:
        for start, header in iter_batches(view, verify=check_crcs):
            if header.is_control or header.last_offset < lowest or header.base_offset > highest:
                continue
            records = _records_decoder.decode(view[start + HEADER_SIZE: start + header.size])
            if len(records) != header.record_count:
                break  # its records cannot be placed at offsets: none of them, nor what follows
            _place(out, records, header, counts, topic, partition, lock_deadline_ms, topic_id)
    except (StorageError, msgspec.DecodeError):
        pass  # a batch that does not check out: what it and the batches after it hold is not delivered
    # Records not delivered stay locked to this member until their locks lapse; then the group
    # delivers them again (their delivery count grows, and a record that never reads right ends
    # in the dead-letter topic).
    out.sort(key=_offset_of)  # linear when already in order, as batches from an honest leader are
    return out


def _offset_of(record: ShareRecord) -> int:
    return record.offset


def _place(out: list[ShareRecord], records: list, header: Any, counts: dict[int, int], topic: str, partition: int,
           lock_deadline_ms: int, topic_id: int) -> None:
    """Give a batch's records their offsets and keep the acquired ones, each offset once (a
    batch that overlaps an earlier one does not deliver its records twice)."""
    for index, record in enumerate(records):
        count = counts.pop(header.base_offset + index, None)
        if count is None:
            continue
        record.timestamp_ms += header.first_timestamp_ms
        record.topic, record.partition, record.offset = topic, partition, header.base_offset + index
        record.topic_id = topic_id
        record.delivery_count, record.lock_deadline_ms = count, lock_deadline_ms
        out.append(record)


def _error_text(error: str) -> str:
    """What a request can carry of an acknowledgement's error: the first ERROR_TEXT_CHARS_MAX
    characters (a 40 MB text made a request no coordinator decodes), each UTF-8 can hold."""
    return str(error)[:ERROR_TEXT_CHARS_MAX].encode("utf-8", "replace").decode("utf-8")


class ShareConsumer(ClientShell):
    _client_noun = "share consumer"

    def __init__(self, bootstrap: str, group_id: str, *, visibility_timeout_ms: int = 30_000,
                 max_delivery_attempts: int = 5, dead_letter_topic: str | None = None, max_poll_records: int = 500,
                 session_timeout_ms: int = 10_000, heartbeat_interval_ms: int = 1_000,
                 client_id: str = "share-consumer", auto_offset_reset: str = "earliest",
                 acquire_max_wait_ms: int = 500, request_timeout_ms: int = 30_000, check_crcs: bool = True,
                 buffer_bytes_max: int = 64 * 1024 * 1024) -> None:
        if max_poll_records <= 0:
            raise ValueError("max_poll_records must be positive")
        if buffer_bytes_max <= 0:
            raise ValueError("buffer_bytes_max must be positive")
        if heartbeat_interval_ms >= session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be smaller than session_timeout_ms")
        super().__init__(request_timeout_ms)
        self.group_id = group_id
        self.max_poll_records = max_poll_records
        self.check_crcs = check_crcs
        group = ShareGroupSettings(visibility_timeout_ms=visibility_timeout_ms,
                                   max_delivery_attempts=max_delivery_attempts,
                                   dead_letter_topic=dead_letter_topic or "", auto_offset_reset=auto_offset_reset)
        settings = ShareMemberSettings(
            group_id=group_id, client_id=client_id, group=group, session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms, acquire_max_wait_ms=acquire_max_wait_ms,
            prefetch_records_max=PREFETCH_POLLS * max_poll_records, request_timeout_ms=request_timeout_ms,
            buffer_bytes_max=buffer_bytes_max)
        self._chunks: deque = deque()
        self._current: list[ShareRecord] = []
        self._current_index = 0
        self._current_chunk: tuple | None = None
        self._delivered: dict[RecordKey, ShareRecord] = {}  # returned by poll, not acknowledged yet
        # each record's answer, with the id of the topic it was read from
        self._acknowledgements: dict[RecordKey, Answer] = {}
        self._failures: deque = deque(maxlen=FAILURES_KEPT_MAX)
        self._membership = 0
        self._member_id = ""
        self._group_settings = group
        self._actor = ShareMember(bootstrap=bootstrap, settings=settings, name=client_id)
        self._engine = ClientEngine(self._actor, name=client_id, on_notify=self._on_notify)
        self._engine.start()

    # ------------------------------------------------------------------ the group

    def subscribe(self, topics: Iterable[str]) -> None:
        topics = topic_names(topics)
        if not topics:
            raise ValueError("subscribe to at least one topic")
        self._command("subscribe", topics=topics)

    def member_id(self) -> str:
        """This member's id ("" until it joined)."""
        with self._ready:
            return self._member_id

    def group_settings(self) -> ShareGroupSettings:
        """The group's settings as the coordinator keeps them (the first member's)."""
        with self._ready:
            return self._group_settings

    def wait_joined(self, timeout_s: float = 10.0) -> str:
        """Block until the member has joined; returns its member id."""
        with self._ready:
            self._wait_until(lambda: bool(self._member_id), timeout_s,
                             f"not joined to {self.group_id!r} in time")
            return self._member_id

    # ------------------------------------------------------------------ polling

    def poll(self, timeout_ms: int = 1000) -> list[ShareRecord]:
        """Accept what the previous poll returned and nobody answered, send the pending
        acknowledgements, and return up to `max_poll_records` newly acquired records."""
        self._check_usable()
        self._accept_unanswered()
        self._send_acknowledgements(token=0)
        deadline = time.monotonic() + timeout_ms / 1000
        out: list[ShareRecord] = []
        consumed = 0
        try:
            with self._ready:
                while len(out) < self.max_poll_records:
                    self._raise_errors()
                    if self._take_current(out):
                        continue
                    if self._chunks:
                        consumed += self._open_chunk(self._chunks.popleft())
                        continue
                    remaining = deadline - time.monotonic()
                    if out or remaining <= 0:
                        break
                    self._ready.wait(min(remaining, 0.1))
                for record in out:
                    self._delivered[(record.topic, record.partition, record.offset)] = record
        finally:
            if consumed:  # the member's buffer has room again: it acquires more
                self._engine.submit(ClientCommand(command="consumed", arguments={"bytes": consumed}))
        return out

    def _take_current(self, out: list[ShareRecord]) -> bool:
        if self._current_chunk is None:
            return False
        now_ms = time.time() * 1000
        while self._current_index < len(self._current) and len(out) < self.max_poll_records:
            record = self._current[self._current_index]
            self._current_index += 1
            if record.lock_deadline_ms > now_ms:  # an expired lock is someone else's record now
                out.append(record)
        if self._current_index >= len(self._current) or self._current_chunk[0] != self._membership:
            self._current, self._current_chunk = [], None
        return True

    def _open_chunk(self, chunk: tuple) -> int:
        """Decode a fetched chunk into the current records; returns its bytes, now used up."""
        membership, topic, partition, batches, acquired, lock_deadline_ms, topic_id = chunk
        self._current_chunk = chunk
        self._current_index = 0
        self._current = [] if membership != self._membership else decode_acquired(
            topic, partition, batches, acquired, lock_deadline_ms, check_crcs=self.check_crcs,
            topic_id=topic_id)
        return len(batches)

    # ------------------------------------------------------------------ acknowledging

    def acknowledge(self, record: ShareRecord, kind: str = "accept", delay_ms: int = 0, error: str = "") -> None:
        """Answer one delivered record: accept (done), release (deliver again, after `delay_ms`),
        or reject (dead-letter it now). Sent with the next poll, or at once by `commit`; refused
        once closed (close released the record: an answer kept now would never be sent)."""
        self._check_usable()
        if kind not in ACKNOWLEDGE_KINDS:
            raise ValueError(f"kind must be one of {', '.join(ACKNOWLEDGE_KINDS)}, not {kind!r}")
        if not 0 <= delay_ms <= INT64_MAX or (delay_ms and kind != "release"):
            raise ValueError(f"delay_ms is for releases, 0 to {INT64_MAX}, got {delay_ms}")
        key = (record.topic, record.partition, record.offset)
        with self._ready:
            delivered = self._delivered.get(key)
            if delivered is None or delivered.topic_id != record.topic_id:
                raise RailmqError(ErrorCode.INVALID_RECORD_STATE, (
                    f"{record.topic}/{record.partition}@{record.offset} was not delivered to this member "
                    "or is already acknowledged"))
            self._acknowledgements[key] = (kind, int(delay_ms), _error_text(error), delivered.delivery_count,
                                           delivered.topic_id)

    def renew(self, record: ShareRecord) -> int:
        """Extend this member's lock on a delivered record by the visibility timeout; returns the
        new lock deadline (wall-clock ms). INVALID_RECORD_STATE if the lock was already lost."""
        key = (record.topic, record.partition, record.offset)
        with self._ready:
            if key not in self._delivered:
                raise RailmqError(ErrorCode.INVALID_RECORD_STATE,
                                  "only a delivered, unanswered record can be renewed")
        results = self.call("acknowledge",
                            acknowledgements=[[*key, record.offset, "renew", 0, "", record.delivery_count,
                                               record.topic_id]])
        (_, _, _, _, code, deadline_ms), = results
        if code:
            where = f"{record.topic}/{record.partition}@{record.offset}"
            raise RailmqError(code, f"the lock on {where} could not be renewed")
        record.lock_deadline_ms = deadline_ms
        return deadline_ms

    def commit(self, timeout_s: float | None = None) -> dict[RecordKey, int]:
        """Accept what was delivered and not answered, send every acknowledgement now and wait:
        returns each answered record's outcome, (topic, partition, offset) -> error code (0: done)."""
        self._check_usable()
        self._accept_unanswered()
        return self._send_acknowledgements(token=next(self._tokens), timeout_s=timeout_s) or {}

    def acknowledgement_failures(self) -> list[tuple[RecordKey, int]]:
        """Records whose asynchronous acknowledgement (sent by poll) was refused, and why;
        forgotten once read."""
        with self._ready:
            failures = list(self._failures)
            self._failures.clear()
            return failures

    def _accept_unanswered(self) -> None:
        with self._ready:
            for key, record in self._delivered.items():
                self._acknowledgements.setdefault(key, ("accept", 0, "", record.delivery_count,
                                                        record.topic_id))

    def _send_acknowledgements(self, token: int, timeout_s: float | None = None) -> dict[RecordKey, int] | None:
        with self._ready:
            answered, self._acknowledgements = self._acknowledgements, {}
            for key in answered:
                self._delivered.pop(key, None)
        if not answered:
            return {} if token else None
        entries = [[topic, partition, first, last, kind, delay_ms, error, delivery_count, topic_id]
                   for (topic, partition, first, last), (kind, delay_ms, error, delivery_count, topic_id)
                   in _ranges(answered)]
        if not token:
            self._command("acknowledge", acknowledgements=entries)
            return None
        # The I/O thread answers every acknowledgement within the request timeout (refusing it
        # itself if the coordinator does not): wait a little longer than that.
        waited = timeout_s if timeout_s is not None else self.request_timeout_s + ANSWER_GRACE_S
        results = self.call("acknowledge", timeout=waited, token=token, acknowledgements=entries)
        return _per_record(results)

    # ------------------------------------------------------------------ the engine thread (under _ready)

    def _handle_notice(self, kind: str, payload: Any) -> None:
        if kind == "share-records":
            self._chunks.append(payload)
        elif kind == "membership":
            self._membership, self._member_id, self._group_settings = payload
            # Their locks went with the old member id: answers for them can no longer count.
            lost = set(self._delivered) | set(self._acknowledgements)
            self._failures.extend((key, ErrorCode.UNKNOWN_MEMBER_ID) for key in sorted(lost))
            self._delivered.clear()
            self._acknowledgements.clear()
        elif kind == "acknowledged":
            self._failures.extend((key, code) for key, code in _per_record(payload).items() if code)
        elif kind == "fatal":
            self._errors.append(payload)

    def close(self, timeout_s: float = 5.0) -> None:
        """Send explicit acknowledgements, release every record still held, leave the group."""
        if self._closed:
            return
        try:
            if self._engine.failure is None:
                self._send_acknowledgements(token=0)
                self.call("close", timeout=timeout_s)
        except RailmqError:
            pass  # the coordinator is unreachable: the locks expire and the session ends by themselves
        finally:
            self._closed = True
            self._engine.stop()


def _ranges(answered: dict[RecordKey, Answer]) -> list[tuple[tuple[str, int, int, int], tuple]]:
    """Per-record acknowledgements as runs of consecutive offsets with the same answer to the
    same delivery."""
    runs: list[list[Any]] = []
    for (topic, partition, offset), answer in sorted(answered.items()):
        last = runs[-1] if runs else None
        if last is not None and last[0] == (topic, partition) and last[2] == offset - 1 and last[3] == answer:
            last[2] = offset
        else:
            runs.append([(topic, partition), offset, offset, answer])
    return [((tp[0], tp[1], first, last), answer) for tp, first, last, answer in runs]


def _per_record(results: list[list[Any]]) -> dict[RecordKey, int]:
    outcome: dict[RecordKey, int] = {}
    for topic, partition, first, last, code, _ in results or []:
        for offset in range(first, last + 1):
            outcome[(topic, partition, offset)] = int(code)
    return outcome
