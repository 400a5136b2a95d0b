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
