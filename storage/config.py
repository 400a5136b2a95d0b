"""The partition log's settings and the small result types its API returns.

Kept apart from `storage/log.py` so that recovery and segment code can share them without
importing the log itself. `storage.log` re-exports every name here.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import msgspec

from storage.batch import BATCH_BYTES_MAX_DEFAULT

DAY_MS = 24 * 3600 * 1000


class FlushPolicy(enum.Enum):
    """When appended bytes are made durable (fdatasync) by the log itself.

    NEVER leaves durability to replication and to explicit `flush()` calls (Kafka's default).
    """

    EVERY_BATCH = "every_batch"
    INTERVAL = "interval"
    NEVER = "never"


class LogConfig(msgspec.Struct, frozen=True):
    # A segment is rolled before an append would take it past this size (a single batch larger
    # than it gets a segment of its own). 64 MiB keeps file counts low and retention granular.
    segment_bytes: int = 64 * 1024 * 1024
    # ... or once the active segment is this old (measured from its creation or the log's open).
    segment_ms: int = 7 * DAY_MS
    retention_ms: int | None = 7 * DAY_MS  # None = keep forever
    retention_bytes: int | None = None  # None = no size limit
    flush_policy: FlushPolicy = FlushPolicy.NEVER
    flush_interval_ms: int = 1000
    # One sparse index entry per this many bytes of batches: a lookup walks at most this far.
    index_interval_bytes: int = 4096
    batch_bytes_max: int = BATCH_BYTES_MAX_DEFAULT
    # Segment files open at once (storage/segment_files.py): the rest are opened when read, so a
    # log of any number of segments needs this many descriptors, not one per segment.
    open_segments_max: int = 64

    def __post_init__(self) -> None:
        if self.segment_bytes <= 0 or self.segment_ms <= 0:
            raise ValueError("segment_bytes and segment_ms must be positive")
        if self.flush_interval_ms <= 0 or self.index_interval_bytes <= 0 or self.batch_bytes_max <= 0 \
                or self.open_segments_max <= 0:
            raise ValueError("flush_interval_ms, index_interval_bytes, batch_bytes_max and open_segments_max "
                             "must be positive")
        if self.retention_bytes is not None and self.retention_bytes < 0:
            raise ValueError("retention_bytes must be >= 0 or None")


class AppendResult(NamedTuple):
    base_offset: int  # first offset written
    last_offset: int  # last offset written
    log_end_offset: int  # the log end after the append


class RecoveryReport(msgspec.Struct):
    """What `PartitionLog.open` found and what it cut."""

    truncated_bytes: int = 0  # bytes removed from the unflushed tail (torn or corrupt)
    truncated_batches: int = 0  # batches (whole or torn) among them
    # (first_offset, last_offset) ranges inside the flushed region that failed their checks and
    # are refused by reads, never truncated away.
    corrupt_ranges: list[tuple[int, int]] = msgspec.field(default_factory=list)
    scanned_bytes: int = 0  # bytes looked at: headers walked plus tail bytes CRC-checked
    seconds: float = 0.0
    segments: int = 0
    problems: list[str] = msgspec.field(default_factory=list)  # human sentences, also logged
