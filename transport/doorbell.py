"""The doorbell: how one end of a shared-memory ring wakes its sleeping peer.

A ring (transport/ring.py) carries the bytes; a doorbell carries only "look again", as an empty
ZeroMQ message, and only to a peer that said in the ring header that it is going to sleep. This
module owns that wake-up channel: the `Doorbell` protocol the ring ends use, and `ZmqDoorbell`,
its ZeroMQ implementation (a PULL socket to be rung on, PUSH sockets to ring peers with).

It must never block the caller and never carry data: a ring that cannot be sent is reported
(False) and dropped, which costs the peer at most one bounded wait, never a record. Every queue
and socket set it keeps is bounded (`DOORBELL_QUEUE_MAX`, `DOORBELL_PEERS_MAX`), and a closed
doorbell lingers at most `DOORBELL_LINGER_MS` to deliver its last rings.
"""

from __future__ import annotations

import platform
import secrets
from collections import OrderedDict
from typing import Protocol

import zmq

# Rings are rare (at most one per sleep of the peer, see `_arm_generation` in transport/ring_end.py),
# so this bound only has to be loose: with 16, stress runs saw sends refused with EAGAIN
# although every waiter drains its doorbell whenever it wakes. ZeroMQ's default of 1000 never
# refused one.
DOORBELL_QUEUE_MAX = 1000
# Distinct peers one doorbell keeps a connected PUSH socket for; older ones are closed.
DOORBELL_PEERS_MAX = 64
# How long a closed doorbell keeps trying to deliver its last rings (the one `close` sends, so
# the peer learns of it at once); ZeroMQ does this in the background, nobody waits for it.
DOORBELL_LINGER_MS = 200


class Doorbell(Protocol):
    """Wakes a sleeping peer. A ring may be lost: waits are bounded, so that costs time, not data."""

    @property
    def endpoint(self) -> str: ...  # where peers ring this end; recorded in the ring header

    def ring(self, peer_endpoint: str) -> bool: ...  # never blocks; False if it could not send

    def wait(self, timeout_ms: int) -> bool: ...  # True if rung (and the rings consumed)

    def close(self) -> None: ...


class ZmqDoorbell:
    """A PULL socket that peers ring with an empty message, and PUSH sockets to ring them.

    On Linux it binds an abstract-namespace ipc address (no file to leave behind), elsewhere
    127.0.0.1 on an ephemeral port. One doorbell may serve several rings of one actor. A runtime
    that sleeps in its own poller registers `socket` there: it calls `arm_doorbell` on its ring
    ends before polling, and `drain()` then `disarm_doorbell(slept=True)` when it wakes.
    Use it from one thread.
    """

    def __init__(self, context: zmq.Context | None = None) -> None:
        self._context = context or zmq.Context.instance()
        self._inbox = self._context.socket(zmq.PULL)
        self._inbox.setsockopt(zmq.LINGER, 0)
        self._inbox.setsockopt(zmq.RCVHWM, DOORBELL_QUEUE_MAX)
        if platform.system() == "Linux":
            self._inbox.bind(f"ipc://@railmq-bell-{secrets.token_hex(8)}")
        else:
            self._inbox.bind("tcp://127.0.0.1:*")
        self._endpoint = self._inbox.getsockopt_string(zmq.LAST_ENDPOINT)
        self._outboxes: OrderedDict[str, zmq.Socket] = OrderedDict()

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def socket(self) -> zmq.Socket:
        return self._inbox

    def ring(self, peer_endpoint: str) -> bool:
        try:
            self._outbox(peer_endpoint).send(b"", zmq.NOBLOCK)
        except zmq.Again:
            return False  # the peer is gone or not listening: its wait times out and it looks again
        return True

    def wait(self, timeout_ms: int) -> bool:
        # A blocking recv with a timeout wakes faster than poll(), which builds a Poller per call.
        self._inbox.setsockopt(zmq.RCVTIMEO, max(0, int(timeout_ms)))
        try:
            self._inbox.recv()
        except zmq.Again:
            return False
        self.drain()
        return True

    def drain(self) -> int:
        """Consume every pending ring without blocking; returns how many there were."""
        drained = 0
        while self._inbox.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._inbox.recv(zmq.NOBLOCK)
            drained += 1
        return drained

    def _outbox(self, peer_endpoint: str) -> zmq.Socket:
        outbox = self._outboxes.get(peer_endpoint)
        if outbox is not None:
            self._outboxes.move_to_end(peer_endpoint)
            return outbox
        if len(self._outboxes) >= DOORBELL_PEERS_MAX:
            self._outboxes.popitem(last=False)[1].close(linger=DOORBELL_LINGER_MS)
        outbox = self._context.socket(zmq.PUSH)
        outbox.setsockopt(zmq.LINGER, DOORBELL_LINGER_MS)
        outbox.setsockopt(zmq.SNDHWM, DOORBELL_QUEUE_MAX)
        outbox.connect(peer_endpoint)
        self._outboxes[peer_endpoint] = outbox
        return outbox

    def close(self) -> None:
        for outbox in self._outboxes.values():
            outbox.close()
        self._outboxes.clear()
        self._inbox.close(linger=0)


class NullDoorbell:
    """A doorbell nobody rings: for rings whose records are announced some other way (a fetch
    response over ZeroMQ, see transport/ring_link.py). An empty endpoint in the ring header tells
    the other end there is nobody to ring."""

    endpoint = ""

    def ring(self, peer_endpoint: str) -> bool:
        return False

    def wait(self, timeout_ms: int) -> bool:
        return False

    def close(self) -> None:
        pass
