"""RingLinks (transport/ring_link.py) between a fetcher and a leader in one process: what goes
through the ring, what falls back to ZeroMQ, and that a fallback never costs the ring."""

from __future__ import annotations

import pytest

from actors.messages import FetchRequest, FetchResponse
from transport.ring_link import CORRELATION, RingLinks
from transport.shm import cluster_prefix, unlink_segments

LEADER = "tcp://127.0.0.1:1"
FETCHER = b"fetcher-routing-id"
RING_BYTES = 64 * 1024


@pytest.fixture
def links(segments):
    fetcher = RingLinks(actor_id="fetcher", cluster_id=segments.cluster_id, capacity_bytes=RING_BYTES,
                        zero_copy=False, counters={})
    leader = RingLinks(actor_id="leader", cluster_id=segments.cluster_id, zero_copy=False, counters={})
    try:
        yield fetcher, leader
    finally:
        leader.close()
        fetcher.close()
        unlink_segments(cluster_prefix(segments.cluster_id))


def fetch(fetcher: RingLinks, leader: RingLinks, correlation: int, records: bytes, max_bytes: int = 8 << 20):
    """One fetch round trip through both ends; (what the leader sent, what the fetcher's actor sees)."""
    request = fetcher.outgoing(LEADER, FetchRequest(correlation_id=correlation, topic="t", partition=0, offset=0,
                                                    max_bytes=max_bytes, replica=2))
    leader.incoming(FETCHER, request)
    sent = leader.divert(FETCHER, FetchResponse(correlation_id=correlation, records=records))
    return request, sent, fetcher.incoming(LEADER, sent)


def test_a_response_that_fits_goes_through_the_ring(links):
    fetcher, leader = links
    _, sent, seen = fetch(fetcher, leader, 1, b"x" * 1000)
    assert sent.records == b"" and sent.ring_bytes == 1000
    assert bytes(seen.records) == b"x" * 1000 and leader.counters["ring_writes"] == 1


def test_a_response_larger_than_the_ring_goes_over_zeromq_and_the_ring_stays(links):
    fetcher, leader = links
    fetch(fetcher, leader, 1, b"a" * 100)
    writer = next(iter(leader.writers.values()))
    oversize = b"b" * (RING_BYTES + 1)
    _, sent, seen = fetch(fetcher, leader, 2, oversize)
    assert sent.ring_bytes == -1 and sent.records == oversize and seen.records == oversize
    assert leader.counters.get("ring_oversize") == 1
    assert list(leader.writers.values()) == [writer], "the ring was kept, not dropped and attached again"
    _, sent, seen = fetch(fetcher, leader, 3, b"c" * 100)
    assert sent.ring_bytes == 100 and bytes(seen.records) == b"c" * 100
    assert next(iter(leader.writers.values())) is writer


def test_a_fetch_that_offers_a_ring_asks_for_no_more_than_the_ring_holds(links):
    fetcher, leader = links
    request, _, _ = fetch(fetcher, leader, 1, b"x", max_bytes=8 << 20)
    reader = fetcher.readers[LEADER]
    assert request.ring == reader.name
    assert request.max_bytes == reader.record_bytes_max - CORRELATION.size
    small, _, _ = fetch(fetcher, leader, 2, b"x", max_bytes=1000)
    assert small.max_bytes == 1000, "a smaller wish is kept"


def test_a_fetch_naming_a_ring_it_cannot_map_gets_its_records_over_zeromq_and_leaves_the_ring_alone(links):
    """`ring` in a fetch is a claim, and any client may make it. A process of another user cannot
    map a fetcher's ring, but /dev/shm shows its name: named in its own fetch, it made the leader
    attach as that ring's writer and write the hostile client's answers into it, and the leader the
    ring was made for then found the writer end taken (RingBusy): replication fell back to ZeroMQ.
    A fetch proves the ring is its own with the key its creator wrote in it."""
    fetcher, leader = links
    offered = fetcher.outgoing(LEADER, FetchRequest(correlation_id=1, topic="t", partition=0, offset=0, replica=2))
    forged = FetchRequest(correlation_id=99, topic="t", partition=0, offset=0, ring=offered.ring, host=offered.host,
                          ring_key=offered.ring_key ^ 1)

    leader.incoming(b"attacker", forged)
    sent = leader.divert(b"attacker", FetchResponse(correlation_id=99, records=b"z" * 100))

    assert offered.ring_key, "the fetcher's offer carries no key"
    assert sent.ring_bytes == -1 and sent.records == b"z" * 100
    assert not leader.writers and leader.counters.get("ring_offers_refused") == 1
    _, sent, seen = fetch(fetcher, leader, 2, b"c" * 100)
    assert sent.ring_bytes == 100 and bytes(seen.records) == b"c" * 100, "the owner's fetches lost the ring"


def test_a_ring_whose_reader_was_killed_is_unlinked_when_the_leader_lets_it_go(links, segments, processes):
    """A consumer killed with kill -9 left its rings in /dev/shm (RAM) while the cluster ran: the
    leader closed its end and nobody unlinked them, so a consumer crashing again and again filled
    /dev/shm 64 KiB to 8 MiB a ring. A leader letting go of a ring whose reader died unlinks it;
    a live reader's ring is left to its creator."""
    from tests.ring.ring_children import fetcher_offers_a_ring
    from transport.ring_link import RINGS_MAX
    from transport.shm import list_segments

    fetcher, leader = links
    parent_end, child_end = processes.pipe()
    doomed = processes.start(fetcher_offers_a_ring, segments.cluster_id, child_end)
    assert parent_end.poll(30), "the fetcher did not offer its ring"
    offer = parent_end.recv()
    leader.incoming(b"doomed", offer)
    assert offer.ring in leader.writers and offer.ring in list_segments(cluster_prefix(segments.cluster_id))
    doomed.kill()
    doomed.join(10)

    live = []
    for index in range(RINGS_MAX):  # other fetchers' offers push the dead one's ring out
        other = RingLinks(actor_id=f"live-{index}", cluster_id=segments.cluster_id, capacity_bytes=RING_BYTES,
                          zero_copy=False, counters={})
        live.append(other)
        leader.incoming(f"live-{index}".encode(), other.outgoing(LEADER, FetchRequest(
            correlation_id=1, topic="t", partition=0, offset=0, max_bytes=8 << 20, replica=2)))
    try:
        assert offer.ring not in leader.writers
        names = list_segments(cluster_prefix(segments.cluster_id))
        assert offer.ring not in names, "the dead reader's ring is still in /dev/shm"
        live_rings = [links_.readers[LEADER].name for links_ in live[:1]]
        leader.close()
        assert set(live_rings) <= set(list_segments(cluster_prefix(segments.cluster_id))), \
            "a live reader's ring was unlinked"
    finally:
        for other in live:
            other.close()
