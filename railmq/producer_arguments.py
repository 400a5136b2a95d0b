"""What `Producer.send` and `send_batch` take from their caller, checked at the call.

A wrong type is a TypeError here, in the caller's thread: passed on, a topic that was not a str
ended the I/O thread (its metadata request's `len(None)`), and every later send timed out; a
float timestamp or partition was truncated without a word. Each check costs the common case one
class comparison (railmq/producer.py calls the fuller one only when that fails).
"""

from __future__ import annotations

from typing import Any

from actors.errors import ErrorCode, RailmqError
from actors.messages import INT64_MAX
from railmq.records import integer


def checked_timestamp(timestamp_ms: Any) -> int:
    """A record's timestamp as a batch holds it: an int64 of milliseconds, never negative (Kafka's
    producer refuses a negative one at send). An int, not coerced: 1.9 was sent as 1, "12" as 12."""
    timestamp = integer(timestamp_ms, "timestamps")
    if not 0 <= timestamp <= INT64_MAX:
        raise RailmqError(ErrorCode.INVALID_TIMESTAMP,
                          f"timestamp_ms must be 0 to {INT64_MAX} (milliseconds since 1970), "
                          f"got {timestamp_ms}")
    return timestamp


def as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"keys and values must be bytes, str or None, not {type(value).__name__}")


def checked_topic(topic: Any) -> str:
    """A topic name must be a str: any other value would reach the I/O thread's metadata request
    and end the thread there (its `len(None)` did), failing every later send."""
    if topic.__class__ is not str:
        raise TypeError(f"a topic name is a str, not {type(topic).__name__}")
    return topic


def checked_partition(partition: Any, count: int, topic: str) -> int:
    """An explicit partition is an int (not a bool, a float or a str) in 0..count-1."""
    if partition.__class__ is not int:
        raise TypeError(f"a partition is an int, not {type(partition).__name__}")
    if not 0 <= partition < count:
        raise RailmqError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                          f"{topic} has partitions 0..{count - 1}, not {partition}")
    return partition


def checked_headers(headers: Any) -> list[tuple[str, bytes]]:
    """Headers are a list of (str name, value) pairs, as Kafka's are; a bytes name is refused, not
    sent as its repr ("b'name'")."""
    if isinstance(headers, (str, bytes, bytearray, memoryview)):
        raise TypeError("headers are a list of (name, value) pairs, not a string")
    out = []
    for header in headers:
        if not isinstance(header, (tuple, list)) or len(header) != 2 or header[0].__class__ is not str:
            raise TypeError(f"a header is a (str name, bytes value) pair, not {header!r:.80}")
        out.append((header[0], as_bytes(header[1]) or b""))
    return out
