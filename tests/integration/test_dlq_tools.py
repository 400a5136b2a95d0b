"""Dead letters on a running cluster: a poison record leaves its partition, and comes back.

Given a classic group whose handler always fails on one record, when it consumes through a
RetryingHandler, then that record lands in `<topic>.dlq` (same partition, shared headers), the
rest of its partition is handled, and the group commits past it. The DLQ's depth shows in
`railmq dlq list` and in the `groups describe` warning lines; `railmq dlq inspect` shows why it is
there; `redrive` moves it back to its source partition at a bounded rate, resumes after a crash
without losing anything, and moves nothing twice after a clean stop."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import time

import pytest

from railmq import cli_dlq
from railmq.admin import Admin
from railmq.consumer import Consumer
from railmq.dlq import (
    HEADER_ATTEMPTS, HEADER_GROUP, HEADER_REASON, HEADER_REDRIVEN_FROM, HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION, HEADER_SOURCE_TOPIC, MalformedDeadLetter, dlq_depth, inspect,
    list_dead_letter_topics, read_range, redrive, start_at_committed,
)
from railmq.producer import Producer
from railmq.records import TopicPartition
from railmq.retry import DeadLetterWriter, RetryingHandler, RetryPolicy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

POISON = b"poison"


def produce(bootstrap: str, topic: str, values: list[bytes], *, key_of=lambda index: f"k{index % 5}") -> list:
    with Producer(bootstrap, acks="all") as producer:
        futures = [producer.send(topic, value, key=key_of(index), headers=[("n", str(index).encode())])
                   for index, value in enumerate(values)]
        return [future.result(20) for future in futures]


def always_fails_on_poison(record) -> None:
    if record.value == POISON:
        raise ValueError(f"cannot parse {record.value!r}")


def consume_with_retries(bootstrap: str, topic: str, group: str, expected: int,
                         timeout_s: float = 30) -> tuple:
    """Drain `topic` as one group member through a RetryingHandler, committing after each poll;
    returns ({(partition, offset): outcome status}, the group's committed offsets, the handler)."""
    policy = RetryPolicy(attempts=3, backoff_ms=10, backoff_max_ms=50)
    outcomes: dict[tuple[int, int], str] = {}
    with DeadLetterWriter.connect(bootstrap) as writer, Consumer(
            bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
        policy.check_poll_interval(max_poll_interval_ms=300_000, max_poll_records=consumer.max_poll_records)
        handler = RetryingHandler(always_fails_on_poison, policy, writer, group)
        consumer.subscribe([topic], on_assign=lambda partitions: start_at_committed(consumer, partitions))
        deadline = time.monotonic() + timeout_s
        while len(outcomes) < expected and time.monotonic() < deadline:
            records = consumer.poll(200)
            for record in records:
                outcomes[(record.partition, record.offset)] = handler(record).status
            if records:
                consumer.commit({TopicPartition(r.topic, r.partition): r.offset + 1 for r in records})
        committed = consumer.committed([(topic, p) for p in range(2)])
    return outcomes, committed, handler


@pytest.fixture
def poisoned(cluster, admin, unique_name):
    """A 2-partition topic of 20 records, one of them poison, drained by group `billing-*`."""
    topic, group = unique_name("orders"), unique_name("billing")
    admin.create_topic(topic, partitions=2, replication_factor=2)
    values = [POISON if index == 6 else f"order-{index}".encode() for index in range(20)]
    acks = produce(cluster.bootstrap, topic, values)
    outcomes, committed, handler = consume_with_retries(cluster.bootstrap, topic, group, expected=20)
    return dict(topic=topic, group=group, acks=acks, poison=acks[6], outcomes=outcomes, committed=committed,
                handler=handler)


def test_a_poison_record_is_dead_lettered_and_its_partition_keeps_draining(cluster, admin, poisoned):
    topic, poison = poisoned["topic"], poisoned["poison"]
    outcomes = poisoned["outcomes"]
    assert len(outcomes) == 20
    assert outcomes.pop((poison.partition, poison.offset)) == "dead-lettered"
    assert set(outcomes.values()) == {"handled"}
    later = [ack for ack in poisoned["acks"]
             if ack.partition == poison.partition and ack.offset > poison.offset]
    assert later and all(outcomes[(ack.partition, ack.offset)] == "handled" for ack in later), \
        "the partition drained past the poison record"
    ends = {p: admin.list_offsets(topic, p, -1).high_watermark for p in range(2)}
    committed = {tp.partition: offset for tp, offset in poisoned["committed"].items()}
    assert committed == ends, "the group committed past the poison record"
    assert (poisoned["handler"].retried, poisoned["handler"].dead_lettered) == (2, 1)

    dlq = admin.describe_topic(f"{topic}.dlq")
    assert len(dlq.partitions) == 2 and all(len(p.replicas) == 2 for p in dlq.partitions), \
        "the DLQ topic is shaped like its source"
    with Consumer(cluster.bootstrap) as reader:
        [raw] = read_range(reader, TopicPartition(f"{topic}.dlq", poison.partition), 0, 1, 10, 10_000)
    assert (raw.key, raw.value) == (b"k1", POISON)
    headers = dict(raw.headers)
    assert [name for name, _ in raw.headers][-1] == "n", "the original headers come last"
    assert headers[HEADER_SOURCE_TOPIC] == topic.encode()
    assert (headers[HEADER_SOURCE_PARTITION], headers[HEADER_SOURCE_OFFSET]) == (
        str(poison.partition).encode(), str(poison.offset).encode())
    assert (headers[HEADER_GROUP], headers[HEADER_REASON], headers[HEADER_ATTEMPTS]) == (
        poisoned["group"].encode(), b"retries-exhausted", b"3")


def test_depth_list_and_warning_lines_show_the_dead_letter(cluster, admin, poisoned, unique_name):
    topic = poisoned["topic"]
    assert dlq_depth(admin, f"{topic}.dlq") == 1
    listed = {info.topic: info for info in list_dead_letter_topics(admin)}
    assert (listed[f"{topic}.dlq"].source_topic, listed[f"{topic}.dlq"].depth) == (topic, 1)
    [warning] = cli_dlq.dlq_warning(admin, [topic])
    assert warning.startswith(
        f"warning: dead-letter topic {topic}.dlq holds 1 dead-lettered message (1 not redriven)")
    quiet, without = unique_name("quiet"), unique_name("without")
    for name in (quiet, f"{quiet}.dlq", without):
        admin.create_topic(name, partitions=1)
    assert cli_dlq.dlq_warning(admin, [quiet, without]) == [f"dead-letter topic {quiet}.dlq: depth 0"]


def test_inspect_shows_why_the_record_is_there(cluster, poisoned):
    topic, poison = poisoned["topic"], poisoned["poison"]
    [letter] = inspect(cluster.bootstrap, f"{topic}.dlq", limit=10)
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
        topic, poison.partition, poison.offset)
    assert (letter.reason, letter.attempts, letter.malformed) == ("retries-exhausted", 3, "")
    assert letter.last_error == repr(ValueError(f"cannot parse {POISON!r}"))
    assert letter.first_delivery_ms <= letter.dead_lettered_ms
    assert letter.headers == [("n", b"6")]
    assert inspect(cluster.bootstrap, f"{topic}.dlq", limit=10, from_offset=1) == []


def test_redrive_returns_the_record_to_its_source_partition_once(cluster, admin, poisoned, unique_name):
    topic, poison = poisoned["topic"], poisoned["poison"]
    before = admin.list_offsets(topic, poison.partition, -1).high_watermark
    group = unique_name("redrive")
    result = redrive(cluster.bootstrap, f"{topic}.dlq", group=group, rate_per_s=50)
    assert (result.moved, result.by_destination, result.remaining, result.stopped) == (
        1, {topic: 1}, 0, "caught-up")
    with Consumer(cluster.bootstrap) as reader:
        [back] = read_range(reader, TopicPartition(topic, poison.partition), before, before + 1, 10, 10_000)
    assert (back.key, back.value) == (b"k1", POISON)
    assert back.headers == [("n", b"6"), (HEADER_REDRIVEN_FROM, f"{topic}.dlq/{poison.partition}/0".encode())]
    again = redrive(cluster.bootstrap, f"{topic}.dlq", group=group)
    assert (again.moved, again.stopped) == (0, "caught-up"), "the redrive group remembers what it moved"
    assert admin.list_offsets(topic, poison.partition, -1).high_watermark == before + 1
    assert dlq_depth(admin, f"{topic}.dlq") == 1, "the DLQ log keeps the record until retention"


def dead_letters(bootstrap: str, source: str, count: int) -> str:
    """A 1-partition DLQ topic holding `count` dead letters of `source` (written like a RetryingHandler)."""
    from railmq.dlq import DeadLetter
    from railmq.records import ConsumerRecord

    with DeadLetterWriter.connect(bootstrap) as writer:
        for offset in range(count):
            record = ConsumerRecord(timestamp_ms=1, key=f"k{offset}".encode(), value=f"v{offset}".encode(),
                                    headers=None, topic=source, partition=0, offset=offset)
            writer.write(DeadLetter.of_failure(record, group="g", reason="rejected", attempts=1,
                                               last_error="E()", first_delivery_ms=1, dead_lettered_ms=2))
    return f"{source}.dlq"


def test_redrive_keeps_to_its_rate_and_stops_at_max_then_resumes(cluster, admin, unique_name):
    source, destination = unique_name("src"), unique_name("dst")
    admin.create_topic(source, partitions=1)
    admin.create_topic(destination, partitions=3)
    dlq = dead_letters(cluster.bootstrap, source, 16)
    group = unique_name("redrive")
    first = redrive(cluster.bootstrap, dlq, to_topic=destination, rate_per_s=10, max_messages=12, group=group)
    assert (first.moved, first.remaining, first.stopped) == (12, 4, "max-messages")
    assert first.elapsed_s >= (12 - 1) / 10, "a burst of one, then one every 100 ms"
    second = redrive(cluster.bootstrap, dlq, to_topic=destination, rate_per_s=1_000, group=group)
    assert (second.moved, second.remaining, second.stopped) == (4, 0, "caught-up")
    moved = sorted(origin_offsets(cluster.bootstrap, destination, dlq))
    assert moved == list(range(16)), "each record moved once across the two runs"


def origin_offsets(bootstrap: str, topic: str, dlq: str) -> list[int]:
    """The DLQ offset each record of `topic` was redriven from."""
    found = []
    with Admin(bootstrap) as admin, Consumer(bootstrap) as reader:
        for partition in range(len(admin.describe_topic(topic).partitions)):
            end = admin.list_offsets(topic, partition, -1).high_watermark
            for record in read_range(reader, TopicPartition(topic, partition), 0, end, end, 10_000):
                origin = dict(record.headers)[HEADER_REDRIVEN_FROM].decode()
                assert origin.startswith(f"{dlq}/0/")
                found.append(int(origin.rsplit("/", 1)[1]))
    return found


def redrive_in_child(bootstrap: str, dlq: str, destination: str, group: str) -> None:
    redrive(bootstrap, dlq, to_topic=destination, rate_per_s=20, group=group)


def test_a_killed_redrive_resumes_without_losing_a_record(cluster, admin, unique_name):
    source, destination = unique_name("src"), unique_name("dst")
    admin.create_topic(source, partitions=1)
    admin.create_topic(destination, partitions=1)
    dlq = dead_letters(cluster.bootstrap, source, 30)
    group = unique_name("redrive")
    child = multiprocessing.get_context("spawn").Process(
        target=redrive_in_child, args=(cluster.bootstrap, dlq, destination, group), daemon=True)
    child.start()
    try:
        deadline = time.monotonic() + 30
        while admin.list_offsets(destination, 0, -1).high_watermark < 8:
            assert time.monotonic() < deadline and child.is_alive(), "the redrive made no progress"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)
    assert child.exitcode == -signal.SIGKILL, "killed in the middle, not finished"
    resumed = redrive(cluster.bootstrap, dlq, to_topic=destination, rate_per_s=1_000, group=group)
    assert resumed.stopped == "caught-up" and 0 < resumed.moved <= 30 - 8 + 2
    moved = origin_offsets(cluster.bootstrap, destination, dlq)
    assert sorted(set(moved)) == list(range(30)), "nothing lost"
    assert len(moved) - 30 <= 2, "at most the one unacknowledged batch (2 records at 20/s) twice"


