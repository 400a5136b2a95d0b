"""A replica's files in the wrong place: another replica's file copied in, a file that is not a file.

Each story writes two replica directories, then puts into one of them what belongs elsewhere — the
checkpoint of another partition or node (a restore from the wrong backup, a copy by hand), a
symlink to a device — and opens it again. Every such file must be refused by name or counted as
damage of unknown extent; none may be read as this replica's own and hide acknowledged records.
"""

from __future__ import annotations

import pytest

from storage.batch import encode_batch
from storage.checkpoint import RECOVERY_POINT_NAME
from storage.log import LogConfig
from storage.memory import MemoryFileSystem
from storage.replica_meta import UNKNOWN_END, ReplicaHealth, ReplicaMeta, open_replica_directory

CONFIG = LogConfig(segment_bytes=4096)


def meta(partition: int = 0, node: int = 1) -> ReplicaMeta:
    return ReplicaMeta(cluster_id="c1", topic="orders", topic_id=0xABC, partition=partition, node=node,
                       replicas=[1, 2, 3])


def directory_of(owner: ReplicaMeta) -> str:
    return f"/data/node-{owner.node}/orders-{owner.partition}-abc"


def batch(tag: str) -> bytes:
    return bytes(encode_batch([(0, f"{tag}-{i}".encode(), b"v" * 200, None) for i in range(2)], 1_000))


def written(fs: MemoryFileSystem, owner: ReplicaMeta, batches: int, *, delete_before: int = 0) -> int:
    """A healthy replica directory of `batches` batches of 2 records, closed cleanly; its log end."""
    opened = open_replica_directory(fs, directory_of(owner), owner, CONFIG, now_ms=0)
    for index in range(batches):
        opened.log.append_producer_batch(batch(f"{owner.partition}{owner.node}-{index:03}"), 1, 0)
    end = opened.log.log_end_offset
    opened.log.note_high_watermark(end, 1)
    if delete_before:
        opened.log.delete_records_before(delete_before)
    opened.health.replace(ReplicaHealth())
    opened.log.close()
    return end


def copy_file(fs: MemoryFileSystem, name: str, source: ReplicaMeta, target: ReplicaMeta) -> None:
    fs.set_content(f"{directory_of(target)}/{name}", fs.read_file(f"{directory_of(source)}/{name}"))


@pytest.mark.parametrize("other", [meta(partition=1), meta(node=2)],
                         ids=["another-partition", "another-node"])
def test_another_replicas_recovery_point_checkpoint_is_not_taken_for_this_ones(other):
    """The checkpoint names no owner: one of partition 1, whose records below 50 were deleted,
    copied into partition 0's directory opened as healthy with its log starting at 50 — offsets
    0..49, all acknowledged, gone from every read, and the replica eligible to lead."""
    fs = MemoryFileSystem()
    own = meta()
    end = written(fs, own, 40)
    written(fs, other, 30, delete_before=50)
    copy_file(fs, RECOVERY_POINT_NAME, other, own)

    opened = open_replica_directory(fs, directory_of(own), own, CONFIG, now_ms=0)

    health = opened.health.current
    span = f"{opened.log.log_start_offset}..{opened.log.log_end_offset}"
    assert not health.healthy, f"log {span} taken as healthy"
    assert any(d.last_offset == UNKNOWN_END and "checkpoint" in d.reason for d in health.damage), health
    assert (opened.log.log_start_offset, opened.log.log_end_offset) == (0, end)


def test_a_checkpoint_of_the_format_before_owners_still_reads_and_is_bound_to_its_owner_once_written():
    import struct
    import zlib

    from storage.checkpoint import RecoveryPoint, RecoveryPointFile

    fs = MemoryFileSystem()
    fs.make_directory("/c")
    body = struct.pack("<IQqqqqqiB", 0x52504332, 7, 120, 100, 4096, 0, 110, 3, 1)
    fs.set_content("/c/point", (body + struct.pack("<I", zlib.crc32(body))).ljust(64, b"\0") + b"\0" * 64)

    upgraded = RecoveryPointFile(fs, "/c/point", owner=b"partition 0")
    assert upgraded.point == RecoveryPoint(120, 100, 4096, 0, 110, 3, True)
    upgraded.store(RecoveryPoint(130, 100, 4200, 0, 120, 3, False))
    upgraded.store(RecoveryPoint(140, 100, 4300, 0, 130, 3, False))  # both slots now bound

    assert RecoveryPointFile(fs, "/c/point", owner=b"partition 0").point.recovery_offset == 140
    assert RecoveryPointFile(fs, "/c/point", owner=b"partition 1").point is None


