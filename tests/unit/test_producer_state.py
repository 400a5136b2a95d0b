"""The leader's idempotent-producer table is bounded in bytes, and an attacker's invented producer
ids push out the producers that wrote least recently, not an active one.

A batch header's producer id is the client's claim: any client can send batches under as many
ids as it likes, and every replica of the partition remembers each (followers rebuild the table
from the batches they copy)."""

from __future__ import annotations

import tracemalloc

from actors.errors import ErrorCode
from actors.limits import DEFAULT_LIMITS
from actors.producer_state import ProducerStateTable


def crc_of(producer_id: int, sequence: int) -> int:
    """A batch's CRC: 32 bits, a different one for each batch."""
    return (producer_id * 2_654_435_761 + sequence * 40_503) & 0xFFFF_FFFF


def test_a_client_inventing_producer_ids_makes_a_partition_hold_a_bounded_number_of_bytes():
    tracemalloc.start()
    try:
        table = ProducerStateTable(DEFAULT_LIMITS.producer_ids_per_partition_max)
        before = tracemalloc.get_traced_memory()[0]
        for producer_id in range(1, 150_001):
            for sequence in range(5 if producer_id % 3 == 0 else 1):
                table.record(producer_id, 0, sequence, 1, crc_of(producer_id, sequence),
                             producer_id * 5 + sequence)
        held_mb = (tracemalloc.get_traced_memory()[0] - before) / 2**20
    finally:
        tracemalloc.stop()

    assert len(table) == DEFAULT_LIMITS.producer_ids_per_partition_max
    assert held_mb < 16, f"the table holds {held_mb:.1f} MiB"


def test_the_producer_that_wrote_least_recently_is_forgotten_first():
    table = ProducerStateTable(100)
    table.record(77, 0, 0, 1, crc_of(77, 0), 0)
    offset = 1
    for producer_id in range(1000, 1500):
        table.record(producer_id, 0, 0, 1, crc_of(producer_id, 0), offset)
        offset += 1
        if producer_id % 50 == 0:  # the active producer writes every 50 of the attacker's ids
            sequence = (producer_id - 1000) // 50 + 1
            table.record(77, 0, sequence, 1, crc_of(77, sequence), offset)
            offset += 1

    retry = table.check(77, 0, 10, 1, crc_of(77, 10))
    forgotten = table.check(1001, 0, 0, 1, crc_of(1001, 0))

    assert retry.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and retry.duplicate_of is not None
    assert forgotten.error == ErrorCode.NONE and forgotten.duplicate_of is None, "1001 was forgotten: a new producer"
    assert len(table) == 100


def test_a_batch_under_remembered_numbers_is_a_retry_only_if_it_is_the_same_batch():
    table = ProducerStateTable(100)
    table.record(77, 0, 0, 3, 0x1234_5678, 40)

    retry = table.check(77, 0, 0, 3, 0x1234_5678)
    other = table.check(77, 0, 0, 3, 0x8765_4321)

    assert retry.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and retry.duplicate_of.base_offset == 40
    assert other.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and other.duplicate_of is None
    assert "other records" in other.message
