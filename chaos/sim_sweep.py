"""The seed sweep behind `python -m chaos.simulator` and `railmq sim`: run seeds, say what each did.

`run(args)` takes the flags `add_arguments` (at the end of this module) defines (plus `--json` under
`railmq sim`; `--variant NAME` runs every seed with one broken rule of chaos/sim_variants.py),
simulates each seed in turn and prints, per seed, its outcome, what it checked
(how many acknowledged writes, deliveries, final logs and replica logs went through the checker)
and which faults ran; then a summary. A sweep of several seeds shows a progress bar on a terminal
(on stderr, so the lines and the JSON stay clean). A failing seed is printed with its problems
and its last events, so it can be replayed from the seed alone. It decides nothing about the
simulation itself: that is chaos/simulator.py; `seed_summary` reads a result's history.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import textwrap
import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from chaos import simulator
from chaos.sim_config import OPTIONAL_FAULT_KINDS
from chaos.simulator import FAULT_KINDS, SimConfig, SimulationFailed, SimulationResult, simulate
from railmq.cli_common import milliseconds, non_negative_int

# What every seed is held to (chaos/simulator.py and chaos/sim_checks.py run these).
CHECKS = (
    "every actor's invariants after every step", "one leader and one incarnation per partition and epoch",
    "no high watermark moving back within an epoch", "ISR members holding every committed offset",
    "acks=all writes on at least min_insync replicas when acknowledged",
    "a restarted group coordinator holding every commit it acknowledged",
    "one owner per partition per generation", "a share record locked by one member at a time",
    "share delivery counts never going back nor past max_delivery_attempts, release delays kept",
    "no acknowledged or consumed write lost", "per-key order", "each producer's writes in send order",
    "one value per offset", "committed offsets never moving back",
    "replicas agreeing below the high watermark",
    "every acknowledged write and every logged record reaching the group",
    "every share record accepted or dead-lettered, once",
    "the group settling and every replica back in the ISR after the heal",
)


def seed_summary(result: SimulationResult) -> dict[str, Any]:
    """What one seed's history holds: the checker's inputs, and the faults injected by kind."""
    acknowledged = deliveries = commits = final_reads = replica_logs = 0
    faults: Counter[str] = Counter()
    events = []
    for line in result.history:
        kind, operation = line.get("type"), line.get("f")
        if kind == "ok" and operation == "send":
            acknowledged += 1
        elif kind == "ok" and operation == "poll":
            deliveries += len(line.get("records") or [])
        elif kind == "ok" and operation == "commit":
            commits += 1
        elif kind == "final-read":
            final_reads += 1
        elif kind == "replica-log":
            replica_logs += 1
        elif kind == "fault" and line.get("phase", "start") == "start":
            faults[str(line.get("nemesis"))] += 1
            events.append({"at_ms": round((line["time_ns"] - result.history[0]["time_ns"]) / 1e6, 1),
                           "nemesis": line.get("nemesis"), "target": line.get("target")})
    return {"seed": result.seed, "ok": result.ok, "simulated_s": round(result.simulated_s, 3),
            "wall_s": round(result.wall_s, 3), "steps": result.steps,
            "checked": {"acknowledged_writes": acknowledged, "deliveries": deliveries, "commits": commits,
                        "final_logs": final_reads, "replica_logs": replica_logs},
            "faults": dict(sorted(faults.items())), "fault_events": events, "problems": list(result.problems)}


def seed_line(summary: dict[str, Any]) -> str:
    checked = summary["checked"]
    faults = ", ".join(f"{name} ×{count}" for name, count in summary["faults"].items()) or "none"
    outcome = "ok" if summary["ok"] else "FAILED"
    return (f"seed {summary['seed']}: {outcome}  {summary['simulated_s']:.1f} simulated s in {summary['wall_s']:.2f} s, "
            f"{summary['steps']:,} steps; checked {checked['acknowledged_writes']:,} acknowledged writes, "
            f"{checked['deliveries']:,} deliveries, {checked['final_logs']} final logs, "
            f"{checked['replica_logs']} replica logs; faults: {faults}")


def run(args: argparse.Namespace) -> int:
    """Run the seeds `add_arguments` describes; 1 when any failed."""
    config = SimConfig(duration_ms=args.duration_ms, faults=args.faults, steps_max=args.steps,
                       controllers=getattr(args, "controllers", 0),
                       entry_bytes_max=getattr(args, "entry_bytes_max", 0))
    seeds = range(args.seed, args.seed + max(1, args.seeds))
    as_json = bool(getattr(args, "json", False))
    if not as_json and not args.quiet:
        print(textwrap.fill(f"each seed is checked for: {'; '.join(CHECKS)}", width=100))
    summaries, failures, simulated, wall, started = [], [], 0.0, 0.0, time.perf_counter()
    progress = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("seeds"),
                        TextColumn("{task.fields[failed]} failed"), TimeRemainingColumn(),
                        console=Console(stderr=True), transient=True,
                        disable=len(seeds) < 2 or not sys.stderr.isatty())
    variant = getattr(args, "variant", "") or ""
    from chaos.sim_variants import broken

    with progress, (broken(variant) if variant else contextlib.nullcontext()):
        task = progress.add_task("sweep", total=len(seeds), failed=0)
        for seed in seeds:
            result = simulate(seed, config)
            summary = seed_summary(result)
            summaries.append(summary)
            simulated += result.simulated_s
            wall += result.wall_s
            if not result.ok:
                failures.append(seed)
                print(SimulationFailed(seed, result.problems, result.trace), file=sys.stderr, flush=True)
            if not as_json and (not args.quiet or not result.ok):
                print(seed_line(summary), flush=True)  # above the bar: rich redirects stdout while it draws
            progress.update(task, advance=1, failed=len(failures))
    elapsed = time.perf_counter() - started
    speed = {"x_real_time": round(simulated / wall, 1) if wall else None,
             "seeds_per_minute": round(len(seeds) / elapsed * 60, 1) if elapsed else None}
    if as_json:
        print(json.dumps({"seeds": summaries, "failed": failures, "checks": list(CHECKS), **speed}, indent=2))
    else:
        print(f"{len(seeds)} seeds, {len(failures)} failed {failures if failures else ''}; "
              f"{speed['x_real_time']:.0f}x real time, {speed['seeds_per_minute']:.0f} seeds per minute")
    return 1 if failures else 0


def parse_faults(text: str) -> tuple[str, ...]:
    if text in ("", "none"):
        return ()
    kinds = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [kind for kind in kinds if kind not in FAULT_KINDS + OPTIONAL_FAULT_KINDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault kinds {unknown}; choose from "
                                         f"{', '.join(FAULT_KINDS + OPTIONAL_FAULT_KINDS)}")
    return kinds


# A sweep runs ~100-250 seeds a minute on two cores: a million is days; more are run in parts
# (`--seed N --seeds M`). Unbounded, 10**20 seeds ended in an OverflowError traceback (the
# sweep's length must fit a C ssize_t).
SEEDS_MAX = 1_000_000


def seed_count(text: str) -> int:
    value = non_negative_int(text)
    if value > SEEDS_MAX:
        raise argparse.ArgumentTypeError(f"a sweep runs at most {SEEDS_MAX:,} seeds, got {text!r}: run more "
                                         f"in parts (--seed N --seeds M)")
    return value


# The simulated cluster's largest record (a partition's, with its topic's name) is ~210 bytes, and
# a record goes whole into one Raft entry: with smaller entries nothing commits, no controller ever
# runs, and every seed "fails" for the knob, not for a bug.
ENTRY_BYTES_MIN = 256


def entry_bytes(text: str) -> int:
    value = non_negative_int(text)
    if 0 < value < ENTRY_BYTES_MIN:
        raise argparse.ArgumentTypeError(f"must be 0 or at least {ENTRY_BYTES_MIN}, got {text!r}: the "
                                         f"simulated cluster's records go whole into one entry, the largest "
                                         f"~210 bytes")
    return value


def parse_variant(text: str) -> str:
    """A variant chaos/sim_variants.py names, or "" for none (an unknown name failed inside the sweep)."""
    from chaos.sim_variants import VARIANTS

    if text and text not in VARIANTS:
        raise argparse.ArgumentTypeError(f"unknown variant {text!r}; choose from {', '.join(VARIANTS)}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulator's flags, shared by `python -m chaos.simulator` and `railmq sim`."""
    parser.add_argument("--seed", type=non_negative_int, default=1, help="the seed of one run (default 1)")
    parser.add_argument("--seeds", type=seed_count, default=0,
                        help=f"sweep this many seeds starting at --seed, at most {SEEDS_MAX:,}")
    parser.add_argument("--controllers", type=int, default=0, choices=(0, 1, 3, 5),
                        help="0: one coordinator process (the default sweep); N: a controller quorum of N voters")
    parser.add_argument("--entry-bytes-max", type=entry_bytes, default=0,
                        help=f"with --controllers: their largest Raft entry in bytes (0: 1 MiB, else at "
                             f"least {ENTRY_BYTES_MIN}); a few hundred makes most metadata changes commit in "
                             f"parts")
    parser.add_argument("--duration-ms", type=milliseconds, default=SimConfig.duration_ms,
                        help="simulated time with faults")
    parser.add_argument("--steps", type=non_negative_int, default=0,
                        help="end the faulty phase after about this many steps (0: no limit)")
    parser.add_argument("--faults", type=parse_faults, default=FAULT_KINDS,
                        help=f"comma-separated fault kinds ({','.join(FAULT_KINDS)}; also "
                             f"{','.join(OPTIONAL_FAULT_KINDS)}, only when named) or 'none'")
    parser.add_argument("--variant", type=parse_variant, default="",
                        help="run with one deliberately broken rule (chaos/sim_variants.py names them)")
    parser.add_argument("--quiet", action="store_true", help="print only failures and the summary")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m chaos.simulator", description=simulator.__doc__.splitlines()[0])
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
