"""The promise survives one damaged disk: real processes, real files, real damage.

Given a 3-node cluster, a topic with replication factor 3 and min in-sync 2, and acknowledged
acks=all writes, when the cluster is stopped and one replica's files are damaged — its tail
segment deleted, a middle segment truncated, a byte flipped in a flushed payload or header, its
recovery-point checkpoint deleted — for the leader's replica or a follower's, then after a restart
of the whole cluster and after a later leader kill:

- every acknowledged write is readable from the leader, at the offset it was acknowledged at;
- no offset ever holds two different records: after a final clean stop, every replica's segment
  files agree with each other and with the acknowledged history;
- the damaged replica has repaired from a healthy leader and is back in the ISR.
"""

from __future__ import annotations

import os
import time

import msgspec
import pytest

from railmq.admin import Admin
from railmq.consumer import Consumer
from railmq.producer import Producer
from storage.batch import decode_records
from storage.fs import OsFileSystem
from storage.log import LogConfig, PartitionLog
from storage.segment import parse_segment_file_name
from tests.conftest import TEST_LIMITS
from tests.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

RECORDS = 1500
SEGMENT_BYTES = 16 * 1024  # ~15 segments of ~50 records: damage lands inside the log, not only at its end
TOPIC_CONFIG = {"min_insync_replicas": 2, "segment_bytes": SEGMENT_BYTES}
# Segments this small are refused by default (topic_segment_bytes_min, 1 MiB): allowed here, for a
# log of a few segments.
LIMITS = msgspec.structs.replace(TEST_LIMITS, topic_segment_bytes_min=SEGMENT_BYTES)


# ---------------------------------------------------------------------------- the faults


def replica_dir(data_dir: str, node: int, topic: str) -> str:
    node_dir = os.path.join(data_dir, f"node-{node}")
    found = [name for name in os.listdir(node_dir) if name.startswith(f"{topic}-0-")]
    assert len(found) == 1, found
    return os.path.join(node_dir, found[0])


def segment_paths(directory: str) -> list[str]:
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if parse_segment_file_name(name) is not None)


def delete_tail_segment(directory: str) -> None:
    os.remove(segment_paths(directory)[-1])


