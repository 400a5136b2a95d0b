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


def test_forgetting_a_closed_client_descriptor_leaves_a_socket_that_reused_its_number_watched(context):
    """A client connection's descriptor is watched for data, and forgotten when the monitor says
    it closed. That report comes late: libzmq may have given the number to a new socket's ZMQ_FD
    meanwhile. Forgetting it then unwatched the new socket (a resumed replica's socket to its new
    leader), and the replica never caught up."""
    watch = SocketWatch()
    server, client = pair(context, "reused")
    watch.add_socket(server)  # its ZMQ_FD has the number a closed client connection had
    number = server.getsockopt(zmq.FD)
    assert watch.wait(0) == ([], [])  # nothing waits: from here on only epoll reports the server

    watch.remove_fd(number)  # the monitor's late report of that connection
    client.send(b"to the socket")

    assert wait_ready(watch) == [server]
    closed_read, closed_write = os.pipe()  # the same for a plain descriptor (a lifeline) on the number
    watch.add_edge_fd(closed_read)
    os.close(closed_read)
    os.close(closed_write)
    read_end, write_end = os.pipe()
    assert read_end == closed_read, "the test needs the number reused"
    watch.add_fd(read_end)
    watch.remove_fd(closed_read)
    os.write(write_end, b"x")
    assert watch.wait(2000)[1] == [read_end]
    for fd in (read_end, write_end):
        os.close(fd)
    watch.close()
