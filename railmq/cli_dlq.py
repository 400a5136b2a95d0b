"""`railmq dlq list|inspect|redrive`: dead-letter topics from the operator's chair.

Rendering only: the facts come from `railmq.dlq` (depth, `inspect`, `redrive`), so the numbers
printed here are the ones tests and other tools compute.

- `list`: every `*.dlq` topic with its depth and how many of those records the redrive group has
  not moved back yet (the log is append-only: a redriven record stays until retention); `--json`.
- `inspect TOPIC`: dead letters with their source, group, reason, attempts and last error
  (`--json`: one object per line, bytes as UTF-8 text or base64 like `railmq consume --json`).
- `redrive TOPIC`: move them back to their source topics (or `--to`), at most `--rate` a second;
  `--json` prints the result as one object.

`inspect` on a topic none of whose records is a dead letter (a source topic named by mistake) is
an error that names the topic's dead-letter topics, not a table of "not a dead letter" rows.

`dlq_warning(admin, group_topics)` gives `railmq groups describe` its dead-letter lines: the
depth of each DLQ topic of the group's topics, as a warning when it is not zero (a dead-letter
topic nobody looks at is data loss on a delay). The depth is the topic's, whichever group
dead-lettered the records.

Operating errors print `error: NAME: sentence` on stderr and exit 1, whether or not the command
runs under `railmq.cli.main` (which reports them the same way); bad flags exit 2 (argparse).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from datetime import datetime, timezone
from typing import Callable, Iterable

import msgspec
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from actors.errors import ErrorCode, RailmqError
from railmq.admin import Admin
from railmq.cli_common import (
    EXIT_FAILED, EXIT_OK, UsageError, add_cluster_arguments, non_negative_int, positive_int, print_error,
    record_to_dict,
)
from railmq.dlq import (
    DEFAULT_REDRIVE_GROUP, DLQ_SUFFIX, DeadLetter, DeadLetterTopicInfo, RedriveResult, default_dlq_topic,
    describe_dead_letter_topic, inspect, list_dead_letter_topics, redrive,
)
from railmq.cli_tables import Column, print_table
from railmq.records import ConsumerRecord
from railmq.terminal_text import cell, json_visible

INSPECT_LIMIT_DEFAULT = 20
# What `letter_to_dict` takes from `record_to_dict` of the source record: its data, encoded.
_RECORD_FIELDS = ("key", "key_encoding", "value", "value_encoding", "headers")
# A table cell shows this much of a value or an error; --json shows everything.
CELL_CHARS_MAX = 60


def register(commands: argparse._SubParsersAction) -> None:
    dlq = commands.add_parser("dlq", help="list, inspect and redrive dead-letter topics")
    actions = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every dead-letter topic (*.dlq) with its depth")
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    add_cluster_arguments(listing)
    listing.set_defaults(handler=run_list)
    reading = actions.add_parser("inspect", help="dead letters: source, group, reason, attempts, last error")
    reading.add_argument("topic", metavar="TOPIC", help="the dead-letter topic")
    reading.add_argument("--limit", type=positive_int, default=INSPECT_LIMIT_DEFAULT, metavar="N",
                         help=f"show at most N dead letters (default {INSPECT_LIMIT_DEFAULT})")
    reading.add_argument("--from-offset", type=non_negative_int, default=0, metavar="N",
                         help="start at this offset in each partition")
    reading.add_argument("--partition", type=non_negative_int, default=None, metavar="P",
                         help="only this partition")
    reading.add_argument("--json", action="store_true", help="one JSON object per dead letter")
    add_cluster_arguments(reading)
    reading.set_defaults(handler=run_inspect)
    moving = actions.add_parser("redrive", help="move dead letters back to their source at a bounded rate")
    moving.add_argument("topic", metavar="TOPIC", help="the dead-letter topic")
    moving.add_argument("--to", dest="to_topic", metavar="TOPIC",
                        help="move them here instead of to each record's source topic")
    moving.add_argument("--rate", type=positive_int, default=100, metavar="N",
                        help="at most N messages a second (default 100)")
    moving.add_argument("--max", dest="max_messages", type=positive_int, default=None, metavar="N",
                        help="stop after N messages")
    moving.add_argument("--group", default=DEFAULT_REDRIVE_GROUP, metavar="G",
                        help=f"the group that remembers how far redrives got "
                             f"(default {DEFAULT_REDRIVE_GROUP})")
    moving.add_argument("--json", action="store_true", help="print the result as JSON")
    add_cluster_arguments(moving)
    moving.set_defaults(handler=run_redrive, parser=moving, precheck=check_redrive_usage)


def reporting_errors(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn an operating error into `error: NAME: sentence` on stderr and exit code 1."""
    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except RailmqError as error:
            print_error(error.name, str(error).removeprefix(f"{error.name}: "))
        except TimeoutError as error:
            print_error(ErrorCode.REQUEST_TIMED_OUT.name, str(error))
        return EXIT_FAILED
    return run


