"""Typed storage errors.

Every way the storage layer can refuse work has its own exception class, so the actors above
can map each one to a wire error code without parsing sentences. Operating errors (bad bytes
from the network, a full disk) are raised as these; broken invariants are plain assertions.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class of every error the storage layer raises on purpose."""


class CorruptBatch(StorageError):
    """A batch's header or CRC does not check out; nothing of it was written."""


class InvalidBatch(StorageError):
    """A batch whose header and CRC check out but whose content is not what it claims, or that sets
    what only the broker may set; nothing of it was written (Kafka's INVALID_RECORD)."""


class BatchTooLarge(StorageError):
    """A batch is larger than the configured `batch_bytes_max`."""


class UnsupportedVersion(CorruptBatch):
    """The batch declares a format version this code does not know."""


class OutOfOrderBatch(StorageError):
    """A replicated batch does not start exactly at the log end offset (a gap or an overlap)."""

    def __init__(self, expected_offset: int, batch_base_offset: int) -> None:
        super().__init__(
            f"replicated batch starts at offset {batch_base_offset}, "
            f"but the log end offset is {expected_offset}"
        )
        self.expected_offset = expected_offset
        self.batch_base_offset = batch_base_offset


class OffsetOutOfRange(StorageError):
    """A read asked for an offset outside [log_start_offset, log_end_offset]."""

    def __init__(self, requested_offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(
            f"offset {requested_offset} is outside the valid range "
            f"[{log_start_offset}, {log_end_offset}]"
        )
        self.requested_offset = requested_offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class CorruptLog(StorageError):
    """Bytes inside the already-flushed region fail their check; that range is refused."""

    def __init__(self, message: str, first_offset: int, last_offset: int) -> None:
        super().__init__(message)
        self.first_offset = first_offset
        self.last_offset = last_offset


class StorageFull(StorageError):
    """The disk (or the injected quota) is full; the write was rolled back, nothing partial remains."""


class StorageUnwritable(StorageFull):
    """The disk refuses to create or write a file (read-only, no permission): nothing was written,
    and it is handled as a full disk is (the caller waits and retries; a process that cannot go on
    without the write stops and is started again later and later)."""


class FsyncFailed(StorageError):
    """fsync/fdatasync failed. The owner must crash, not retry: the page cache state is unknown."""


class LogClosed(StorageError):
    """The log was closed (or the process is stopping) and takes no more work."""


class StaleLeaderEpoch(StorageError):
    """A batch carries a leader epoch older than the latest one this log already holds
    (epochs never go back along a log: KIP-101). Nothing of it was written."""

    def __init__(self, latest_epoch: int, batch_epoch: int) -> None:
        super().__init__(f"batch leader epoch {batch_epoch} is older than the log's latest epoch {latest_epoch}")
        self.latest_epoch = latest_epoch
        self.batch_epoch = batch_epoch


class CorruptState(StorageError):
    """A durable-state journal fails its checks inside the region that was already flushed.
    The file is left as it is for an operator; nothing is silently dropped."""
