"""A replica that finds damage on its own disk says so, and gets the data back from its leader
(actors/replica_health.py); a follower never lets a leader truncate what it saw committed; a
replica answers only for its own partition (actors/replica_fetch.py)."""

from __future__ import annotations

import pytest

from actors.errors import ErrorCode
from actors.limits import Limits
from actors.messages import (
    AlterIsrResponse, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, PartitionState,
    ProduceRequest, ProduceResponse, ReplicaHeartbeat, ReplicaHeartbeatResponse, TopicConfig,
)
from actors.partition_replica import PartitionReplica
from storage.log import LogConfig
from storage.memory import MemoryFileSystem
from storage.replica_meta import ReplicaMeta, open_replica_directory
from tests.unit.actor_harness import Harness, only
from tests.unit.test_partition_replica import CLIENT, COORDINATOR, LEADER, TOPIC_ID, Stage, batch

FOLLOWER, OTHER_LEADER = "tcp://127.0.0.1:9/orders/0/n1", "tcp://127.0.0.1:9/orders/0/n2"
DIRECTORY = "/replica"
LIMITS = Limits()


def meta(node: int = 1) -> ReplicaMeta:
    return ReplicaMeta(cluster_id="c", topic="orders", topic_id=TOPIC_ID, partition=0, node=node, replicas=[1, 2, 3])


def heartbeats(harness: Harness) -> list[ReplicaHeartbeat]:
    return harness.take(COORDINATOR, ReplicaHeartbeat)


class FollowerStage:
    """Node 1 follows node 2 (played by the test) over a replica directory on a memory disk."""

    def __init__(self, fs: MemoryFileSystem | None = None, *, epoch: int = 3, last_unclean_epoch: int = -1) -> None:
        self.fs = fs or MemoryFileSystem()
        self.open()
        self.state(epoch, last_unclean_epoch)

    def open(self) -> None:
        opened = open_replica_directory(self.fs, DIRECTORY, meta(), LogConfig(segment_bytes=2048), now_ms=0)
        self.log, self.health = opened.log, opened.health
        self.harness = Harness()
        self.replica = PartitionReplica(
            topic="orders", topic_id=TOPIC_ID, partition=0, node=1, endpoint=FOLLOWER, coordinator=COORDINATOR,
            log=self.log, config=TopicConfig(), incarnation=7, limits=LIMITS, health=self.health,
            findings=opened.findings)
        self.harness.add(FOLLOWER, self.replica)

    def state(self, epoch: int, last_unclean_epoch: int = -1) -> None:
        state = PartitionState(topic="orders", topic_id=TOPIC_ID, partition=0, leader=2, leader_endpoint=OTHER_LEADER,
                               leader_epoch=epoch, partition_epoch=epoch, replicas=[1, 2, 3], isr=[2, 3],
                               last_unclean_epoch=last_unclean_epoch)
        self.epoch = epoch
        self.harness.deliver(FOLLOWER, ReplicaHeartbeatResponse(state=state), COORDINATOR)

    def fetch(self) -> FetchRequest:
        requests = self.harness.take(OTHER_LEADER, FetchRequest)
        assert requests, "the follower has no fetch in flight"
        return requests[-1]

    def answer(self, request: FetchRequest, records: bytes = b"", *, high_watermark: int = 0,
               log_end_offset: int | None = None, diverging=None) -> list:
        end = log_end_offset if log_end_offset is not None else request.offset
        response = FetchResponse(correlation_id=request.correlation_id, topic="orders", partition=0,
                                 high_watermark=high_watermark, log_end_offset=end, leader_epoch=self.epoch,
                                 diverging_epoch=diverging, records=records)
        return self.harness.deliver(FOLLOWER, response, OTHER_LEADER)


def leader_batches(count: int, *, epoch: int, start: int = 0) -> bytes:
    """`count` one-record batches as a leader of `epoch` would send them, from offset `start`."""
    from storage.memory import open_memory_log

    log = open_memory_log(LogConfig())
    if start:
        log.reset_to(start)
    for index in range(count):
        log.append_producer_batch(batch(1, tag=f"x{start + index}"), epoch, 0)
    return log.read(start, 1 << 20)


# ---------------------------------------------------------------------------- finding damage