# --------------------------------------------------------------------------- list


@reporting_errors
def run_list(args: argparse.Namespace) -> int:
    with Admin(args.bootstrap, timeout_ms=args.request_timeout_ms) as admin:
        topics = list_dead_letter_topics(admin)
    if args.json:
        print(json.dumps(msgspec.to_builtins(topics), indent=2))
        return EXIT_OK
    if not topics:
        Console().print("no dead-letter topics")
        return EXIT_OK
    print_table(Console(), DEPTH_COLUMNS, depth_rows(topics), title="dead-letter topics")
    return EXIT_OK


DEPTH_COLUMNS = [Column("topic"), Column("source"), Column("partitions", "right", optional=True),
                 Column("depth", "right"), Column("not redriven", "right")]


def depth_rows(topics: list[DeadLetterTopicInfo]) -> list[list[str]]:
    return [[info.topic, info.source_topic, str(info.partitions), f"[bold red]{info.depth}[/]" if info.depth else "0",
             str(info.pending)] for info in topics]


# --------------------------------------------------------------------------- inspect


@reporting_errors
def run_inspect(args: argparse.Namespace) -> int:
    letters = inspect(args.bootstrap, args.topic, args.limit, args.from_offset, partition=args.partition,
                      timeout_ms=args.request_timeout_ms)
    if letters and all(letter.malformed for letter in letters) and not args.topic.endswith(DLQ_SUFFIX):
        raise RailmqError(ErrorCode.INVALID_REQUEST, not_a_dlq_sentence(args))
    if args.json:
        # C1 and bidi controls, which JSON leaves raw, as \u escapes (railmq/terminal_text.py).
        lines = [json_visible(json.dumps(letter_to_dict(letter), ensure_ascii=False)) + "\n"
                 for letter in letters]
        sys.stdout.write("".join(lines))
    else:
        console = Console()
        if letters:
            print_table(console, LETTER_COLUMNS, letter_rows(letters), title=f"dead letters in {args.topic}")
        else:
            console.print(f"no dead letters in {args.topic}")
    return EXIT_OK


def not_a_dlq_sentence(args: argparse.Namespace) -> str:
    with Admin(args.bootstrap, timeout_ms=args.request_timeout_ms) as admin:
        known = [info.topic for info in list_dead_letter_topics(admin)]
    mine = default_dlq_topic(args.topic)
    if mine in known:
        hint = f"its dead letters are in {mine}: railmq dlq inspect {mine}"
    elif known:
        hint = f"dead-letter topics: {', '.join(known)}"
    else:
        hint = "no dead-letter topic exists yet"
    return f"{args.topic} is not a dead-letter topic (none of its records carries railmq.dlq.* headers); {hint}"


def letter_to_dict(letter: DeadLetter) -> dict:
    """The dead letter as JSON-ready data: where it is, why it is there, and the source record
    (key, value and headers encoded as `railmq consume --json` encodes them)."""
    source = ConsumerRecord(timestamp_ms=letter.source_timestamp_ms, key=letter.key, value=letter.value,
                            headers=letter.headers)
    record = record_to_dict(source)
    return {
        "topic": letter.topic, "partition": letter.partition, "offset": letter.offset,
        "source_topic": letter.source_topic, "source_partition": letter.source_partition,
        "source_offset": letter.source_offset, "group": letter.group, "reason": letter.reason,
        "attempts": letter.attempts, "last_error": letter.last_error,
        "source_timestamp_ms": letter.source_timestamp_ms, "first_delivery_ms": letter.first_delivery_ms,
        "dead_lettered_ms": letter.dead_lettered_ms, "malformed": letter.malformed,
        **{name: value for name, value in record.items() if name in _RECORD_FIELDS},
    }


