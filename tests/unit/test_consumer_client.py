"""The consumer's fetch logic (actors/consumer_client.py): positions, the fetch loop, the buffer.

The consumer actor runs in the harness; the test plays the coordinator (metadata) and the leader
of `orders/0` (list-offsets and fetch answers), and the embedding shell (commands in, Notify
effects out).
"""

from __future__ import annotations

import pytest

from actors.consumer_client import ConsumerClient, ConsumerSettings
from actors.errors import ErrorCode
from actors.messages import (
    ClientCommand, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, MetadataRequest,
    MetadataResponse, PartitionMetadata, TimerFired, TopicMetadata,
)
from storage.batch import encode_batch
from tests.unit.actor_harness import MS, Harness, notices, only

CONSUMER, BOOTSTRAP = "consumer", "bootstrap"
LEADER, NEW_LEADER = "tcp://127.0.0.1:9/leader-1", "tcp://127.0.0.1:9/leader-2"


def stamped(base_offset: int, count: int, leader_epoch: int = 4) -> bytes:
    records = [(i, b"k", f"value-{base_offset + i}".encode(), None) for i in range(count)]
    return bytes(encode_batch(records, 1_000, base_offset=base_offset, leader_epoch=leader_epoch))


class Stage:
    def __init__(self, **settings) -> None:
        self.harness = Harness()
        self.consumer = ConsumerClient(bootstrap=BOOTSTRAP, settings=ConsumerSettings(**settings))
        self.harness.add(CONSUMER, self.consumer)
        self.tokens = 0
        self.topic_id = 4711

    def command(self, command: str, **arguments) -> list:
        self.tokens += 1
        return self.harness.deliver(CONSUMER, ClientCommand(command=command, arguments=arguments,
                                                            token=self.tokens), b"")

    def metadata(self, endpoint: str = LEADER, leader_epoch: int = 4, partitions: int = 1) -> list:
        asked = self.harness.take(BOOTSTRAP, MetadataRequest)
        led = [PartitionMetadata(partition=index, leader=1, leader_endpoint=endpoint, leader_epoch=leader_epoch)
               for index in range(partitions)]
        response = MetadataResponse(correlation_id=asked[-1].correlation_id if asked else 0,
                                    topics=[TopicMetadata(name="orders", topic_id=self.topic_id, partitions=led)])
        return self.harness.deliver(CONSUMER, response, BOOTSTRAP)

    def sent(self, kind, to: str = LEADER) -> list:
        return self.harness.take(to, kind)

    def pending_reset(self) -> ListOffsetsRequest:
        """The list-offsets request the consumer sent last (it stays to be answered)."""
        return self.harness.received(LEADER, ListOffsetsRequest)[-1]

    def answer_reset(self, offset: int, *, error: int = 0) -> list:
        request = only(self.sent(ListOffsetsRequest), ListOffsetsRequest)
        response = ListOffsetsResponse(correlation_id=request.correlation_id, topic=request.topic,
                                       partition=request.partition, offset=offset, error=error)
        return self.harness.deliver(CONSUMER, response, LEADER)

    def answer_fetch(self, request: FetchRequest, records: bytes = b"", *, error: int = 0,
                     high_watermark: int = 100) -> list:
        response = FetchResponse(correlation_id=request.correlation_id, topic=request.topic,
                                 partition=request.partition, error=error, high_watermark=high_watermark,
                                 records=records)
        return self.harness.deliver(CONSUMER, response, LEADER)

    def assigned_at(self, offset: int) -> FetchRequest:
        """Assign orders/0 and resolve its position to `offset`: the first fetch is out."""
        self.command("assign", partitions=[("orders", 0)])
        self.metadata()
        self.answer_reset(offset)
        return only(self.sent(FetchRequest), FetchRequest)

    def notified(self, kind: str) -> list:
        return [notice.payload for _, notice in self.harness.notified if notice.kind == kind]


@pytest.fixture
def stage() -> Stage:
    return Stage()


# ---------------------------------------------------------------------------- assign, reset, fetch


