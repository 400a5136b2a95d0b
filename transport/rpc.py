"""A small synchronous request/reply client over DEALER sockets, for admin tools and the node agent.

Each request carries a fresh correlation id; replies with other ids (late answers to requests
that timed out) are discarded. A timeout raises `RequestTimeout`; the socket to that endpoint is
then closed so nothing stale is delivered to the next request. Not thread-safe: one per thread.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import msgspec
import zmq

from actors.controller_endpoints import ControllerEndpoints
from actors.limits import DEFAULT_LIMITS
from actors.messages import ErrorResponse, Message
from transport.codec import Codec, DecodeFailure


# A voter that does not answer within this (or an eighth of the caller's timeout, when longer) is
# taken for dead and the next one is asked: a live controller answers in ~1 ms even when loaded.
CONTROLLER_ATTEMPT_MS = 1000
ELECTION_WAIT_S = 0.05  # no voter knows a leader: ask again after this


class RequestTimeout(TimeoutError):
    def __init__(self, endpoint: str, message: Message, timeout_ms: int) -> None:
        super().__init__(f"no answer from {endpoint} to {type(message).__name__} within {timeout_ms} ms")
        self.endpoint = endpoint


_ids = itertools.count(1)


class RpcClient:
    def __init__(self, identity: str = "rpc", context: zmq.Context | None = None, *,
                 secret: bytes | None = None) -> None:
        self.context = context or zmq.Context.instance()
        self.identity = identity
        self.codec = Codec(DEFAULT_LIMITS.frame_bytes_hard_max, secret=secret)
        self._sockets: dict[str, zmq.Socket] = {}

    def _socket(self, endpoint: str) -> zmq.Socket:
        socket = self._sockets.get(endpoint)
        if socket is None:
            socket = self.context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.RECONNECT_IVL, 50)
            socket.setsockopt(zmq.ROUTING_ID, f"{self.identity}|{os.getpid()}|{next(_ids)}".encode())
            socket.connect(endpoint)
            self._sockets[endpoint] = socket
        return socket

    def request(self, endpoint: str, message: Message, timeout_ms: int = 5000, *,
                authenticated_only: bool = False) -> Any:
        """Send `message` (its correlation_id is replaced) and return the matching reply. With
        `authenticated_only`, a reply without this cluster's tag is ignored (a process that took
        over a dead actor's port cannot answer for it)."""
        correlation_id = next(_ids)
        message = msgspec.structs.replace(message, correlation_id=correlation_id)
        socket = self._socket(endpoint)
        socket.send_multipart(self.codec.encode(message), copy=False)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not socket.poll(remaining_ms, zmq.POLLIN):
                self.forget(endpoint)
                raise RequestTimeout(endpoint, message, timeout_ms)
            frames = socket.recv_multipart(copy=False)
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
                                     authenticated_only=authenticated_only)
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
        """Fire and forget."""
        self._socket(endpoint).send_multipart(self.codec.encode(message), copy=False)

    def forget(self, endpoint: str) -> None:
        socket = self._sockets.pop(endpoint, None)
        if socket is not None:
            socket.close(linger=0)

    def close(self) -> None:
        for endpoint in list(self._sockets):
            self.forget(endpoint)
