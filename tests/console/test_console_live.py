"""The console on a live cluster, over HTTP: /metrics names and values that move under load, the
fault buttons (pause and resume by pid, isolate and heal with the cluster secret), explain, the
request checks, and the `railmq console` and `railmq top` commands.

The console here joins a running cluster the way `railmq console --bootstrap B --data-dir D`
does (pids from metadata, the secret from the data directory); the browser tests use the
in-process way of `railmq up --console`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.helpers import wait_for

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

pytestmark = pytest.mark.integration
TOPIC = "console-live"


def _get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _metric(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    pattern = re.escape(name) + (r"\{" + re.escape(wanted) + r"\}" if labels else "") + r" ([0-9.e+-]+)$"
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else None


@pytest.fixture(scope="module")
def console(cluster):
    from chaos.console.server import Console
    from railmq.admin import Admin

    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=2, replication_factor=3, config={"min_insync_replicas": 2})
        admin.wait_for_leaders(TOPIC, full_isr=True)
    started = Console(cluster.bootstrap, http_port=0, data_dir=cluster.data_dir, refresh_ms=300).start()
    try:
        yield started
    finally:
        assert started.stop() == [], "the console left a fault behind"


def _produce(bootstrap: str, count: int, group_commit: bool = False) -> None:
    from railmq.consumer import Consumer
    from railmq.producer import Producer

    with Producer(bootstrap, acks="all", idempotent=True) as producer:
        for index in range(count):
            producer.send(TOPIC, f"value-{index}", key=f"key-{index % 5}")
        producer.flush(20)
    if group_commit:
        with Consumer(bootstrap, group_id="console-readers", auto_offset_reset="earliest") as consumer:
            consumer.subscribe([TOPIC])
            seen = 0
            for _ in range(100):
                seen += len(consumer.poll(200))
                if seen >= count // 2:
                    break
            consumer.commit()


def test_metrics_have_kafka_names_and_move_under_load(console, cluster):
    _produce(cluster.bootstrap, 50, group_commit=True)
    wait_for(lambda: console.collector.snapshot.groups, 20, "the group to appear in the console")
    status, body = _get(console.url + "/metrics")
    assert status == 200
    before = body.decode()
    for name in (
        "railmq_under_replicated_partitions",
        "railmq_offline_partitions_count",
        "railmq_isr_shrinks_total",
        "railmq_isr_expands_total",
        "railmq_leader_elections_total",
        "railmq_log_log_end_offset",
        "railmq_log_size_bytes",
        "railmq_consumergroup_lag",
        "railmq_dead_letter_depth",
        "railmq_actor_messages_in_total",
        "railmq_rejected_frames_total",
        "railmq_console_request_latency_seconds_bucket",
        "railmq_request_latency_seconds_bucket",
        "railmq_messages_in_total",
        "railmq_bytes_in_total",
    ):
        assert f"# TYPE {name.removesuffix('_total').removesuffix('_bucket')}" in before, name
    end_before = sum(
        _metric(before, "railmq_log_log_end_offset", topic=TOPIC, partition=str(p)) or 0 for p in (0, 1)
    )
    _produce(cluster.bootstrap, 200)

    def moved():
        text = _get(console.url + "/metrics")[1].decode()
        end = sum(
            _metric(text, "railmq_log_log_end_offset", topic=TOPIC, partition=str(p)) or 0 for p in (0, 1)
        )
        appended = sum(
            _metric(text, "railmq_messages_in_total", topic=TOPIC, partition=str(p)) or 0 for p in (0, 1)
        )
        return text if end >= end_before + 200 and appended >= 200 else None

    wait_for(moved, 20, "log end offsets and messages_in to grow by 200")

    def lagging():  # the group stopped reading: the new records are lag, once the leaders' high
        # watermarks reach the metadata (a leader's report travels with its node's next heartbeat)
        text = _get(console.url + "/metrics")[1].decode()
        lag = [_metric(text, "railmq_consumergroup_lag", group="console-readers", topic=TOPIC, partition=str(p))
               for p in (0, 1)]
        return text if sum(value or 0 for value in lag) >= 200 else None

    wait_for(lagging, 20, "the group's lag to count the 200 new records")

    def produces_timed():  # the leaders timed the produce requests they answered
        text = _get(console.url + "/metrics")[1].decode()
        counts = [_metric(text, "railmq_request_latency_seconds_count", process=f"node-{node}", request="Produce")
                  for node in (1, 2, 3)]
        return text if sum(count or 0 for count in counts) >= 2 else None

    timed = wait_for(produces_timed, 20, "the leaders' produce latency to be scraped")
    assert _metric(timed, "railmq_request_latency_seconds_bucket", le="+Inf", process="coordinator",
                   request="Metadata") is not None
    node_text = _get(console.url + "/nodes/1/metrics")[1].decode()
    assert "railmq_partition_count" in node_text and 'node="2"' not in node_text


def test_pause_and_resume_a_follower_by_pid(console, cluster):
    view = wait_for(
        lambda: next(
            (
                p
                for p in console.collector.snapshot.partitions
                if p.topic == TOPIC and p.partition == 0 and not p.offline
            ),
            None,
        ),
        20,
        "partition 0 with a leader",
    )
    follower = next(replica for replica in view.replicas if replica.role == "follower")
    status, outcome = _post(
        console.url + "/api/faults", {"action": "pause", "kind": "replica", "name": follower.actor}
    )
    assert status == 200 and outcome["ok"], outcome
    assert f"pid {follower.pid}" in outcome["sentence"]
    wait_for(
        lambda: follower.actor in console.collector.snapshot.paused, 10, "the snapshot to list the pause"
    )
    status, outcome = _post(
        console.url + "/api/faults", {"action": "resume", "kind": "replica", "name": follower.actor}
    )
    assert status == 200 and outcome["ok"], outcome
    assert follower.actor not in console.collector.faults.paused
    entries = [entry.text for entry in console.collector.timeline() if entry.category == "fault"]
    assert any(text.startswith(f"pause {follower.actor}") for text in entries)
    status, outcome = _post(
        console.url + "/api/faults", {"action": "resume", "kind": "replica", "name": follower.actor}
    )
    assert status == 409 and "has not paused" in outcome["sentence"]


def test_isolating_a_follower_shrinks_the_isr_and_healing_brings_it_back(console, cluster):
    view = next(p for p in console.collector.snapshot.partitions if p.topic == TOPIC and p.partition == 1)
    follower = next(replica for replica in view.replicas if replica.role == "follower")
    status, outcome = _post(
        console.url + "/api/faults", {"action": "isolate", "kind": "replica", "name": follower.actor}
    )
    assert status == 200 and outcome["ok"], outcome
    try:
        assert follower.actor in console.collector.snapshot.isolated or wait_for(
            lambda: follower.actor in console.collector.snapshot.isolated, 5, "the isolation in the snapshot"
        )
        wait_for(
            lambda: any(
                p.topic == TOPIC and p.partition == 1 and follower.node not in p.isr
                for p in console.collector.snapshot.partitions
            ),
            30,
            "the ISR to drop the isolated follower",
        )
    finally:
        status, outcome = _post(
            console.url + "/api/faults", {"action": "heal", "kind": "replica", "name": follower.actor}
        )
    assert status == 200 and outcome["ok"], outcome
    wait_for(
        lambda: any(
            p.topic == TOPIC and p.partition == 1 and follower.node in p.isr
            for p in console.collector.snapshot.partitions
        ),
        30,
        "the healed follower back in the ISR",
    )
    shrinks = [
        entry
        for entry in console.collector.timeline()
        if entry.event == "isr-changed" and "shrank" in entry.text
    ]
    assert shrinks, "the ISR shrink is on the timeline"


def test_explain_follows_a_produced_record_to_its_group(console, cluster):
    from railmq.producer import Producer

    with Producer(cluster.bootstrap, acks="all", idempotent=True) as producer:
        acknowledged = producer.send(TOPIC, "explain-me", key="explained", partition=0).result(20)
    wait_for(
        lambda: any(
            p.topic == TOPIC and p.partition == 0 and p.high_watermark > acknowledged.offset
            for p in console.collector.snapshot.partitions
        ),
        20,
        "the high watermark past the record",
    )
    status, body = _get(f"{console.url}/api/explain?topic={TOPIC}&partition=0&offset={acknowledged.offset}")
    story = json.loads(body)
    assert (
        status == 200 and story["record"]["value"] == "explain-me" and story["record"]["key"] == "explained"
    )
    assert story["batch"]["producer_id"] >= 0 and story["batch"]["base_offset"] <= acknowledged.offset
    steps = " | ".join(step["what"] for step in story["steps"])
    assert "created by producer" in steps and "appended by the leader n" in steps
    assert "the high watermark passed it" in steps and "now held by" in steps
    status, body = _get(f"{console.url}/api/explain?topic=nope&partition=0&offset=0")
    assert "not a partition" in json.loads(body)["error"]


def test_requests_for_another_host_or_from_another_origin_are_refused(console):
    assert _get(console.url + "/api/snapshot", {"Host": "evil.example:80"})[0] == 421
    status, _ = _post(
        console.url + "/api/faults",
        {"action": "kill", "kind": "coordinator"},
        {"Origin": "http://evil.example"},
    )
    assert status == 403
    request = urllib.request.Request(
        console.url + "/api/faults",
        data=b'{"action": "kill", "kind": "coordinator"}',
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 415
    assert console.collector.snapshot.reachable  # nothing was killed


def test_the_console_and_top_commands(cluster):
    command = [
        sys.executable,
        "-m",
        "railmq",
        "console",
        "--bootstrap",
        cluster.bootstrap,
        "--http-port",
        "0",
        "--data-dir",
        cluster.data_dir,
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
        assert match, f"no address in {line!r}: {process.stderr.read() if process.poll() is not None else ''}"
        snapshot = json.loads(_get(match.group(1) + "/api/snapshot")[1] or b"{}")
        wait_for(
            lambda: json.loads(_get(match.group(1) + "/api/snapshot")[1])["partitions"], 20, "partitions"
        )
        assert snapshot["bootstrap"] == cluster.bootstrap
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    top = subprocess.run(
        [
            sys.executable,
            "-m",
            "railmq",
            "top",
            "--bootstrap",
            cluster.bootstrap,
            "--iterations",
            "1",
            "--interval-ms",
            "1500",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert top.returncode == 0, top.stderr
    assert f"{TOPIC}/0" in top.stdout and "partitions" in top.stdout


def test_up_with_the_console_serves_its_cluster_and_stops_both(tmp_path):
    command = [sys.executable, "-m", "railmq", "up", "--console", "--http-port", "0", "--port", "0",
               "--nodes", "1", "--data-dir", str(tmp_path / "data")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "COLUMNS": "200"})
    try:
        url = None
        for _ in range(40):
            line = process.stdout.readline()
            match = re.search(r"console\s+(http://127\.0\.0\.1:\d+)/", line)
            if match:
                url = match.group(1)
                break
        assert url, "railmq up --console printed no console address"
        snapshot = json.loads(_get(url + "/api/snapshot")[1])
        assert snapshot["controls"]["isolate"] and snapshot["controls"]["labs"]  # fault switch on, in-process
        assert snapshot["nodes"] and snapshot["nodes"][0]["node"] == 1
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    wait_for(lambda: not _holding(str(tmp_path)), 10, "every actor of the stopped cluster to exit")


def _holding(directory: str) -> list[int]:
    """Pids of processes with a file open under `directory` (the actors keep their trace open)."""
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if any(opened.path.startswith(directory) for opened in process.open_files()):
                found.append(process.pid)
        except (psutil.Error, OSError):
            continue
    return found
