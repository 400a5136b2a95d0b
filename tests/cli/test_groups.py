"""Consumer groups from the command line: members run by `railmq consume --group`, lag reports
from `railmq groups describe`, offset resets, listing and deletion.

Given a topic with records, when a group member processes some of them and stops, then the group
has committed exactly what the member processed, and `groups describe` reports, per partition, the
lag that remains — with the member gone as well as while it runs."""

from __future__ import annotations

import json
import signal
import time

import pytest

from railmq.admin import Admin
from railmq.producer import Producer
from tests.cli.conftest import handler_log
from tests.cli.handlers import LOG_ENVIRONMENT
from tests.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

MEMBER_FLAGS = ("--session-timeout-ms", 1500)  # quick rebalances when members come and go
RECORD_HANDLER = ("--handler", "tests.cli.handlers:record")


def make_topic(cluster, name: str, per_partition: list[list[str]], timestamp_ms: int | None = None) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=len(per_partition), replication_factor=1)
    with Producer(cluster.bootstrap, acks="all") as producer:
        for partition, values in enumerate(per_partition):
            for value in values:
                producer.send(name, value, partition=partition, timestamp_ms=timestamp_ms)
        producer.flush(20)


def describe(railmq, cluster, group: str, *extra) -> dict:
    finished = railmq("groups", "describe", group, "--json", *extra, "--bootstrap", cluster.bootstrap)
    assert finished.returncode == 0, finished.stderr
    return json.loads(finished.stdout)


def by_partition(report: dict) -> dict[int, dict]:
    return {row["partition"]: row for row in report["partitions"]}


def test_member_commits_exactly_what_it_processed_and_describe_shows_the_rest_as_lag(
        cluster, railmq, unique_name, tmp_path):
    topic, group = unique_name(), unique_name("g")
    make_topic(cluster, topic, [[f"a{i}" for i in range(12)], [f"b{i}" for i in range(8)]])
    log = tmp_path / "processed.jsonl"
    member = railmq("consume", topic, "--group", group, *RECORD_HANDLER, "--from-beginning",
                    "--max-messages", 13, "--commit-every", "record", *MEMBER_FLAGS,
                    "--bootstrap", cluster.bootstrap,
                    env={LOG_ENVIRONMENT: str(log)}, script=True)
    assert member.returncode == 0, member.stderr
    processed = handler_log(log)
    assert len(processed) == 13
    counts = {p: len([r for r in processed if r["partition"] == p]) for p in (0, 1)}
    for partition in (0, 1):
        offsets = [r["offset"] for r in processed if r["partition"] == partition]
        assert offsets == list(range(counts[partition])), "each partition is processed in order from 0"

    report = describe(railmq, cluster, group)  # no live member: offsets only
    assert report["state"] == "Empty" and report["members"] == []
    rows = by_partition(report)
    for partition, produced in ((0, 12), (1, 8)):
        row = rows[partition]
        assert row["committed_offset"] == counts[partition], "committed exactly what was processed"
        assert row["log_end_offset"] == produced
        assert row["lag_messages"] == produced - counts[partition]
        assert row["member_id"] is None
    assert report["total_lag_messages"] == 20 - 13


def test_lag_in_seconds_is_the_age_of_the_oldest_unconsumed_record(cluster, railmq, unique_name):
    topic, group = unique_name(), unique_name("g")
    minute_ago = int(time.time() * 1000) - 60_000
    make_topic(cluster, topic, [["x"] * 5], timestamp_ms=minute_ago)
    reset = railmq("groups", "reset-offsets", group, "--topic", topic, "--shift-by", 2, "--execute",
                   "--bootstrap", cluster.bootstrap)
    assert reset.returncode == 0, reset.stderr
    row = by_partition(describe(railmq, cluster, group))[0]
    assert (row["committed_offset"], row["lag_messages"]) == (2, 3)
    assert 59 <= row["lag_seconds"] < 120


