"""Which partition a produced record goes to: Kafka's default choice, bit for bit.

This module owns the producer-side partition choice:

* keyed records go to `toPositive(murmur2(key)) % partition_count`, exactly as the Java client's
  `BuiltInPartitioner.partitionForKey` does, so a railmq producer and a Kafka producer put the same
  key on the same partition (same key, same partition, same order);
* keyless records use the sticky partitioner of KIP-480 (stay on one partition until the batch
  being filled there is sent, then switch at random to another one), or plain round robin.

Invariants: `murmur2` returns exactly the signed 32-bit int Java's `Utils.murmur2` returns (Java's
wrapping `int` arithmetic is emulated with 32-bit masks); every partition returned is in
`[0, partition_count)`; every cache and per-topic table is bounded. Nothing here reads a clock or
global randomness: the sticky partitioner is given its `random.Random`.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence

__all__ = [
    "CACHED_KEY_BYTES_MAX",
    "KEY_CACHE_ENTRIES_MAX",
    "TRACKED_TOPICS_MAX",
    "InvalidPartitionCount",
    "KeyPartitioner",
    "PartitionerError",
    "RoundRobinPartitioner",
    "StickyPartitioner",
    "murmur2",
    "partition_for_key",
    "to_positive",
]

# Hot keys repeat (a user id, an order id), so remembering recent hashes saves most of the work;
# 4096 entries of short keys cost well under a megabyte.
KEY_CACHE_ENTRIES_MAX = 4096
# Long keys are rare and costly to keep; past this size a key is hashed every time, never cached.
CACHED_KEY_BYTES_MAX = 128
# A producer writes to a handful of topics; the bound only stops a topic-per-record pattern from
# growing the per-topic tables without limit (forgetting a topic's state is harmless).
TRACKED_TOPICS_MAX = 10_000

_SIGN_BIT_32 = 0x80000000
_SEED = 0x9747B28C  # Utils.murmur2's seed
_MIX = 0x5BD1E995  # murmur2's multiplier 'm'
_POSITIVE_MASK = 0x7FFFFFFF  # Utils.toPositive: clear the sign bit (not abs())

# One little-endian struct per key length in words, built once: keys up to 1 KiB need no format
# parsing on the hot path.
_WORD_STRUCTS_CACHED_MAX = 256
_WORD_STRUCTS = [struct.Struct(f"<{count}I") for count in range(_WORD_STRUCTS_CACHED_MAX + 1)]


class PartitionerError(Exception):
    """Base of the errors this module raises."""


class InvalidPartitionCount(PartitionerError, ValueError):
    """A topic was said to have zero or fewer partitions: there is nothing to choose from."""

    def __init__(self, partition_count: int) -> None:
        self.partition_count = partition_count
        super().__init__(f"partition count must be at least 1, got {partition_count}")


def _check_partition_count(partition_count: int) -> None:
    if partition_count < 1:
        raise InvalidPartitionCount(partition_count)


def murmur2(data: bytes) -> int:
    """The 32-bit murmur2 hash of `data`, as the signed int Kafka's `Utils.murmur2` returns.

    Words are read little-endian, four bytes at a time; the 1-3 trailing bytes are folded in the
    same little-endian order before the last multiply, as Java's fall-through `switch` does.
    The 32-bit mask is written as a literal (a constant in the bytecode, no global lookup): this
    runs once per keyed record.
    """
    length = len(data)
    mix = _MIX
    h = _SEED ^ length
    word_count = length >> 2
    if word_count:
        if word_count <= _WORD_STRUCTS_CACHED_MAX:
            words = _WORD_STRUCTS[word_count]
        else:
            words = struct.Struct(f"<{word_count}I")
        for k in words.unpack_from(data):
            # Java: k *= m; k ^= k >>> 24; k *= m; h *= m; h ^= k -- masked once where it matters.
            k = (k * mix) & 0xFFFFFFFF
            h = ((h * mix) ^ ((k ^ (k >> 24)) * mix)) & 0xFFFFFFFF
    tail_length = length & 3
    if tail_length:
        h = ((h ^ int.from_bytes(data[length - tail_length:], "little")) * mix) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * mix) & 0xFFFFFFFF
    h ^= h >> 15
    return h - 0x100000000 if h & _SIGN_BIT_32 else h


def to_positive(number: int) -> int:
    """Kafka's `Utils.toPositive`: the sign bit cleared, so -1 becomes 2**31 - 1 (not 1)."""
    return number & _POSITIVE_MASK


def partition_for_key(key: bytes, partition_count: int) -> int:
    """The partition Kafka's default partitioner picks for a keyed record."""
    _check_partition_count(partition_count)
    return (murmur2(key) & _POSITIVE_MASK) % partition_count


