"""`railmq topics ...`, `railmq produce` and `railmq consume` (no group) against a running cluster.

Given a 3-node cluster, when an operator manages topics and moves records with the command line,
then each command does it, prints what happened, and failures are one `error: NAME: ...` line
with exit code 1 (bad flags: exit 2)."""

from __future__ import annotations

import base64
import json
import select
import signal
import time

import pytest

from railmq.admin import Admin
from railmq.producer import Producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_topics_create_list_describe_and_delete(cluster, railmq, unique_name):
    topic = unique_name()
    bootstrap = ("--bootstrap", cluster.bootstrap)
    created = railmq("topics", "create", topic, "--partitions", 3, "--replication-factor", 3,
                     "--min-insync", 2, "--config", "retention_ms=60000",
                     "--config", "flush_policy=every_batch", *bootstrap)
    assert created.returncode == 0, created.stderr
    listed = railmq("topics", "list", *bootstrap, script=True)  # the installed console script
    assert listed.returncode == 0 and topic in listed.stdout

    described = railmq("topics", "describe", topic, "--json", *bootstrap)
    assert described.returncode == 0, described.stderr
    document = json.loads(described.stdout)
    assert document["topic"] == topic
    assert document["config"]["retention_ms"] == 60000 and document["config"]["flush_policy"] == "every_batch"
    assert document["config"]["min_insync_replicas"] == 2
    assert [p["partition"] for p in document["partitions"]] == [0, 1, 2]
    actors = {actor["pid"] for actor in cluster.actors() if actor["kind"] == "replica"}
    for partition in document["partitions"]:
        assert sorted(replica["node"] for replica in partition["replicas"]) == [1, 2, 3]
        assert partition["leader"] in (1, 2, 3) and partition["leader_epoch"] >= 0
        for replica in partition["replicas"]:
            assert replica["pid"] in actors and replica["endpoint"].startswith("tcp://127.0.0.1:")
            assert {"alive", "log_end_offset", "high_watermark", "log_start_offset", "in_isr"} <= set(replica)

    table = railmq("topics", "describe", topic, *bootstrap)
    assert table.returncode == 0 and "watermark" in table.stdout and "isr" in table.stdout

    deleted = railmq("topics", "delete", topic, *bootstrap)
    assert deleted.returncode == 0, deleted.stderr
    with Admin(cluster.bootstrap) as admin:
        assert topic not in admin.list_topics()


def test_produce_from_arguments_and_stdin_then_consume_json_from_beginning(cluster, railmq, unique_name):
    topic = unique_name()
    bootstrap = ("--bootstrap", cluster.bootstrap)
    assert railmq("topics", "create", topic, "--partitions", 2, *bootstrap).returncode == 0
    from_args = railmq("produce", topic, "one", "two", "--key", "user-7", "--header", "trace=abc", *bootstrap)
    assert from_args.returncode == 0, from_args.stderr
    acks = from_args.stdout.split("\n")[:2]
    partition = int(acks[0].split()[1])
    assert acks == [f"partition {partition} offset 0", f"partition {partition} offset 1"]
    from_stdin = railmq("produce", topic, "--partition", 1 - partition, "--acks", "1", *bootstrap,
                        input="alpha\nbeta\ngamma\n")
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert from_stdin.stdout.split() == ["partition", str(1 - partition), "offset", "0",
                                         "partition", str(1 - partition), "offset", "1",
                                         "partition", str(1 - partition), "offset", "2"]

    consumed = railmq("consume", topic, "--from-beginning", "--max-messages", 5, "--json", *bootstrap)
    assert consumed.returncode == 0, consumed.stderr
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert len(records) == 5
    keyed = [r for r in records if r["partition"] == partition]
    headers = [{"key": "trace", "value": "abc"}]
    assert [(r["offset"], r["key"], r["value"], r["headers"]) for r in keyed] == [
        (0, "user-7", "one", headers), (1, "user-7", "two", headers)]
    assert [r["value"] for r in records if r["partition"] == 1 - partition] == ["alpha", "beta", "gamma"]
    assert all(r["topic"] == topic and r["timestamp"] > 0 for r in records)


def test_consume_one_partition_from_an_offset_and_binary_values_as_base64(cluster, railmq, unique_name):
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=2)
    with Producer(cluster.bootstrap) as producer:
        for index in range(4):
            producer.send(topic, f"v{index}".encode(), partition=0)
        producer.send(topic, b"\xff\xfe", partition=1)
        producer.flush(10)
    bootstrap = ("--bootstrap", cluster.bootstrap)
    picked = railmq("consume", topic, "--partition", 0, "--offset", 2, "--timeout-ms", 1000, "--json",
                    *bootstrap)
    assert picked.returncode == 0, picked.stderr
    assert [json.loads(line)["value"] for line in picked.stdout.splitlines()] == ["v2", "v3"]
    binary = railmq("consume", topic, "--partition", 1, "--from-beginning", "--max-messages", 1, "--json",
                    *bootstrap)
    record = json.loads(binary.stdout)
    assert record["value_encoding"] == "base64" and base64.b64decode(record["value"]) == b"\xff\xfe"
    human = railmq("consume", topic, "--partition", 0, "--from-beginning", "--max-messages", 1, *bootstrap)
    assert human.stdout.strip() == f"{topic}/0@0 v0"


