"""The `railmq` command line: parsing, dispatch and exit codes; the commands live in `cli_*.py`.

This module is the roof of the import graph (DESIGN.md): nothing imports it. It owns the rules
every command obeys:

- exit code 2 with argparse's message and the command's own usage for a bad flag or value (a
  `UsageError` raised by a command after parsing is reported the same way); flags have no
  abbreviations, and options may come before, between or after a command's values;
- exit code 1 with one line `error: NAME: sentence` on stderr for an operating error — a typed
  broker refusal (`RailmqError`), no cluster at the address (CLUSTER_UNREACHABLE, found in about a
  second before the command runs), no answer in time (REQUEST_TIMED_OUT), an unusable file — and
  never a Python traceback for one;
- exit code 0 when the command did what it was asked, including being stopped by Ctrl-C or
  SIGTERM where that is the normal way to end it (`up`, `consume`).

Command groups plug in through `COMMAND_GROUPS`: each entry is a `register(subcommands)`
function that adds its parsers and sets `handler` (a function `args -> exit code`) on each.
A new group (chaos, sim, lab, dlq) adds its module's `register` to the list. A command whose
values are a free-form list (`produce TOPIC VALUE...`) sets `takes_extra_values=True`; one whose
flags can contradict each other sets `precheck` (args -> None, raising UsageError), which runs
before the cluster is looked for.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

import railmq
from actors.errors import ErrorCode, RailmqError
from railmq import (
    cli_chaos, cli_cluster, cli_console, cli_data, cli_dlq, cli_groups, cli_lab, cli_node, cli_sim, cli_size,
    cli_topics,
)
from railmq.cli_common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, print_error
from railmq.cli_connect import ClusterUnreachable, check_cluster
from railmq.cli_parser import RailmqParser
from storage.directory import ClusterMismatch, DirectoryInUse, SecretExposed
from transport.supervisor import ActorStartFailed

Register = Callable[[argparse._SubParsersAction], None]


def _register_version(commands: argparse._SubParsersAction) -> None:
    version = commands.add_parser("version", help="print the railmq version")
    version.set_defaults(handler=run_version)


def run_version(args: argparse.Namespace) -> int:
    print(f"railmq {railmq.__version__}")
    return EXIT_OK


COMMAND_GROUPS: list[Register] = [
    cli_cluster.register,
    cli_node.register,
    cli_topics.register,
    cli_data.register,
    cli_groups.register,
    cli_dlq.register,
    cli_chaos.register,
    cli_sim.register,
    cli_size.register,
    cli_lab.register,
    cli_console.register,
    _register_version,
]


def build_parser() -> argparse.ArgumentParser:
    parser = RailmqParser(
        prog="railmq",
        description="railmq: a partitioned, replicated log you can run and break on one machine.",
        epilog="Start with `railmq up --detach`, then `railmq topics create orders`; "
               "`railmq COMMAND --help` explains each command.")
    parser.add_argument("-V", "--version", action="version", version=f"railmq {railmq.__version__}",
                        help="print the railmq version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMAND_GROUPS:
        register(commands)
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, letting values follow options (`produce orders --key k "paid 10"`): words argparse
    leaves over become the command's extra values if it takes them, else a usage error. After
    `--`, every word is a value of such a command, even one that starts with a dash."""
    words = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    if "--" in words and words[0] in _commands_taking_values(parser):
        cut = words.index("--")
        words, tail = words[:cut], words[cut + 1:]
    args, extra = parser.parse_known_args(words)
    if extra:
        leaf = getattr(args, "parser", parser)
        flags = [word for word in extra if word.startswith("-") and word != "-"]
        if flags or not getattr(args, "takes_extra_values", False):
            leaf.error(f"unrecognized arguments: {' '.join(flags or extra)}")
    if extra or tail:
        args.values = list(args.values or []) + extra + tail
    return args


def _commands_taking_values(parser: argparse.ArgumentParser) -> set[str]:
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return {name for name, child in commands.choices.items() if child.get_default("takes_extra_values")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv)
    try:
        precheck = getattr(args, "precheck", None)
        if precheck is not None:
            precheck(args)  # usage errors first: they need no cluster
        if getattr(args, "needs_cluster", False):
            check_cluster(args.bootstrap)
        return args.handler(args)
    except UsageError as error:
        error.parser.print_usage(sys.stderr)
        print(f"{error.parser.prog}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except ClusterUnreachable as error:
        print_error(error.name, str(error))
        return EXIT_FAILED
    except (DirectoryInUse, ClusterMismatch, ActorStartFailed) as error:
        # A cluster that must not start here (a directory in use, another cluster's, a lost
        # coordinator state): the sentence says why and what to do.
        print_error(_start_refusal_name(error), str(error))
        return EXIT_FAILED
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


def _start_refusal_name(error: Exception) -> str:
    if isinstance(error, DirectoryInUse):
        return "DIRECTORY_IN_USE"
    if isinstance(error, SecretExposed):
        return "CLUSTER_SECRET_EXPOSED"
    if isinstance(error, ClusterMismatch):
        return "INCONSISTENT_CLUSTER_ID"
    return "CLUSTER_START_REFUSED"


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