class KeyPartitioner:
    """`partition_for_key` with a bounded cache of recent keys' hashes.

    The cache holds the key's positive hash, not a partition, so it stays right when a topic
    gains partitions. When full it is emptied in one step (no LRU bookkeeping on the hot path);
    keys longer than `cached_key_bytes_max`, and non-`bytes` keys, are never cached.
    """

    def __init__(
        self,
        key_cache_entries_max: int = KEY_CACHE_ENTRIES_MAX,
        cached_key_bytes_max: int = CACHED_KEY_BYTES_MAX,
    ) -> None:
        if key_cache_entries_max < 1:
            raise ValueError(f"key_cache_entries_max must be at least 1, got {key_cache_entries_max}")
        self.key_cache_entries_max = key_cache_entries_max
        self.cached_key_bytes_max = cached_key_bytes_max
        self._positive_hashes: dict[bytes, int] = {}

    @property
    def cached_key_count(self) -> int:
        return len(self._positive_hashes)

    def partition(self, key: bytes, partition_count: int) -> int:
        if partition_count < 1:
            raise InvalidPartitionCount(partition_count)
        cache = self._positive_hashes
        positive_hash = cache.get(key) if type(key) is bytes else None
        if positive_hash is None:
            positive_hash = murmur2(key) & _POSITIVE_MASK
            if type(key) is bytes and len(key) <= self.cached_key_bytes_max:
                if len(cache) >= self.key_cache_entries_max:
                    cache.clear()
                cache[key] = positive_hash
        return positive_hash % partition_count


def _eligible_partitions(partition_count: int, available: Sequence[int]) -> Sequence[int]:
    """The partitions worth sending to: the available ones that exist, else all of them.

    Like Kafka, an empty (or wholly stale) availability list means "no information", not "nowhere".
    """
    in_range = [partition for partition in available if 0 <= partition < partition_count]
    return in_range if in_range else range(partition_count)


class StickyPartitioner:
    """KIP-480's sticky choice for keyless records: fill one batch at a time.

    `partition()` returns the topic's current sticky partition for every record. When the
    producer sends the batch it was filling there, it calls `on_batch_sent()`, which moves the
    topic to a different partition chosen at random (among `available` ones when given). Sticking
    makes batches fuller and fewer than spreading each record, at the same long-run spread.
    """

    def __init__(self, rng: random.Random, tracked_topics_max: int = TRACKED_TOPICS_MAX) -> None:
        self._rng = rng
        self.tracked_topics_max = tracked_topics_max
        self._sticky_partitions: dict[str, int] = {}

    @property
    def tracked_topic_count(self) -> int:
        return len(self._sticky_partitions)

    def partition(self, topic: str, partition_count: int, available: Sequence[int] = ()) -> int:
        _check_partition_count(partition_count)
        current = self._sticky_partitions.get(topic)
        if current is None or current >= partition_count:
            return self._switch(topic, partition_count, available, leaving=current)
        return current

    def on_batch_sent(
        self, topic: str, sent_partition: int, partition_count: int, available: Sequence[int] = ()
    ) -> int:
        """Move the topic off `sent_partition`; returns the new sticky partition.

        A stale call (the topic already moved off `sent_partition`) changes nothing, as in Kafka's
        `StickyPartitionCache.nextPartition`.
        """
        _check_partition_count(partition_count)
        current = self._sticky_partitions.get(topic)
        if current is not None and current != sent_partition and current < partition_count:
            return current
        return self._switch(topic, partition_count, available, leaving=sent_partition)

    def _switch(self, topic: str, partition_count: int, available: Sequence[int], leaving: int | None) -> int:
        eligible = _eligible_partitions(partition_count, available)
        candidates = [partition for partition in eligible if partition != leaving] or list(eligible)
        chosen = candidates[self._rng.randrange(len(candidates))]
        if topic not in self._sticky_partitions and len(self._sticky_partitions) >= self.tracked_topics_max:
            self._sticky_partitions.clear()
        self._sticky_partitions[topic] = chosen
        return chosen


class RoundRobinPartitioner:
    """Kafka's `RoundRobinPartitioner`: each record of a topic goes to the next partition in turn.

    With `available` given, the turn goes through the available partitions only.
    """

    def __init__(self, tracked_topics_max: int = TRACKED_TOPICS_MAX) -> None:
        self.tracked_topics_max = tracked_topics_max
        self._counters: dict[str, int] = {}

    @property
    def tracked_topic_count(self) -> int:
        return len(self._counters)

    def partition(self, topic: str, partition_count: int, available: Sequence[int] = ()) -> int:
        _check_partition_count(partition_count)
        counter = self._counters.get(topic)
        if counter is None:
            if len(self._counters) >= self.tracked_topics_max:
                self._counters.clear()
            counter = 0
        self._counters[topic] = (counter + 1) & _POSITIVE_MASK
        eligible = _eligible_partitions(partition_count, available)
        return eligible[counter % len(eligible)]
