"""The chaos workload: producers and group members that record every operation they do.

Each client runs in a process of its own (started by `chaos.workers.WorkerPool`), so the nemesis
can kill -9 or pause a producer or a group member like any actor. Each writes its history lines
(docs/history.md) to its own file through a `LineRecorder`; the runner merges the files by time
at the end. Times are `time.monotonic_ns()` minus the run's origin: the monotonic clock is one
clock for every process on the machine, so lines from different processes compare.

What a producer does: unique values `"<process>:<key>:<n>"` over a small shared key space, at
most one send in flight per key (so "A acknowledged before B invoked" is meaningful per key),
under a rate cap. Outcomes (`classify_send_error`):
- `ok` with the acknowledged partition and offset;
- `fail` only for a definite refusal on the only attempt (NOT_ENOUGH_REPLICAS, MESSAGE_TOO_LARGE,
  DISK_FULL, ...: the broker refused before appending);
- `info` for everything else: REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND, a lost
  connection, a refusal after earlier attempts whose fate is unknown, or no outcome in time.

What a group member does: poll, record the poll, "process" the records for
`processing_ms`, commit the offsets after them (at-least-once), record the commit's invoke and
outcome, and record each new assignment. `phase` (shared with the parent) is 1 while polled
records are not yet committed, which lets the nemesis crash a member exactly there.

Invariants:
- an operation's `invoke` line is in the kernel (one `os.write`) before the operation starts, so
  a kill -9 can lose a completion (indeterminate) but never an invoke (which would make a read
  look like a phantom);
- each send gets exactly one completion line, however the producer's callback and the watchdog
  race; a late callback after an `info` is ignored;
- stamps never go backwards within one file.
"""

from __future__ import annotations

import os
import random
import re
import sys
import threading
import time
from multiprocessing.connection import wait
from typing import Any, Callable

import msgspec

from actors.errors import ErrorCode, RailmqError

# A definite refusal: the broker said no before appending anything. Only these become `fail`.
DEFINITE_REFUSALS = frozenset({
    ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.DISK_FULL,
    ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_REQUEST, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.BUSY,
})
_ATTEMPTS = re.compile(r"after (\d+) attempts")
# A send whose future has said nothing this long after its delivery timeout is written off as
# indeterminate, so its key can carry on.
SEND_OUTCOME_GRACE_MS = 2000
# Producer settings: a request answered within a second or retried; delivery given up on after a
# few failovers' worth of time (each ~1.5-3 s with the chaos limits).
REQUEST_TIMEOUT_MS = 1000
DELIVERY_TIMEOUT_MS = 6000
RETRY_BACKOFF_MS = 50
PRODUCER_BLOCK_MS = 1000
# Members poll with this timeout, so a stop request is seen within it.
MEMBER_POLL_MS = 200
PHASE_IDLE, PHASE_UNCOMMITTED = 0, 1


class ProducerSpec(msgspec.Struct, frozen=True, kw_only=True):
    process: str  # the name in the history, e.g. "producer-1" or "producer-1#2" after a restart
    client_id: str
    bootstrap: str
    topic: str
    history_path: str
    origin_ns: int
    keys: list[str]
    rate_per_s: int
    acks: int = -1
    idempotent: bool = True
    seed: int = 0


class MemberSpec(msgspec.Struct, frozen=True, kw_only=True):
    process: str  # e.g. "g1/member-1"
    client_id: str
    bootstrap: str
    topic: str
    group: str
    history_path: str
    origin_ns: int
    session_timeout_ms: int = 1500
    processing_ms: int = 20


