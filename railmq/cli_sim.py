"""`railmq sim`: the deterministic simulator from the command line (chaos/simulator.py).

    railmq sim --seed 7                 one run, replayable from its seed
    railmq sim --seed 1 --seeds 200     a sweep; failing seeds are printed with their last events
"""

from __future__ import annotations

import argparse

from chaos.simulator import add_arguments, run


def register(commands: argparse._SubParsersAction) -> None:
    sim = commands.add_parser("sim", help="simulate a whole cluster under faults, deterministically from a seed")
    add_arguments(sim)
    sim.set_defaults(handler=run)