def test_a_leader_whose_read_meets_bit_rot_refuses_the_range_and_tells_the_coordinator_at_once():
    stage = Stage()
    stage.produce(count=3)
    stage.catch_up()
    segment = [name for name in stage.fs.list_directory("/log") if name.endswith(".log")][0]
    stage.fs.corrupt(f"/log/{segment}", 100)  # inside the first batch's payload (under the CRC)
    stage.harness.take(COORDINATOR, ReplicaHeartbeat)

    response = only(stage.consumer_fetch(0), FetchResponse)

    assert response.error == ErrorCode.STORAGE_ERROR
    beat = only(heartbeats(stage.harness), ReplicaHeartbeat)
    assert beat.storage.state == "damaged"
    assert beat.storage.damage == [(0, 2)]
    assert stage.harness.trace_events("storage-damage-found")


@pytest.mark.parametrize("ask", ["timestamp", "long poll"])
def test_a_header_walk_that_meets_bit_rot_refuses_the_range_instead_of_ending_the_replica(ask):
    """A ListOffsets by time and a waiting fetch walk batch headers, and a header damaged after the
    log was opened (a record count read as 4,294,967,294) raised CorruptBatch out of the replica's
    step: one client's request ended the leader's process. Now: refused as a read refuses it."""
    stage = Stage()
    sizes = [len(batch(1, first_timestamp_ms=1_000 + index)) for index in range(4)]
    for index in range(4):
        stage.produce(batch(1, first_timestamp_ms=1_000 + index))
    stage.catch_up()
    segment = [name for name in stage.fs.list_directory("/log") if name.endswith(".log")][0]
    for byte in range(36, 40):  # the second batch's record count
        stage.fs.corrupt(f"/log/{segment}", sizes[0] + byte)
    stage.harness.take(COORDINATOR, ReplicaHeartbeat)

    if ask == "timestamp":
        assert stage.list_offsets(1_002).error == ErrorCode.STORAGE_ERROR
    else:
        stage.consumer_fetch(0, max_wait_ms=500, min_bytes=1 << 20)

    beat = only(heartbeats(stage.harness), ReplicaHeartbeat)
    assert beat.storage.state == "damaged" and beat.storage.damage[0][0] == 1
    assert only(stage.consumer_fetch(1), FetchResponse).error == ErrorCode.STORAGE_ERROR
    assert only(stage.consumer_fetch(0, max_bytes=1), FetchResponse).error == ErrorCode.NONE


def test_the_scrubber_finds_bit_rot_in_a_follower_log_nobody_reads():
    follower = FollowerStage()
    follower.answer(follower.fetch(), leader_batches(6, epoch=3), high_watermark=6, log_end_offset=6)
    segment = [name for name in follower.fs.list_directory(DIRECTORY) if name.endswith(".log")][0]
    follower.fs.corrupt(f"{DIRECTORY}/{segment}", 200)
    heartbeats(follower.harness)

    follower.harness.advance(LIMITS.scrub_interval_ms * 3)

    assert follower.replica.storage.damaged
    assert any(beat.storage.state == "repairing" for beat in heartbeats(follower.harness))


# ---------------------------------------------------------------------------- repairing


def test_a_follower_with_a_refused_range_truncates_below_it_refetches_and_reports_ok_again():
    fs = MemoryFileSystem()
    first = FollowerStage(fs)
    first.answer(first.fetch(), leader_batches(6, epoch=3), high_watermark=6, log_end_offset=6)
    first.log.close()
    segment = sorted(name for name in fs.list_directory(DIRECTORY) if name.endswith(".log"))[0]
    fs.corrupt(f"{DIRECTORY}/{segment}", 4)  # a flushed batch's stamped offset: refused on open

    follower = FollowerStage(fs)  # restarted over the damaged directory

    assert follower.replica.storage.damaged
    request = follower.fetch()
    assert request.offset == 0 and request.repairing, "the refused range and all after it is fetched again"
    assert follower.harness.trace_events("repair-truncated")
    follower.answer(request, leader_batches(6, epoch=3), high_watermark=6, log_end_offset=6)
    assert follower.replica.storage.healthy
    assert follower.log.log_end_offset == 6
    assert not follower.fetch().repairing
    assert follower.harness.trace_events("storage-repaired")
    assert not follower.log.corrupt_ranges


