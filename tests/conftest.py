"""Shared fixtures. Integration fixtures start real processes and always clean up after them:
every actor process, the data directory, and any railmq shared-memory segment."""

from __future__ import annotations

import os
import time
import uuid

import psutil
import pytest

from hypothesis import HealthCheck, settings

from actors.limits import Limits

# Property tests judge correctness, never speed: a loaded 2-core CI machine must not turn a slow
# example into a failure.
settings.register_profile("railmq", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("railmq")

# Timeouts short enough for fast tests, long enough for a loaded 2-core CI machine.
TEST_LIMITS = Limits(replica_session_timeout_ms=1500, replica_lag_time_max_ms=2000,
                     coordinator_election_grace_ms=500, group_initial_rebalance_delay_ms=50,
                     scrub_pass_interval_ms=1000, replica_keepalive_interval_ms=500,
                     replica_keepalive_timeout_ms=1500, node_heartbeat_interval_ms=250,
                     node_session_timeout_ms=1500)


def _is_multiprocessing_helper(process: psutil.Process) -> bool:
    """multiprocessing's forkserver and resource tracker live as long as the test process."""
    command = " ".join(process.cmdline())
    return "forkserver" in command or "resource_tracker" in command


def railmq_children(wait_s: float = 3.0) -> list[psutil.Process]:
    """Live actor processes of this test process (the multiprocessing forkserver excepted;
    zombies count as gone: the forkserver, their parent, reaps them)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for child in psutil.Process().children(recursive=True):
            try:
                if child.status() == psutil.STATUS_ZOMBIE or _is_multiprocessing_helper(child):
                    continue
                found.append(child)
            except psutil.NoSuchProcess:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def railmq_segments() -> list[str]:
    try:
        return sorted(name for name in os.listdir("/dev/shm") if name.startswith("railmq"))
    except FileNotFoundError:
        return []


@pytest.fixture
def unique_name():
    def make(prefix: str = "t") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"
    return make


def _start_cluster(tmp_path_factory, nodes: int = 3, **options):
    from railmq.cluster import LocalCluster

    data_dir = options.pop("data_dir", None) or str(tmp_path_factory.mktemp("cluster"))
    cluster = LocalCluster(nodes=nodes, data_dir=data_dir, limits=options.pop("limits", TEST_LIMITS),
                           restart_delay_ms=options.pop("restart_delay_ms", 200),
                           fault_injection=options.pop("fault_injection", True), **options)
    cluster.start()
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A 3-node cluster shared by the tests of one module (tests use unique topic names)."""
    cluster = _start_cluster(tmp_path_factory)
    try:
        yield cluster
    finally:
        cluster.stop()
        assert not railmq_children(), f"actor processes left behind: {railmq_children()}"


@pytest.fixture
def fresh_cluster(tmp_path_factory):
    """A cluster of its own, for tests that kill, pause or restart things."""
    clusters = []

    def start(nodes: int = 3, **options):
        started = _start_cluster(tmp_path_factory, nodes, **options)
        clusters.append(started)
        return started

    try:
        yield start
    finally:
        for started in clusters:
            started.stop()
        leftovers = railmq_children()
        for process in leftovers:
            process.kill()
        assert not leftovers, f"actor processes left behind: {leftovers}"


@pytest.fixture
def admin(cluster):
    from railmq.admin import Admin

    with Admin(cluster.bootstrap) as client:
        yield client
