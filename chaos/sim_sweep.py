"""The seed sweep behind `python -m chaos.simulator` and `railmq sim`: run seeds, print outcomes.

`run(args)` takes the flags `chaos.simulator.add_arguments` defines, simulates each seed in turn
and prints one line per seed and a summary; a failing seed is printed with its problems and its
last events, so it can be replayed from the seed alone. It decides nothing about the simulation
itself: that is chaos/simulator.py.
"""

from __future__ import annotations

import argparse
import sys
import time

from chaos.simulator import SimConfig, SimulationFailed, simulate


def run(args: argparse.Namespace) -> int:
    """Run the seeds `add_arguments` describes; 1 when any failed."""
    config = SimConfig(duration_ms=args.duration_ms, faults=args.faults, steps_max=args.steps)
    seeds = range(args.seed, args.seed + max(1, args.seeds))
    failures, simulated, wall, started = [], 0.0, 0.0, time.perf_counter()
    for seed in seeds:
        result = simulate(seed, config)
        simulated += result.simulated_s
        wall += result.wall_s
        if not result.ok:
            failures.append(seed)
            print(SimulationFailed(seed, result.problems, result.trace), file=sys.stderr)
        elif not args.quiet:
            print(f"seed {seed}: ok  {result.simulated_s:.1f} simulated s in {result.wall_s:.2f} s, {result.steps} steps")
    elapsed = time.perf_counter() - started
    print(f"{len(seeds)} seeds, {len(failures)} failed {failures if failures else ''}; "
          f"{simulated / wall:.0f}x real time, {len(seeds) / elapsed * 60:.0f} seeds per minute")
    return 1 if failures else 0
