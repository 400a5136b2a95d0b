"""What the connections to a ROUTER may cost when they are not the cluster's, and who may take one.

libzmq accepts every connection and has no per-peer disconnect for a ROUTER. Left alone, one local
process that opened connections and completed the ZeroMQ greeting (64 bytes each) took a leader
to its open-files limit (20,000 here) in a few minutes: from then on no new producer, consumer
or restarted follower could connect, and the leader could open no new segment file.

So the runtime, and the node agent for its reports socket, watch a ROUTER's connections
(`RouterGuard`: a socket monitor reports each accepted and closed connection with its file
descriptor) and record, for each message, the descriptor it came on (`ZMQ_SRCFD`, ~0.1 us). A
connection that has carried a message with the cluster's valid tag is a cluster process's (a
follower, a node agent, the controller; their number is bounded by the cluster) and is never
closed here. The others are counted; when there are more than
`client_connections_max`, the one that has been quiet the longest is shut down. As in Kafka
(`max.connections`, KIP-402), a new client still gets in while an attacker's connections sit
idle: to keep a client out, the attacker must keep every one of its connections busier than the
client, which costs it the actor's whole message rate. A client whose connection was closed
loses what it had in flight on it; its DEALER reconnects by itself and it retries.

Connections also cost what they send before it is a message: libzmq allocates a message's whole
size when its header comes (up to `frame_bytes_hard_max`) and fills it as bytes arrive, and only
the last byte makes it a message the runtime reads. 20 connections that each sent 60 MiB of a
message and stopped held 1.2 GB of a leader. So `client_inbound_check_interval_ms` after bytes
came on a client connection (the runtime watches their descriptors for data, edge-triggered), the
kernel is asked what each has received (`tcpi_bytes_received`, ~3 us a connection) less the
messages read from it: the rest is held for it. While they hold more than
`client_inbound_bytes_max` together, the one holding the most is closed.

Closing is `shutdown(2)` on libzmq's descriptor (borrowed, never closed here): libzmq sees the end of the stream,
closes its descriptor and reports the disconnect. A descriptor is only shut down if its peer's
address is still the one recorded when it was accepted, so a number libzmq has already reused
for another connection (the monitor's events arrive late) is left alone. The monitor's report of
a connection is queued before its first message can be read, so a tagged message on a descriptor
not known yet is matched once the monitor's queue is read. One case is not told apart: a tagged
message still queued when its connection closed, read after the descriptor's number went to a new
connection, lends the new connection its trust; it takes a cluster process's connection closing
with messages unread, and costs one connection kept past the bound.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
import secrets
import socket
from typing import Any, Callable, Iterator

import zmq

# A connection's greeting and READY command (64 bytes, and a READY of properties: a socket type and
# a routing id of at most 255 bytes) are received but never read as a message.
HANDSHAKE_BYTES_MAX = 1024
# struct tcp_info (linux/tcp.h): tcpi_bytes_received, a u64, since Linux 4.1.
TCP_INFO = getattr(socket, "TCP_INFO", None)
TCP_INFO_BYTES = 256
TCPI_BYTES_RECEIVED_OFFSET = 128
ROUTING_ID_BYTES_MAX = 255  # libzmq refuses a longer ZMQ_ROUTING_ID
_socket_numbers = itertools.count(1)


def routing_id(identity: str) -> bytes:
    """The routing id of a DEALER this process opens: its name (the fault switch matches peers by
    name prefix; cut to fit for the longest topic names), its pid and socket number, and 8 random
    bytes. A ROUTER hands a routing id over to the newest connection that claims it (so a peer
    that reconnects before its old connection is seen dead gets its answers), so a guessable id
    let any local process take a follower's connection: name, pid (from `ps`) and a small counter
    were enough to make a partition with min ISR 3 acknowledge nothing while it kept doing so."""
    suffix = f"|{os.getpid()}|{next(_socket_numbers)}|{secrets.token_hex(8)}".encode()
    return identity.encode()[:ROUTING_ID_BYTES_MAX - len(suffix)] + suffix


OPEN_FILES_WANTED = 1 << 20  # a soft open-files limit past this is never needed


def raise_open_files_limit() -> int:
    """Raise this process's soft open-files limit to its hard limit (capped at OPEN_FILES_WANTED);
    return the soft limit in force. Many systems start processes at 1,024 with a far higher hard
    limit, and a cluster process may hold connections from every client."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_WANTED)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return OPEN_FILES_WANTED if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        return soft
    return wanted


