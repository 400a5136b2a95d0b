"""A producer's batches on their way (`Pending`), and an idempotent producer's sequence numbers per
partition (`PartitionSequences`): how they are given, and how they start over after a gap.

The leader takes each producer's batches to a partition in sequence order (actors/producer_state.py):
a batch numbered past what it expects is refused `OUT_OF_ORDER_SEQUENCE_NUMBER` and not appended.
So a batch that ends undelivered — refused for good (`DISK_FULL`, an invalid record) or past its
delivery timeout — leaves a gap that no later batch numbered under the same producer epoch can
cross: before this, every later batch of the producer to that partition timed out, for good.

Those later batches cannot have been appended, and never will be under their numbers. They are
numbered again, from 0, under the partition's next producer epoch, which the leader takes as a new
start (Kafka's KIP-360 bumps the epoch likewise). Not at once: a batch numbered before the gap was
known may still be in flight or waiting to go again, and one after a batch that timed out may have
been appended after all. Those go out first, as they are; the leader settles each (appended, or
refused out of order and so never appended). Only when none is left does the numbering start over.

A partition's epoch is its own: the leader keeps producer state per partition, and the producer id
is this producer's alone, so no coordinator need be asked for it.
"""

from __future__ import annotations

from actors.messages import SendBatch

PRODUCER_EPOCH_MAX = 32_767  # the batch header's int16 (storage/batch.py)

Key = tuple[str, int]


class Pending:
    """A batch on its way: encoded once, re-sent as is (same sequence numbers) on retry, and
    numbered again only behind a gap."""

    __slots__ = ("batch", "order", "record_count", "encoded", "sequence", "epoch", "attempts", "correlation_id",
                 "sent_ns", "retry_at_ns", "last_error")

    def __init__(self, batch: SendBatch, order: int) -> None:
        self.batch = batch
        self.order = order  # its place among the producer's batches
        self.record_count = len(batch.records)  # what an acknowledgement of this batch must span
        self.encoded: bytearray | None = None
        self.sequence = -1  # its first sequence number (-1: none yet, or taken back to number it again)
        self.epoch = -1  # the producer epoch it was numbered under
        self.attempts = 0
        self.correlation_id = 0
        self.sent_ns = 0
        self.retry_at_ns = 0
        self.last_error = ""


class PartitionSequences:
    def __init__(self) -> None:
        self.base_epoch = 0  # the epoch the producer id came with
        self.next_sequence: dict[Key, int] = {}
        self.epochs: dict[Key, int] = {}  # a partition's epoch once its numbering started over
        # The first sequence of a batch that ended undelivered, under the partition's epoch.
        self.gaps: dict[Key, int] = {}

    def epoch(self, key: Key) -> int:
        return self.epochs.get(key, self.base_epoch)

    def take(self, key: Key, count: int) -> tuple[int, int]:
        """(first sequence, epoch) for the next `count` records of the partition."""
        sequence = self.next_sequence.get(key, 0)
        self.next_sequence[key] = sequence + count
        return sequence, self.epoch(key)

    def ended_undelivered(self, key: Key, sequence: int, epoch: int) -> None:
        """A batch numbered `sequence` under `epoch` will not be sent again, and was not delivered."""
        if sequence >= 0 and epoch == self.epoch(key):
            self.gaps[key] = min(self.gaps.get(key, sequence), sequence)

    def behind_gap(self, key: Key, sequence: int, epoch: int) -> bool:
        """Whether a batch the leader refused out of order lies behind such a batch: then it was
        never appended, and never will be under these numbers."""
        gap = self.gaps.get(key)
        return gap is not None and epoch == self.epoch(key) and sequence > gap

    def waiting_for_start_over(self, key: Key) -> bool:
        return key in self.gaps

    def start_over(self, key: Key) -> bool:
        """Number the partition from 0 under its next epoch, once the caller has nothing numbered
        under this one in flight or waiting; False when the epoch is spent (the batches left fail
        at their deadline, and a new producer has a new id)."""
        epoch = self.epoch(key) + 1
        if epoch > PRODUCER_EPOCH_MAX:
            return False
        self.epochs[key] = epoch
        self.next_sequence[key] = 0
        del self.gaps[key]
        return True
