"""`railmq produce` and `railmq consume`: records in and out from a terminal or a pipe.

`produce` sends values given as arguments, or one per stdin line, and prints where each landed.
Sends go out in windows of `PRODUCE_WINDOW_RECORDS` so a long pipe never buffers without bound
and its acknowledgements are printed in input order as they arrive.

`consume` without `--group` assigns partitions itself (all, or the `--partition`s given) and
prints records; with `--group` it becomes a group member (`railmq.member_process`). It stops on
Ctrl-C/SIGTERM (exit 0), after `--max-messages`, or after `--timeout-ms` with nothing new.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Iterable, Iterator

from actors.errors import ErrorCode, RailmqError
from railmq.admin import Admin
from railmq.cli_common import (
    EXIT_OK, UsageError, add_cluster_arguments, key_value, non_negative_int, positive_int, render_record,
)
from railmq.consumer import Consumer
from railmq.member_process import (
    ASSIGNORS, DELIVERIES, POLL_TIMEOUT_MS, MemberOptions, StopSignal, check_options, run_group_member,
)
from railmq.producer import Producer

# Records sent before waiting for their acknowledgements: bounds memory on an endless stdin.
PRODUCE_WINDOW_RECORDS = 1000
ACKS = {"0": 0, "1": 1, "all": "all"}
GROUP_ONLY_FLAGS = ("record_handler", "per_batch", "delivery", "commit_every", "assignor",
                    "group_instance_id", "session_timeout_ms")


def register(commands: argparse._SubParsersAction) -> None:
    _add_produce(commands)
    _add_consume(commands)


def _add_produce(commands: argparse._SubParsersAction) -> None:
    produce = commands.add_parser("produce", help="send records (arguments, or one per stdin line)")
    produce.add_argument("topic", metavar="TOPIC")
    produce.add_argument("values", nargs="*", metavar="VALUE", help="values to send; none: read stdin lines")
    produce.add_argument("--key", help="the key of every record (same key, same partition, same order)")
    produce.add_argument("--partition", type=non_negative_int, metavar="P", help="send to this partition")
    produce.add_argument("--acks", choices=sorted(ACKS), default="all", help="0, 1 or all (default all)")
    produce.add_argument("--header", type=key_value, action="append", default=[], metavar="K=V",
                         help="a header on every record, repeatable")
    produce.add_argument("--quiet", action="store_true", help="print nothing for acknowledged records")
    add_cluster_arguments(produce)
    produce.set_defaults(handler=run_produce)


def _add_consume(commands: argparse._SubParsersAction) -> None:
    consume = commands.add_parser("consume", help="print records, or run a consumer-group member")
    consume.add_argument("topic", metavar="TOPIC")
    consume.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    consume.add_argument("--partition", type=non_negative_int, action="append", metavar="P",
                         help="read this partition, repeatable (default: all; not with --group)")
    consume.add_argument("--offset", type=non_negative_int, metavar="N",
                         help="start here (with one --partition)")
    consume.add_argument("--max-messages", type=positive_int, metavar="N", help="stop after N records")
    consume.add_argument("--timeout-ms", type=positive_int, metavar="MS",
                         help="stop after MS with nothing new")
    consume.add_argument("--json", action="store_true", help="one JSON object per record per line")
    group = consume.add_argument_group("consumer group member")
    group.add_argument("--group", metavar="G", help="join group G and consume what it assigns")
    group.add_argument("--handler", dest="record_handler", metavar="MODULE:FUNCTION",
                       help="call this per record (default: print)")
    group.add_argument("--per-batch", action="store_true", help="call the handler once per polled batch")
    group.add_argument("--delivery", choices=DELIVERIES, help="commit after (default) or before the handler")
    group.add_argument("--commit-every", metavar="record|batch|Nms",
                       help="how often to commit (default batch)")
    group.add_argument("--assignor", choices=ASSIGNORS, help="partition assignor (default range)")
    group.add_argument("--group-instance-id", metavar="ID", help="static membership (KIP-345)")
    group.add_argument("--session-timeout-ms", type=positive_int, metavar="MS", help="default 10000")
    group.add_argument("--retries", type=positive_int, metavar="N",
                       help="attempts per record before it goes to the dead-letter topic <topic>.dlq "
                            "and the group commits past it (default: no retries, stop on failure)")
    group.add_argument("--retry-backoff-ms", type=positive_int, default=100, metavar="MS",
                       help="first backoff between attempts, doubled each time (default 100)")
    share = consume.add_argument_group("share-group member (per-record acknowledgement, KIP-932)")
    share.add_argument("--share-group", metavar="G", help="join share group G: many members per partition")
    share.add_argument("--visibility-timeout", metavar="DURATION", default="30s",
                       help="how long a delivered record is locked to its member, e.g. 30s, 500ms (default 30s)")
    share.add_argument("--max-attempts", type=positive_int, default=5, metavar="N",
                       help="deliveries before a record moves to the dead-letter topic (default 5)")
    share.add_argument("--dead-letter-topic", metavar="TOPIC", help="default <topic>.dlq")
    add_cluster_arguments(consume)
    consume.set_defaults(handler=run_consume, parser=consume)


# --------------------------------------------------------------------------- produce


def _values(args: argparse.Namespace) -> Iterator[str]:
    if args.values:
        yield from args.values
        return
    for line in sys.stdin:
        yield line.rstrip("\r\n")


def _windows(values: Iterable[str], size: int) -> Iterator[list[str]]:
    window: list[str] = []
    for value in values:
        window.append(value)
        if len(window) >= size:
            yield window
            window = []
    if window:
        yield window


def run_produce(args: argparse.Namespace) -> int:
    headers = [(name, value.encode()) for name, value in args.header] or None
    with Producer(args.bootstrap, acks=ACKS[args.acks], max_block_ms=args.request_timeout_ms,
                  request_timeout_ms=args.request_timeout_ms, client_id="railmq-cli") as producer:
        for window in _windows(_values(args), PRODUCE_WINDOW_RECORDS):
            futures = [producer.send(args.topic, value, key=args.key, headers=headers,
                                     partition=args.partition) for value in window]
            producer.flush(args.request_timeout_ms / 1000 * 3)
            for future in futures:
                sent = future.result(0)
                if not args.quiet:
                    offset = "-" if sent.offset < 0 else str(sent.offset)
                    print(f"partition {sent.partition} offset {offset}")
            sys.stdout.flush()
    return EXIT_OK


# --------------------------------------------------------------------------- consume


def run_consume(args: argparse.Namespace) -> int:
    _check_consume_flags(args)
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
    partitions = _partitions_to_read(args)
    with StopSignal() as stopping, Consumer(
            args.bootstrap, auto_offset_reset="earliest" if args.from_beginning else "latest",
            request_timeout_ms=args.request_timeout_ms, client_id="railmq-cli") as consumer:
        consumer.assign([(args.topic, partition) for partition in partitions])
        if args.offset is not None:
            consumer.seek((args.topic, partitions[0]), args.offset)
        read_until_done(consumer, args, stopping)
    return EXIT_OK


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
    from railmq.retry import DeadLetterWriter, RetryPolicy, retrying_delivery

    policy = RetryPolicy(attempts=args.retries, backoff_ms=args.retry_backoff_ms)
    with DeadLetterWriter.connect(args.bootstrap) as dead_letters:
        return run_group_member(options, wrap_delivery=retrying_delivery(policy, dead_letters, args.group))


def _check_consume_flags(args: argparse.Namespace) -> None:
    if args.share_group is not None and args.group is not None:
        raise UsageError(args.parser, "a consumer is in a group (--group) or a share group (--share-group), not both")
    if args.share_group is not None and (args.partition is not None or args.offset is not None):
        raise UsageError(args.parser, "a share-group member gets records from the group: no --partition or --offset")
    if args.retries and args.group is None:
        raise UsageError(args.parser, "--retries is for --group members (share groups redeliver by themselves)")
    if args.offset is not None and (args.partition is None or len(args.partition) != 1):
        raise UsageError(args.parser, "--offset needs exactly one --partition")
    if args.group is None and args.share_group is None:
        given = [_flag(name) for name in GROUP_ONLY_FLAGS if getattr(args, name) not in (None, False)]
        if given:
            raise UsageError(args.parser, f"{', '.join(given)} only make sense with --group")
    elif args.partition is not None or args.offset is not None:
        raise UsageError(args.parser,
                         "a group member gets its partitions from the group: no --partition or --offset")


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
        from_beginning=args.from_beginning, output_json=args.json, max_messages=args.max_messages,
        idle_timeout_ms=args.timeout_ms, request_timeout_ms=args.request_timeout_ms)


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


def read_until_done(consumer: Consumer, args: argparse.Namespace, stopping: threading.Event) -> int:
    """Print records until stopped, `--max-messages` or `--timeout-ms` idle; returns the count."""
    printed = 0
    idle_since = time.monotonic()
    while not stopping.is_set():
        wanted = None if args.max_messages is None else args.max_messages - printed
        if wanted is not None and wanted <= 0:
            break
        records = consumer.poll(POLL_TIMEOUT_MS, max_records=wanted)
        if records:
            sys.stdout.write("".join(render_record(record, args.json) + "\n" for record in records))
            sys.stdout.flush()
            printed += len(records)
            idle_since = time.monotonic()
        elif args.timeout_ms is not None and time.monotonic() - idle_since >= args.timeout_ms / 1000:
            break
    return printed
