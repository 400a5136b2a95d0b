"""The CLI's pure parts, without a cluster: lag arithmetic, hot partitions, reset plans, commit
policies, record rendering, topic configs and argument errors."""

from __future__ import annotations

import base64
import json
import threading

import pytest

from actors.errors import ErrorCode, RailmqError
from actors.messages import (
    DescribeGroupResponse, MemberDescription, OffsetEntry, PartitionMetadata, TopicConfig, TopicMetadata,
)
from railmq import cli
from railmq.cli_common import record_to_dict, record_to_line
from railmq.cli_topics import topic_config
from railmq.lag import (
    HotRule, ResetTarget, arrival_rates, build_group_lag, hot_flags, lag_messages, lag_seconds,
    measure_group_lag, plan_reset,
)
from railmq.member_process import (
    GroupMember, MemberOptions, check_options, load_handler, parse_commit_every,
)
from railmq.records import ConsumerRecord, TopicPartition


# --------------------------------------------------------------------------- lag arithmetic


def test_lag_is_high_watermark_minus_commit_and_unknown_without_either():
    assert lag_messages(committed=40, log_end=100) == 60
    assert lag_messages(committed=100, log_end=100) == 0
    assert lag_messages(committed=120, log_end=100) == 0  # a commit past the end is not negative lag
    assert lag_messages(committed=None, log_end=100) is None
    assert lag_messages(committed=5, log_end=None) is None


def test_lag_seconds_is_the_age_of_the_oldest_unconsumed_record():
    assert lag_seconds(now_ms=10_000, lag=5, oldest_unconsumed_timestamp_ms=7_500) == 2.5
    assert lag_seconds(now_ms=10_000, lag=0, oldest_unconsumed_timestamp_ms=None) == 0.0
    assert lag_seconds(now_ms=10_000, lag=5, oldest_unconsumed_timestamp_ms=None) is None
    assert lag_seconds(now_ms=10_000, lag=5, oldest_unconsumed_timestamp_ms=12_000) == 0.0  # clock skew


def test_a_partition_is_hot_only_far_above_the_median_of_the_others_and_above_the_floor():
    assert hot_flags([500, 20, 30, 25], ratio=3, minimum=100) == [True, False, False, False]
    assert hot_flags([90, 1, 1], ratio=3, minimum=100) == [False, False, False]  # under the floor
    assert hot_flags([500, 400, 450], ratio=3, minimum=100) == [False, False, False]  # none stands out
    assert hot_flags([500], ratio=3, minimum=100) == [False]  # nothing to compare with
    assert hot_flags([500, None, 10], ratio=3, minimum=100) == [True, False, False]


def test_arrival_rate_is_growth_per_second_over_the_sample():
    rates = arrival_rates({"a": 10, "b": 0}, {"a": 110, "b": 5}, elapsed_ms=500)
    assert rates == {"a": 200.0, "b": 10.0}
    assert arrival_rates({"a": 1}, {"a": 2}, elapsed_ms=0) == {}


def _description(**fields) -> DescribeGroupResponse:
    return DescribeGroupResponse(correlation_id=1, group_id="g", **fields)


def test_group_lag_joins_commits_assignments_and_log_ends_per_partition():
    description = _description(
        state="Stable", generation=4, protocol_name="range",
        members=[MemberDescription(member_id="worker-1-abc", client_id="worker-1",
                                   assignment=[("t", 0), ("t", 1)]),
                 MemberDescription(member_id="worker-2-def", client_id="worker-2", assignment=[])],
        offsets=[OffsetEntry(topic="t", partition=0, offset=70),
                 OffsetEntry(topic="t", partition=1, offset=10)])
    report = build_group_lag(description, {"t": 3}, {("t", 0): 100, ("t", 1): 10, ("t", 2): 50},
                             {("t", 0): 4_000}, now_ms=10_000)
    rows = {row.partition: row for row in report.partitions}
    # Partition 2 has no commit: a member joining now (auto_offset_reset=latest) starts at its end.
    assert [(row.partition, row.lag_messages) for row in report.partitions] == [(0, 30), (1, 0), (2, 0)]
    assert [row.start_from for row in report.partitions] == ["committed", "committed", "latest"]
    assert (rows[2].start_offset, rows[2].committed_offset) == (50, None)
    assert rows[0].lag_seconds == 6.0 and rows[1].lag_seconds == 0.0 and rows[2].lag_seconds == 0.0
    assert rows[0].member_id == "worker-1-abc" and rows[2].member_id is None
    assert report.total_lag_messages == 30
    idle = [member.member_id for member in report.members if member.idle]
    assert idle == ["worker-2-def"]
    assert report.members[0].lag_messages == 30 and report.members[0].partitions == [("t", 0), ("t", 1)]


