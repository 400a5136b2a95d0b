"""Waiting on many ZeroMQ sockets at a cost that grows with the busy ones, not with all of them.

`zmq.Poller` asks every registered socket for its events on every wake-up: a syscall pair per
socket, so a coordinator holding a socket (and its monitor) per replica paid ~150 µs per wake-up
with 90 replicas, whatever woke it. Here each socket's `ZMQ_FD` sits in one `epoll` set instead.
That descriptor only says "this socket's state may have changed": after it fires, the socket's
`ZMQ_EVENTS` tells whether a message is there, and reading `ZMQ_EVENTS` (or sending, or
receiving) consumes the signal. So a socket that was just sent on or drained may hold a message
whose signal is already gone: such sockets stay on the `suspects` list and are asked directly
before the next sleep (pyzmq's own event-loop integration follows the same rule).

`wait(timeout_ms)` returns the sockets with a message waiting and the plain file descriptors
(lifelines, doorbells) that are readable.
"""

from __future__ import annotations

import select
from typing import Any

import zmq


class SocketWatch:
    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._by_fd: dict[int, Any] = {}  # ZMQ_FD -> socket, or a plain fd -> itself
        self._fd_of: dict[Any, int] = {}
        self.suspects: set[zmq.Socket] = set()
        self._edge: set[int] = set()  # numbers `add_edge_fd` registered and nothing replaced since

    def add_socket(self, socket: zmq.Socket) -> None:
        fd = socket.getsockopt(zmq.FD)
        self._epoll.register(fd, select.EPOLLIN)
        self._by_fd[fd] = socket
        self._fd_of[socket] = fd
        self._edge.discard(fd)
        self.suspects.add(socket)  # a message may have come before it was watched

    def add_fd(self, fd: int) -> None:
        self._epoll.register(fd, select.EPOLLIN)
        self._by_fd[fd] = fd
        self._edge.discard(fd)

    def add_edge_fd(self, fd: int) -> None:
        """Watch a descriptor someone else reads (a client connection libzmq owns): `wait` names
        it once per arrival of data, not for as long as data is unread."""
        try:
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLET)
        except OSError:  # closed already, or its number now names a file
            return
        self._by_fd[fd] = fd
        self._edge.add(fd)

    def remove_fd(self, fd: int) -> None:
        """Stop watching a descriptor added by `add_edge_fd`. Its owner may have closed it long
        since and the number may now be a socket's ZMQ_FD: that registration is left alone."""
        if fd not in self._edge:
            return
        self._edge.discard(fd)
        del self._by_fd[fd]
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):  # closed by its owner: epoll forgot it then
            pass

    def remove(self, socket: zmq.Socket) -> None:
        """Before the socket is closed: its descriptor goes with it."""
        fd = self._fd_of.pop(socket, None)
        if fd is not None:
            self._by_fd.pop(fd, None)
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):
                pass
        self.suspects.discard(socket)

    def touched(self, socket: zmq.Socket) -> None:
        """A send or a receive on `socket` may have consumed the signal of a message now waiting."""
        self.suspects.add(socket)

    def wait(self, timeout_ms: int) -> tuple[list[zmq.Socket], list[int]]:
        ready = self._readable_suspects()
        fired = self._epoll.poll(0 if ready else max(0, timeout_ms) / 1000)
        fds: list[int] = []
        for fd, _ in fired:
            target = self._by_fd.get(fd)
            if target is None:
                continue
            if isinstance(target, int):
                fds.append(target)
            else:
                self.suspects.add(target)
        if fired:
            ready = self._readable_suspects()
        return ready, fds

    def _readable_suspects(self) -> list[zmq.Socket]:
        ready = []
        for socket in list(self.suspects):
            if socket.closed:
                self.suspects.discard(socket)
                continue
            if socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                ready.append(socket)  # stays a suspect: it is drained, then asked again
            else:
                self.suspects.discard(socket)
        return ready

    def close(self) -> None:
        self._epoll.close()
        self._by_fd.clear()
        self._fd_of.clear()
        self._edge.clear()
        self.suspects.clear()


def connect_monitored(socket: zmq.Socket, endpoint: str, events: int) -> zmq.Socket:
    """Connect `socket` to `endpoint` with a monitor socket for `events`, attached before the
    connect so a refusal of the very first attempt is seen too. An endpoint ZeroMQ refuses closes
    both and raises its ZMQError."""
    monitor = socket.get_monitor_socket(events)
    try:
        socket.connect(endpoint)
    except zmq.ZMQError:
        socket.disable_monitor()
        monitor.close(linger=0)
        socket.close(linger=0)
        raise
    return monitor