# ---------------------------------------------------------------------------- a file that is not a file

def _child_with_bounded_memory(body: str, tmp_path) -> str:
    """Run `body` in a child process limited to 1 GiB of address space and 30 s, and return what it
    printed: a file that is read whole without a bound (/dev/zero) ends in a MemoryError there,
    instead of taking this machine's memory."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "child.py"
    script.write_text("import resource\nresource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
                      + textwrap.dedent(body))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30,
                          env={**__import__("os").environ, "PYTHONPATH": ":".join(sys.path)})
    return done.stdout + done.stderr


REPLICA_CHILD = """
import os, sys
from storage.batch import encode_batch
from storage.fs import OsFileSystem
from storage.log import LogConfig
from storage.replica_meta import ReplicaFileUnusable, ReplicaHealth, ReplicaMeta, open_replica_directory

name, target, directory = {name!r}, {target!r}, {directory!r}
meta = ReplicaMeta(cluster_id="c1", topic="orders", topic_id=1, partition=0, node=1)
opened = open_replica_directory(OsFileSystem(), directory, meta, LogConfig(segment_bytes=4096), now_ms=0)
for _ in range(20):
    opened.log.append_producer_batch(bytes(encode_batch([(0, b"k", b"v" * 200, None)], 1000)), 1, 0)
opened.health.replace(ReplicaHealth())
opened.log.close()
if name == "first segment":
    name = sorted(n for n in os.listdir(directory) if n.endswith(".log"))[0]
os.remove(os.path.join(directory, name))
if target == "fifo":
    os.mkfifo(os.path.join(directory, name))  # nobody writes to it: a blocking open never returns
elif target == "large":
    with open(os.path.join(directory, name), "wb") as handle:
        handle.truncate(4 << 30)  # sparse: 4 GiB that take no room
else:
    os.symlink(target, os.path.join(directory, name))
try:
    open_replica_directory(OsFileSystem(), directory, meta, LogConfig(segment_bytes=4096), now_ms=0)
except ReplicaFileUnusable as error:
    print("REFUSED", error)
else:
    print("OPENED")
"""


@pytest.mark.parametrize("name, target", [
    (name, target) for name in ("replica.meta", "replica.health", "leader-epoch-checkpoint",
                                "recovery-point-checkpoint", "first segment")
    for target in ("/dev/zero", "fifo", "large")
    # the recovery point and the segments are read at positions, never whole: a large one is
    # judged by its content (tests/storage/test_replica_directory_faults.py)
    if target != "large" or name in ("replica.meta", "replica.health", "leader-epoch-checkpoint")])
def test_a_replica_file_that_is_a_device_or_far_too_large_is_refused_by_name(tmp_path, name, target):
    """`replica.meta`, `replica.health` and the leader-epoch checkpoint were read whole: a symlink
    to /dev/zero in their place was read until memory ran out (MemoryError under a 1 GiB limit,
    the machine's memory without one), and a 4 GiB sparse file the same. A recovery point on
    /dev/zero ended in `FsyncFailed` (a restart loop), a segment on it was read as empty."""
    directory = str(tmp_path / "orders-0")
    output = _child_with_bounded_memory(REPLICA_CHILD.format(name=name, target=target, directory=directory),
                                        tmp_path)
    shown = name if name != "first segment" else ".log"
    assert "REFUSED" in output and shown in output, output


def test_a_raft_snapshot_that_is_a_device_is_refused_by_name(tmp_path):
    directory = str(tmp_path / "raft")
    output = _child_with_bounded_memory(f"""
        import os
        from storage.fs import OsFileSystem
        from storage.raft_log import CorruptRaftSnapshot, RaftLog, SNAPSHOT_NAME
        log = RaftLog.open({directory!r}, fs=OsFileSystem())
        log.close()
        os.symlink("/dev/zero", os.path.join({directory!r}, SNAPSHOT_NAME))
        try:
            RaftLog.open({directory!r}, fs=OsFileSystem())
        except CorruptRaftSnapshot as error:
            print("REFUSED", error)
        """, tmp_path)
    assert "REFUSED" in output and "snapshot" in output, output
