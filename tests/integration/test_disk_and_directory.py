"""What a lost file, a second cluster on the same directory and a full disk do to a live cluster.

- A coordinator whose `metadata.state` is missing, shorter than its header or corrupt, while
  replica directories exist, refuses to start and says how to recover; nothing on disk is deleted
  or changed; so does a controller quorum that lost every voter's log. `--rebuild-metadata`
  (LocalCluster(rebuild_metadata=True)) brings every topic back from the replicas' own records,
  with every acknowledged write.
- A group coordinator whose `groups.state` is lost (`--controllers 0`) refuses to start until
  `--reset-group-state` (LocalCluster(reset_group_state=True)) accepts the loss of the offsets.
- A quorum that lost one voter's log keeps everything: the voter comes back empty, refuses to
  vote until the leader has caught it up, and holds the same metadata afterwards.
- A second cluster on a data directory in use fails at once, naming the holder's pid.
- A full disk makes writes fail with DISK_FULL and followers back off; no actor crash-loops
  (tracing included: a trace line that cannot be written is dropped and counted), and once space
  is back everything acknowledged is there.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import shutil

import pytest

from actors.errors import ErrorCode, RailmqError
from railmq.admin import Admin
from railmq.cluster import LocalCluster
from railmq.group_admin import GroupAdminClient
from railmq.producer import Producer
from storage.directory import DirectoryInUse
from storage.raft_log import RaftLog, rejoining_on_disk
from tests.conftest import TEST_LIMITS
from tests.helpers import wait_for
from tests.integration.test_storage_faults import read_all
from transport.actor_main import controller_directory
from transport.supervisor import ActorStartFailed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def produce(bootstrap: str, topic: str, count: int, tag: str = "r") -> dict[int, bytes]:
    acked = {}
    with Producer(bootstrap, acks="all", idempotent=True, request_timeout_ms=3000) as producer:
        futures = [(f"{tag}-{index}".encode(), producer.send(topic, f"{tag}-{index}".encode(), partition=index % 2))
                   for index in range(count)]
        for value, future in futures:
            metadata = future.result(60)
            acked[(metadata.partition, metadata.offset)] = value
    return acked


def fingerprint(data_dir: str) -> dict[str, str]:
    """Every replica file's content hash: what must not change when a start is refused."""
    found = {}
    for root, _, names in os.walk(data_dir):
        for name in names:
            path = os.path.join(root, name)
            if "/node-" in path and name != ".lock":
                with open(path, "rb") as handle:
                    found[os.path.relpath(path, data_dir)] = hashlib.sha256(handle.read()).hexdigest()
    return found


def cluster_with_data(fresh_cluster, data_dir: str, topic: str, **options) -> dict:
    cluster = fresh_cluster(data_dir=data_dir, **options)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=3, config={"min_insync_replicas": 2})
        admin.wait_for_leaders(topic, full_isr=True)
    acked = produce(cluster.bootstrap, topic, 400)
    cluster.stop()
    return acked


def lose_state(data_dir: str, how: str) -> None:
    path = os.path.join(data_dir, "coordinator", "metadata.state")
    if how == "every-controller-log":
        for node in (1, 2, 3):
            shutil.rmtree(controller_directory(data_dir, node))
    elif how == "missing":
        os.remove(path)
    elif how == "short":
        with open(path, "r+b") as handle:
            handle.truncate(20)
    elif how == "corrupt":
        with open(path, "r+b") as handle:
            handle.seek(70)
            byte = handle.read(1)
            handle.seek(70)
            handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("how", ["missing", "short", "corrupt", "every-controller-log"])