def test_a_share_member_whose_partitions_the_answer_left_out_is_not_called_idle():
    description = _description(kind="share", state="Stable", members=[
        MemberDescription(member_id="a-1", client_id="a", assignment=[("t", 0)]),
        MemberDescription(member_id="b-2", client_id="b", assignment=[], assignment_omitted=1)])
    report = build_group_lag(description, {"t": 1}, {("t", 0): 5}, {}, now_ms=0)

    assert [(member.member_id, member.idle) for member in report.members] == [("a-1", False), ("b-2", False)]


def test_a_partition_without_a_commit_is_measured_from_where_the_reset_policy_starts_a_member():
    description = _description(offsets=[OffsetEntry(topic="t", partition=0, offset=4)])
    ends, starts = {("t", 0): 10, ("t", 1): 12}, {("t", 1): 2}
    latest = build_group_lag(description, {"t": 2}, ends, {}, now_ms=0, log_starts=starts)
    earliest = build_group_lag(description, {"t": 2}, ends, {}, now_ms=0, log_starts=starts, reset="earliest")

    assert [(row.start_from, row.start_offset, row.lag_messages) for row in latest.partitions] == [
        ("committed", 4, 6), ("latest", 12, 0)]
    assert [(row.start_from, row.start_offset, row.lag_messages) for row in earliest.partitions] == [
        ("committed", 4, 6), ("earliest", 2, 10)]
    assert (latest.total_lag_messages, earliest.total_lag_messages) == (6, 16)
    assert latest.partitions[1].log_start_offset == 2 and latest.partitions[0].log_start_offset is None
    from railmq.cli_groups import no_commit_notes

    [note] = no_commit_notes(latest)
    assert "skip the 10 records" in note and "--from-beginning" in note
    with pytest.raises(ValueError, match="earliest or latest"):
        build_group_lag(description, {"t": 2}, ends, {}, now_ms=0, reset="none")


def test_group_lag_flags_hot_partitions_by_lag_and_by_arrival_rate_within_a_topic():
    offsets = [OffsetEntry(topic="t", partition=p, offset=0) for p in range(4)]
    offsets += [OffsetEntry(topic="u", partition=0, offset=0), OffsetEntry(topic="u", partition=1, offset=0)]
    ends = {("t", 0): 900, ("t", 1): 30, ("t", 2): 40, ("t", 3): 20, ("u", 0): 5000, ("u", 1): 4000}
    rates = {("t", 0): 1.0, ("t", 1): 1.0, ("t", 2): 2.0, ("t", 3): 90.0}
    report = build_group_lag(_description(offsets=offsets), {"t": 4, "u": 2}, ends, {}, now_ms=0, rates=rates,
                             rule=HotRule(), sample_ms=500)
    hot = {(row.topic, row.partition): row.hot_reasons for row in report.partitions if row.hot}
    assert hot == {("t", 0): ["lag"], ("t", 3): ["rate"]}  # topic u's big lag is shared by both partitions


class FakeGroupClient:
    """The facts `measure_group_lag` gathers, served from memory; the log grows while it sleeps."""

    def __init__(self, ends: dict[int, int], growth: dict[int, int], timestamps: dict[int, int]) -> None:
        self.ends, self.growth, self.timestamps = dict(ends), growth, timestamps
        self.now_ms = 50_000
        self.timestamp_requests: list[tuple[int, int]] = []
        self.committed_topic_id = self.topic_id = 0  # 0: not known (commits older than topic ids)

    def clock_ms(self) -> int:
        return self.now_ms

    def sleep(self, seconds: float) -> None:
        self.now_ms += int(seconds * 1000)
        for partition, added in self.growth.items():
            self.ends[partition] += added

    def describe_group(self, group_id: str) -> DescribeGroupResponse:
        offsets = [OffsetEntry(topic="t", partition=p, offset=10, topic_id=self.committed_topic_id)
                   for p in (0, 1, 2)]
        return _description(state="Empty", offsets=offsets)

    def topic(self, name: str):
        if name != "t":
            raise RailmqError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name)
        return TopicMetadata(name="t", topic_id=self.topic_id,
                             partitions=[PartitionMetadata(partition=p) for p in range(4)])

    def list_offset(self, topic: str, partition: int, timestamp_ms: int) -> int:
        assert timestamp_ms in (-1, -2), "lag is measured against the latest offset (and the earliest without a commit)"
        return self.ends[partition] if timestamp_ms == -1 else 0

    def list_offsets(self, keys: list[tuple[str, int]], timestamp_ms: int) -> dict[tuple[str, int], int]:
        return {key: self.list_offset(key[0], key[1], timestamp_ms) for key in keys}

    def timestamp_at(self, topic: str, partition: int, offset: int) -> int | None:
        self.timestamp_requests.append((partition, offset))
        return self.timestamps.get(partition)


