"""The console against a hostile local client and a hostile trace: whatever a request carries or a
trace file holds, the console answers with a typed error (a status and a JSON `error`), never a
traceback or a hang, and what it keeps stays bounded in bytes.

In-process: the starlette app is called as ASGI with a `receive` that makes its body on demand
(so a test can send gigabytes without holding them), and the console's parts are called directly.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from typing import Any, AsyncIterator, Iterable

import pytest

from chaos.console.counters import EventCounters
from chaos.console.faults import FaultOutcome
from chaos.console.snapshot import Snapshot

pytest.importorskip("starlette")

MIB = 1024 * 1024


class _AppCollector:
    """What ConsoleApp reads of a collector, and a record of the faults it was asked for."""

    def __init__(self) -> None:
        self.snapshot = Snapshot(time_ns=1)
        self.snapshot_json = b"{}"
        self.counters = EventCounters()
        self.performed: list[tuple[str, str, str]] = []

    def subscribe(self, subscriber: Any) -> None:
        pass

    def unsubscribe(self, subscriber: Any) -> None:
        pass

    def timeline(self, after: int = 0, limit: int = 0) -> list:
        return []

    def perform_fault(self, action: str, kind: str, name: str = "") -> FaultOutcome:
        self.performed.append((action, kind, name))
        return FaultOutcome(action, name, False, "refused")


class _Labs:
    def __init__(self) -> None:
        self.started: list[tuple[str, bool]] = []

    def start(self, name: str, *, quick: bool = True) -> dict[str, Any]:
        if name != "hot-key":
            raise ValueError(f"no lab {name!r}")  # as LabRunner refuses an unknown lab
        self.started.append((name, quick))
        return {"started": name}


def _console_app(collector: Any = None, labs: Any = None) -> Any:
    from chaos.console.app import ConsoleApp

    return ConsoleApp(collector or _AppCollector(), labs=labs or _Labs()).app


async def _call(
    app: Any,
    method: str,
    path: str,
    chunks: Iterable[bytes] | AsyncIterator[bytes] = (),
    headers: dict[str, str] | None = None,
    query: str = "",
) -> tuple[int, bytes]:
    """One request through the ASGI app: (status, body). `chunks` are sent as the body."""
    sent: dict[str, Any] = {"status": 0, "body": b""}
    head = {"host": "127.0.0.1:7480", "content-type": "application/json", **(headers or {})}
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(name.encode(), value.encode()) for name, value in head.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 7480),
    }

    async def body() -> AsyncIterator[bytes]:
        if hasattr(chunks, "__aiter__"):
            async for chunk in chunks:  # type: ignore[union-attr]
                yield chunk
        else:
            for chunk in chunks:  # type: ignore[union-attr]
                yield chunk

    parts = body()

    async def receive() -> dict[str, Any]:
        try:
            chunk = await parts.__anext__()
        except StopAsyncIteration:
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            sent["status"] = message["status"]
        elif message["type"] == "http.response.body":
            sent["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return sent["status"], sent["body"]


def _json_error(status_body: tuple[int, bytes]) -> tuple[int, str]:
    status, body = status_body
    return status, json.loads(body)["error"]


# --------------------------------------------------------------------------- request bodies


def _spaces(total_bytes: int, chunk_bytes: int = MIB) -> Iterable[bytes]:
    """A JSON body of `total_bytes` (a long run of whitespace: valid JSON until the end)."""
    chunk = b" " * chunk_bytes
    for _ in range(total_bytes // chunk_bytes):
        yield chunk


@pytest.mark.parametrize("path", ["/api/faults", "/api/labs"])
def test_a_huge_request_body_is_refused_before_it_is_held(path):
    """Before: a button's POST was read whole (`request.json()`) before any check, so a body of
    64 MiB made the console hold ~128 MiB (the chunks and their join); a gigabyte, gigabytes."""
    collector, labs = _AppCollector(), _Labs()
    app = _console_app(collector, labs)
    tracemalloc.start()
    try:
        result = asyncio.run(_call(app, "POST", path, _spaces(64 * MIB)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MIB, f"the console held {peak / MIB:.0f} MiB for one request"
    status, error = _json_error(result)
    assert status == 413 and "bytes" in error
    assert collector.performed == [] and labs.started == []


def test_a_body_declared_larger_than_the_bound_is_refused_without_reading_it():
    read = []

    async def never_sent() -> AsyncIterator[bytes]:
        read.append(True)
        yield b"{}"

    status, error = _json_error(
        asyncio.run(
            _call(_console_app(), "POST", "/api/faults", never_sent(), {"content-length": str(10**12)})
        )
    )
    assert status == 413 and read == []


MALFORMED_BODIES = {
    "nested 5,000 deep": b"[" * 5_000 + b"]" * 5_000,
    "not UTF-8": b"\xff\xfe\xff",
    "a 5,000-digit number": b'{"action": ' + b"1" * 5_000 + b"}",
    "not an object": b'"kill"',
    "null": b"null",
    "a list": b'["kill", "replica"]',
    "fields of the wrong type": b'{"action": ["kill"], "kind": {"a": 1}, "name": 3, "quick": [1]}',
}


@pytest.mark.parametrize("path", ["/api/faults", "/api/labs"])
@pytest.mark.parametrize("body", MALFORMED_BODIES.values(), ids=MALFORMED_BODIES.keys())
def test_a_malformed_body_gets_a_typed_error_never_a_traceback(path, body):
    """Before: JSON nested 5,000 deep raised RecursionError and a 5,000-digit number or bytes that
    are not UTF-8 raised ValueError out of the handler (a 500 and a traceback in the console)."""
    collector = _AppCollector()
    status, body_out = asyncio.run(_call(_console_app(collector), "POST", path, [body]))
    answer = json.loads(body_out)
    assert status in (400, 409), (status, answer)
    assert isinstance(answer.get("error") or answer.get("sentence"), str), answer
    # A field of another type is taken as its text: the action is then refused by name.
    assert all(isinstance(value, str) for call in collector.performed for value in call)


def test_a_body_that_never_finishes_is_given_up_on(monkeypatch):
    """Before: a POST whose Content-Length promised more than it sent held its request open for
    ever (the handler awaited the rest of the body with no deadline): 5 s here, then the test's
    guard; a thousand such connections held a thousand handlers and their sockets."""
    from chaos.console import app as console_app

    monkeypatch.setattr(console_app, "REQUEST_BODY_READ_TIMEOUT_S", 0.2, raising=False)

    async def stalls() -> AsyncIterator[bytes]:
        yield b'{"action": '
        await asyncio.Event().wait()  # the rest never comes

    async def guarded() -> tuple[int, bytes]:
        headers = {"content-length": "100"}
        return await asyncio.wait_for(_call(_console_app(), "POST", "/api/faults", stalls(), headers), 5)

    status, error = _json_error(asyncio.run(guarded()))
    assert status == 408 and "seconds" in error


# --------------------------------------------------------------------------- fault presses


@pytest.fixture
def collector():
    from chaos.console.collector import Collector
    from chaos.console.faults import FaultController

    made = Collector("tcp://127.0.0.1:1")  # never started: no thread, no request sent
    made.faults = FaultController("tcp://127.0.0.1:1", lambda: [], secret=b"", cluster=None)
    yield made
    made.stop()


def test_presses_of_invented_actions_add_no_metric_series(collector):
    """Before: every action string a POST named became a label of railmq_console_faults, kept for
    ever: 10,000 presses of invented 100-character actions made 10,000 series (1.4 MB a scrape)."""
    pytest.importorskip("prometheus_client")
    from chaos.console.faults import ACTIONS
    from chaos.console.metrics import ClusterMetrics

    for number in range(10_000):
        collector.perform_fault(f"{number:0100d}", "replica", "replica/t/0/n1")
    collector.perform_fault("kill", "replica", "replica/t/0/n1")  # a real action, refused: no such actor
    assert set(collector.counters.faults) <= set(ACTIONS), len(collector.counters.faults)
    exposition = ClusterMetrics(collector).exposition()[0]
    assert exposition.count(b"railmq_console_faults_total{") <= len(ACTIONS)


def test_timeline_entries_are_bounded_in_bytes_whatever_a_press_or_a_trace_line_names(collector):
    """Before: a press's action and name went into its timeline entry whole (the action twice, in
    the refusal's sentence too): 2,000 presses naming 16 KiB (the body bound) each kept 64 MB of
    timeline, sent to every page; a trace line's reason of 1 MiB made a 1 MiB entry."""
    import msgspec

    from chaos.console.collector import TIMELINE_MAX
    from chaos.console.events import to_entry

    entry_bytes_budget = 4 * 1024  # a sentence an operator reads at a glance, with its fields
    for number in range(TIMELINE_MAX):
        collector.perform_fault(f"{number % 10}" * 8_000, "replica", "n" * 8_000)
    timeline_bytes = len(msgspec.json.encode(collector.timeline()))
    assert timeline_bytes <= TIMELINE_MAX * entry_bytes_budget, f"{timeline_bytes / MIB:.0f} MiB"
    entry = to_entry({"time_ns": 1, "event": "rebalance-started", "group": "g" * MIB, "reason": "r" * MIB})
    assert len(msgspec.json.encode(entry)) <= entry_bytes_budget


