"""What a Kafka, kcat or rpk user tries in their first hour, against a running cluster.

Given a 3-node cluster, when a user runs the commands they know from kcat and rpk (keys from a
separator, tombstones, a file of records, start offsets like `-o -2` and `@time`, `-e`, `-f`
formats, `--json` everywhere a script reads, topic defaults that fit the cluster, added
partitions, offset resets to an offset, a time or a duration, cluster info and health), then each
does what they expect, tables fit 80 columns, and an offset outside the log is a one-line error.
The commands run in this process (`railmq.cli.main`), which is what the installed script runs.
"""

from __future__ import annotations

import json

import pytest

from railmq import cli
from railmq.admin import Admin
from railmq.producer import Producer
from tests.cli.handlers import LOG_ENVIRONMENT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def run(cluster, capsys):
    """`railmq ARGV... --bootstrap <cluster>` in this process: (exit code, stdout, stderr)."""
    def invoke(*argv: object) -> tuple[int, str, str]:
        try:
            code = cli.main([str(arg) for arg in argv] + ["--bootstrap", cluster.bootstrap])
        except SystemExit as exited:
            code = exited.code
        out, err = capsys.readouterr()
        return code, out, err
    return invoke


def fits_80_columns(text: str) -> bool:
    return max((len(line) for line in text.splitlines()), default=0) <= 80


def produce(cluster, topic: str, values_by_partition: dict[int, list[str]]) -> None:
    with Producer(cluster.bootstrap, acks="all") as producer:
        for partition, values in values_by_partition.items():
            for value in values:
                producer.send(topic, value, key=f"k{partition}", partition=partition)
        producer.flush(30)


def test_topics_default_to_the_cluster_and_grow_and_describe_their_settings(run, unique_name):
    topic = unique_name()
    code, out, err = run("topics", "create", topic)
    assert code == 0, err
    assert out.strip() == f"created topic {topic}: 3 partitions, replication factor 3, min in-sync 2"
    code, out, _ = run("topics", "create", topic, "--if-not-exists")
    assert code == 0 and "exists already" in out
    code, _, err = run("topics", "create", topic)
    assert code == 1 and err.startswith("error: TOPIC_ALREADY_EXISTS: ")
    code, out, err = run("topics", "add-partitions", topic, "--num", 2)
    assert code == 0 and "now has 5 partitions (was 3)" in out, err
    code, out, _ = run("topics", "list", "--json")
    [row] = [row for row in json.loads(out) if row["topic"] == topic]
    assert (row["partitions"], row["replication_factor"], row["min_insync_replicas"]) == (5, 3, 2)
    code, out, _ = run("topics", "describe", topic)
    assert code == 0 and fits_80_columns(out) and "watermark" in out
    code, out, _ = run("topics", "describe-config", topic, "--json")
    document = json.loads(out)
    assert document["config"]["min_insync_replicas"] == 2 and "retention_ms" in document["defaults"]
    code, out, _ = run("topics", "describe-config", topic)
    assert code == 0 and "retention_ms" in out and fits_80_columns(out)
    code, out, _ = run("topics", "create", unique_name(), "-p", 1, "-r", 1, "-c", "retention.ms=60000")
    assert code == 0 and "1 partition, replication factor 1, min in-sync 1" in out
    code, out, _ = run("topics", "delete", topic, unique_name("missing"), "--if-exists")
    assert code == 0 and f"deleted topic {topic}" in out and "does not exist" in out


def test_produce_keys_from_a_separator_tombstones_a_file_and_json_acknowledgements(run, cluster, unique_name,
                                                                                    tmp_path, monkeypatch):
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
    code, out, err = run("produce", topic, "alice:paid 10", "-K:", "bob:", "-Z", "--json")
    assert code == 0, err
    acks = [json.loads(line) for line in out.splitlines()]
    assert [(ack["partition"], ack["offset"], ack["key"]) for ack in acks] == [(0, 0, "alice"), (0, 1, "bob")]
    records = tmp_path / "records.txt"
    records.write_text("from a file\nand another\n")
    code, out, err = run("produce", topic, "--file", records, "-k", "carol")
    assert code == 0 and out.split("\n")[:2] == ["partition 0 offset 2", "partition 0 offset 3"], err
    code, out, err = run("consume", topic, "-o", "beginning", "-e", "-f", r"%o %k=%s (%S)\n")
    assert code == 0, err
    assert out.splitlines() == ["0 alice=paid 10 (7)", "1 bob= (-1)", "2 carol=from a file (11)",
                                "3 carol=and another (11)"], "bob's empty value went as a tombstone (null)"
    assert "reached the end" in err
    code, _, err = run("produce", topic, "x", "-k", "a", "-K", ":")
    assert code == 2 and "use one" in err