def client_connections_bound(configured: int) -> int:
    """The bound in force: the configured one, or half this process's open-files limit if that is
    lower. The other half is for what the process needs besides its clients' connections: segment
    files and indexes opened on demand, shared-memory rings, pipes, its own sockets to peers."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return configured if soft == resource.RLIM_INFINITY else max(1, min(configured, soft // 2))


class _Connection:
    __slots__ = ("peer", "delivered", "routing_id")

    def __init__(self, peer: Any) -> None:
        self.peer = peer
        self.delivered = 0  # bytes on the wire of the messages read from it
        self.routing_id = b""  # the ROUTER's name for it, from its first message (fixed per connection)


class ConnectionTable:
    """Accepted connections by descriptor: trusted ones (a tagged message came on them) apart,
    the rest in order of their last message, least recent first."""

    def __init__(self, untrusted_max: int, inbound_bytes_max: int = 0) -> None:
        self.untrusted_max = untrusted_max
        self.inbound_bytes_max = inbound_bytes_max
        self._untrusted: dict[int, _Connection] = {}  # dict order = least recently active first
        self._trusted: dict[int, Any] = {}
        self.held_bytes = 0  # at the last `over_inbound_budget`

    def __len__(self) -> int:
        return len(self._untrusted) + len(self._trusted)

    @property
    def untrusted(self) -> int:
        return len(self._untrusted)

    def accepted(self, fd: int, peer: Any) -> None:
        """A new connection (one on a reused descriptor replaces what was recorded for it)."""
        self._trusted.pop(fd, None)
        self._untrusted.pop(fd, None)
        self._untrusted[fd] = _Connection(peer)

    def gone(self, fd: int) -> None:
        self._untrusted.pop(fd, None)
        self._trusted.pop(fd, None)

    def active(self, fd: int, frames: Any = (), routing_id: Any = None) -> None:
        """A message (`frames`, as on the wire, from `routing_id`: a frame) came on `fd`: it
        becomes the most recently active."""
        connection = self._untrusted.pop(fd, None)
        if connection is not None:
            connection.delivered += wire_bytes(frames)
            if routing_id is not None and not connection.routing_id:
                connection.routing_id = routing_id.bytes  # once: a connection keeps its routing id
            self._untrusted[fd] = connection

    def clients_by_routing_id(self) -> dict[bytes, int]:
        """The untrusted connections' descriptors by the ROUTER's name for each."""
        return {connection.routing_id: fd for fd, connection in self._untrusted.items()}

    def take(self, fd: int) -> Any:
        """Take out an untrusted connection; its peer address (None if it is not one)."""
        connection = self._untrusted.pop(fd, None)
        return None if connection is None else connection.peer

    def trusted(self, fd: int) -> bool:
        return fd in self._trusted

    def trust(self, fd: int) -> bool:
        """A message with the cluster's valid tag came on `fd`; False if `fd` is not known yet
        (its connection's first message can be read before the monitor's report of it)."""
        if fd in self._untrusted:
            self._trusted[fd] = self._untrusted.pop(fd).peer
        return fd in self._trusted

    def excess(self) -> list[tuple[int, Any]]:
        """Take out and return the least recently active untrusted connections beyond the bound."""
        over = len(self._untrusted) - self.untrusted_max
        victims: list[tuple[int, Any]] = []
        for fd, connection in self._untrusted.items():
            if len(victims) >= over:
                break
            victims.append((fd, connection.peer))
        for fd, _ in victims:
            del self._untrusted[fd]
        return victims

    def over_inbound_budget(self, received_of: Callable[[int], int | None]) -> list[tuple[int, Any]]:
        """Take out and return the untrusted connections holding the most bytes not yet read as
        messages, while all of them together hold more than `inbound_bytes_max`. `received_of(fd)`
        is what the kernel has received on `fd` (None: not known)."""
        held = []
        for fd, connection in self._untrusted.items():
            received = received_of(fd)
            if received is not None:
                held.append((max(0, received - connection.delivered - HANDSHAKE_BYTES_MAX), fd))
        total = sum(bytes_ for bytes_, _ in held)
        victims = []
        for bytes_, fd in sorted(held, reverse=True):
            if total <= self.inbound_bytes_max:
                break
            victims.append((fd, self._untrusted.pop(fd).peer))
            total -= bytes_
        self.held_bytes = total
        return victims


class RouterGuard:
    """The two bounds for one ROUTER: its monitor socket (to watch with the ROUTER), its table,
    and when to count what client connections hold next. `count(name)` tallies what it does.

    When to count: with `watch`/`unwatch` (the runtime's), each client connection's descriptor
    is watched for data (edge-triggered: once per arrival, whoever reads it), and a count is due
    `check_interval_ms` after data came, then again only while something is held. An idle client
    costs nothing, and neither does one whose messages all arrive whole. Without them (the node
    agent, whose socket no client should use) a count is due every interval while any exists."""

    EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED

    def __init__(self, router: zmq.Socket, *, untrusted_max: int, inbound_bytes_max: int, check_interval_ms: int,
                 clock: Callable[[], int], count: Callable[[str], None],
                 watch: Callable[[int], None] | None = None, unwatch: Callable[[int], None] | None = None) -> None:
        self.router = router
        self.table = ConnectionTable(untrusted_max, inbound_bytes_max)
        self.monitor = router.get_monitor_socket(self.EVENTS)
        self.check_interval_ns = check_interval_ms * 1_000_000
        self.check_at_ns: int | None = None
        self._clock = clock
        self._count = count
        self._watch, self._unwatch = watch, unwatch

    def arrived(self, frames: list) -> int:
        """A message read from the ROUTER (routing id first): the descriptor it came on."""
        fd = frames[0].get(zmq.SRCFD)
        self.table.active(fd, frames[1:], frames[0])
        return fd

    def close_client(self, fd: int) -> bool:
        """Close a client connection (False: not one, or already gone)."""
        peer = self.table.take(fd)
        if peer is None:
            return False
        self._dropped(fd)
        return shut_down(fd, peer)

    def data_arrived(self) -> None:
        """Bytes came on a client connection: count what is held soon."""
        if self.check_at_ns is None:
            self.check_at_ns = self._clock() + self.check_interval_ns

    def trust(self, fd: int) -> None:
        """A message with the cluster's tag came on `fd` (read the monitor first if it is new)."""
        if self.table.trusted(fd):  # every follower fetch, every report: nothing to do
            return
        if not self.table.trust(fd):
            self.on_events()
            self.table.trust(fd)
        self._dropped(fd)

    def on_events(self) -> None:
        """Record accepted and closed connections; close the quietest of the clients' past the bound."""
        table = self.table
        while True:
            try:
                head = self.monitor.recv_multipart(zmq.NOBLOCK)[0]
            except zmq.Again:
                break
            event, fd = int.from_bytes(head[:2], "little"), int.from_bytes(head[2:6], "little")
            if event == zmq.EVENT_ACCEPTED:
                peer = peer_of(fd)
                table.accepted(fd, peer)
                if peer is not None and self._watch is not None:
                    self._watch(fd)
                self.data_arrived()  # what came before the watch began
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                table.gone(fd)
                self._dropped(fd)
        for fd, peer in table.excess():
            self._dropped(fd)
            self._count("connections_closed_over_limit" if shut_down(fd, peer) else "connections_forgotten")

    def check_if_due(self) -> None:
        """Close the client connections holding the most bytes not yet read as messages while
        together they hold more than the budget."""
        if self.check_at_ns is None or self._clock() < self.check_at_ns:
            return
        for fd, peer in self.table.over_inbound_budget(bytes_received):
            self._dropped(fd)
            self._count("connections_closed_over_bytes" if shut_down(fd, peer) else "connections_forgotten")
        again = self.table.held_bytes > 0 if self._watch is not None else self.table.untrusted > 0
        self.check_at_ns = self._clock() + self.check_interval_ns if again else None

    def _dropped(self, fd: int) -> None:
        if self._unwatch is not None:
            self._unwatch(fd)

    def close(self) -> None:
        self.router.disable_monitor()
        self.monitor.close(linger=0)


def wire_bytes(frames: Any) -> int:
    """Bytes of ZMTP 3 frames on the wire: a flags byte, a 1-byte size (8 bytes past 255), the body."""
    return sum(len(frame) + (2 if len(frame) < 256 else 9) for frame in frames)


def bytes_received(fd: int) -> int | None:
    """What the kernel has received on TCP socket `fd` (`tcpi_bytes_received`), or None (also on a
    system without Linux's TCP_INFO: there the byte bound does not apply)."""
    if TCP_INFO is None:
        return None
    with _borrowed(fd) as connection:
        try:
            info = b"" if connection is None else connection.getsockopt(socket.IPPROTO_TCP, TCP_INFO, TCP_INFO_BYTES)
        except OSError:
            return None
    if len(info) < TCPI_BYTES_RECEIVED_OFFSET + 8:
        return None
    return int.from_bytes(info[TCPI_BYTES_RECEIVED_OFFSET:TCPI_BYTES_RECEIVED_OFFSET + 8], "little")


def peer_of(fd: int) -> Any:
    """The peer address of connected socket `fd`, or None if it is not one (closed, reused for a
    file, not connected)."""
    with _borrowed(fd) as connection:
        try:
            return None if connection is None else connection.getpeername()
        except OSError:
            return None


def shut_down(fd: int, peer: Any) -> bool:
    """End the connection on libzmq's descriptor `fd` if it still goes to `peer`."""
    with _borrowed(fd) as connection:
        try:
            if peer is None or connection is None or connection.getpeername() != peer:
                return False
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False
    return True


@contextlib.contextmanager
def _borrowed(fd: int) -> Iterator[socket.socket | None]:
    """A socket object on libzmq's descriptor `fd` that leaves it open, or None if `fd` is not a
    socket (a closed number, or one that now names a file)."""
    try:
        connection = socket.socket(fileno=fd)
    except OSError:
        yield None
        return
    try:
        yield connection
    finally:
        connection.detach()
