"""Labs 4, 11, 13 and 14: what a queue does with a poison message, a slow member, many readers
and more load than it can take.

- lab 4: a record whose handler always fails blocks its partition when retried forever; with a
  retry limit and a dead-letter topic (railmq.retry) the partition drains and the DLQ holds it;
- lab 11: one log, read by one group (queue: each record once in the group), by three groups
  (pub/sub: each gets everything) and by a group that arrives later (replay from the start);
- lab 13: a share-group member that holds records past the visibility timeout loses them to
  another member (delivery count 2), and its late acknowledgement is refused;
- lab 14: a producer whose leader stops answering fills its bounded buffer and then refuses
  the next send with a typed error (BufferFull) instead of growing.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable

from actors.errors import RailmqError
from chaos.labs.framework import (
    ARTICLE_GUIDE, ARTICLE_QUESTIONS, Band, Lab, LabContext, LabResult, Measure, Plot, Series,
)
from chaos.labs.lab_backlog import COLORS, start_group, stop_all
from chaos.labs.tools import produce, read_partition, wait_for
from railmq.admin import Admin
from railmq.consumer import Consumer
from railmq.dlq import DeadLetter, default_dlq_topic, dlq_depth
from railmq.group_admin import GroupAdminClient
from railmq.lag import measure_group_lag
from railmq.producer import RECORD_OVERHEAD_BYTES, BufferFull, Producer
from railmq.records import TopicPartition
from railmq.retry import DeadLetterWriter, RetryingHandler, RetryPolicy, ensure_dead_letter_topic
from railmq.share_consumer import ShareConsumer
from transport.supervisor import process_context

POISON = "poison"


# --------------------------------------------------------------------------- lab 4


class PoisonedMember:
    """A group member that commits after each record; its handler fails on the poison record.
    Without a policy it retries forever (every `backoff_s`); with one, railmq.retry decides."""

    def __init__(self, bootstrap: str, group: str, topic: str, name: str,
                 handler: Callable[[Any], Any] | None = None, backoff_s: float = 0.05) -> None:
        self.consumer = Consumer(bootstrap, group_id=group, client_id=f"lab-{name}",
                                 auto_offset_reset="earliest",
                                 enable_auto_commit=False, session_timeout_ms=3000, heartbeat_interval_ms=300)
        self.topic = topic
        self.handler = handler
        self.backoff_s = backoff_s
        self.attempts = 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"lab-{name}", daemon=True)

    def start(self) -> "PoisonedMember":
        self.consumer.subscribe([self.topic])
        self.thread.start()
        return self

    def _handle(self, record: Any) -> None:
        self.attempts += 1
        if record.value == POISON.encode():
            raise ValueError(f"cannot parse {record.value!r}")

    def _run(self) -> None:
        while not self.stop_event.is_set():
            for record in self.consumer.poll(100):
                if self.handler is not None:
                    self.handler(record)  # railmq.retry: returns once handled or dead-lettered
                else:
                    while not self.stop_event.is_set():  # retry forever: the partition waits
                        try:
                            self._handle(record)
                            break
                        except ValueError:
                            time.sleep(self.backoff_s)
                    if self.stop_event.is_set():
                        return
                try:
                    self.consumer.commit({TopicPartition(record.topic, record.partition): record.offset + 1})
                except RailmqError:
                    break  # the group is moving: the next owner starts from the last commit

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(10)
        self.consumer.close()


def _group_lag(bootstrap: str, group: str) -> dict[int, int]:
    with GroupAdminClient(bootstrap) as client:
        lag = measure_group_lag(client, group)
    return {row.partition: row.lag_messages if row.lag_messages is not None else -1 for row in lag.partitions}


def _members_settled(members: list[PoisonedMember]) -> bool:
    return all(len(member.consumer.assignment()) == 1 for member in members)


def poison_message(context: LabContext, result: LabResult) -> None:
    per_partition, poison_at = 30, 5
    blocked_s = 2.0 if context.quick else 4.0
    topic = context.topic("orders", partitions=2)
    dlq_topic = default_dlq_topic(topic)
    with Admin(context.bootstrap) as admin:
        ensure_dead_letter_topic(admin, topic, dlq_topic)  # created up front, as an operator would
    context.adopt_topic(dlq_topic)
    policy = RetryPolicy(attempts=3, backoff_ms=20, backoff_max_ms=50)
    writer = DeadLetterWriter.connect(context.bootstrap)
    context.on_cleanup(writer.close)
    forever, capped = context.name("forever"), context.name("capped")

    def member(group: str, index: int) -> PoisonedMember:
        started = PoisonedMember(context.bootstrap, group, topic, f"{group}-{index}")
        if group == capped:
            started.handler = RetryingHandler(started._handle, policy, writer, capped)
        context.on_cleanup(started.stop)
        return started.start()

    retrying_forever = [member(forever, index) for index in range(2)]
    with_dlq = [member(capped, index) for index in range(2)]
    wait_for(lambda: _members_settled(retrying_forever) and _members_settled(with_dlq), 30,
             "one partition per member in both groups")
    context.say(f"2 partitions of {per_partition} records; partition 0 offset {poison_at} always fails; one "
                f"group retries forever, the other {policy.attempts} times and then dead-letters")
    for partition in (0, 1):
        values = [POISON if partition == 0 and index == poison_at else f"order-{partition}-{index}"
                  for index in range(per_partition)]
        produce(context.bootstrap, topic, values, partition=partition, acks=1)
    wait_for(lambda: _group_lag(context.bootstrap, capped) == {0: 0, 1: 0}, 30,
             "the DLQ group to drain both partitions")
    drained = _group_lag(context.bootstrap, capped)
    time.sleep(blocked_s)
    blocked = _group_lag(context.bootstrap, forever)
    attempts = sum(started.attempts for started in retrying_forever)
    for started in retrying_forever + with_dlq:
        started.stop()
    context.say(f"  retrying forever: after {blocked_s:.0f} s more the lag is {blocked}; the poison was "
                f"tried {attempts - per_partition - poison_at} times")
    with Admin(context.bootstrap) as admin:
        depth = dlq_depth(admin, dlq_topic)
    (letter_record,) = [record for partition in (0, 1)
                        for record in read_partition(context.bootstrap, dlq_topic, partition)]
    letter = DeadLetter.parse(letter_record)
    context.say(f"  with {policy.attempts} attempts and a dead-letter topic: lag {drained}, "
                f"DLQ depth {depth}")
    result.measures += [
        Measure("lag of the poisoned partition, retrying forever", per_partition - poison_at,
                Band.exactly(per_partition - poison_at), blocked.get(0),
                how="everything from the poison on waits"),
        Measure("lag of the other partition, retrying forever", 0, Band.exactly(0), blocked.get(1)),
        Measure("lag of the poisoned partition, with a DLQ", 0, Band.exactly(0), drained.get(0)),
        Measure("dead-letter topic depth", 1, Band.exactly(1), depth),
        Measure("attempts recorded on the dead letter", policy.attempts, Band.exactly(policy.attempts),
                letter.attempts),
    ]
    result.facts.append(f"The dead letter names its source: {letter.source_topic}/{letter.source_partition}"
                        f"@{letter.source_offset}, reason {letter.reason}, last error {letter.last_error}.")
    result.plots.append(Plot("lag after the poison message", "", "messages behind", kind="bar",
                             categories=["p0, retry forever", "p1, retry forever", "p0, DLQ", "p1, DLQ",
                                         "DLQ depth"],
                             series=[Series("messages", [(0, blocked.get(0, 0)), (1, blocked.get(1, 0)),
                                                         (2, drained.get(0, 0)), (3, drained.get(1, 0)),
                                                         (4, depth)], COLORS[4])]))


# --------------------------------------------------------------------------- lab 11


def _distinct(member: Any) -> set[tuple[int, int]]:
    with member.lock:
        return {(partition, offset) for _, partition, offset, _ in member.handled}


def queue_and_pubsub(context: LabContext, result: LabResult) -> None:
    records, partitions = (150, 3) if context.quick else (300, 3)
    topic = context.topic("events", partitions=partitions)
    context.say(f"{records} records on {partitions} partitions; one group of 2 members, three groups of 1, "
                "then a group that arrives afterwards")
    _, workers = start_group(context, topic, 2, 0, partitions=partitions, prefix="worker")
    readers = {name: start_group(context, topic, 1, 0, partitions=partitions, prefix=name)[1][0]
               for name in ("billing", "audit", "search")}
    produce(context.bootstrap, topic, [f"event-{index}" for index in range(records)],
            keys=[f"user-{index % 50}" for index in range(records)], acks=1)
    everyone = workers + list(readers.values())
    wait_for(lambda: len(_distinct(workers[0]) | _distinct(workers[1])) >= records
             and all(len(_distinct(reader)) >= records for reader in readers.values()), 30,
             "every group to read it all")
    shared = [_distinct(worker) for worker in workers]
    stop_all(everyone)
    _, (late,) = start_group(context, topic, 1, 0, partitions=partitions, prefix="replay")
    wait_for(lambda: len(_distinct(late)) >= records, 30, "the late group to replay history")
    replayed = _distinct(late)
    stop_all([late])
    result.measures += [
        Measure("records read by the queue group (once each)", records, Band.exactly(records),
                len(shared[0] | shared[1])),
        Measure("records both queue members read", 0, Band.exactly(0), len(shared[0] & shared[1])),
        Measure("queue members that did work", 2, Band.exactly(2), sum(1 for part in shared if part)),
    ] + [Measure(f"records read by group {name}", records, Band.exactly(records), len(_distinct(reader)))
         for name, reader in readers.items()] + [
        Measure("records a late group replays from the start", records, Band.exactly(records), len(replayed))]
    result.facts.append(f"The queue group split the work {len(shared[0])} / {len(shared[1])}; every other "
                        "group got its own copy of everything, and the log still held it all for the group "
                        "that came later.")
    result.plots.append(Plot("who read what from one log", "", "records", kind="bar",
                             categories=["worker 0", "worker 1", "billing", "audit", "search", "late group"],
                             series=[Series("records", [(0, len(shared[0])), (1, len(shared[1]))]
                                            + [(2 + index, len(_distinct(reader)))
                                               for index, reader in enumerate(readers.values())]
                                            + [(5, len(replayed))], COLORS[1])]))


# --------------------------------------------------------------------------- lab 13


def slow_share_member(bootstrap: str, group: str, topic: str, records: int, visibility_ms: int,
                      pipe: Any) -> None:
    """A share-group member in a process of its own: it acquires, reports what it holds, and
    waits (the parent freezes it with SIGSTOP, as a long pause or a stuck host would); woken,
    it acknowledges its records late and reports each answer."""
    from chaos.workload import exit_when_parent_dies

    exit_when_parent_dies()
    consumer = ShareConsumer(bootstrap, group, visibility_timeout_ms=visibility_ms, client_id="lab-slow",
                             max_poll_records=records, session_timeout_ms=30_000, heartbeat_interval_ms=1000)
    consumer.subscribe([topic])
    held: list[Any] = []
    while not held:
        held = consumer.poll(500)
    pipe.send([(record.offset, record.delivery_count, record.lock_deadline_ms) for record in held])
    pipe.recv()  # sent after the parent resumed this process
    answers = consumer.commit(timeout_s=10)
    pipe.send(sorted(code for code in answers.values()))
    consumer.close()


def visibility_timeout(context: LabContext, result: LabResult) -> None:
    records, visibility_ms = 10, 1000
    held_s = 1.8 if context.quick else 2.5
    topic = context.topic("jobs")
    produce(context.bootstrap, topic, [f"job-{index}" for index in range(records)], partition=0, acks=1)
    group = context.name("share")
    context.say(f"{records} jobs, a share group with a {visibility_ms} ms visibility timeout; the slow "
                f"member stops answering (SIGSTOP) for {held_s:.1f} s after it acquired them")
    context_ = process_context()
    ours, theirs = context_.Pipe()
    slow = context_.Process(target=slow_share_member, name="lab-slow-member", daemon=True,
                            args=(context.bootstrap, group, topic, records, visibility_ms, theirs))
    slow.start()
    context.on_cleanup(lambda: (os.kill(slow.pid, signal.SIGCONT) if slow.is_alive() else None, slow.kill(),
                                slow.join(5)))
    if not ours.poll(30):
        raise RuntimeError("the slow member acquired nothing in 30 s")
    held = ours.recv()
    os.kill(slow.pid, signal.SIGSTOP)
    fast = ShareConsumer(context.bootstrap, group, visibility_timeout_ms=visibility_ms, client_id="lab-fast",
                         max_poll_records=records)
    context.on_cleanup(fast.close)
    fast.subscribe([topic])
    received: dict[int, tuple[int, int]] = {}  # offset -> (delivery count, wall ms when received)
    deadline = time.monotonic() + held_s
    while time.monotonic() < deadline or (len(received) < records and time.monotonic() < deadline + 10):
        for record in fast.poll(100):
            received[record.offset] = (record.delivery_count, time.time_ns() // 1_000_000)
    fast.commit(timeout_s=10)
    os.kill(slow.pid, signal.SIGCONT)
    ours.send("answer now")
    late = ours.recv() if ours.poll(20) else []
    slow.join(10)
    refused = sum(1 for code in late if code)
    acquired_ms = min(deadline_ms for _, _, deadline_ms in held) - visibility_ms
    redelivered = [offset for offset, _, _ in held if received.get(offset, (0, 0))[0] == 2]
    waits = [received[offset][1] - acquired_ms for offset in redelivered]
    context.say(f"  the slow member held {len(held)}; the other got {len(redelivered)} of them again "
                f"(delivery count 2) {min(waits, default=0)} ms after they were first taken; the slow "
                f"member's late answers: {refused} of {len(late)} refused")
    result.measures += [
        Measure("held records redelivered to the other member", len(held), Band.exactly(len(held)),
                len(redelivered)),
        Measure("late acknowledgements refused", len(held), Band.exactly(len(held)), refused),
        Measure("wait before redelivery (ms)", visibility_ms,
                Band(visibility_ms * 0.95, visibility_ms + 2500),
                min(waits) if waits else None, how="the lock lasts the visibility timeout"),
        Measure("jobs accepted in the end", records, Band.exactly(records), len(received)),
    ]
    result.facts.append("The slow member's work was not lost and not done only once: it was handed to "
                        "another member (delivery count 2) and the slow member's answer, when it came, "
                        "changed nothing.")
    result.plots.append(Plot("when each held job came back", "offset", "ms after the slow member took it",
                             series=[Series("redelivered", [(offset, received[offset][1] - acquired_ms)
                                                            for offset in redelivered], COLORS[0]),
                                     Series("visibility timeout",
                                            [(0, visibility_ms), (records - 1, visibility_ms)],
                                            COLORS[4], dashed=True)]))


# --------------------------------------------------------------------------- lab 14


def backpressure(context: LabContext, result: LabResult) -> None:
    buffer_bytes, block_ms, value_bytes = 64 * 1024, 500, 1000
    topic = context.topic("ingest")
    leader = context.cluster.leader_of(topic, 0)
    size = RECORD_OVERHEAD_BYTES + value_bytes + 1
    expected = buffer_bytes // size
    producer = Producer(context.bootstrap, acks=1, buffer_bytes_max=buffer_bytes, max_block_ms=block_ms,
                        request_timeout_ms=30_000, delivery_timeout_ms=60_000, client_id="lab-bounded")
    context.on_cleanup(lambda: producer.close(timeout=5))
    producer.partitions_for(topic)
    context.say(f"a producer with a {buffer_bytes // 1024} KiB buffer, max_block_ms {block_ms}; its leader "
                f"stops answering (SIGSTOP); records of {size} bytes")
    context.cluster.pause(leader)
    resumed = [False]

    def resume() -> None:
        if not resumed[0]:
            resumed[0] = True
            context.cluster.resume(leader)
    context.on_cleanup(resume)
    accepted, refusal, blocked_s, futures = 0, "", 0.0, []
    curve = []
    while accepted < 10 * expected:
        started = time.monotonic()
        try:
            futures.append(producer.send(topic, "x" * value_bytes, key="k"))
        except BufferFull as error:
            blocked_s, refusal = time.monotonic() - started, f"{type(error).__name__}: {error.name}"
            break
        accepted += 1
        curve.append((accepted, accepted * size / 1024))
    resume()
    delivered = sum(1 for future in futures if future.exception(60) is None)
    stored = len(read_partition(context.bootstrap, topic, 0))
    context.say(f"  accepted {accepted} sends, then {refusal or 'no refusal'} after {blocked_s:.2f} s; "
                f"{delivered} delivered once the leader answered again")
    result.measures += [
        Measure("sends accepted before the refusal", expected, Band.exactly(expected), accepted,
                how=f"⌊{buffer_bytes} B buffer ÷ {size} B per record⌋"),
        Measure("refused with BufferFull (1 = yes)", 1, Band.exactly(1),
                1 if refusal.startswith("BufferFull") else 0),
        Measure("time the refused send waited (s)", block_ms / 1000,
                Band(block_ms / 1000 * 0.95, block_ms / 1000 + 1.0),
                blocked_s, how="max_block_ms"),
        Measure("accepted sends delivered after the leader came back", expected, Band.exactly(expected),
                stored),
    ]
    result.facts.append(f"The refusal is immediate news at the edge ({refusal}); an unbounded buffer would "
                        "have kept accepting until the process ran out of memory, long after anyone could "
                        "react.")
    result.plots.append(Plot("producer buffer while the leader does not answer", "sends", "KiB buffered",
                             marks=[(accepted + 1,
                                     f"send {accepted + 1}: BufferFull after {blocked_s * 1000:.0f} ms")],
                             series=[Series("buffered", curve, COLORS[1]),
                                     Series("buffer_bytes_max", [(0, buffer_bytes / 1024),
                                                                 (max(accepted, 1), buffer_bytes / 1024)],
                                            COLORS[4], dashed=True)]))


LABS = [
    Lab(4, "poison-message", "a poison message blocks its partition; a dead-letter queue lets it drain",
        ARTICLE_QUESTIONS,
        "\"A message that fails deterministically and gets redelivered forever will block an ordered "
        "partition indefinitely. This is what a dead-letter queue is for: after N attempts, move it aside so "
        "the rest can drain, and alert on the DLQ depth.\"", poison_message,
        "lag stuck at the poison without a DLQ; 0 with one, DLQ depth 1, the attempts on the letter"),
    Lab(11, "queue-and-pubsub", "queue and pub/sub from one log", ARTICLE_GUIDE,
        "\"Keep messages in a log, and let each group of consumers read it with its own offset. One group "
        "gives queue behaviour. Several groups give pub/sub.\" And \"a new group can also start from the "
        "oldest message and replay history.\"", queue_and_pubsub,
        "the queue group reads each record once, split between members; every other group reads everything"),
    Lab(13, "visibility-timeout",
        "a member that stops answering loses its records after the visibility timeout",
        ARTICLE_QUESTIONS,
        "\"The message was never acknowledged. After a visibility timeout, the broker redelivers it to "
        "another consumer. That is correct behaviour, not a bug — and it is why the default delivery "
        "guarantee is at-least-once: the work may run twice.\"", visibility_timeout,
        "delivery count 2 on every held record, no earlier than the timeout; the late answers refused"),
    Lab(14, "backpressure", "a bounded producer buffer refuses instead of growing", ARTICLE_QUESTIONS,
        "\"If arrival genuinely exceeds any reasonable processing capacity, you need backpressure: reject or "
        "shed at the edge ... An unbounded queue is not a solution to overload; it is a decision to fail "
        "later and less visibly.\"", backpressure,
        "sends accepted = buffer ÷ record size, then BufferFull after max_block_ms; nothing accepted is "
        "lost"),
]
