"""Request latency per type (transport/request_timing.py): arrival to answer, matched by peer and
correlation id, in fixed buckets, with a bounded number of requests awaiting their answer."""

from __future__ import annotations

from actors.messages import FetchRequest, FetchResponse, ProduceRequest, ProduceResponse, ReplicaExited
from transport.request_timing import BUCKETS_S, IN_FLIGHT_MAX, RequestTiming

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns


def produce(correlation_id: int) -> ProduceRequest:
    return ProduceRequest(correlation_id=correlation_id, topic="orders", partition=0, batch=b"")


def bucket_of(seconds: float) -> int:
    return next((index for index, bound in enumerate(BUCKETS_S) if seconds <= bound), len(BUCKETS_S))


def test_the_time_from_a_request_to_its_answer_lands_in_its_types_bucket():
    clock = Clock()
    timing = RequestTiming(clock)
    timing.arrived(b"client", produce(1))
    clock.now_ns += 3 * MS  # an acks=all produce waiting for its followers
    timing.answered(b"client", ProduceResponse(correlation_id=1))

    (name, latency), = timing.snapshot().items()
    assert name == "Produce"
    assert sum(latency.counts) == 1 and latency.counts[bucket_of(0.003)] == 1
    assert latency.sum_us == 3000


def test_a_long_poll_counts_its_wait_as_kafka_does():
    clock = Clock()
    timing = RequestTiming(clock)
    timing.arrived(b"follower", FetchRequest(correlation_id=9, topic="orders", partition=0, offset=0, max_wait_ms=5000))
    clock.now_ns += 5000 * MS
    timing.answered(b"follower", FetchResponse(correlation_id=9, topic="orders", partition=0))

    assert timing.snapshot()["Fetch"].counts[bucket_of(5.0)] == 1


def test_an_answer_to_another_peer_or_with_another_correlation_id_is_not_this_requests():
    clock = Clock()
    timing = RequestTiming(clock)
    timing.arrived(b"alice", produce(1))
    timing.answered(b"bob", ProduceResponse(correlation_id=1))
    timing.answered(b"alice", ProduceResponse(correlation_id=2))
    assert timing.snapshot() == {}

    timing.answered(b"alice", ProduceResponse(correlation_id=1))
    timing.answered(b"alice", ProduceResponse(correlation_id=1))  # a second answer is not a second request
    assert sum(timing.snapshot()["Produce"].counts) == 1


def test_requests_never_answered_are_forgotten_oldest_first_and_counted():
    timing = RequestTiming(Clock())
    for correlation_id in range(IN_FLIGHT_MAX + 10):
        timing.arrived(b"flood", produce(correlation_id))

    assert len(timing.waiting) == IN_FLIGHT_MAX and timing.forgotten == 10
    timing.answered(b"flood", ProduceResponse(correlation_id=0))  # forgotten: not counted
    timing.answered(b"flood", ProduceResponse(correlation_id=IN_FLIGHT_MAX + 9))
    assert sum(timing.snapshot()["Produce"].counts) == 1


def test_notices_and_acks_0_produces_expect_no_answer_and_are_not_timed():
    timing = RequestTiming(Clock())
    timing.arrived(b"supervisor", ReplicaExited(topic="orders", partition=0, node=1, incarnation=1))
    timing.arrived(b"client", ProduceRequest(correlation_id=5, topic="orders", partition=0, acks=0))
    assert not timing.waiting