# --------------------------------------------------------------------------- trace lines


WRONG_TYPES = [
    {"time_ns": 1, "event": "isr-changed", "topic": "t", "partition": 0, "isr": 5, "previous_isr": [1]},
    {"time_ns": 2, "event": "share-dead-lettered", "topic": "t.dlq", "partition": 0, "records": 7},
    {"time_ns": 3, "event": "generation-started", "group": "g", "members": 3},
    {"time_ns": 4, "event": "unclean-election", "topic": "t", "partition": 0, "isr_before": 1},
    {"time_ns": 5, "event": ["leader-elected"], "topic": {"t": 1}, "partition": "0"},
    {"time_ns": 6, "event": "share-dead-lettered", "topic": "t.dlq", "records": [[1, 2, 3, 4, {"a": []}]]},
]


def test_trace_lines_of_the_wrong_types_are_skipped_not_fatal(collector):
    """Before: a trace line that parsed but held a number where a list belongs (`"isr": 5`) raised
    TypeError in the collector's fast thread, which has no other guard: the thread ended, and the
    timeline and the topology stopped for good while the page kept showing the last snapshot."""
    good = {"time_ns": 9, "event": "topic-created", "topic": "t", "partitions": 1, "replication_factor": 1}
    for event in WRONG_TYPES:
        collector._consume_events([event, good])
    texts = [entry.text for entry in collector.timeline()]
    assert texts.count("topic t created: 1 partition(s), replication factor 1") == len(WRONG_TYPES)


