"""`railmq lab list | run NAME... | run --all`: the design articles' claims, on a live cluster.

    railmq lab list                         every lab: number, name, claim, article
    railmq lab run hot-key                  one lab (by name or number), full size
    railmq lab run 1 2 12 --quick           several, in their short versions
    railmq lab run --all --report out/      all fifteen, with an HTML page per lab and plots
    railmq lab run --all --pictures docs/pictures    the SVG pictures docs/labs.md shows

Each lab starts from one shared 3-node cluster (started here, stopped at the end), states its
claim, runs the experiment, and prints expected against measured with a tolerance band and a
verdict. Exit code 0 when every measure of every lab landed in its band, 1 otherwise. The labs
themselves are in chaos/labs/; this module only hangs them under `railmq lab`.
"""

from __future__ import annotations

import argparse
import json
import sys

from railmq.cli_common import EXIT_FAILED, EXIT_OK, UsageError, directory


def register(commands: argparse._SubParsersAction) -> None:
    lab = commands.add_parser(
        "lab", help="reproduce the design articles' failure modes and numbers on a live cluster",
        description="Labs: each states a claim from the design articles, runs it on a live local cluster and "
                    "prints expected against measured, with a tolerance band and a verdict.")
    actions = lab.add_subparsers(dest="lab_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every lab, with its claim")
    listing.add_argument("--json", action="store_true", help="print the labs as JSON")
    listing.set_defaults(handler=run_list)
    run = actions.add_parser("run", help="run labs by name or number, or --all")
    run.add_argument("labs", nargs="*", metavar="NAME", help="lab names or numbers (see `railmq lab list`)")
    run.add_argument("--all", action="store_true", help="run every lab, in order")
    run.add_argument("--quick", action="store_true", help="the short versions (seconds each)")
    run.add_argument("--report", type=directory, metavar="DIR",
                     help="write index.html and a page per lab with plots into DIR")
    run.add_argument("--pictures", type=directory, metavar="DIR",
                     help="write each lab's plots as standalone SVG files into DIR")
    run.add_argument("--seed", type=int, default=1, help="seeds every random choice of the labs (default 1)")
    run.add_argument("--json", action="store_true", help="print the results as JSON at the end")
    run.set_defaults(handler=run_labs_command, parser=run)


def run_list(args: argparse.Namespace) -> int:
    from chaos.labs.catalog import LABS

    if args.json:
        print(json.dumps([{"number": lab.number, "name": lab.name, "title": lab.title, "article": lab.article,
                           "claim": lab.claim} for lab in LABS], indent=2))
        return EXIT_OK
    for lab in LABS:
        print(f"{lab.number:>2}  {lab.name:<24} {lab.title}")
    print("\nrun one with `railmq lab run NAME`, all with `railmq lab run --all` "
          "(add --quick for the short versions)")
    return EXIT_OK


def _selected(args: argparse.Namespace) -> list:
    from chaos.labs.catalog import LABS, UnknownLab, find

    if args.all == bool(args.labs):
        raise UsageError(args.parser, "name the labs to run, or give --all (not both)")
    if args.all:
        return list(LABS)
    try:
        return [find(name) for name in args.labs]
    except UnknownLab as unknown:
        raise UsageError(args.parser, str(unknown)) from None


def _say(line: str) -> None:
    print(line, flush=True)


def run_labs_command(args: argparse.Namespace) -> int:
    from chaos.labs.report import write_pictures, write_report
    from chaos.labs.runner import run_labs, summary_lines

    labs = _selected(args)
    results = run_labs(labs, quick=args.quick, seed=args.seed, say=_say)
    if len(results) > 1:
        print("\n".join(summary_lines(results)))
    if args.report:
        print(f"report: {write_report(args.report, results)}")
    if args.pictures:
        print(f"pictures: {len(write_pictures(args.pictures, results))} SVG files in {args.pictures}")
    if args.json:
        json.dump([{"lab": result.lab.name, "verdict": result.verdict,
                    "elapsed_s": round(result.elapsed_s, 2),
                    "error": result.error, "facts": result.facts,
                    "measures": [{"name": m.name, "expected": m.expected, "low": m.band.low,
                                  "high": m.band.high,
                                  "measured": m.measured, "verdict": m.verdict} for m in result.measures]}
                   for result in results], sys.stdout, indent=2, default=str)
        print()
    return EXIT_OK if all(result.passed for result in results) else EXIT_FAILED
