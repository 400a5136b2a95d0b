"""`railmq groups list|describe|reset-offsets|delete`: consumer groups from the operator's chair.

Rendering only: the facts and the arithmetic come from `railmq.lag` (`measure_group_lag`,
`plan_reset`), so the numbers printed here are the numbers tests and other tools compute.

`reset-offsets` is a dry run unless `--execute`: it prints the plan (current → new per
partition). Executing commits with generation -1, which the group coordinator accepts only while
the group has no members; otherwise it answers NON_EMPTY_GROUP and nothing changes.
"""

from __future__ import annotations

import argparse
import json

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from actors.errors import ErrorCode, RailmqError
from railmq.cli_common import EXIT_OK, add_cluster_arguments, non_negative_int
from railmq.lag import (
    EARLIEST, LATEST, GroupAdminClient, GroupLag, OffsetResetPlan, ResetTarget, measure_group_lag, plan_reset,
)


def register(commands: argparse._SubParsersAction) -> None:
    groups = commands.add_parser("groups", help="list, describe, reset and delete consumer groups")
    actions = groups.add_subparsers(dest="groups_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every group: kind, state, members")
    add_cluster_arguments(listing)
    listing.set_defaults(handler=run_list)
    describe = actions.add_parser("describe", help="members, committed offsets and lag per partition")
    describe.add_argument("group", metavar="G")
    describe.add_argument("--json", action="store_true", help="print the lag report as JSON")
    describe.add_argument("--sample-ms", type=non_negative_int, default=0, metavar="N",
                          help="also measure each partition's arrival rate over N ms")
    add_cluster_arguments(describe)
    describe.set_defaults(handler=run_describe)
    _add_reset(actions)
    delete = actions.add_parser("delete", help="delete a group with no members, and its offsets")
    delete.add_argument("group", metavar="G")
    add_cluster_arguments(delete)
    delete.set_defaults(handler=run_delete)


def _add_reset(actions: argparse._SubParsersAction) -> None:
    reset = actions.add_parser("reset-offsets", help="move a group's committed offsets (dry run by default)")
    reset.add_argument("group", metavar="G")
    reset.add_argument("--topic", required=True, metavar="T")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-earliest", action="store_const", dest="target", const=ResetTarget("earliest"))
    where.add_argument("--to-latest", action="store_const", dest="target", const=ResetTarget("latest"))
    where.add_argument("--to-timestamp", type=_timestamp_target, dest="target", metavar="MS",
                       help="the first offset at or after this time (ms since epoch)")
    where.add_argument("--shift-by", type=_shift_target, dest="target", metavar="N",
                       help="move each committed offset by N (negative: back), within the log")
    reset.add_argument("--execute", action="store_true",
                       help="commit the plan (the group must have no members)")
    add_cluster_arguments(reset)
    reset.set_defaults(handler=run_reset)


def _timestamp_target(text: str) -> ResetTarget:
    return ResetTarget("timestamp", non_negative_int(text))


def _shift_target(text: str) -> ResetTarget:
    try:
        return ResetTarget("shift", int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _client(args: argparse.Namespace) -> GroupAdminClient:
    return GroupAdminClient(args.bootstrap, timeout_ms=args.request_timeout_ms)


def run_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        groups = client.list_groups()
    table = Table(title="consumer groups", title_justify="left")
    for column in ("group", "kind", "state", "members"):
        table.add_column(column, justify="right" if column == "members" else "left")
    for group in groups:
        table.add_row(group.group_id, group.kind, group.state, str(group.members))
    Console().print(table if groups else "no groups")
    return EXIT_OK


def run_describe(args: argparse.Namespace) -> int:
    with _client(args) as client:
        report = measure_group_lag(client, args.group, sample_ms=args.sample_ms)
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


def render_group_lag(report: GroupLag, console: Console) -> None:
    console.print(f"[bold]group {report.group_id}[/]  kind {report.kind}  state {report.state}  "
                  f"generation {report.generation}  protocol {report.protocol or '-'}  "
                  f"members {len(report.members)}  total lag {report.total_lag_messages}")
    sampled = report.sample_ms > 0
    table = Table(title_justify="left")
    columns = ["topic", "partition", "member", "committed", "log end", "lag", "lag s"]
    columns += ["msgs/s"] if sampled else []
    for column in columns + ["hot"]:
        table.add_column(column, justify="left" if column in ("topic", "member", "hot") else "right")
    for row in report.partitions:
        lag_s = "-" if row.lag_seconds is None else f"{row.lag_seconds:.1f}"
        cells = [row.topic, str(row.partition), _member_name(row.client_id, row.member_id),
                 _shown(row.committed_offset), _shown(row.log_end_offset), _shown(row.lag_messages), lag_s]
        if sampled:
            cells.append("-" if row.arrival_rate_per_s is None else f"{row.arrival_rate_per_s:.1f}")
        cells.append(f"[bold red]HOT ({', '.join(row.hot_reasons)})[/]" if row.hot else "")
        table.add_row(*cells)
    console.print(table if report.partitions else "no committed offsets and no assigned partitions")
    for member in report.members:
        if member.idle:
            console.print(f"idle member (no partitions): {_member_name(member.client_id, member.member_id)}")


def run_reset(args: argparse.Namespace) -> int:
    with _client(args) as client:
        plans = reset_plans(client, args.group, args.topic, args.target)
        if args.execute:
            client.commit_as_admin(args.group, {(plan.topic, plan.partition): plan.new_offset
                                                for plan in plans})
    outcome = "executed" if args.execute else "dry run: add --execute to commit"
    table = Table(title=f"reset of group {args.group} on {args.topic} ({outcome})", title_justify="left")
    for column in ("topic", "partition", "current", "new"):
        table.add_column(column, justify="left" if column == "topic" else "right")
    for plan in plans:
        table.add_row(plan.topic, str(plan.partition), _shown(plan.current_offset), str(plan.new_offset))
    Console().print(table)
    return EXIT_OK


def reset_plans(client: GroupAdminClient, group_id: str, topic: str,
                target: ResetTarget) -> list[OffsetResetPlan]:
    count = len(client.topic(topic).partitions)
    try:
        offsets = client.describe_group(group_id).offsets
    except RailmqError as error:
        if error.code != ErrorCode.GROUP_ID_NOT_FOUND:
            raise
        offsets = []  # a new group: the reset gives it its first offsets
    committed = {entry.partition: entry.offset for entry in offsets if entry.topic == topic}
    plans = []
    for partition in range(count):
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
