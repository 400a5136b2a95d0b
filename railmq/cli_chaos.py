"""`railmq chaos list|run|check`: the chaos harness under the railmq command.

The commands themselves live in `chaos/__main__.py` (also reachable as `python -m chaos`); this
module only hangs them under `railmq chaos`, so both entry points parse, run and exit alike:
0 valid (or the loss a teaching scenario expects), 1 a safety violation, 2 an unreadable history
or a misused command.
"""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    from chaos.__main__ import add_commands

    chaos = commands.add_parser(
        "chaos", help="break a real cluster on purpose and check that no acknowledged write was lost",
        description="Run named fault scenarios (kill, pause, partition, disk faults) against a local "
                    "cluster under load, then check the recorded history.")
    actions = chaos.add_subparsers(dest="chaos_command", required=True, metavar="ACTION")
    add_commands(actions)
