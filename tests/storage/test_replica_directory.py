"""A replica directory knows whose it is and what it lost (storage/replica_meta.py, storage/checkpoint.py).

Each story writes a replica directory, stops it cleanly, then does to it what a bad disk, a bad
operator or a lost file would do, and opens it again: the open must say what was lost — never
silently start over — and remember it until told it was repaired.
"""

from __future__ import annotations

import pytest

from storage.batch import encode_batch
from storage.checkpoint import RECOVERY_POINT_NAME, RecoveryPoint, RecoveryPointFile
from storage.log import LogConfig
from storage.memory import MemoryFileSystem
from storage.replica_meta import (HEALTH_NAME, META_NAME, UNKNOWN_END, Damage, MetaMismatch, ReplicaHealth, ReplicaMeta,
                                  open_replica_directory, read_health)
from storage.segment import segment_file_name

DIRECTORY = "/data/node-1/orders-0-abc"
META = ReplicaMeta(cluster_id="c1", topic="orders", topic_id=0xABC, partition=0, node=1, replicas=[1, 2, 3])
CONFIG = LogConfig(segment_bytes=4096)


def batch(count: int, tag: str) -> bytes:
    return bytes(encode_batch([(0, f"{tag}-{i}".encode(), b"v" * 200, None) for i in range(count)], 1_000))


def written(fs: MemoryFileSystem, batches: int = 20) -> int:
    """A directory with `batches` batches of 2 records over several segments, closed cleanly."""
    opened = open_replica_directory(fs, DIRECTORY, META, CONFIG, now_ms=0)
    for index in range(batches):
        opened.log.append_producer_batch(batch(2, f"b{index}"), 1, 0)
    end = opened.log.log_end_offset
    opened.log.note_high_watermark(end, 1)
    opened.log.close()
    return end


def reopen(fs: MemoryFileSystem):
    return open_replica_directory(fs, DIRECTORY, META, CONFIG, now_ms=0)


def segments(fs: MemoryFileSystem) -> list[str]:
    return sorted(name for name in fs.list_directory(DIRECTORY) if name.endswith(".log"))


def test_a_new_directory_says_so_and_records_whose_it_is():
    fs = MemoryFileSystem()

    opened = reopen(fs)

    assert opened.health.current == ReplicaHealth(new_directory=True)
    assert fs.exists(f"{DIRECTORY}/{META_NAME}")
    assert not opened.log.clean_shutdown


def test_a_clean_close_is_told_apart_from_a_crash():
    fs = MemoryFileSystem()
    end = written(fs)

    opened = reopen(fs)
    assert opened.log.clean_shutdown
    assert (opened.log.high_watermark, opened.log.high_watermark_epoch) == (end, 1)
    opened.log.append_producer_batch(batch(1, "late"), 1, 0)
    opened.log.flush()
    fs.crash()  # no close: the process died

    assert not reopen(fs).log.clean_shutdown


def test_an_intact_directory_reopens_healthy_and_keeps_its_new_directory_mark_cleared():
    fs = MemoryFileSystem()
    written(fs)
    first = reopen(fs)
    first.health.replace(ReplicaHealth())  # caught up with a leader once
    first.log.close()

    opened = reopen(fs)

    assert opened.health.current.healthy
    assert opened.findings == []


def test_a_deleted_tail_segment_is_damage_with_its_offsets_and_never_clean():
    fs = MemoryFileSystem()
    end = written(fs)
    last = segments(fs)[-1]
    base = int(last.split(".")[0])
    fs.remove(f"{DIRECTORY}/{last}")

    opened = reopen(fs)

    assert not opened.log.clean_shutdown
    assert opened.log.log_end_offset == base
    damage = opened.health.current.damage
    assert any(d.first_offset == base and d.last_offset == end - 1 for d in damage), damage
    assert any("flushed but missing" in finding for finding in opened.findings)


def test_damage_found_once_is_remembered_by_the_next_open():
    fs = MemoryFileSystem()
    written(fs)
    fs.remove(f"{DIRECTORY}/{segments(fs)[-1]}")
    first = reopen(fs)
    first.log.close()  # the close rewrites the checkpoint: the loss is no longer visible to recovery

    again = reopen(fs)

    assert again.health.current.damage == first.health.current.damage
    assert read_health(fs, DIRECTORY).damage == first.health.current.damage


def test_a_truncated_middle_segment_is_refused_damage_inside_the_log():
    fs = MemoryFileSystem()
    written(fs)
    middle = segments(fs)[1]
    fs.cut(f"{DIRECTORY}/{middle}", 100)

    opened = reopen(fs)

    refused = [d for d in opened.health.current.damage if d.first_offset < opened.log.log_end_offset]
    assert refused, opened.health.current.damage
    assert opened.log.corrupt_ranges


def test_a_flipped_offset_byte_in_a_flushed_header_is_refused_damage_at_open():
    fs = MemoryFileSystem()
    written(fs)
    fs.corrupt(f"{DIRECTORY}/{segments(fs)[0]}", 2)  # the first batch's base offset (outside the CRC)

    opened = reopen(fs)

    assert opened.health.current.damage
    assert not opened.log.clean_shutdown


