"""Small instruments the labs share: waiting, producing, reading back, rate-bound clients, lag.

Everything here is a thin use of the public client API (Producer, Consumer, Admin and
railmq.group_admin's GroupAdminClient), so a lab measures what a user of railmq would see:

- `wait_for` polls a condition with a deadline and names what it waited for;
- `produce` / `read_partition` / `read_topic` write and read back whole topics;
- `RateProducer` sends at a fixed rate from a thread (never faster, never a burst after a stall);
- `CappedMember` is a group member that handles at most `rate_per_s` records a second and
  commits its position every `commit_interval_s` — a consumer with a known capacity;
- `LagSampler` records each partition's lag in messages and seconds over time, with the same
  code `railmq groups lag` uses;
- `slope` fits a least-squares line through samples.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, TypeVar

from actors.errors import RailmqError
from railmq.admin import Admin
from railmq.consumer import Consumer
from railmq.group_admin import GroupAdminClient
from railmq.lag import measure_group_lag
from railmq.producer import Producer
from railmq.records import ConsumerRecord, TopicPartition

T = TypeVar("T")
WAIT_INTERVAL_S = 0.05


class LabStuck(RuntimeError):
    """A condition the experiment depends on never came true (the lab cannot measure anything)."""


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str,
             interval_s: float = WAIT_INTERVAL_S) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except (RailmqError, TimeoutError):
            value = None  # a leader moving, a coordinator restarting: ask again
        if value:
            return value
        if time.monotonic() > deadline:
            raise LabStuck(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def produce(bootstrap: str, topic: str, values: list[str], *, keys: list[str] | None = None,
            partition: int | None = None, acks: Any = "all", **options: Any) -> list[Any]:
    """Send every value (with its key), wait for every acknowledgement, return the metadata."""
    with Producer(bootstrap, acks=acks, linger_ms=2, **options) as producer:
        futures = [producer.send(topic, value, key=None if keys is None else keys[index], partition=partition)
                   for index, value in enumerate(values)]
        producer.flush(60)
        return [future.result(30) for future in futures]


def read_partition(bootstrap: str, topic: str, partition: int,
                   timeout_s: float = 20.0) -> list[ConsumerRecord]:
    """Every record of the partition, up to its high watermark at the start of the read."""
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout_s
        while end > 0 and (not records or records[-1].offset < end - 1):
            if time.monotonic() > deadline:
                raise LabStuck(f"read {len(records)} records of {topic}/{partition}, "
                               f"expected up to offset {end}")
            records += consumer.poll(200)
        return records


def read_topic(bootstrap: str, topic: str, partitions: int) -> dict[int, list[ConsumerRecord]]:
    return {partition: read_partition(bootstrap, topic, partition) for partition in range(partitions)}


def leader_state(bootstrap: str, topic: str, partition: int = 0) -> Any:
    with Admin(bootstrap) as admin:
        return admin.describe_topic(topic).partitions[partition]


def slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(slope, r²) of the least-squares line through the points (0, 0 for fewer than two)."""
    if len(points) < 2:
        return 0.0, 0.0
    count = len(points)
    mean_x = sum(x for x, _ in points) / count
    mean_y = sum(y for _, y in points) / count
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    syy = sum((y - mean_y) ** 2 for _, y in points)
    if sxx == 0:
        return 0.0, 0.0
    fitted = sxy / sxx
    r_squared = (sxy * sxy) / (sxx * syy) if syy else 1.0
    return fitted, r_squared


class RateProducer:
    """Sends `rate_per_s` records a second from a thread; `key_for(n)` picks each key (or None)."""

    def __init__(self, bootstrap: str, topic: str, rate_per_s: float, *, key_for: Callable[[int], str | None],
                 partition_for: Callable[[int], int | None] = lambda n: None) -> None:
        self.producer = Producer(bootstrap, acks=1, linger_ms=5, client_id="lab-rate-producer")
        self.topic = topic
        self.interval_s = 1.0 / rate_per_s
        self.key_for = key_for
        self.partition_for = partition_for
        self.sent = 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="lab-producer", daemon=True)

    def start(self) -> "RateProducer":
        self.thread.start()
        return self

    def _run(self) -> None:
        next_s = time.monotonic()
        while not self.stop_event.is_set():
            delay = next_s - time.monotonic()
            if delay > 0 and self.stop_event.wait(delay):
                break
            next_s = max(next_s + self.interval_s, time.monotonic() - 0.1)  # fall behind, never burst
            self.producer.send(self.topic, f"m{self.sent}", key=self.key_for(self.sent),
                               partition=self.partition_for(self.sent))
            self.sent += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(10)
        self.producer.close(timeout=10)