LETTER_COLUMNS = [Column("at"), Column("source"), Column("group", optional=True), Column("reason"),
                  Column("attempts", "right"), Column("last error"), Column("dead-lettered", optional=True),
                  Column("key", optional=True), Column("value", optional=True)]


def letter_rows(letters: list[DeadLetter]) -> list[list[str]]:
    """Every text of a dead letter is a client's (its headers are whatever the producer to the
    dead-letter topic wrote): each goes through `cell`, never a terminal control nor markup."""
    rows = []
    for letter in letters:
        if letter.malformed:
            source, reason = "-", f"[bold red]not a dead letter: {cell(_cut(letter.malformed))}[/]"
        else:
            source = f"{letter.source_topic}/{letter.source_partition}@{letter.source_offset}"
            reason = cell(letter.reason)
        attempts = str(letter.attempts) if letter.attempts >= 0 else "-"
        rows.append([f"{letter.partition}@{letter.offset}", cell(source), cell(letter.group or "-"), reason,
                     attempts, cell(_cut(letter.last_error) or "-"), _when(letter.dead_lettered_ms),
                     cell(_shown(letter.key)), cell(_shown(letter.value))])
    return rows


def _when(timestamp_ms: int) -> str:
    if timestamp_ms < 0:
        return "-"
    moment = datetime.fromtimestamp(timestamp_ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _shown(data: bytes | None) -> str:
    if data is None:
        return "null"
    try:
        return _cut(data.decode("utf-8"))
    except UnicodeDecodeError:
        return f"<{len(data)} bytes>"


def _cut(text: str) -> str:
    return text if len(text) <= CELL_CHARS_MAX else text[:CELL_CHARS_MAX] + "…"


# --------------------------------------------------------------------------- redrive


def check_redrive_usage(args: argparse.Namespace) -> None:
    if args.to_topic == args.topic:
        raise UsageError(args.parser,
                         "--to names the dead-letter topic itself; records would go round in circles")


@reporting_errors
def run_redrive(args: argparse.Namespace) -> int:
    check_redrive_usage(args)
    progress = Progress(console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty())
    with progress:
        task = progress.add_task(f"redriving {args.topic}", total=None)

        def show(moved: int, remaining: int) -> None:
            progress.update(task, completed=moved, total=moved + remaining)
        result = redrive(args.bootstrap, args.topic, to_topic=args.to_topic, rate_per_s=args.rate,
                         max_messages=args.max_messages, group=args.group,
                         request_timeout_ms=args.request_timeout_ms, on_progress=show)
    if args.json:
        print(json.dumps(msgspec.to_builtins(result), indent=2))
        return EXIT_OK
    console = Console()
    console.print(redrive_summary(result))
    if result.by_destination:
        console.print(destination_table(result))
    return EXIT_OK


def redrive_summary(result: RedriveResult) -> str:
    stopped = "nothing left from when it started" if result.stopped == "caught-up" else "--max reached"
    return (f"redrive of {result.dlq_topic}: {result.moved} moved, {result.remaining} left "
            f"({stopped}; {result.elapsed_s:.1f} s)")


def destination_table(result: RedriveResult) -> Table:
    table = Table(title_justify="left")
    table.add_column("destination")
    table.add_column("messages", justify="right")
    for topic, count in sorted(result.by_destination.items()):
        table.add_row(topic, str(count))
    return table


# --------------------------------------------------------------------------- groups describe


def dead_letter_topics_of(admin: Admin, source_topics: Iterable[str]) -> list[DeadLetterTopicInfo]:
    """The DLQ topics (those that exist) of these source topics, with their depth."""
    existing = set(admin.list_topics())
    names = sorted({default_dlq_topic(topic) for topic in source_topics} & existing)
    return [describe_dead_letter_topic(admin, name) for name in names]


def dlq_warning(admin: Admin, group_topics: Iterable[str]) -> list[str]:
    """Lines for `railmq groups describe`: each DLQ topic of the group's topics with its depth, as
    a warning when the depth is not zero. No lines when none of the topics has a DLQ topic."""
    lines = []
    for info in dead_letter_topics_of(admin, group_topics):
        if info.depth == 0:
            lines.append(f"dead-letter topic {info.topic}: depth 0")
            continue
        lines.append(f"warning: dead-letter topic {info.topic} holds {info.depth} dead-lettered "
                     f"message{'s' if info.depth != 1 else ''} ({info.pending} not redriven); "
                     f"see `railmq dlq inspect {info.topic}`")
    return lines
