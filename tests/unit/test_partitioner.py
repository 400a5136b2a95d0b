"""The producer's partition choice: Kafka-identical key hashing, sticky and round-robin spreading."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from railmq.partitioner import (
    InvalidPartitionCount,
    KeyPartitioner,
    RoundRobinPartitioner,
    StickyPartitioner,
    murmur2,
    partition_for_key,
    to_positive,
)

# Kafka's own vectors: clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java,
# testMurmur2. They cover a 2-byte tail, a 2-byte tail after one word, whole words only
# (24 bytes), a 2-byte tail after six words, 48 bytes, and a 3-byte tail with no whole word.
KAFKA_UTILS_TEST_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]

# Edges the Kafka vectors miss: the empty key, every tail length, and bytes >= 0x80 (which Java
# reads as negative bytes and must mask with 0xff). Values computed by the Java client's
# algorithm under the JVM's own wrapping int arithmetic; the short digit strings also appear in
# other Kafka-compatible clients' test suites.
JVM_COMPUTED_VECTORS = [
    (b"", 275646681),
    (bytes.fromhex("00"), 375494588),
    (bytes.fromhex("ff"), -311467685),
    (bytes.fromhex("ffff"), -1642832928),
    (bytes.fromhex("ffffff"), 1548199422),
    (bytes.fromhex("ffffffff"), 644171429),
    (bytes.fromhex("8081828384"), -1665622439),
    (bytes.fromhex("000102030405060708"), 1671170726),
    (bytes.fromhex("f0e1d2c3b4a5968778695a4b3c2d1e0f"), 1592711084),
    (bytes.fromhex("7f800180fe"), 2122874695),
    (b"1", -1993445489),
    (b"12", 126087238),
    (b"123", -267702483),
    (b"1234", -1614185708),
    (b"12345", -1188365604),
]


@pytest.mark.parametrize(("key", "expected"), KAFKA_UTILS_TEST_VECTORS + JVM_COMPUTED_VECTORS)
def test_murmur2_matches_the_java_client(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_murmur2_accepts_other_bytes_like_inputs() -> None:
    assert murmur2(bytearray(b"foobar")) == -790332482
    assert murmur2(memoryview(b"a-little-bit-longer-string")) == -1486304829


def test_murmur2_hashes_keys_longer_than_the_prebuilt_word_layouts() -> None:
    # 2 KiB of one repeated byte: exercises the path that builds its struct on demand.
    long_key = b"\xab" * 2048 + b"xy"
    assert murmur2(long_key) == murmur2(bytes(long_key))
    assert murmur2(long_key) != murmur2(long_key[:-1])
    assert -(2**31) <= murmur2(long_key) < 2**31


def test_to_positive_clears_the_sign_bit_instead_of_taking_the_absolute_value() -> None:
    assert to_positive(-1) == 2**31 - 1
    assert to_positive(-973932308) == 1173551340
    assert to_positive(479470107) == 479470107


@pytest.mark.parametrize(("key", "expected_hash"), KAFKA_UTILS_TEST_VECTORS)
@pytest.mark.parametrize("partition_count", [1, 3, 7, 12, 100])
def test_partition_for_key_is_kafkas_default_choice(
    key: bytes, expected_hash: int, partition_count: int
) -> None:
    assert partition_for_key(key, partition_count) == (expected_hash & 0x7FFFFFFF) % partition_count


def test_a_negative_hash_is_not_mapped_through_abs() -> None:
    # "21" hashes negative; abs() would give 973932308 % 10 == 8, Kafka gives 1173551340 % 10 == 0.
    assert partition_for_key(b"21", 10) == 0


@pytest.mark.parametrize("partition_count", [0, -1])
def test_a_topic_without_partitions_is_a_typed_error(partition_count: int) -> None:
    with pytest.raises(InvalidPartitionCount):
        partition_for_key(b"k", partition_count)
    with pytest.raises(InvalidPartitionCount):
        KeyPartitioner().partition(b"k", partition_count)
    with pytest.raises(InvalidPartitionCount):
        StickyPartitioner(random.Random(1)).partition("t", partition_count)
    with pytest.raises(InvalidPartitionCount):
        RoundRobinPartitioner().partition("t", partition_count)


@given(key=st.binary(max_size=300), partition_count=st.integers(min_value=1, max_value=10_000))
def test_keyed_partition_is_in_range_and_deterministic(key: bytes, partition_count: int) -> None:
    hashed = murmur2(key)
    assert -(2**31) <= hashed < 2**31
    assert murmur2(key) == hashed
    partition = partition_for_key(key, partition_count)
    assert 0 <= partition < partition_count
    assert partition == partition_for_key(bytes(key), partition_count)


@given(keys=st.lists(st.binary(max_size=200), max_size=60), partition_count=st.integers(1, 64))
def test_the_caching_key_partitioner_agrees_with_the_plain_function(
    keys: list[bytes], partition_count: int
) -> None:
    partitioner = KeyPartitioner(key_cache_entries_max=8, cached_key_bytes_max=100)
    for _ in range(2):  # the second pass is served from the cache where it can be
        for key in keys:
            assert partitioner.partition(key, partition_count) == partition_for_key(key, partition_count)


def test_the_key_cache_stays_within_its_bound() -> None:
    partitioner = KeyPartitioner(key_cache_entries_max=16)
    for number in range(1000):
        partitioner.partition(number.to_bytes(4, "big"), 12)
        assert partitioner.cached_key_count <= 16
    assert partitioner.cached_key_count > 0


def test_long_and_mutable_keys_are_never_cached() -> None:
    partitioner = KeyPartitioner(cached_key_bytes_max=8)
    partitioner.partition(b"x" * 9, 5)
    partitioner.partition(bytearray(b"short"), 5)
    assert partitioner.cached_key_count == 0
    partitioner.partition(b"x" * 8, 5)
    assert partitioner.cached_key_count == 1


def test_a_cached_key_follows_a_topic_that_gained_partitions() -> None:
    partitioner = KeyPartitioner()
    for partition_count in (3, 12, 7, 3):
        expected = partition_for_key(b"foobar", partition_count)
        assert partitioner.partition(b"foobar", partition_count) == expected


def test_keys_spread_over_all_partitions() -> None:
    counts = [0] * 8
    for number in range(8000):
        counts[partition_for_key(f"user-{number}".encode(), 8)] += 1
    assert min(counts) > 800  # 1000 expected per partition


def test_sticky_partitioner_keeps_one_partition_until_the_batch_is_sent() -> None:
    sticky = StickyPartitioner(random.Random(5))
    first = sticky.partition("orders", 6)
    assert all(sticky.partition("orders", 6) == first for _ in range(100))
    moved_to = sticky.on_batch_sent("orders", first, 6)
    assert moved_to != first
    assert all(sticky.partition("orders", 6) == moved_to for _ in range(100))


def test_sticky_partitioner_ignores_a_stale_batch_sent_notice() -> None:
    sticky = StickyPartitioner(random.Random(5))
    first = sticky.partition("orders", 6)
    second = sticky.on_batch_sent("orders", first, 6)
    assert sticky.on_batch_sent("orders", first, 6) == second
    assert sticky.partition("orders", 6) == second


def test_sticky_partitioner_visits_every_partition_over_many_batches() -> None:
    sticky = StickyPartitioner(random.Random(11))
    visited = {sticky.partition("t", 5)}
    for _ in range(200):
        visited.add(sticky.on_batch_sent("t", sticky.partition("t", 5), 5))
    assert visited == {0, 1, 2, 3, 4}


def test_sticky_partitioner_is_reproducible_from_its_seed() -> None:
    def sequence(seed: int) -> list[int]:
        sticky = StickyPartitioner(random.Random(seed))
        chosen = [sticky.partition("t", 9)]
        for _ in range(30):
            chosen.append(sticky.on_batch_sent("t", chosen[-1], 9))
        return chosen

    assert sequence(3) == sequence(3)
    assert sequence(3) != sequence(4)


def test_sticky_partitioner_with_one_partition_stays_on_it() -> None:
    sticky = StickyPartitioner(random.Random(2))
    assert sticky.partition("t", 1) == 0
    assert sticky.on_batch_sent("t", 0, 1) == 0


def test_sticky_partitioner_only_moves_to_available_partitions() -> None:
    sticky = StickyPartitioner(random.Random(8))
    chosen = {sticky.partition("t", 10, available=[2, 7])}
    for _ in range(50):
        chosen.add(sticky.on_batch_sent("t", sticky.partition("t", 10), 10, available=[2, 7]))
    assert chosen == {2, 7}


def test_sticky_partitioner_leaves_a_partition_that_no_longer_exists() -> None:
    sticky = StickyPartitioner(random.Random(1))
    assert sticky.partition("t", 50, available=[40]) == 40
    # the topic is now said to have 4 partitions: partition 40 is no longer a place to write
    assert sticky.partition("t", 4) in range(4)


def test_sticky_partitioner_tracks_topics_separately_and_boundedly() -> None:
    sticky = StickyPartitioner(random.Random(4), tracked_topics_max=3)
    a = sticky.partition("a", 100)
    sticky.on_batch_sent("b", sticky.partition("b", 100), 100)
    assert sticky.partition("a", 100) == a
    for number in range(20):
        sticky.partition(f"topic-{number}", 4)
        assert sticky.tracked_topic_count <= 3


def test_round_robin_cycles_through_partitions_per_topic() -> None:
    round_robin = RoundRobinPartitioner()
    assert [round_robin.partition("a", 3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [round_robin.partition("b", 2) for _ in range(3)] == [0, 1, 0]
    assert round_robin.partition("a", 3) == 1


def test_round_robin_cycles_through_available_partitions_only() -> None:
    round_robin = RoundRobinPartitioner()
    assert [round_robin.partition("a", 6, available=[1, 4]) for _ in range(4)] == [1, 4, 1, 4]
    # availability entries outside the topic are ignored; none left means "use all"
    assert round_robin.partition("c", 2, available=[5, 9]) == 0


def test_round_robin_bounds_its_per_topic_counters() -> None:
    round_robin = RoundRobinPartitioner(tracked_topics_max=2)
    for number in range(10):
        round_robin.partition(f"topic-{number}", 3)
        assert round_robin.tracked_topic_count <= 2