def test_the_explain_view_reads_past_trace_lines_of_the_wrong_types(tmp_path):
    """Before: a truncation or a retention line whose offsets were not numbers raised out of
    `explain` (int("x")): the explain view answered 500 for every offset of that partition."""
    from chaos.console.batches import RecordFacts
    from chaos.console.explain import Explainer, Story

    story = Story(topic="t", partition=0, offset=5, record=RecordFacts(offset=5, timestamp_ms=0))
    events = [
        {"time_ns": 1, "event": "follower-truncated", "topic": "t", "partition": 0, "to": "x", "from": [9]},
        {"time_ns": 2, "event": "retention", "topic": "t", "partition": 0, "log_start_offset": {"a": 1}},
        {"time_ns": 3, "event": "retention", "topic": "t", "partition": 0, "log_start_offset": 9},
    ]
    Explainer(None)._afterwards(story, None, events)
    assert [step.what.startswith("then retention deleted it") for step in story.steps] == [True]


def _line(time_ns: int, event: str, **details: Any) -> bytes:
    line = {"time_ns": time_ns, "actor": "coordinator", "event": event, **details}
    return (json.dumps(line) + "\n").encode()


def test_a_trace_line_of_tens_of_megabytes_is_skipped_not_held(tmp_path):
    """Before: a line without its newline was kept whole, each poll adding 8 MiB to it (and copying
    it again): 40 MiB of line made the follower hold 40 MiB, a gigabyte a gigabyte; the explain
    view's scan and the coverage read such a line whole too."""
    from chaos.console.traces import TraceTail, coverage, scan

    path = tmp_path / "trace.jsonl"
    path.write_bytes(_line(1, "topic-created", topic="t"))
    tail = TraceTail(str(path), from_start=True)
    assert [event["time_ns"] for event in tail.poll()] == [1]
    with open(path, "ab") as handle:
        for _ in range(40):
            handle.write(b"x" * MIB)
    tracemalloc.start()
    try:
        for _ in range(6):
            tail.poll()
        held = len(tail._partial or b"")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held <= 8 * MIB and peak < 24 * MIB, f"held {held / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB"
    with open(path, "ab") as handle:
        handle.write(b"\n" + _line(2, "topic-deleted", topic="t"))
    assert [event["time_ns"] for event in tail.poll()] == [2]
    assert tail.torn_lines == 1

    tracemalloc.start()
    try:
        found = [event["time_ns"] for event in scan(str(path), lambda event: True)]
        earliest = coverage(str(path)).earliest_ns
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (found, earliest) == ([1, 2], 1)
    assert peak < 24 * MIB, f"scan peak {peak / MIB:.0f} MiB"


# --------------------------------------------------------------------------- what the cluster holds


def _cluster_metadata(topics: list[str], log_end: int) -> Any:
    """One partition per topic on node 1; a topic named "kept" stays at log end 5."""
    from actors.messages import MetadataResponse, PartitionMetadata, ReplicaInfo, TopicMetadata

    def partition(end: int) -> PartitionMetadata:
        info = ReplicaInfo(node=1, endpoint="tcp://127.0.0.1:9001", pid=0, alive=True,
                           log_end_offset=end, high_watermark=end)
        return PartitionMetadata(partition=0, leader=1, leader_endpoint="tcp://127.0.0.1:9001",
                                 leader_epoch=1, replicas=[1], isr=[1], replica_info=[info])

    return MetadataResponse(correlation_id=0, nodes=[1], topics=[
        TopicMetadata(name=name, partitions=[partition(5 if name == "kept" else log_end)])
        for name in topics])


