"""`ClientShell`: the caller's side of a client whose logic runs on a ClientEngine's I/O thread.

`Consumer` and `ShareConsumer` both keep their protocol logic in an actor driven by
transport/client_engine.py, and talk to it the same way; this base class owns that plumbing.
A command goes to the I/O thread as a `ClientCommand`. A `call` is a command with a token: it
registers a result slot under the token, submits the command, and waits on the shell's
condition (`_ready`) until the engine thread's "result" notification fills the slot, then
returns the value or raises the error it carries. Every other notification goes to the
subclass's `_handle_notice`, under the same condition, which is then notified.

Invariants: a slot is registered before its command is submitted, so an answer never arrives
before its slot; a slot is removed once its call returns or times out, so a late answer is
dropped, never kept; every wait ends by a deadline (the request timeout unless the caller gives
one); the engine thread touches the shell's fields only while holding `_ready`. The shell never
touches a socket: that is the engine's job.
"""

from __future__ import annotations

import itertools
import threading
from abc import ABC, abstractmethod
import time
from collections import deque
from typing import Any, Callable, ClassVar, Self

from actors.errors import ErrorCode, RailmqError
from actors.messages import ClientCommand
from transport.client_engine import ClientEngine

ERRORS_KEPT_MAX = 1000  # reported errors waiting for the caller's next call

# A waiter wakes at least this often to look at its deadline and at errors reported meanwhile.
WAIT_SLICE_S = 0.1


class ClientShell(ABC):
    """Commands, calls and errors between the caller's threads and one ClientEngine."""

    # How errors name this client ("the consumer is closed").
    _client_noun: ClassVar[str] = "client"
    # Set by the subclass once its actor exists; the shell only submits to it and reads `failure`.
    _engine: ClientEngine

    def __init__(self, request_timeout_ms: int) -> None:
        self.request_timeout_s = request_timeout_ms / 1000
        self._ready = threading.Condition()
        # Raised, oldest first, by the caller's next wait; a caller that does not call for a while
        # keeps the latest ERRORS_KEPT_MAX (they are mostly the same report, repeated).
        self._errors: deque = deque(maxlen=ERRORS_KEPT_MAX)
        self._results: dict[int, list] = {}  # token -> slot; a slot gets one (value, error)
        self._tokens = itertools.count(1)
        self._closed = False

    # ------------------------------------------------------------------ the caller's threads

    def _command(self, name: str, token: int = 0, **arguments: Any) -> None:
        """Hand a command to the I/O thread; with token 0 nobody waits for its result."""
        self._check_usable()
        self._engine.submit(ClientCommand(command=name, arguments=arguments, token=token))

    def call(self, name: str, timeout: float | None = None, token: int | None = None,
             **arguments: Any) -> Any:
        """Send a command to the I/O thread and wait for its result."""
        token = token or next(self._tokens)
        slot: list = []
        self._results[token] = slot
        self._command(name, token=token, **arguments)
        try:
            with self._ready:
                self._wait_until(lambda: bool(slot), timeout, f"{name} got no answer in time",
                                 raise_errors=False)
        finally:
            self._results.pop(token, None)
        value, error = slot[0]
        if error is not None:
            raise error
        return value

    def _wait_until(self, done: Callable[[], bool], timeout_s: float | None, timed_out: str, *,
                    raise_errors: bool = True) -> None:
        """Wait, holding `_ready`, until `done()`; REQUEST_TIMED_OUT (saying `timed_out`) after
        `timeout_s` (default: the request timeout). `raise_errors`: raise reported errors first."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.request_timeout_s)
        while not done():
            if raise_errors:
                self._raise_errors()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RailmqError(ErrorCode.REQUEST_TIMED_OUT, timed_out)
            self._ready.wait(min(remaining, WAIT_SLICE_S))

    def _raise_errors(self) -> None:
        if self._errors:
            raise self._errors.popleft()

    def _check_usable(self) -> None:
        if self._closed:
            raise RailmqError(ErrorCode.INVALID_REQUEST, f"the {self._client_noun} is closed")
        if self._engine.failure is not None:
            raise RuntimeError(f"the {self._client_noun}'s I/O thread failed") from self._engine.failure

    # ------------------------------------------------------------------ the engine thread

    def _on_notify(self, kind: str, payload: Any) -> None:
        with self._ready:
            if kind == "result":
                self._deliver_result(payload)
            else:
                self._handle_notice(kind, payload)
            self._ready.notify_all()

    def _deliver_result(self, payload: tuple[int, Any, BaseException | None]) -> None:
        """Fill the slot of the call that sent this token; nobody waits for an unknown token."""
        token, value, error = payload
        slot = self._results.get(token)
        if slot is not None:
            slot.append((value, error))

    @abstractmethod
    def _handle_notice(self, kind: str, payload: Any) -> None:
        """A notification other than a result, with `_ready` held (waiters are woken after)."""

    # ------------------------------------------------------------------ lifetime

    @abstractmethod
    def close(self) -> None:
        """Stop the client: leave what it joined, stop its I/O thread."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