def test_assign_learns_the_leader_resolves_the_position_then_fetches_from_it(stage):
    effects = stage.command("assign", partitions=[("orders", 0)])
    assert only(effects, MetadataRequest).topics == ["orders"]

    stage.metadata(leader_epoch=4)
    reset = only(stage.sent(ListOffsetsRequest), ListOffsetsRequest)
    assert (reset.topic, reset.partition, reset.timestamp_ms, reset.leader_epoch) == ("orders", 0, -1, 4)

    answer = ListOffsetsResponse(correlation_id=reset.correlation_id, topic="orders", partition=0, offset=17)
    effects = stage.harness.deliver(CONSUMER, answer, LEADER)

    assert notices(effects, "position") == [("orders", 0, (0, 0), 17)]
    fetch = only(stage.sent(FetchRequest), FetchRequest)
    assert (fetch.offset, fetch.leader_epoch, fetch.replica) == (17, 4, -1)


def test_auto_offset_reset_earliest_asks_for_the_log_start():
    stage = Stage(auto_offset_reset="earliest")
    stage.command("assign", partitions=[("orders", 0)])
    stage.metadata()

    assert only(stage.sent(ListOffsetsRequest), ListOffsetsRequest).timestamp_ms == -2


def test_fetched_records_go_to_the_shell_and_the_next_fetch_starts_after_them(stage):
    first = stage.assigned_at(10)

    effects = stage.answer_fetch(first, stamped(10, 3) + stamped(13, 2), high_watermark=20)

    [(topic, partition, session, records, high_watermark, topic_id)] = notices(effects, "records")
    assert (topic, partition, session, high_watermark) == ("orders", 0, (0, 0), 20)
    assert topic_id == stage.topic_id == 4711, "the id of the topic they were fetched from"
    assert bytes(records) == stamped(10, 3) + stamped(13, 2)
    assert only(stage.sent(FetchRequest), FetchRequest).offset == 15


def test_an_empty_fetch_answer_just_fetches_again_from_the_same_position(stage):
    first = stage.assigned_at(10)

    effects = stage.answer_fetch(first)

    assert notices(effects, "records") == []
    assert only(stage.sent(FetchRequest), FetchRequest).offset == 10


def test_only_one_fetch_per_partition_is_in_flight(stage):
    stage.assigned_at(0)

    stage.harness.advance(1_000)

    assert stage.sent(FetchRequest) == []


def test_a_full_buffer_stops_fetching_until_the_shell_has_consumed_enough():
    batch = stamped(0, 4)
    stage = Stage(buffer_bytes_max=len(batch))
    first = stage.assigned_at(0)

    stage.answer_fetch(first, batch)
    stage.harness.advance(500)
    assert stage.sent(FetchRequest) == [], "fetched past the buffer bound"

    stage.command("consumed", bytes=len(batch))

    assert only(stage.sent(FetchRequest), FetchRequest).offset == 4
    assert stage.consumer.buffered_bytes == 0


def assigned_many(stage: Stage, partitions: int) -> list[FetchRequest]:
    """Assign orders/0..partitions-1, every position resolved to 0: the fetches that went out."""
    stage.command("assign", partitions=[("orders", index) for index in range(partitions)])
    stage.metadata(partitions=partitions)
    for request in stage.sent(ListOffsetsRequest):
        stage.harness.deliver(CONSUMER, ListOffsetsResponse(correlation_id=request.correlation_id, topic="orders",
                                                            partition=request.partition, offset=0), LEADER)
    return stage.sent(FetchRequest)


def test_fetches_in_flight_never_ask_for_more_than_the_buffer_holds():
    """Thirty partitions, each allowed 512 KiB a fetch, with a 1 MiB buffer: every partition is
    asked for its share, and together they can bring no more than the buffer holds."""
    stage = Stage(buffer_bytes_max=1 << 20, fetch_partition_bytes_max=512 << 10)
    fetches = assigned_many(stage, 30)
    assert sum(request.max_bytes for request in fetches) <= 1 << 20
    assert len(fetches) == 1024 // 64, "each a 64 KiB share, the smallest a fetch asks for"
    assert {request.max_bytes for request in fetches} == {64 << 10}


