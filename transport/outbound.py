"""A byte budget for what an actor has handed ZeroMQ to send and the peer has not read yet.

ZeroMQ's send high-water mark counts messages, not bytes: a ROUTER holds up to SNDHWM messages per
peer, each up to a fetch's worth of records. A client that sends fetches and never reads its socket
would make a leader hold SNDHWM x 64 MiB. So every answer to a ROUTER peer of TRACK_BYTES_MIN or
more is sent tracked (pyzmq's MessageTracker: done once libzmq has taken it off the peer's queue,
i.e. the peer is reading), and the bytes not done are counted per peer and in total. An answer
that would take a peer past `peer_outbound_bytes_max`, or the actor past `outbound_bytes_max`, is
not sent: the runtime answers with a small BUSY instead ("read what you were sent first"), and the
peer asks again once it drains. Smaller answers are not tracked (a tracker costs ~20 us of the
send): the ROUTER's SNDHWM (`router_send_queue_max`) bounds them, to router_send_queue_max x
TRACK_BYTES_MIN per peer. Counting only answers of 64 KiB or more let one connection that never
read hold ~430 MiB of answers just under that size.

The budget over all peers protects the actor's memory, and alone it did not protect its clients:
four connections that sent fetches and never read held a leader's whole `outbound_bytes_max`, and
until they read or went, every client's large answers were BUSY. So when a peer within its own
budget is refused for the actor's, the runtime closes the client connections whose answers have
waited unread longest past `client_unread_answers_close_ms`, holding the most first
(`unread_longest`), and their queues go with them. A cluster process's connection is never
closed (transport/connections.py).
"""

from __future__ import annotations

from collections import deque
from typing import Any

TRACK_BYTES_MIN = 4 * 1024  # answers below this are bounded by the ROUTER's SNDHWM instead


class OutboundBudget:
    def __init__(self, peer_bytes_max: int, total_bytes_max: int) -> None:
        self.peer_bytes_max = peer_bytes_max
        self.total_bytes_max = total_bytes_max
        self._pending: dict[Any, deque[tuple[Any, int, int]]] = {}  # (tracker, size, sent at ns)
        self._peer_bytes: dict[Any, int] = {}
        self.total_bytes = 0

    def outstanding(self, peer: Any) -> int:
        self._prune(peer)
        return self._peer_bytes.get(peer, 0)

    def allows(self, peer: Any, size: int) -> bool:
        """True when `size` more bytes to `peer` keep it and the actor within their budgets."""
        if size < TRACK_BYTES_MIN:
            return True
        self.prune_all()
        return (self._peer_bytes.get(peer, 0) + size <= self.peer_bytes_max
                and self.total_bytes + size <= self.total_bytes_max)

    def within_peer_budget(self, peer: Any, size: int) -> bool:
        return self._peer_bytes.get(peer, 0) + size <= self.peer_bytes_max

    def unread_longest(self, sent_before_ns: int, besides: Any) -> list[Any]:
        """Peers other than `besides` whose oldest unread answer was sent before `sent_before_ns`,
        holding the most first."""
        self.prune_all()
        waited = [peer for peer, pending in self._pending.items()
                  if peer != besides and pending[0][2] < sent_before_ns]
        return sorted(waited, key=self._peer_bytes.__getitem__, reverse=True)

    def track(self, peer: Any, tracker: Any, size: int, now_ns: int) -> None:
        self._pending.setdefault(peer, deque()).append((tracker, size, now_ns))
        self._peer_bytes[peer] = self._peer_bytes.get(peer, 0) + size
        self.total_bytes += size

    def _prune(self, peer: Any) -> None:
        pending = self._pending.get(peer)
        if pending is None:
            return
        while pending and pending[0][0].done:
            size = pending.popleft()[1]
            self._peer_bytes[peer] -= size
            self.total_bytes -= size
        if not pending:
            del self._pending[peer]
            del self._peer_bytes[peer]

    def prune_all(self) -> None:
        for peer in list(self._pending):
            self._prune(peer)

    def forget(self, peer: Any) -> None:
        """The peer is gone (its socket closed): what was queued for it is freed with it."""
        for _, size, _ in self._pending.pop(peer, ()):
            self.total_bytes -= size
        self._peer_bytes.pop(peer, None)
