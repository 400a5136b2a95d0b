"""`railmq console` (the live console in a browser, with /metrics) and `railmq top` (the same
numbers in the terminal). The console itself lives in chaos/console/; this module only hangs it
under the command line, as cli_chaos.py does for the chaos harness.

    railmq console --bootstrap 127.0.0.1:7411 --http-port 7480 --data-dir ./railmq-data
    railmq top --bootstrap 127.0.0.1:7411

`--data-dir` gives the console the actors' trace (the event timeline, explain), the replicas'
log sizes and the cluster secret (the isolate buttons); without it the console looks for the
data directory through the coordinator's open trace file, which works for a cluster of the same
user on this machine. `railmq up --console` starts a cluster and a console together.
"""

from __future__ import annotations

import argparse
import sys

from actors.errors import ErrorCode, RailmqError
from railmq.cli_common import (
    EXIT_FAILED,
    EXIT_OK,
    add_cluster_arguments,
    milliseconds,
    non_negative_int,
    positive_int,
    print_error,
)

HTTP_PORT_DEFAULT = 7480
REFRESH_MS_DEFAULT = 500
EXTRA_HINT = "the console needs its extra: pip install 'railmq[console]'"


def http_port(text: str) -> int:
    port = non_negative_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0..65535; 0 picks a free one)")
    return port


def add_console_arguments(parser: argparse.ArgumentParser, *, data_dir: bool = True) -> None:
    parser.add_argument(
        "--http-port",
        type=http_port,
        default=HTTP_PORT_DEFAULT,
        metavar="N",
        help=f"serve the console at http://127.0.0.1:N/ (default {HTTP_PORT_DEFAULT}; 0: any free port)",
    )
    parser.add_argument(
        "--refresh-ms",
        type=milliseconds,
        default=REFRESH_MS_DEFAULT,
        metavar="MS",
        help=f"how often the topology is re-read (default {REFRESH_MS_DEFAULT}; elections and "
        "button presses refresh it at once)",
    )
    if data_dir:
        parser.add_argument(
            "--data-dir",
            default="",
            metavar="DIR",
            help="the cluster's data directory: its trace (timeline, explain), log sizes and "
            "secret (isolate buttons); default: found from the coordinator's open files",
        )


def register(commands: argparse._SubParsersAction) -> None:
    console = commands.add_parser(
        "console",
        help="a live console in the browser: topology, rates, lag, timeline, faults, explain, /metrics",
        description="Serve a live view of a running cluster at http://127.0.0.1:N/ with fault buttons and "
        "Prometheus metrics at /metrics, until Ctrl-C.",
    )
    add_console_arguments(console)
    add_cluster_arguments(console)
    console.set_defaults(handler=run_console)
    top = commands.add_parser(
        "top",
        help="the console's live numbers in the terminal, refreshed every second",
        description="Partitions, groups and the newest events of a running cluster, "
        "redrawn every second until Ctrl-C.",
    )
    top.add_argument(
        "--data-dir",
        default="",
        metavar="DIR",
        help="the cluster's data directory, for the timeline (default: found from the coordinator)",
    )
    top.add_argument(
        "--interval-ms", type=milliseconds, default=1000, metavar="MS", help="redraw period (default 1000)"
    )
    top.add_argument(
        "--iterations",
        type=positive_int,
        default=None,
        metavar="N",
        help="stop after N redraws (default: until Ctrl-C)",
    )
    add_cluster_arguments(top)
    top.set_defaults(handler=run_top)


class ConsoleUnavailable(RailmqError):
    def __init__(self, sentence: str) -> None:
        super().__init__(ErrorCode.INVALID_CONFIG, sentence)


def _console_module():
    """chaos.console.server, or ConsoleUnavailable naming the missing extra."""
    try:
        import starlette  # noqa: F401 - the extra's packages, checked before anything starts
        import uvicorn  # noqa: F401

        from chaos.console import server
    except ImportError as missing:
        raise ConsoleUnavailable(f"{missing}; {EXTRA_HINT}") from None
    return server


def serve_console(bootstrap: str, args: argparse.Namespace, *, cluster=None, data_dir: str = "") -> int:
    """Run a console until Ctrl-C or SIGTERM (the caller owns any cluster)."""
    from railmq.member_process import StopSignal

    server = _console_module()
    console = server.Console(
        bootstrap, http_port=args.http_port, data_dir=data_dir, cluster=cluster, refresh_ms=args.refresh_ms
    )
    try:
        with StopSignal() as stopping:
            console.start()
            print(
                f"railmq console at {console.url}/ (metrics at {console.url}/metrics); Ctrl-C stops it",
                flush=True,
            )
            while not stopping.is_set():
                stopping.wait(1.0)
    except server.ConsoleStartFailed as failed:
        print_error("CONSOLE_START_FAILED", str(failed))
        return EXIT_FAILED
    finally:
        for problem in console.stop():
            print(f"console: could not undo a fault: {problem}", file=sys.stderr)
    return EXIT_OK


def run_console(args: argparse.Namespace) -> int:
    return serve_console(args.bootstrap, args, data_dir=args.data_dir)


def run_top(args: argparse.Namespace) -> int:
    from chaos.console.collector import Collector
    from chaos.console.top import run_top as draw

    collector = Collector(args.bootstrap, data_dir=args.data_dir).start()
    try:
        draw(collector, interval_s=args.interval_ms / 1000, iterations=args.iterations)
    except KeyboardInterrupt:
        pass
    finally:
        collector.stop()
    return EXIT_OK


# --------------------------------------------------------------------------- railmq up --console


def add_up_arguments(up: argparse.ArgumentParser) -> None:
    up.add_argument(
        "--console",
        action="store_true",
        help="also serve the live console (http://127.0.0.1:N/, see --http-port); the cluster is "
        "started with the fault switch on, so the console's isolate buttons work",
    )
    add_console_arguments(up, data_dir=False)


def start_console_for(cluster, args: argparse.Namespace):
    """The console of `railmq up --console`, started on the cluster just started (None without
    --console); ConsoleUnavailable (one error line, exit 1) when it cannot start."""
    if not getattr(args, "console", False):
        return None
    server = _console_module()
    try:
        console = server.Console(
            cluster.bootstrap, http_port=args.http_port, cluster=cluster, refresh_ms=args.refresh_ms
        ).start()
    except server.ConsoleStartFailed as failed:
        raise ConsoleUnavailable(f"the console did not start: {failed}") from None
    print(f"console            {console.url}/ (metrics at {console.url}/metrics)", flush=True)
    return console


def stop_console(console) -> None:
    if console is None:
        return
    for problem in console.stop():
        print(f"console: could not undo a fault: {problem}", file=sys.stderr)