def test_a_follower_that_lost_its_first_segment_fetches_everything_again():
    """Its files now begin above the log start its checkpoint names: the offsets below are lost,
    not retained away. It says it is damaged (so it is not elected) and empties its log down to
    the lost offsets, which it fetches again with everything after them."""
    fs = MemoryFileSystem()
    first = FollowerStage(fs)
    first.answer(first.fetch(), leader_batches(60, epoch=3), high_watermark=60, log_end_offset=60)
    first.log.close()
    segments = sorted(name for name in fs.list_directory(DIRECTORY) if name.endswith(".log"))
    assert len(segments) >= 2
    fs.remove(f"{DIRECTORY}/{segments[0]}")

    follower = FollowerStage(fs)  # restarted over the directory

    assert follower.replica.storage.damaged
    request = follower.fetch()
    assert request.offset == 0 and request.repairing
    follower.answer(request, leader_batches(60, epoch=3), high_watermark=60, log_end_offset=60)
    assert follower.replica.storage.healthy
    assert (follower.log.log_start_offset, follower.log.log_end_offset) == (0, 60)
    assert follower.log.read(0, 1 << 20)


def test_a_new_directory_is_repaired_once_it_has_caught_up_with_its_leader():
    follower = FollowerStage()
    assert follower.replica.storage.state() == "new"

    follower.answer(follower.fetch(), leader_batches(3, epoch=3), high_watermark=3, log_end_offset=5)
    assert follower.replica.storage.state() == "new", "not caught up yet: the leader has 5"
    follower.answer(follower.fetch(), leader_batches(2, epoch=3, start=3), high_watermark=5, log_end_offset=5)

    assert follower.replica.storage.state() == "ok"


# ---------------------------------------------------------------------------- the committed floor


def diverging_to(end_offset: int, epoch: int = 3):
    from actors.messages import EpochEndOffset

    return EpochEndOffset(epoch=epoch, end_offset=end_offset)


def test_a_follower_refuses_to_truncate_below_what_it_saw_committed():
    follower = FollowerStage()
    follower.answer(follower.fetch(), leader_batches(6, epoch=3), high_watermark=6, log_end_offset=6)
    follower.state(epoch=4)  # a new leader...

    follower.answer(follower.fetch(), diverging=diverging_to(2))  # ... claims epoch 3 ended at 2

    assert follower.log.log_end_offset == 6
    refused = follower.harness.trace_events("follower-refused-truncation")
    assert refused and refused[0]["committed_offset"] == 6
    follower.replica.invariants()


def test_after_an_unclean_election_the_follower_truncates_as_told():
    follower = FollowerStage()
    follower.answer(follower.fetch(), leader_batches(6, epoch=3), high_watermark=6, log_end_offset=6)
    follower.state(epoch=4, last_unclean_epoch=4)

    follower.answer(follower.fetch(), diverging=diverging_to(2))

    assert follower.log.log_end_offset == 2
    assert follower.replica.committed_offset == 2
    follower.replica.invariants()


def test_the_committed_floor_survives_a_restart():
    fs = MemoryFileSystem()
    first = FollowerStage(fs)
    first.answer(first.fetch(), leader_batches(6, epoch=3), high_watermark=5, log_end_offset=6)
    first.harness.advance(LIMITS.replica_heartbeat_interval_ms + 1)  # the floor is noted with the heartbeat
    first.replica.handle(__import__("actors.messages", fromlist=["Stop"]).Stop(), b"", 0)

    again = FollowerStage(fs, epoch=4)

    assert again.replica.committed_offset == 5
    again.answer(again.fetch(), diverging=diverging_to(3))
    assert again.log.log_end_offset == 6, "the restarted follower still defends offset 5"


def test_the_invariant_catches_a_follower_that_truncates_below_its_floor():
    follower = FollowerStage()
    follower.answer(follower.fetch(), leader_batches(6, epoch=3), high_watermark=6, log_end_offset=6)

    follower.log.truncate_to(2)  # what a follower that believed any leader would have done ...
    follower.replica.high_watermark = 2  # ... keeping its high watermark inside its log

    with pytest.raises(AssertionError, match="below the committed offset"):
        follower.replica.invariants()


# ---------------------------------------------------------------------------- who the request is for


