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

import importlib
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, TextIO

import msgspec

from actors.errors import ErrorCode, RailmqError
from railmq.admin import Admin
from railmq.cli_common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, print_error, render_record
from railmq.cli_format import compile_format
from railmq.consumer import Consumer
from railmq.member_notices import (
    Notices, assigned_line, joined_line, left_line, lost_line, revoked_line, start_line,
)
from railmq.records import ConsumerRecord, TopicPartition

AT_LEAST_ONCE, AT_MOST_ONCE = "at-least-once", "at-most-once"
DELIVERIES = (AT_LEAST_ONCE, AT_MOST_ONCE)
ASSIGNORS = ("range", "round-robin", "cooperative-sticky")
# Poll wake-ups are this far apart at most, so a stop signal is acted on within this time.
POLL_TIMEOUT_MS = 200
# A heartbeat every third of the session: two lost heartbeats never look like a death.
HEARTBEATS_PER_SESSION = 3
# Commit refusals that mean "the group is moving": the records will be redelivered to whoever owns
# the partition next (at-least-once still holds), so the member warns and carries on.
COMMIT_REFUSALS_TO_RIDE_OUT = frozenset({
    ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID,
    ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR, ErrorCode.REQUEST_TIMED_OUT,
})

Delivery = Callable[[list[ConsumerRecord]], None]


class MemberOptions(msgspec.Struct, kw_only=True):
    bootstrap: str
    group_id: str
    topics: list[str]
    handler: str | None = None  # "module:function"; None prints the records
    per_batch: bool = False  # call the handler with each polled batch instead of each record
    delivery: str = AT_LEAST_ONCE
    commit_every: str = "batch"  # "record" | "batch" | "<N>ms"
    assignor: str = "range"
    group_instance_id: str | None = None
    session_timeout_ms: int = 10_000
    from_beginning: bool = False
    output_json: bool = False
    max_messages: int | None = None  # stop after handling this many records
    idle_timeout_ms: int | None = None  # stop after this long without a record
    request_timeout_ms: int = 10_000
    client_id: str = "railmq-member"
    quiet: bool = False  # no membership lines on stderr
    output_format: str | None = None  # printed records: a `consume -f` format (railmq/cli_format.py)
    exit_at_end: bool = False  # stop once every assigned partition is read to its end


class CommitEvery(msgspec.Struct, frozen=True):
    kind: str  # "record" | "batch" | "interval"
    interval_ms: int = 0


class HandlerFailed(Exception):
    """The user's handler raised; the member commits what it finished and stops."""


def parse_commit_every(text: str) -> CommitEvery:
    """`record`, `batch` or `<N>ms` (N > 0); ValueError otherwise."""
    if text in ("record", "batch"):
        return CommitEvery(text)
    if text.endswith("ms") and text[:-2].isdigit() and int(text[:-2]) > 0:
        return CommitEvery("interval", int(text[:-2]))
    raise ValueError(f"--commit-every must be record, batch or a duration like 500ms, not {text!r}")


def check_options(options: MemberOptions) -> None:
    """ValueError for a combination that cannot keep its promise."""
    commit_every = parse_commit_every(options.commit_every)
    if options.delivery not in DELIVERIES:
        raise ValueError(f"--delivery must be one of {', '.join(DELIVERIES)}, not {options.delivery!r}")
    if options.assignor not in ASSIGNORS:
        raise ValueError(f"--assignor must be one of {', '.join(ASSIGNORS)}, not {options.assignor!r}")
    if options.delivery == AT_MOST_ONCE and commit_every.kind == "interval":
        raise ValueError("at-most-once commits before each record or batch it handles; "
                         "a time-based --commit-every needs at-least-once")
    if not options.topics:
        raise ValueError("a group member subscribes to at least one topic")


def load_handler(spec: str) -> Callable[[Any], Any]:
    """Import `module:function`. The working directory is importable, as for `python -m`."""
    module_name, separator, function_name = spec.partition(":")
    if not separator or not module_name or not function_name:
        raise ValueError(f"--handler must look like module:function, not {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot import handler module {module_name!r}: {error}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"{module_name} has no function {function_name!r}")
    return function


def make_delivery(options: MemberOptions, output: TextIO) -> Delivery:
    """The handler as a function of a list of records (per record: called once per record)."""
    if options.handler is None:
        render = (compile_format(options.output_format) if options.output_format
                  else lambda record: render_record(record, options.output_json) + "\n")

        def print_records(records: list[ConsumerRecord]) -> None:
            output.write("".join(render(record) for record in records))
            output.flush()
        return print_records
    function = load_handler(options.handler)
    if options.per_batch:
        return function
    return lambda records: function(records[0])  # per record, a unit is always one record


class StopSignal:
    """SIGINT and SIGTERM set `event` while inside the `with` (main thread only; elsewhere the
    owner sets the event itself). The previous handlers come back on exit."""

    def __init__(self, event: threading.Event | None = None) -> None:
        self.event = event or threading.Event()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> threading.Event:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self.event

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.event.set()

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


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
        except RailmqError as error:
            print_error(error.name, str(error).removeprefix(f"{error.name}: "))
            return EXIT_FAILED


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
            self._loop()
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
        positions = self.consumer.positions()
        for record in reversed(records):
            positions[TopicPartition(record.topic, record.partition)] = record.offset
        if not all(tp in positions for tp in self.starting if tp in self.consumer.assignment()):
            return
        starts = {tp: positions[tp] for tp in self.starting if tp in positions}
        if starts:
            self.say(start_line(self.options.group_id, starts, dict(self.starting), self.reset_policy))
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
        self.say(revoked_line(self.options.group_id, partitions))

    def _on_lost(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.processed.pop(tp, None)  # no longer ours to commit: the next owner redelivers
            self.committed.pop(tp, None)
            self.starting.pop(tp, None)
        self.say(lost_line(self.options.group_id, partitions))


def _next_offsets(records: list[ConsumerRecord]) -> dict[TopicPartition, int]:
    """Per partition, the offset after the last of these records (Kafka's commit convention)."""
    offsets: dict[TopicPartition, int] = {}
    for record in records:
        tp = TopicPartition(record.topic, record.partition)
        if record.offset + 1 > offsets.get(tp, -1):
            offsets[tp] = record.offset + 1
    return offsets
