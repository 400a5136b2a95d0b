"""One consumer-group member as a process: poll, hand records to a handler, commit by a policy.

`run_group_member(options) -> exit code` is what `railmq consume --group` runs, and what tests and
the chaos harness start in a process of their own. It owns the order of three things, which is
what the delivery guarantee is made of (Kafka's consumer docs, "delivery semantics"):

- at-least-once (default): the handler runs first, then the offset after the record is committed.
  A crash between the two redelivers the record; nothing is committed past a record whose
  handler did not return. A handler exception commits what was processed before it, prints the
  error and ends the member with exit code 1.
- at-most-once: the offsets are committed first, then the handler runs. A crash between the two
  loses the records; none is ever handled twice. A refused commit means the records are not
  handled at all.

`--commit-every` says how often: after each record, after each polled batch, or (at-least-once
only) at most every N ms. A commit covers every assigned partition, as Kafka's `commitSync()`
does: the ones that returned records get the offset after the last one handled, the others their
position — so a partition that got nothing during a member's life keeps its place, and records
produced to it while no member runs are read by the next one instead of being skipped by its
`auto_offset_reset`. Between batches (record and batch policies) positions that moved without a
record, such as a fresh assignment's starting offset, are committed as soon as they are known.
Revoked partitions are committed before they move (at-least-once). SIGINT and SIGTERM stop the
loop; the member commits, leaves the group and exits 0. `exit_at_end` stops it instead once it
has read to the end of every partition it was assigned (kcat's -e).

The member says what happens to it on stderr (railmq/member_notices.py): joined, assigned and
where each partition starts, revoked, lost, retrying, dead-lettered, left; `quiet` silences it.

The handler is reached only through a `Delivery` (a function of a list of records), so a retry
or dead-letter policy can wrap it: `run_group_member(options, wrap_delivery=policy)`.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TextIO

from actors.errors import RailmqError
from railmq.admin import Admin
from railmq.cli_common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, print_error
from railmq.consumer import Consumer
from railmq.member_notices import (
    Notices, assigned_line, joined_line, left_line, lost_line, revoked_line, start_line,
)
from railmq.records import ConsumerRecord, CorruptBatchError, TopicPartition

# The options and the pieces a member is built from live in railmq/member_options.py; they are
# importable from here too, where callers have always found them.
from railmq.member_options import (  # noqa: F401
    ASSIGNORS, AT_LEAST_ONCE, AT_MOST_ONCE, COMMIT_REFUSALS_TO_RIDE_OUT, DELIVERIES, HEARTBEATS_PER_SESSION,
    POLL_TIMEOUT_MS, CommitEvery, Delivery, HandlerFailed, MemberOptions, StopSignal, check_options, load_handler,
    make_delivery, parse_commit_every,
)


def run_group_member(options: MemberOptions, *, wrap_delivery: Callable[[Delivery], Delivery] | None = None,
                     stop: threading.Event | None = None, output: TextIO | None = None) -> int:
    """Run one group member until stopped, max_messages or idle; returns the process exit code."""
    try:
        check_options(options)
        delivery = make_delivery(options, output or sys.stdout)
    except ValueError as error:
        print(f"railmq consume: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if wrap_delivery is not None:
        delivery = wrap_delivery(delivery)
    with StopSignal(stop) as stopping:
        member = GroupMember(options, delivery, stopping)
        try:
            return member.run()
        except HandlerFailed as failure:
            cause = failure.__cause__
            print_error("HANDLER_FAILED", f"{failure}: {type(cause).__name__}: {cause}")
            return EXIT_FAILED
        except CorruptBatchError as error:
            print_error(error.name, corrupt_batch_sentence(error, options.group_id))
            return EXIT_FAILED
        except RailmqError as error:
            print_error(error.name, str(error).removeprefix(f"{error.name}: "))
            return EXIT_FAILED


def corrupt_batch_sentence(error: CorruptBatchError, group: str | None = None) -> str:
    """What a command-line user reads when a partition holds a batch nobody can read, and how
    they move past it on purpose (a member never skips it by itself)."""
    where = f"{error.topic}/{error.partition}: the batch at offset {error.offset} cannot be read ({error.reason})"
    if error.next_offset is None:
        return (f"{where}; its header is unreadable, so where it ends is unknown: choose a later offset "
                f"(railmq topics describe {error.topic} shows where the log ends)")
    target = error.next_offset
    if group is None:
        return f"{where}; read past it with -p {error.partition} -o {target}"
    return (f"{where}; the member stopped there. To skip it: railmq groups reset-offsets {group} --topic "
            f"{error.topic}:{error.partition} --to-offset {target} --execute (with no member running)")


class GroupMember:
    """The poll → commit → handle loop of one member; `processed` holds handled, uncommitted offsets."""

    def __init__(self, options: MemberOptions, delivery: Delivery, stopping: threading.Event,
                 notices: Notices | None = None) -> None:
        self.options = options
        self.delivery = delivery
        self.stopping = stopping
        self.say = notices or Notices(options.quiet)
        self.commit_every = parse_commit_every(options.commit_every)
        self.at_least_once = options.delivery == AT_LEAST_ONCE
        self.processed: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, int] = {}  # what this member last committed
        self.starting: dict[TopicPartition, int | None] = {}  # assigned, start not announced: committed
        self.started_at: dict[TopicPartition, int] = {}  # where those started, as soon as it is known
        self.generation = -1
        self.handled = 0
        self.last_commit = time.monotonic()
        self.consumer: Consumer | None = None

    def run(self) -> int:
        self._check_topics()
        self.consumer = self._open_consumer()
        try:
            self.consumer.subscribe(self.options.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                    on_lost=self._on_lost)
            try:
                self._loop()
            except CorruptBatchError:
                self._commit_processed()  # what was handled before the unreadable batch stays handled
                raise
            self._commit_processed()
        finally:
            self.consumer.close()
        self.say(left_line(self.options.group_id, self.handled))
        return EXIT_OK

    def _check_topics(self) -> None:
        with Admin(self.options.bootstrap, timeout_ms=self.options.request_timeout_ms) as admin:
            for topic in self.options.topics:
                admin.describe_topic(topic)

    def _open_consumer(self) -> Consumer:
        options = self.options
        return Consumer(
            options.bootstrap, group_id=options.group_id, client_id=options.client_id,
            auto_offset_reset=self.reset_policy, request_timeout_ms=options.request_timeout_ms,
            enable_auto_commit=False, assignor=options.assignor,
            group_instance_id=options.group_instance_id, session_timeout_ms=options.session_timeout_ms,
            heartbeat_interval_ms=max(1, options.session_timeout_ms // HEARTBEATS_PER_SESSION))

    @property
    def reset_policy(self) -> str:
        return "earliest" if self.options.from_beginning else "latest"

    def _loop(self) -> None:
        options = self.options
        idle_timeout_s = None if options.idle_timeout_ms is None else options.idle_timeout_ms / 1000
        commit_interval_s = self.commit_every.interval_ms / 1000
        last_record = time.monotonic()
        while not self.stopping.is_set():
            remaining = None if options.max_messages is None else options.max_messages - self.handled
            if remaining is not None and remaining <= 0:
                return
            records = self.consumer.poll(POLL_TIMEOUT_MS, max_records=remaining)
            self._announce_starts(records)
            if records:
                last_record = time.monotonic()
                self._handle_batch(records)
            elif idle_timeout_s is not None and time.monotonic() - last_record >= idle_timeout_s:
                return
            elif self.commit_every.kind != "interval":
                self._commit_moved_positions()
            if not records and options.exit_at_end and self._at_end():
                return
            interval_passed = time.monotonic() - self.last_commit >= commit_interval_s
            if self.commit_every.kind == "interval" and interval_passed:
                self._commit_processed()

    def _at_end(self) -> bool:
        """Every assigned partition read to its high watermark (an empty assignment is not an end)."""
        positions = self.consumer.positions()
        assigned = self.consumer.assignment()
        if not assigned or len(positions) < len(assigned):
            return False
        ends = self.consumer.end_offsets(assigned)
        return all(positions[tp] >= ends[tp] for tp in assigned)

    # ------------------------------------------------------------------ handling

    def _handle_batch(self, records: list[ConsumerRecord]) -> None:
        units = [records] if self.options.per_batch else [[record] for record in records]
        commit_first = not self.at_least_once and self.commit_every.kind == "batch"
        if commit_first and not self._commit(_next_offsets(records)):
            self._rewind(records)  # at-most-once: refused commit, so nothing of this batch may be handled
            return
        for index, unit in enumerate(units):
            if not self._handle_unit(unit):
                self._rewind([record for later in units[index:] for record in later])
                return
        if self.at_least_once and self.commit_every.kind == "batch":
            self._commit_processed()

    def _rewind(self, unhandled: list[ConsumerRecord]) -> None:
        """Move positions back to records that were polled but not handled, so that no later
        commit of positions passes them (they stay for whoever owns the partition next)."""
        first: dict[TopicPartition, int] = {}
        for record in unhandled:
            first.setdefault(TopicPartition(record.topic, record.partition), record.offset)
        for tp, offset in first.items():
            try:
                self.consumer.seek(tp, offset)
            except RailmqError:
                pass  # no longer assigned: nothing of this member commits it any more

    def _handle_unit(self, unit: list[ConsumerRecord]) -> bool:
        """Handle one unit; False when at-most-once could not commit it first (not handled)."""
        per_record_commit = self.commit_every.kind == "record"
        if not self.at_least_once and per_record_commit and not self._commit(_next_offsets(unit)):
            return False
        try:
            self.delivery(unit)
        except Exception as error:
            if self.at_least_once:
                self._commit_processed(with_positions=False)  # later records of the poll are not handled
            first = unit[0]
            where = f"{first.topic}/{first.partition}@{first.offset}"
            raise HandlerFailed(f"the handler failed on {where}") from error
        self.handled += len(unit)
        if self.at_least_once:
            self.processed.update(_next_offsets(unit))
            if per_record_commit:
                self._commit_processed(with_positions=False)
        return True

    # ------------------------------------------------------------------ committing

    def _commit_processed(self, with_positions: bool = True) -> None:
        """Commit the handled offsets and, between batches, the position of every other assigned
        partition (everything poll returned is handled then, so a position skips nothing)."""
        offsets = {**self._moved_positions(), **self.processed} if with_positions else dict(self.processed)
        if offsets and self._commit(offsets):
            for tp, offset in list(self.processed.items()):
                if self.processed.get(tp) == offset:
                    del self.processed[tp]
        self.last_commit = time.monotonic()

    def _moved_positions(self, partitions: list[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        positions = self.consumer.positions()
        wanted = partitions if partitions is not None else list(positions)
        return {tp: positions[tp] for tp in wanted if tp in positions and self.committed.get(tp) != positions[tp]}

    def _commit_moved_positions(self) -> None:
        """Between batches: commit positions that moved without a record (a fresh assignment's
        start), quietly — a refusal loses nothing, the next idle poll tries again."""
        moved = self._moved_positions()
        if moved:
            self._commit(moved, quiet=True)

    def _commit(self, offsets: dict[TopicPartition, int], quiet: bool = False) -> bool:
        try:
            self.consumer.commit(offsets)
        except RailmqError as error:
            if error.code not in COMMIT_REFUSALS_TO_RIDE_OUT:
                raise
            if not quiet:
                print(f"warning: commit not accepted ({error}); those records will be delivered again",
                      file=sys.stderr)
            return False
        self.committed.update(offsets)
        return True

    # ------------------------------------------------------------------ membership (inside poll)

    def _on_assign(self, partitions: list[TopicPartition]) -> None:
        group, generation = self.options.group_id, self.consumer.generation()
        if generation != self.generation:
            if self.generation < 0:
                self.say(joined_line(group, self.consumer.member_id(), generation))
            self.generation = generation
        self.say(assigned_line(group, partitions, generation))
        if not partitions:
            return
        try:
            committed = self.consumer.committed(partitions)
        except RailmqError:
            committed = {}
        for tp in partitions:
            self.starting[tp] = committed.get(tp)
            if committed.get(tp) is not None:
                self.committed[tp] = committed[tp]

    def _announce_starts(self, records: list[ConsumerRecord]) -> None:
        """Say where newly assigned partitions start, once their positions are known (a partition
        that returned records in this poll started at its first one)."""
        if not self.starting:
            return
        first_returned = {}
        for record in reversed(records):
            first_returned[TopicPartition(record.topic, record.partition)] = record.offset
        positions = self.consumer.positions()
        for tp in self.starting:
            if tp not in self.started_at and (tp in first_returned or tp in positions):
                self.started_at[tp] = first_returned.get(tp, positions.get(tp))
        assigned = self.consumer.assignment()
        complete = all(tp in self.started_at for tp in self.starting if tp in assigned)
        if not complete and not records:
            return  # wait for the rest, unless records are about to be handled: say what is known now
        starts = {tp: self.started_at[tp] for tp in self.starting if tp in self.started_at}
        if starts:
            self.say(start_line(self.options.group_id, starts, dict(self.starting), self.reset_policy))
        for tp in starts:
            self.starting.pop(tp, None)
            self.started_at.pop(tp, None)
        if complete:
            self.starting.clear()

    def _on_revoke(self, partitions: list[TopicPartition]) -> None:
        revoked = {tp: self.processed.pop(tp) for tp in partitions if tp in self.processed}
        if self.at_least_once:
            revoked = {**self._moved_positions(partitions), **revoked}
        if revoked:
            self._commit(revoked)
        for tp in partitions:
            self.committed.pop(tp, None)
            self.starting.pop(tp, None)
            self.started_at.pop(tp, None)
        self.say(revoked_line(self.options.group_id, partitions))

    def _on_lost(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.processed.pop(tp, None)  # no longer ours to commit: the next owner redelivers
            self.committed.pop(tp, None)
            self.starting.pop(tp, None)
            self.started_at.pop(tp, None)
        self.say(lost_line(self.options.group_id, partitions))


def _next_offsets(records: list[ConsumerRecord]) -> dict[TopicPartition, int]:
    """Per partition, the offset after the last of these records (Kafka's commit convention)."""
    offsets: dict[TopicPartition, int] = {}
    for record in records:
        tp = TopicPartition(record.topic, record.partition)
        if record.offset + 1 > offsets.get(tp, -1):
            offsets[tp] = record.offset + 1
    return offsets
