"""`railmq node`: run one node of a cluster that spans machines (railmq/node.py, docs/deploy.md).

    railmq node --node 1 --voters 1=10.0.0.1,2=10.0.0.2,3=10.0.0.3 --data-dir /var/lib/railmq
    railmq node --node 2 --join 10.0.0.1:7411 --advertise 10.0.0.2 --identity-from /etc/railmq/identity

`--voters` names every node and the host its peers reach it at (the same on every node); `--join`
asks a running controller for that list instead. The process runs in the foreground until SIGINT
or SIGTERM, like `railmq up`.
"""

from __future__ import annotations

import argparse
import re

from rich.console import Console

from actors.limits import NODE_ID_MAX
from actors.messages import ControllerStatusRequest, ControllerStatusResponse
from railmq.cli_common import EXIT_FAILED, EXIT_OK, directory, endpoint, positive_int, print_error

UP_WAKE_INTERVAL_S = 0.5
JOIN_TIMEOUT_MS = 5_000
_TCP = re.compile(r"^tcp://(?P<host>[^:]+):(?P<port>\d+)$")



def node_id(text: str) -> int:
    value = positive_int(text)
    if value > NODE_ID_MAX:
        raise argparse.ArgumentTypeError(
            f"a node id is 1 to {NODE_ID_MAX} (Kafka's int32 node.id), got {text!r}")
    return value

def host(text: str) -> str:
    """An address to listen at or advertise; it travels in messages as UTF-8 text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not UTF-8, so no address") from None
    return text


def register(commands: argparse._SubParsersAction) -> None:
    from railmq.node import DEFAULT_NODE_PORT

    node = commands.add_parser("node", help="run one node of a cluster across machines (docs/deploy.md)",
                               description="Run one node: its controller, its group voter, its replicas.")
    node.add_argument("--node", type=node_id, required=True, metavar="N", help="this node's id")
    where = node.add_mutually_exclusive_group(required=True)
    where.add_argument("--voters", metavar="N=HOST,...",
                       help="every node and the address its peers reach it at, the same list on every node")
    where.add_argument("--join", type=endpoint, metavar="HOST:PORT",
                       help="ask this running controller for the voters instead of --voters")
    node.add_argument("--port", type=positive_int, default=DEFAULT_NODE_PORT, metavar="P",
                      help=f"the controller's port on every node; the group voter takes P+1 (default {DEFAULT_NODE_PORT})")
    node.add_argument("--bind", type=host, default="", metavar="ADDRESS",
                      help="where this node's processes listen (default: the advertised address)")
    node.add_argument("--advertise", type=host, default="", metavar="HOST",
                      help="the address other nodes and clients reach this node at (default: its --voters entry)")
    node.add_argument("--data-dir", type=directory, required=True, metavar="DIR",
                      help="this node's data directory")
    node.add_argument("--identity-from", default="", metavar="DIR",
                      help="a directory with the cluster's cluster.meta and cluster.secret, copied into a new "
                           "data directory (every node but the first)")
    node.add_argument("--limits", default="", metavar="FILE",
                      help="a JSON object of timeouts and bounds to change from their defaults (actors/limits.py), "
                           "the same file on every node")
    node.add_argument("--shared-memory", action="store_true",
                      help="hand fetches over shared-memory rings (only when every node shares this machine's /dev/shm)")
    node.set_defaults(handler=run_node)


def voters_from_controller(bootstrap: str) -> tuple[dict[int, str], int]:
    """(node -> host, controller port) as a running controller knows its quorum."""
    from railmq.admin import Admin

    with Admin(bootstrap, timeout_ms=JOIN_TIMEOUT_MS) as admin:
        status = admin.rpc.request(bootstrap, ControllerStatusRequest(correlation_id=0), JOIN_TIMEOUT_MS)
    if not isinstance(status, ControllerStatusResponse) or not status.voters:
        raise ValueError(f"{bootstrap} did not answer as a controller of a quorum")
    hosts, ports = {}, set()
    for node, address in status.voters.items():
        match = _TCP.match(address)
        if match is None:
            raise ValueError(f"voter {node} has an endpoint railmq node cannot reuse: {address}")
        hosts[int(node)] = match.group("host")
        ports.add(int(match.group("port")))
    if len(ports) != 1:
        raise ValueError(f"the voters listen on different ports {sorted(ports)}: give --voters and --port")
    return hosts, ports.pop()


def run_node(args: argparse.Namespace) -> int:
    from railmq.member_process import StopSignal
    from railmq.node import ClusterNode, NodeConfigError, load_limits, parse_voters
    from railmq.quorum_formed import QuorumUndecided

    try:
        if args.join:
            voters, port = voters_from_controller(args.join)
        else:
            voters, port = parse_voters(args.voters), args.port
        node = ClusterNode(args.node, voters=voters, data_dir=args.data_dir, port=port, bind_host=args.bind,
                           advertise_host=args.advertise, identity_from=args.identity_from,
                           shared_memory=args.shared_memory, limits=load_limits(args.limits) if args.limits else None)
    except (NodeConfigError, ValueError) as error:
        print_error("INVALID_CONFIG", str(error))
        return EXIT_FAILED
    console = Console()
    with StopSignal() as stopping:
        try:
            try:
                node.start(stopping)
            except NodeConfigError as error:  # found only at the start (an --identity-from lacking a file)
                print_error("INVALID_CONFIG", str(error))
                return EXIT_FAILED
            except QuorumUndecided:  # stopped while its voters waited to hear whether the quorum formed
                console.print("stopped")
                return EXIT_OK
            console.print(f"railmq node {node.node} is up: controller {node.controller_endpoints[node.node]}, "
                          f"group voter {node.group_voter_endpoints[node.node]}, cluster {node.cluster_id}; "
                          f"clients: --bootstrap {node.bootstrap}", highlight=False, soft_wrap=True)
            while not stopping.is_set():
                stopping.wait(UP_WAKE_INTERVAL_S)
        finally:
            node.stop()
    console.print("stopped")
    return EXIT_OK
