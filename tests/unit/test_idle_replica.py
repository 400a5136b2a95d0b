"""An idle replica costs nothing, and an idle ISR stays the ISR (actors/partition_replica.py,
actors/replica_leader.py, actors/replica_follower.py, actors/replica_reports.py).

Followers in the ISR with nothing to copy park their fetch at the leader for
`replica_fetch_idle_wait_max_ms`; a fetch parked at the log end counts as caught up, new data or
a newer high watermark answers it at once, and leaving the ISR answers it too. Timers run only
while there is work. Through a node agent, a replica reports when it changes and otherwise sends
a keepalive.
"""

from __future__ import annotations

from actors.actor import MS
from actors.limits import Limits
from actors.messages import (
    AlterIsrRequest, FetchRequest, FetchResponse, PartitionState, ReplicaHeartbeat, ReplicaHeartbeatResponse,
    TopicConfig,
)
from actors.partition_replica import PartitionReplica
from storage.log import LogConfig
from storage.memory import MemoryFileSystem, open_memory_log
from tests.unit.actor_harness import Harness
from tests.unit.test_partition_replica import COORDINATOR, LEADER, TOPIC_ID, Stage, batch, follower
from tests.unit.test_replica_storage import OTHER_LEADER, FollowerStage, leader_batches

LIMITS = Limits()
AGENT = "tcp://127.0.0.1:7/node-agent"


def park(stage: Stage, node: int, *, high_watermark: int = -1, wait_ms: int | None = None) -> list:
    """Follower `node` fetches at the leader's end and waits there, as an idle follower does."""
    request = FetchRequest(
        correlation_id=stage.next_correlation(), topic="orders", partition=0, offset=stage.log.log_end_offset,
        max_wait_ms=LIMITS.replica_fetch_idle_wait_max_ms if wait_ms is None else wait_ms,
        leader_epoch=stage.leader_epoch, replica=node, last_fetched_epoch=stage.leader_epoch,
        incarnation=200 + node, high_watermark=stage.replica.high_watermark if high_watermark < 0 else high_watermark)
    return stage.harness.deliver(LEADER, request, follower(node))


def both_parked(records: int) -> Stage:
    """A leader with `records` records that both followers hold, both waiting at its end."""
    stage = Stage()
    stage.produce(count=records)
    stage.catch_up()
    park(stage, 2)
    park(stage, 3)
    return stage


def timers_of(stage: Stage) -> set[str]:
    timers = stage.harness.timers[LEADER]
    return {name for name in ("isr-check", "flush", "retention", "fetch-expiry", "heartbeat", "scrub")
            if timers.deadline(name) is not None}


def test_an_idle_leader_whose_followers_wait_at_the_log_end_keeps_its_isr_and_sets_no_isr_timer():
    stage = both_parked(3)
    stage.harness.take(COORDINATOR, AlterIsrRequest)

    stage.harness.advance(LIMITS.replica_lag_time_max_ms * 3)  # far past the lag time, well inside the wait

    assert stage.harness.take(COORDINATOR, AlterIsrRequest) == [], "a follower waiting at the end is caught up"
    assert "isr-check" not in timers_of(stage) and "flush" not in timers_of(stage)
    assert "fetch-expiry" in timers_of(stage)


def test_a_follower_whose_parked_fetch_expired_was_caught_up_until_then_and_one_that_never_fetches_again_leaves():
    stage = both_parked(1)
    stage.harness.take(follower(2), FetchResponse)
    stage.harness.advance(LIMITS.replica_fetch_idle_wait_max_ms)  # both waits end: empty answers
    assert len(stage.harness.take(follower(2), FetchResponse)) == 1
    park(stage, 2)  # node 2 asks again at once; node 3 never does (it died with the answer unread)

    stage.harness.advance(LIMITS.replica_lag_time_max_ms + LIMITS.isr_check_interval_ms)

    (request,) = stage.harness.take(COORDINATOR, AlterIsrRequest)
    assert request.isr == [1, 2]


