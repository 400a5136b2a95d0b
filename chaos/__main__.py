"""The chaos command line: `python -m chaos check HISTORY [--json]`.

This module owns argument parsing, rendering and exit codes, nothing else: the verdict comes from
`chaos.checker`, the file format from `chaos.history`. Each subcommand registers itself in
`build_parser` through one small `_add_*_command` function and sets its handler, so a `run`
subcommand slots in next to `check`.

Exit codes: 0 the history is valid, 1 at least one safety violation, 2 the history could not be
read (missing file, malformed line: the message names the line number).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from chaos.checker import ANOMALY_FIELDS, SUMMARY_FIELDS, CheckResult, check_file, summary_dict
from chaos.history import HistoryError, UnreadableHistory

EXIT_VALID = 0
EXIT_VIOLATION = 1
EXIT_UNREADABLE = 2
# Rows per anomaly table on a terminal; --json carries the checker's full bounded lists.
ANOMALY_ROWS_SHOWN_MAX = 10


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m chaos", description="railmq chaos tools")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_check_command(commands)
    return parser


def _add_check_command(commands: Any) -> None:
    check = commands.add_parser("check", help="judge a recorded history (docs/history.md)")
    check.add_argument("history", metavar="HISTORY", help="path of a JSON Lines history file")
    check.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    check.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    try:
        result = check_file(args.history)
    except (HistoryError, OSError) as error:
        where = "" if isinstance(error, UnreadableHistory) else f"{args.history}: "  # it names the path
        print(f"error: {where}{error}", file=sys.stderr)
        return EXIT_UNREADABLE
    if args.json:
        print(json.dumps(summary_dict(result), indent=2))
    else:
        render_result(result, Console())
    return EXIT_VALID if result.valid else EXIT_VIOLATION


def render_result(result: CheckResult, console: Console) -> None:
    """The summary table, then the first anomalies of each kind, then the verdict."""
    console.print(_summary_table(result))
    for name in ANOMALY_FIELDS:
        anomalies = getattr(result, name)
        if anomalies:
            console.print(_anomaly_table(name, anomalies))
    for sentence in result.violations:
        console.print(f"[bold red]violation[/]: {escape(sentence)}", highlight=False)
    verdict = "[bold green]VALID[/]" if result.valid else "[bold red]INVALID[/]"
    console.print(f"history is {verdict}")


def _summary_table(result: CheckResult) -> Table:
    table = Table(title="chaos history summary", show_header=False)
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name in SUMMARY_FIELDS:
        table.add_row(name, _shown(getattr(result, name)))
    table.add_row("leftover_processes", _shown(len(result.leftover_processes)))
    table.add_row("leftover_shm", _shown(len(result.leftover_shm)))
    return table


def _anomaly_table(name: str, anomalies: list[msgspec.Struct]) -> Table:
    columns = anomalies[0].__struct_fields__
    shown = min(len(anomalies), ANOMALY_ROWS_SHOWN_MAX)
    table = Table(title=f"{name} (first {shown})")
    for column in columns:
        table.add_column(column)
    for anomaly in anomalies[:shown]:
        table.add_row(*(_shown(getattr(anomaly, column)) for column in columns))
    return table


def _shown(value: Any) -> Text:
    """A cell as plain text: values from a history are never read as rich markup."""
    if value is None:
        return Text("-")
    if isinstance(value, float):
        return Text(f"{value:,.3f}")
    if isinstance(value, (list, tuple, dict)):
        return Text(json.dumps(msgspec.to_builtins(value)))
    return Text(str(value))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