class LineRecorder:
    """Appends history lines to a file, one `os.write` per line, stamped under one lock."""

    def __init__(self, path: str, origin_ns: int, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._origin_ns = origin_ns
        self._clock_ns = clock_ns
        self._encoder = msgspec.json.Encoder()
        self._lock = threading.Lock()
        self._last_ns = 0

    def record(self, fields: dict[str, Any]) -> int:
        with self._lock:
            stamp = max(self._clock_ns() - self._origin_ns, self._last_ns)
            self._last_ns = stamp
            data = self._encoder.encode({**fields, "time_ns": stamp}) + b"\n"
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
        return stamp

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def classify_send_error(error: BaseException) -> tuple[str, str]:
    """(`fail` or `info`, error text) for a send that did not succeed."""
    if isinstance(error, RailmqError):
        match = _ATTEMPTS.search(str(error))
        attempts = int(match.group(1)) if match else 1
        if error.code in DEFINITE_REFUSALS and attempts <= 1:
            return "fail", error.name
        return "info", error.name
    if isinstance(error, TimeoutError):
        return "info", "timeout"
    return "info", type(error).__name__


def exit_when_parent_dies() -> None:
    """A worker outlives nothing: when the runner's process is gone, exit at once."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


# --------------------------------------------------------------------------- producer


class _Send:
    __slots__ = ("value", "key", "deadline_ns", "done")

    def __init__(self, value: str, key: str, deadline_ns: int) -> None:
        self.value, self.key, self.deadline_ns, self.done = value, key, deadline_ns, False


class ProducerLoop:
    """Sends until `stop` is set, then waits for outstanding outcomes; records everything."""

    def __init__(self, spec: ProducerSpec, recorder: LineRecorder, stop: Any, producer: Any,
                 acked: Any = None) -> None:
        self.spec = spec
        self.recorder = recorder
        self.stop = stop
        self.producer = producer
        self.acked = acked
        self.rng = random.Random(spec.seed)
        self.lock = threading.Condition()
        self.free_keys = list(spec.keys)
        self.in_flight: dict[str, _Send] = {}
        self.sequence = 0

    def run(self) -> None:
        interval_s = 1.0 / self.spec.rate_per_s
        next_s = time.monotonic()
        while not self.stop.is_set():
            delay_s = next_s - time.monotonic()
            if delay_s > 0 and self.stop.wait(delay_s):
                break
            next_s = max(next_s + interval_s, time.monotonic() - 1.0)  # never a burst of more than 1 s
            key = self._take_key()
            if key is not None:
                self._send(key)
        self._drain()

    def _take_key(self) -> str | None:
        with self.lock:
            self._write_off_overdue()
            if not self.free_keys:
                self.lock.wait(0.05)
                return None
            return self.free_keys.pop(self.rng.randrange(len(self.free_keys)))

    def _send(self, key: str) -> None:
        spec = self.spec
        value = f"{spec.process}:{key}:{self.sequence}"
        self.sequence += 1
        deadline_ns = time.monotonic_ns() + (DELIVERY_TIMEOUT_MS + SEND_OUTCOME_GRACE_MS) * 1_000_000
        send = _Send(value, key, deadline_ns)
        with self.lock:
            self.in_flight[value] = send
        self._line("invoke", send)
        try:
            future = self.producer.send(spec.topic, value, key=key)
        except (RailmqError, TimeoutError) as error:  # never handed to the broker
            self._complete(send, "fail", error=getattr(error, "name", type(error).__name__))
            return
        future.add_done_callback(lambda done, send=send: self._on_done(send, done))

    def _on_done(self, send: _Send, future: Any) -> None:
        error = future.exception(0)
        if error is None:
            metadata = future.result(0)
            self._complete(send, "ok", partition=metadata.partition, offset=metadata.offset)
            if self.acked is not None:
                self.acked.value += 1
        else:
            outcome, text = classify_send_error(error)
            self._complete(send, outcome, error=text)

    def _complete(self, send: _Send, outcome: str, **fields: Any) -> None:
        with self.lock:
            if send.done:
                return
            send.done = True
            self.in_flight.pop(send.value, None)
            self._line(outcome, send, **fields)
            self.free_keys.append(send.key)
            self.lock.notify_all()

    def _write_off_overdue(self) -> None:
        now_ns = time.monotonic_ns()
        for send in [send for send in self.in_flight.values() if send.deadline_ns <= now_ns]:
            self._complete_locked_info(send, "no outcome in time")

    def _complete_locked_info(self, send: _Send, text: str) -> None:
        send.done = True
        self.in_flight.pop(send.value, None)
        self._line("info", send, error=text)
        self.free_keys.append(send.key)

    def _drain(self) -> None:
        deadline = time.monotonic() + (DELIVERY_TIMEOUT_MS + SEND_OUTCOME_GRACE_MS) / 1000
        with self.lock:
            while self.in_flight and time.monotonic() < deadline:
                self.lock.wait(0.05)
            for send in list(self.in_flight.values()):
                self._complete_locked_info(send, "no outcome before the producer stopped")

    def _line(self, kind: str, send: _Send, **fields: Any) -> None:
        self.recorder.record({"type": kind, "f": "send", "process": self.spec.process,
                              "topic": self.spec.topic, "key": send.key, "value": send.value, **fields})


def producer_main(spec_bytes: bytes, stop: Any, acked: Any) -> None:
    """Entry point of a producer process."""
    from railmq.producer import Producer

    exit_when_parent_dies()
    spec = msgspec.msgpack.decode(spec_bytes, type=ProducerSpec)
    recorder = LineRecorder(spec.history_path, spec.origin_ns)
    producer = Producer(spec.bootstrap, acks=spec.acks, idempotent=spec.idempotent, client_id=spec.client_id,
                        request_timeout_ms=REQUEST_TIMEOUT_MS, delivery_timeout_ms=DELIVERY_TIMEOUT_MS,
                        retry_backoff_ms=RETRY_BACKOFF_MS, max_block_ms=PRODUCER_BLOCK_MS, seed=spec.seed)
    try:
        ProducerLoop(spec, recorder, stop, producer, acked).run()
    finally:
        try:
            producer.close(timeout=1.0)
        except (TimeoutError, RailmqError):
            pass  # every outstanding send already has its `info` line
        recorder.close()


# --------------------------------------------------------------------------- group member


def as_text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "replace")


class MemberLoop:
    """poll → record → process → commit → record, until `stop` is set."""

    def __init__(self, spec: MemberSpec, recorder: LineRecorder, stop: Any, consumer: Any,
                 phase: Any = None) -> None:
        self.spec = spec
        self.recorder = recorder
        self.stop = stop
        self.consumer = consumer
        self.phase = phase

    def run(self) -> None:
        self.consumer.subscribe([self.spec.topic], on_assign=self._on_assign)
        while not self.stop.is_set():
            try:
                records = self.consumer.poll(MEMBER_POLL_MS)
            except RailmqError as error:
                print(f"{self.spec.process}: poll failed: {error}", file=sys.stderr)
                self.stop.wait(0.1)
                continue
            if records:
                self._handle(records)

    def _identity(self) -> dict[str, Any]:
        return {"process": self.spec.process, "group": self.spec.group, "topic": self.spec.topic,
                "member": self.consumer.member_id(), "generation": self.consumer.generation()}

    def _on_assign(self, partitions: list[Any]) -> None:
        owned = sorted(tp.partition for tp in self.consumer.assignment() if tp.topic == self.spec.topic)
        self.recorder.record({"type": "ok", "f": "assign", **self._identity(), "partitions": owned})

    def _handle(self, records: list[Any]) -> None:
        rows = [[record.partition, record.offset, as_text(record.key), as_text(record.value)]
                for record in records]
        self.recorder.record({"type": "ok", "f": "poll", **self._identity(), "records": rows})
        self._set_phase(PHASE_UNCOMMITTED)
        time.sleep(self.spec.processing_ms / 1000)
        offsets: dict[int, int] = {}
        for record in records:
            offsets[record.partition] = max(offsets.get(record.partition, 0), record.offset + 1)
        self._commit(offsets)
        self._set_phase(PHASE_IDLE)

    def _commit(self, offsets: dict[int, int]) -> None:
        from railmq.records import TopicPartition

        identity = self._identity()
        shown = {str(partition): offset for partition, offset in sorted(offsets.items())}
        self.recorder.record({"type": "invoke", "f": "commit", **identity, "offsets": shown})
        try:
            self.consumer.commit({TopicPartition(self.spec.topic, p): o for p, o in offsets.items()})
        except RailmqError as error:
            outcome = "info" if error.code == ErrorCode.REQUEST_TIMED_OUT else "fail"
            self.recorder.record({"type": outcome, "f": "commit", **identity, "offsets": shown,
                                  "error": error.name})
            return
        except Exception as error:  # the outcome is unknown: indeterminate
            self.recorder.record({"type": "info", "f": "commit", **identity, "offsets": shown,
                                  "error": type(error).__name__})
            raise
        self.recorder.record({"type": "ok", "f": "commit", **identity, "offsets": shown})

    def _set_phase(self, value: int) -> None:
        if self.phase is not None:
            self.phase.value = value


def member_main(spec_bytes: bytes, stop: Any, phase: Any) -> None:
    """Entry point of a group member process."""
    from railmq.consumer import Consumer

    exit_when_parent_dies()
    spec = msgspec.msgpack.decode(spec_bytes, type=MemberSpec)
    recorder = LineRecorder(spec.history_path, spec.origin_ns)
    consumer = Consumer(spec.bootstrap, group_id=spec.group, client_id=spec.client_id,
                        auto_offset_reset="earliest", enable_auto_commit=False,
                        session_timeout_ms=spec.session_timeout_ms,
                        heartbeat_interval_ms=max(1, spec.session_timeout_ms // 3),
                        request_timeout_ms=REQUEST_TIMEOUT_MS * 3)
    try:
        MemberLoop(spec, recorder, stop, consumer, phase).run()
    finally:
        consumer.close()
        recorder.close()
