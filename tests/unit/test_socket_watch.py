"""transport/socket_watch.py: waiting on many ZeroMQ sockets through their ZMQ_FD in one epoll set."""

from __future__ import annotations

import os
import time

import pytest
import zmq

from transport.socket_watch import SocketWatch


@pytest.fixture
def context():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def pair(context, name: str):
    server = context.socket(zmq.ROUTER)
    server.bind(f"inproc://{name}")
    client = context.socket(zmq.DEALER)
    client.connect(f"inproc://{name}")
    return server, client


def wait_ready(watch: SocketWatch, timeout_s: float = 2.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _ = watch.wait(50)
        if ready:
            return ready
    return []


def test_of_many_sockets_only_the_one_with_a_message_is_returned(context):
    watch = SocketWatch()
    pairs = [pair(context, f"p{index}") for index in range(50)]
    for server, _ in pairs:
        watch.add_socket(server)
    assert watch.wait(0) == ([], [])

    pairs[31][1].send(b"hello")

    assert wait_ready(watch) == [pairs[31][0]]
    watch.close()


def test_a_message_whose_signal_a_send_consumed_is_still_found(context):
    watch = SocketWatch()
    server, client = pair(context, "echo")
    watch.add_socket(client)
    client.send(b"ping")
    identity, _ = server.recv_multipart()
    server.send_multipart([identity, b"pong"])
    time.sleep(0.05)
    client.send(b"again")  # processes the commands: the signal of "pong" is consumed here
    watch.touched(client)

    assert watch.wait(1000)[0] == [client]
    assert client.recv(zmq.NOBLOCK) == b"pong"
    watch.close()


def test_a_drained_socket_stops_being_returned_and_plain_descriptors_are_watched_too(context):
    watch = SocketWatch()
    server, client = pair(context, "drain")
    watch.add_socket(server)
    read_end, write_end = os.pipe()
    watch.add_fd(read_end)
    client.send(b"one")
    assert wait_ready(watch) == [server]
    server.recv_multipart(zmq.NOBLOCK)
    os.write(write_end, b"x")

    ready, fds = watch.wait(1000)

    assert ready == [] and fds == [read_end]
    watch.remove(server)
    client.send(b"two")
    assert wait_ready(watch, 0.2) == [], "a removed socket is not watched"
    os.close(read_end)
    os.close(write_end)
    watch.close()
