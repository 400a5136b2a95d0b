"""`railmq up` and `railmq demo` as a user runs them: real processes, stopped by a signal or on
their own, leaving no process, no listening port and no temporary directory behind."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest

from actors.errors import RailmqError
from railmq.admin import Admin
from tests.cli.conftest import descendants, free_port, port_listening
from tests.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def cluster_answers(bootstrap: str) -> bool:
    try:
        with Admin(bootstrap, timeout_ms=300) as admin:
            admin.metadata()
        return True
    except RailmqError:
        return False


def test_up_serves_clients_and_sigint_stops_it_with_no_process_or_port_left(railmq, background, tmp_path):
    port = free_port()
    bootstrap = f"tcp://127.0.0.1:{port}"
    data_dir = tmp_path / "data"
    up = background("up", "--nodes", 2, "--port", port, "--data-dir", data_dir)
    wait_for(lambda: cluster_answers(bootstrap), 30, "railmq up to answer on its port")

    created = railmq("topics", "create", "events", "--partitions", 2, "--replication-factor", 2,
                     "--bootstrap", bootstrap)
    assert created.returncode == 0, created.stderr
    produced = railmq("produce", "events", "hello", "world", "--key", "k",
                      env={"RAILMQ_BOOTSTRAP": bootstrap})
    assert produced.returncode == 0, produced.stderr
    consumed = railmq("consume", "events", "--from-beginning", "--max-messages", 2, "--json",
                      "--bootstrap", bootstrap)
    assert [json.loads(line)["value"] for line in consumed.stdout.splitlines()] == ["hello", "world"]

    processes = descendants(up.pid)
    assert len([p for p in processes if p.name() not in ("python", "python3")]) >= 4, processes
    up.send_signal(signal.SIGINT)
    assert up.wait(timeout=30) == 0
    output = up.stdout.read()
    assert "railmq is up" in output and bootstrap in output and "stopped" in output
    assert "railmq produce" in output, "a hint how to use the cluster"
    gone, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, f"processes left behind: {alive}"
    assert not port_listening(port)
    assert (data_dir / "node-1" / "controller" / "raft").is_dir(), "the metadata stays for the next `railmq up`"


def test_up_refuses_a_port_in_use_with_a_one_line_error(railmq, background, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        finished = railmq("up", "--port", port, "--data-dir", tmp_path / "data", timeout=30)
    assert finished.returncode == 1
    assert finished.stderr.startswith("error: ") and f"port {port}" in finished.stderr
    assert "Traceback" not in finished.stderr


def test_demo_shows_keys_in_order_and_cleans_up(railmq, tmp_path):
    finished = railmq("demo", env={"TMPDIR": str(tmp_path)}, script=True, timeout=60)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    output = finished.stdout
    for key in ("alice", "bob", "carol", "dave", "erin"):
        assert key in output
    assert output.count("held") == 5 and "BROKEN" not in output
    assert "coordinator" in output and "replica/orders/0/n1" in output
    leftovers = [entry for entry in os.listdir(tmp_path) if entry.startswith("railmq-")]
    assert leftovers == [], "the temporary data directory is removed"


def test_up_refuses_a_lost_group_state_until_told_to_reset_it(railmq, background, tmp_path):
    port = free_port()
    bootstrap = f"tcp://127.0.0.1:{port}"
    data_dir = tmp_path / "data"
    first = ("up", "--nodes", 1, "--controllers", 0, "--port", port, "--data-dir", data_dir)
    up = background(*first)
    wait_for(lambda: cluster_answers(bootstrap), 30, "railmq up to answer on its port")
    assert railmq("topics", "create", "events", "--bootstrap", bootstrap).returncode == 0
    up.send_signal(signal.SIGINT)
    assert up.wait(timeout=30) == 0
    (data_dir / "group-coordinator" / "groups.state").unlink()

    refused = railmq(*first, timeout=60)

    assert refused.returncode == 1
    error = refused.stderr.strip().splitlines()[-1]  # after the actor's own log line saying the same
    assert error.startswith("error: CLUSTER_START_REFUSED: group-coordinator") and "--reset-group-state" in error
    assert "Traceback" not in refused.stderr
    accepted = background(*first, "--reset-group-state")
    wait_for(lambda: cluster_answers(bootstrap), 30, "railmq up --reset-group-state to answer")
    accepted.send_signal(signal.SIGINT)
    assert accepted.wait(timeout=30) == 0
    assert (data_dir / "group-coordinator" / "groups.state").exists()
