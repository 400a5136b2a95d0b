"""The clock actors run on: the wall clock's nanoseconds, except that it never steps back.

Actors get one `now_ns` for everything: record timestamps and retention compare it with times
producers wrote (so it is the wall clock), and every timer is a deadline on it (elections,
sessions, lock expiries, request timeouts). On `time.time_ns` alone, a machine whose clock was set
back ten minutes (NTP stepping a clock that ran fast, an operator's `date -s`) stalled every
timer for ten minutes: no election, no session expiry, no failover.

`SteadyClock` reads the wall clock while it runs normally. When the wall clock steps back, it
goes on from where it was at `1 - SLEW` of the pace of the monotonic clock, until the wall clock
catches up, and reads the wall clock again from then on. A timer meanwhile fires at most
`SLEW` late; nothing ever sees time go back. A step forward is followed at once: after a
suspended machine resumes the time did pass (sessions expired meanwhile), and due timers fire.

Each process has its own, so two processes started on either side of a step back disagree by up
to the step until it is made up. What compares times across processes tolerates that: a share
member holding a lock the coordinator let expire finds its acknowledgement refused (the record is
delivered again), as with the skew between hosts.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

# While the wall clock is behind, this clock runs this much slower than real time: a timer fires
# at most 10% late, and a step back of ten minutes is made up in 100 minutes.
SLEW = 0.1


class SteadyClock:
    def __init__(self, wall: Callable[[], int] | None = None, monotonic: Callable[[], int] = time.monotonic_ns) -> None:
        self._wall = wall or (lambda: time.time_ns())  # looked up at each call (tests move it)
        self._monotonic = monotonic
        self._lock = threading.Lock()  # a client's shell and its engine's thread both read it
        self._last_monotonic = monotonic()
        self._last = self._wall()

    def __call__(self) -> int:
        """max(the wall clock, the last reading + the monotonic time since, slowed by SLEW)."""
        with self._lock:
            monotonic = self._monotonic()
            elapsed = max(0, monotonic - self._last_monotonic)
            now = max(self._wall(), self._last + elapsed - int(elapsed * SLEW))
            self._last, self._last_monotonic = now, monotonic
            return now
