"""Committed offsets of classic groups: the store, and the bounds that keep it small.

Every commit is checked before anything is stored (a commit is all-or-nothing per entry, as in
Kafka): the group id and topic name must be names railmq could have made, the partition a number
a topic could have, the offset not negative, the metadata string within
`offset_metadata_length_max` (OFFSET_METADATA_TOO_LARGE). Then the bounds, each with a typed
LIMIT_REACHED answer naming it: at most `groups_max` classic groups, `group_offsets_max`
partitions with a commit per group, `offset_bytes_per_group_max` bytes of them in one group (its
offsets are one answer, which must fit a frame) and `group_offsets_bytes_max` bytes of committed
state in all (topic names and metadata strings are what costs): a client that commits for
thousands of made-up groups or topics fills a bounded store, not the coordinator's memory and disk.
"""

from __future__ import annotations

import re
from typing import Any

from actors.errors import ErrorCode
from actors.limits import Limits
from actors.messages import (
    INT32_MAX, INT64_MAX, ErrorResponse, OffsetEntry, OffsetFetchRequest, OffsetFetchResponse,
)
from actors.wire_bounds import text_bytes

TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]+")  # whole names only (fullmatch): `$` would let "a\n" through
GROUP_ID_LENGTH_MAX = 255
ENTRY_OVERHEAD_BYTES = 64  # the key, three numbers and the journal record around them


def entry_bytes(group_id: str, entry: OffsetEntry) -> int:
    """In the bytes the entry is encoded in: counted in characters, metadata of 4,096 characters
    above U+FFFF (16 KiB each) let one group's OffsetFetch answer reach 63.7 MB."""
    return ENTRY_OVERHEAD_BYTES + text_bytes(group_id) + text_bytes(entry.topic) + text_bytes(entry.metadata)


def is_topic_name(name: str, limits: Limits) -> bool:
    """A name a topic could have (topic_admin refuses to create any other)."""
    return (bool(TOPIC_NAME.fullmatch(name)) and len(name) <= limits.topic_name_length_max
            and name not in (".", ".."))


def check_group_id(group_id: str) -> str | None:
    if not group_id or len(group_id) > GROUP_ID_LENGTH_MAX or "/" in group_id:
        return f"group id must be 1..{GROUP_ID_LENGTH_MAX} characters without '/'"
    return None


def check_entry(entry: OffsetEntry, limits: Limits) -> tuple[ErrorCode, str] | None:
    """Why one commit entry cannot be stored, or None."""
    if not is_topic_name(entry.topic, limits):
        return ErrorCode.INVALID_REQUEST, f"{entry.topic[:60]!r} is not a topic name"
    if not 0 <= entry.partition < limits.partitions_per_topic_max:
        return ErrorCode.INVALID_REQUEST, f"partition {entry.partition} is outside 0..{limits.partitions_per_topic_max - 1}"
    # Offsets and topic ids are int64s and leader epochs int32s (the batch header's widths; topic
    # ids are drawn below 2**62): msgpack carries up to 2**64 - 1, and a value no partition can
    # hold was stored and answered as if it were one.
    if not 0 <= entry.offset <= INT64_MAX:
        return ErrorCode.INVALID_REQUEST, f"offset {entry.offset} is outside 0..{INT64_MAX}"
    if not -1 <= entry.leader_epoch <= INT32_MAX:
        return ErrorCode.INVALID_REQUEST, (f"leader epoch {entry.leader_epoch} is neither an epoch "
                                           f"(0..{INT32_MAX}) nor -1 (unknown)")
    if not 0 <= entry.topic_id <= INT64_MAX:
        return ErrorCode.INVALID_REQUEST, f"topic id {entry.topic_id} is outside 0..{INT64_MAX}"
    if len(entry.metadata) > limits.offset_metadata_length_max:
        return ErrorCode.OFFSET_METADATA_TOO_LARGE, (
            f"metadata of {len(entry.metadata)} characters is above offset_metadata_length_max "
            f"({limits.offset_metadata_length_max})")
    return None