class _MetadataAdmin:
    def __init__(self) -> None:
        self.answer: Any = None

    def metadata(self) -> Any:
        return self.answer

    def runtime_stats(self, endpoint: str) -> Any:
        raise TimeoutError("no actor here")

    def close(self) -> None:
        pass


def test_a_deleted_topic_leaves_nothing_behind_in_the_console(collector):
    """Before: `Journal.forget` was never called, and the leader offsets, sizes and counters for
    /metrics were keyed by every partition ever seen: 2,000 topics (200-character names) created,
    written and deleted one after another left 2,000 journals, offsets and counter series for
    ever (4.4 MiB here; each journal holds up to 4,096 samples, so a busy one ~1 MB)."""
    pytest.importorskip("prometheus_client")
    from chaos.console.metrics import ClusterMetrics

    admin = collector._admin = _MetadataAdmin()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for number in range(2_000):
            name = f"{number:0200d}"
            for log_end in (1, 5):
                admin.answer = _cluster_metadata(["kept", name], log_end)
                collector._refresh_metadata()
            collector._consume_events([{"time_ns": number, "event": "leader-elected", "topic": name,
                                        "partition": 0, "leader": 1}])
            collector._last_leader_size[(name, 0)] = (1, 100)
            admin.answer = _cluster_metadata(["kept"], 5)  # the topic is deleted
            collector._refresh_metadata()
        collector._timeline.clear()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert set(collector.journal._partitions) == {("kept", 0)}
    assert set(collector._last_leader_end) == {("kept", 0)}
    assert set(collector._last_leader_size) <= {("kept", 0)}
    for table in (collector.counters.messages_in, collector.counters.elections):
        assert set(table) <= {("kept", 0)}
    collector.snapshot = collector.build_snapshot()
    assert b"0000000" not in ClusterMetrics(collector).exposition()[0]
    assert after - before < 256 * 1024, f"{(after - before) / MIB:.1f} MiB kept"


def test_a_deleted_group_leaves_nothing_behind_in_the_console(collector):
    """Groups made and deleted under ever-new names (anyone may commit for a new group id) kept
    their commit journals and their rebalance counts (a /metrics series each) for good."""
    from actors.messages import DescribeGroupResponse, OffsetEntry
    from chaos.console.poller import SlowFacts

    def described(group: str) -> DescribeGroupResponse:
        return DescribeGroupResponse(correlation_id=0, group_id=group, state="Empty",
                                     offsets=[OffsetEntry(topic="t", partition=0, offset=7)])

    def round_listing(time_ns: int, groups: list[str]) -> SlowFacts:
        facts = SlowFacts()
        facts.time_ns, facts.group_ids = time_ns, set(groups)
        facts.descriptions = [described(group) for group in groups]
        return facts

    for number in range(500):
        name = f"group-{number:0200d}"
        collector._consume_events([{"time_ns": number, "event": "rebalance-started", "group": name}])
        collector._observe_slow(round_listing(number, ["kept", name]))
        collector._observe_slow(round_listing(number + 1, ["kept"]))  # the group is deleted

    assert {group for group, _, _ in collector.journal._commits} == {"kept"}
    assert set(collector.counters.rebalances) <= {"kept"}


# --------------------------------------------------------------------------- paths and queries


@pytest.mark.parametrize("node", ["9" * 5_000, "abc", "-1", "1" * 40])
def test_a_node_page_of_a_number_too_long_or_no_number_is_a_typed_error(node):
    """Before: /nodes/{node:int}/metrics converted the path with int() while routing, so a node of
    5,000 digits (a 5 KB URL) raised ValueError (Python's 4,300-digit limit): a 500 and a traceback."""
    status, error = _json_error(asyncio.run(_call(_console_app(), "GET", f"/nodes/{node}/metrics")))
    assert status == 404 and "node" in error


@pytest.mark.timeout(20)
def test_a_trace_file_that_is_a_pipe_or_a_device_is_not_read(tmp_path):
    """A FIFO named trace.jsonl held the console's open for ever (at start, or in an explain
    thread), and /dev/zero in its place was scanned without end: only a regular file is read."""
    import os

    from chaos.console.traces import TraceTail, coverage, scan

    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    assert TraceTail(str(fifo), from_start=True).poll() == []
    assert list(scan(str(fifo), lambda event: True)) == []
    assert coverage(str(fifo)).earliest_ns is None
    device = tmp_path / "device" / "trace.jsonl"
    device.parent.mkdir()
    device.symlink_to("/dev/zero")
    assert list(scan(str(device), lambda event: True)) == []
    assert TraceTail(str(device)).poll() == []