def test_measuring_a_group_samples_arrival_rates_over_the_injected_clock():
    client = FakeGroupClient(ends={0: 30, 1: 20, 2: 10, 3: 5}, growth={0: 500, 1: 10, 2: 5, 3: 20},
                             timestamps={0: 45_000, 1: 47_000})
    report = measure_group_lag(client, "g", sample_ms=1000, sleep=client.sleep)
    rows = {row.partition: row for row in report.partitions}
    assert [rows[p].arrival_rate_per_s for p in range(4)] == [500.0, 10.0, 5.0, 20.0]
    assert [rows[p].lag_messages for p in range(4)] == [520, 20, 5, 0]  # no commit on 3: a new member starts at its end
    assert rows[3].start_from == "latest" and rows[3].log_start_offset == 0
    assert rows[0].hot and rows[0].hot_reasons == ["lag", "rate"]
    assert not any(rows[p].hot for p in (1, 2, 3))
    assert rows[0].lag_seconds == 6.0 and rows[1].lag_seconds == 4.0
    assert sorted(client.timestamp_requests) == [(0, 10), (1, 10), (2, 10)], "only lagging partitions"
    assert report.sample_ms == 1000


def test_a_group_with_commits_on_a_deleted_topic_still_describes():
    description = _description(offsets=[OffsetEntry(topic="gone", partition=0, offset=3)])
    report = build_group_lag(description, {}, {}, {}, now_ms=0)
    assert [(row.topic, row.committed_offset, row.log_end_offset, row.lag_messages)
            for row in report.partitions] == [("gone", 3, None, None)]


def test_commits_of_a_topic_deleted_and_made_again_are_not_measured_against_the_new_one():
    """The group committed offset 10 on partitions 0..2 of the old topic; the new one under the name
    holds 30, 20, 5 and 5 records. Measured against the old commits, the lags were 20, 10 and 0 (5
    records under a commit of 10), while a member starts those partitions from its reset policy
    (trace position-of-a-deleted-topic) and reads all 60."""
    client = FakeGroupClient(ends={0: 30, 1: 20, 2: 5, 3: 5}, growth={}, timestamps={})
    client.committed_topic_id, client.topic_id = 1, 2

    report = measure_group_lag(client, "g", reset="earliest")

    rows = {row.partition: row for row in report.partitions}
    assert [rows[p].committed_offset for p in range(4)] == [None] * 4
    assert [rows[p].lag_messages for p in range(4)] == [30, 20, 5, 5], "from the start, as a member reads"
    assert {rows[p].start_from for p in range(4)} == {"earliest"}


# --------------------------------------------------------------------------- reset plans


@pytest.mark.parametrize("target, committed, at_time, expected", [
    (ResetTarget("earliest"), 50, None, 10),
    (ResetTarget("latest"), 50, None, 90),
    (ResetTarget("timestamp", 1234), 50, 42, 42),
    (ResetTarget("timestamp", 1234), 50, -1, 90),  # nothing at or after that time: the end
    (ResetTarget("shift", -15), 50, None, 35),
    (ResetTarget("shift", -100), 50, None, 10),  # clamped to the log start
    (ResetTarget("shift", 100), 50, None, 90),  # clamped to the end
    (ResetTarget("shift", 5), None, None, 15),  # no commit: shift from the log start
])
def test_reset_plans_stay_within_the_log(target, committed, at_time, expected):
    plan = plan_reset(target, "t", 0, committed=committed, earliest=10, latest=90, at_time=at_time)
    assert (plan.current_offset, plan.new_offset) == (committed, expected)


# --------------------------------------------------------------------------- member options


def test_commit_every_accepts_record_batch_and_milliseconds_only():
    assert parse_commit_every("record").kind == "record"
    assert parse_commit_every("batch").kind == "batch"
    assert parse_commit_every("250ms").interval_ms == 250
    for bad in ("0ms", "ms", "5s", "often", "-3ms"):
        with pytest.raises(ValueError):
            parse_commit_every(bad)


def test_at_most_once_refuses_a_time_based_commit_policy():
    options = MemberOptions(bootstrap="tcp://127.0.0.1:1", group_id="g", topics=["t"],
                            delivery="at-most-once", commit_every="100ms")
    with pytest.raises(ValueError, match="at-least-once"):
        check_options(options)
    check_options(MemberOptions(bootstrap="tcp://127.0.0.1:1", group_id="g", topics=["t"],
                                delivery="at-most-once"))


