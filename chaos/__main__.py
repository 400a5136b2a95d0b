"""The chaos command line: `python -m chaos list | run SCENARIO | check HISTORY`.

This module owns argument parsing, rendering and exit codes, nothing else: the verdict comes from
`chaos.checker`, the file format from `chaos.history`, runs from `chaos.runner`, the scenarios
from `chaos.scenarios`. Each subcommand registers itself through one small `add_*_command`
function and sets its handler; `railmq chaos` (railmq/cli_chaos.py) registers the same three.

- `list` prints every scenario: name, whether it is expected to lose data, what it does;
- `run SCENARIO --seed N --duration SECONDS [--report DIR]` runs it on real processes with a
  progress bar, prints the summary table and writes the report folder;
- `check HISTORY [--json]` judges a recorded history and prints the same summary as `run` (with
  the run's facts and why each lost message was lost when the history sits in a report folder
  beside its summary.json and trace.jsonl), then the first anomalies of each kind in words,
  times in seconds.

Exit codes: 0 valid (for a teaching scenario: the loss is expected and reported), 1 at least one
safety violation, 2 the history could not be read or the command was misused (an unknown
scenario, a bad number).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any, Callable, Sequence

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from chaos.checker import ANOMALY_FIELDS, CheckResult, check_file, summary_dict
from chaos.history import HistoryError, UnreadableHistory
from chaos.report import explanations_for, render_terminal
from chaos.netns import unavailable as hosts_unavailable
from chaos.runner import RECOVERY_WINDOW_S, run_scenario
from chaos.runner import Progress as RunProgress
from chaos.scenarios import SCENARIOS, UnknownScenario, get_scenario
from railmq.cli_common import MILLISECONDS_MAX, directory

EXIT_VALID = 0
EXIT_VIOLATION = 1
EXIT_UNREADABLE = 2
# Rows per anomaly table on a terminal; --json carries the checker's full bounded lists.
ANOMALY_ROWS_SHOWN_MAX = 10


def build_parser(prog: str = "python -m chaos") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="railmq chaos tools")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_commands(commands)
    return parser


def add_commands(commands: Any) -> None:
    """Add `list`, `run` and `check` to a subparsers object (here, or under `railmq chaos`)."""
    add_list_command(commands)
    add_run_command(commands)
    add_check_command(commands)


def add_list_command(commands: Any) -> None:
    listing = commands.add_parser("list", help="the named chaos scenarios")
    listing.set_defaults(handler=run_list)


def add_run_command(commands: Any) -> None:
    run = commands.add_parser("run", help="run a scenario on a real cluster and report what broke")
    run.add_argument("scenario", metavar="SCENARIO", help="a scenario name (see `list`)")
    run.add_argument("--seed", type=_non_negative_int, default=1, metavar="N",
                     help="drives every random choice: the same seed replays the same schedule (default 1)")
    run.add_argument("--duration", type=_positive_float, default=20.0, metavar="SECONDS",
                     help="length of the fault phase (default 20)")
    run.add_argument("--report", type=directory, metavar="DIR", default=None,
                     help="report folder (default chaos-reports/<scenario>-seed<N>-<time>)")
    run.add_argument("--recovery-window", type=_non_negative_float, default=RECOVERY_WINDOW_S,
                     metavar="SECONDS",
                     help=f"how long the healed cluster gets to converge (default {RECOVERY_WINDOW_S:g})")
    run.add_argument("--json", action="store_true", help="print summary.json instead of the tables")
    run.set_defaults(handler=run_run)


def add_check_command(commands: Any) -> None:
    check = commands.add_parser("check", help="judge a recorded history (docs/history.md)")
    check.add_argument("history", metavar="HISTORY", help="path of a JSON Lines history file")
    check.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    check.set_defaults(handler=run_check)


def _parsed(kind: Callable[[str], Any], text: str, ok: Callable[[Any], bool], rule: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    return _parsed(int, text, lambda value: value >= 0, "zero or more")


# The longest phase a run takes, the longest wait of the command line's -ms flags (2^31 - 1 ms,
# 24.8 days): `--duration 1e308` built its schedule, a fault every few seconds, for ever.
PHASE_S_MAX = MILLISECONDS_MAX // 1000


def _positive_float(text: str) -> float:
    return _parsed(float, text, lambda value: 0 < value <= PHASE_S_MAX, f"positive, at most {PHASE_S_MAX} s")


def _non_negative_float(text: str) -> float:
    return _parsed(float, text, lambda value: 0 <= value <= PHASE_S_MAX,
                   f"zero or more, at most {PHASE_S_MAX} s")


def run_list(args: argparse.Namespace) -> int:
    table = Table(title="chaos scenarios")
    for column in ("name", "loses data", "what it does"):
        table.add_column(column)
    for scenario in SCENARIOS.values():
        loses = "expected" if scenario.expect_loss else "never"
        table.add_row(scenario.name, loses, escape(scenario.summary))
    Console().print(table)
    return EXIT_VALID


def default_report_dir(scenario: str, seed: int, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return os.path.join("chaos-reports", f"{scenario}-seed{seed}-{stamp}")


def run_run(args: argparse.Namespace) -> int:
    try:
        scenario = get_scenario(args.scenario)
    except UnknownScenario as unknown:
        print(f"error: {unknown}", file=sys.stderr)
        return EXIT_UNREADABLE
    if scenario.over_hosts and (reason := hosts_unavailable()):
        print(f"error: {scenario.name} runs its nodes in network namespaces, which cannot be made here: {reason}",
              file=sys.stderr)
        return EXIT_UNREADABLE
    report_dir = args.report or default_report_dir(scenario.name, args.seed)
    console = Console(stderr=args.json)
    # Restarts are the nemesis at work and are in the fault log: not warnings to print over the bar.
    logging.getLogger("railmq.supervisor").setLevel(logging.ERROR)
    with ProgressDisplay(console, scenario.name, args.duration) as display:
        outcome = run_scenario(scenario, seed=args.seed, duration_s=args.duration, report_dir=report_dir,
                               recovery_window_s=args.recovery_window, on_progress=display.update)
    if args.json:
        print(json.dumps(outcome.summary, indent=2, default=str))
    else:
        render_terminal(outcome.result, outcome.run_info, console,
                        explanations_for(report_dir, outcome.result, outcome.run_info))
        console.print(f"report: {escape(os.path.join(report_dir, 'report.html'))}", highlight=False)
    return EXIT_VALID if outcome.result.valid else EXIT_VIOLATION


class ProgressDisplay:
    """A rich progress bar over the fault phase, then the run's later phases as its description."""

    def __init__(self, console: Console, scenario: str, duration_s: float) -> None:
        counts = TextColumn("{task.fields[acknowledged]:>7,} acked  {task.fields[faults]:>3} faults")
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), counts,
                                 console=console, transient=False)
        self.task = self.progress.add_task(f"{scenario}: starting", total=duration_s, acknowledged=0,
                                           faults=0)
        self.scenario = scenario

    def __enter__(self) -> "ProgressDisplay":
        self.progress.start()
        return self

    def update(self, state: RunProgress) -> None:
        self.progress.update(self.task, completed=state.elapsed_s,
                             description=f"{self.scenario}: {state.phase}",
                             acknowledged=state.acknowledged, faults=state.faults)

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


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
        render_result(result, Console(), run_info_beside(args.history, result), os.path.dirname(args.history))
    return EXIT_VALID if result.valid else EXIT_VIOLATION


