"""The console's HTTP face (starlette): the page, its live feed, the buttons, /metrics.

    GET  /                      the page (static/index.html; its script and style, no CDN)
    GET  /api/snapshot          the latest Snapshot as JSON
    GET  /api/timeline?after=N  timeline entries after sequence N
    GET  /api/events            server-sent events: `snapshot` (the whole view, latest only) and
                                `events` (new timeline entries, every one, in order)
    POST /api/faults            {"action": "kill", "kind": "replica", "name": "replica/t/0/n1"}
    GET  /api/explain?topic=T&partition=P&offset=O   the life of one offset
    GET  /api/labs, POST /api/labs {"name": ..., "quick": true}, GET /api/labs/run
    GET  /metrics               the whole cluster in Prometheus' text format
    GET  /nodes/{node}/metrics  one node's share of it (what a broker's exporter would show)

The live feed keeps per client only the newest snapshot and a bounded queue of timeline
entries; a client too slow to take them is told to reload them (`resync`) rather than letting
the queue grow. Buttons change the cluster, so a POST must be JSON (a page of another origin
cannot send that without a CORS preflight, which this app never grants) and carry no foreign
Origin, and every request must name this machine as its Host (no DNS rebinding).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import deque
from typing import Any, AsyncIterator

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from chaos.console.collector import Collector

STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")
CLIENT_EVENTS_MAX = 512  # timeline entries queued per page before it is told to resync
TIMELINE_ON_CONNECT = 400
KEEPALIVE_S = 15.0
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")
# A button's or a lab's request is a few short strings (the longest, a replica's name, is under
# 300 bytes). Any local process can POST here, and a body was read whole before any check: one
# of 64 MiB made the console hold 128 MiB. A body past this is refused (413) as it arrives.
REQUEST_BODY_BYTES_MAX = 16 * 1024
# A body that promised more than it sent held its handler (and its socket) open for ever: the
# page sends its few bytes at once, so one that takes longer than this is refused (408).
REQUEST_BODY_READ_TIMEOUT_S = 10.0
NODE_DIGITS_MAX = 9  # node numbers are small ints; a longer path is no node of any cluster


class RequestRefused(Exception):
    """A request the console will not read further: answered with `status` and the sentence."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error

    def response(self) -> Response:
        return JSONResponse({"error": self.error}, status_code=self.status)


async def read_json_body(request: Request) -> Any:
    """The request's JSON body, read only while it stays within `REQUEST_BODY_BYTES_MAX`."""
    too_large = RequestRefused(413, f"a request body holds at most {REQUEST_BODY_BYTES_MAX} bytes")
    declared = request.headers.get("content-length", "")
    if declared and (not declared.isdigit() or len(declared) > 12 or int(declared) > REQUEST_BODY_BYTES_MAX):
        raise too_large
    chunks: list[bytes] = []

    async def read() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > REQUEST_BODY_BYTES_MAX:
                raise too_large
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), REQUEST_BODY_READ_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise RequestRefused(
            408, f"the body did not arrive within {REQUEST_BODY_READ_TIMEOUT_S:g} seconds"
        ) from None
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as error:
        # ValueError: not JSON, not UTF-8, a number past Python's 4,300 digits; RecursionError:
        # nested deeper than ~1,000 (json recurses). Each was a traceback and a 500 before.
        raise RequestRefused(400, f"the body is not JSON the console reads: {type(error).__name__}") from None


class Feed:
    """One page's share of the live feed."""

    def __init__(self) -> None:
        self.snapshot: bytes | None = None
        self.events: deque[bytes] = deque()
        self.resync = False
        self.ready = asyncio.Event()


