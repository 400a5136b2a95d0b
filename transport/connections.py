"""A bound on the TCP connections an actor's ROUTER holds from peers that are not cluster processes.

libzmq accepts every connection and has no per-peer disconnect for a ROUTER. Left alone, one local
process that opened connections and completed the ZeroMQ greeting (64 bytes each) took a leader
to its open-files limit (20,000 here) in a few minutes: from then on no new producer, consumer
or restarted follower could connect, and the leader could open no new segment file.

So the runtime watches its ROUTER's connections (a socket monitor: accepted and disconnected,
each with its file descriptor) and records, for each message, the descriptor it came on
(`ZMQ_SRCFD`, ~0.1 us). A connection that has carried a message with the cluster's valid tag is
a cluster process's (a follower, a node agent, the controller; their number is bounded by the
cluster) and is never closed here. The others are counted; when there are more than
`client_connections_max`, the one that has been quiet the longest is shut down. As in Kafka
(`max.connections`, KIP-402), a new client still gets in while an attacker's connections sit
idle: to keep a client out, the attacker must keep every one of its connections busier than the
client, which costs it the actor's whole message rate. A client whose connection was closed
loses what it had in flight on it; its DEALER reconnects by itself and it retries.

Connections also cost what they send before it is a message: libzmq allocates a message's whole
size when its header comes (up to `frame_bytes_hard_max`) and fills it as bytes arrive, and only
the last byte makes it a message the runtime reads. 20 connections that each sent 60 MiB of a
message and stopped held 1.2 GB of a leader. So while client connections exist, the runtime asks
the kernel every `client_inbound_check_interval_ms` what each has received (`tcpi_bytes_received`,
~3 us a connection) and subtracts the messages read from it: the rest is held for it. While they
hold more than `client_inbound_bytes_max` together, the one holding the most is closed.

Closing is `shutdown(2)` on a duplicate of libzmq's descriptor: libzmq sees the end of the stream,
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

import itertools
import os
import resource
import secrets
import socket
from typing import Any, Callable

# A connection's greeting and READY command (64 bytes, and a READY of properties: a socket type and
# a routing id of at most 255 bytes) are received but never read as a message.
HANDSHAKE_BYTES_MAX = 1024
# struct tcp_info (linux/tcp.h): tcpi_bytes_received, a u64, since Linux 4.1.
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


# Descriptors an actor needs besides its clients' connections: segment files and indexes opened
# on demand, shared-memory rings, pipes, its own sockets to peers. A bound above half the
# open-files limit is lowered to it.
OPEN_FILES_WANTED = 1 << 20


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


def client_connections_bound(configured: int, open_files: int) -> int:
    """The bound in force: the configured one, or half the open-files limit if that is lower."""
    return max(1, min(configured, open_files // 2))


class _Connection:
    __slots__ = ("peer", "delivered")

    def __init__(self, peer: Any) -> None:
        self.peer = peer
        self.delivered = 0  # bytes on the wire of the messages read from it


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

    def active(self, fd: int, frames: Any = ()) -> None:
        """A message (`frames`, as on the wire) came on `fd`: it becomes the most recently active."""
        connection = self._untrusted.pop(fd, None)
        if connection is not None:
            connection.delivered += wire_bytes(frames)
            self._untrusted[fd] = connection

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


def wire_bytes(frames: Any) -> int:
    """Bytes of ZMTP 3 frames on the wire: a flags byte, a 1-byte size (8 bytes past 255), the body."""
    return sum(len(frame) + (2 if len(frame) < 256 else 9) for frame in frames)


def bytes_received(fd: int) -> int | None:
    """What the kernel has received on TCP socket `fd` (`tcpi_bytes_received`), or None."""
    try:
        connection = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        info = connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)
    except OSError:
        return None
    finally:
        connection.detach()  # the descriptor stays libzmq's
    if len(info) < TCPI_BYTES_RECEIVED_OFFSET + 8:
        return None
    return int.from_bytes(info[TCPI_BYTES_RECEIVED_OFFSET:TCPI_BYTES_RECEIVED_OFFSET + 8], "little")


def peer_of(fd: int) -> Any:
    """The peer address of connected socket `fd`, or None if it is not one (closed, reused for a
    file, not connected)."""
    duplicate = _socket_on(fd)
    if duplicate is None:
        return None
    with duplicate:
        try:
            return duplicate.getpeername()
        except OSError:
            return None


def shut_down(fd: int, peer: Any) -> bool:
    """End the connection on libzmq's descriptor `fd` if it still goes to `peer`."""
    duplicate = None if peer is None else _socket_on(fd)
    if duplicate is None:
        return False
    with duplicate:
        try:
            if duplicate.getpeername() != peer:
                return False
            duplicate.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False
    return True


def _socket_on(fd: int) -> socket.socket | None:
    """A socket object on a duplicate of `fd` (closing it leaves `fd` open), or None."""
    try:
        duplicate = os.dup(fd)
    except OSError:
        return None
    try:
        return socket.socket(fileno=duplicate)
    except OSError:  # not a socket
        os.close(duplicate)
        return None