def test_unknown_topic_exits_1_with_a_typed_error(cluster, railmq, unique_name):
    missing = unique_name("missing")
    for command in (("topics", "describe", missing), ("produce", missing, "x"), ("consume", missing),
                    ("topics", "delete", missing)):
        finished = railmq(*command, "--bootstrap", cluster.bootstrap, "--request-timeout-ms", 3000)
        assert finished.returncode == 1, (command, finished.stdout, finished.stderr)
        assert finished.stderr.startswith("error: UNKNOWN_TOPIC_OR_PARTITION: "), (command, finished.stderr)
        assert "Traceback" not in finished.stderr


def test_refused_requests_and_a_missing_cluster_are_one_line_errors(cluster, railmq, unique_name):
    topic = unique_name()
    bootstrap = ("--bootstrap", cluster.bootstrap)
    assert railmq("topics", "create", topic, *bootstrap).returncode == 0
    again = railmq("topics", "create", topic, *bootstrap)
    assert again.returncode == 1 and again.stderr.startswith("error: TOPIC_ALREADY_EXISTS: ")
    too_many = railmq("topics", "create", unique_name(), "--replication-factor", 2, "--min-insync", 3,
                      *bootstrap)
    assert too_many.returncode == 1 and too_many.stderr.startswith("error: INVALID_CONFIG: ")
    # A number msgpack cannot hold: an OverflowError traceback from inside the codec, before.
    unencodable = railmq("topics", "create", unique_name(), "--config", f"retention_ms={10**23}", *bootstrap)
    assert unencodable.returncode == 1 and unencodable.stderr.startswith("error: INVALID_REQUEST: "), \
        unencodable.stderr
    from tests.cli.conftest import free_port

    address = f"127.0.0.1:{free_port()}"
    for command in (("topics", "list"), ("consume", topic, "--timeout-ms", 2000), ("produce", topic, "x")):
        started = time.monotonic()
        nobody = railmq(*command, "--bootstrap", address, "--request-timeout-ms", 60_000)
        assert time.monotonic() - started < 30, "a missing cluster is found before any request times out"
        assert nobody.returncode == 1 and nobody.stderr.startswith("error: CLUSTER_UNREACHABLE: "), nobody.stderr
        assert f"nothing answers at tcp://{address}" in nobody.stderr and "railmq up" in nobody.stderr
        assert "Traceback" not in nobody.stderr and "max_block_ms" not in nobody.stderr


def test_bootstrap_comes_from_the_environment_and_bad_flags_exit_2(cluster, railmq, unique_name):
    topic = unique_name()
    assert railmq("topics", "create", topic, env={"RAILMQ_BOOTSTRAP": cluster.bootstrap}).returncode == 0
    listed = railmq("topics", "list", env={"RAILMQ_BOOTSTRAP": cluster.bootstrap})
    assert listed.returncode == 0 and topic in listed.stdout
    bad_environment = railmq("topics", "list", env={"RAILMQ_BOOTSTRAP": "not-an-endpoint"})
    assert bad_environment.returncode == 2 and "not an endpoint" in bad_environment.stderr
    for argv, words in [(("consume", topic, "--offset", "soon"), "is not a start offset"),
                        (("consume", topic, "--from-beginning", "-o", "end"), "give one of them"),
                        (("consume", topic, "--delivery", "at-most-once"), "only make sense with --group"),
                        (("produce", topic, "--partition", "-1"), "must be zero or more"),
                        (("topics", "create", topic, "--config", "colour=blue"), "unknown config key")]:
        finished = railmq(*argv, "--bootstrap", cluster.bootstrap)
        assert finished.returncode == 2, (argv, finished.stderr)
        assert words in finished.stderr and finished.stderr.startswith("usage:"), (argv, finished.stderr)



def _has_output(process, wait_s: float) -> bool:
    return bool(select.select([process.stdout], [], [], wait_s)[0])


def test_consume_follows_new_records_until_sigint_and_exits_0(cluster, background, unique_name):
    topic = unique_name()
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
    with Producer(cluster.bootstrap) as producer:
        producer.send(topic, b"old").result(10)
        follower = background("consume", topic, "--json", "--bootstrap", cluster.bootstrap)
        deadline = time.monotonic() + 20
        # It starts at the end of the log: send until it has started and printed one.
        while not _has_output(follower, 0.2) and time.monotonic() < deadline:
            producer.send(topic, b"new").result(10)
    follower.send_signal(signal.SIGINT)
    assert follower.wait(timeout=20) == 0, follower.stderr.read()
    values = [json.loads(line)["value"] for line in follower.stdout.read().splitlines()]
    assert values and set(values) == {"new"}, "from the end: only records sent after it started"
