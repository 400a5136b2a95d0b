"""Named timers with one deadline each: set replaces, cancel forgets, pop_due fires in order.

A heap with lazy deletion: setting or cancelling is O(log n) and stale heap entries are skipped
when they surface. Shared by the runtime and the simulator so both fire timers the same way.
"""

from __future__ import annotations

import heapq


class Timers:
    def __init__(self) -> None:
        self._deadlines: dict[str, int] = {}
        self._heap: list[tuple[int, int, str]] = []
        self._sequence = 0

    def __len__(self) -> int:
        return len(self._deadlines)

    def set(self, name: str, deadline_ns: int) -> None:
        self._deadlines[name] = deadline_ns
        self._sequence += 1
        heapq.heappush(self._heap, (deadline_ns, self._sequence, name))

    def cancel(self, name: str) -> None:
        self._deadlines.pop(name, None)

    def deadline(self, name: str) -> int | None:
        return self._deadlines.get(name)

    def next_deadline(self) -> int | None:
        self._discard_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ns: int) -> list[str]:
        """Names whose deadline is <= now, earliest first; each fires once."""
        due: list[str] = []
        while True:
            self._discard_stale()
            if not self._heap or self._heap[0][0] > now_ns:
                return due
            deadline, _, name = heapq.heappop(self._heap)
            del self._deadlines[name]
            due.append(name)

    def _discard_stale(self) -> None:
        heap = self._heap
        while heap and self._deadlines.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