def test_a_flipped_byte_under_the_crc_is_found_by_the_first_read_not_by_the_header_walk():
    """Open only walks headers below the recovery point (cheap); the CRC check of every read — and
    the replica's scrubber, which reads everything — finds the rest (tests/unit/test_replica_storage.py)."""
    from storage.errors import CorruptLog

    fs = MemoryFileSystem()
    written(fs)
    fs.corrupt(f"{DIRECTORY}/{segments(fs)[0]}", 30)  # the first batch's producer id

    opened = reopen(fs)
    with pytest.raises(CorruptLog):
        opened.log.scrub(0, 1 << 20)

    assert opened.log.corrupt_ranges


def test_a_missing_checkpoint_is_damage_of_unknown_extent():
    fs = MemoryFileSystem()
    written(fs)
    fs.remove(f"{DIRECTORY}/{RECOVERY_POINT_NAME}")

    damage = reopen(fs).health.current.damage

    assert any(d.last_offset == UNKNOWN_END and "checkpoint was missing" in d.reason for d in damage)


def test_a_missing_meta_file_with_data_is_damage_of_unknown_extent():
    fs = MemoryFileSystem()
    written(fs)
    fs.remove(f"{DIRECTORY}/{META_NAME}")

    opened = reopen(fs)

    assert any(d.last_offset == UNKNOWN_END and META_NAME in d.reason for d in opened.health.current.damage)
    assert fs.exists(f"{DIRECTORY}/{META_NAME}"), "the meta is written again"


def test_a_damaged_health_file_counts_as_damage_itself():
    fs = MemoryFileSystem()
    written(fs)
    fs.set_content(f"{DIRECTORY}/{HEALTH_NAME}", b"RMH1garbage")

    assert reopen(fs).health.current.damage == [Damage(0, UNKNOWN_END, f"{HEALTH_NAME} is damaged")]


@pytest.mark.parametrize("field, value", [("cluster_id", "other"), ("topic_id", 0xDEF), ("partition", 1),
                                          ("node", 2), ("topic", "payments")])
def test_a_directory_of_another_cluster_topic_partition_or_node_is_refused_untouched(field, value):
    fs = MemoryFileSystem()
    written(fs)
    before = {name: fs.read_file(f"{DIRECTORY}/{name}") for name in fs.list_directory(DIRECTORY)}
    other = ReplicaMeta(**{**{f: getattr(META, f) for f in META.__struct_fields__}, field: value})

    with pytest.raises(MetaMismatch, match=field):
        open_replica_directory(fs, DIRECTORY, other, CONFIG, now_ms=0)

    assert {name: fs.read_file(f"{DIRECTORY}/{name}") for name in fs.list_directory(DIRECTORY)} == before


def test_a_damaged_meta_file_is_refused():
    fs = MemoryFileSystem()
    written(fs)
    fs.set_content(f"{DIRECTORY}/{META_NAME}", b"not a meta")

    with pytest.raises(MetaMismatch, match="damaged"):
        reopen(fs)


# ---------------------------------------------------------------------------- the checkpoint format


def test_a_checkpoint_slot_of_the_previous_format_still_reads():
    import struct
    import zlib

    fs = MemoryFileSystem()
    fs.make_directory("/c")
    body = struct.pack("<IQqqqq", 0x52504331, 7, 120, 100, 4096, 0)
    fs.set_content("/c/point", (body + struct.pack("<I", zlib.crc32(body))).ljust(64, b"\0") + b"\0" * 64)

    point = RecoveryPointFile(fs, "/c/point").point

    assert point == RecoveryPoint(120, 100, 4096, 0)
    assert not point.clean and point.high_watermark_epoch == -1


def test_the_new_checkpoint_fields_round_trip():
    fs = MemoryFileSystem()
    fs.make_directory("/c")
    stored = RecoveryPoint(120, 100, 4096, 3, 110, 7, True)
    RecoveryPointFile(fs, "/c/point").store(stored)

    assert RecoveryPointFile(fs, "/c/point").point == stored


def test_segment_names_are_what_the_helpers_expect():
    assert segment_file_name(0) == "00000000000000000000.log"


def test_the_scrub_finds_a_stamped_field_changed_on_disk_that_no_crc_covers():
    """Base offset and leader epoch are stamped by the leader outside the CRC: a byte flipped in
    them while the replica runs is found by the scrubber's continuity and epoch checks."""
    from storage.errors import CorruptLog

    fs = MemoryFileSystem()
    written(fs)
    opened = reopen(fs)
    first_segment = segments(fs)[0]
    fs.corrupt(f"{DIRECTORY}/{first_segment}", 9)  # the first batch's leader epoch, in the open log's file

    with pytest.raises(CorruptLog, match="stamped header field"):
        opened.log.scrub(0, 1 << 20)

    assert opened.log.corrupt_ranges