class CappedMember:
    """A group member that handles at most `rate_per_s` records a second (0: as fast as it can),
    commits its position every `commit_interval_s`, and notes when it handled each record."""

    def __init__(self, bootstrap: str, group: str, topic: str, *, rate_per_s: float = 0, name: str = "member",
                 assignor: str = "range", commit_interval_s: float = 0.2, auto_offset_reset: str = "earliest",
                 session_timeout_ms: int = 3000) -> None:
        self.consumer = Consumer(bootstrap, group_id=group, client_id=f"lab-{name}", assignor=assignor,
                                 auto_offset_reset=auto_offset_reset, enable_auto_commit=False,
                                 session_timeout_ms=session_timeout_ms,
                                 heartbeat_interval_ms=max(100,
                                                           session_timeout_ms // 10), max_poll_records=20)
        self.topic = topic
        self.name = name
        self.handle_s = 1.0 / rate_per_s if rate_per_s else 0.0
        self.commit_interval_s = commit_interval_s
        self.handled: list[tuple[float, int, int, str]] = []  # (monotonic time, partition, offset, value)
        self.revoked: list[tuple[float, list[int]]] = []  # (monotonic time, partitions taken away)
        self.assigned: list[tuple[float, list[int]]] = []  # (monotonic time, partitions given)
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"lab-{name}", daemon=True)

    def start(self) -> "CappedMember":
        self.consumer.subscribe([self.topic], on_revoke=self._commit_revoked, on_assign=self._note_assigned,
                                on_lost=self._note_lost)
        self.thread.start()
        return self

    def assignment(self) -> list[TopicPartition]:
        return self.consumer.assignment()

    def _commit_revoked(self, partitions: list[TopicPartition]) -> None:
        self.revoked.append((time.monotonic(), sorted(tp.partition for tp in partitions)))
        self._commit()

    def _note_lost(self, partitions: list[TopicPartition]) -> None:
        self.revoked.append((time.monotonic(), sorted(tp.partition for tp in partitions)))

    def _note_assigned(self, partitions: list[TopicPartition]) -> None:
        self.assigned.append((time.monotonic(), sorted(tp.partition for tp in partitions)))

    def _commit(self) -> None:
        try:
            self.consumer.commit()
        except RailmqError:
            pass  # the group is moving: the next owner starts from the last commit (at-least-once)

    def _run(self) -> None:
        last_commit = time.monotonic()
        next_s = time.monotonic()
        while not self.stop_event.is_set():
            try:
                records = self.consumer.poll(100)
            except RailmqError:
                continue
            for record in records:
                if self.handle_s:
                    next_s = max(next_s + self.handle_s, time.monotonic() - self.handle_s)
                    delay = next_s - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                with self.lock:
                    self.handled.append((time.monotonic(), record.partition, record.offset,
                                         record.value.decode() if record.value else ""))
            if time.monotonic() - last_commit >= self.commit_interval_s:
                self._commit()
                last_commit = time.monotonic()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(10)
        self._commit()
        self.consumer.close()


class LagSampler:
    """Samples a group's lag (messages and seconds, per partition) with railmq.lag, in a thread."""

    def __init__(self, bootstrap: str, group: str, interval_s: float = 0.5) -> None:
        self.client = GroupAdminClient(bootstrap)
        self.group = group
        self.interval_s = interval_s
        self.origin = time.monotonic()
        self.samples: list[tuple[float, dict[int, int], dict[int, float]]] = []  # (t, messages, seconds)
        self.hot_flags: list[list[int]] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="lab-lag", daemon=True)

    def start(self) -> "LagSampler":
        self.origin = time.monotonic()
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop_event.wait(self.interval_s):
            try:
                lag = measure_group_lag(self.client, self.group)
            except (RailmqError, TimeoutError):
                continue
            messages = {row.partition: row.lag_messages or 0 for row in lag.partitions}
            seconds = {row.partition: row.lag_seconds or 0.0 for row in lag.partitions}
            self.samples.append((time.monotonic() - self.origin, messages, seconds))
            self.hot_flags.append([row.partition for row in lag.partitions if row.hot])

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(10)
        self.client.close()

    def series(self, partition: int, seconds: bool = False) -> list[tuple[float, float]]:
        return [(t, (lag_seconds if seconds else lag_messages).get(partition, 0))
                for t, lag_messages, lag_seconds in self.samples]