def truncate_middle_segment(directory: str) -> None:
    paths = segment_paths(directory)
    with open(paths[len(paths) // 2], "r+b") as handle:
        handle.truncate(os.path.getsize(paths[len(paths) // 2]) // 2)


def flip_payload_byte(directory: str) -> None:
    _flip(segment_paths(directory)[len(segment_paths(directory)) // 2], 56 + 40)  # inside the first batch's records


def flip_header_byte(directory: str) -> None:
    _flip(segment_paths(directory)[len(segment_paths(directory)) // 2], 2)  # the first batch's base offset


def delete_checkpoint(directory: str) -> None:
    os.remove(os.path.join(directory, "recovery-point-checkpoint"))
    os.remove(os.path.join(directory, "leader-epoch-checkpoint"))


def _flip(path: str, position: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)
        handle.seek(position)
        handle.write(bytes([byte[0] ^ 0xFF]))


FAULTS = {
    "tail-segment-deleted": delete_tail_segment,
    "middle-segment-truncated": truncate_middle_segment,
    "payload-byte-flipped": flip_payload_byte,
    "header-byte-flipped": flip_header_byte,
    "checkpoints-deleted": delete_checkpoint,
}


# ---------------------------------------------------------------------------- the checks


def produce(bootstrap: str, topic: str, count: int, tag: str) -> dict[int, bytes]:
    """Acknowledged writes: offset -> value."""
    acked: dict[int, bytes] = {}
    with Producer(bootstrap, acks="all", idempotent=True, request_timeout_ms=3000) as producer:
        futures = [(value, producer.send(topic, value, partition=0))
                   for value in (f"{tag}-{index}".encode() for index in range(count))]
        for value, future in futures:
            acked[future.result(60).offset] = value
    return acked


def read_all(bootstrap: str, topic: str, until: int, timeout_s: float = 40.0, *, partition: int = 0) -> dict[int, bytes]:
    """Everything the leader serves below `until` (retrying through failovers and refusals)."""
    found: dict[int, bytes] = {}
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, partition)])
        deadline = time.monotonic() + timeout_s
        while len(found) < until and time.monotonic() < deadline:
            for record in consumer.poll(300):
                assert found.setdefault(record.offset, record.value) == record.value, (
                    f"offset {record.offset} was read with two values")
    return found


def assert_every_acknowledged_write_is_served(bootstrap: str, topic: str, acked: dict[int, bytes]) -> None:
    served = read_all(bootstrap, topic, max(acked) + 1)
    missing = [offset for offset, value in acked.items() if served.get(offset) != value]
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged writes are not served (first: {missing[:5]})"


def replica_contents(directory: str) -> dict[int, bytes]:
    log = PartitionLog.open(directory, LogConfig(segment_bytes=SEGMENT_BYTES), fs=OsFileSystem(), now_ms=0)
    try:
        data = log.read(log.log_start_offset, 1 << 30) if log.log_end_offset > log.log_start_offset else b""
        contents: dict[int, bytes] = {}
        from storage.batch import iter_batches

        for position, header in iter_batches(data):
            for index, record in enumerate(decode_records(data, header, position)):
                contents[header.base_offset + index] = record[2]
        return contents
    finally:
        log.close()


def assert_replicas_agree_with_history(data_dir: str, topic: str, acked: dict[int, bytes]) -> None:
    contents = {node: replica_contents(replica_dir(data_dir, node, topic)) for node in (1, 2, 3)}
    for node, held in contents.items():
        for offset, value in acked.items():
            assert held.get(offset) == value, f"node {node} holds {held.get(offset)!r} at acknowledged offset {offset}"
    reference = contents[1]
    for node in (2, 3):
        assert contents[node] == reference, f"node {node}'s log differs from node 1's"


def storage_states(admin: Admin, topic: str) -> dict[int, str]:
    partition = admin.describe_topic(topic).partitions[0]
    return {info.node: info.storage.state for info in partition.replica_info}


def healthy_and_in_sync(admin: Admin, topic: str) -> bool:
    partition = admin.describe_topic(topic).partitions[0]
    return (bool(partition.leader_endpoint) and sorted(partition.isr) == [1, 2, 3]
            and all(info.alive and info.storage.state == "ok" for info in partition.replica_info))


# ---------------------------------------------------------------------------- the story


@pytest.mark.parametrize("target", ["leader", "follower"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_one_damaged_replica_loses_no_acknowledged_write(fresh_cluster, unique_name, tmp_path, fault, target):
    data_dir = str(tmp_path / "cluster")
    topic = unique_name()
    cluster = fresh_cluster(data_dir=data_dir, limits=LIMITS)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3, config=TOPIC_CONFIG)
        admin.wait_for_leaders(topic, full_isr=True)
        acked = produce(cluster.bootstrap, topic, RECORDS, "before")
        wait_for(lambda: all(info.log_end_offset == RECORDS for info in
                             admin.describe_topic(topic).partitions[0].replica_info),
                 timeout_s=20, what="every replica holding every record")
        partition = admin.describe_topic(topic).partitions[0]
    victim = partition.leader if target == "leader" else next(n for n in partition.isr if n != partition.leader)
    cluster.stop()

    FAULTS[fault](replica_dir(data_dir, victim, topic))

    cluster = fresh_cluster(data_dir=data_dir, limits=LIMITS)
    with Admin(cluster.bootstrap) as admin:
        admin.wait_for_leaders(topic, timeout_s=30)
        assert_every_acknowledged_write_is_served(cluster.bootstrap, topic, acked)
        wait_for(lambda: healthy_and_in_sync(admin, topic), timeout_s=40,
                 what=f"node {victim} repaired and back in the ISR ({storage_states(admin, topic)})")

        before_kill = admin.describe_topic(topic).partitions[0]
        cluster.kill(cluster.leader_of(topic, 0))
        wait_for(lambda: admin.describe_topic(topic).partitions[0].leader_epoch > before_kill.leader_epoch
                 and admin.describe_topic(topic).partitions[0].leader_endpoint, timeout_s=30, what="a new leader")
        acked.update(produce(cluster.bootstrap, topic, 100, "after"))
        assert_every_acknowledged_write_is_served(cluster.bootstrap, topic, acked)
        wait_for(lambda: healthy_and_in_sync(admin, topic), timeout_s=40, what="a full ISR after the kill")
        wait_for(lambda: all(info.log_end_offset == max(acked) + 1 for info in
                             admin.describe_topic(topic).partitions[0].replica_info),
                 timeout_s=20, what="every replica caught up")
    cluster.stop()

    assert_replicas_agree_with_history(data_dir, topic, acked)
