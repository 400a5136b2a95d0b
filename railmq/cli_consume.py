"""`railmq consume`: print records, or run a consumer-group or share-group member.

Without a group the command assigns partitions itself (all, or the `-p`s given) and prints records
from where `-o/--offset` says (kcat's and rpk's forms, railmq/cli_offsets.py; default: the end,
as Kafka's console consumer does, or the beginning with `--from-beginning`). An offset outside a
partition's log is an error naming the partition's range, never a silent reset. It stops on
Ctrl-C/SIGTERM (exit 0), at the end of every partition with `-e`, after `-c N` records, or after
`--timeout-ms` with nothing new, and says on stderr where it reads and how it will stop.

With `-g/--group` it becomes a group member (railmq/member_process.py): it starts at the group's
committed offsets, or where `--reset` (or `--from-beginning`) says when the group has none.
With `--share-group` it is a share-group member (railmq/share_member_process.py).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Callable

from actors.errors import ErrorCode, RailmqError
from railmq.admin import Admin
from railmq.cli_common import (
    EXIT_OK, UsageError, add_cluster_arguments, milliseconds, non_negative_int, positive_int,
)
from railmq.cli_format import compile_format, record_renderer
from railmq.cli_offsets import StartSpec, check_in_log, describe_start, parse_start, resolve_start
from railmq.consumer import Consumer
from railmq.member_notices import Notices
from railmq.member_process import (
    ASSIGNORS, DELIVERIES, POLL_TIMEOUT_MS, MemberOptions, StopSignal, check_options, corrupt_batch_sentence,
    run_group_member,
)
from railmq.records import ConsumerRecord, CorruptBatchError, TopicPartition

GROUP_ONLY_FLAGS = ("record_handler", "per_batch", "delivery", "commit_every", "assignor",
                    "group_instance_id", "session_timeout_ms", "reset")


def register(commands: argparse._SubParsersAction) -> None:
    consume = commands.add_parser(
        "consume", help="print records, or run a consumer-group member",
        description="Print the records of TOPIC (from the end unless -o or --from-beginning says otherwise; "
                    "Ctrl-C stops, -e stops at the end), or join a group with -g and hand records to a handler.")
    consume.add_argument("topic", metavar="TOPIC", help="the topic to read")
    where = consume.add_argument_group("where to start and when to stop")
    where.add_argument("-o", "--offset", metavar="START",
                       help="beginning | end | N (offset N) | -N (N before the end) | +N (N after the "
                            "beginning) | @TIME (ms since the epoch, an ISO datetime, or -10m for ten "
                            "minutes ago); default: end")
    where.add_argument("--from-beginning", action="store_true",
                       help="start at the earliest offset (-o beginning; for a new group, --reset earliest)")
    where.add_argument("-p", "--partition", type=non_negative_int, action="append", metavar="P",
                       help="read this partition, repeatable (default: all; not with a group)")
    where.add_argument("-e", "--exit-at-end", action="store_true",
                       help="stop once every partition is read to its end (kcat's -e)")
    where.add_argument("-c", "-n", "--count", "--num", "--max-messages", dest="max_messages", type=positive_int,
                       metavar="N", help="stop after N records")
    where.add_argument("--timeout-ms", type=milliseconds, metavar="MS", help="stop after MS with nothing new")
    shown = consume.add_argument_group("output")
    shape = shown.add_mutually_exclusive_group()
    shape.add_argument("-J", "--json", action="store_true", help="one JSON object per record per line")
    shape.add_argument("-f", "--format", metavar="FORMAT",
                       help="print each record by FORMAT: %%t topic, %%p partition, %%o offset, %%k key, "
                            "%%s value, %%T timestamp, %%h headers, \\n newline (kcat's -f)")
    shown.add_argument("-q", "--quiet", action="store_true",
                       help="no notes on stderr (where it reads, group membership, retries)")
    _add_group_flags(consume)
    add_cluster_arguments(consume)
    consume.set_defaults(handler=run_consume, precheck=check_consume_usage, parser=consume)


def _add_group_flags(consume: argparse.ArgumentParser) -> None:
    group = consume.add_argument_group("consumer group member")
    group.add_argument("-g", "--group", metavar="G", help="join group G and consume what it assigns")
    group.add_argument("--reset", choices=("earliest", "latest"),
                       help="where a group with no committed offset starts (Kafka's auto.offset.reset; "
                            "default latest, --from-beginning means earliest)")
    group.add_argument("--handler", dest="record_handler", metavar="MODULE:FUNCTION",
                       help="call this per record (default: print)")
    group.add_argument("--per-batch", action="store_true", help="call the handler once per polled batch")
    group.add_argument("--delivery", choices=DELIVERIES,
                       help="commit after the handler (at-least-once, default) or before it (at-most-once)")
    group.add_argument("--commit-every", metavar="record|batch|Nms", help="how often to commit (default batch)")
    group.add_argument("--assignor", choices=ASSIGNORS, help="partition assignor (default range)")
    group.add_argument("--group-instance-id", metavar="ID", help="static membership (KIP-345)")
    group.add_argument("--session-timeout-ms", type=milliseconds, metavar="MS",
                       help="how long the group waits for a silent member before moving its partitions "
                            "(default 10000)")
    group.add_argument("--retries", type=positive_int, metavar="N",
                       help="attempts per record before it goes to the dead-letter topic <topic>.dlq "
                            "and the group commits past it (default: no retries, stop on failure)")
    group.add_argument("--retry-backoff-ms", type=milliseconds, default=100, metavar="MS",
                       help="first backoff between attempts, doubled each time")
    share = consume.add_argument_group("share-group member (per-record acknowledgement, KIP-932)")
    share.add_argument("--share-group", metavar="G", help="join share group G: many members per partition")
    share.add_argument("--visibility-timeout", metavar="DURATION", default="30s",
                       help="how long a delivered record is locked to its member, e.g. 30s, 500ms")
    share.add_argument("--max-attempts", type=positive_int, default=5, metavar="N",
                       help="deliveries before a record moves to the dead-letter topic")
    share.add_argument("--dead-letter-topic", metavar="TOPIC", help="default <topic>.dlq")


# --------------------------------------------------------------------------- dispatch


def check_consume_usage(args: argparse.Namespace) -> None:
    _check_consume_flags(args)
    if args.format is not None:
        try:
            compile_format(args.format)
        except ValueError as error:
            raise UsageError(args.parser, str(error)) from None
    try:
        if args.offset is not None:
            parse_start(args.offset, _now_ms())
        if args.share_group is not None:
            from railmq.share_member_process import parse_duration_ms

            parse_duration_ms(args.visibility_timeout)
        if args.retries:
            retry_policy(args)  # `--retries 2**63` was a ValueError traceback once the cluster answered
    except ValueError as error:
        raise UsageError(args.parser, str(error)) from None


def retry_policy(args: argparse.Namespace):
    """The RetryPolicy of `--retries` and `--retry-backoff-ms`; ValueError naming what it refuses."""
    from railmq.retry import RetryPolicy

    return RetryPolicy(attempts=args.retries, backoff_ms=args.retry_backoff_ms)


def run_consume(args: argparse.Namespace) -> int:
    check_consume_usage(args)
    if args.share_group is not None:
        return _run_share_member(args)
    if args.group is not None:
        options = member_options(args)
        try:
            check_options(options)
        except ValueError as error:
            raise UsageError(args.parser, str(error)) from None
        if args.retries:
            return _run_with_retries(args, options)
        return run_group_member(options)
    return _run_plain(args)


def _check_consume_flags(args: argparse.Namespace) -> None:
    fail = lambda sentence: UsageError(args.parser, sentence)  # noqa: E731 - one line per rule below
    if args.share_group is not None and args.group is not None:
        raise fail("a consumer is in a group (--group) or a share group (--share-group), not both")
    in_a_group = args.group is not None or args.share_group is not None
    if in_a_group and (args.partition is not None or args.offset is not None):
        raise fail("a group member gets its partitions and positions from the group: no -p or -o "
                   "(--reset or --from-beginning say where a group without commits starts)")
    if args.share_group is not None and args.exit_at_end:
        raise fail("a share group has no end to stop at: use --timeout-ms or --max-messages")
    if args.retries and args.group is None:
        raise fail("--retries is for --group members (share groups redeliver by themselves)")
    if args.offset is not None and args.from_beginning:
        raise fail("--from-beginning is -o beginning: give one of them")
    if args.reset is not None and args.from_beginning and args.reset != "earliest":
        raise fail("--from-beginning means --reset earliest")
    if args.group is None and args.share_group is None:
        given = [_flag(name) for name in GROUP_ONLY_FLAGS if getattr(args, name) not in (None, False)]
        if given:
            raise fail(f"{', '.join(given)} only make sense with --group")


def _flag(dest: str) -> str:
    return "--handler" if dest == "record_handler" else f"--{dest.replace('_', '-')}"


def member_options(args: argparse.Namespace) -> MemberOptions:
    defaults = MemberOptions(bootstrap="", group_id="", topics=[])
    return MemberOptions(
        bootstrap=args.bootstrap, group_id=args.group, topics=[args.topic], handler=args.record_handler,
        per_batch=args.per_batch, delivery=args.delivery or defaults.delivery,
        commit_every=args.commit_every or defaults.commit_every, assignor=args.assignor or defaults.assignor,
        group_instance_id=args.group_instance_id,
        session_timeout_ms=args.session_timeout_ms or defaults.session_timeout_ms,
        from_beginning=args.from_beginning or args.reset == "earliest", output_json=args.json,
        max_messages=args.max_messages, idle_timeout_ms=args.timeout_ms, request_timeout_ms=args.request_timeout_ms,
        quiet=args.quiet, exit_at_end=args.exit_at_end, output_format=args.format)


def _run_share_member(args: argparse.Namespace) -> int:
    from railmq.share_member_process import ShareMemberOptions, check_options as check_share, parse_duration_ms
    from railmq.share_member_process import run_share_member

    try:
        options = ShareMemberOptions(
            bootstrap=args.bootstrap, group_id=args.share_group, topics=[args.topic], handler=args.record_handler,
            visibility_timeout_ms=parse_duration_ms(args.visibility_timeout), max_delivery_attempts=args.max_attempts,
            dead_letter_topic=args.dead_letter_topic, max_messages=args.max_messages,
            idle_timeout_ms=args.timeout_ms, output_json=args.json, request_timeout_ms=args.request_timeout_ms,
            auto_offset_reset="earliest")  # a new share group delivers the backlog, like a queue
        check_share(options)
    except ValueError as error:
        raise UsageError(args.parser, str(error)) from None
    return run_share_member(options)


def _run_with_retries(args: argparse.Namespace, options: MemberOptions) -> int:
    from railmq.retry import DeadLetterWriter, retrying_delivery

    policy = retry_policy(args)
    with DeadLetterWriter.connect(args.bootstrap) as dead_letters:
        wrap = retrying_delivery(policy, dead_letters, args.group, say=Notices(args.quiet))
        return run_group_member(options, wrap_delivery=wrap)


# --------------------------------------------------------------------------- without a group


def _run_plain(args: argparse.Namespace) -> int:
    say = Notices(args.quiet)
    partitions = _partitions_to_read(args)
    tps = [TopicPartition(args.topic, partition) for partition in partitions]
    start = parse_start("beginning" if args.from_beginning else (args.offset or "end"), _now_ms())
    render = record_renderer(args.format, args.json, terminal=sys.stdout.isatty())
    with StopSignal() as stopping, Consumer(
            args.bootstrap, auto_offset_reset="earliest" if start.kind == "earliest" else "latest",
            request_timeout_ms=args.request_timeout_ms, client_id="railmq-cli") as consumer:
        consumer.assign(tps)
        ends = _place(consumer, tps, start) if args.offset is not None or args.exit_at_end else None
        say(_reading_line(args, tps, start))
        try:
            printed = read_until_done(consumer, args, stopping, render, ends)
        except CorruptBatchError as error:
            raise RailmqError(error.code, corrupt_batch_sentence(error)) from None
    if ends is not None and args.exit_at_end and not stopping.is_set():
        say(f"reached the end of {len(tps)} partition{'' if len(tps) == 1 else 's'} after {printed} "
            f"record{'' if printed == 1 else 's'}")
    return EXIT_OK


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _place(consumer: Consumer, tps: list[TopicPartition], start: StartSpec) -> dict[TopicPartition, int]:
    """Seek each partition to where `start` says (checked against its log); return the end offsets
    as they are now, where `-e` stops."""
    earliest = consumer.beginning_offsets(tps)
    latest = consumer.end_offsets(tps)
    at_time = consumer.offsets_for_times({tp: start.value for tp in tps}) if start.kind == "time" else {}
    for tp in tps:
        found = at_time.get(tp)
        offset = resolve_start(start, earliest[tp], latest[tp], found[0] if found else None)
        if start.kind == "offset":
            try:
                check_in_log(f"{tp.topic}/{tp.partition}", offset, earliest[tp], latest[tp])
            except ValueError as error:
                raise RailmqError(ErrorCode.OFFSET_OUT_OF_RANGE, str(error)) from None
        consumer.seek(tp, offset)
    return latest


def _reading_line(args: argparse.Namespace, tps: list[TopicPartition], start: StartSpec) -> str:
    names = ",".join(str(tp.partition) for tp in tps)
    stops = []
    if args.exit_at_end:
        stops.append("at the end")
    if args.max_messages is not None:
        stops.append(f"after {args.max_messages} records")
    if args.timeout_ms is not None:
        stops.append(f"after {args.timeout_ms} ms with nothing new")
    until = " or ".join(stops) if stops else "on Ctrl-C (-e stops at the end)"
    line = f"reading {args.topic} partition{'s' if len(tps) > 1 else ''} {names} from {describe_start(start)}; stops {until}"
    if start.kind == "latest" and args.offset is None and not args.exit_at_end:
        line += "; --from-beginning reads what is already there"
    return line


def _partitions_to_read(args: argparse.Namespace) -> list[int]:
    with Admin(args.bootstrap, timeout_ms=args.request_timeout_ms) as admin:
        count = len(admin.describe_topic(args.topic).partitions)
    if args.partition is None:
        return list(range(count))
    missing = [p for p in args.partition if p >= count]
    if missing:
        raise RailmqError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                          f"{args.topic} has partitions 0..{count - 1}, not {missing[0]}")
    return sorted(set(args.partition))


def _done(consumer: Consumer, ends: dict[TopicPartition, int]) -> bool:
    positions = consumer.positions()
    return all(positions.get(tp, -1) >= end for tp, end in ends.items())


def read_until_done(consumer: Consumer, args: argparse.Namespace, stopping: threading.Event,
                    render: Callable[[ConsumerRecord], str], ends: dict[TopicPartition, int] | None = None) -> int:
    """Print records until stopped, the end (`-e`, `ends`), `--max-messages` or `--timeout-ms`
    idle; returns the count."""
    printed = 0
    idle_since = time.monotonic()
    at_end = args.exit_at_end and ends is not None
    while not stopping.is_set():
        wanted = None if args.max_messages is None else args.max_messages - printed
        if (wanted is not None and wanted <= 0) or (at_end and _done(consumer, ends)):
            break
        records = consumer.poll(POLL_TIMEOUT_MS, max_records=wanted)
        if records:
            sys.stdout.write("".join(render(record) for record in records))
            sys.stdout.flush()
            printed += len(records)
            idle_since = time.monotonic()
        elif args.timeout_ms is not None and time.monotonic() - idle_since >= args.timeout_ms / 1000:
            break
    return printed
