"""`railmq groups list|describe|reset-offsets|delete`: consumer groups from the operator's chair.

Rendering only: the facts and the arithmetic come from `railmq.lag` (`measure_group_lag`,
`plan_reset`), so the numbers printed here are the numbers tests and other tools compute.

`describe` measures a partition with no committed offset from where a member joining now would
start (`--reset`, default latest as in Kafka) and marks it, so "lag 0" never hides a backlog
that a new member would skip.

`reset-offsets` follows kafka-consumer-groups: a target (`--to-earliest`, `--to-latest`,
`--to-offset N`, `--to-datetime TIME`, `--by-duration DURATION`, `--to-timestamp MS`,
`--shift-by N`), one topic, optionally some of its partitions (`--partition P` or `--topic T:0,2`).
It is a dry run unless `--execute`: it prints the plan (current → new per partition). Executing
commits with generation -1, which the group coordinator accepts only while the group has no
members; otherwise it answers NON_EMPTY_GROUP and nothing changes.
"""

from __future__ import annotations

import argparse
import json
import time

import msgspec
from rich.console import Console
from rich.markup import escape

from actors.errors import ErrorCode, RailmqError
from actors.messages import GroupSummary
from railmq.cli_common import (
    EXIT_OK, UsageError, add_cluster_arguments, milliseconds_or_zero, non_negative_int,
)
from railmq.cli_offsets import TIME_MS_MAX, parse_duration_ms, parse_time_ms
from railmq.cli_tables import Column, print_table
from railmq.group_admin import EARLIEST, LATEST, GroupAdminClient
from railmq.lag import GroupLag, OffsetResetPlan, ResetTarget, measure_group_lag, plan_reset
from railmq.terminal_text import cell


def register(commands: argparse._SubParsersAction) -> None:
    groups = commands.add_parser("groups", help="list, describe, reset and delete consumer groups",
                                 description="Consumer groups and share groups.")
    actions = groups.add_subparsers(dest="groups_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every group: kind, state, members")
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    add_cluster_arguments(listing)
    listing.set_defaults(handler=run_list)
    describe = actions.add_parser("describe", help="members, committed offsets and lag per partition")
    describe.add_argument("group", metavar="G", help="the group")
    describe.add_argument("--json", action="store_true", help="print the lag report as JSON")
    describe.add_argument("--sample-ms", type=milliseconds_or_zero, default=0, metavar="N",
                          help="also measure each partition's arrival rate over N ms (0: do not)")
    describe.add_argument("--reset", choices=("earliest", "latest"), default="latest",
                          help="where a member would start on a partition with no commit, for its lag")
    add_cluster_arguments(describe)
    describe.set_defaults(handler=run_describe)
    _add_reset(actions)
    delete = actions.add_parser("delete", help="delete a group with no members, and its offsets (classic or share)")
    delete.add_argument("group", metavar="G", help="the group")
    add_cluster_arguments(delete)
    delete.set_defaults(handler=run_delete)
    forget = actions.add_parser("delete-offsets", help="forget a group's committed offsets for one topic "
                                                         "(kafka-consumer-groups --delete-offsets)")
    forget.add_argument("group", metavar="G", help="the group (it must have no members)")
    forget.add_argument("--topic", required=True, metavar="T[:P,P...]",
                        help="the topic, optionally with partitions (orders:0,2); default every partition")
    forget.add_argument("--partition", type=non_negative_int, action="append", metavar="P",
                        help="only this partition, repeatable")
    forget.add_argument("--json", action="store_true", help="print what was deleted as JSON")
    add_cluster_arguments(forget)
    forget.set_defaults(handler=run_delete_offsets, parser=forget)