def test_the_dlq_topic_grows_with_its_source(cluster, admin, unique_name):
    from railmq.dlq import DeadLetter
    from railmq.records import ConsumerRecord

    source = unique_name("growing")
    admin.create_topic(source, partitions=1)
    with DeadLetterWriter.connect(cluster.bootstrap) as writer:
        for partition in (0, 2):
            if partition == 2:
                admin.create_partitions(source, 3)
            record = ConsumerRecord(timestamp_ms=1, key=None, value=b"v", topic=source, partition=partition,
                                    offset=0)
            letter = DeadLetter.of_failure(record, group="g", reason="rejected", attempts=1, last_error="E()",
                                           first_delivery_ms=1, dead_lettered_ms=2)
            where = writer.write(letter)
            assert (where.topic, where.partition) == (f"{source}.dlq", partition)
    assert len(admin.describe_topic(f"{source}.dlq").partitions) == 3


def test_a_poison_record_as_large_as_its_topic_allows_still_reaches_the_dlq(cluster, admin, unique_name):
    """The ten railmq.dlq.* headers make a dead letter larger than its source record: one near the
    source topic's batch_bytes_max (8 MiB by default) once failed MESSAGE_TOO_LARGE for good, and
    its consumer could never commit past it."""
    source = unique_name("large")
    admin.create_topic(source, partitions=1, replication_factor=2)
    value = b"x" * (8 * 1024 * 1024 - 1024)  # its dead letter is past 8 MiB
    with Producer(cluster.bootstrap, acks="all", batch_bytes_max=8 * 1024 * 1024) as producer:
        producer.send(source, value, key=b"big").result(30)
    with Consumer(cluster.bootstrap) as reader:
        [poison] = read_range(reader, TopicPartition(source, 0), 0, 1, 1, 20_000)
    handler_error = ValueError("\u00e9" * 2000)  # the longest last_error there is, in 2-byte characters
    with DeadLetterWriter.connect(cluster.bootstrap) as writer:
        handler = RetryingHandler(lambda record: (_ for _ in ()).throw(handler_error),
                                  RetryPolicy(attempts=1), writer, unique_name("g" * 200))
        outcome = handler(poison)
    assert outcome.status == "dead-lettered"
    [letter] = inspect(cluster.bootstrap, f"{source}.dlq", limit=1, timeout_ms=20_000)
    assert (letter.source_offset, letter.key, letter.value) == (0, b"big", value)


