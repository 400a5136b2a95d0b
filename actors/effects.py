"""Effects: what an actor asks the world to do, as data.

An actor's `start` and `handle` return a list of effects; the runtime (real sockets, real disk)
and the simulator (virtual network, memory disk) carry them out with the same rules:

- Effects in one list are applied in order.
- `Send` goes out at once. Delivery is not guaranteed (the peer may be dead or cut off): every
  protocol built on it has timeouts and retries.
- `AfterFlush(store, effects)` makes `store` durable (its `flush()`) *before* applying `effects`.
  The runtime may delay these effects to share one flush among many requests (group commit), so
  they can be applied after effects returned later; nothing else may overtake the flush itself.
  This is the effect to use for "reply only once the append is durable" (raft's Ready rule:
  persist before sending).
- `SetTimer` replaces any timer of the same name; when it expires the actor receives
  `TimerFired(name)`. `CancelTimer` of an unknown name is a no-op.
- `Trace` is an observation for logs, chaos fault logs and learners; it changes nothing.
- `Notify` hands a result to the code that embeds a client actor (a producer's future, a
  consumer's records); servers never use it.
- `Exit` stops the actor gracefully (it still gets `Stop`, so it closes its storage): the topic
  it served was deleted, or it was moved elsewhere.
- `Crash` stops the actor at once as if killed (e.g. after a failed fsync, whose page-cache state
  is unknown: retrying could acknowledge data that is not on disk). The supervisor restarts it.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, Union

from actors.messages import Message

# An address is where a message goes. A `str` is an endpoint ("tcp://127.0.0.1:7411"): the runtime
# sends through its DEALER socket to it. A `bytes` is the return address of a peer that sent to
# our ROUTER socket (its routing id): replies go back through the ROUTER.
Address = Union[str, bytes]


class Flushable(Protocol):
    def flush(self) -> None: ...


class Send(NamedTuple):
    to: Address
    message: Message


class AfterFlush(NamedTuple):
    store: Flushable
    effects: tuple


class SetTimer(NamedTuple):
    name: str
    deadline_ns: int


class CancelTimer(NamedTuple):
    name: str


class Trace(NamedTuple):
    event: str
    details: dict


class Notify(NamedTuple):
    kind: str
    payload: Any


class Exit(NamedTuple):
    reason: str


class Crash(NamedTuple):
    reason: str


Effect = Union[Send, AfterFlush, SetTimer, CancelTimer, Trace, Notify, Exit, Crash]