def test_a_poisoned_handler_stops_the_member_with_exit_1_and_nothing_past_it_is_committed(
        cluster, railmq, unique_name, tmp_path):
    topic, group = unique_name(), unique_name("g")
    make_topic(cluster, topic, [["v0", "v1", "v2", "poison", "v4", "v5"]])
    log = tmp_path / "processed.jsonl"
    member = railmq("consume", topic, "--group", group, *RECORD_HANDLER, "--from-beginning",
                    "--timeout-ms", 5000, *MEMBER_FLAGS, "--bootstrap", cluster.bootstrap,
                    env={LOG_ENVIRONMENT: str(log)})
    assert member.returncode == 1
    assert "HANDLER_FAILED" in member.stderr and "poison at offset 3" in member.stderr
    assert "Traceback" not in member.stderr
    assert [r["offset"] for r in handler_log(log)] == [0, 1, 2]
    assert by_partition(describe(railmq, cluster, group))[0]["committed_offset"] == 3


def test_sigint_commits_what_was_processed_then_exits_0(cluster, railmq, background, unique_name, tmp_path):
    topic, group = unique_name(), unique_name("g")
    make_topic(cluster, topic, [[f"{i}" for i in range(10)], [f"{i}" for i in range(7)]])
    log = tmp_path / "processed.jsonl"
    member = background("consume", topic, "--group", group, "--handler", "tests.cli.handlers:batch",
                        "--per-batch", "--from-beginning", "--commit-every", "600000ms", *MEMBER_FLAGS,
                        "--bootstrap", cluster.bootstrap, env={LOG_ENVIRONMENT: str(log)})
    wait_for(lambda: len(handler_log(log)) == 17, 20, "the member to process all 17 records")
    before = by_partition(describe(railmq, cluster, group))
    assert all(row["committed_offset"] is None for row in before.values()), "nothing committed yet"
    member.send_signal(signal.SIGINT)
    assert member.wait(timeout=20) == 0, member.stderr.read()
    after = by_partition(describe(railmq, cluster, group))
    assert (after[0]["committed_offset"], after[1]["committed_offset"]) == (10, 7)


def test_describe_shows_live_members_idle_members_and_hot_partitions(
        cluster, railmq, background, unique_name):
    topic, group = unique_name(), unique_name("g")
    make_topic(cluster, topic, [["hot"] * 400, ["cold"] * 10, ["cold"] * 12])
    reset = railmq("groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "--execute",
                   "--bootstrap", cluster.bootstrap)
    assert reset.returncode == 0, reset.stderr
    report = describe(railmq, cluster, group)
    hot = [row["partition"] for row in report["partitions"] if row["hot"]]
    assert hot == [0] and by_partition(report)[0]["hot_reasons"] == ["lag"]

    members = [background("consume", topic, "--group", group, "--json", "--timeout-ms", 30_000, *MEMBER_FLAGS,
                          "--bootstrap", cluster.bootstrap) for _ in range(4)]

    def settled() -> dict | None:
        current = describe(railmq, cluster, group)
        owned = [row for row in current["partitions"] if row["member_id"]]
        ready = current["state"] == "Stable" and len(current["members"]) == 4 and len(owned) == 3
        return current if ready else None

    report = wait_for(settled, 30, "four members with all three partitions assigned", interval_s=0.3)
    idle = [member for member in report["members"] if member["idle"]]
    assert len(idle) == 1 and idle[0]["partitions"] == []
    owners = {row["member_id"] for row in report["partitions"]}
    assert owners == {member["member_id"] for member in report["members"] if not member["idle"]}
    table = railmq("groups", "describe", group, "--bootstrap", cluster.bootstrap)
    assert "idle member" in table.stdout and "Stable" in table.stdout
    for member in members:
        member.send_signal(signal.SIGTERM)
    for member in members:
        assert member.wait(timeout=20) == 0, member.stderr.read()