def test_handlers_load_from_module_colon_function_and_bad_specs_say_why():
    from tests.cli import handlers

    assert load_handler("tests.cli.handlers:record") is handlers.record
    for spec, words in [("no-colon", "module:function"), ("tests.cli.nothing_here:x", "cannot import"),
                        ("tests.cli.handlers:missing", "no function")]:
        with pytest.raises(ValueError, match=words):
            load_handler(spec)


class FakeConsumer:
    """Records commits (while `refusing`, refuses them as a rebalancing group would) and keeps the
    positions a real consumer would: `returned(records)` is what a poll that returned them does."""

    def __init__(self) -> None:
        self.commits: list[dict] = []
        self.refusing = False
        self._positions: dict[TopicPartition, int] = {}
        self.seeks: list[tuple[TopicPartition, int]] = []

    def commit(self, offsets):
        if self.refusing:
            raise RailmqError(ErrorCode.REBALANCE_IN_PROGRESS, "the group is rebalancing")
        self.commits.append(dict(offsets))

    def positions(self) -> dict[TopicPartition, int]:
        return dict(self._positions)

    def returned(self, records: list[ConsumerRecord]) -> list[ConsumerRecord]:
        for record in records:
            self._positions[TopicPartition(record.topic, record.partition)] = record.offset + 1
        return records

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))
        self._positions[tp] = offset

    def drop(self, tp: TopicPartition) -> None:
        """What the consumer does after a revoke or loss: the partition is no longer assigned."""
        self._positions.pop(tp, None)


def _records(*offsets: int, partition: int = 0, poison_at: int | None = None) -> list[ConsumerRecord]:
    return [ConsumerRecord(timestamp_ms=0, key=None, value=b"poison" if offset == poison_at else b"ok",
                           topic="t", partition=partition, offset=offset) for offset in offsets]


def _member(delivery: str, commit_every: str, handled: list) -> tuple[GroupMember, FakeConsumer]:
    def deliver(records):
        if any(record.value == b"poison" for record in records):
            raise ValueError("poison")
        handled.extend(record.offset for record in records)

    options = MemberOptions(bootstrap="tcp://127.0.0.1:1", group_id="g", topics=["t"], delivery=delivery,
                            commit_every=commit_every)
    member = GroupMember(options, deliver, threading.Event())
    member.consumer = FakeConsumer()
    return member, member.consumer


def test_at_least_once_commits_after_handling_and_never_past_a_failed_record():
    handled: list[int] = []
    member, consumer = _member("at-least-once", "batch", handled)
    member._handle_batch(consumer.returned(_records(0, 1, 2)))
    assert consumer.commits == [{TopicPartition("t", 0): 3}]
    with pytest.raises(Exception, match="t/0@5"):
        member._handle_batch(consumer.returned(_records(3, 4, 5, 6, poison_at=5)))
    assert handled == [0, 1, 2, 3, 4]
    assert consumer.commits[-1] == {TopicPartition("t", 0): 5}, "the failed record stays uncommitted"


def test_at_most_once_commits_before_handling():
    handled: list[int] = []
    member, consumer = _member("at-most-once", "record", handled)
    seen_commits_at_handle: list[int] = []
    original = member.delivery

    def deliver(records):
        seen_commits_at_handle.append(len(consumer.commits))
        original(records)

    member.delivery = deliver
    member._handle_batch(consumer.returned(_records(7, 8)))
    assert consumer.commits == [{TopicPartition("t", 0): 8}, {TopicPartition("t", 0): 9}]
    assert seen_commits_at_handle == [1, 2], "each record was committed before its handler ran"


def test_at_most_once_does_not_handle_records_whose_commit_was_refused(capsys):
    handled: list[int] = []
    member, consumer = _member("at-most-once", "batch", handled)
    consumer.refusing = True
    member._handle_batch(consumer.returned(_records(0, 1)))
    assert handled == [] and "commit not accepted" in capsys.readouterr().err
    assert consumer.seeks == [(TopicPartition("t", 0), 0)], "the position went back: no commit passes them"
    consumer.refusing = False
    member._handle_batch(consumer.returned(_records(0, 1)))
    assert handled == [0, 1]


