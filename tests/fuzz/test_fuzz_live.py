"""The fuzz tier's soak against a live cluster (-m slow): cases sent over real sockets to every
endpoint for a minute, then the cluster must be as it was — no actor restarted, every
acknowledged write served, and no log holding a batch a legitimate producer could not send."""

from __future__ import annotations

import os
import random
import time

import pytest
import zmq

from chaos.fuzz import Fuzzer, logs_hold_only_valid_batches
from chaos.fuzz_targets import all_targets
from railmq.admin import Admin
from storage.fs import OsFileSystem
from storage.log import LogConfig, PartitionLog
from tests.integration.test_storage_faults import produce, read_all

SOAK_S = float(os.environ.get("RAILMQ_FUZZ_SOAK_S", "60"))

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(int(SOAK_S) + 240)]


def test_a_minute_of_fuzzed_frames_against_every_endpoint_changes_nothing(fresh_cluster, tmp_path, unique_name):
    data_dir = str(tmp_path / "cluster")
    cluster = fresh_cluster(data_dir=data_dir)
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        admin.wait_for_leaders(topic, full_isr=True)
    acked = produce(cluster.bootstrap, topic, 300, "before")
    endpoints = [actor["endpoint"] for actor in cluster.actors() if actor["endpoint"]]
    before = {actor["name"]: actor["pid"] for actor in cluster.actors()}
    fuzzer = Fuzzer(all_targets(), seed=random.randrange(1 << 30))
    context = zmq.Context()
    sockets = []
    for endpoint in endpoints:
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 100)
        socket.connect(endpoint)
        sockets.append(socket)
    sent = 0
    try:
        deadline = time.monotonic() + SOAK_S
        while time.monotonic() < deadline:
            socket = sockets[sent % len(sockets)]
            frames, _ = fuzzer.frames_for(fuzzer.targets[sent % len(fuzzer.targets)])
            if frames:
                try:
                    socket.send_multipart(frames, zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    time.sleep(0.001)
            while socket.poll(0):
                socket.recv_multipart()
    finally:
        context.destroy(linger=0)

    assert sent > 10_000
    after = {actor["name"]: actor["pid"] for actor in cluster.actors()}
    assert {name: pid for name, pid in after.items() if name in before} == before, "an actor was restarted"
    assert all(read_all(cluster.bootstrap, topic, max(acked) + 1).get(offset) == value for offset, value in acked.items())
    cluster.stop()
    logs = []
    for root, _, names in os.walk(data_dir):
        if any(name.endswith(".log") for name in names):
            logs.append(PartitionLog.open(root, LogConfig(), fs=OsFileSystem(), now_ms=0))
    try:
        assert logs and logs_hold_only_valid_batches(logs) == []
    finally:
        for log in logs:
            log.close()
