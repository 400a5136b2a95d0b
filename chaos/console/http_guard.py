"""The console's HTTP connections, each with a deadline for its request's headers and a bound on
how many are open.

uvicorn closes a connection that is idle after a response (its keep-alive timeout) but not one
that never finishes its first request's headers, nor one that sends nothing: any local process
could hold connections, and up to 16 KiB of unfinished headers each, until the console's file
descriptors ran out. `GuardedH11Protocol` is uvicorn's h11 protocol with two rules more:

- a connection whose request headers are not complete within `headers_timeout_s` of its opening,
  or of the end of its last response, is closed, however slowly it trickles bytes;
- a connection opened while `connections_max` are open is closed at once.

A request whose headers are complete is never cut: a live feed (`/api/events`) streams for as long
as its page is open. The server module sets both bounds (chaos/console/server.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


class GuardedH11Protocol(H11Protocol):
    headers_timeout_s = 10.0
    connections_max = 256

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._headers_deadline: asyncio.TimerHandle | None = None
        self._waiting_cycle: Any = None
        if len(self.connections) > self.connections_max:
            transport.close()
            return
        self._await_headers()

    def _await_headers(self) -> None:
        """Start the deadline for the next request's headers: they are complete once uvicorn has
        made a request cycle other than the one there is now."""
        self._waiting_cycle = self.cycle
        self._headers_deadline = self.loop.call_later(self.headers_timeout_s, self._headers_too_slow)

    def _cancel_deadline(self) -> None:
        if self._headers_deadline is not None:
            self._headers_deadline.cancel()
            self._headers_deadline = None

    def _headers_too_slow(self) -> None:
        self._headers_deadline = None
        if self.cycle is self._waiting_cycle and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._headers_deadline is not None and self.cycle is not self._waiting_cycle:
            self._cancel_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:  # no pipelined request started
            self._cancel_deadline()
            self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)
