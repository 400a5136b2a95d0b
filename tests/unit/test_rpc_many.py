"""`RpcClient.request_many`: many requests in one round trip, each reply matched to its request.

Given a peer that answers the second request before the first, when both are sent at once, then
each reply comes back in its request's place; given a peer that never answers one of them, then
the call gives up within its timeout naming the unanswered request.
"""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from actors.messages import ListOffsetsRequest, ListOffsetsResponse
from transport.codec import Codec
from transport.rpc import RequestTimeout, RpcClient

pytestmark = pytest.mark.timeout(30)


def serve(router: zmq.Socket, answer: set[int], count: int) -> None:
    """Read `count` requests, then answer those whose partition is in `answer`, last first."""
    codec = Codec(64 * 1024 * 1024)
    got = []
    while len(got) < count:
        frames = router.recv_multipart()
        got.append((frames[0], codec.decode(frames[1:])))
    for identity, request in reversed(got):
        if request.partition in answer:
            reply = ListOffsetsResponse(correlation_id=request.correlation_id, topic=request.topic,
                                        partition=request.partition, offset=100 + request.partition)
            router.send_multipart([identity, *codec.encode(reply)])


@pytest.fixture
def peer():
    context = zmq.Context.instance()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    yield router, f"tcp://127.0.0.1:{port}"
    router.close(linger=0)


def asks(endpoint: str, partitions: list[int]) -> list[tuple[str, ListOffsetsRequest]]:
    return [(endpoint, ListOffsetsRequest(correlation_id=0, topic="t", partition=p, timestamp_ms=-1))
            for p in partitions]


def test_replies_answered_out_of_order_come_back_in_request_order(peer):
    router, endpoint = peer
    server = threading.Thread(target=serve, args=(router, {0, 1, 2}, 3))
    server.start()
    client = RpcClient("test")
    try:
        replies = client.request_many(asks(endpoint, [0, 1, 2]), timeout_ms=5000)
    finally:
        client.close()
        server.join(5)
    assert [(reply.partition, reply.offset) for reply in replies] == [(0, 100), (1, 101), (2, 102)]


def test_an_unanswered_request_times_out_within_the_budget_and_is_named(peer):
    router, endpoint = peer
    server = threading.Thread(target=serve, args=(router, {0}, 2))
    server.start()
    client = RpcClient("test")
    started = time.monotonic()
    try:
        with pytest.raises(RequestTimeout, match="ListOffsetsRequest"):
            client.request_many(asks(endpoint, [0, 1]), timeout_ms=500)
    finally:
        client.close()
        server.join(5)
    assert time.monotonic() - started < 3


# ---------------------------------------------------------------------------- a hostile server


PUSHING_SERVER = """
import sys, zmq
from transport.codec import Codec
from actors.messages import ListOffsetsResponse
router = zmq.Context.instance().socket(zmq.ROUTER)
router.setsockopt(zmq.SNDHWM, 0)
port = router.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
frames = router.recv_multipart()
request = Codec().decode(frames[1:])
router.send_multipart([frames[0], *Codec().encode(ListOffsetsResponse(
    correlation_id=request.correlation_id, topic="t", partition=0, offset=1))])
for _ in range(40):
    router.send_multipart([frames[0], bytes(8 << 20)])
sys.stdin.read()  # until the test is done
"""


def test_a_server_pushing_unasked_answers_fills_no_more_than_a_few_of_them():
    """The node agent's and the admin's client sits idle between requests; whatever the server
    at the other end sends meanwhile waits in its socket. A process that took a dead controller's
    port could push a thousand answers of up to 64 MiB each (no size bound, ZeroMQ's default
    queue of 1,000): 40 pushes of 8 MiB grew the client by 320 MiB."""
    import subprocess
    import sys

    import psutil

    server = subprocess.Popen([sys.executable, "-c", PUSHING_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    client = RpcClient("test")
    try:
        endpoint = f"tcp://127.0.0.1:{server.stdout.readline().strip()}"
        me = psutil.Process()
        before = me.memory_info().rss
        client.request(endpoint, ListOffsetsRequest(correlation_id=0, topic="t", partition=0, timestamp_ms=-1))
        time.sleep(1.5)
        grown_mb = (me.memory_info().rss - before) / 2**20
    finally:
        client.close()
        server.kill()
        server.wait(5)
    assert grown_mb < 60, f"the client holds {grown_mb:.0f} MiB of answers it never asked for"


def test_an_answer_from_another_endpoint_than_its_request_went_to_is_not_taken():
    """`request_many` numbers its requests from one counter, so the server of one request can
    guess the correlation id of the request sent just before it to another leader, and answer it.
    That answer was taken as the other leader's: a lag reading or an offsets reset read offset
    666 for partition 0 from the server of partition 1, whose own leader never answered. Now an
    answer counts only from the endpoint its request went to; the other request times out."""
    context = zmq.Context.instance()
    silent, guessing = context.socket(zmq.ROUTER), context.socket(zmq.ROUTER)
    endpoints = []
    for router in (silent, guessing):
        router.setsockopt(zmq.LINGER, 0)
        endpoints.append(f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}")

    def guess() -> None:
        codec = Codec()
        if not guessing.poll(5000):
            return
        identity, *frames = guessing.recv_multipart()
        request = codec.decode(frames)
        for correlation_id, partition, offset in ((request.correlation_id - 1, 0, 666),
                                                  (request.correlation_id, 1, 101)):
            guessing.send_multipart([identity, *codec.encode(ListOffsetsResponse(
                correlation_id=correlation_id, topic="t", partition=partition, offset=offset))])

    server = threading.Thread(target=guess)
    server.start()
    client = RpcClient("test")
    try:
        with pytest.raises(RequestTimeout) as timeout:
            client.request_many([(endpoints[0], asks(endpoints[0], [0])[0][1]),
                                 (endpoints[1], asks(endpoints[1], [1])[0][1])], timeout_ms=500)
        assert timeout.value.endpoint == endpoints[0]
    finally:
        client.close()
        server.join(10)
        silent.close(linger=0)
        guessing.close(linger=0)
