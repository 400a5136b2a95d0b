"""`topics describe` says which replicas lost data and why a partition is offline."""

from __future__ import annotations

from actors.messages import PartitionMetadata, ReplicaInfo, StorageReport, TopicMetadata
from railmq.cli_topics import describe_cells, describe_to_dict, storage_notes, DESCRIBE_COLUMNS


def topic() -> TopicMetadata:
    damaged = StorageReport(state="repairing", damage=[(120, -1)], detail="offsets 120..?: flushed but missing")
    healthy = [ReplicaInfo(node=1, alive=True), ReplicaInfo(node=3, alive=True)]
    return TopicMetadata(name="orders", partitions=[
        PartitionMetadata(partition=0, leader=1, leader_endpoint="tcp://x", replicas=[1, 2, 3], isr=[1, 3],
                          replica_info=[healthy[0], ReplicaInfo(node=2, alive=True, storage=damaged), healthy[1]]),
        PartitionMetadata(partition=1, leader=-1, replicas=[1, 2, 3], isr=[2], eligible_leader_replicas=[1],
                          offline_reason="no in-sync replica can lead: ISR members [2] lost or damaged data",
                          replica_info=healthy),
    ])


def test_the_storage_column_names_each_replica_that_is_not_ok():
    cells = [dict(zip((column.name for column in DESCRIBE_COLUMNS), describe_cells(p))) for p in topic().partitions]

    assert "2:repairing" in cells[0]["storage"]
    assert cells[1]["storage"] == "ok"


def test_the_notes_say_why_a_partition_is_offline_and_what_a_replica_lost():
    notes = storage_notes(topic())

    assert "partition 1 offline: no in-sync replica can lead: ISR members [2] lost or damaged data" in notes
    assert "partition 0 replica 2: repairing (offsets 120..?: flushed but missing)" in notes


def test_json_carries_storage_health_the_elr_and_the_offline_reason():
    described = describe_to_dict(topic())

    replica = described["partitions"][0]["replicas"][1]
    assert replica["storage"] == {"state": "repairing", "clean_shutdown": False, "damage": [[120, -1]],
                                  "detail": "offsets 120..?: flushed but missing"}
    assert described["partitions"][1]["eligible_leader_replicas"] == [1]
    assert described["partitions"][1]["offline_reason"].startswith("no in-sync replica can lead")