@pytest.mark.parametrize("topic, partition, topic_id, code", [
    ("payments", 0, 0, ErrorCode.NOT_LEADER),
    ("orders", 1, 0, ErrorCode.NOT_LEADER),
    ("orders", 99, 0, ErrorCode.NOT_LEADER),
    ("no-such-topic", 0, 0, ErrorCode.NOT_LEADER),
    ("orders", 0, TOPIC_ID + 1, ErrorCode.UNKNOWN_TOPIC_ID),
])
def test_a_produce_for_another_partition_is_refused_and_nothing_is_appended(topic, partition, topic_id, code):
    stage = Stage()
    request = ProduceRequest(correlation_id=5, topic=topic, partition=partition, topic_id=topic_id, acks=1,
                             batch=batch(3))

    response = only(stage.harness.deliver(LEADER, request, CLIENT), ProduceResponse)

    assert response.error == code
    assert (response.topic, response.partition) == (topic, partition), "the answer names what was asked"
    assert stage.log.log_end_offset == 0


def test_a_produce_naming_the_right_topic_id_is_appended():
    stage = Stage()
    request = ProduceRequest(correlation_id=5, topic="orders", partition=0, topic_id=TOPIC_ID, acks=1, batch=batch(3))

    assert only(stage.harness.deliver(LEADER, request, CLIENT), ProduceResponse).error == ErrorCode.NONE


@pytest.mark.parametrize("topic, partition", [("payments", 0), ("orders", 3)])
def test_fetch_and_list_offsets_for_another_partition_are_refused(topic, partition):
    stage = Stage()
    stage.produce(count=2)
    stage.catch_up()

    fetch = only(stage.harness.deliver(LEADER, FetchRequest(correlation_id=6, topic=topic, partition=partition,
                                                            offset=0, max_wait_ms=0), CLIENT), FetchResponse)
    listed = only(stage.harness.deliver(LEADER, ListOffsetsRequest(correlation_id=7, topic=topic, partition=partition,
                                                                   timestamp_ms=-1), CLIENT), ListOffsetsResponse)

    assert fetch.error == ErrorCode.NOT_LEADER and not len(fetch.records)
    assert (listed.error, listed.topic, listed.partition) == (ErrorCode.NOT_LEADER, topic, partition)


def test_list_offsets_answers_name_their_partition():
    stage = Stage()

    listed = stage.list_offsets(-1)

    assert (listed.topic, listed.partition, listed.error) == ("orders", 0, ErrorCode.NONE)


@pytest.mark.parametrize("message, needed", [
    (ReplicaHeartbeatResponse(deleted=True), True),
    (AlterIsrResponse(correlation_id=1), True),
    (FetchResponse(correlation_id=1), True),
    (FetchRequest(correlation_id=1, topic="orders", partition=0, offset=0, replica=2), True),
    (FetchRequest(correlation_id=1, topic="orders", partition=0, offset=0), False),
    (ProduceRequest(correlation_id=1, topic="orders", partition=0), False),
    (ListOffsetsRequest(correlation_id=1, topic="orders", partition=0, timestamp_ms=-1), False),
], ids=["state-push", "isr-answer", "fetch-answer", "follower-fetch", "consumer-fetch", "produce", "list-offsets"])
def test_what_a_replica_accepts_only_from_inside_the_cluster(message, needed):
    assert Stage().replica.needs_authentication(message) is needed