def test_a_few_partitions_each_ask_for_the_whole_partition_limit():
    stage = Stage(buffer_bytes_max=64 << 20, fetch_partition_bytes_max=8 << 20)
    fetches = assigned_many(stage, 4)
    assert [request.max_bytes for request in fetches] == [8 << 20] * 4


def test_partitions_left_without_room_are_fetched_first_when_room_returns():
    stage = Stage(buffer_bytes_max=256 << 10, fetch_partition_bytes_max=256 << 10)
    first = assigned_many(stage, 8)
    waiting = set(range(8)) - {request.partition for request in first}
    assert len(first) == 4 and len(waiting) == 4
    stage.answer_fetch(first[0], b"")  # an empty answer frees its share: it goes to a waiting partition
    following = only(stage.sent(FetchRequest), FetchRequest)
    assert following.partition in waiting


def test_one_fetch_goes_out_even_when_the_partition_limit_exceeds_the_buffer():
    stage = Stage(buffer_bytes_max=16 << 10, fetch_partition_bytes_max=1 << 20)
    fetches = assigned_many(stage, 3)
    assert len(fetches) == 1 and fetches[0].max_bytes == 16 << 10


def test_a_paused_partition_is_not_fetched_until_resumed(stage):
    first = stage.assigned_at(0)
    stage.command("pause", partitions=[("orders", 0)])

    stage.answer_fetch(first)
    assert stage.sent(FetchRequest) == []

    stage.command("resume", partitions=[("orders", 0)])
    assert len(stage.sent(FetchRequest)) == 1


def test_seek_opens_a_new_session_and_data_from_the_old_one_is_dropped(stage):
    old = stage.assigned_at(0)

    effects = stage.command("seek", topic="orders", partition=0, offset=50, epoch=3)

    assert notices(effects, "position") == [("orders", 0, (3, 0), 50)]
    new = only(stage.sent(FetchRequest), FetchRequest)
    assert new.offset == 50
    late = stage.answer_fetch(old, stamped(0, 5))
    assert notices(late, "records") == [], "records fetched before the seek reached the shell"
    fresh = stage.answer_fetch(new, stamped(50, 1))
    assert notices(fresh, "records")[0][2] == (3, 0)


def test_seeking_a_partition_that_is_not_assigned_is_reported(stage):
    stage.assigned_at(0)

    effects = stage.command("seek", topic="orders", partition=7, offset=0, epoch=1)

    [(topic, partition, error)] = notices(effects, "partition-error")
    assert (topic, partition, error.code) == ("orders", 7, ErrorCode.INVALID_REQUEST)


def test_a_reset_to_the_beginning_asks_the_leader_again(stage):
    stage.assigned_at(30)

    stage.command("reset", topic="orders", partition=0, timestamp=-2, epoch=2)

    assert stage.pending_reset().timestamp_ms == -2
    effects = stage.answer_reset(5)
    assert notices(effects, "position") == [("orders", 0, (2, 0), 5)]


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("policy, timestamp", [("earliest", -2), ("latest", -1)])
def test_offset_out_of_range_resets_by_the_policy_in_a_new_session(policy, timestamp):
    stage = Stage(auto_offset_reset=policy)
    first = stage.assigned_at(500)

    stage.answer_fetch(first, error=ErrorCode.OFFSET_OUT_OF_RANGE)

    assert stage.pending_reset().timestamp_ms == timestamp
    effects = stage.answer_reset(20)
    assert notices(effects, "position") == [("orders", 0, (0, 1), 20)]
    assert only(stage.sent(FetchRequest), FetchRequest).offset == 20


def test_offset_out_of_range_with_policy_none_is_reported_and_not_reset():
    stage = Stage(auto_offset_reset="none")
    stage.command("assign", partitions=[("orders", 0)])
    stage.metadata()
    stage.command("seek", topic="orders", partition=0, offset=500, epoch=1)
    first = only(stage.sent(FetchRequest), FetchRequest)

    effects = stage.answer_fetch(first, error=ErrorCode.OFFSET_OUT_OF_RANGE)

    [(topic, partition, error)] = notices(effects, "partition-error")
    assert (topic, partition, error.code) == ("orders", 0, ErrorCode.OFFSET_OUT_OF_RANGE)
    assert stage.sent(ListOffsetsRequest) == []
    assert stage.consumer.fetches[("orders", 0)].position == 500