def test_reset_offsets_plans_by_default_and_commits_only_with_execute_and_no_members(
        cluster, railmq, background, unique_name):
    topic, group = unique_name(), unique_name("g")
    make_topic(cluster, topic, [[f"{i}" for i in range(10)], [f"{i}" for i in range(4)]])
    bootstrap = ("--bootstrap", cluster.bootstrap)
    reset = ("groups", "reset-offsets", group, "--topic", topic)
    assert railmq(*reset, "--to-latest", "--execute", *bootstrap).returncode == 0
    assert [row["committed_offset"] for row in describe(railmq, cluster, group)["partitions"]] == [10, 4]

    dry = railmq(*reset, "--shift-by", "-3", *bootstrap)
    assert dry.returncode == 0 and "dry run" in dry.stdout
    assert [row["committed_offset"] for row in describe(railmq, cluster, group)["partitions"]] == [10, 4]

    executed = railmq(*reset, "--shift-by", "-3", "--execute", *bootstrap)
    assert executed.returncode == 0, executed.stderr
    assert [row["committed_offset"] for row in describe(railmq, cluster, group)["partitions"]] == [7, 1]

    member = background("consume", topic, "--group", group, "--timeout-ms", 30_000, *MEMBER_FLAGS, *bootstrap)
    wait_for(lambda: describe(railmq, cluster, group)["members"], 20, "the member to join")
    refused = railmq(*reset, "--to-earliest", "--execute", *bootstrap)
    assert refused.returncode == 1 and refused.stderr.startswith("error: NON_EMPTY_GROUP: ")
    member.send_signal(signal.SIGINT)
    assert member.wait(timeout=20) == 0
    lines = member.stdout.read().splitlines()
    expected = [f"{topic}/0@{i} {i}" for i in range(7, 10)] + [f"{topic}/1@{i} {i}" for i in range(1, 4)]
    assert sorted(lines) == sorted(expected), "a member starts from the reset offsets"


def test_groups_list_and_delete(cluster, railmq, unique_name):
    topic, group = unique_name(), unique_name("g")
    make_topic(cluster, topic, [["x"]])
    bootstrap = ("--bootstrap", cluster.bootstrap)
    reset = railmq("groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "--execute",
                   *bootstrap)
    assert reset.returncode == 0, reset.stderr
    listed = railmq("groups", "list", *bootstrap)
    assert listed.returncode == 0 and group in listed.stdout and "classic" in listed.stdout
    assert railmq("groups", "delete", group, *bootstrap).returncode == 0
    assert group not in railmq("groups", "list", *bootstrap).stdout
    gone = railmq("groups", "describe", group, *bootstrap)
    assert gone.returncode == 1 and gone.stderr.startswith("error: GROUP_ID_NOT_FOUND: ")


def test_delete_offsets_forgets_one_topics_commits_and_keeps_the_rest(cluster, railmq, unique_name):
    topic, other, group = unique_name(), unique_name(), unique_name("g")
    make_topic(cluster, topic, [["a"], ["b"]])
    make_topic(cluster, other, [["c"]])
    for name in (topic, other):
        finished = railmq("groups", "reset-offsets", group, "--topic", name, "--to-latest", "--execute",
                          "--bootstrap", cluster.bootstrap)
        assert finished.returncode == 0, finished.stderr

    finished = railmq("groups", "delete-offsets", group, "--topic", f"{topic}:0", "--json",
                      "--bootstrap", cluster.bootstrap)
    via_reset = railmq("groups", "reset-offsets", group, "--topic", topic, "--delete-offsets", "--execute",
                       "--bootstrap", cluster.bootstrap)

    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout)["deleted"] == [[topic, 0]]
    assert via_reset.returncode == 0, via_reset.stderr
    assert f"{topic}/1" in via_reset.stdout
    offsets = {(row["topic"], row["partition"]) for row in describe(railmq, cluster, group)["partitions"]
               if row.get("committed_offset") is not None}
    assert offsets == {(other, 0)}


def test_topics_alter_config_changes_retention_and_refuses_fixed_settings(cluster, railmq, unique_name):
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3, config={"min_insync_replicas": 2})

    changed = railmq("topics", "alter-config", topic, "-s", "retention.ms=60000", "-s", "min.insync.replicas=1",
                     "--json", "--bootstrap", cluster.bootstrap)
    fixed = railmq("topics", "alter-config", topic, "-s", "segment.bytes=1024", "--bootstrap", cluster.bootstrap)

    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout)["retention_ms"] == 60000
    with Admin(cluster.bootstrap) as admin:
        config = admin.describe_topic(topic).config
    assert (config.retention_ms, config.min_insync_replicas) == (60000, 1)
    assert fixed.returncode == 2 and "cannot change after creation" in fixed.stderr
