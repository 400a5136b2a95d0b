"""What the connections of this process's DEALERs may hold before it reads them as messages.

A DEALER connects to whatever listens on its peer's endpoint, and endpoints are claims: a dead
leader's or controller's port may be taken by any local process, and a client's DEALER reconnects
to it by itself. libzmq bounds what such a peer can queue in whole messages (ZMQ_RCVHWM) and
frames (ZMQ_MAXMSGSIZE), but a message is whole only at its last frame: one message of ever more
frames, each marked "more", is never a message the runtime can read, and libzmq kept all of it
(320 MiB for 320 frames of 1 MiB, and no end but the machine's memory).

So, as for a ROUTER's client connections (transport/connections.py, whose table and kernel
counts this reuses), each DEALER connection's descriptor is learnt from its monitor's CONNECTED
event and watched for data (edge-triggered); `client_inbound_check_interval_ms` after data came,
the kernel is asked what each has received less the messages read from it, and while together
they hold more than `peer_inbound_bytes_max`, the one holding the most is shut down. Its DEALER
sees the stream end, the actor hears that its peer went (`PeerDisconnected`) and asks again as
for any lost connection. A legitimate peer holds one message in progress and a few whole ones
unread: far below the budget.
"""

from __future__ import annotations

from typing import Callable

import zmq

from transport.connections import ConnectionTable, bytes_received, peer_of, shut_down


class PeerInbound:
    def __init__(self, *, inbound_bytes_max: int, check_interval_ms: int, clock: Callable[[], int],
                 count: Callable[[str], None], watch: Callable[[int], None],
                 unwatch: Callable[[int], None]) -> None:
        # Every DEALER connection is counted: none is exempt (untrusted_max is never applied here).
        self.table = ConnectionTable(untrusted_max=0, inbound_bytes_max=inbound_bytes_max)
        self.check_interval_ns = check_interval_ms * 1_000_000
        self.check_at_ns: int | None = None
        self._owner: dict[int, str] = {}  # descriptor -> the endpoint whose DEALER holds it
        self._clock, self._count = clock, count
        self._watch, self._unwatch = watch, unwatch

    def connected(self, endpoint: str, fd: int) -> None:
        """A DEALER's monitor reported a connection on `fd`."""
        peer = peer_of(fd)
        if peer is None:
            return  # gone already
        self.table.accepted(fd, peer)
        self._owner[fd] = endpoint
        self._watch(fd)
        self.data_arrived()  # what came before the watch began

    def gone(self, endpoint: str, fd: int) -> None:
        """A DEALER's monitor reported the connection on `fd` closed. Monitors are read in no set
        order, so a number another DEALER's new connection already has is left alone."""
        if self._owner.get(fd) == endpoint:
            self._forget(fd)

    def closed(self, endpoint: str) -> None:
        """The DEALER of `endpoint` is closed here (its monitor reports nothing more)."""
        for fd in [fd for fd, owner in self._owner.items() if owner == endpoint]:
            self._forget(fd)

    def arrived(self, frames: list) -> None:
        """A message read from a DEALER (frames received without copying)."""
        self.table.active(frames[0].get(zmq.SRCFD), frames)

    def close_connection(self, fd: int) -> bool:
        """Shut down the connection on `fd` (it sent what no peer of railmq sends); False if it is
        not one of ours, or already gone."""
        peer = self.table.take(fd)
        if peer is None or self._owner.pop(fd, None) is None:
            return False
        self._unwatch(fd)
        return shut_down(fd, peer)

    def data_arrived(self) -> None:
        if self.check_at_ns is None:
            self.check_at_ns = self._clock() + self.check_interval_ns

    def check_if_due(self) -> None:
        """Shut down the connections holding the most bytes not yet read as messages while
        together they hold more than the budget."""
        if self.check_at_ns is None or self._clock() < self.check_at_ns:
            return
        for fd, peer in self.table.over_inbound_budget(bytes_received):
            self._owner.pop(fd, None)
            self._unwatch(fd)
            closed = shut_down(fd, peer)
            self._count("peer_connections_closed_over_bytes" if closed else "peer_connections_forgotten")
        self.check_at_ns = self._clock() + self.check_interval_ns if self.table.held_bytes > 0 else None

    def _forget(self, fd: int) -> None:
        del self._owner[fd]
        self.table.gone(fd)
        self._unwatch(fd)