def test_with_policy_none_a_partition_without_a_position_is_reported():
    stage = Stage(auto_offset_reset="none")
    stage.command("assign", partitions=[("orders", 0)])
    stage.metadata()
    stage.harness.advance(1_000)

    assert stage.notified("partition-error"), "the consumer sits idle without saying why"


def test_a_not_leader_answer_refreshes_metadata_and_fetches_from_the_new_leader(stage):
    first = stage.assigned_at(8)

    effects = stage.answer_fetch(first, error=ErrorCode.NOT_LEADER)

    assert only(effects, MetadataRequest)
    stage.metadata(endpoint=NEW_LEADER, leader_epoch=5)
    stage.harness.advance(200)
    refetch = only(stage.sent(FetchRequest, NEW_LEADER), FetchRequest)
    assert (refetch.offset, refetch.leader_epoch) == (8, 5)


def test_a_fetch_that_is_never_answered_is_sent_again():
    stage = Stage(fetch_max_wait_ms=100, request_timeout_ms=400)
    stage.assigned_at(3)

    stage.harness.advance(700)
    stage.metadata()
    stage.harness.advance(100)

    assert [request.offset for request in stage.sent(FetchRequest)] == [3]


# ---------------------------------------------------------------------------- shell commands


def test_list_offsets_for_the_user_returns_offset_and_timestamp(stage):
    stage.assigned_at(0)

    stage.command("list-offsets", topic="orders", partition=0, timestamp=12_345)
    request = only(stage.sent(ListOffsetsRequest), ListOffsetsRequest)
    answer = ListOffsetsResponse(correlation_id=request.correlation_id, topic="orders", partition=0, offset=9,
                                 timestamp_ms=12_400)
    effects = stage.harness.deliver(CONSUMER, answer, LEADER)

    assert request.timestamp_ms == 12_345
    assert notices(effects, "result") == [(stage.tokens, (9, 12_400), None)]


def test_a_user_list_offsets_refused_for_a_stale_leader_asks_who_leads_now(stage):
    stage.assigned_at(0)
    stage.harness.take(BOOTSTRAP, MetadataRequest)

    stage.command("list-offsets", topic="orders", partition=0, timestamp=-1)
    request = only(stage.sent(ListOffsetsRequest), ListOffsetsRequest)
    refusal = ListOffsetsResponse(correlation_id=request.correlation_id, error=ErrorCode.FENCED_LEADER_EPOCH)
    effects = stage.harness.deliver(CONSUMER, refusal, LEADER)

    [(_, value, error)] = notices(effects, "result")
    assert (value, error.code, error.retriable) == (None, ErrorCode.FENCED_LEADER_EPOCH, True)
    assert only(effects, MetadataRequest).topics == ["orders"]
    assert request.leader_epoch == 4, "the request names the epoch the consumer believes current"


def test_fetches_carry_the_consumers_min_bytes_and_max_wait():
    stage = Stage(fetch_min_bytes=64 * 1024, fetch_max_wait_ms=250)

    request = stage.assigned_at(0)

    assert (request.min_bytes, request.max_wait_ms) == (64 * 1024, 250)


def test_an_unknown_command_is_answered_with_an_error(stage):
    effects = stage.command("teleport")

    [(token, value, error)] = notices(effects, "result")
    assert (token, value, error.code) == (stage.tokens, None, ErrorCode.INVALID_REQUEST)


def test_reassigning_keeps_the_position_of_kept_partitions(stage):
    stage.answer_fetch(stage.assigned_at(40))

    stage.command("assign", partitions=[("orders", 0), ("orders", 1)])

    assert stage.consumer.fetches[("orders", 0)].position == 40
    assert stage.consumer.fetches[("orders", 1)].position == -1


