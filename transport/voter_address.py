"""A voter's messages come from its own host: the address check of a quorum's Raft traffic.

Every Raft message names its sender (`source`, a voter id), and the cluster's authentication tag
proves only that the sender holds the cluster's secret. A second process holding it as voter N —
a cloned machine, a restored copy of node N's disk started while node N runs — would be a second
voter N: it votes for itself and asks the others for votes, and two processes counting voter N's
vote can elect two leaders in one term. Only one process can listen on voter N's configured
address, so a voter takes a Raft message naming voter N only from a connection whose remote
address is one of the addresses voter N's configured host resolves to (ZeroMQ's `Peer-Address`
property of a received frame). Anything else is dropped and counted (`rejected_wrong_address`),
and logged at most once a second. A host name that resolves differently later is looked up again
(at most once a second per voter) before a message is refused; an address literal never is. The
lookup runs in the voter's own loop: with host names in `--voters`, a slow resolver delays that
voter by up to its timeout, once a second at most, and only while a wrong address is sending.

On one machine every voter is 127.0.0.1 and the check cannot tell processes apart; there a second
process cannot take voter N's port. Where a host reaches the others from another address than
the one configured (several interfaces, NAT), `voter_address_check` (actors/limits.py) turns the
check off.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from typing import Any, Callable
from urllib.parse import urlsplit

log = logging.getLogger("railmq.quorum")

RESOLVE_INTERVAL_S = 1.0
LOG_INTERVAL_S = 1.0


def endpoint_host(endpoint: str) -> str:
    """The host of `tcp://HOST:PORT` (brackets of an IPv6 literal removed)."""
    return urlsplit(endpoint).hostname or ""


def normal_address(address: str) -> str:
    """An IPv4 peer seen through a dual-stack socket (`::ffff:10.0.0.2`) as plain IPv4."""
    address = address.strip("[]")
    return address[7:] if address.lower().startswith("::ffff:") and "." in address else address


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def resolve(host: str) -> frozenset[str]:
    """Every address `host` names (itself, for an address literal); empty when it does not resolve."""
    try:
        return frozenset(normal_address(info[4][0]) for info in socket.getaddrinfo(host, None))
    except (OSError, UnicodeError):
        return frozenset()


class VoterAddresses:
    """Where each voter's messages may come from, per its configured endpoint."""

    def __init__(self, voters: dict[int, str], *, resolver: Callable[[str], frozenset[str]] = resolve,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hosts = {int(voter): endpoint_host(endpoint) for voter, endpoint in voters.items()}
        self.resolver, self.clock = resolver, clock
        self.addresses: dict[int, frozenset[str]] = {}
        self.resolved_at: dict[int, float] = {}
        self.logged_at = -LOG_INTERVAL_S
        self.refused = 0

    def allows(self, voter: int, peer_address: str | None) -> bool:
        """Whether a message naming `voter` as its sender may have come from `peer_address`.
        A voter id outside the quorum is left to the actor (it drops what is not for its quorum)."""
        host = self.hosts.get(voter)
        if host is None:
            return True
        address = normal_address(peer_address or "")
        if address in self._addresses(voter, host, fresh=False):
            return True
        if address and not _is_literal(host) and address in self._addresses(voter, host, fresh=True):
            return True
        self.refused += 1
        now = self.clock()
        if now - self.logged_at >= LOG_INTERVAL_S:
            self.logged_at = now
            log.warning("a message naming voter %d came from %s, not from its host %s (%s): a second process "
                        "poses as voter %d; dropped (%d so far)", voter, address or "an unknown address", host,
                        ", ".join(sorted(self.addresses.get(voter, ()))) or "unresolved", voter, self.refused)
        return False

    def _addresses(self, voter: int, host: str, *, fresh: bool) -> frozenset[str]:
        known = self.addresses.get(voter)
        now = self.clock()
        if known is None or (fresh and now - self.resolved_at.get(voter, -RESOLVE_INTERVAL_S) >= RESOLVE_INTERVAL_S):
            known = self.resolver(host)
            self.addresses[voter], self.resolved_at[voter] = known, now
        return known


def raft_address_check(voters: dict[int, str]) -> Callable[[Any, Any], bool]:
    """The runtime's `peer_check` for a voter of a quorum: Raft messages only from their voter's host."""
    from actors.raft_messages import RaftMessage

    addresses = VoterAddresses(voters)

    def check(message: Any, frame: Any) -> bool:
        if not isinstance(message, RaftMessage):
            return True
        get = getattr(frame, "get", None)
        try:
            peer = get("Peer-Address") if get is not None else None
        except Exception:  # zmq.ZMQError: a transport without the property (inproc, ipc)
            peer = None
        if peer is None:
            return True  # nothing to compare: voters listen on TCP only, which always has it
        return addresses.allows(message.source, peer)

    return check
