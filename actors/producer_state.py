"""Idempotent-producer bookkeeping on the broker (Kafka's ProducerStateManager, KIP-98).

An idempotent producer stamps each batch with (producer id, producer epoch, base sequence). The
partition leader remembers, per producer id, the last few batches it appended, so a retried
batch (the producer timed out, the ack was lost) is recognised and answered with its original
offsets instead of being written twice. Followers rebuild the same table from the batches they
replicate, so a new leader after a failover still recognises retries.

A retry is the same batch sent again: the same numbers and the same bytes, so the same CRC
(which covers the producer fields and every record). Numbers alone are a claim too: a client that
read a producer's id from the log can store a batch of its own under that producer's next numbers,
and the producer's own batch under them would then be answered as a retry, acknowledged with the
other batch's offsets while none of its records are in the log. A batch whose numbers match a
remembered one but whose CRC does not is refused `DUPLICATE_SEQUENCE_NUMBER`: its numbers are
taken, and it is not stored.

Limits: dedup covers the last `BATCHES_REMEMBERED_MAX` batches of each producer (Kafka's 5, which
is why a producer keeps at most 5 requests in flight per partition), and producers forgotten by
retention are unknown again. An unknown producer's first batch must start at sequence 0; any
other is refused `UNKNOWN_PRODUCER_ID`, and a producer the leader forgot numbers the partition
again from 0 under its next epoch (actors/producer_sequences.py). A producer id is the batch
header's claim, so a client can invent any number of them: the table remembers at most
`producer_ids_per_partition_max` (up to ~1.1 KB each with five batches) and forgets the producer
that wrote least recently first, so an active producer keeps its dedup while an attacker's ids
push each other out. (Kafka bounds the same with quotas on new producer ids, KIP-936.)
Exactly-once stops here: it is about the broker's log, not about side effects a consumer performs
(see docs/delivery.md).
"""

from __future__ import annotations

from typing import NamedTuple

from actors.errors import ErrorCode

BATCHES_REMEMBERED_MAX = 5


class BatchMark(NamedTuple):
    base_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int
    crc: int  # the batch's CRC as the producer wrote it: what tells a retry from another batch


class ProducerEntry:
    __slots__ = ("epoch", "batches")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches: list[BatchMark] = []  # the last BATCHES_REMEMBERED_MAX, oldest first


class Verdict(NamedTuple):
    """What to do with an incoming batch: append it, answer it as a duplicate, or refuse it."""

    error: ErrorCode
    message: str = ""
    duplicate_of: BatchMark | None = None


APPEND = Verdict(ErrorCode.NONE)


class ProducerStateTable:
    def __init__(self, producers_max: int) -> None:
        self.producers_max = producers_max
        self._producers: dict[int, ProducerEntry] = {}  # least recently written first

    def __len__(self) -> int:
        return len(self._producers)

    def check(self, producer_id: int, producer_epoch: int, base_sequence: int, record_count: int,
              crc: int) -> Verdict:
        if producer_id < 0:
            return APPEND
        entry = self._producers.get(producer_id)
        if entry is None:
            # A new producer starts at 0. Taking any first batch let a later one overtake batches
            # refused just before it (NOT_ENOUGH_REPLICAS), which could then never be appended.
            # One forgotten (retention, or past producer_ids_per_partition_max) is told so, and
            # numbers the partition again from 0 under its next epoch.
            return APPEND if base_sequence == 0 else Verdict(ErrorCode.UNKNOWN_PRODUCER_ID, (
                f"no state for producer {producer_id} (new, or forgotten: its batches were removed, or more "
                f"producers wrote since): its first batch must start at sequence 0, not {base_sequence}"))
        if producer_epoch < entry.epoch:
            return Verdict(ErrorCode.INVALID_PRODUCER_EPOCH,
                           f"producer {producer_id} epoch {producer_epoch} is older than {entry.epoch}")
        if producer_epoch > entry.epoch:
            return APPEND if base_sequence == 0 else Verdict(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"a new producer epoch must start at sequence 0, got {base_sequence}")
        last_sequence = base_sequence + record_count - 1
        for mark in entry.batches:
            if mark.base_sequence == base_sequence and mark.last_sequence == last_sequence:
                if mark.crc != crc:
                    return Verdict(ErrorCode.DUPLICATE_SEQUENCE_NUMBER, (
                        f"producer {producer_id} epoch {producer_epoch} sequences "
                        f"{base_sequence}..{last_sequence} are taken by a stored batch with other records "
                        f"(CRC {mark.crc:#010x}, not {crc:#010x}): not stored"))
                return Verdict(ErrorCode.DUPLICATE_SEQUENCE_NUMBER, "duplicate batch", mark)
        expected = entry.batches[-1].last_sequence + 1 if entry.batches else 0
        if base_sequence != expected:
            return Verdict(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                           f"producer {producer_id} sent sequence {base_sequence}, expected {expected}")
        return APPEND

    def record(self, producer_id: int, producer_epoch: int, base_sequence: int, record_count: int, crc: int,
               base_offset: int) -> None:
        """Remember an appended batch (leader after append; follower after replication)."""
        if producer_id < 0:
            return
        entry = self._producers.pop(producer_id, None)  # put back last: the most recent writer
        if entry is None or producer_epoch > entry.epoch:
            if entry is None and len(self._producers) >= self.producers_max:
                del self._producers[next(iter(self._producers))]
            entry = ProducerEntry(producer_epoch)
        self._producers[producer_id] = entry
        batches = entry.batches
        batches.append(BatchMark(base_sequence, base_sequence + record_count - 1,
                                 base_offset, base_offset + record_count - 1, crc))
        if len(batches) > BATCHES_REMEMBERED_MAX:
            del batches[0]

    def truncate(self, end_offset: int) -> None:
        """Forget batches at or past `end_offset` (the log was truncated there)."""
        for producer_id in list(self._producers):
            entry = self._producers[producer_id]
            kept = [mark for mark in entry.batches if mark.last_offset < end_offset]
            if not kept:
                del self._producers[producer_id]
                continue
            entry.batches = kept
