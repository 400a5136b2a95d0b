"""Request latency as the console measures it: per request type, a cumulative-bucket histogram of
the time from sending a request to its answer (or to giving up), Prometheus' model.

The actor runtime counts messages but does not time requests, so these are the latencies a
client sees for the requests the console itself makes (Metadata, DescribeGroup, RuntimeStats,
ListGroups, Fetch): a probe of the coordinators and leaders, exported as such. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

# Seconds: loopback requests answer in ~0.1-1 ms; a paused or isolated actor takes the timeout.
BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class LatencyHistogram:
    def __init__(self, buckets_s: tuple[float, ...] = BUCKETS_S) -> None:
        self.buckets_s = buckets_s
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], list[int]] = {}  # (request, outcome) -> per-bucket counts
        self._sums: dict[tuple[str, str], float] = {}

    def observe(self, request: str, seconds: float, outcome: str = "ok") -> None:
        with self._lock:
            key = (request, outcome)
            counts = self._counts.setdefault(key, [0] * (len(self.buckets_s) + 1))
            index = next(
                (position for position, bound in enumerate(self.buckets_s) if seconds <= bound),
                len(self.buckets_s),
            )
            counts[index] += 1
            self._sums[key] = self._sums.get(key, 0.0) + seconds

    @contextmanager
    def timed(self, request: str) -> Iterator[None]:
        started = time.perf_counter()
        outcome = "ok"
        try:
            yield
        except BaseException:
            outcome = "error"
            raise
        finally:
            self.observe(request, time.perf_counter() - started, outcome)

    def series(self) -> list[tuple[str, str, list[tuple[str, int]], float]]:
        """(request, outcome, cumulative buckets as (le, count) ending with +Inf, sum of seconds)."""
        with self._lock:
            out = []
            for (request, outcome), counts in sorted(self._counts.items()):
                running, buckets = 0, []
                for bound, count in zip(list(self.buckets_s) + [float("inf")], counts):
                    running += count
                    buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
                out.append((request, outcome, buckets, self._sums[(request, outcome)]))
            return out