def test_a_follower_waiting_at_the_end_learns_a_newer_high_watermark_within_the_notice_time():
    stage = Stage()
    stage.produce(count=1)
    stage.follower_fetch(2)  # node 2 holds offset 0; node 3 does not yet: the high watermark stays 0
    stage.harness.take(follower(2), FetchResponse)
    park(stage, 2, high_watermark=0)
    assert stage.harness.take(follower(2), FetchResponse) == [], "parked: nothing new for node 2"

    stage.follower_fetch(3)  # now every ISR member holds offset 0: the high watermark moves to 1
    assert stage.harness.take(follower(2), FetchResponse) == [], "not at once: data may come first"
    stage.harness.advance(LIMITS.replica_high_watermark_notice_ms)

    (answer,) = stage.harness.take(follower(2), FetchResponse)
    assert (answer.high_watermark, len(answer.records)) == (1, 0)


def test_new_data_answers_a_parked_follower_before_its_high_watermark_notice_would():
    stage = Stage()
    stage.produce(count=1)
    stage.follower_fetch(2)
    stage.harness.take(follower(2), FetchResponse)
    park(stage, 2, high_watermark=0)
    stage.follower_fetch(3)  # the high watermark moves: node 2's notice is due in 50 ms

    stage.produce(count=1)
    stage.harness.advance(LIMITS.replica_high_watermark_notice_ms)

    (answer,) = stage.harness.take(follower(2), FetchResponse)
    assert len(answer.records) > 0 and answer.high_watermark == 1, "one answer, with the data"


def test_a_follower_that_leaves_the_isr_has_its_parked_fetch_answered_so_later_records_never_wait_in_its_socket():
    stage = both_parked(1)
    stage.harness.take(follower(2), FetchResponse)
    stage.harness.take(follower(3), FetchResponse)

    stage.set_state(leader=1, isr=[1, 3], partition_epoch=2)  # the coordinator gave up on node 2 (paused)
    stage.produce(count=1)

    (answer,) = stage.harness.take(follower(2), FetchResponse)
    assert len(answer.records) == 0, "answered before the new record came"
    assert len(stage.harness.take(follower(3), FetchResponse)[-1].records) > 0


def test_a_follower_in_the_isr_at_the_log_end_waits_long_and_one_catching_up_or_after_a_lost_answer_waits_short():
    stage = FollowerStage()
    first = stage.fetch()
    stage.answer(first, leader_batches(2, epoch=3), high_watermark=2, log_end_offset=2)
    catching_up = stage.fetch()
    in_sync_state(stage, isr=[1, 2, 3])
    stage.answer(catching_up, high_watermark=2, log_end_offset=2)
    idle = stage.fetch()
    stage.harness.advance(idle.max_wait_ms + LIMITS.replica_fetch_timeout_ms)  # the answer never came
    after_loss = stage.fetch()

    assert catching_up.max_wait_ms == LIMITS.replica_fetch_wait_max_ms
    assert idle.max_wait_ms == LIMITS.replica_fetch_idle_wait_max_ms
    assert after_loss.max_wait_ms == LIMITS.replica_fetch_wait_max_ms
    assert catching_up.high_watermark == 2, "a follower tells the leader the high watermark it knows"


def test_news_about_the_partition_renews_a_fetch_that_may_have_been_lost():
    stage = FollowerStage()
    stage.answer(stage.fetch(), high_watermark=0, log_end_offset=0)
    in_sync_state(stage, isr=[1, 2, 3])
    stage.answer(stage.fetch(), high_watermark=0, log_end_offset=0)
    stage.fetch()  # parked at the leader (or lost: the follower cannot tell)
    stage.harness.advance(LIMITS.replica_fetch_timeout_ms + 1)

    in_sync_state(stage, isr=[2, 3], partition_epoch=4)  # news: it left the ISR

    renewed = stage.harness.take(OTHER_LEADER, FetchRequest)
    assert len(renewed) == 1 and renewed[0].max_wait_ms == LIMITS.replica_fetch_wait_max_ms


