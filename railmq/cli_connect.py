"""Is a railmq cluster there? One quick check before a command talks to the cluster.

A ZeroMQ socket connects lazily and queues what it is given, so a request to an address where
nothing listens simply waits for its whole timeout. Before a command that needs the cluster runs,
`check_cluster` opens a plain TCP connection to the address (refused at once when nothing
listens) and then asks for metadata, all within `CONNECT_CHECK_TIMEOUT_MS`, and raises
`ClusterUnreachable` with a sentence that names the address and says how to start a cluster.
"""

from __future__ import annotations

import socket
import time

from actors.controller_endpoints import split_bootstrap
from actors.errors import ErrorCode, RailmqError
from railmq.admin import Admin

# Long enough for a loaded machine to answer a metadata request, short enough to feel immediate.
CONNECT_CHECK_TIMEOUT_MS = 2_000
START_HINT = "start one with `railmq up --detach`, or point --bootstrap (or $RAILMQ_BOOTSTRAP) at it"


class ClusterUnreachable(Exception):
    """Nothing answers as a railmq coordinator at the address a command was given."""

    name = "CLUSTER_UNREACHABLE"


def _tcp_address(bootstrap: str) -> tuple[str, int] | None:
    if not bootstrap.startswith("tcp://"):
        return None
    host, _, port = bootstrap[len("tcp://"):].rpartition(":")
    return host, int(port)


def check_cluster(bootstrap: str, timeout_ms: int = CONNECT_CHECK_TIMEOUT_MS) -> None:
    """Any one voter listening is enough (a quorum with one voter down still serves)."""
    started = time.monotonic()
    reasons = []
    for part in split_bootstrap(bootstrap):
        address = _tcp_address(part)
        if address is None:
            reasons = []
            break
        try:
            socket.create_connection(address, timeout=timeout_ms / 1000).close()
            reasons = []
            break
        except OSError as error:
            reasons.append("the connection was refused" if isinstance(error, ConnectionRefusedError) else str(error))
    if reasons:
        raise ClusterUnreachable(f"nothing answers at {bootstrap} ({'; '.join(dict.fromkeys(reasons))}); "
                                 f"{START_HINT}")
    remaining_ms = max(200, int(timeout_ms - (time.monotonic() - started) * 1000))
    try:
        with Admin(bootstrap, timeout_ms=remaining_ms) as admin:
            admin.metadata([])
    except RailmqError as error:
        if error.code != ErrorCode.REQUEST_TIMED_OUT:
            raise
        raise ClusterUnreachable(f"something listens at {bootstrap} but no railmq coordinator answered within "
                                 f"{timeout_ms} ms; {START_HINT}") from None