def _add_reset(actions: argparse._SubParsersAction) -> None:
    reset = actions.add_parser("reset-offsets", help="move a group's committed offsets (dry run by default)")
    reset.add_argument("group", metavar="G", help="the group")
    reset.add_argument("--topic", required=True, metavar="T[:P,P...]",
                       help="the topic, optionally with partitions as kafka-consumer-groups takes them (orders:0,2)")
    reset.add_argument("--partition", type=non_negative_int, action="append", metavar="P",
                       help="only this partition, repeatable (default: every partition)")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-earliest", action="store_const", dest="target", const=ResetTarget("earliest"),
                       help="the first offset still in the log")
    where.add_argument("--to-latest", action="store_const", dest="target", const=ResetTarget("latest"),
                       help="the end of the log: skip everything there now")
    where.add_argument("--to-offset", type=_offset_target, dest="target", metavar="N",
                       help="offset N (kept within the log, as Kafka does)")
    where.add_argument("--to-datetime", type=_datetime_target, dest="target", metavar="TIME",
                       help="the first offset at or after TIME (ISO-8601, e.g. 2024-05-01T12:00:00Z; naive is local)")
    where.add_argument("--by-duration", type=_duration_target, dest="target", metavar="DURATION",
                       help="the first offset at or after DURATION ago (10m, 1h30m, PT15M)")
    where.add_argument("--to-timestamp", type=_timestamp_target, dest="target", metavar="MS",
                       help="the first offset at or after this time (ms since epoch)")
    where.add_argument("--shift-by", type=_shift_target, dest="target", metavar="N",
                       help="move each committed offset by N (negative: back), within the log")
    where.add_argument("--delete-offsets", action="store_const", dest="target", const=ResetTarget("delete"),
                       help="forget the commits instead (the group then starts by its reset policy), "
                            "the same as `groups delete-offsets`")
    reset.add_argument("--execute", action="store_true", help="commit the plan (the group must have no members)")
    reset.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_cluster_arguments(reset)
    reset.set_defaults(handler=run_reset, precheck=lambda args: _topic_and_partitions(args) and None, parser=reset)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _typed(parse, text: str):  # noqa: ANN001, ANN202 - argparse type adapter
    try:
        return parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _offset_target(text: str) -> ResetTarget:
    return ResetTarget("offset", non_negative_int(text))


def _timestamp_target(text: str) -> ResetTarget:
    moment_ms = non_negative_int(text)
    if moment_ms > TIME_MS_MAX:  # was "ListOffsetsRequest cannot be sent" once the cluster was found
        raise argparse.ArgumentTypeError(f"{text!r} is past the year 292 million: no record's time")
    return ResetTarget("timestamp", moment_ms)


def _datetime_target(text: str) -> ResetTarget:
    return ResetTarget("timestamp", _typed(lambda raw: parse_time_ms(raw, _now_ms()), text))


def _duration_target(text: str) -> ResetTarget:
    moment_ms = _now_ms() - _typed(parse_duration_ms, text)
    if moment_ms < 0:  # was asked of the leader as a negative timestamp (INVALID_REQUEST)
        raise argparse.ArgumentTypeError(f"{text!r} reaches back before 1970, before any record's time")
    return ResetTarget("timestamp", moment_ms)


