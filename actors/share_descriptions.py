"""What DescribeGroup and DescribeSharePartitions say about a share group, bounded in bytes.

Both answers grow with what clients do, not with what the cluster holds: each in-flight record
released with its own error text is a range of its own, and every member of a share group is given
every partition of its topics. Unbounded, 100,000 records in flight held by a member with a
200-character client id made a 56 MB DescribeSharePartitions answer, and 200 members of a topic
with 750 partitions and a 249-character name a 38 MB DescribeGroup: both past the 32 MiB frame a
client decodes, so nobody could read them. Each answer holds at most `share_describe_bytes_max` of
ranges, or of members' partitions, counted as they are built; past it a partition or a member says
how many it leaves out (`records_omitted`, `assignment_omitted`).

Pure functions of the share-partitions and members given: nothing here changes state.
"""

from __future__ import annotations

from typing import Any, Callable

from actors.actor import MS
from actors.messages import MemberDescription, SharePartitionDescription, ShareRecordRange

# The most one described range takes on the wire besides its member id and error text: its field
# names, state and three 64-bit numbers.
RANGE_OVERHEAD_BYTES = 128
PARTITION_ENTRY_BYTES = 16  # one [topic, partition] of a described member, besides the topic's name


def describe_partitions(share_partitions: list[Any], bytes_max: int) -> list[SharePartitionDescription]:
    """Each share-partition's in-flight window as ranges of like records, `bytes_max` in all."""
    room, described = bytes_max, []
    for share_partition in share_partitions:
        description, used = _describe_partition(share_partition, room)
        described.append(description)
        room -= used
    return described


def _describe_partition(share_partition: Any, bytes_max: int) -> tuple[SharePartitionDescription, int]:
    """Its window in ranges taking at most `bytes_max` (the offsets past them are counted, not
    shown), and the bytes they took."""
    ranges: list[ShareRecordRange] = []
    used, omitted = 0, 0
    end = share_partition.end_offset
    for offset in range(share_partition.start_offset, end):
        record = share_partition.records[offset]
        previous = ranges[-1] if ranges else None
        if previous is not None and (previous.state, previous.delivery_count, previous.member_id,
                                     previous.last_error) == (record.state, record.delivery_count,
                                                              record.holder, record.last_error):
            previous.last_offset = offset
            continue
        size = RANGE_OVERHEAD_BYTES + len(record.holder.encode()) + len(record.last_error.encode())
        if used + size > bytes_max:
            omitted = end - offset
            break
        used += size
        ranges.append(ShareRecordRange(first_offset=offset, last_offset=offset, state=record.state,
                                       delivery_count=record.delivery_count, member_id=record.holder,
                                       last_error=record.last_error))
    return SharePartitionDescription(
        topic=share_partition.topic, partition=share_partition.partition, start_offset=share_partition.start_offset,
        end_offset=end, high_watermark=share_partition.high_watermark, records=ranges,
        records_omitted=omitted), used


def describe_members(members: list[Any], partitions_of: Callable[[list[str]], list[tuple[str, int]]],
                     bytes_max: int, now_ns: int) -> list[MemberDescription]:
    """Each member with the partitions it is given, listed while `bytes_max` lasts."""
    room, described = bytes_max, []
    for member in members:
        partitions = partitions_of(member.topics)
        size = sum(len(topic.encode()) + PARTITION_ENTRY_BYTES for topic, _ in partitions)
        shown = size <= room
        room -= size if shown else 0
        described.append(MemberDescription(
            member_id=member.member_id, client_id=member.client_id, assignment=partitions if shown else [],
            assignment_omitted=0 if shown else len(partitions),
            last_heartbeat_ms_ago=(now_ns - member.last_seen_ns) // MS, session_timeout_ms=member.session_timeout_ms))
    return described
