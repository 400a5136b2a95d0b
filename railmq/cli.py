"""The `railmq` command line: parsing, dispatch and exit codes; the commands live in `cli_*.py`.

This module is the roof of the import graph (DESIGN.md): nothing imports it. It owns three rules
every command obeys:

- exit code 2 with argparse's message for a bad flag or value (a `UsageError` raised by a command
  after parsing is reported the same way);
- exit code 1 with one line `error: NAME: sentence` on stderr for an operating error — a typed
  broker refusal (`RailmqError`), no answer in time (REQUEST_TIMED_OUT), an unusable file — and
  never a Python traceback for one;
- exit code 0 when the command did what it was asked, including being stopped by Ctrl-C or
  SIGTERM where that is the normal way to end it (`up`, `consume`).

Command groups plug in through `COMMAND_GROUPS`: each entry is a `register(subcommands)`
function that adds its parsers and sets `handler` (a function `args -> exit code`) on each.
A new group (chaos, sim, lab, dlq) adds its module's `register` to the list.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from typing import Callable, Sequence

from actors.errors import ErrorCode, RailmqError
from railmq import (
    cli_chaos, cli_cluster, cli_data, cli_dlq, cli_groups, cli_lab, cli_sim, cli_size, cli_topics,
)
from railmq.cli_common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, print_error

Register = Callable[[argparse._SubParsersAction], None]


def _register_version(commands: argparse._SubParsersAction) -> None:
    version = commands.add_parser("version", help="print the railmq version")
    version.set_defaults(handler=run_version)


def run_version(args: argparse.Namespace) -> int:
    print(f"railmq {package_version()}")
    return EXIT_OK


def package_version() -> str:
    try:
        return metadata.version("railmq")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


COMMAND_GROUPS: list[Register] = [
    cli_cluster.register,
    cli_topics.register,
    cli_data.register,
    cli_groups.register,
    cli_dlq.register,
    cli_chaos.register,
    cli_sim.register,
    cli_size.register,
    cli_lab.register,
    _register_version,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="railmq",
        description="railmq: a partitioned, replicated log you can run and break on one machine.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMAND_GROUPS:
        register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except UsageError as error:
        error.parser.print_usage(sys.stderr)
        print(f"{error.parser.prog}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except RailmqError as error:
        print_error(error.name, _sentence(error))
        return EXIT_FAILED
    except TimeoutError as error:
        print_error(ErrorCode.REQUEST_TIMED_OUT.name, str(error))
        return EXIT_FAILED
    except BrokenPipeError:
        _silence_stdout()  # the reader went away (`railmq consume | head`): a normal end
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except OSError as error:
        print_error("OS_ERROR", str(error))
        return EXIT_FAILED


def _sentence(error: RailmqError) -> str:
    """The broker's sentence without the `NAME: ` prefix the exception text already carries."""
    text = str(error)
    prefix = f"{error.name}: "
    return text[len(prefix):] if text.startswith(prefix) else text


def _silence_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


def entry_point() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
