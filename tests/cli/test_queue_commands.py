"""Queue-style commands through the real `railmq` command: share-group members, retries with a
dead-letter topic for classic members, the `dlq` tools, dead-letter depth in `groups describe`,
and `railmq sim`."""

from __future__ import annotations

import json

import pytest

from railmq.producer import Producer
from tests.cli.handlers import LOG_ENVIRONMENT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    with Producer(bootstrap, acks="all") as producer:
        for value in values:
            producer.send(topic, value, partition=0)
        producer.flush(30)


def handled(log_path) -> list[dict]:
    if not log_path.exists():
        return []
    return [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]


def test_a_share_group_member_sends_the_poison_record_to_the_dead_letter_topic(railmq, cluster, admin,
                                                                              unique_name, tmp_path):
    topic = unique_name()
    admin.create_topic(topic, partitions=1)
    produce(cluster.bootstrap, topic, [b"one", b"poison", b"two"])
    log_path = tmp_path / "handled.jsonl"
    result = railmq("consume", topic, "--share-group", unique_name("share"), "--handler", "tests.cli.handlers:record",
                    "--visibility-timeout", "2s", "--max-attempts", "2", "--timeout-ms", "6000",
                    "--bootstrap", cluster.bootstrap, env={LOG_ENVIRONMENT: str(log_path)})
    assert result.returncode == 0, result.stderr
    assert sorted(entry["value"] for entry in handled(log_path)) == ["one", "two"]
    inspected = railmq("dlq", "inspect", f"{topic}.dlq", "--json", "--bootstrap", cluster.bootstrap)
    assert inspected.returncode == 0, inspected.stderr
    letters = [json.loads(line) for line in inspected.stdout.splitlines() if line.strip().startswith("{")]
    assert len(letters) == 1, inspected.stdout
    letter = letters[0]
    assert letter["source_topic"] == topic and letter["source_offset"] == 1 and letter["attempts"] == 2
    assert letter["reason"] == "max-attempts" and "poison" in letter["last_error"]


def test_classic_member_retries_then_dead_letters_and_groups_describe_warns(railmq, cluster, admin,
                                                                            unique_name, tmp_path):
    topic, group = unique_name(), unique_name("g")
    admin.create_topic(topic, partitions=1)
    produce(cluster.bootstrap, topic, [b"a", b"poison", b"b"])
    log_path = tmp_path / "handled.jsonl"
    result = railmq("consume", topic, "--group", group, "--from-beginning", "--handler", "tests.cli.handlers:record",
                    "--retries", "3", "--retry-backoff-ms", "10", "--timeout-ms", "4000",
                    "--bootstrap", cluster.bootstrap, env={LOG_ENVIRONMENT: str(log_path)})
    assert result.returncode == 0, result.stderr
    assert [entry["value"] for entry in handled(log_path)] == ["a", "b"], "the partition kept draining"
    described = railmq("groups", "describe", group, "--json", "--bootstrap", cluster.bootstrap)
    assert described.returncode == 0, described.stderr
    document = json.loads(described.stdout)
    assert [p["committed_offset"] for p in document["partitions"]] == [3], "committed past the poison record"
    assert any("warning" in line.lower() and f"{topic}.dlq" in line for line in document["dead_letters"])
    listed = railmq("dlq", "list", "--bootstrap", cluster.bootstrap)
    assert listed.returncode == 0 and f"{topic}.dlq" in listed.stdout


def test_dlq_redrive_returns_messages_to_their_source(railmq, cluster, admin, unique_name, tmp_path):
    topic, group = unique_name(), unique_name("g")
    admin.create_topic(topic, partitions=1)
    produce(cluster.bootstrap, topic, [b"poison"])
    log_path = tmp_path / "handled.jsonl"
    railmq("consume", topic, "--group", group, "--from-beginning", "--handler", "tests.cli.handlers:record",
           "--retries", "2", "--retry-backoff-ms", "10", "--timeout-ms", "3000", "--bootstrap", cluster.bootstrap,
           env={LOG_ENVIRONMENT: str(log_path)})
    redriven = railmq("dlq", "redrive", f"{topic}.dlq", "--rate", "100", "--bootstrap", cluster.bootstrap)
    assert redriven.returncode == 0, redriven.stderr
    end = admin.list_offsets(topic, 0, -1).offset
    assert end == 2, "the dead letter is back in its source topic"


def test_bad_queue_flags_are_usage_errors(railmq):
    for args in (["consume", "t", "--share-group", "s", "--group", "g"],
                 ["consume", "t", "--retries", "3"],
                 ["consume", "t", "--share-group", "s", "--visibility-timeout", "soon"]):
        result = railmq(*args, "--bootstrap", "tcp://127.0.0.1:1")
        assert result.returncode == 2, (args, result.stderr)
        assert "error" in result.stderr


def test_railmq_sim_runs_a_seed_and_reports_it(railmq):
    result = railmq("sim", "--seed", "4", "--duration-ms", "2000")
    assert result.returncode == 0, result.stderr
    assert "seed 4: ok" in result.stdout and "x real time" in result.stdout
    bad = railmq("sim", "--faults", "meteor")
    assert bad.returncode == 2 and "unknown fault kinds" in bad.stderr