def in_sync_state(stage: FollowerStage, *, isr: list[int], partition_epoch: int | None = None) -> None:
    state = PartitionState(topic="orders", topic_id=TOPIC_ID, partition=0, leader=2, leader_endpoint=OTHER_LEADER,
                           leader_epoch=stage.epoch, partition_epoch=partition_epoch or stage.epoch,
                           replicas=[1, 2, 3], isr=isr)
    stage.harness.deliver(stage.replica.endpoint, ReplicaHeartbeatResponse(state=state), COORDINATOR)


# ---------------------------------------------------------------------------- reports


class ReportingStage:
    """A leader that reports to its node agent (played by the test)."""

    def __init__(self) -> None:
        self.harness = Harness()
        self.log = open_memory_log(LogConfig(), now_ms=0, fs=MemoryFileSystem())
        self.replica = PartitionReplica(
            topic="orders", topic_id=TOPIC_ID, partition=0, node=1, endpoint=LEADER, coordinator=COORDINATOR,
            log=self.log, config=TopicConfig(min_insync_replicas=1), incarnation=101, limits=LIMITS,
            report_to=AGENT)
        self.harness.add(LEADER, self.replica)
        state = PartitionState(topic="orders", topic_id=TOPIC_ID, partition=0, leader=1, leader_endpoint=LEADER,
                               leader_epoch=1, partition_epoch=1, replicas=[1], isr=[1],
                               config=TopicConfig(min_insync_replicas=1))
        self.harness.deliver(LEADER, ReplicaHeartbeatResponse(state=state), COORDINATOR)

    def reports(self) -> list[ReplicaHeartbeat]:
        return self.harness.take(AGENT, ReplicaHeartbeat)


def test_through_a_node_agent_an_unchanged_replica_sends_only_keepalives_on_shared_instants():
    """Every replica of a host sends its keepalive on the same instants (multiples of the
    interval), so its node agent reads a round in one wake-up; none is ever more than 1.5
    intervals after the last report (the agent's timeout is three) nor less than half of one."""
    stage = ReportingStage()
    assert stage.reports(), "a report at start and one when it became leader"
    interval_ns = LIMITS.replica_keepalive_interval_ms * MS
    sent_ns = [stage.harness.now_ns]
    for _ in range(LIMITS.replica_keepalive_interval_ms * 5 // 50):
        stage.harness.advance(50)
        sent_ns += [stage.harness.now_ns for _ in stage.reports()]

    settled_ns = LIMITS.replica_heartbeat_interval_ms * MS  # the reports of its start are news, not keepalives
    keepalives = [at for at in sent_ns if at > settled_ns]
    assert len(keepalives) >= 4
    assert all(at % interval_ns < 50 * MS for at in keepalives), "each on a multiple of the interval"
    since_news = sent_ns[len(sent_ns) - len(keepalives) - 1:]
    gaps = [later - earlier for earlier, later in zip(since_news, since_news[1:])]
    assert all(interval_ns // 2 <= gap <= interval_ns * 3 // 2 for gap in gaps), gaps
    assert stage.harness.take(COORDINATOR, ReplicaHeartbeat) == [], "nothing goes to the coordinator itself"


def test_a_changing_replica_reports_at_once_and_then_at_most_once_per_interval():
    stage = ReportingStage()
    stage.harness.advance(LIMITS.replica_heartbeat_interval_ms * 2)  # past the reports of its start
    stage.reports()

    for index in range(10):  # ten batches within a few milliseconds
        stage.harness.deliver(LEADER, produce_request(index), "client")
        stage.harness.advance(1)
    first = stage.reports()
    stage.harness.advance(LIMITS.replica_heartbeat_interval_ms)
    later = stage.reports()

    assert [report.log_end_offset for report in first] == [1]
    assert [report.log_end_offset for report in later] == [10]


def produce_request(index: int):
    from actors.messages import ProduceRequest

    return ProduceRequest(correlation_id=index + 1, topic="orders", partition=0, acks=1, batch=batch(1))
