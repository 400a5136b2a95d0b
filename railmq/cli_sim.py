"""`railmq sim`: the deterministic simulator from the command line (chaos/simulator.py).

    railmq sim --seed 7                 one run, replayable from its seed
    railmq sim --seed 1 --seeds 200     a sweep; failing seeds are printed with their last events
"""

from __future__ import annotations

import argparse

from chaos.simulator import FAULT_KINDS, SimConfig, main as simulator_main, parse_faults


def register(commands: argparse._SubParsersAction) -> None:
    sim = commands.add_parser("sim", help="simulate a whole cluster under faults, deterministically from a seed")
    sim.add_argument("--seed", type=int, default=1, help="the seed of one run (default 1)")
    sim.add_argument("--seeds", type=int, default=0, help="sweep this many seeds starting at --seed")
    sim.add_argument("--duration-ms", type=int, default=SimConfig.duration_ms, help="simulated time with faults")
    sim.add_argument("--steps", type=int, default=0, help="end the faulty phase after about this many steps")
    sim.add_argument("--faults", type=parse_faults, default=FAULT_KINDS,
                     help=f"comma-separated fault kinds ({','.join(FAULT_KINDS)}) or 'none'")
    sim.add_argument("--quiet", action="store_true", help="print only failures and the summary")
    sim.set_defaults(handler=run_sim)


def run_sim(args: argparse.Namespace) -> int:
    argv = ["--seed", str(args.seed), "--seeds", str(args.seeds), "--duration-ms", str(args.duration_ms),
            "--steps", str(args.steps), "--faults", ",".join(args.faults) or "none"]
    if args.quiet:
        argv.append("--quiet")
    return simulator_main(argv)
