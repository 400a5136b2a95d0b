"""The sparse index is held in memory for every segment a replica keeps, so its bytes per entry
bound what a partition's data costs in memory (storage/index.py).

One entry per `index_interval_bytes` (4 KiB) of batches: as three Python lists of int objects an
entry took ~112 bytes, 2.7% of the data, so a topic kept for ever (`retention_ms` unset) that had
written 600 GB held ~16 GB of index in its replica's memory, before its disk was full.
"""

from __future__ import annotations

import sys

from storage.batch import parse_header
from storage.index import SparseIndex
from tests.storage.storage_helpers import make_batch

ENTRIES = 10_000
ENTRY_BYTES_MAX = 32  # three int64 columns, and the slack of growing them


def index_bytes(index: SparseIndex) -> int:
    """What the index's columns hold: the containers and every object in them."""
    total = 0
    for column in (index.offsets, index.positions, index.prior_max_timestamps):
        total += sys.getsizeof(column)
        if isinstance(column, list):
            total += sum(sys.getsizeof(value) for value in column)
    return total


def test_an_index_entry_costs_a_few_int64s_of_memory_not_python_objects():
    index = SparseIndex(interval_bytes=1)
    header = parse_header(make_batch(1))
    size = header.size
    for number in range(ENTRIES):
        stamped = header._replace(base_offset=10**12 + number, max_timestamp_ms=1_700_000_000_000 + number)
        index.add(number * size, stamped)

    assert len(index.offsets) == ENTRIES
    assert index_bytes(index) <= ENTRIES * ENTRY_BYTES_MAX, (
        f"{index_bytes(index) / ENTRIES:.0f} bytes an entry")
    assert index.floor_position(10**12 + 5_000) == 5_000 * size
    later = 1_700_000_000_000 + 7_000
    assert index.floor_entry_for_timestamp(later) == (7_000 * size, later - 1)