def run_info_beside(history_path: str, result: CheckResult) -> dict[str, Any]:
    """The run's facts from the summary.json next to the history, or what the history itself says."""
    info: dict[str, Any] = {"scenario": result.scenario, "seed": result.seed}
    summary_path = os.path.join(os.path.dirname(history_path) or ".", "summary.json")
    try:
        with open(summary_path, encoding="utf-8") as handle:
            info.update(json.load(handle).get("run") or {})
    except (OSError, ValueError, AttributeError):
        pass
    return info


def render_result(result: CheckResult, console: Console, run_info: dict[str, Any] | None = None,
                  report_dir: str = "") -> None:
    """The summary `chaos run` prints, then the first anomalies of each kind, in words."""
    run_info = run_info or {"scenario": result.scenario, "seed": result.seed}
    explanations = explanations_for(report_dir or ".", result, run_info) if result.lost_messages else []
    render_terminal(result, run_info, console, explanations)
    found = [name for name in ANOMALY_FIELDS if getattr(result, name)]
    for name in found:
        if name != "lost_messages":  # lost messages are in the summary already, with why
            console.print(_anomaly_table(name, getattr(result, name)))
    if found:
        listed = ", ".join(f"{name} ({len(getattr(result, name))})" for name in found)
        console.print(f"--json lists each of them under anomalies: {listed}", highlight=False, markup=False)


def _words(name: str) -> str:
    """`earlier_offset` -> `earlier offset`; `fault_ns` -> `fault (s)`: a column as a person reads it."""
    return (name[:-3] + " (s)" if name.endswith("_ns") else name).replace("_", " ")


def _anomaly_table(name: str, anomalies: list[msgspec.Struct]) -> Table:
    columns = anomalies[0].__struct_fields__
    shown = min(len(anomalies), ANOMALY_ROWS_SHOWN_MAX)
    table = Table(title=f"{_words(name)} (first {shown} of {len(anomalies)} listed)")
    for column in columns:
        table.add_column(_words(column), overflow="fold")
    for anomaly in anomalies[:shown]:
        table.add_row(*(_shown(getattr(anomaly, column), column) for column in columns))
    return table


def _shown(value: Any, column: str = "") -> Text:
    """A cell as plain text: values from a history are never read as rich markup."""
    if value is None:
        return Text("-")
    if column.endswith("_ns") and isinstance(value, int):
        return Text(f"{value / 1e9:,.3f}")
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