def _shift_target(text: str) -> ResetTarget:
    try:
        return ResetTarget("shift", int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _client(args: argparse.Namespace) -> GroupAdminClient:
    return GroupAdminClient(args.bootstrap, timeout_ms=args.request_timeout_ms)


LIST_COLUMNS = [Column("group"), Column("kind"), Column("state"), Column("members", "right")]


def run_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        groups = client.list_groups()
    if args.json:
        fields = GroupSummary.__struct_fields__  # every field: the wire form omits defaults
        print(json.dumps([{name: getattr(group, name) for name in fields} for group in groups], indent=2))
        return EXIT_OK
    console = Console()
    if not groups:
        console.print("no groups")
        return EXIT_OK
    print_table(console, LIST_COLUMNS, [[cell(g.group_id), g.kind, g.state, str(g.members)] for g in groups],
                title="consumer groups")
    return EXIT_OK


def run_describe(args: argparse.Namespace) -> int:
    with _client(args) as client:
        report = measure_group_lag(client, args.group, sample_ms=args.sample_ms, reset=args.reset)
    warnings = _dead_letter_lines(args, report)
    if args.json:
        document = msgspec.to_builtins(report)
        document["dead_letters"] = warnings
        print(json.dumps(document, indent=2))
    else:
        console = Console()
        render_group_lag(report, console)
        for line in warnings:
            console.print(escape(line), style="bold yellow" if "warning" in line.lower() else None)
    return EXIT_OK


def _dead_letter_lines(args: argparse.Namespace, report: GroupLag) -> list[str]:
    """Dead-letter depth of the group's topics (railmq.cli_dlq), a warning when it is not zero."""
    from railmq.admin import Admin
    from railmq.cli_dlq import dlq_warning

    topics = sorted({partition.topic for partition in report.partitions})
    if not topics:
        return []
    with Admin(args.bootstrap, timeout_ms=args.request_timeout_ms) as admin:
        return dlq_warning(admin, topics)


def _shown(value: object) -> str:
    return "-" if value is None else str(value)


def _member_name(client_id: str | None, member_id: str | None) -> str:
    """The member id; it starts with the client id, which is shown apart only when it does not."""
    if member_id is None:
        return "-"
    return member_id if not client_id or member_id.startswith(client_id) else f"{client_id} / {member_id}"


LAG_COLUMNS = [Column("topic"), Column("partition", "right"), Column("member"), Column("committed", "right"),
               Column("log end", "right"), Column("lag", "right"), Column("lag s", "right", optional=True),
               Column("msgs/s", "right", optional=True), Column("hot", optional=True)]
NO_COMMIT_MARK = "*"


def render_group_lag(report: GroupLag, console: Console) -> None:
    members = len(report.members)
    # Client text (ids, the protocol the members named) and what the group coordinator's port
    # answered (state, kind, topics) go through `cell`: never a terminal control, never markup
    # (railmq/terminal_text.py).
    console.print(f"[bold]group {cell(report.group_id)}[/] ({cell(report.kind)}, {cell(report.state)}, "
                  f"generation {report.generation}, protocol {cell(report.protocol or '-')}): "
                  f"{members} member{'' if members == 1 else 's'}, total lag {report.total_lag_messages}",
                  highlight=False)
    if not report.partitions:
        console.print("no committed offsets and no assigned partitions")
        return
    sampled = report.sample_ms > 0
    columns = [column for column in LAG_COLUMNS if column.name != "msgs/s" or sampled]
    rows = []
    for row in report.partitions:
        lag = _shown(row.lag_messages) + (NO_COMMIT_MARK if row.start_from != "committed" else "")
        cells = [cell(row.topic), str(row.partition), cell(_member_name(row.client_id, row.member_id)),
                 _shown(row.committed_offset), _shown(row.log_end_offset), lag,
                 "-" if row.lag_seconds is None else f"{row.lag_seconds:.1f}"]
        if sampled:
            cells.append("-" if row.arrival_rate_per_s is None else f"{row.arrival_rate_per_s:.1f}")
        cells.append(f"[bold red]HOT ({', '.join(row.hot_reasons)})[/]" if row.hot else "")
        rows.append(cells)
    print_table(console, columns, rows)
    for line in no_commit_notes(report):
        console.print(line, highlight=False)
    for member in report.members:
        if member.idle:
            name = cell(_member_name(member.client_id, member.member_id))
            console.print(f"idle member (no partitions): {name}")


def no_commit_notes(report: GroupLag) -> list[str]:
    """The footnote for partitions measured from a reset position instead of a commit."""
    uncommitted = [row for row in report.partitions if row.start_from != "committed"]
    if not uncommitted:
        return []
    if report.reset == "latest":
        skipped = sum(max(0, (row.log_end_offset or 0) - (row.log_start_offset or 0)) for row in uncommitted)
        return [f"{NO_COMMIT_MARK} no committed offset: lag counted from where a new member starts with "
                f"auto_offset_reset=latest (the log end); it would skip the {skipped} record"
                f"{'' if skipped == 1 else 's'} there now (--reset earliest shows them as lag; "
                "consume --from-beginning reads them)"]
    return [f"{NO_COMMIT_MARK} no committed offset: lag counted from the log start, where a new member starts "
            "with auto_offset_reset=earliest"]


RESET_COLUMNS = [Column("topic"), Column("partition", "right"), Column("current", "right"), Column("new", "right")]


def run_reset(args: argparse.Namespace) -> int:
    if args.target.kind == "delete":
        if not args.execute:
            print("dry run: nothing changed; add --execute to delete these commits")
            return EXIT_OK
        return run_delete_offsets(args)
    topic, partitions = _topic_and_partitions(args)
    with _client(args) as client:
        plans = reset_plans(client, args.group, topic, args.target, partitions)
        if args.execute:
            client.commit_as_admin(args.group, {(plan.topic, plan.partition): plan.new_offset for plan in plans})
    if args.json:
        print(json.dumps({"group": args.group, "executed": args.execute,
                          "plan": msgspec.to_builtins(plans)}, indent=2))
        return EXIT_OK
    console = Console()
    print_table(console, RESET_COLUMNS,
                [[escape(plan.topic), str(plan.partition), _shown(plan.current_offset), str(plan.new_offset)]
                 for plan in plans], title=f"offsets of group {escape(args.group)}")
    console.print("committed: the group starts from the new offsets" if args.execute
                  else "dry run: nothing changed; add --execute to commit these offsets", highlight=False)
    return EXIT_OK


def _topic_and_partitions(args: argparse.Namespace) -> tuple[str, list[int] | None]:
    topic, colon, listed = args.topic.partition(":")
    partitions = list(args.partition or [])
    if colon:
        try:
            partitions += [int(part) for part in listed.split(",") if part.strip()]
        except ValueError:
            raise UsageError(args.parser, f"--topic {args.topic!r}: partitions are numbers, like orders:0,2") from None
    if not topic:
        raise UsageError(args.parser, "--topic needs a topic name")
    return topic, sorted(set(partitions)) or None


def reset_plans(client: GroupAdminClient, group_id: str, topic: str, target: ResetTarget,
                partitions: list[int] | None = None) -> list[OffsetResetPlan]:
    count = len(client.topic(topic).partitions)
    missing = [p for p in partitions or [] if p >= count]
    if missing:
        raise RailmqError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has partitions 0..{count - 1}, not {missing[0]}")
    try:
        offsets = client.describe_group(group_id).offsets
    except RailmqError as error:
        if error.code != ErrorCode.GROUP_ID_NOT_FOUND:
            raise
        offsets = []  # a new group: the reset gives it its first offsets
    committed = {entry.partition: entry.offset for entry in offsets if entry.topic == topic}
    plans = []
    for partition in partitions if partitions is not None else range(count):
        at_time = client.list_offset(topic, partition, target.value) if target.kind == "timestamp" else None
        plans.append(plan_reset(target, topic, partition, committed=committed.get(partition),
                                earliest=client.list_offset(topic, partition, EARLIEST),
                                latest=client.list_offset(topic, partition, LATEST), at_time=at_time))
    return plans


def run_delete(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.delete_group(args.group)
    print(f"deleted group {args.group}")
    return EXIT_OK


def run_delete_offsets(args: argparse.Namespace) -> int:
    topic, partitions = _topic_and_partitions(args)
    with _client(args) as client:
        wanted = partitions if partitions is not None else list(range(len(client.topic(topic).partitions)))
        deleted = client.delete_offsets(args.group, [(topic, partition) for partition in wanted])
    if getattr(args, "json", False):
        print(json.dumps({"group": args.group, "deleted": [list(item) for item in deleted]}))
        return EXIT_OK
    shown = ", ".join(f"{t}/{p}" for t, p in deleted) or "nothing (no commits there)"
    print(f"group {args.group}: deleted the committed offsets of {shown}")
    return EXIT_OK
