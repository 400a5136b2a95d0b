"""A high-watermark long poll: ListOffsets(latest) that waits for the high watermark to pass an
offset, so whoever watches a partition's end (the share-group coordinator, for acquires waiting
on new records) asks once per change or per wait, never every few milliseconds of an idle
partition (actors/replica_fetch.py, actors/share_leaders.py).
"""

from __future__ import annotations

from actors.errors import ErrorCode
from actors.limits import Limits
from actors.messages import ListOffsetsRequest, ListOffsetsResponse
from tests.unit.test_partition_replica import CLIENT, LEADER, Stage
from tests.unit.test_share_group import World, replica_endpoint

LATEST, EARLIEST = -1, -2


def ask(stage: Stage, *, wait_past: int, max_wait_ms: int = 500, timestamp_ms: int = LATEST) -> list:
    request = ListOffsetsRequest(correlation_id=stage.next_correlation(), topic="orders", partition=0,
                                 timestamp_ms=timestamp_ms, wait_past_offset=wait_past, max_wait_ms=max_wait_ms)
    return stage.harness.deliver(LEADER, request, CLIENT)


def answers(stage: Stage) -> list[ListOffsetsResponse]:
    return stage.harness.take(CLIENT, ListOffsetsResponse)


def committed(stage: Stage, count: int) -> None:
    stage.produce(count=count, acks=-1)
    stage.catch_up()
    stage.catch_up()


# ---------------------------------------------------------------------------- the leader


def test_a_long_poll_waits_until_the_high_watermark_passes_its_offset():
    stage = Stage()
    committed(stage, 3)
    answers(stage)

    ask(stage, wait_past=3)
    assert answers(stage) == []  # nothing new: it waits

    committed(stage, 2)
    [answer] = answers(stage)
    assert (answer.error, answer.offset, answer.high_watermark) == (ErrorCode.NONE, 5, 5)


def test_a_long_poll_already_passed_is_answered_at_once():
    stage = Stage()
    committed(stage, 3)
    answers(stage)

    ask(stage, wait_past=1)

    [answer] = answers(stage)
    assert answer.offset == 3


def test_a_long_poll_with_nothing_new_is_answered_when_its_wait_ends():
    stage = Stage()
    committed(stage, 3)
    answers(stage)

    ask(stage, wait_past=3, max_wait_ms=400)
    stage.harness.advance(350)
    assert answers(stage) == []
    stage.harness.advance(100)

    [answer] = answers(stage)
    assert (answer.error, answer.offset) == (ErrorCode.NONE, 3)


def test_a_long_poll_is_answered_not_leader_when_the_leader_steps_down():
    stage = Stage()
    ask(stage, wait_past=0)
    assert answers(stage) == []

    stage.set_state(leader=2, isr=[1, 2, 3], leader_epoch=2)

    [answer] = answers(stage)
    assert answer.error == ErrorCode.NOT_LEADER


def test_only_latest_waits_and_a_full_purgatory_answers_at_once():
    stage = Stage(limits=Limits(purgatory_fetch_max=1))
    ask(stage, wait_past=0, timestamp_ms=EARLIEST)
    assert len(answers(stage)) == 1  # the log start does not wait

    ask(stage, wait_past=0)
    assert answers(stage) == []
    ask(stage, wait_past=0)  # the purgatory holds one: this one is answered now
    [answer] = answers(stage)
    assert (answer.error, answer.offset) == (ErrorCode.NONE, 0)
    assert len(stage.replica.parked) == 1


# ---------------------------------------------------------------------------- the share-group coordinator


def test_acquires_waiting_on_an_idle_partition_read_its_high_watermark_once_per_wait_not_per_refresh():
    world = World()
    world.create_topic("orders")
    member = world.join("a", ["orders"]).member_id
    world.produce("orders", ["one"])
    assert world.acquire_now("a", member, "orders").acquired  # the partition is read up to its end
    leader = replica_endpoint("orders", 0, world.coordinator.partitions[("orders", 0)].leader)
    before = len(world.harness.steps_of(leader, ListOffsetsRequest))

    for _ in range(4):  # two seconds of acquires waiting on nothing
        world.acquire("a", member, "orders", wait_ms=500)
        world.settle(500)
        world.acquired("a")
    asked = [step.message for step in world.harness.steps_of(leader, ListOffsetsRequest)][before:]

    assert 1 <= len(asked) <= 6, f"{len(asked)} high-watermark reads in 2 s of an idle partition"
    assert all(request.max_wait_ms > 0 and request.wait_past_offset == 1 for request in asked)
    world.produce("orders", ["two"])
    assert [offset for offset, _ in _offsets(world.acquire_now("a", member, "orders"))] == [1]


def _offsets(response):
    return [(offset, ranged.delivery_count) for ranged in response.acquired
            for offset in range(ranged.first_offset, ranged.last_offset + 1)]
