"""The simulator's clock, event queue and faulty network, all driven by one seeded Random.

Every message between simulated actors goes through the real codec (encode to frames, decode
on arrival), then through `Network.plan`, which decides from the seeded RNG whether the message
is dropped, duplicated or delayed, and whether a partition cuts the link. Partitions are sets of
blocked (source, destination) host pairs, so one-way cuts are just one direction blocked.

Ordering follows what railmq's transport gives: ZeroMQ over TCP keeps the messages of one link
(one sender to one receiver) in order, so a slow message holds back those behind it on its link
(head-of-line blocking), while messages on different links reorder freely. A duplicate arrives
right behind its original. Protocols may rely on per-link order, as Kafka's do on TCP; they may
not rely on anything else.

Nothing here reads a real clock: `EventQueue.now_ns` moves only when an event is popped.
"""

from __future__ import annotations

import random
from heapq import heappop, heappush
from dataclasses import dataclass, field
from typing import Any

MS = 1_000_000


@dataclass(frozen=True)
class NetworkFaults:
    """Per-message fault probabilities and delays (a link that behaves, by default)."""

    drop_probability: float = 0.0
    duplicate_probability: float = 0.0
    delay_min_ms: float = 0.05
    delay_max_ms: float = 0.5
    slow_probability: float = 0.0  # a message is occasionally much slower (reordering)
    slow_delay_ms: float = 50.0


class EventQueue:
    def __init__(self) -> None:
        self.now_ns = 0
        self._heap: list[tuple[int, int, str, Any]] = []
        self._sequence = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, at_ns: int, kind: str, payload: Any) -> None:
        self._sequence += 1
        heappush(self._heap, (at_ns if at_ns > self.now_ns else self.now_ns, self._sequence, kind, payload))

    def pop(self) -> tuple[int, str, Any]:
        at_ns, _, kind, payload = heappop(self._heap)
        self.now_ns = at_ns
        return at_ns, kind, payload

    def pop_due(self, until_ns: int) -> tuple[str, Any] | None:
        """The next event at or before `until_ns` (kind, payload), moving the clock; else None."""
        heap = self._heap
        if not heap or heap[0][0] > until_ns:
            return None
        at_ns, _, kind, payload = heappop(heap)
        self.now_ns = at_ns
        return kind, payload



@dataclass
class Network:
    rng: random.Random
    faults: NetworkFaults = field(default_factory=NetworkFaults)
    blocked: set[tuple[str, str]] = field(default_factory=set)  # (source host, destination host)
    counters: dict[str, int] = field(default_factory=dict)
    link_free_ns: dict[tuple[str, str], int] = field(default_factory=dict)  # per-link FIFO

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def plan(self, source: str, destination: str, now_ns: int) -> list[int]:
        """Arrival times (ns) of the copies of one message: [] when it is lost.

        This runs for every simulated message, so it is written for speed; `rng.random()` scaled
        by hand is exactly what `rng.uniform` computes, so seeds replay as they always did."""
        link = (source, destination)
        if link in self.blocked:
            self.count("cut")
            return []
        faults = self.faults
        random = self.rng.random
        copies = 1
        if faults.drop_probability or faults.duplicate_probability:
            if faults.drop_probability and random() < faults.drop_probability:
                self.count("dropped")
                return []
            if faults.duplicate_probability and random() < faults.duplicate_probability:
                copies = 2
                self.count("duplicated")
        low = faults.delay_min_ms
        delay_ms = low + (faults.delay_max_ms - low) * random()
        if faults.slow_probability and random() < faults.slow_probability:
            delay_ms += faults.slow_delay_ms * random()
            self.count("slowed")
        arrival = now_ns + int(delay_ms * MS)
        free = self.link_free_ns.get(link, 0)
        if arrival <= free:
            arrival = free + 1
        if copies == 1:
            self.link_free_ns[link] = arrival
            return [arrival]
        self.link_free_ns[link] = arrival + 1
        return [arrival, arrival + 1]

    # ------------------------------------------------------------------ partitions

    def isolate(self, host: str, others: list[str], *, direction: str = "both") -> None:
        for other in others:
            if other == host:
                continue
            if direction in ("both", "out"):
                self.blocked.add((host, other))
            if direction in ("both", "in"):
                self.blocked.add((other, host))

    def split(self, side_a: list[str], side_b: list[str]) -> None:
        for a in side_a:
            for b in side_b:
                self.blocked.add((a, b))
                self.blocked.add((b, a))

    def heal(self) -> None:
        self.blocked.clear()
