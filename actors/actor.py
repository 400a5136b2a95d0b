"""The actor contract: a pure state machine fed messages and time, returning effects.

Actors never touch sockets, clocks, randomness or threads (`actors/` never imports zmq, socket,
time, random, os, threading or asyncio). Time arrives as `now_ns`; randomness as an injected
`random.Random`; storage as an injected object with the same interface on disk and in memory.
The same classes run under `transport/runtime.py` (real processes) and `chaos/simulator.py`
(one process, virtual clock, faulty network).
"""

from __future__ import annotations

from typing import Protocol

from actors.effects import Address, Effect
from actors.messages import Message


class Actor(Protocol):
    name: str

    def start(self, now_ns: int) -> list[Effect]: ...

    def handle(self, message: Message, sender: Address, now_ns: int) -> list[Effect]: ...

    def invariants(self) -> None:
        """Raise AssertionError on a broken invariant; tests and the simulator call it after every step."""


class IllegalTransition(AssertionError):
    """A (state, message) pair that the protocol says cannot happen: a programmer error, loudly."""

    def __init__(self, actor: str, state: object, message: object) -> None:
        super().__init__(f"{actor}: message {type(message).__name__} is illegal in state {state!r}")


MS = 1_000_000  # nanoseconds per millisecond


def ms_to_ns(milliseconds: float) -> int:
    return int(milliseconds * MS)