class OffsetStore:
    """group id -> {(topic, partition): OffsetEntry}, with its size in bytes."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.by_group: dict[str, dict[tuple[str, int], OffsetEntry]] = {}
        self.group_bytes: dict[str, int] = {}
        self.total_bytes = 0

    def invariants(self) -> None:
        assert self.total_bytes == sum(self.group_bytes.values()), "the offsets' bytes do not add up"
        assert self.group_bytes.keys() <= self.by_group.keys(), "bytes counted for a group without offsets"

    def load(self, group_id: str, entry: OffsetEntry) -> None:
        self._put(group_id, entry)

    def over_budget(self, group_id: str, entry: OffsetEntry) -> str | None:
        """The bound one more entry would pass (a new partition or more bytes), or None."""
        stored = self.by_group.get(group_id, {})
        old = stored.get((entry.topic, entry.partition))
        if old is None and len(stored) >= self.limits.group_offsets_max:
            return f"group {group_id!r} has commits for its maximum of {self.limits.group_offsets_max} partitions"
        grown = entry_bytes(group_id, entry) - (entry_bytes(group_id, old) if old is not None else 0)
        if grown > 0 and self.group_bytes.get(group_id, 0) + grown > self.limits.offset_bytes_per_group_max:
            return (f"group {group_id!r} holds its maximum of {self.limits.offset_bytes_per_group_max} bytes of "
                    "committed offsets (offset_bytes_per_group_max); delete the offsets it no longer uses")
        if grown > 0 and self.total_bytes + grown > self.limits.group_offsets_bytes_max:
            return (f"committed offsets hold their maximum of {self.limits.group_offsets_bytes_max} bytes "
                    "(group_offsets_bytes_max); delete groups that are no longer used")
        return None

    def put(self, group_id: str, entry: OffsetEntry) -> None:
        self._put(group_id, entry)

    def _put(self, group_id: str, entry: OffsetEntry) -> None:
        stored = self.by_group.setdefault(group_id, {})
        old = stored.get((entry.topic, entry.partition))
        if old is not None:
            self._count(group_id, -entry_bytes(group_id, old))
        stored[(entry.topic, entry.partition)] = entry
        self._count(group_id, entry_bytes(group_id, entry))

    def _count(self, group_id: str, change: int) -> None:
        self.total_bytes += change
        held = self.group_bytes.get(group_id, 0) + change
        if held:
            self.group_bytes[group_id] = held
        else:
            self.group_bytes.pop(group_id, None)

    def delete_group(self, group_id: str) -> list[tuple[str, int]]:
        stored = self.by_group.pop(group_id, {})
        self.total_bytes -= self.group_bytes.pop(group_id, 0)
        return list(stored)

    def delete_partitions(self, group_id: str, partitions: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Forget the commits of these partitions; the ones that had one."""
        stored = self.by_group.get(group_id, {})
        deleted = []
        for key in partitions:
            entry = stored.pop(key, None)
            if entry is not None:
                self._count(group_id, -entry_bytes(group_id, entry))
                deleted.append(key)
        return deleted

    def answer_fetch(self, request: OffsetFetchRequest) -> OffsetFetchResponse | ErrorResponse:
        """The committed offsets an OffsetFetch names (all of the group's for None; -1 for a
        partition without one), each once. It names at most `group_offsets_max` partitions: the
        answer repeats each, and must fit a frame (one partition named 10,000 times, its 4 KiB of
        metadata repeated each time, made a 41 MB answer)."""
        if request.partitions is not None and len(request.partitions) > self.limits.group_offsets_max:
            return ErrorResponse(correlation_id=request.correlation_id, error=ErrorCode.INVALID_REQUEST, error_message=(
                f"an offset fetch names at most group_offsets_max ({self.limits.group_offsets_max}) partitions, "
                f"got {len(request.partitions)}"))
        stored = self.by_group.get(request.group_id, {})
        if request.partitions is None:
            entries = [stored[key] for key in sorted(stored)]
        else:
            entries = [stored.get((topic, partition)) or OffsetEntry(topic=topic, partition=partition, offset=-1)
                       for topic, partition in dict.fromkeys(map(tuple, request.partitions))]
        return OffsetFetchResponse(correlation_id=request.correlation_id, offsets=entries)

    def get(self, group_id: str, default: dict | None = None) -> dict[tuple[str, int], OffsetEntry]:
        return self.by_group.get(group_id, {} if default is None else default)

    def __contains__(self, group_id: str) -> bool:
        return group_id in self.by_group


def offset_from_record(key: str, value: Any) -> tuple[str, OffsetEntry]:
    """(group id, entry) of an `offset/<group>/<topic>/<partition>` record `[offset, metadata, ms,
    leader epoch, topic id]` (without the topic id, 0, as records were written before ids were
    kept or when the committer knew none; without the epoch too, -1, before epochs were kept)."""
    group_id, topic, partition = key[len("offset/"):].rsplit("/", 2)
    offset, metadata, timestamp, leader_epoch, topic_id = [*value, -1, 0][:5] if len(value) == 3 else \
        [*value, 0][:5]
    if not (partition.isdigit() and type(offset) is int and offset >= 0 and isinstance(metadata, str)
            and type(timestamp) is int and type(leader_epoch) is int and leader_epoch >= -1
            and type(topic_id) is int and topic_id >= 0 and 3 <= len(value) <= 5):
        raise ValueError(f"not [offset >= 0, metadata, timestamp, epoch >= -1, topic id >= 0] for a numbered "
                         f"partition: {value!r:.80}")
    return group_id, OffsetEntry(topic=topic, partition=int(partition), offset=offset, metadata=metadata,
                                 commit_timestamp_ms=timestamp, leader_epoch=leader_epoch, topic_id=topic_id)
