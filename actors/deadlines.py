"""One timer at an actor's next deadline, instead of a periodic tick.

A client's work, and the group coordinator's, falls due at known times: a request's timeout, a
retry's backoff, a session's end, a lock's expiry, the next heartbeat. Each is wanted where it is
born (`want(deadline_ns)`), and the handler that saw it born ends with `arm(now_ns)`: the timer is
set at the earliest deadline wanted, unless it is already set at or before it. So the timer never fires after a deadline it
was told of; it may fire before one that no longer matters (the answer came), which costs one
wake that finds nothing due. When it fires (`fired()`), the actor does what is due and wants every
deadline still ahead again. An actor with nothing pending sets no timer at all: an idle client
costs no wakes, and a busy one wakes when something is due, not 10 or 20 times a second.

A deadline at or before now arms the timer at now: the actor runs its due work next. Its
deadlines are the ones still ahead of now, so work that stays due (a retry waiting for room in
flight) does not wake it again; the event that makes room does.

`uncovered(deadlines)` is for `invariants()` of an actor that wants deadlines where they are born
(the producer, a share member's locks, the group coordinator's classic groups): a deadline ahead
of the latest time seen that the armed timer would miss is a wake lost, and the simulator checks for one
after every step. An actor that wants every deadline at the end of every step needs no check.
"""

from __future__ import annotations

from collections.abc import Iterable

from actors.effects import Effect, SetTimer


def lowered(floor_ns: int | None, deadline_ns: int | None, now_ns: int) -> int | None:
    """A floor (no deadline of its kind before it; None: none pending) lowered by a deadline just
    born. One at or before now is not a deadline ahead: it leaves the floor as it is."""
    if deadline_ns is None or deadline_ns <= now_ns or (floor_ns is not None and floor_ns <= deadline_ns):
        return floor_ns
    return deadline_ns


class DeadlineTimer:
    __slots__ = ("name", "armed_ns", "wanted_ns", "seen_ns")

    def __init__(self, name: str = "tick") -> None:
        self.name = name
        self.armed_ns: int | None = None  # when the timer is set to fire (None: not set)
        self.wanted_ns: int | None = None  # the earliest deadline wanted since the last `arm`
        # The latest time an `arm` saw. A clock can step back (a wall clock set back, the
        # simulator's clock faults); a deadline at or before this one fell due then, and what it
        # guarded was done or waits for an event, even if the clock now shows it ahead again.
        self.seen_ns = 0

    def want(self, deadline_ns: int) -> None:
        if self.wanted_ns is None or deadline_ns < self.wanted_ns:
            self.wanted_ns = deadline_ns

    def want_all(self, deadlines: Iterable[int], now_ns: int) -> None:
        """Want every deadline still ahead of now (after the timer fired and the due work ran)."""
        wanted = self.wanted_ns
        for deadline_ns in deadlines:
            if deadline_ns > now_ns and (wanted is None or deadline_ns < wanted):
                wanted = deadline_ns
        self.wanted_ns = wanted

    def arm(self, now_ns: int) -> list[Effect]:
        """The `SetTimer` a handler ends with, if a deadline wanted comes before the armed one."""
        if now_ns > self.seen_ns:
            self.seen_ns = now_ns
        wanted, self.wanted_ns = self.wanted_ns, None
        if wanted is None or (self.armed_ns is not None and self.armed_ns <= wanted):
            return []
        self.armed_ns = max(wanted, now_ns)
        return [SetTimer(self.name, self.armed_ns)]

    def fired(self) -> None:
        self.armed_ns = None

    def uncovered(self, deadlines: Iterable[int]) -> int | None:
        """A deadline ahead of every `arm` so far that the armed timer would fire after (None: none)."""
        now_ns, armed_ns = self.seen_ns, self.armed_ns
        if armed_ns is None:
            return next((deadline_ns for deadline_ns in deadlines if deadline_ns > now_ns), None)
        return next((deadline_ns for deadline_ns in deadlines if armed_ns > deadline_ns > now_ns), None)
