"""The group quorum against a burst of clients' writes (actors/group_quorum.py, actors/controller.py).

Every member request that writes (a commit, a join, the leader's sync, a leave, a share
acquisition or acknowledgement) is one entry of the group quorum's log, and any local process
may send them faster than the followers acknowledge. Each test counts what the quorum does
(entries, rebuilds, refusals), never time.
"""

from __future__ import annotations

from collections import Counter

import pytest

from actors.errors import ErrorCode
from actors.messages import OffsetCommitRequest, OffsetEntry, OffsetFetchRequest, OffsetFetchResponse
from tests.unit.controller_harness import ControllerNet

CLIENT = "tcp://client"
GROUPS = 100


@pytest.mark.timeout(120)
def test_a_burst_of_commits_is_refused_busy_before_it_fills_the_uncommitted_log():
    """5,000 commits reaching the active group voter before any follower acknowledged: past
    `uncommitted_entries_max` (4,096) the leader refused the next proposal, and the voter dropped
    its group coordinator and rebuilt it from the committed map, answering every request it held
    NOT_COORDINATOR (though their commits were in the log) and every member's next request too.
    Clients' writes now fill only `controller_client_uncommitted_percent` of what may be
    uncommitted; past it they are BUSY at once, and the coordinator stays."""
    net = ControllerNet(groups=True)
    active = net.run_until_active()
    voter = net.controllers[active]
    coordinator = voter.coordinator
    net.run_for(100)
    net.answers(CLIENT)

    for number in range(5_000):
        net.send(CLIENT, active, OffsetCommitRequest(
            correlation_id=100 + number, group_id=f"g{number % GROUPS}",
            offsets=[OffsetEntry(topic="orders", partition=0, offset=number)]))
    net.deliver()  # every commit reaches the leader before any follower's acknowledgement
    answers = net.answers(CLIENT)
    kinds = Counter((type(answer).__name__, answer.error) for answer in answers)

    assert not [trace for trace in net.traces if trace.event == "controller-inactive"], kinds
    assert voter.coordinator is coordinator, "the group coordinator was dropped and rebuilt"
    assert kinds[("ErrorResponse", ErrorCode.NOT_COORDINATOR)] == 0, kinds
    assert kinds[("ErrorResponse", ErrorCode.BUSY)] > 0, kinds
    assert set(kinds) <= {("ErrorResponse", ErrorCode.BUSY), ("OffsetCommitResponse", ErrorCode.NONE)}, kinds
    last_done: dict[str, int] = {}
    for answer in answers:
        if answer.error == ErrorCode.NONE:
            number = answer.correlation_id - 100
            last_done[f"g{number % GROUPS}"] = max(last_done.get(f"g{number % GROUPS}", -1), number)

    net.run_for(500)  # the followers catch up: each group holds its last commit answered as done
    for index in range(GROUPS):
        net.send(CLIENT, active, OffsetFetchRequest(correlation_id=index, group_id=f"g{index}"))
    net.run_for(10)
    fetched = {f"g{answer.correlation_id}": [entry.offset for entry in answer.offsets]
               for answer in net.answers(CLIENT) if isinstance(answer, OffsetFetchResponse)}
    assert fetched == {group: [offset] for group, offset in last_done.items()}, (
        "a BUSY commit took, or one done did not")


def test_a_leaders_sync_refused_busy_is_sent_again_in_the_same_generation_after_a_backoff():
    """A busy group quorum refuses the leader's SyncGroup (it stores the generation's assignment).
    Handled as any other error, the member rejoined, and a join in CompletingRebalance starts a
    new rebalance: every member of the group paid for the quorum being busy. It now sends the
    same sync again after a backoff, and does not join."""
    from actors.consumer_member import JOIN_BACKOFF_MS
    from actors.messages import (
        ErrorResponse, GroupMember, JoinGroupRequest, JoinGroupResponse, SyncGroupRequest, SyncGroupResponse,
    )
    from tests.unit.test_consumer_member import GROUPS, Stage, assignment

    stage = Stage()
    stage.command("subscribe", topics=["orders"])
    stage.metadata()
    join = stage.to_groups(JoinGroupRequest)
    myself = GroupMember(member_id="c1-m", metadata=join.protocols[0].metadata)
    stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=4, protocol_name="range",
                                   leader="c1-m", member_id="c1-m", members=[myself]))
    sync = stage.to_groups(SyncGroupRequest)
    assert sync.assignments, "the leader's sync carries the assignment"
    stage.answer(ErrorResponse(correlation_id=sync.correlation_id, error=ErrorCode.BUSY,
                               error_message="busy"))

    assert stage.harness.take(GROUPS, SyncGroupRequest) == [], "sent again at once, with no backoff"
    stage.harness.advance(JOIN_BACKOFF_MS)
    again = stage.harness.take(GROUPS, SyncGroupRequest)

    assert stage.harness.take(GROUPS, JoinGroupRequest) == [], "the member joined again: a new rebalance"
    assert [(s.generation, s.member_id, s.assignments) for s in again] == [
        (sync.generation, sync.member_id, sync.assignments)]
    stage.answer(SyncGroupResponse(correlation_id=again[0].correlation_id,
                                   assignment=assignment(("orders", 0), ("orders", 1))))
    assert len(stage.harness.take(GROUPS, OffsetFetchRequest)) == 1, "the assignment was not taken"
    assert stage.member.generation == 4 and stage.member.member_id == "c1-m"


