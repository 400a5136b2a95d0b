"""`topics create` and `add-partitions` wait for leaders with a bound that grows with what must start,
and say how far they got when it passes (railmq/admin.py's wait_for_leaders, railmq/cli_topics.py)."""

from __future__ import annotations

import argparse

import pytest

from actors.errors import ErrorCode, RailmqError
from actors.messages import PartitionMetadata, TopicMetadata
from railmq.admin import Admin
from railmq.cli_topics import wait_bound_s


class SlowStart(Admin):
    """An admin whose cluster gives one more partition a leader at every look."""

    def __init__(self, partitions: int, stuck_at: int | None = None) -> None:
        self.partitions, self.stuck_at, self.looks = partitions, stuck_at, 0

    def describe_topic(self, name: str) -> TopicMetadata:
        self.looks += 1
        led = min(self.partitions, self.looks if self.stuck_at is None else self.stuck_at)
        return TopicMetadata(name=name, partitions=[
            PartitionMetadata(partition=index, leader=1 if index < led else -1, replicas=[1], isr=[1],
                              leader_endpoint="tcp://127.0.0.1:1" if index < led else "")
            for index in range(self.partitions)])


def test_the_wait_reports_progress_until_every_partition_has_a_leader():
    seen = []
    SlowStart(4).wait_for_leaders("orders", 10, on_progress=lambda ready, total: seen.append((ready, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_a_wait_that_runs_out_says_the_topic_exists_and_how_many_partitions_are_led():
    with pytest.raises(RailmqError) as refused:
        SlowStart(5, stuck_at=2).wait_for_leaders("orders", 0.2)
    assert refused.value.code == ErrorCode.LEADER_NOT_AVAILABLE and refused.value.retriable
    assert "exists" in str(refused.value) and "only 2 of 5 partitions" in str(refused.value)


def test_the_default_bound_grows_with_the_replica_processes_to_start():
    assert wait_bound_s(argparse.Namespace(wait_s=None), 1, 3) == pytest.approx(30.6)
    assert wait_bound_s(argparse.Namespace(wait_s=None), 100, 3) == pytest.approx(90.0)
    assert wait_bound_s(argparse.Namespace(wait_s=7), 100, 3) == 7