def test_redrive_stops_at_a_record_that_names_no_source_and_moves_it_when_told_where(cluster, admin,
                                                                                    unique_name):
    source, elsewhere = unique_name("src"), unique_name("elsewhere")
    admin.create_topic(source, partitions=1)
    admin.create_topic(elsewhere, partitions=1)
    dlq = dead_letters(cluster.bootstrap, source, 2)
    with Producer(cluster.bootstrap, acks="all") as producer:
        producer.send(dlq, b"written by hand", partition=0).result(10)
    dead_letters(cluster.bootstrap, source, 1)
    [*_, stray, _] = inspect(cluster.bootstrap, dlq)
    assert "source_topic is missing" in stray.malformed
    group = unique_name("redrive")
    with pytest.raises(MalformedDeadLetter, match=f"{dlq}/0@2 names no source"):
        redrive(cluster.bootstrap, dlq, group=group)
    assert admin.list_offsets(source, 0, -1).high_watermark == 2, "the two before it moved"
    rest = redrive(cluster.bootstrap, dlq, to_topic=elsewhere, group=group)
    assert (rest.moved, rest.stopped) == (2, "caught-up"), "it resumes at the stray record"
    assert sorted(origin_offsets(cluster.bootstrap, elsewhere, dlq)) == [2, 3]