class Broadcaster:
    """Hands what the collector publishes (from its threads) to every page's feed (on the loop)."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.loop: asyncio.AbstractEventLoop | None = None
        self.feeds: set[Feed] = set()
        self.closing = False
        self._lock = threading.Lock()
        collector.subscribe(self.publish)

    def publish(self, kind: str, payload: Any) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        data = payload if kind == "snapshot" else msgspec.json.encode(payload)
        try:
            loop.call_soon_threadsafe(self._fan_out, kind, data)
        except RuntimeError:
            pass  # the loop closed between the check and the call: the server is stopping

    def _fan_out(self, kind: str, data: bytes) -> None:
        for feed in self.feeds:
            if kind == "snapshot":
                feed.snapshot = data
            elif len(feed.events) >= CLIENT_EVENTS_MAX:
                feed.events.clear()
                feed.resync = True
            else:
                feed.events.append(data)
            feed.ready.set()

    def close(self) -> None:
        self.closing = True
        self.collector.unsubscribe(self.publish)
        if self.loop is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self._wake_all)
            except RuntimeError:
                pass

    def _wake_all(self) -> None:
        for feed in self.feeds:
            feed.ready.set()


def _sse(kind: str, data: bytes) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def _host_is_local(request: Request) -> bool:
    host = request.headers.get("host", "")
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    return name in LOCAL_HOSTS


def _origin_is_ours(request: Request) -> bool:
    origin = request.headers.get("origin")
    return origin is None or origin.split("://", 1)[-1] == request.headers.get("host", "")


class ConsoleApp:
    def __init__(
        self, collector: Collector, *, explainer: Any = None, labs: Any = None, metrics: Any = None
    ) -> None:
        self.collector = collector
        self.broadcaster = Broadcaster(collector)
        self.explainer = explainer
        self.labs = labs
        self.metrics = metrics
        routes = [
            Route("/", self.index),
            Route("/api/snapshot", self.snapshot),
            Route("/api/timeline", self.timeline),
            Route("/api/events", self.events),
            Route("/api/faults", self.fault, methods=["POST"]),
            Route("/api/explain", self.explain),
            Route("/api/labs", self.labs_list),
            Route("/api/labs", self.labs_start, methods=["POST"]),
            Route("/api/labs/run", self.labs_run),
            Route("/metrics", self.cluster_metrics),
            # A str, parsed by node_metrics: starlette's int convertor ran int() while routing, so
            # a node of 5,000 digits raised ValueError (Python's 4,300-digit limit): a 500.
            Route("/nodes/{node}/metrics", self.node_metrics),
            Route("/healthz", self.health),
            Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
        ]
        self.app = Starlette(routes=routes)
        self.app.add_middleware(_LocalOnly)

    async def index(self, request: Request) -> Response:
        return FileResponse(os.path.join(STATIC_DIR, "index.html"), headers={"Cache-Control": "no-store"})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"ok": True, "reachable": self.collector.snapshot.reachable})

    async def snapshot(self, request: Request) -> Response:
        return Response(self.collector.snapshot_json, media_type="application/json")

    async def timeline(self, request: Request) -> Response:
        try:
            after = int(request.query_params.get("after", "0"))
        except ValueError:
            return JSONResponse({"error": "after must be an integer"}, status_code=400)
        return Response(msgspec.json.encode(self.collector.timeline(after)), media_type="application/json")

    async def events(self, request: Request) -> Response:
        broadcaster = self.broadcaster
        broadcaster.loop = asyncio.get_running_loop()
        feed = Feed()
        broadcaster.feeds.add(feed)
        return StreamingResponse(
            self._stream(feed),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def _stream(self, feed: Feed) -> AsyncIterator[bytes]:
        broadcaster = self.broadcaster
        try:
            yield _sse("timeline", msgspec.json.encode(self.collector.timeline(limit=TIMELINE_ON_CONNECT)))
            yield _sse("snapshot", self.collector.snapshot_json)
            while not broadcaster.closing:
                try:
                    await asyncio.wait_for(feed.ready.wait(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                feed.ready.clear()
                if feed.resync:
                    feed.resync = False
                    yield _sse(
                        "timeline", msgspec.json.encode(self.collector.timeline(limit=TIMELINE_ON_CONNECT))
                    )
                while feed.events:
                    yield _sse("events", feed.events.popleft())
                if feed.snapshot is not None:
                    data, feed.snapshot = feed.snapshot, None
                    yield _sse("snapshot", data)
        finally:
            broadcaster.feeds.discard(feed)

    async def fault(self, request: Request) -> Response:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"error": "send the action as application/json"}, status_code=415)
        try:
            body = await read_json_body(request)
            action, kind, name = str(body["action"]), str(body["kind"]), str(body.get("name", ""))
        except RequestRefused as refused:
            return refused.response()
        except (json.JSONDecodeError, KeyError, TypeError):
            return JSONResponse(
                {"error": 'expected {"action": ..., "kind": ..., "name": ...}'}, status_code=400
            )
        from starlette.concurrency import run_in_threadpool

        outcome = await run_in_threadpool(self.collector.perform_fault, action, kind, name)
        return JSONResponse(outcome._asdict(), status_code=200 if outcome.ok else 409)

    async def explain(self, request: Request) -> Response:
        if self.explainer is None:
            return JSONResponse({"error": "explain is not available"}, status_code=404)
        try:
            topic = request.query_params["topic"]
            partition, offset = int(request.query_params["partition"]), int(request.query_params["offset"])
        except (KeyError, ValueError):
            return JSONResponse({"error": "give topic, partition and offset (integers)"}, status_code=400)
        from starlette.concurrency import run_in_threadpool

        story = await run_in_threadpool(self.explainer.explain, topic, partition, offset)
        return Response(msgspec.json.encode(story), media_type="application/json")

    async def labs_list(self, request: Request) -> Response:
        if self.labs is None:
            return JSONResponse(
                {
                    "available": False,
                    "why": "labs run only on a cluster the console started " "(railmq up --console)",
                    "labs": [],
                }
            )
        return JSONResponse({"available": True, "labs": self.labs.catalog()})

    async def labs_start(self, request: Request) -> Response:
        if self.labs is None:
            return JSONResponse({"error": "labs run only on a cluster the console started"}, status_code=409)
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"error": "send the lab as application/json"}, status_code=415)
        try:
            body = await read_json_body(request)
            started = self.labs.start(str(body["name"]), quick=bool(body.get("quick", True)))
        except RequestRefused as refused:
            return refused.response()
        except (json.JSONDecodeError, KeyError, TypeError):
            return JSONResponse({"error": 'expected {"name": ..., "quick": true}'}, status_code=400)
        except ValueError as refused:
            return JSONResponse({"error": str(refused)}, status_code=409)
        return JSONResponse(started)

    async def labs_run(self, request: Request) -> Response:
        if self.labs is None:
            return JSONResponse({"running": False})
        return JSONResponse(self.labs.status())

    async def cluster_metrics(self, request: Request) -> Response:
        return self._metrics(None)

    async def node_metrics(self, request: Request) -> Response:
        node = request.path_params["node"]
        if not node.isascii() or not node.isdigit() or len(node) > NODE_DIGITS_MAX:
            return JSONResponse({"error": "a node is a number of at most 9 digits"}, status_code=404)
        return self._metrics(int(node))

    def _metrics(self, node: int | None) -> Response:
        if self.metrics is None:
            return Response(
                "metrics need the prometheus_client package (pip install 'railmq[console]')\n",
                status_code=501,
                media_type="text/plain",
            )
        body, content_type = self.metrics.exposition(node)
        return Response(body, media_type=content_type)


class _LocalOnly:
    """Refuse a request whose Host is not this machine, and a POST from another origin."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            request = Request(scope)
            if not _host_is_local(request):
                await JSONResponse(
                    {"error": "the console answers only requests for 127.0.0.1 or localhost"}, status_code=421
                )(scope, receive, send)
                return
            if request.method == "POST" and not _origin_is_ours(request):
                await JSONResponse({"error": "requests from another origin are refused"}, status_code=403)(
                    scope, receive, send
                )
                return
        await self.app(scope, receive, send)
