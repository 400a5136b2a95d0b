"""Helpers for storage tests (a plain module: test files import it by name)."""

from __future__ import annotations

from storage.batch import encode_batch, iter_batches


def make_batch(record_count: int = 1, value_bytes: int = 8, timestamp_ms: int = 1_000, *, tag: int = 0) -> bytearray:
    """A producer batch of `record_count` records; `tag` makes the payload distinct."""
    value = bytes([tag % 256]) * value_bytes
    records = [(index, f"k{tag}".encode(), value, None) for index in range(record_count)]
    return encode_batch(records, timestamp_ms)


def offsets_of(data: bytes) -> list[tuple[int, int]]:
    """(base_offset, last_offset) of each batch in concatenated batches (CRC-checked)."""
    return [(header.base_offset, header.last_offset) for _, header in iter_batches(data)]
