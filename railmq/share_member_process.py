"""One share-group member as a process: poll, hand each record to a handler, answer it.

`run_share_member(options) -> exit code` is what `railmq consume TOPIC --share-group G --handler
module:function --visibility-timeout 30s --max-attempts 5` runs, and what tests start in a thread
or a process of their own. Each record gets its own answer (KIP-932 share groups):

- the handler returns normally: accept (the record is done);
- the handler raises: release, with the exception's text as the record's last error, after
  `release_delay_ms` if set; the record is delivered again, its delivery count grows, and at
  `max_delivery_attempts` the coordinator moves it to the dead-letter topic with that error in
  its `railmq.dlq.last_error` header. The member keeps going: a poison record never stops it.

With no handler each record is printed and accepted. The answers of one polled batch are sent
and confirmed (`ShareConsumer.commit`) before the next poll; an answer refused because the lock
had expired (the record went to someone else) is reported, not fatal. SIGINT and SIGTERM stop
the loop: records polled but not handled yet are released, the rest confirmed, and the member
leaves the group (exit 0).

Durations on the command line (`30s`, `500ms`, `2m`, `1h`) parse with `parse_duration_ms`.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from typing import Any, Callable, TextIO

import msgspec

from actors.errors import ErrorCode, RailmqError, error_name
from railmq.admin import Admin
from railmq.cli_common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, print_error, render_record
from railmq.member_process import StopSignal, load_handler
from railmq.share_consumer import ShareConsumer, ShareRecord

# Poll wake-ups are this far apart at most, so a stop signal is acted on within this time.
POLL_TIMEOUT_MS = 200
HEARTBEATS_PER_SESSION = 3
# Refused answers of one batch printed one per line; beyond this, a count (a coordinator restart
# can refuse a whole batch at once).
REFUSALS_SHOWN_MAX = 5
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_duration_ms(text: str) -> int:
    """`500ms`, `30s`, `2m` or `1h` in milliseconds; ValueError for anything else (a bare number
    is refused: seconds and milliseconds are too easy to confuse)."""
    match = _DURATION.match(str(text))
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 500ms, 30s, 2m or 1h")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


class ShareMemberOptions(msgspec.Struct, kw_only=True):
    bootstrap: str
    group_id: str
    topics: list[str]
    handler: Any = None  # a callable taking a ShareRecord, or "module:function"; None prints records
    visibility_timeout_ms: int = 30_000
    max_delivery_attempts: int = 5
    dead_letter_topic: str | None = None  # None: "<topic>.dlq"
    auto_offset_reset: str = "earliest"  # where a new group starts: "earliest" (a queue's backlog) | "latest"
    release_delay_ms: int = 0  # a failed record is not redelivered before this (backoff)
    max_poll_records: int = 500  # records handled per batch; the member holds at most twice this
    max_messages: int | None = None  # stop after handling this many records
    idle_timeout_ms: int | None = None  # stop after this long without a record
    output_json: bool = False
    session_timeout_ms: int = 10_000
    request_timeout_ms: int = 10_000
    client_id: str = "railmq-share-member"


def check_options(options: ShareMemberOptions) -> Callable[[ShareRecord], Any] | None:
    """The handler to call (None: print), or ValueError for options that cannot work."""
    if not options.topics:
        raise ValueError("a share-group member subscribes to at least one topic")
    if options.max_delivery_attempts < 1:
        raise ValueError("--max-attempts must be at least 1")
    if options.release_delay_ms < 0:
        raise ValueError("the release delay is not negative")
    if options.max_messages is not None and options.max_messages <= 0:
        raise ValueError("max_messages must be positive")
    if options.max_poll_records <= 0:
        raise ValueError("max_poll_records must be positive")
    if options.auto_offset_reset not in ("earliest", "latest"):
        raise ValueError(f"auto_offset_reset must be earliest or latest, not {options.auto_offset_reset!r}")
    if isinstance(options.handler, str):
        return load_handler(options.handler)
    if options.handler is not None and not callable(options.handler):
        raise ValueError(f"the handler must be callable, not {type(options.handler).__name__}")
    return options.handler


def run_share_member(options: ShareMemberOptions, *, stop: threading.Event | None = None,
                     output: TextIO | None = None) -> int:
    """Run one share-group member until stopped, max_messages or idle; returns the exit code."""
    try:
        handler = check_options(options)
    except ValueError as error:
        print(f"railmq consume: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    with StopSignal(stop) as stopping:
        try:
            return ShareMemberLoop(options, handler, stopping, output or sys.stdout).run()
        except RailmqError as error:
            print_error(error.name, str(error).removeprefix(f"{error.name}: "))
            return EXIT_FAILED


class ShareMemberLoop:
    """poll -> handle each record -> answer it -> confirm the batch's answers."""

    def __init__(self, options: ShareMemberOptions, handler: Callable[[ShareRecord], Any] | None,
                 stopping: threading.Event, output: TextIO) -> None:
        self.options = options
        self.handler = handler
        self.stopping = stopping
        self.output = output
        self.handled = 0
        self.consumer: ShareConsumer | None = None

    def run(self) -> int:
        with Admin(self.options.bootstrap, timeout_ms=self.options.request_timeout_ms) as admin:
            for topic in self.options.topics:
                admin.describe_topic(topic)
        self.consumer = self._open_consumer()
        try:
            self.consumer.subscribe(self.options.topics)
            self._loop()
        finally:
            self.consumer.close()
        return EXIT_OK

    def _open_consumer(self) -> ShareConsumer:
        options = self.options
        return ShareConsumer(
            options.bootstrap, options.group_id, visibility_timeout_ms=options.visibility_timeout_ms,
            max_delivery_attempts=options.max_delivery_attempts, dead_letter_topic=options.dead_letter_topic,
            max_poll_records=min(options.max_poll_records, options.max_messages or options.max_poll_records),
            session_timeout_ms=options.session_timeout_ms,
            heartbeat_interval_ms=max(1, options.session_timeout_ms // HEARTBEATS_PER_SESSION),
            client_id=options.client_id, request_timeout_ms=options.request_timeout_ms,
            auto_offset_reset=options.auto_offset_reset)

    def _loop(self) -> None:
        idle_timeout_s = None if self.options.idle_timeout_ms is None else self.options.idle_timeout_ms / 1000
        last_record = time.monotonic()
        while not self.stopping.is_set() and not self._enough():
            records = self.consumer.poll(POLL_TIMEOUT_MS)
            if records:
                last_record = time.monotonic()
                self._handle_batch(records)
            elif idle_timeout_s is not None and time.monotonic() - last_record >= idle_timeout_s:
                return

    def _enough(self) -> bool:
        return self.options.max_messages is not None and self.handled >= self.options.max_messages

    def _handle_batch(self, records: list[ShareRecord]) -> None:
        for index, record in enumerate(records):
            if self.stopping.is_set() or self._enough():
                for unhandled in records[index:]:
                    self._answer(unhandled, "release")  # not handled: someone else's to take
                break
            self._handle(record)
        self._confirm()

    def _handle(self, record: ShareRecord) -> None:
        try:
            if self.handler is None:
                self.output.write(render_record(record, self.options.output_json) + "\n")
                self.output.flush()
            else:
                self.handler(record)
        except Exception as error:  # the user's handler: any failure means "deliver it again"
            text = f"{type(error).__name__}: {error}"
            self._answer(record, "release", delay_ms=self.options.release_delay_ms, error=text)
            print(f"warning: the handler failed on {record.topic}/{record.partition}@{record.offset} (delivery "
                  f"{record.delivery_count} of {self.options.max_delivery_attempts}): {text}; released",
                  file=sys.stderr)
        else:
            self._answer(record, "accept")

    def _answer(self, record: ShareRecord, kind: str, **options: Any) -> None:
        """Acknowledge a record; one this member no longer holds (its lock or its membership was
        lost meanwhile: the group coordinator failed over, a session ended) is not an error of the
        loop — the record is delivered again, to whoever holds it next."""
        try:
            self.consumer.acknowledge(record, kind, **options)
        except RailmqError as error:
            if error.code != ErrorCode.INVALID_RECORD_STATE:
                raise
            print(f"warning: {record.topic}/{record.partition}@{record.offset} is no longer held by this member "
                  "(its lock was lost); it will be delivered again", file=sys.stderr)
        self.handled += 1

    def _confirm(self) -> None:
        try:
            outcomes = self.consumer.commit()
        except RailmqError as error:
            if not error.retriable:
                raise
            print(f"warning: answers not confirmed ({error}); unconfirmed records will be delivered again",
                  file=sys.stderr)
            return
        refused = [(key, code) for key, code in sorted(outcomes.items()) if code]
        for (topic, partition, offset), code in refused[:REFUSALS_SHOWN_MAX]:
            why = "its lock had expired" if code == ErrorCode.INVALID_RECORD_STATE else "not confirmed"
            print(f"warning: the answer for {topic}/{partition}@{offset} was refused ({error_name(code)}): "
                  f"{why}; it will be delivered again", file=sys.stderr)
        if len(refused) > REFUSALS_SHOWN_MAX:
            print(f"warning: {len(refused) - REFUSALS_SHOWN_MAX} more answers of this batch were refused",
                  file=sys.stderr)
