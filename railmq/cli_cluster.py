"""`railmq up` (a local cluster, in the foreground or `--detach`ed), `down`, `cluster info|health`
(railmq/cli_health.py) and `railmq demo` (the main job, end to end).

Both own a `LocalCluster` for their whole life and always stop it — on Ctrl-C, SIGTERM, an error
or a normal end — so no actor process and (for the demo) no temporary directory outlives them.
A foreground `up` records itself in `<data dir>/railmq.json` while it runs, which is how
`up --detach` knows it started and `down` finds it (railmq/cli_daemon.py). A foreground `up` put
in the background of a shell (`railmq up &`) draws no spinner and says that Ctrl-C will not reach it.
Actor processes ignore SIGINT (transport/actor_main.py): the terminal's Ctrl-C reaches only this
process's handler, which stops the actors in order.

The demo's claim is the README's: records with the same key land on the same partition and are
read back in the order they were sent. It checks that claim on what it reads and exits 1 if it
did not hold.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
import time
from contextlib import nullcontext

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from actors.errors import ErrorCode, RailmqError
from actors.limits import NODES_MAX
from railmq.admin import Admin
from railmq import cli_console, cli_health
from railmq.cli_common import (
    BOOTSTRAP_ENVIRONMENT, DEFAULT_PORT, EXIT_FAILED, EXIT_OK, clients_default_bootstrap, default_port,
    UsageError, directory, non_negative_int, positive_int, print_error, seconds,
)
from railmq.cli_daemon import remove_state, run_detached, run_down, write_state
from railmq.cluster import LocalCluster
from railmq.consumer import Consumer
from railmq.member_process import StopSignal
from railmq.producer import Producer
from railmq.terminal_text import cell

DATA_DIR_DEFAULT = "./railmq-data"
# How often `up` wakes while waiting for a stop signal (signals also interrupt the wait).
UP_WAKE_INTERVAL_S = 1.0
DEMO_TOPIC = "orders"
DEMO_KEYS = ("alice", "bob", "carol", "dave", "erin")  # user ids that cover all 3 partitions
DEMO_MESSAGES_PER_KEY = 6
# Reading the demo's 30 records back takes well under a second; this bounds a broken cluster.
DEMO_READ_TIMEOUT_S = 10.0



def node_count(text: str) -> int:
    value = positive_int(text)
    if value > NODES_MAX:
        raise argparse.ArgumentTypeError(f"a cluster has at most {NODES_MAX} nodes, got {text!r}")
    return value

def register(commands: argparse._SubParsersAction) -> None:
    up = commands.add_parser("up", help="run a local cluster (foreground: Ctrl-C stops it; --detach: railmq down)",
                             description="Run a local cluster on this machine.")
    up.add_argument("--nodes", type=node_count, default=3, metavar="N",
                    help=f"broker nodes, at most {NODES_MAX} (default 3)")
    up.add_argument("--data-dir", type=directory, default=DATA_DIR_DEFAULT, metavar="DIR",
                    help=f"where data lives (default {DATA_DIR_DEFAULT})")
    up.add_argument("--port", type=tcp_port, default=default_port(), metavar="P",
                    help=f"the first controller's port (the other controllers, then the group voters, take "
                         f"P+1, P+2, ...); clients use "
                         f"127.0.0.1:P (default: the port of ${BOOTSTRAP_ENVIRONMENT} when it names this machine, "
                         f"else {DEFAULT_PORT})")
    up.add_argument("--controllers", type=non_negative_int, default=None, metavar="N",
                    help="voters of the controller quorum, one per node (default 3, or 1 below three nodes); "
                         "0 runs a single coordinator process instead (no quorum)")
    up.add_argument("-d", "--detach", action="store_true",
                    help="run in the background and return once it answers; `railmq down` stops it")
    up.add_argument("--rebuild-metadata", action="store_true",
                    help="the coordinator's state is lost: rebuild topics, placement and epochs from the replica "
                         "directories first (their own records), then start (docs/operations.md)")
    up.add_argument("--reset-group-state", action="store_true",
                    help="the group coordinator's state is lost: start it empty, accepting that every group's "
                         "committed offsets are gone (consumers start at their auto_offset_reset; "
                         "docs/operations.md)")
    cli_console.add_up_arguments(up)
    up.set_defaults(handler=run_up, precheck=check_ports_fit)
    down = commands.add_parser("down", help="stop the cluster `railmq up --detach` started")
    down.add_argument("--data-dir", type=directory, default=DATA_DIR_DEFAULT, metavar="DIR",
                      help=f"the data directory it was started with (default {DATA_DIR_DEFAULT})")
    down.add_argument("--timeout", type=seconds, default=60.0, metavar="SECONDS",
                      help="how long to wait for it to stop before killing it")
    down.set_defaults(handler=run_down)
    cli_health.register(commands)
    demo = commands.add_parser("demo", help="start a cluster, send keyed messages, show per-key order, stop")
    demo.set_defaults(handler=run_demo)


# --------------------------------------------------------------------------- up


def tcp_port(text: str) -> int:
    port = non_negative_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0..65535; 0 picks a free one)")
    return port


def check_ports_fit(args: argparse.Namespace) -> None:
    """The ports from P the cluster takes must all be TCP ports (`--port 65535` with three
    controllers would take 65535-65540)."""
    last = args.port + ports_taken(args) - 1
    if args.port and last > 65535:
        raise UsageError(args.parser, f"--port {args.port}: the controllers and group voters take ports "
                                      f"{args.port}-{last}, past 65535; choose a lower one")


def quorum_size(args: argparse.Namespace) -> int:
    """How many controllers `railmq up` starts with these flags (LocalCluster's rule)."""
    if args.controllers is not None:
        return args.controllers
    return 3 if args.nodes >= 3 else 1


def ports_taken(args: argparse.Namespace) -> int:
    """How many consecutive ports from P the cluster takes: the controllers', then the group voters'."""
    return 2 * quorum_size(args) if quorum_size(args) else 1


def taken_port(args: argparse.Namespace) -> int | None:
    """The first port of P, P+1, ... the voters take, or the console's (`--console`), that
    something else listens on: checked before anything starts."""
    wanted = range(args.port, args.port + ports_taken(args)) if args.port else range(0)
    console = [args.http_port] if getattr(args, "console", False) and args.http_port else []
    for port in [*wanted, *console]:
        if not port_is_free(port):
            return port
    return None


def port_in_use_text(args: argparse.Namespace, port: int) -> str:
    if getattr(args, "console", False) and port == args.http_port:
        return f"port {port} on 127.0.0.1 is in use (the console's); choose another with --http-port"
    count = ports_taken(args)
    taken = f" (the controllers and group voters take ports {args.port}-{args.port + count - 1})" if count > 1 else ""
    return f"port {port} on 127.0.0.1 is in use{taken}; choose another with --port"


def port_is_free(port: int) -> bool:
    if port == 0:
        return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def run_up(args: argparse.Namespace) -> int:
    if args.controllers is not None and args.controllers > args.nodes:
        print_error("INVALID_CONFIG", f"--controllers {args.controllers} needs as many nodes (one controller per "
                                      f"node); --nodes is {args.nodes}")
        return EXIT_FAILED
    if args.detach:
        return run_detached(args, taken_port, port_in_use_text)
    taken = taken_port(args)
    if taken is not None:
        print_error("INVALID_CONFIG", port_in_use_text(args, taken))
        return EXIT_FAILED
    console = Console()
    background = in_shell_background()
    with StopSignal() as stopping:
        cluster = LocalCluster(nodes=args.nodes, data_dir=args.data_dir, port=args.port,
                               rebuild_metadata=args.rebuild_metadata, controllers=args.controllers,
                               reset_group_state=args.reset_group_state,
                               fault_injection=args.console)  # the console's isolate buttons need it
        web = None
        try:
            with console.status(f"starting {args.nodes} nodes...") if not background else nullcontext():
                cluster.start()
            write_state(args.data_dir, cluster.bootstrap, len(cluster.node_ids))
            _announce(console, cluster, background)
            web = cli_console.start_console_for(cluster, args)
            while not stopping.is_set():
                stopping.wait(UP_WAKE_INTERVAL_S)
            console.print("stopping...")
        finally:
            cli_console.stop_console(web)
            cluster.stop()
            remove_state(args.data_dir)
    console.print("stopped")
    return EXIT_OK


def in_shell_background() -> bool:
    """True for a job put in the background of an interactive shell (`railmq up &`): the
    terminal's Ctrl-C goes to the foreground job, and a spinner would draw over the prompt."""
    try:
        return os.getpgrp() != os.tcgetpgrp(sys.stdout.fileno())
    except OSError:
        return False  # no terminal: nothing to draw over


def _announce(console: Console, cluster: LocalCluster, background: bool = False) -> None:
    endpoints = {actor["kind"]: actor["endpoint"] for actor in cluster.actors()}
    bootstrap = cluster.bootstrap.split(",")[0]  # one voter is enough: clients learn the others
    role = "controllers" if "," in cluster.bootstrap else "coordinator"
    lines = [
        f"{role:<19}{cluster.bootstrap}",
        f"group coordinator  {endpoints.get('group-coordinator', '-')}",
        f"nodes              {', '.join(map(str, cluster.node_ids))}",
        f"data               {cell(cluster.data_dir)}",  # a path may look like markup: `runs/[/]x`
    ]
    stopping = "kill %1 (or kill the pid) stops it" if background else "Ctrl-C stops it"
    console.print(Panel("\n".join(lines), title="railmq is up", subtitle=stopping, expand=False))
    if background:
        console.print("this runs in the background of your shell, where Ctrl-C does not reach it; "
                      "`railmq up --detach` and `railmq down` are made for that", highlight=False)
    flag = "" if bootstrap == clients_default_bootstrap() else f" --bootstrap {bootstrap}"
    replication = min(3, len(cluster.node_ids))
    console.print(f"try: railmq topics create demo --replication-factor {replication}{flag}"
                  f" && railmq produce demo hello{flag} && railmq consume demo --from-beginning -e{flag}",
                  soft_wrap=True, highlight=False)
    sys.stdout.flush()


# --------------------------------------------------------------------------- demo


def run_demo(args: argparse.Namespace) -> int:
    console = Console()
    started = time.monotonic()
    cluster = LocalCluster(nodes=3)  # in a temporary directory, removed on stop
    with console.status("starting a 3-node cluster...") as status:
        try:
            cluster.start()
            status.update(f"creating topic {DEMO_TOPIC!r}: 3 partitions, replication factor 3, "
                          "min in-sync 2...")
            with Admin(cluster.bootstrap) as admin:
                admin.create_topic(DEMO_TOPIC, partitions=3, replication_factor=3,
                                   config={"min_insync_replicas": 2})
            status.update(f"sending {len(DEMO_KEYS) * DEMO_MESSAGES_PER_KEY} keyed messages with acks=all...")
            landed = _send_demo_messages(cluster.bootstrap)
            status.update("reading everything back from the beginning...")
            read = _read_demo_messages(cluster.bootstrap, len(landed))
            processes = cluster.actors()
        finally:
            status.update("stopping the cluster...")
            cluster.stop()
    in_order = _show_demo(console, landed, read, processes)
    elapsed_s = time.monotonic() - started
    console.print(f"done in {elapsed_s:.1f} s; the cluster is stopped and its files are gone")
    return EXIT_OK if in_order else EXIT_FAILED


def _send_demo_messages(bootstrap: str) -> list[tuple[str, int, int, int]]:
    """(key, sequence, partition, offset) per acknowledged message, keys interleaved."""
    with Producer(bootstrap, acks="all", linger_ms=5, client_id="railmq-demo") as producer:
        sent = [(key, sequence, producer.send(DEMO_TOPIC, f"{key}:{sequence}", key=key))
                for sequence in range(DEMO_MESSAGES_PER_KEY) for key in DEMO_KEYS]
        producer.flush(DEMO_READ_TIMEOUT_S)
        acknowledged = [(key, sequence, future.result(0)) for key, sequence, future in sent]
        return [(key, sequence, ack.partition, ack.offset) for key, sequence, ack in acknowledged]


def _read_demo_messages(bootstrap: str, expected: int) -> list[tuple[str, int, int]]:
    """(key, sequence, partition) in the order a consumer reads them."""
    with Consumer(bootstrap, auto_offset_reset="earliest", client_id="railmq-demo") as consumer:
        consumer.assign([(DEMO_TOPIC, partition) for partition in range(3)])
        records = []
        deadline = time.monotonic() + DEMO_READ_TIMEOUT_S
        while len(records) < expected and time.monotonic() < deadline:
            records += consumer.poll(200)
    if len(records) < expected:
        raise RailmqError(ErrorCode.REQUEST_TIMED_OUT, f"read {len(records)} of {expected} messages back")
    out = []
    for record in records:
        key, _, sequence = record.value.decode().rpartition(":")
        out.append((key, int(sequence), record.partition))
    return out


def _show_demo(console: Console, landed: list, read: list, processes: list[dict]) -> bool:
    table = Table(title=f"where each key landed (topic {DEMO_TOPIC})", title_justify="left")
    for column in ("key", "partition", "sent", "read back in this order", "per-key order"):
        table.add_column(column, justify="left")
    in_order = True
    for key in DEMO_KEYS:
        partitions = sorted({partition for k, _, partition, _ in landed if k == key})
        sequences = [sequence for k, sequence, _ in read if k == key]
        held = (sequences == sorted(sequences) and len(sequences) == DEMO_MESSAGES_PER_KEY
                and len(partitions) == 1)
        in_order &= held
        table.add_row(key, ",".join(map(str, partitions)), str(DEMO_MESSAGES_PER_KEY),
                      " ".join(map(str, sequences)), "[green]held[/]" if held else "[bold red]BROKEN[/]")
    console.print(table)
    actors = Table(title="the cluster's processes", title_justify="left")
    for column in ("name", "kind", "pid"):
        actors.add_column(column, justify="right" if column == "pid" else "left")
    for actor in sorted(processes, key=lambda actor: actor["name"]):
        actors.add_row(actor["name"], actor["kind"], str(actor["pid"]))
    console.print(actors)
    return in_order
