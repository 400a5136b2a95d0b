"""A tiny deterministic driver for unit tests that call actors' `handle()` directly.

It owns a virtual clock, the messages in flight between in-process actors (routed by address,
first sent first delivered), each actor's named timers (the runtime's own `transport.timers.Timers`,
so timers fire the same way), and the effect rules of `actors/effects.py` as the runtime applies
them: `Send` goes out at once, `AfterFlush` flushes its store before its effects apply (at once:
there is no group commit here), `SetTimer` replaces a timer of the same name, `Exit` stops the
actor after handing it `Stop`, `Crash` removes it as if killed.

Invariants it keeps: every actor's `invariants()` runs after every step it takes; a message reaches
an actor only by being encoded and decoded by the wire codec (internal messages excepted), so tests
exercise the real framing; time only moves forward, and timers fire in deadline order across all
actors. Messages to an address no actor holds (a test's "client") are kept in `outbox` for the
test to read. Nothing here is random: the same calls give the same run.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable, NamedTuple

from actors.effects import AfterFlush, CancelTimer, Crash, Exit, Notify, Send, SetTimer, Trace
from actors.messages import INTERNAL_TYPES, Message, Stop, TimerFired
from transport.codec import Codec
from transport.timers import Timers

MS = 1_000_000
STEPS_MAX = 100_000  # a run that delivers more messages than this is a livelock, not a test


class Envelope(NamedTuple):
    sender: Any
    to: Any
    message: Message


class Step(NamedTuple):
    """One `handle` call: who handled what, and the effects it returned."""

    address: Any
    message: Message
    effects: list


# ---------------------------------------------------------------------------- reading effects


def expand(effects: Iterable[Any]) -> list[Any]:
    """The effects with every `AfterFlush` opened in place (its inner effects after it)."""
    flat: list[Any] = []
    for effect in effects:
        flat.append(effect)
        if isinstance(effect, AfterFlush):
            flat.extend(expand(effect.effects))
    return flat


def sends(effects: Iterable[Any], kind: type | None = None, to: Any = None) -> list[Send]:
    """Every `Send` (inside `AfterFlush` too) of a message of `kind` to `to` (None: any)."""
    return [effect for effect in expand(effects) if isinstance(effect, Send)
            and (kind is None or isinstance(effect.message, kind)) and (to is None or effect.to == to)]


def messages(effects: Iterable[Any], kind: type | None = None, to: Any = None) -> list[Any]:
    """The messages the effects send. Bare messages in the list (from `Harness.received`) count
    as sent to anyone."""
    effects = list(effects)
    found = [send.message for send in sends(effects, kind, to)]
    if to is None:
        found += [item for item in effects
                  if isinstance(item, Message) and (kind is None or isinstance(item, kind))]
    return found


def only(effects: Iterable[Any], kind: type, to: Any = None) -> Any:
    """The one message of `kind` among effects (or messages); fails loudly on none or several."""
    found = messages(effects, kind, to)
    assert len(found) == 1, f"expected one {kind.__name__}, found {len(found)}: {found}"
    return found[0]


def flushed(effects: Iterable[Any]) -> list[Any]:
    """The effects that wait for a flush (inside an `AfterFlush`, at any depth)."""
    return [effect for outer in effects if isinstance(outer, AfterFlush) for effect in expand(outer.effects)]


def at_once(effects: Iterable[Any]) -> list[Any]:
    """The effects applied at once, not waiting for any flush."""
    return [effect for effect in effects if not isinstance(effect, AfterFlush)]


def flushed_messages(effects: Iterable[Any], kind: type | None = None) -> list[Any]:
    """Messages sent only after a flush."""
    return messages(flushed(effects), kind)


def unflushed_messages(effects: Iterable[Any], kind: type | None = None) -> list[Any]:
    """Messages sent at once, not waiting for any flush."""
    return messages(at_once(effects), kind)


def traces(effects: Iterable[Any], event: str | None = None) -> list[dict]:
    return [effect.details for effect in expand(effects)
            if isinstance(effect, Trace) and (event is None or effect.event == event)]


def notices(effects: Iterable[Any], kind: str) -> list[Any]:
    return [effect.payload for effect in expand(effects)
            if isinstance(effect, Notify) and effect.kind == kind]


def wire_round_trip(codec: Codec, message: Message) -> Message:
    """What the receiving end would decode; internal messages never cross the wire."""
    if type(message) in INTERNAL_TYPES:
        return message
    return codec.decode([bytes(frame) for frame in codec.encode(message)])


# ---------------------------------------------------------------------------- the driver


class Harness:
    def __init__(self, *, now_ns: int = 0, wire: bool = True) -> None:
        self.now_ns = now_ns
        self.codec = Codec() if wire else None
        self.actors: dict[Any, Any] = {}
        self.timers: dict[Any, Timers] = {}
        self.in_flight: deque[Envelope] = deque()
        self.outbox: list[Envelope] = []
        self.notified: list[tuple[Any, Notify]] = []
        self.traced: list[tuple[Any, Trace]] = []
        self.stopped: dict[Any, Exit | Crash] = {}
        self.dropped: list[Envelope] = []
        self.steps: list[Step] = []
        self._cut: set[frozenset] = set()

    # -- actors ---------------------------------------------------------------------------------
    def add(self, address: Any, actor: Any, *, start: bool = True) -> Any:
        assert address not in self.actors, f"{address!r} already holds an actor"
        self.actors[address] = actor
        self.timers[address] = Timers()
        self.stopped.pop(address, None)
        if start:
            self._apply(address, actor.start(self.now_ns))
            actor.invariants()
        return actor

    def remove(self, address: Any) -> Any:
        """The actor vanishes as if killed: its timers go, messages to it are dropped."""
        actor = self.actors.pop(address)
        del self.timers[address]
        self.in_flight = deque(envelope for envelope in self.in_flight if envelope.to != address)
        return actor

    # -- messages -------------------------------------------------------------------------------
    def deliver(self, to: Any, message: Message, sender: Any = "client") -> list[Any]:
        """Hand `message` to the actor at `to` now (through the codec); apply and return its effects."""
        actor = self.actors[to]
        if self.codec is not None:
            message = wire_round_trip(self.codec, message)
        effects = actor.handle(message, sender, self.now_ns)
        self.steps.append(Step(to, message, effects))
        actor.invariants()
        self._apply(to, effects)
        if isinstance(self.stopped.get(to), Exit) and self.actors.get(to) is actor:
            self._stop(to, actor)
        return effects

    def _stop(self, address: Any, actor: Any) -> None:
        """A graceful exit, as the runtime does it: the actor still gets `Stop`, then it is gone."""
        effects = actor.handle(Stop(reason="the actor exited"), b"", self.now_ns)
        self.steps.append(Step(address, Stop(), effects))
        self._apply(address, effects)
        self.remove(address)

    def run(self, steps_max: int = STEPS_MAX) -> int:
        """Deliver messages in flight until none is left (time stands still). Returns how many."""
        count = 0
        while self.in_flight:
            envelope = self.in_flight.popleft()
            if envelope.to not in self.actors:
                self.dropped.append(envelope)
                continue
            self.deliver(envelope.to, envelope.message, envelope.sender)
            count += 1
            assert count < steps_max, f"no quiet point after {count} messages: a message loop?"
        return count

    def advance(self, milliseconds: float) -> None:
        self.advance_to(self.now_ns + int(milliseconds * MS))

    def advance_to(self, deadline_ns: int) -> None:
        """Move the clock to `deadline_ns`, firing every timer due on the way in deadline order
        (across actors) and delivering the messages each one causes."""
        assert deadline_ns >= self.now_ns, "time only moves forward"
        self.run()
        while True:
            due = self._earliest_timer()
            if due is None or due[0] > deadline_ns:
                break
            when, address = due
            self.now_ns = max(self.now_ns, when)
            for name in self.timers[address].pop_due(when):
                if address in self.actors:
                    self.deliver(address, TimerFired(name=name), b"")
            self.run()
        self.now_ns = deadline_ns

    def _earliest_timer(self) -> tuple[int, Any] | None:
        best: tuple[int, Any] | None = None
        for address in sorted(self.timers, key=repr):
            deadline = self.timers[address].next_deadline()
            if deadline is not None and (best is None or deadline < best[0]):
                best = (deadline, address)
        return best

    # -- faults ---------------------------------------------------------------------------------
    def cut(self, first: Any, second: Any) -> None:
        """Drop every message between two addresses, both ways, until `heal`."""
        self._cut.add(frozenset((first, second)))

    def heal(self) -> None:
        self._cut.clear()

    # -- what happened --------------------------------------------------------------------------
    def received(self, address: Any, kind: type | None = None) -> list[Any]:
        """Messages sent to an address no actor holds (a test's client), oldest first."""
        return [envelope.message for envelope in self.outbox
                if envelope.to == address and (kind is None or isinstance(envelope.message, kind))]

    def take(self, address: Any, kind: type | None = None) -> list[Any]:
        """Like `received`, and forget them."""
        taken = self.received(address, kind)
        self.outbox = [envelope for envelope in self.outbox if not (
            envelope.to == address and (kind is None or isinstance(envelope.message, kind)))]
        return taken

    def steps_of(self, address: Any, kind: type | None = None) -> list[Step]:
        """The steps an actor took, for the messages of `kind` (None: all)."""
        return [step for step in self.steps
                if step.address == address and (kind is None or isinstance(step.message, kind))]

    def trace_events(self, event: str | None = None) -> list[dict]:
        return [trace.details for _, trace in self.traced if event is None or trace.event == event]

    # -- effects --------------------------------------------------------------------------------
    def _apply(self, address: Any, effects: list[Any]) -> None:
        for effect in effects:
            match effect:
                case Send(to=to, message=message):
                    self._send(Envelope(address, to, message))
                case AfterFlush(store=store, effects=inner):
                    store.flush()
                    self._apply(address, list(inner))
                case SetTimer(name=name, deadline_ns=deadline_ns):
                    if address in self.timers:
                        self.timers[address].set(name, deadline_ns)
                case CancelTimer(name=name):
                    if address in self.timers:
                        self.timers[address].cancel(name)
                case Trace():
                    self.traced.append((address, effect))
                case Notify():
                    self.notified.append((address, effect))
                case Exit():
                    self.stopped[address] = effect  # `deliver` hands it `Stop` once its effects are out
                case Crash():
                    self.stopped[address] = effect
                    if address in self.actors:
                        self.remove(address)
                case _:
                    raise AssertionError(f"{address!r} returned an unknown effect {effect!r}")

    def _send(self, envelope: Envelope) -> None:
        if frozenset((envelope.sender, envelope.to)) in self._cut:
            self.dropped.append(envelope)
            return
        if envelope.to in self.actors:
            self.in_flight.append(envelope)
        else:
            self.outbox.append(envelope)
