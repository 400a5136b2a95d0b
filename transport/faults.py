"""The fault switch: drops or delays traffic to and from named peers, without root.

The chaos harness sends a `FaultControlRequest` to a runtime; from then on every message that
runtime sends or receives is checked against the link faults: a matching fault with
`drop_probability` 1 cuts the link (a network partition, one-way if `direction` says so), a
smaller probability makes it lossy, `delay_ms` holds messages back. A peer matches when its
endpoint or its name (the routing id other actors send with) starts with one of the fault's
`peers`, or the fault names "*".

Held messages are released in deadline order by the runtime's loop, so a delayed link also
reorders relative to undelayed ones, as real networks do.
"""

from __future__ import annotations

import heapq
import random
from typing import Any

from actors.messages import LinkFault


class FaultSwitch:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._links: list[LinkFault] = []
        self._held: list[tuple[int, int, Any]] = []
        self._sequence = 0

    def configure(self, links: list[LinkFault]) -> None:
        """Replace the link faults; raises ValueError (nothing changes) for a fault that could not
        mean what its sender meant: an empty prefix matches every peer, the fault switch's own
        answer included, so a plan built before an endpoint was known would cut the actor off."""
        for link in links:
            if not link.peers or any(not prefix for prefix in link.peers):
                raise ValueError(f"a link fault needs non-empty peer prefixes (\"*\" for everyone), not {link.peers!r}")
            if link.direction not in ("in", "out", "both"):
                raise ValueError(f"a link fault's direction is in, out or both, not {link.direction!r}")
        self._links = list(links)

    @property
    def active(self) -> bool:
        return bool(self._links)

    def outbound(self, peer: str) -> int | None:
        """None: drop. 0: send now. >0: hold for that many nanoseconds."""
        return self._decide(peer, "out")

    def inbound(self, peer: str) -> int | None:
        return self._decide(peer, "in")

    def _decide(self, peer: str, direction: str) -> int | None:
        if not self._links:
            return 0
        delay_ns = 0
        for link in self._links:
            if link.direction not in (direction, "both"):
                continue
            if not any(prefix == "*" or peer.startswith(prefix) for prefix in link.peers):
                continue
            if link.drop_probability >= 1.0 or (
                link.drop_probability > 0 and self._rng.random() < link.drop_probability
            ):
                return None
            delay_ns = max(delay_ns, link.delay_ms * 1_000_000)
        return delay_ns

    def hold(self, release_ns: int, item: Any) -> None:
        self._sequence += 1
        heapq.heappush(self._held, (release_ns, self._sequence, item))

    def next_release_ns(self) -> int | None:
        return self._held[0][0] if self._held else None

    def release_due(self, now_ns: int) -> list[Any]:
        due = []
        while self._held and self._held[0][0] <= now_ns:
            due.append(heapq.heappop(self._held)[2])
        return due