@pytest.mark.parametrize("options", [{"fetch_min_bytes": -1}, {"fetch_max_wait_ms": -1}, {"max_poll_records": 0},
                                     {"auto_offset_reset": "sometimes"}])
def test_a_consumer_refuses_bad_fetch_options_before_it_starts(options):
    from railmq.consumer import Consumer

    with pytest.raises(ValueError):
        Consumer("tcp://127.0.0.1:1", **options)


# ---------------------------------------------------------------------------- answers are checked


def test_a_fetch_answer_naming_another_partition_is_not_taken_as_data():
    """A stale endpoint may now serve another partition: its records are not this partition's."""
    stage = Stage()
    request = stage.assigned_at(0)
    wrong = FetchResponse(correlation_id=request.correlation_id, topic="payments", partition=0,
                          high_watermark=100, records=stamped(0, 3))

    effects = stage.harness.deliver(CONSUMER, wrong, LEADER)

    assert not [effect for effect in effects if getattr(effect, "kind", "") == "records"]
    assert stage.harness.take(BOOTSTRAP, MetadataRequest), "it asks who leads the partition now"


def test_a_list_offsets_answer_naming_another_partition_is_an_error_not_a_position():
    stage = Stage()
    stage.assigned_at(0)
    stage.command("list-offsets", topic="orders", partition=0, timestamp=12_345)
    request = only(stage.sent(ListOffsetsRequest), ListOffsetsRequest)
    wrong = ListOffsetsResponse(correlation_id=request.correlation_id, topic="orders", partition=5, offset=9)

    effects = stage.harness.deliver(CONSUMER, wrong, LEADER)

    result = [effect.payload for effect in effects if getattr(effect, "kind", "") == "result"]
    assert result and result[0][2] is not None and result[0][2].code == ErrorCode.NOT_LEADER


def test_fetches_and_offset_lookups_carry_the_topic_id():
    stage = Stage()

    request = stage.assigned_at(0)

    assert request.topic_id == stage.topic_id != 0


# ---------------------------------------------------------------------------- timers at deadlines


def wakes(stage: Stage) -> int:
    return len(stage.harness.steps_of(CONSUMER, TimerFired))


def test_an_idle_consumer_sets_no_timer(stage):
    assert stage.harness.timers[CONSUMER].deadline("tick") is None
    stage.harness.advance(60_000)
    assert wakes(stage) == 0


def test_a_parked_fetch_costs_no_wakes_until_its_timeout():
    """A long poll in flight and nothing else to do: the timer is at the fetch's timeout, not
    every 100 ms; the answer that comes first moves it on."""
    stage = Stage(fetch_max_wait_ms=500, request_timeout_ms=2_000)
    request = stage.assigned_at(3)
    sent_ns = stage.harness.now_ns
    stage.harness.advance(100)  # the metadata request's patience, armed while it was in flight
    assert stage.harness.timers[CONSUMER].deadline("tick") == sent_ns + 2_500 * MS + 1
    before = wakes(stage)
    stage.harness.advance(2_000)
    assert wakes(stage) == before, "woke while the fetch was parked and nothing was due"
    stage.answer_fetch(request, stamped(3, 2))
    assert only(stage.sent(FetchRequest), FetchRequest).offset == 5


def test_a_fetch_retried_after_an_error_goes_out_when_its_backoff_ends():
    stage = Stage()
    request = stage.assigned_at(3)
    answered_ns = stage.harness.now_ns
    stage.answer_fetch(request, error=ErrorCode.NOT_ENOUGH_REPLICAS)
    retry_at_ns = stage.consumer.fetches[("orders", 0)].retry_at_ns
    assert retry_at_ns > answered_ns
    stage.metadata()  # the leader is asked for again at once; the fetch waits for its backoff
    stage.harness.advance_to(retry_at_ns - 1)
    assert stage.sent(FetchRequest) == []
    stage.harness.advance_to(retry_at_ns)
    assert only(stage.sent(FetchRequest), FetchRequest).offset == 3


