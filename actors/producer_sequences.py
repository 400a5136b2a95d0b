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

Both numbers only grow while the producer lives, and the batch header holds them in fixed widths
(storage/batch.py): sequence numbers as an int32 (`SEQUENCE_MAX`), epochs as an int16
(`PRODUCER_EPOCH_MAX`). A batch whose numbers would run past `SEQUENCE_MAX` is not numbered under
the epoch: the partition starts over as behind a gap (Kafka wraps to 0 instead; a new epoch keeps
every comparison of numbers here within one epoch). A partition whose epochs are spent asks for a
new producer id and goes on under it from its epoch and sequence 0 (Kafka's producer likewise
takes a new id once its epoch would overflow, KIP-360); the other partitions keep theirs. Before,
the 2**31st record to a partition made every later batch to it fail INVALID_RECORD, and the
32,768th undelivered batch every later one REQUEST_TIMED_OUT, for good.

The leader recognises a retry only among the producer's last 5 batches (`BATCHES_REMEMBERED_MAX`).
Keeping 5 requests in flight is not enough for that: a batch whose answer was lost stays in flight
for its request timeout while later ones complete and free their places, and more go out; by its
retry the leader has forgotten it and answers out of order, every time, until its delivery
timeout. So a partition's batches are counted in the order they were first sent
(`first_sent`), and a new one goes out only while the oldest one not yet settled is among the
last `max_in_flight` sent (`may_send_new`): a retry always finds the leader remembering it.
"""

from __future__ import annotations

from actors.messages import SendBatch
from storage.batch import SEQUENCE_MAX

PRODUCER_EPOCH_MAX = 32_767  # the batch header's int16 (storage/batch.py)

Key = tuple[str, int]


class Pending:
    """A batch on its way: encoded once, re-sent as is (same sequence numbers) on retry, and
    numbered again only behind a gap."""

    __slots__ = ("batch", "order", "record_count", "encoded", "sequence", "epoch", "attempts", "correlation_id",
                 "sent_ns", "retry_at_ns", "last_error", "index")

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
        self.index = -1  # its place among the partition's batches in the order first sent (-1: not sent)


class PartitionSequences:
    def __init__(self) -> None:
        self.base_epoch = 0  # the epoch the producer id came with
        self.next_sequence: dict[Key, int] = {}
        self.epochs: dict[Key, int] = {}  # a partition's epoch once its numbering started over
        # The first sequence of a batch that ended undelivered, under the partition's epoch.
        self.gaps: dict[Key, int] = {}
        self.sent: dict[Key, int] = {}  # batches first sent to each partition
        self.unsettled: dict[Key, set[int]] = {}  # the places of those sent and not yet settled
        # A partition that went on under a new producer id: that id and its secret.
        self.producer_ids: dict[Key, tuple[int, bytes]] = {}
        self.epochs_spent: set[Key] = set()  # partitions waiting for a new producer id

    def may_send_new(self, key: Key, window: int) -> bool:
        """Whether a batch not sent yet may go out: the partition's oldest unsettled batch must
        stay among the last `window` sent, or the leader may forget it before its retry."""
        unsettled = self.unsettled.get(key)
        return not unsettled or self.sent.get(key, 0) - min(unsettled) < window

    def first_sent(self, key: Key) -> int:
        """A batch goes out for the first time: its place (unsettled until `settled`)."""
        index = self.sent.get(key, 0)
        self.sent[key] = index + 1
        self.unsettled.setdefault(key, set()).add(index)
        return index

    def settled(self, key: Key, index: int) -> None:
        """A batch sent has its outcome (delivered or failed) and will not go out again."""
        unsettled = self.unsettled.get(key)
        if unsettled is not None:
            unsettled.discard(index)
            if not unsettled:
                del self.unsettled[key]

    def epoch(self, key: Key) -> int:
        return self.epochs.get(key, self.base_epoch)

    def producer_id(self, key: Key, base_id: int, base_secret: bytes) -> tuple[int, bytes]:
        """The producer id (and its secret) the partition's batches are numbered under."""
        return self.producer_ids.get(key, (base_id, base_secret))

    def fits(self, key: Key, count: int) -> bool:
        """Whether `count` more records can be numbered under the partition's epoch."""
        return self.next_sequence.get(key, 0) + count - 1 <= SEQUENCE_MAX

    def numbers_spent(self, key: Key) -> None:
        """The next batch does not fit the sequence numbers left: the partition starts over as
        behind a gap at its next number (no batch was numbered at or past it)."""
        self.gaps.setdefault(key, self.next_sequence.get(key, 0))

    def take(self, key: Key, count: int) -> tuple[int, int]:
        """(first sequence, epoch) for the next `count` records of the partition."""
        sequence = self.next_sequence.get(key, 0)
        self.next_sequence[key] = sequence + count
        return sequence, self.epoch(key)

    def ended_undelivered(self, key: Key, sequence: int, epoch: int) -> None:
        """A batch numbered `sequence` under `epoch` will not be sent again, and was not delivered."""
        if sequence >= 0 and epoch == self.epoch(key):
            self.gaps[key] = min(self.gaps.get(key, sequence), sequence)

    def forgotten_from(self, key: Key, sequence: int, epoch: int) -> None:
        """The leader forgot the producer: it takes no batch numbered `sequence` or later under
        `epoch`, so those are numbered again, as behind a gap."""
        self.ended_undelivered(key, sequence, epoch)

    def behind_gap(self, key: Key, sequence: int, epoch: int) -> bool:
        """Whether a batch the leader refused out of order lies behind such a batch: then it was
        never appended, and never will be under these numbers."""
        gap = self.gaps.get(key)
        return gap is not None and epoch == self.epoch(key) and sequence > gap

    def waiting_for_start_over(self, key: Key) -> bool:
        return key in self.gaps

    def start_over(self, key: Key) -> bool:
        """Number the partition from 0 under its next epoch, once the caller has nothing numbered
        under this one in flight or waiting; False when the epochs are spent: the partition then
        waits in `epochs_spent` for a new producer id (`move_to`)."""
        epoch = self.epoch(key) + 1
        if epoch > PRODUCER_EPOCH_MAX:
            self.epochs_spent.add(key)
            return False
        self.epochs[key] = epoch
        self.next_sequence[key] = 0
        del self.gaps[key]
        return True

    def move_to(self, key: Key, producer_id: int, secret: bytes, epoch: int) -> None:
        """A partition whose epochs are spent goes on under a new producer id, from `epoch` (the
        one the id came with) and sequence 0: the leader has never seen that id."""
        self.producer_ids[key] = (producer_id, secret)
        self.epochs[key] = epoch
        self.next_sequence[key] = 0
        self.gaps.pop(key, None)
        self.epochs_spent.discard(key)
