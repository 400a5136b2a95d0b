"""How long each request type takes an actor, from arrival to answer (Kafka's RequestMetrics
TotalTimeMs, minus the network).

The runtime notes every request a peer sends to its ROUTER (the peer, the correlation id, the
type) and, when it sends that peer a message carrying the same correlation id, puts the time in
between into the request type's histogram. Everything the actor does before answering is in it:
the handler, the fsync an answer waits for (AfterFlush), an acks=all produce waiting for its
followers, a fetch parked until data arrives or its wait ends (as in Kafka, a long poll's wait
is part of a fetch's time).

Bounded in bytes: at most `IN_FLIGHT_MAX` requests await an answer (a request never answered —
a notice, a peer that went away — is forgotten oldest first, and counted), and one histogram of
`len(BUCKETS_S) + 1` counters per request type of the protocol, a closed set of names the codec
decoded (a hostile peer cannot invent new ones).
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from typing import Any

from actors.messages import ProduceRequest, ReplicaExited, RequestLatency

# Upper bounds of the buckets, in seconds (a last, unbounded bucket follows): 0.5 ms to 10 s.
BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BOUNDS_NS = tuple(int(bound * 1e9) for bound in BUCKETS_S)
IN_FLIGHT_MAX = 1024  # ~150 bytes each: at most ~150 KB of requests awaiting their answer


def request_name(message: Any) -> str:
    """The label of a request: its type without "Request" (Produce, Fetch, ReplicaHeartbeat, ...)."""
    return type(message).__name__.removesuffix("Request")


def expects_answer(message: Any) -> bool:
    """Notices (an exit notice) and acks=0 produces get no answer: not requests to time."""
    kind = type(message)
    return kind is not ReplicaExited and not (kind is ProduceRequest and message.acks == 0)


class Histogram:
    __slots__ = ("counts", "sum_ns")

    def __init__(self) -> None:
        self.counts = [0] * (len(_BOUNDS_NS) + 1)
        self.sum_ns = 0

    def observe(self, elapsed_ns: int) -> None:
        self.counts[bisect.bisect_left(_BOUNDS_NS, elapsed_ns)] += 1
        self.sum_ns += elapsed_ns


class RequestTiming:
    def __init__(self, clock: Any = time.monotonic_ns) -> None:
        self.clock = clock
        self.waiting: OrderedDict[tuple[bytes, int], tuple[str, int]] = OrderedDict()
        self.histograms: dict[str, Histogram] = {}
        self.forgotten = 0  # requests dropped from `waiting` unanswered (see IN_FLIGHT_MAX)

    def arrived(self, sender: bytes, message: Any) -> None:
        correlation_id = getattr(message, "correlation_id", None)
        if type(correlation_id) is not int or not expects_answer(message):
            return
        waiting = self.waiting
        key = (sender, correlation_id)
        waiting.pop(key, None)  # the same id again: the peer gave up on the first one
        waiting[key] = (request_name(message), self.clock())
        if len(waiting) > IN_FLIGHT_MAX:
            waiting.popitem(last=False)
            self.forgotten += 1

    def answered(self, to: bytes, message: Any) -> None:
        correlation_id = getattr(message, "correlation_id", None)
        if type(correlation_id) is not int:
            return
        started = self.waiting.pop((to, correlation_id), None)
        if started is None:
            return
        name, arrived_ns = started
        histogram = self.histograms.get(name)
        if histogram is None:
            histogram = self.histograms[name] = Histogram()
        histogram.observe(self.clock() - arrived_ns)

    def snapshot(self) -> dict[str, RequestLatency]:
        """Per request type: the count in each bucket (not cumulative; the last is above 10 s) and
        the total time in microseconds."""
        return {name: RequestLatency(counts=list(histogram.counts), sum_us=histogram.sum_ns // 1000)
                for name, histogram in sorted(self.histograms.items())}