def test_revoked_partitions_commit_their_processed_offsets_and_lost_ones_do_not():
    handled: list[int] = []
    member, consumer = _member("at-least-once", "60000ms", handled)
    member._handle_batch(consumer.returned(_records(0, 1) + _records(4, partition=1)))
    assert consumer.commits == []
    member._on_revoke([TopicPartition("t", 0)])
    consumer.drop(TopicPartition("t", 0))
    assert consumer.commits == [{TopicPartition("t", 0): 2}]
    member._on_lost([TopicPartition("t", 1)])
    consumer.drop(TopicPartition("t", 1))
    member._commit_processed()
    assert consumer.commits == [{TopicPartition("t", 0): 2}], "a lost partition's offsets are not committed"


def test_a_commit_covers_every_assigned_partition_including_those_that_returned_nothing():
    handled: list[int] = []
    member, consumer = _member("at-least-once", "batch", handled)
    consumer._positions = {TopicPartition("t", 1): 7, TopicPartition("t", 2): 0}  # assigned, nothing yet
    member._handle_batch(consumer.returned(_records(3, 4)))
    assert consumer.commits == [{TopicPartition("t", 0): 5, TopicPartition("t", 1): 7, TopicPartition("t", 2): 0}]
    member._commit_moved_positions()
    assert len(consumer.commits) == 1, "positions already committed are not committed again"
    consumer._positions[TopicPartition("t", 3)] = 12  # a new assignment's start becomes known
    member._commit_moved_positions()
    assert consumer.commits[-1] == {TopicPartition("t", 3): 12}


def test_the_member_says_where_each_new_partition_starts(capsys):
    member, consumer = _member("at-least-once", "batch", [])
    member.starting = {TopicPartition("t", 0): 5, TopicPartition("t", 1): None}
    consumer.assignment = lambda: [TopicPartition("t", 0), TopicPartition("t", 1)]
    consumer._positions = {}
    member._announce_starts([])
    assert capsys.readouterr().err == "", "nothing is known yet: it waits"
    records = consumer.returned(_records(5, 6))  # partition 0's records come before partition 1's start
    member._announce_starts(records)
    assert capsys.readouterr().err.strip() == "group g: starts t/0 at 5 (committed)", "said before handling"
    consumer._positions[TopicPartition("t", 1)] = 40
    member._announce_starts([])
    line = capsys.readouterr().err.strip()
    assert line == ("group g: starts t/1 at 40 (no commit yet: latest); records already there are skipped "
                    "(--from-beginning reads them)")
    member._announce_starts([])
    assert capsys.readouterr().err == "" and member.starting == {}, "each start is said once"


# --------------------------------------------------------------------------- rendering and configs


def test_records_render_as_text_when_utf8_and_base64_otherwise():
    record = ConsumerRecord(timestamp_ms=99, key=b"user-1", value=b"\xff\x00", headers=[("trace", b"abc")],
                            topic="t", partition=2, offset=7)
    shown = record_to_dict(record)
    assert shown == {"topic": "t", "partition": 2, "offset": 7, "key": "user-1",
                     "value": base64.b64encode(b"\xff\x00").decode(), "value_encoding": "base64",
                     "headers": [{"key": "trace", "value": "abc"}], "timestamp": 99}
    json.dumps(shown)
    assert record_to_line(record) == "t/2@7 key=user-1 [trace=abc] <2 bytes>"


def test_topic_config_converts_values_and_refuses_unknown_keys():
    config = topic_config([("retention_ms", "60000"), ("unclean_leader_election", "true"),
                           ("retention_bytes", "none"), ("flush_policy", "every_batch")], min_insync=2)
    assert config == TopicConfig(min_insync_replicas=2, retention_ms=60000, unclean_leader_election=True,
                                 retention_bytes=None, flush_policy="every_batch")
    with pytest.raises(ValueError, match="unknown config key"):
        topic_config([("retention", "1")], 1)
    with pytest.raises(ValueError, match="bad config value"):
        topic_config([("segment_bytes", "lots")], 1)


@pytest.mark.parametrize("argv, words", [
    (["topics", "create", "t", "--partitions", "zero"], "is not an integer"),
    (["topics", "create", "t", "--config", "retention"], "key=value"),
    (["produce", "t", "--acks", "2"], "invalid choice"),
    (["consume", "t", "--bootstrap", "localhost"], "not an endpoint"),
    (["groups", "reset-offsets", "g", "--topic", "t"], "one of the arguments"),
    (["nonsense"], "invalid choice"),
])
def test_bad_flags_exit_2_with_argparse_message(argv, words, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert words in capsys.readouterr().err


def test_every_command_group_registers_through_the_plug_in_list():
    commands = cli.build_parser()._subparsers._group_actions[0].choices
    assert {"up", "demo", "topics", "produce", "consume", "groups", "version"} <= set(commands)
    assert len(cli.COMMAND_GROUPS) >= 5
