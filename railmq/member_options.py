"""What a consumer-group member process is given: its options, its handler, its stop signal.

`MemberOptions` is everything `railmq consume --group` (or a test, or the chaos harness) sets;
`check_options` refuses a combination that cannot keep its promise; `load_handler` imports the
user's `module:function`; `make_delivery` turns the handler (or printing) into a `Delivery`, a
function of a list of records that retry and dead-letter policies can wrap; `StopSignal` turns
SIGINT and SIGTERM into an event. railmq/member_process.py runs the member with these.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from typing import Any, Callable, TextIO

import msgspec

from actors.errors import ErrorCode
from railmq.cli_format import record_renderer
from railmq.records import ConsumerRecord

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
        terminal = bool(getattr(output, "isatty", lambda: False)())  # -f escapes controls there
        render = record_renderer(options.output_format, options.output_json, terminal)

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