def test_consume_starts_where_kcat_and_rpk_flags_say_and_refuses_offsets_outside_the_log(run, cluster, unique_name):
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=2)
    produce(cluster, topic, {0: ["a0", "a1", "a2", "a3"], 1: ["b0", "b1"]})
    values = lambda out: sorted(json.loads(line)["value"] for line in out.splitlines())  # noqa: E731
    code, out, err = run("consume", topic, "-o", "-2", "-e", "--json")
    assert code == 0 and values(out) == ["a2", "a3", "b0", "b1"], err
    code, out, _ = run("consume", topic, "-o", "+3", "-e", "--json", "-q")
    assert values(out) == ["a3"]
    code, out, _ = run("consume", topic, "-o", 1, "-p", 1, "-e", "-J", "-q")
    assert values(out) == ["b1"]
    code, out, _ = run("consume", topic, "-o", "@-1h", "-c", 3, "-J", "-q")
    assert code == 0 and len(out.splitlines()) == 3
    code, out, err = run("consume", topic, "-o", "end", "-e")
    assert code == 0 and out == "" and "from the end" in err
    code, out, err = run("consume", topic, "-o", 9, "-p", 0)
    assert code == 1 and out == ""
    assert err.strip() == (f"error: OFFSET_OUT_OF_RANGE: {topic}/0 holds offsets 0..3 (next offset 4); "
                           "offset 9 is past its end")
    code, _, err = run("consume", topic, "--group", "g", "-o", "beginning")
    assert code == 2 and "--reset or --from-beginning" in err


def test_a_partition_with_no_new_records_keeps_its_committed_position_across_member_restarts(run, cluster,
                                                                                           unique_name):
    topic, group = unique_name(), unique_name("g")
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=2)
    produce(cluster, topic, {0: ["first"]})
    code, out, err = run("consume", topic, "--group", group, "-e", "--session-timeout-ms", 1500)
    assert code == 0 and out == "", err  # a new group starts at the end (latest), and says so
    assert f"group {group}: joined as " in err and f"{topic}/1 at 0 (no commit yet: latest)" in err
    assert "records already there are skipped (--from-beginning reads them)" in err
    code, out, _ = run("groups", "describe", group, "--json")
    rows = {row["partition"]: row for row in json.loads(out)["partitions"]}
    assert (rows[0]["committed_offset"], rows[1]["committed_offset"]) == (1, 0), "both positions committed"

    produce(cluster, topic, {1: ["while nobody ran"]})  # no member runs now
    code, out, err = run("consume", topic, "--group", group, "-e", "--session-timeout-ms", 1500)
    assert code == 0 and out.strip() == f"{topic}/1@0 key=k1 while nobody ran", err
    assert f"{topic}/1 at 0 (committed)" in err and f"group {group}: left after handling 1 record" in err
    code, out, err = run("consume", topic, "--group", unique_name("g"), "-e", "--quiet", "--reset", "earliest")
    assert code == 0 and len(out.splitlines()) == 2 and err == ""


