"""A small synchronous request/reply client over DEALER sockets, for admin tools and the node agent.

Each request carries a fresh correlation id; replies with other ids (late answers to requests
that timed out) are discarded. A timeout raises `RequestTimeout`; the socket to that endpoint is
then closed so nothing stale is delivered to the next request. Not thread-safe: one per thread.

What a socket's connection holds before it is a message is bounded as an actor's DEALERs are
(transport/peer_inbound.py): whatever listens on an endpoint (a process on a dead controller's
port) may send one message of ever more frames, which libzmq keeps whole until its last frame.
A request looks every `INBOUND_CHECK_MS` while it waits; a caller that keeps sockets between
requests (the node agent) watches `connection_fds()` and calls `check_inbound()` when they stir.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from actors.controller_endpoints import ControllerEndpoints
from actors.limits import DEFAULT_LIMITS, MESSAGE_FRAMES_MAX
from actors.messages import ErrorResponse, Message
from transport.codec import Codec, DecodeFailure
from transport.connections import routing_id
from transport.frames import receive
from transport.peer_inbound import PeerInbound
from transport.socket_watch import connect_monitored


# A voter that does not answer within this (or an eighth of the caller's timeout, when longer) is
# taken for dead and the next one is asked: a live controller answers in ~1 ms even when loaded.
CONTROLLER_ATTEMPT_MS = 1000
# A request that may fail fast looks at its connection this often while it waits.
FAIL_FAST_CHECK_MS = 5
PEER_DOWN_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
ELECTION_WAIT_S = 0.05  # no voter knows a leader: ask again after this
# A waiting request counts what its connections hold this often: an endless message is cut off
# within the budget and what loopback carries in this time.
INBOUND_CHECK_MS = 20


class RequestTimeout(TimeoutError):
    def __init__(self, endpoint: str, message: Message, timeout_ms: int) -> None:
        super().__init__(f"no answer from {endpoint} to {type(message).__name__} within {timeout_ms} ms")
        self.endpoint = endpoint


class PeerDown(RequestTimeout):
    """Nothing listens at the endpoint any more (the connection was refused or dropped): asked with
    `fail_fast`, the request gives up at once instead of waiting out its timeout."""

    def __init__(self, endpoint: str, message: Message) -> None:
        TimeoutError.__init__(self, f"{endpoint} is down (the connection was refused or dropped) before it answered "
                                    f"{type(message).__name__}")
        self.endpoint = endpoint


class UnusableEndpoint(PeerDown):
    """ZeroMQ cannot connect to the endpoint at all (`tcp://127.0.0.1:1?0`, `garbage`): nothing
    will ever answer there. A `RequestTimeout`, so every caller already handles it: an endpoint an
    answer named (a leader, a voter) is a claim, and a bad one raised a bare `zmq.ZMQError`."""

    def __init__(self, endpoint: str, message: Message, error: zmq.ZMQError) -> None:
        TimeoutError.__init__(self, f"{endpoint[:80]!r} is no endpoint ZeroMQ can connect to "
                                    f"({error.strerror}): {type(message).__name__} was not sent")
        self.endpoint = endpoint


_correlation_ids = itertools.count(1)
# Answers one socket holds unread. A socket carries one request at a time (request_many uses one
# per endpoint), and is dropped when a request times out, so a late answer never piles up.
RPC_RECEIVE_QUEUE_MAX = 4


class RpcClient:
    def __init__(self, identity: str = "rpc", context: zmq.Context | None = None, *,
                 secret: bytes | None = None,
                 inbound_bytes_max: int = DEFAULT_LIMITS.peer_inbound_bytes_max) -> None:
        self.context = context or zmq.Context.instance()
        self.identity = identity
        self.codec = Codec(DEFAULT_LIMITS.frame_bytes_hard_max, secret=secret)
        self._sockets: dict[str, zmq.Socket] = {}
        self._monitors: dict[str, zmq.Socket] = {}
        self._down: dict[str, bool] = {}  # endpoint -> refused or dropped since the last look
        self._connection_fds: set[int] = set()
        self.counters: dict[str, int] = {}
        self.inbound = PeerInbound(inbound_bytes_max=inbound_bytes_max, check_interval_ms=0,
                                   clock=time.monotonic_ns, count=self._count,
                                   watch=self._connection_fds.add, unwatch=self._connection_fds.discard)

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _socket(self, endpoint: str, message: Message) -> zmq.Socket:
        """The socket to `endpoint`, connected on first use (`UnusableEndpoint` if it cannot be)."""
        socket = self._sockets.get(endpoint)
        if socket is None:
            socket = self.context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.RECONNECT_IVL, 50)
            # What the server sends unasked waits here between requests: a few answers, none past
            # the frame bound (ZeroMQ's defaults: 1,000 of any size).
            socket.setsockopt(zmq.RCVHWM, RPC_RECEIVE_QUEUE_MAX)
            socket.setsockopt(zmq.MAXMSGSIZE, DEFAULT_LIMITS.frame_bytes_hard_max)
            socket.setsockopt(zmq.ROUTING_ID, routing_id(self.identity))
            try:
                self._monitors[endpoint] = connect_monitored(socket, endpoint, PEER_DOWN_EVENTS)
            except zmq.ZMQError as error:  # the socket is closed already
                raise UnusableEndpoint(endpoint, message, error) from None
            self._sockets[endpoint] = socket
        return socket

    def _read_events(self, endpoint: str) -> None:
        """Take in what the endpoint's monitor saw: connections made (counted from now on) and
        refused or dropped (remembered for `_peer_went_down`)."""
        monitor = self._monitors.get(endpoint)
        while monitor is not None and monitor.poll(0, zmq.POLLIN):
            event = recv_monitor_message(monitor)
            if event["event"] == zmq.EVENT_CONNECTED:
                self._down[endpoint] = False
                self.inbound.connected(endpoint, event["value"])
            elif event["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CONNECT_RETRIED):
                self._down[endpoint] = True
                if event["event"] == zmq.EVENT_DISCONNECTED:
                    self.inbound.gone(endpoint, event["value"])

    def _peer_went_down(self, endpoint: str) -> bool:
        """Whether the monitor saw the connection refused or dropped since the last look."""
        self._read_events(endpoint)
        return self._down.pop(endpoint, False)

    def connection_fds(self) -> list[int]:
        """The descriptors of the sockets' connections (libzmq's): readable when data comes."""
        return sorted(self._connection_fds)

    def discard_unasked(self) -> None:
        """Read and drop what the sockets hold while no request waits (late or unasked answers):
        a full receive queue would stop libzmq reading the connection, which then stays readable."""
        for endpoint, socket in list(self._sockets.items()):
            while True:
                try:
                    frames = self._receive(endpoint, socket)
                except zmq.Again:
                    break
                if frames is None:
                    break
                self.inbound.arrived(frames)

    def _receive(self, endpoint: str, socket: zmq.Socket) -> list[Any] | None:
        """The next message from `endpoint` (zmq.Again when none waits), or None for one of more
        frames than any railmq message has: its socket is dropped with the rest unread, which libzmq
        frees. Read whole, an answer of 200,000 empty frames (400 KB) became as many frame objects
        (tens of MB) before its decode failed (transport/frames.py)."""
        frames, more = receive(socket, MESSAGE_FRAMES_MAX)
        if more:
            self._count("messages_over_frames_max")
            self.forget(endpoint)
            return None
        return frames

    def check_inbound(self) -> None:
        """Shut down the connections holding the most bytes not yet read as messages, while
        together they hold more than the budget; their sockets connect again by themselves."""
        for endpoint in list(self._monitors):
            self._read_events(endpoint)
        self.inbound.data_arrived()
        self.inbound.check_if_due()

    def request(self, endpoint: str, message: Message, timeout_ms: int = 5000, *,
                authenticated_only: bool = False, fail_fast: bool = False) -> Any:
        """Send `message` (its correlation_id is replaced) and return the matching reply. With
        `authenticated_only`, a reply without this cluster's tag is ignored (a process that took
        over a dead actor's port cannot answer for it). With `fail_fast`, a connection refused or
        dropped before the answer raises `PeerDown` at once (the request is dropped with the socket)."""
        correlation_id = next(_correlation_ids)
        message = msgspec.structs.replace(message, correlation_id=correlation_id)
        socket = self._socket(endpoint, message)
        self._peer_went_down(endpoint)  # what happened before this request does not count
        socket.send_multipart(self.codec.encode(message), copy=False)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self.check_inbound()
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            wait_ms = min(remaining_ms, FAIL_FAST_CHECK_MS if fail_fast else INBOUND_CHECK_MS)
            if remaining_ms <= 0 or not socket.poll(max(wait_ms, 0), zmq.POLLIN):
                if fail_fast and remaining_ms > 0 and self._peer_went_down(endpoint):
                    self.forget(endpoint)
                    raise PeerDown(endpoint, message)
                if remaining_ms > 0:
                    continue
                self.forget(endpoint)
                raise RequestTimeout(endpoint, message, timeout_ms)
            frames = self._receive(endpoint, socket)  # the poll saw a whole message: it is there
            if frames is None:
                raise PeerDown(endpoint, message)
            self._read_events(endpoint)  # its connection first: the answer may come before the report
            self.inbound.arrived(frames)
            try:
                reply = self.codec.decode(frames)
            except DecodeFailure:
                continue
            if authenticated_only and not self.codec.last_authenticated:
                continue
            if getattr(reply, "correlation_id", None) == correlation_id:
                return reply
            if isinstance(reply, ErrorResponse) and reply.correlation_id == -1:
                return reply

    def request_many(self, requests: list[tuple[str, Message]], timeout_ms: int = 5000) -> list[Any]:
        """Send every (endpoint, message) at once and return the replies in the same order, within
        `timeout_ms` in all: one round trip for many peers instead of one after another (a lag
        reading, whose log ends are worth the moment they were read). A reply counts only from the
        endpoint its request went to. RequestTimeout names the first request left unanswered; its
        socket, and every other still waited on, is dropped."""
        replies: list[Any] = [None] * len(requests)
        pending: dict[int, int] = {}  # correlation id -> position
        sockets: dict[zmq.Socket, str] = {}
        for position, (endpoint, message) in enumerate(requests):
            correlation_id = next(_correlation_ids)
            try:
                socket = self._socket(endpoint, message)
            except UnusableEndpoint:
                for sent in sockets.values():  # what they answer would wait there unasked
                    self.forget(sent)
                raise
            socket.send_multipart(self.codec.encode(
                msgspec.structs.replace(message, correlation_id=correlation_id)), copy=False)
            pending[correlation_id] = position
            sockets[socket] = endpoint
        poller = zmq.Poller()
        for socket in sockets:
            poller.register(socket, zmq.POLLIN)
        deadline = time.monotonic() + timeout_ms / 1000
        while pending:
            self.check_inbound()
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            ready = poller.poll(min(remaining_ms, INBOUND_CHECK_MS)) if remaining_ms > 0 else []
            if not ready and remaining_ms > 0:
                continue
            if not ready:
                waiting = sorted(pending.values())
                endpoint, message = requests[waiting[0]]
                for position in waiting:
                    self.forget(requests[position][0])
                raise RequestTimeout(endpoint, message, timeout_ms)
            for socket, _ in ready:
                while True:
                    try:
                        frames = self._receive(sockets[socket], socket)
                    except zmq.Again:
                        break
                    if frames is None:
                        for sent in sockets.values():  # what they answer would wait there unasked
                            self.forget(sent)
                        endpoint = sockets[socket]
                        raise PeerDown(endpoint, next(message for to, message in requests if to == endpoint))
                    self._read_events(sockets[socket])
                    self.inbound.arrived(frames)
                    try:
                        reply = self.codec.decode(frames)
                    except DecodeFailure:
                        continue
                    correlation_id = getattr(reply, "correlation_id", None)
                    position = pending.get(correlation_id)
                    # Only from where the request went: the ids come from one counter, so the
                    # server of one request can guess the id of the one sent before it elsewhere.
                    if position is not None and requests[position][0] == sockets[socket]:
                        replies[position] = reply
                        del pending[correlation_id]
        return replies

    def request_controller(self, controllers: ControllerEndpoints, message: Message, timeout_ms: int = 5000, *,
                           authenticated_only: bool = False) -> Any:
        """`request` to the active controller, within `timeout_ms` in all: follow NOT_CONTROLLER
        hints at once, wait a little when no voter knows a leader (an election is under way), and
        move to the next voter when one does not answer within its share of the time. With one
        endpoint (a single coordinator) this is one `request`."""
        deadline = time.monotonic() + timeout_ms / 1000
        attempt_ms = timeout_ms if len(controllers) == 1 else max(CONTROLLER_ATTEMPT_MS, timeout_ms // 8)
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise RequestTimeout(controllers.current, message, timeout_ms)
            endpoint = controllers.current
            try:
                reply = self.request(endpoint, message, min(attempt_ms, remaining_ms),
                                     authenticated_only=authenticated_only, fail_fast=len(controllers) > 1)
            except RequestTimeout:
                controllers.rotate()
                continue
            if not controllers.take(reply):
                learned = getattr(reply, "controller_endpoints", None)
                if learned:
                    controllers.learn(learned)
                return reply
            if not reply.controller_endpoint:
                time.sleep(min(ELECTION_WAIT_S, max(0, deadline - time.monotonic())))

    def send(self, endpoint: str, message: Message) -> None:
        """Fire and forget (to an endpoint ZeroMQ cannot connect to: dropped and counted)."""
        try:
            socket = self._socket(endpoint, message)
        except UnusableEndpoint:
            self._count("dropped_out_bad_endpoint")
            return
        socket.send_multipart(self.codec.encode(message), copy=False)

    def forget(self, endpoint: str) -> None:
        socket = self._sockets.pop(endpoint, None)
        monitor = self._monitors.pop(endpoint, None)
        self.inbound.closed(endpoint)
        self._down.pop(endpoint, None)
        if socket is not None:
            socket.disable_monitor()
            socket.close(linger=0)
        if monitor is not None:
            monitor.close(linger=0)

    def close(self) -> None:
        for endpoint in list(self._sockets):
            self.forget(endpoint)