def test_the_scrubber_starts_over_at_the_log_start_even_while_records_keep_arriving():
    """A cursor that only followed the log end would never look at old data again while a
    producer keeps writing: each pass ends at the end and the next begins at the start."""
    follower = FollowerStage()
    follower.answer(follower.fetch(), leader_batches(6, epoch=3), high_watermark=6, log_end_offset=6)
    end = 6

    def one_more_record() -> None:
        nonlocal end
        follower.answer(follower.fetch(), leader_batches(1, epoch=3, start=end), high_watermark=end + 1,
                        log_end_offset=end + 1)
        end += 1

    follower.harness.advance(LIMITS.scrub_interval_ms)  # a first pass over the healthy log
    one_more_record()
    segment = [name for name in follower.fs.list_directory(DIRECTORY) if name.endswith(".log")][0]
    follower.fs.corrupt(f"{DIRECTORY}/{segment}", 200)  # old data rots after it was scrubbed
    for _ in range(6):  # new records before every scrub tick, until the next pass is due
        follower.harness.advance(LIMITS.scrub_interval_ms)
        one_more_record()
    assert not follower.harness.trace_events("storage-damage-found"), "passes wait for their interval"
    for _ in range(6):  # the next pass, with new records before each of its ticks
        follower.harness.advance(LIMITS.scrub_pass_interval_ms // 6)
        if follower.harness.trace_events("storage-damage-found"):
            break
        one_more_record()

    assert follower.harness.trace_events("storage-damage-found"), "the old damage was found while writes went on"


def test_an_idle_replica_scrubs_nothing_between_passes():
    follower = FollowerStage()
    follower.answer(follower.fetch(), leader_batches(6, epoch=3), high_watermark=6, log_end_offset=6)
    follower.harness.advance(LIMITS.scrub_interval_ms * 4)  # the first pass (one tick reads 6 batches)
    next_pass_ns = follower.harness.timers[FOLLOWER].deadline("scrub")

    assert next_pass_ns is not None and next_pass_ns - follower.harness.now_ns >= (
        LIMITS.scrub_pass_interval_ms - LIMITS.scrub_interval_ms * 4) * 1_000_000


def test_a_partition_state_with_new_retention_reaches_the_log():
    stage = Stage()
    config = TopicConfig(min_insync_replicas=2, retention_ms=5_000, retention_bytes=1_000_000)
    state = PartitionState(topic="orders", topic_id=TOPIC_ID, partition=0, leader=1, leader_endpoint=LEADER,
                           leader_epoch=1, partition_epoch=2, replicas=[1, 2, 3], isr=[1, 2, 3], config=config)

    stage.harness.deliver(LEADER, ReplicaHeartbeatResponse(state=state), COORDINATOR)

    assert (stage.log._config.retention_ms, stage.log._config.retention_bytes) == (5_000, 1_000_000)
    assert stage.replica.config.retention_ms == 5_000


def test_retention_never_deletes_what_the_followers_have_not_fetched():
    """A leader whose followers lag holds records above its high watermark. Retention that deleted
    them sent each follower past them (`OFFSET_OUT_OF_RANGE`, then a fetch from the log start),
    which the leader counted as holding them: acks=all acknowledged 10 records that no replica
    held and no consumer ever read. Retention stops at the high watermark (Kafka's rule)."""
    stage = Stage(retention_bytes=1, log_config=LogConfig(segment_bytes=150, retention_bytes=1))
    for round in range(6):
        stage.produce(batch(2, tag=f"b{round}"), acks=-1)  # one segment each; nobody has fetched
    assert len(stage.log._segments) == 6 and stage.replica.high_watermark == 0

    stage.harness.advance(10_000)  # retention runs
    first = only(stage.follower_fetch(2, 0), FetchResponse)
    stage.follower_fetch(3, 0)
    acknowledged = [reply for reply in stage.replies() if reply.error == ErrorCode.NONE]

    assert first.error == ErrorCode.NONE and first.records, "the follower gets what it had not fetched"
    assert stage.log.log_start_offset == 0
    assert all(reply.base_offset >= stage.log.log_start_offset for reply in acknowledged)

    stage.catch_up()
    stage.harness.advance(10_000)  # now replicated, below the high watermark: retention may delete it

    assert stage.replica.high_watermark == 12 and stage.log.log_start_offset == 10


# ---------------------------------------------------------------------------- a repair never takes back what the leader counted
# The simulator's seeds 20559 and 20606: a follower's scrubber found damage, and the follower cut
# its log below it at once, while the fetch it had just sent (saying it held everything) was on
# its way. The leader counted that position for acks=all writes the follower no longer held. Now
# the follower asks from below the damage first and cuts when that fetch is answered: by then the
# leader holds the lower position.


def test_damage_found_while_following_is_cut_only_once_a_fetch_from_below_it_is_answered():
    follower = FollowerStage()
    follower.answer(follower.fetch(), leader_batches(6, epoch=3), high_watermark=6, log_end_offset=6)
    segment = [name for name in follower.fs.list_directory(DIRECTORY) if name.endswith(".log")][0]
    follower.fs.corrupt(f"{DIRECTORY}/{segment}", 240)  # inside the third batch's payload

    follower.harness.advance(LIMITS.scrub_interval_ms * 3)

    assert follower.replica.storage.damaged
    assert not follower.harness.trace_events("repair-truncated"), "cut before the leader heard of it"
    assert follower.log.log_end_offset == 6
    announcing = follower.fetch()
    assert announcing.repairing and announcing.offset == 2, "the fetch asks from below the damage"
    assert announcing.last_fetched_epoch == 3

    follower.answer(announcing, leader_batches(4, epoch=3, start=2), high_watermark=6, log_end_offset=6)

    assert follower.harness.trace_events("repair-truncated")
    assert follower.replica.storage.healthy and follower.log.log_end_offset == 6
    assert not follower.log.corrupt_ranges
    assert not follower.fetch().repairing


def test_a_cut_fetch_that_times_out_is_asked_again_from_below_the_damage():
    follower = FollowerStage()
    follower.answer(follower.fetch(), leader_batches(6, epoch=3), high_watermark=6, log_end_offset=6)
    segment = [name for name in follower.fs.list_directory(DIRECTORY) if name.endswith(".log")][0]
    follower.fs.corrupt(f"{DIRECTORY}/{segment}", 240)
    follower.harness.advance(LIMITS.scrub_interval_ms * 3)
    assert follower.fetch().offset == 2

    follower.harness.advance(LIMITS.replica_fetch_timeout_ms + LIMITS.replica_fetch_wait_max_ms + 10)

    again = follower.fetch()
    assert again.offset == 2 and follower.log.log_end_offset == 6, "the unanswered cut was forgotten"


def test_a_leader_takes_a_lower_position_from_an_in_sync_follower_at_its_word():
    stage = Stage()
    stage.catch_up()
    stage.produce(acks=-1)
    end = stage.log.log_end_offset
    stage.follower_fetch(2)
    stage.follower_fetch(2, end - 1)  # it found damage: it asks from below it
    stage.follower_fetch(3)

    assert stage.replica.high_watermark == end - 1
    assert not stage.replies(ProduceResponse), "acknowledged counting what a follower gave back"


def test_a_cut_follower_is_repaired_only_once_it_holds_again_what_the_cut_dropped():
    """The simulator's seed 32101: the damage was offsets 22..33 and the cut dropped 22..330; the
    first answer brought 22..146, passing the damage, and the follower reported itself healthy —
    in the ISR, without 184 committed offsets it had held."""
    follower = FollowerStage()
    follower.answer(follower.fetch(), leader_batches(6, epoch=3), high_watermark=6, log_end_offset=6)
    segment = [name for name in follower.fs.list_directory(DIRECTORY) if name.endswith(".log")][0]
    follower.fs.corrupt(f"{DIRECTORY}/{segment}", 240)  # offset 2 only
    follower.harness.advance(LIMITS.scrub_interval_ms * 3)
    cut_fetch = follower.fetch()

    follower.answer(cut_fetch, leader_batches(2, epoch=3, start=2), high_watermark=6, log_end_offset=6)

    assert follower.log.log_end_offset == 4
    assert not follower.replica.storage.healthy, "healthy without offsets 4 and 5, which it held"
    rest = follower.fetch()
    follower.answer(rest, leader_batches(2, epoch=3, start=4), high_watermark=6, log_end_offset=6)
    assert follower.replica.storage.healthy


# ---------------------------------------------------------------------------- elected while damaged


def damaged_mid_repair() -> FollowerStage:
    """Node 1 held offsets 0..5, found offset 2 rotten, cut to 2 and has fetched 2..3 back: it
    holds 0..3 of the 6 offsets it had seen committed, and knows it."""
    follower = FollowerStage()
    follower.answer(follower.fetch(), leader_batches(6, epoch=3), high_watermark=6, log_end_offset=6)
    segment = [name for name in follower.fs.list_directory(DIRECTORY) if name.endswith(".log")][0]
    follower.fs.corrupt(f"{DIRECTORY}/{segment}", 240)  # offset 2 only
    follower.harness.advance(LIMITS.scrub_interval_ms * 3)
    follower.answer(follower.fetch(), leader_batches(2, epoch=3, start=2), high_watermark=6, log_end_offset=6)
    assert follower.log.log_end_offset == 4 and follower.replica.storage.damaged
    heartbeats(follower.harness)
    return follower


def elect_node_1(follower: FollowerStage, epoch: int, last_unclean_epoch: int = -1) -> None:
    state = PartitionState(topic="orders", topic_id=TOPIC_ID, partition=0, leader=1, leader_endpoint=FOLLOWER,
                           leader_epoch=epoch, partition_epoch=epoch, replicas=[1, 2, 3], isr=[1, 3],
                           last_unclean_epoch=last_unclean_epoch)
    follower.harness.deliver(FOLLOWER, ReplicaHeartbeatResponse(state=state), COORDINATOR)


def test_a_replica_elected_on_stale_news_while_repairing_refuses_to_lead_and_says_why_at_once():
    """The simulator's seed 5056: the damage report was lost on the way (a cut, a lossy network),
    the coordinator elected the repairing replica from its ISR, and it led epoch 3 ending at 504
    of 535 committed offsets. It knows it is damaged: it must not lead on a clean election."""
    follower = damaged_mid_repair()

    elect_node_1(follower, epoch=4)

    assert follower.replica.role != "leader"
    assert not follower.harness.trace_events("became-leader")
    assert follower.harness.trace_events("leadership-refused")
    beat = only(heartbeats(follower.harness), ReplicaHeartbeat)
    assert beat.storage.state == "damaged" and beat.storage.damage, "the coordinator hears of the damage now"
    produced = follower.harness.deliver(FOLLOWER, ProduceRequest(
        correlation_id=9, topic="orders", partition=0, acks=1, timeout_ms=1_000, batch=batch(1)), CLIENT)
    assert only(produced, ProduceResponse).error == ErrorCode.NOT_LEADER
    assert follower.log.log_end_offset == 4
    follower.replica.invariants()


def test_the_same_election_said_again_does_not_set_off_a_heartbeat_storm():
    follower = damaged_mid_repair()
    elect_node_1(follower, epoch=4)
    heartbeats(follower.harness)

    for _ in range(5):
        elect_node_1(follower, epoch=4)

    assert heartbeats(follower.harness) == []
    assert len(follower.harness.trace_events("leadership-refused")) == 1


def test_a_damaged_replica_leads_when_the_election_is_unclean():
    """An unclean election chose it knowing: its data is the best there is."""
    follower = damaged_mid_repair()

    elect_node_1(follower, epoch=4, last_unclean_epoch=4)

    assert follower.replica.role == "leader"


def test_a_replica_refusing_to_lead_follows_and_repairs_once_another_leader_is_named():
    follower = damaged_mid_repair()
    elect_node_1(follower, epoch=4)

    follower.state(epoch=5)

    request = follower.fetch()
    assert request.repairing and request.leader_epoch == 5
    follower.answer(request, leader_batches(6 - request.offset, epoch=3, start=request.offset),
                    high_watermark=6, log_end_offset=6)
    assert follower.replica.storage.healthy
    assert follower.log.log_end_offset == 6


def test_a_truncation_that_meets_a_header_damaged_since_open_cuts_below_it_and_fetches_again():
    """A follower told to truncate walks batch headers to its cut point, and a header damaged
    after the log was opened (a record count read as 4,294,967,294) raised CorruptBatch out of
    the replica's step: the leader's answer ended the follower's process. Now the damaged batch
    and everything after it are cut, recorded as damage (so the follower is not taken as whole
    until it has them again), and fetched again from the leader."""
    from storage.batch import iter_batches

    follower = FollowerStage()
    follower.answer(follower.fetch(), leader_batches(6, epoch=3), high_watermark=2, log_end_offset=6)
    positions = [position for position, _ in iter_batches(follower.log.read(0, 1 << 20))]
    segment = [name for name in follower.fs.list_directory(DIRECTORY) if name.endswith(".log")][0]
    for byte in range(36, 40):  # batch 4's record count
        follower.fs.corrupt(f"{DIRECTORY}/{segment}", positions[4] + byte)
    follower.state(epoch=4, last_unclean_epoch=4)

    follower.answer(follower.fetch(), diverging=diverging_to(5))

    assert follower.log.log_end_offset == 4
    assert follower.replica.storage.state() != "ok"
    again = follower.fetch()
    assert again.offset == 4
    follower.answer(again, leader_batches(2, epoch=4, start=4), high_watermark=6, log_end_offset=6)
    assert follower.log.log_end_offset == 6 and follower.replica.storage.state() == "ok"
    follower.replica.invariants()