def test_a_join_refused_busy_is_sent_again_after_a_backoff_not_at_once():
    """A JoinGroup refused BUSY was handled as an unknown error: the member went unjoined with no
    deadline to join at, and after a second refusal it sent no join for the 5 s watched (until
    some other deadline woke it: its metadata refresh, 60 s here). It now joins again after the
    join backoff, doubling while BUSY answers keep coming (KIP-580)."""
    from actors.consumer_member import JOIN_BACKOFF_MS
    from actors.messages import ErrorResponse, JoinGroupRequest
    from tests.unit.test_consumer_member import GROUPS, Stage

    stage = Stage()
    stage.command("subscribe", topics=["orders"])
    stage.metadata()
    joins = []
    for _ in range(3):
        join = stage.to_groups(JoinGroupRequest)
        joins.append(stage.harness.now_ns)
        stage.answer(ErrorResponse(correlation_id=join.correlation_id, error=ErrorCode.BUSY,
                                   error_message="busy"))
        assert stage.harness.take(GROUPS, JoinGroupRequest) == []
        stage.harness.advance(JOIN_BACKOFF_MS * 4 + 1)

    gaps = [(later - earlier) // 1_000_000 for earlier, later in zip(joins, joins[1:])]
    assert JOIN_BACKOFF_MS <= gaps[0] and 2 * JOIN_BACKOFF_MS <= gaps[1], gaps


def test_a_share_members_join_refused_busy_waits_for_its_next_heartbeat_at_the_same_coordinator():
    """A share member's first heartbeat (its join) refused BUSY was taken as a lost coordinator:
    the member forgot it and asked the controller's metadata again, adding to the load of a
    cluster already too busy. It now keeps its coordinator and joins at its next heartbeat."""
    from actors.messages import (
        ErrorResponse, MetadataRequest, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse,
    )
    from tests.unit.test_clients_vs_hostile_server import SHARE_GROUPS, ShareStage

    stage = ShareStage(coordinator=SHARE_GROUPS, answer_join=False)  # subscribed; its join not answered
    join = stage.harness.take(SHARE_GROUPS, ShareGroupHeartbeatRequest)[-1]
    assert join.member_id == ""
    stage.harness.deliver("member", ErrorResponse(correlation_id=join.correlation_id, error=ErrorCode.BUSY,
                                                  error_message="busy"), SHARE_GROUPS)
    stage.harness.take("bootstrap", MetadataRequest)

    stage.harness.advance(stage.member.heartbeat_interval_ms + 1)
    again = stage.harness.take(SHARE_GROUPS, ShareGroupHeartbeatRequest)

    assert stage.harness.take("bootstrap", MetadataRequest) == [], "the coordinator was taken as lost"
    assert [beat.member_id for beat in again] == [""]
    stage.harness.deliver("member", ShareGroupHeartbeatResponse(
        correlation_id=again[0].correlation_id, member_id="m1", partitions=[("orders", 0)]), SHARE_GROUPS)
    assert stage.member.state == "stable" and stage.member.member_id == "m1"


def test_a_users_commit_refused_busy_is_tried_again_until_the_request_timeout():
    """`commit()` raised BUSY to the user's thread though nothing was wrong with the commit (the
    group quorum's log was full of other clients' writes); Kafka's commitSync retries a
    retriable error until its timeout. Other errors still reach the caller at once."""
    from actors.consumer_member import GroupSettings
    from actors.errors import RailmqError
    from railmq.group_consumer import GroupShell
    from railmq.records import TopicPartition

    class Consumer:
        request_timeout_s = 30.0

        def __init__(self, answers: list) -> None:
            self.answers, self.calls = answers, 0

        def call(self, command: str, **arguments):
            self.calls += 1
            answer = self.answers.pop(0)
            if isinstance(answer, RailmqError):
                raise answer
            return answer

    done = [OffsetEntry(topic="orders", partition=0, offset=7)]
    busy = RailmqError(ErrorCode.BUSY, "busy")
    patient = Consumer([busy, busy, done])
    shell = GroupShell(patient, GroupSettings(group_id="g"), auto_commit=False, auto_commit_interval_ms=5_000)
    assert shell.commit({TopicPartition("orders", 0): 7}) == done and patient.calls == 3

    fenced = Consumer([RailmqError(ErrorCode.ILLEGAL_GENERATION, "gone"), done])
    shell = GroupShell(fenced, GroupSettings(group_id="g"), auto_commit=False, auto_commit_interval_ms=5_000)
    with pytest.raises(RailmqError, match="ILLEGAL_GENERATION"):
        shell.commit({TopicPartition("orders", 0): 7})
    assert fenced.calls == 1
