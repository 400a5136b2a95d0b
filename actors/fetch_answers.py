"""What of a fetch answer a consumer takes: the leading whole batches that are what was asked for.

A header is a claim, and a leader may be stale, confused or hostile: each batch of the answer is
checked against the request (the position asked for, `max_bytes`) and the answer itself (its
high watermark, the batches before it) before a consumer hands it on. actors/consumer_client.py
takes the prefix that passes and fetches the rest again; an unparsable header ends the readable
part for good (the shell holds the partition, see that module's docstring).
"""

from __future__ import annotations

from typing import NamedTuple

from storage.batch import BatchHeader, iter_batches
from storage.errors import StorageError


class FetchedPrefix(NamedTuple):
    size: int  # bytes of the leading whole batches the consumer takes
    last: BatchHeader | None  # the last of them (None: none taken)
    unreadable: str  # why the batch after them does not parse ("" when it does)
    refused: str  # why the batch after them is not taken although it parses ("" when none is refused)


def readable_batches(records: bytes | memoryview, position: int = 0, high_watermark: int | None = None,
                     max_bytes: int | None = None) -> FetchedPrefix:
    """The leading whole batches of a fetch answer that are what was asked for: a header is a
    claim, so each batch is checked against the request and the answer itself. The first batch
    must end after `position` (it may start before: it holds the offset), each later one must
    start at or after the end of the one before (gaps are fine, overlaps are not), none may end
    past the answer's high watermark, and after the first the whole must fit `max_bytes` (a
    first batch larger than that comes whole, as Kafka's fetches do). The batches not taken are
    fetched again from the new position; an unparsable header ends the readable part for good."""
    size, last, expected = 0, None, position
    try:
        for start, header in iter_batches(records, verify=False):
            refused = _refusal(header, start, last, expected, high_watermark, max_bytes)
            if refused:
                return FetchedPrefix(size, last, "", refused)
            size, last, expected = start + header.size, header, header.next_offset
    except StorageError as error:
        return FetchedPrefix(size, last, str(error), "")
    return FetchedPrefix(size, last, "", "")


def _refusal(header: BatchHeader, start: int, last: BatchHeader | None, expected: int,
             high_watermark: int | None, max_bytes: int | None) -> str:
    if header.next_offset <= expected:
        return f"the batch at offset {header.base_offset} ends at {header.next_offset}, not after {expected}"
    if last is not None and header.base_offset < expected:
        return f"the batch at offset {header.base_offset} overlaps the one before, which ends at {expected}"
    if high_watermark is not None and header.next_offset > high_watermark:
        return (f"the batch at offset {header.base_offset} ends at {header.next_offset}, "
                f"past the answer's high watermark {high_watermark}")
    if max_bytes is not None and last is not None and start + header.size > max_bytes:
        return f"the answer holds more than the {max_bytes} bytes asked for"
    return ""
