"""`railmq sim`: the deterministic simulator from the command line (chaos/simulator.py).

    railmq sim --seed 7                 one run, replayable from its seed
    railmq sim --seed 1 --seeds 200     a sweep with a progress bar; failing seeds are printed with their last events
    railmq sim --seeds 20 --json        one JSON document: per seed what was checked and which faults ran

The sweep itself is chaos/sim_sweep.py.
"""

from __future__ import annotations

import argparse

from chaos.sim_sweep import add_arguments, run


def register(commands: argparse._SubParsersAction) -> None:
    sim = commands.add_parser("sim", help="simulate a whole cluster under faults, deterministically from a seed")
    add_arguments(sim)
    sim.add_argument("--json", action="store_true",
                     help="print one JSON document: each seed's checks, faults and problems, and the speed")
    sim.set_defaults(handler=run)