def test_a_lost_coordinator_state_deletes_nothing_and_says_what_to_do(fresh_cluster, tmp_path, unique_name, how):
    data_dir, topic = str(tmp_path / "cluster"), unique_name()
    options = {} if how == "every-controller-log" else {"controllers": 0}  # the single coordinator's file
    acked = cluster_with_data(fresh_cluster, data_dir, topic, **options)
    lose_state(data_dir, how)
    before = fingerprint(data_dir)

    # Every controller refuses; they start at once, so whichever says so first is reported.
    with pytest.raises(ActorStartFailed, match=r"(coordinator|controller/[123]) refused to start") as refused:
        fresh_cluster(data_dir=data_dir, **options)

    assert "--rebuild-metadata" in str(refused.value)
    assert fingerprint(data_dir) == before, "a refused start must not touch replica data"

    rebuilt = fresh_cluster(data_dir=data_dir, rebuild_metadata=True, **options)
    with Admin(rebuilt.bootstrap) as admin:
        admin.wait_for_leaders(topic, timeout_s=30)
        assert len(admin.describe_topic(topic).partitions) == 2
    for partition in (0, 1):
        wanted = {offset: value for (p, offset), value in acked.items() if p == partition}
        served = read_all(rebuilt.bootstrap, topic, max(wanted) + 1, partition=partition)
        assert all(served.get(offset) == value for offset, value in wanted.items()), f"partition {partition} lost writes"


def test_a_lost_group_state_refuses_the_start_until_the_loss_is_accepted(fresh_cluster, tmp_path, unique_name):
    """With --controllers 0 `groups.state` is the only copy of every committed offset: lost, the
    group coordinator must not start empty as if the cluster were new."""
    data_dir, topic = str(tmp_path / "cluster"), unique_name()
    cluster_with_data(fresh_cluster, data_dir, topic, controllers=0)
    os.remove(os.path.join(data_dir, "group-coordinator", "groups.state"))
    before = fingerprint(data_dir)

    with pytest.raises(ActorStartFailed, match="group-coordinator refused to start") as refused:
        fresh_cluster(data_dir=data_dir, controllers=0)

    assert "--reset-group-state" in str(refused.value)
    assert fingerprint(data_dir) == before, "a refused start must not touch replica data"
    accepted = fresh_cluster(data_dir=data_dir, controllers=0, reset_group_state=True)
    with Admin(accepted.bootstrap) as admin:
        admin.wait_for_leaders(topic, timeout_s=30)
    assert os.path.exists(os.path.join(data_dir, "group-coordinator", "groups.state"))


def test_a_voter_that_lost_its_log_waits_to_be_caught_up_and_loses_nothing(fresh_cluster, tmp_path, unique_name):
    data_dir, topic = str(tmp_path / "cluster"), unique_name()
    acked = cluster_with_data(fresh_cluster, data_dir, topic)
    shutil.rmtree(controller_directory(data_dir, 2))

    cluster = fresh_cluster(data_dir=data_dir)
    raft = os.path.join(controller_directory(data_dir, 2), "raft")
    with Admin(cluster.bootstrap) as admin:
        admin.wait_for_leaders(topic, timeout_s=30)
        wait_for(lambda: not rejoining_on_disk(raft), 20, "the wiped voter to be caught up")
        wait_for(lambda: len({entry.commit_index for entry in admin.quorum_status()}) == 1, 10,
                 "every voter at the same commit index")
        admin.create_topic(unique_name(), partitions=1, replication_factor=3)
    with open(cluster.trace_path, encoding="utf-8") as handle:
        events = [json.loads(line) for line in handle]
    assert any(event["event"] == "raft_rejoined" and event["actor"] == "controller/2" for event in events), (
        "the wiped voter never said it was caught up")
    served = read_all(cluster.bootstrap, topic, max(offset for _, offset in acked) + 1, partition=0)
    wanted = {offset: value for (p, offset), value in acked.items() if p == 0}
    assert all(served.get(offset) == value for offset, value in wanted.items()), "acknowledged writes lost"