def test_group_describe_marks_lag_measured_without_a_commit_and_resets_take_kafka_targets(run, cluster,
                                                                                        unique_name):
    topic, group = unique_name(), unique_name("g")
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=2)
    produce(cluster, topic, {0: [f"v{i}" for i in range(6)], 1: ["w0", "w1"]})
    code, out, err = run("groups", "reset-offsets", group, "--topic", f"{topic}:0", "--to-offset", 4, "--execute")
    assert code == 0 and "committed" in out, err
    code, out, _ = run("groups", "describe", group)
    assert code == 0 and fits_80_columns(out)
    assert "no committed offset" in out and "skip the 2 records" in out
    code, out, _ = run("groups", "describe", group, "--json", "--reset", "earliest")
    report = json.loads(out)
    assert report["total_lag_messages"] == 2 + 2 and report["reset"] == "earliest"
    code, out, _ = run("groups", "reset-offsets", group, "--topic", topic, "--partition", 1, "--to-offset", 99,
                       "--json")
    plan = json.loads(out)
    assert plan["executed"] is False and [(p["partition"], p["new_offset"]) for p in plan["plan"]] == [(1, 2)]
    code, out, _ = run("groups", "reset-offsets", group, "--topic", topic, "--by-duration", "1h", "--json")
    assert [p["new_offset"] for p in json.loads(out)["plan"]] == [0, 0]
    code, out, _ = run("groups", "reset-offsets", group, "--topic", topic, "--to-datetime", "2999-01-01", "--json")
    assert [p["new_offset"] for p in json.loads(out)["plan"]] == [6, 2], "no record after it: the end"
    code, _, err = run("groups", "reset-offsets", group, "--topic", topic, "--by-duration", "soon")
    assert code == 2 and "is not a duration" in err
    code, out, _ = run("groups", "list", "--json")
    assert {"group_id": group, "kind": "classic"}.items() <= next(
        g for g in json.loads(out) if g["group_id"] == group).items()


def test_members_say_when_they_retry_and_dead_letter_and_dlq_tools_speak_json(run, cluster, unique_name,
                                                                             tmp_path, monkeypatch):
    topic, group = unique_name(), unique_name("g")
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
    produce(cluster, topic, {0: ["ok", "poison"]})
    monkeypatch.setenv(LOG_ENVIRONMENT, str(tmp_path / "handled.jsonl"))
    code, _, err = run("consume", topic, "-g", group, "--from-beginning", "--handler", "tests.cli.handlers:record",
                       "--retries", 2, "--retry-backoff-ms", 10, "-e")
    assert code == 0, err
    assert f"retrying {topic}/0@1 in " in err and "(attempt 1 of 2 failed: ValueError: poison at offset 1)" in err
    assert f"dead-lettered {topic}/0@1 to {topic}.dlq/0@0 after 2 attempts (retries-exhausted" in err
    code, out, _ = run("dlq", "list", "--json")
    [info] = [info for info in json.loads(out) if info["topic"] == f"{topic}.dlq"]
    assert (info["source_topic"], info["depth"]) == (topic, 1)
    code, _, err = run("dlq", "inspect", topic)
    assert code == 1 and "is not a dead-letter topic" in err and f"railmq dlq inspect {topic}.dlq" in err
    code, out, err = run("dlq", "redrive", f"{topic}.dlq", "--json")
    assert code == 0 and json.loads(out)["moved"] == 1, err


def test_cluster_info_and_health(run, cluster):
    code, out, err = run("cluster", "info", "--json")
    facts = json.loads(out)
    assert code == 0 and facts["nodes"] == [1, 2, 3] and facts["coordinator"] == cluster.bootstrap, err
    assert facts["group_coordinator"].startswith("tcp://") and facts["replicas_alive"] == facts["replicas"]
    code, out, _ = run("cluster", "info")
    assert code == 0 and "cluster id" in out and fits_80_columns(out)
    code, out, _ = run("cluster", "health", "--exit-when-healthy", "--json")
    report = json.loads(out)
    assert code == 0 and report["healthy"] is True and report["offline_partitions"] == []
    code, out, _ = run("cluster", "health")
    assert code == 0 and out.startswith("healthy: yes")


def test_the_python_consumers_commit_covers_every_assigned_partition(cluster, unique_name):
    from railmq.consumer import Consumer
    from railmq.group_admin import GroupAdminClient
    from tests.helpers import wait_for

    topic, group = unique_name(), unique_name("g")
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=3)
    produce(cluster, topic, {1: ["only here"]})
    with Consumer(cluster.bootstrap, group_id=group, auto_offset_reset="earliest", session_timeout_ms=1500,
                  heartbeat_interval_ms=300) as consumer:
        consumer.subscribe([topic])
        records = consumer.poll(10_000)  # one poll: it waits through the join for the first record
        assert [record.value for record in records] == [b"only here"]
        wait_for(lambda: len(consumer.positions()) == 3, 10, "the start of every partition")
        consumer.commit()
    with GroupAdminClient(cluster.bootstrap) as client:
        committed = {entry.partition: entry.offset for entry in client.describe_group(group).offsets}
    assert committed == {0: 0, 1: 1, 2: 0}, "partitions that returned nothing are committed at their position"