# --------------------------------------------------------------------------- the command line


@pytest.fixture
def dlq_command(cluster, capsys, monkeypatch):
    """Run `railmq dlq ...` through cli_dlq's parsers in this process: (exit code, stdout, stderr)."""
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps tables to the terminal width

    def run(*argv: str) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser(prog="railmq")
        cli_dlq.register(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(["dlq", *argv, "--bootstrap", cluster.bootstrap])
        code = args.handler(args)
        out, err = capsys.readouterr()
        return code, out, err
    return run


def table_rows(text: str) -> list[list[str]]:
    """The cells of each row of a rich table."""
    rows = [line.strip().strip("│") for line in text.splitlines() if "│" in line]
    return [[cell.strip() for cell in row.split("│")] for row in rows]


def test_the_dlq_commands_list_inspect_and_redrive(cluster, admin, dlq_command, unique_name):
    source, destination = unique_name("src"), unique_name("dst")
    admin.create_topic(source, partitions=1)
    admin.create_topic(destination, partitions=1)
    dlq = dead_letters(cluster.bootstrap, source, 3)
    code, out, _ = dlq_command("list")
    assert code == 0 and [dlq, source, "1", "3", "3"] in table_rows(out)
    code, out, _ = dlq_command("inspect", dlq, "--limit", "2", "--json")
    letters = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert [(d["source_offset"], d["value"], d["reason"]) for d in letters] == [
        (0, "v0", "rejected"), (1, "v1", "rejected")]
    code, out, _ = dlq_command("inspect", dlq)
    assert code == 0 and f"{source}/0@2" in out and "rejected" in out
    code, out, _ = dlq_command("redrive", dlq, "--to", destination, "--rate", "100")
    assert code == 0 and f"3 moved, 0 left" in out and destination in out
    code, out, _ = dlq_command("list")
    assert [dlq, source, "1", "3", "0"] in table_rows(out), "the depth stays, nothing is left to redrive"


def test_the_dlq_commands_report_errors_and_refuse_bad_flags(dlq_command, unique_name, capsys):
    missing = unique_name("missing")
    code, _, err = dlq_command("inspect", f"{missing}.dlq")
    assert code == 1 and err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION: ")
    bad = (["redrive", "x.dlq", "--rate", "0"], ["inspect", "x.dlq", "--limit", "many"], ["purge", "x.dlq"])
    for flags in bad:
        with pytest.raises(SystemExit) as exited:
            dlq_command(*flags)
        assert exited.value.code == 2, flags
    from railmq.cli_common import UsageError

    with pytest.raises(UsageError, match="round in circles"):
        dlq_command("redrive", "x.dlq", "--to", "x.dlq")