def test_after_every_step_the_timer_is_at_or_before_every_deadline_ahead():
    """Fetches, an error and its backoff, a lost answer, a leaderless partition, a metadata
    request left unanswered: after each step the armed timer comes no later than anything due."""
    stage = Stage(fetch_max_wait_ms=200, request_timeout_ms=700)
    checked = 0
    original = stage.harness.deliver

    def deliver(to, message, sender="client"):
        nonlocal checked
        effects = original(to, message, sender)
        if to == CONSUMER:
            ahead = [d for d in stage.consumer._deadlines() if d > stage.harness.now_ns]
            armed = stage.harness.timers[CONSUMER].deadline("tick")
            assert not ahead or (armed is not None and armed <= min(ahead)), (type(message).__name__, armed, ahead)
            checked += 1
        return effects

    stage.harness.deliver = deliver
    stage.command("assign", partitions=[("orders", 0), ("orders", 1)])
    stage.metadata(partitions=2)
    for request in stage.sent(ListOffsetsRequest):
        stage.harness.deliver(CONSUMER, ListOffsetsResponse(correlation_id=request.correlation_id, topic=request.topic,
                                                            partition=request.partition, offset=0), LEADER)
    first, second = stage.sent(FetchRequest)
    stage.answer_fetch(first, stamped(0, 3))
    stage.answer_fetch(second, error=ErrorCode.NOT_LEADER)  # backoff, metadata asked
    stage.harness.advance(150)  # the metadata request is never answered: patience runs out
    stage.metadata(endpoint="", partitions=2)  # no leader named
    stage.harness.advance(2_000)  # a fetch never answered times out
    stage.metadata(partitions=2)
    stage.harness.advance(500)
    assert checked > 10


# ---------------------------------------------------------------------------- a topic made again


def test_a_committed_offset_of_a_topic_deleted_and_made_again_is_not_used():
    """The group committed offset 30 of the topic with id 4711; `orders` now has id 9000 (deleted
    and made again): fetching from 30 would skip the new topic's first 30 records."""
    stage = Stage(auto_offset_reset="earliest")
    stage.topic_id = 9000
    stage.consumer.assign([("orders", 0)], 0, {("orders", 0): 30}, topic_ids={("orders", 0): 4711})
    stage.metadata()

    reset = only(stage.sent(ListOffsetsRequest), ListOffsetsRequest)
    assert reset.timestamp_ms == -2, "from the new topic's start (auto_offset_reset=earliest)"
    assert [trace for trace in stage.harness.trace_events("position-of-a-deleted-topic")] == [{
        "topic": "orders", "partition": 0, "position": 30, "old_topic_id": 4711, "topic_id": 9000}]


def test_a_committed_offset_of_the_same_topic_is_used_and_commits_carry_its_id():
    stage = Stage(auto_offset_reset="earliest")
    stage.consumer.assign([("orders", 0)], 0, {("orders", 0): 30}, topic_ids={("orders", 0): 4711})
    stage.metadata()

    fetch = only(stage.sent(FetchRequest), FetchRequest)
    assert (fetch.offset, fetch.topic_id) == (30, 4711)
    assert stage.consumer.position_topic_id("orders", 0) == 4711


def test_a_running_consumer_whose_topic_is_made_again_starts_over_in_the_new_one():
    stage = Stage(auto_offset_reset="earliest")
    first = stage.assigned_at(10)
    stage.answer_fetch(first, stamped(10, 3), high_watermark=13)
    second = only(stage.sent(FetchRequest), FetchRequest)
    stage.harness.deliver(CONSUMER, MetadataResponse(correlation_id=0, topics=[TopicMetadata(
        name="orders", topic_id=9000, partitions=[PartitionMetadata(partition=0, leader=1, leader_endpoint=LEADER,
                                                                     leader_epoch=0)])]), BOOTSTRAP)
    stage.answer_fetch(second, b"", high_watermark=0)

    assert only(stage.sent(ListOffsetsRequest), ListOffsetsRequest).timestamp_ms == -2
    assert stage.consumer.position_topic_id("orders", 0) == 9000
