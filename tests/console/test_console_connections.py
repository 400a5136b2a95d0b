"""The console's HTTP server against connections that hold a place without asking anything.

uvicorn closes a connection idle after a response (its keep-alive timeout), but not one that
never finishes a request's headers, nor one that sends nothing at all: each stayed open for good,
so any local process could hold connections (and up to 16 KiB of unfinished headers each) until
the console's descriptors ran out. The console's server closes a connection whose headers are not
complete within `HEADERS_TIMEOUT_S` of its opening (or of its last response), and one past
`CONNECTIONS_MAX` at once. A live feed, whose request is complete, is never cut.
"""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest

from chaos.console import server
from chaos.console.server import Console

pytest.importorskip("uvicorn")

NOBODY = "tcp://127.0.0.1:1"  # no cluster: the HTTP server is what is tested


@pytest.fixture
def console(monkeypatch):
    monkeypatch.setattr(server, "HEADERS_TIMEOUT_S", 1.0)
    monkeypatch.setattr(server, "CONNECTIONS_MAX", 6)
    started = Console(NOBODY, http_port=0, refresh_ms=300).start()
    try:
        yield started
    finally:
        started.stop()


def _connect(console: Console) -> socket.socket:
    host, port = console.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_within(connection: socket.socket, seconds: float) -> bool:
    """The server closed it (or reset it) within `seconds`; an open one is still open after them
    (whatever it was sent meanwhile: a live feed keeps sending)."""
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            connection.settimeout(left)
            if not connection.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        pass
    return False


def _response(connection: socket.socket) -> bytes:
    """One whole response: its headers, then as many bytes as its content-length says."""
    connection.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        data += connection.recv(4096)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        body += connection.recv(4096)
    return head + b"\r\n\r\n" + body


def test_connections_that_never_finish_their_headers_are_closed(console):
    silent = _connect(console)
    partial = _connect(console)
    partial.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    trickling = _connect(console)
    opened = time.monotonic()
    try:
        try:
            for _ in range(6):  # a byte every 0.3 s: each one arrives long before any idle timeout
                trickling.sendall(b"X")
                time.sleep(0.3)
            closed = _closed_within(trickling, 1.0)
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        assert closed, "still open 2.8 s after it opened, its headers unfinished"
        assert time.monotonic() - opened > 0.9, "not before the headers timeout"
        assert _closed_within(silent, 1.0) and _closed_within(partial, 1.0)
    finally:
        for connection in (silent, partial, trickling):
            connection.close()


def test_a_connection_past_the_bound_is_closed_at_once_and_others_get_in_once_they_go(console):
    held = [_connect(console) for _ in range(server.CONNECTIONS_MAX)]
    try:
        time.sleep(0.2)
        extra = _connect(console)
        assert _closed_within(extra, 0.5), "one more than CONNECTIONS_MAX"
        extra.close()
        assert all(_closed_within(connection, 2.0) for connection in held)
        with urllib.request.urlopen(console.url + "/healthz", timeout=5) as answer:
            assert answer.status == 200
    finally:
        for connection in held:
            connection.close()


def test_a_live_feed_outlasts_the_headers_timeout(console):
    feed = _connect(console)
    try:
        feed.sendall(b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert not _closed_within(feed, 2.5), "a complete request is answered, not cut"
    finally:
        feed.close()


def test_keep_alive_requests_on_one_connection_each_get_their_answer(console):
    connection = _connect(console)
    try:
        for _ in range(3):
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _response(connection).startswith(b"HTTP/1.1 200")
            time.sleep(0.5)  # within the headers timeout, measured afresh after each answer
    finally:
        connection.close()
