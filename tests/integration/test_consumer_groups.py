"""Consumer groups on a real cluster: queue and pub/sub from one log, replay, crashes and zombies.

Members that must die by SIGKILL or freeze by SIGSTOP run as child processes (`group_member`
below) that log every processed record and every commit outcome to a JSON-lines file, so the test
can count exactly what was processed, committed and redelivered."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time

import pytest

from actors.errors import RailmqError
from railmq.consumer import Consumer
from railmq.producer import Producer
from tests.helpers import created_again, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GROUP_OPTIONS = dict(session_timeout_ms=1000, heartbeat_interval_ms=100, auto_offset_reset="earliest",
                     enable_auto_commit=False)


def produce(bootstrap: str, topic: str, count: int, partitions: int) -> None:
    with Producer(bootstrap, acks="all") as producer:
        for i in range(count):
            producer.send(topic, f"{i}", partition=i % partitions)
        producer.flush(30)


def drain(consumer: Consumer, expected: int, timeout_s: float = 30.0) -> list:
    records: list = []
    deadline = time.monotonic() + timeout_s
    while len(records) < expected and time.monotonic() < deadline:
        records += consumer.poll(100)
    return records


def group_member(bootstrap: str, topic: str, group: str, log_path: str, mode: str, stop_after: int,
                 commit_every: int) -> None:
    """A member in its own process. mode: 'after' commits after processing (at-least-once),
    'before' commits before processing (at-most-once), 'late' is 'after' except that the last
    batch is committed only when the process notices it was paused (a zombie's late commit).
    After `stop_after` records it logs 'parked' and processes nothing more, waiting to be killed
    or paused."""
    log = open(log_path, "a", buffering=1)
    consumer = Consumer(bootstrap, group_id=group, client_id="child", **GROUP_OPTIONS)
    consumer.subscribe([topic])
    processed = 0
    uncommitted: dict = {}
    while True:
        records = consumer.poll(100, max_records=commit_every)
        if processed >= stop_after:
            log.write(json.dumps({"event": "parked"}) + "\n")
            last = time.monotonic()
            while True:
                time.sleep(0.05)
                now, paused = time.monotonic(), time.monotonic() - last > 1.0
                last = now
                if mode != "late" or not paused:
                    continue
                mode = "done"  # woke up from a pause: try to commit what it processed before
                try:
                    consumer.commit(dict(uncommitted))
                    log.write(json.dumps({"event": "late-commit", "ok": True}) + "\n")
                except RailmqError as error:
                    log.write(json.dumps({"event": "late-commit", "ok": False, "error": error.name}) + "\n")
        if not records:
            continue
        if mode == "before":
            consumer.commit({(r.topic, r.partition): r.offset + 1 for r in records})
            log.write(json.dumps({"event": "committed", "upto": [[r.partition, r.offset + 1] for r in records]}) + "\n")
        for record in records:
            log.write(json.dumps({"event": "processed", "partition": record.partition, "offset": record.offset}) + "\n")
            processed += 1
            uncommitted[(record.topic, record.partition)] = record.offset + 1
            if processed >= stop_after:
                break
        if mode in ("after", "late") and processed < stop_after:
            consumer.commit(dict(uncommitted))
            log.write(json.dumps({"event": "committed", "upto": [[tp[1], o] for tp, o in uncommitted.items()]}) + "\n")
            uncommitted.clear()


def start_member(*arguments) -> multiprocessing.Process:
    process = multiprocessing.get_context("spawn").Process(target=group_member, args=arguments, daemon=True)
    process.start()
    return process


def read_log(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def stop_process(process: multiprocessing.Process) -> None:
    if process.is_alive():
        os.kill(process.pid, signal.SIGCONT)
        process.kill()
    process.join(10)


def test_two_groups_each_receive_every_message_and_a_new_group_replays(cluster, admin, unique_name):
    topic = unique_name()
    admin.create_topic(topic, partitions=3)
    produce(cluster.bootstrap, topic, 300, 3)
    groups = {}
    for name in ("billing", "audit"):
        members = [Consumer(cluster.bootstrap, group_id=f"{topic}-{name}", client_id=f"{name}-{i}", **GROUP_OPTIONS)
                   for i in range(2)]
        for member in members:
            member.subscribe([topic])
        records: list = []
        deadline = time.monotonic() + 30
        while len(records) < 300 and time.monotonic() < deadline:
            for member in members:
                records += member.poll(50)
        groups[name] = records
        assignments = [set(member.assignment()) for member in members]
        assert not (assignments[0] & assignments[1]), "a partition belongs to one member of a group"
        for member in members:
            member.commit()
            member.close()
    for name, records in groups.items():
        assert sorted(int(r.value) for r in records) == list(range(300)), f"group {name} got every message once"
    with Consumer(cluster.bootstrap, group_id=f"{topic}-replay", **GROUP_OPTIONS) as replay:
        replay.subscribe([topic])
        assert sorted(int(r.value) for r in drain(replay, 300)) == list(range(300)), "a new group replays history"


def test_members_beyond_the_partition_count_are_idle(cluster, admin, unique_name):
    topic = unique_name()
    admin.create_topic(topic, partitions=2)
    members = [Consumer(cluster.bootstrap, group_id=topic, client_id=f"m{i}", **GROUP_OPTIONS) for i in range(3)]
    try:
        for member in members:
            member.subscribe([topic])
        wait_for(lambda: [m.poll(20) for m in members] and sum(len(m.assignment()) for m in members) == 2
                 and len({m.generation() for m in members}) == 1, timeout_s=30, what="a stable assignment")
        sizes = sorted(len(member.assignment()) for member in members)
        assert sizes == [0, 1, 1], "two partitions, three members: one is idle"
    finally:
        for member in members:
            member.close()


def kill_once_parked(bootstrap: str, topic: str, log_path: str, mode: str, stop_after: int) -> list[dict]:
    """Run a member (committing every 10 records) until it has processed `stop_after` records,
    SIGKILL it, and return its log."""
    child = start_member(bootstrap, topic, topic, log_path, mode, stop_after, 10)
    try:
        wait_for(lambda: any(e["event"] == "parked" for e in read_log(log_path)),
                 timeout_s=30, what=f"the member to process {stop_after}")
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    finally:
        stop_process(child)
    return read_log(log_path)


def test_sigkill_mid_batch_redelivers_exactly_the_processed_but_uncommitted(cluster, admin, unique_name, tmp_path):
    topic = unique_name()
    admin.create_topic(topic, partitions=2)
    produce(cluster.bootstrap, topic, 200, 2)
    entries = kill_once_parked(cluster.bootstrap, topic, str(tmp_path / "member.jsonl"), "after", 55)
    processed = {(e["partition"], e["offset"]) for e in entries if e["event"] == "processed"}
    committed: dict[int, int] = {}
    for entry in entries:
        if entry["event"] == "committed":
            for partition, offset in entry["upto"]:
                committed[partition] = max(committed.get(partition, 0), offset)
    uncommitted = {(p, o) for p, o in processed if o >= committed.get(p, 0)}
    assert len(processed) == 55 and len(uncommitted) == 5
    with Consumer(cluster.bootstrap, group_id=topic, **GROUP_OPTIONS) as survivor:
        survivor.subscribe([topic])
        records = drain(survivor, 200 - len(processed) + len(uncommitted))
    redelivered = {(r.partition, r.offset) for r in records} & processed
    assert redelivered == uncommitted, "exactly the processed-but-uncommitted records come again"
    assert {(r.partition, r.offset) for r in records} | processed == {(p, o) for p in range(2) for o in range(100)}


def auto_committing_member(bootstrap: str, topic: str, log_path: str, polls_processed: int) -> None:
    """A member with auto-commit on (the default) that processes `polls_processed` polls' records,
    then takes one more poll's records and is killed before processing any of them."""
    log = open(log_path, "a", buffering=1)
    consumer = Consumer(bootstrap, group_id=topic, client_id="auto", max_poll_records=10,
                        auto_commit_interval_ms=0, **{**GROUP_OPTIONS, "enable_auto_commit": True})
    consumer.subscribe([topic])
    polls = 0
    while True:
        records = consumer.poll(100)
        if not records:
            continue
        polls += 1
        if polls > polls_processed:
            log.write(json.dumps({"event": "received", "offsets": [r.offset for r in records]}) + "\n")
            while True:
                time.sleep(1)  # killed while "processing" them
        for record in records:
            log.write(json.dumps({"event": "processed", "partition": record.partition,
                                  "offset": record.offset}) + "\n")


def test_auto_commit_never_commits_the_records_a_poll_just_returned(cluster, admin, unique_name, tmp_path):
    """Auto-commit commits what earlier polls returned (Kafka commits at the start of poll): a
    member killed while processing a poll's records leaves those records to the next owner. It
    committed them inside the very poll that returned them, and all 10 were never delivered again."""
    topic = unique_name()
    admin.create_topic(topic, partitions=1)
    produce(cluster.bootstrap, topic, 100, 1)
    log_path = str(tmp_path / "auto.jsonl")
    child = multiprocessing.get_context("spawn").Process(
        target=auto_committing_member, args=(cluster.bootstrap, topic, log_path, 2), daemon=True)
    child.start()
    try:
        wait_for(lambda: any(e["event"] == "received" for e in read_log(log_path)), timeout_s=30,
                 what="the member to take its third poll")
        time.sleep(0.5)  # an auto-commit sent in that poll reaches the coordinator
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    finally:
        stop_process(child)
    entries = read_log(log_path)
    processed = {e["offset"] for e in entries if e["event"] == "processed"}
    in_flight = next(e["offsets"] for e in entries if e["event"] == "received")
    assert len(processed) == 20 and len(in_flight) == 10
    with Consumer(cluster.bootstrap, group_id=topic, **GROUP_OPTIONS) as survivor:
        survivor.subscribe([topic])
        records = drain(survivor, 100 - len(processed))
    delivered = {r.offset for r in records}
    assert set(in_flight) <= delivered, f"never delivered again: {sorted(set(in_flight) - delivered)}"
    assert delivered | processed == set(range(100))


def test_a_handler_failing_inside_a_with_block_leaves_the_failed_poll_uncommitted(
        cluster, admin, unique_name):
    """Auto-commit is on and the handler raises at the fourth record of a poll: leaving the `with`
    block closes the consumer, and its last commit covered the whole poll: that record and the 6
    after it were never handled by anyone. Now it commits only what earlier polls returned."""
    topic = unique_name()
    admin.create_topic(topic, partitions=1)
    produce(cluster.bootstrap, topic, 30, 1)
    handled: list[int] = []
    with pytest.raises(RuntimeError, match="the handler failed"):
        with Consumer(cluster.bootstrap, group_id=topic, client_id="failing", max_poll_records=10,
                      **{**GROUP_OPTIONS, "enable_auto_commit": True}) as consumer:
            consumer.subscribe([topic])
            while True:
                for record in consumer.poll(100):
                    if record.offset == 13:
                        raise RuntimeError("the handler failed")
                    handled.append(record.offset)
    assert handled == list(range(13))
    with Consumer(cluster.bootstrap, group_id=topic, **GROUP_OPTIONS) as survivor:
        survivor.subscribe([topic])
        records = drain(survivor, 30 - 10)
    assert min(record.offset for record in records) == 10, "from the start of the poll that failed"
    assert {record.offset for record in records} | set(handled) == set(range(30))


def test_at_most_once_loses_exactly_the_in_flight_records(cluster, admin, unique_name, tmp_path):
    topic = unique_name()
    admin.create_topic(topic, partitions=1)
    produce(cluster.bootstrap, topic, 100, 1)
    entries = kill_once_parked(cluster.bootstrap, topic, str(tmp_path / "member.jsonl"), "before", 25)
    processed = {e["offset"] for e in entries if e["event"] == "processed"}
    committed = max(offset for e in entries if e["event"] == "committed" for _, offset in e["upto"])
    in_flight = set(range(max(processed) + 1, committed))
    assert processed == set(range(25)) and committed == 30 and len(in_flight) == 5
    with Consumer(cluster.bootstrap, group_id=topic, **GROUP_OPTIONS) as survivor:
        survivor.subscribe([topic])
        records = drain(survivor, 100 - committed)
    seen = {r.offset for r in records}
    assert seen == set(range(committed, 100)), "the survivor resumes at the commit made before processing"
    assert not (seen | processed) & in_flight, "the in-flight records are lost: nobody processes them"


def test_a_paused_member_is_fenced_and_its_late_commit_refused(cluster, admin, unique_name, tmp_path):
    topic = unique_name()
    admin.create_topic(topic, partitions=1)
    produce(cluster.bootstrap, topic, 60, 1)
    log_path = str(tmp_path / "member.jsonl")
    child = start_member(cluster.bootstrap, topic, topic, log_path, "late", 20, 10)
    try:
        wait_for(lambda: any(e["event"] == "parked" for e in read_log(log_path)),
                 timeout_s=30, what="the member to park")
        os.kill(child.pid, signal.SIGSTOP)
        with Consumer(cluster.bootstrap, group_id=topic, **GROUP_OPTIONS) as survivor:
            survivor.subscribe([topic])
            records = drain(survivor, 50)
            assert {r.offset for r in records} == set(range(10, 60)), "the survivor starts at the last commit"
            survivor.commit()
            # The member tells it was paused by a gap of more than 1 s in its 50 ms loop; the
            # survivor may get here in about the 1 s session, so the pause must last beyond it.
            time.sleep(1.2)
            os.kill(child.pid, signal.SIGCONT)
            late = wait_for(lambda: [e for e in read_log(log_path) if e["event"] == "late-commit"],
                            timeout_s=30, what="the zombie's late commit")
            assert late[0]["ok"] is False and late[0]["error"] in ("ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID",
                                                                    "REBALANCE_IN_PROGRESS")
            committed = survivor.committed([(topic, 0)])[(topic, 0)]
            assert committed == 60, "the zombie's commit did not move the group's offset back"
    finally:
        stop_process(child)


def test_a_group_coordinator_kill_neither_rebalances_nor_redelivers(cluster, admin, unique_name):
    """The membership of a Stable group is durable: a restarted group coordinator lets members carry
    on in their generation, so nothing is consumed twice though commits failed while it was down."""
    topic = unique_name()
    admin.create_topic(topic, partitions=2)
    options = {**GROUP_OPTIONS, "session_timeout_ms": 3000, "request_timeout_ms": 1000}
    members = [Consumer(cluster.bootstrap, group_id=topic, client_id=f"m{i}", **options) for i in range(2)]
    seen: list[int] = []

    def consume_until(total: int) -> None:
        deadline = time.monotonic() + 30
        while len(seen) < total and time.monotonic() < deadline:
            for member in members:
                records = member.poll(50)
                seen.extend(int(record.value) for record in records)
                if records:
                    try:
                        member.commit()
                    except RailmqError:
                        pass  # the group coordinator is down: the next commit covers these

    try:
        for member in members:
            member.subscribe([topic])
        wait_for(lambda: [m.poll(20) for m in members] and all(len(m.assignment()) == 1 for m in members)
                 and len({m.generation() for m in members}) == 1, timeout_s=30, what="a stable assignment")
        generations = [member.generation() for member in members]
        produce(cluster.bootstrap, topic, 200, 2)
        consume_until(200)
        cluster.kill(cluster.group_coordinator_name())
        produce(cluster.bootstrap, topic, 200, 2)
        consume_until(400)

        def commits_land() -> bool:
            for member in members:  # keep polling: a member that had to rejoin would read its records again
                seen.extend(int(record.value) for record in member.poll(20))
            try:
                for member in members:
                    member.commit()
                return True
            except RailmqError:
                return False

        wait_for(commits_land, timeout_s=15, what="commits to the restarted coordinator")
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            for member in members:
                seen.extend(int(record.value) for record in member.poll(50))
        assert sorted(seen) == sorted(list(range(200)) * 2), "every record once, none redelivered"
        assert [member.generation() for member in members] == generations, "no rebalance after the restart"
        committed = members[0].committed([(topic, 0), (topic, 1)])
    finally:
        for member in members:
            member.close()
    assert sum(committed.values()) == 400, f"the last commits cover everything consumed: {committed}"


def test_a_topic_deleted_and_made_again_under_its_name_is_read_from_its_start_not_from_the_old_offsets(
        cluster, admin, unique_name):
    """The group committed offset 30 of the old topic. The new one, under the same name, got 40
    records while the group was away: resuming at 30 skipped 30 records it never delivered."""
    topic, group = unique_name(), unique_name()
    admin.create_topic(topic, partitions=1)
    produce(cluster.bootstrap, topic, 30, 1)
    with Consumer(cluster.bootstrap, group_id=group, client_id="before", **GROUP_OPTIONS) as consumer:
        consumer.subscribe([topic])
        assert len(drain(consumer, 30)) == 30
        consumer.commit()
    admin.delete_topic(topic)
    wait_for(lambda: topic not in [known.name for known in admin.metadata().topics], timeout_s=20,
             what="the topic gone from metadata")
    wait_for(lambda: created_again(admin, topic), timeout_s=30, what="the topic made again")
    admin.wait_for_leaders(topic)
    with Producer(cluster.bootstrap, acks="all") as producer:
        for index in range(40):
            producer.send(topic, f"new-{index}", partition=0)
        producer.flush(30)

    with Consumer(cluster.bootstrap, group_id=group, client_id="after", **GROUP_OPTIONS) as consumer:
        consumer.subscribe([topic])
        records = drain(consumer, 40, timeout_s=20)

    assert [record.value.decode() for record in records] == [f"new-{index}" for index in range(40)]