def test_a_first_quorum_start_cut_short_keeps_the_single_coordinators_topics_and_offsets(
        fresh_cluster, tmp_path, unique_name):
    """A cluster run with `--controllers 0`, then started with its quorums: a first start killed
    after every voter made its journal and before a leader committed the old state came back, at
    the next start, as a new, empty cluster (no topic, no committed offset, nothing said)."""
    data_dir, topic = str(tmp_path / "cluster"), unique_name()
    acked = cluster_with_data(fresh_cluster, data_dir, topic, controllers=0)
    single = fresh_cluster(data_dir=data_dir, controllers=0)
    with GroupAdminClient(single.bootstrap) as groups:
        groups.commit_as_admin("payments", {(topic, 0): 7})
    single.stop()
    for node in (1, 2, 3):  # what the first quorum start leaves when every process dies at once
        RaftLog.open(os.path.join(controller_directory(data_dir, node), "raft")).close()
        RaftLog.open(os.path.join(data_dir, f"node-{node}", "group-coordinator", "raft")).close()

    cluster = fresh_cluster(data_dir=data_dir)
    with Admin(cluster.bootstrap) as admin:
        admin.wait_for_leaders(topic, timeout_s=30)
    with GroupAdminClient(cluster.bootstrap) as groups:
        offsets = groups.describe_group("payments").offsets
    assert [(entry.topic, entry.partition, entry.offset) for entry in offsets] == [(topic, 0, 7)]
    wanted = {offset: value for (p, offset), value in acked.items() if p == 0}
    served = read_all(cluster.bootstrap, topic, max(wanted) + 1, partition=0)
    assert all(served.get(offset) == value for offset, value in wanted.items()), "acknowledged writes lost"
    cluster.stop()

    again = fresh_cluster(data_dir=data_dir)  # the quorums hold it all now: the old files are retired
    with Admin(again.bootstrap) as admin:
        admin.wait_for_leaders(topic, timeout_s=30)
    for old in ("coordinator/metadata.state", "group-coordinator/groups.state"):
        assert not os.path.exists(os.path.join(data_dir, old))
        assert os.path.exists(os.path.join(data_dir, old + ".migrated"))


def test_a_second_cluster_on_a_directory_in_use_is_refused_naming_the_holder(fresh_cluster, tmp_path):
    data_dir = str(tmp_path / "cluster")
    fresh_cluster(data_dir=data_dir)

    second = LocalCluster(3, data_dir=data_dir, limits=TEST_LIMITS)
    with pytest.raises(DirectoryInUse, match=f"process {os.getpid()}"):
        second.start()
    second.stop()


def test_a_second_railmq_up_on_the_same_directory_fails_at_once(fresh_cluster, tmp_path):
    data_dir = str(tmp_path / "cluster")
    fresh_cluster(data_dir=data_dir)

    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "railmq.cli", "up", "--data-dir", data_dir, "--port", "0"],
                            capture_output=True, text=True, timeout=60)

    assert result.returncode != 0
    assert f"in use by process {os.getpid()}" in result.stderr
    assert time.monotonic() - started < 30


@pytest.fixture
def small_disk(tmp_path):
    """A 12 MiB tmpfs (root only; skipped where mounting is not allowed)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount_point)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield str(mount_point)
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def fill(path: str) -> None:
    with open(path, "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * (256 * 1024))
                handle.flush()
        except OSError:
            pass


def test_a_full_disk_never_crash_loops_an_actor_and_loses_nothing_acknowledged(small_disk, fresh_cluster, unique_name):
    topic = unique_name()
    cluster = fresh_cluster(data_dir=os.path.join(small_disk, "cluster"))
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=3, config={"min_insync_replicas": 2})
        admin.wait_for_leaders(topic, full_isr=True)
    acked = produce(cluster.bootstrap, topic, 200, "before")
    ballast = os.path.join(small_disk, "ballast")
    fill(ballast)

    refused = []
    with Producer(cluster.bootstrap, acks="all", request_timeout_ms=1000, delivery_timeout_ms=3000) as producer:
        for index in range(200):
            try:
                metadata = producer.send(topic, b"x" * 4096, partition=index % 2).result(10)
                acked[(metadata.partition, metadata.offset)] = b"x" * 4096
            except RailmqError as error:
                refused.append(error.code)
    time.sleep(3)  # several restart delays: a crash loop would show in the restart counts

    assert ErrorCode.DISK_FULL in refused or ErrorCode.REQUEST_TIMED_OUT in refused
    assert all(actor["restarts"] == 0 and actor["alive"] for actor in cluster.actors()), cluster.actors()
    os.remove(ballast)
    acked.update(produce(cluster.bootstrap, topic, 50, "after"))
    with Admin(cluster.bootstrap) as admin:
        wait_for(lambda: all(len(p.isr) == 3 for p in admin.describe_topic(topic).partitions), timeout_s=30,
                 what="a full ISR once space is back")
    for partition in (0, 1):
        wanted = {offset: value for (p, offset), value in acked.items() if p == partition}
        served = read_all(cluster.bootstrap, topic, max(wanted) + 1, partition=partition)
        assert all(served.get(offset) == value for offset, value in wanted.items())
