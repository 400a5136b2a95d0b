"""A consumer as a member of a classic group (actors/consumer_member.py inside ConsumerClient).

The first part plays the group coordinator by hand, so each transition of the member's state
machine is one answer the test chooses. The second part runs two consumers against the real
GroupCoordinator (a small metadata server stands in for the cluster coordinator) to tell eager
revocation from cooperative (KIP-429) revocation. The test is also the embedding shell: it
reads Notify effects and sends commands ("revoked", "polled", "commit", ...).
"""

from __future__ import annotations

import random

import msgspec
import pytest

from actors.assignors import Subscription
from actors.consumer_client import EARLIEST, LATEST, ConsumerClient, ConsumerSettings
from actors.consumer_member import ConsumerMember, GroupSettings
from actors.effects import Send
from actors.errors import ErrorCode
from actors.group_coordinator import GroupCoordinator
from actors.limits import Limits
from actors.messages import (
    ClientCommand, ConsumerAssignment, ErrorResponse, GroupMember, HeartbeatRequest, HeartbeatResponse,
    JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, ListOffsetsRequest, MetadataRequest,
    MetadataResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetEntry, OffsetFetchRequest, OffsetFetchResponse, PartitionMetadata,
    PeerDisconnected, SyncGroupRequest, SyncGroupResponse, TimerFired, TopicMetadata,
)
from storage.memory import MemoryFileSystem
from storage.state import DurableState
from tests.unit.actor_harness import MS, Harness, notices, only

BOOTSTRAP, GROUPS = "bootstrap", "tcp://127.0.0.1:5/groups"
HEARTBEAT_MS, SESSION_MS, MAX_POLL_MS = 300, 3_000, 60_000


def topic(partitions: int = 2, name: str = "orders") -> TopicMetadata:
    return TopicMetadata(name=name, partitions=[
        PartitionMetadata(partition=p, leader=1, leader_endpoint=f"tcp://127.0.0.1:6/{name}/{p}")
        for p in range(partitions)])


def assignment(*partitions: tuple[str, int]) -> bytes:
    return msgspec.msgpack.encode(ConsumerAssignment(partitions=list(partitions)))


def consumer(name: str, *, assignor: str = "range", instance: str | None = None,
             max_poll_ms: int = MAX_POLL_MS) -> ConsumerClient:
    client = ConsumerClient(bootstrap=BOOTSTRAP, settings=ConsumerSettings(auto_offset_reset="earliest"),
                            name=name)
    client.member = ConsumerMember(client, GroupSettings(
        group_id="g", group_instance_id=instance, client_id=name, assignor=assignor,
        session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS, max_poll_interval_ms=max_poll_ms,
        metadata_refresh_ms=60_000))
    return client


# ---------------------------------------------------------------------------- by hand


class Stage:
    """One consumer; the test is its cluster coordinator, its group coordinator and its shell."""

    def __init__(self, **options) -> None:
        self.harness = Harness()
        self.client = consumer("c1", **options)
        self.member = self.client.member
        self.harness.add("c1", self.client)

    def command(self, command: str, **arguments) -> list:
        return self.harness.deliver("c1", ClientCommand(command=command, arguments=arguments, token=9), b"")

    def metadata(self, partitions: int = 2) -> list:
        asked = self.harness.take(BOOTSTRAP, MetadataRequest)
        response = MetadataResponse(correlation_id=asked[-1].correlation_id if asked else 0,
                                    topics=[topic(partitions)], group_coordinator_endpoint=GROUPS)
        return self.harness.deliver("c1", response, BOOTSTRAP)

    def to_groups(self, kind):
        sent = self.harness.take(GROUPS, kind)
        assert sent, f"the member sent no {kind.__name__}"
        return sent[-1]

    def answer(self, response) -> list:
        return self.harness.deliver("c1", response, GROUPS)

    def joined_alone(self, partitions=(("orders", 0), ("orders", 1)), generation: int = 1) -> None:
        """Subscribe, join as the only member (so as leader), sync, learn positions: stable."""
        self.command("subscribe", topics=["orders"])
        self.metadata()
        join = self.to_groups(JoinGroupRequest)
        myself = GroupMember(member_id="c1-m", metadata=join.protocols[0].metadata)
        self.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=generation,
                                      protocol_name="range", leader="c1-m", member_id="c1-m",
                                      members=[myself]))
        sync = self.to_groups(SyncGroupRequest)
        self.answer(SyncGroupResponse(correlation_id=sync.correlation_id, assignment=assignment(*partitions)))
        fetch = self.to_groups(OffsetFetchRequest)
        self.answer(OffsetFetchResponse(correlation_id=fetch.correlation_id, offsets=[
            OffsetEntry(topic=t, partition=p, offset=10 * (p + 1)) for t, p in partitions]))
        assert self.member.state == "stable"

    def join_as_follower(self, generation: int, assignment_bytes: bytes) -> None:
        """Answer the member's JoinGroup as a follower of c0-m, then its SyncGroup with
        `assignment_bytes`."""
        join = self.to_groups(JoinGroupRequest)
        self.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=generation,
                                      protocol_name="range", leader="c0-m", member_id="c1-m"))
        sync = self.to_groups(SyncGroupRequest)
        self.answer(SyncGroupResponse(correlation_id=sync.correlation_id, assignment=assignment_bytes))

    def heartbeat_answer(self, error: int) -> list:
        self.harness.advance(HEARTBEAT_MS)
        beat = self.to_groups(HeartbeatRequest)
        return self.answer(HeartbeatResponse(correlation_id=beat.correlation_id, error=error))

    def notified(self, kind: str) -> list:
        return [notice.payload for _, notice in self.harness.notified if notice.kind == kind]


@pytest.fixture
def stage() -> Stage:
    return Stage()


def test_the_member_joins_once_it_knows_its_coordinator_and_its_subscription(stage):
    stage.command("subscribe", topics=["orders"])
    assert stage.member.state == "unjoined"
    assert stage.harness.received(GROUPS) == []

    stage.metadata()

    join = stage.to_groups(JoinGroupRequest)
    assert stage.member.state == "joining"
    assert (join.group_id, join.member_id, join.session_timeout_ms, join.rebalance_timeout_ms) == (
        "g", "", SESSION_MS, MAX_POLL_MS)
    assert [p.name for p in join.protocols] == ["range"]
    assert msgspec.msgpack.decode(join.protocols[0].metadata, type=Subscription).topics == ["orders"]


def test_the_leader_runs_the_assignor_over_every_members_subscription(stage):
    stage.command("subscribe", topics=["orders"])
    stage.metadata(partitions=4)
    join = stage.to_groups(JoinGroupRequest)
    other = msgspec.msgpack.encode(Subscription(topics=["orders"]))

    stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=3, protocol_name="range",
                                   leader="c1-m", member_id="c1-m", members=[
                                       GroupMember(member_id="c1-m", metadata=join.protocols[0].metadata),
                                       GroupMember(member_id="c2-m", metadata=other)]))

    sync = stage.to_groups(SyncGroupRequest)
    given = {entry.member_id: msgspec.msgpack.decode(entry.assignment, type=ConsumerAssignment).partitions
             for entry in sync.assignments}
    assert stage.member.state == "syncing"
    assert (sync.generation, sync.member_id) == (3, "c1-m")
    assert given == {"c1-m": [("orders", 0), ("orders", 1)], "c2-m": [("orders", 2), ("orders", 3)]}


def test_a_follower_syncs_without_assignments(stage):
    stage.command("subscribe", topics=["orders"])
    stage.metadata()
    join = stage.to_groups(JoinGroupRequest)

    stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=2, protocol_name="range",
                                   leader="other-m", member_id="c1-m"))

    assert stage.to_groups(SyncGroupRequest).assignments == []


def test_an_assignment_starts_fetching_from_the_committed_offsets(stage):
    stage.joined_alone()

    [(generation, member_id, owned, added)] = stage.notified("assigned")
    assert (generation, member_id) == (1, "c1-m")
    assert owned == added == [("orders", 0), ("orders", 1)]
    assert {key: fetch.position for key, fetch in stage.client.fetches.items()} == {
        ("orders", 0): 10, ("orders", 1): 20}


def test_commits_carry_the_generation_and_member_id_and_report_their_result(stage):
    stage.joined_alone()

    stage.command("commit", offsets=[("orders", 0, 15, "")])
    commit = stage.to_groups(OffsetCommitRequest)
    effects = stage.answer(OffsetCommitResponse(correlation_id=commit.correlation_id, offsets=commit.offsets))

    assert (commit.generation, commit.member_id) == (1, "c1-m")
    [(token, offsets, error)] = notices(effects, "result")
    assert token == 9 and error is None and offsets[0].offset == 15


def test_a_commit_while_joining_is_refused_by_the_member_itself(stage):
    stage.command("subscribe", topics=["orders"])
    stage.metadata()

    effects = stage.command("commit", offsets=[("orders", 0, 15, "")])

    [(_, _, error)] = notices(effects, "result")
    assert error.code == ErrorCode.REBALANCE_IN_PROGRESS
    assert stage.harness.received(GROUPS, OffsetCommitRequest) == []


def test_stable_members_heartbeat_every_interval(stage):
    stage.joined_alone()

    stage.harness.advance(HEARTBEAT_MS * 3)

    beats = stage.harness.take(GROUPS, HeartbeatRequest)
    assert len(beats) == 3
    assert {(b.generation, b.member_id) for b in beats} == {(1, "c1-m")}


def test_an_eager_member_revokes_everything_before_it_rejoins(stage):
    stage.joined_alone()

    stage.heartbeat_answer(ErrorCode.REBALANCE_IN_PROGRESS)

    assert stage.member.state == "revoking"
    assert stage.notified("revoke") == [([("orders", 0), ("orders", 1)], False)]
    assert stage.harness.received(GROUPS, JoinGroupRequest) == [], "rejoined before the shell revoked"
    stage.command("revoked")
    join = stage.to_groups(JoinGroupRequest)
    assert stage.member.state == "joining"
    assert join.member_id == "c1-m"
    assert stage.client.fetches == {}


def test_a_cooperative_member_keeps_its_partitions_while_it_rejoins():
    stage = Stage(assignor="cooperative-sticky")
    stage.joined_alone()

    stage.heartbeat_answer(ErrorCode.REBALANCE_IN_PROGRESS)

    join = stage.to_groups(JoinGroupRequest)
    assert stage.notified("revoke") == []
    assert msgspec.msgpack.decode(join.protocols[0].metadata, type=Subscription).owned == [
        ("orders", 0), ("orders", 1)]
    assert set(stage.client.fetches) == {("orders", 0), ("orders", 1)}


def test_a_cooperative_member_revokes_only_what_moved_away_then_rejoins():
    stage = cooperative_stage_revoking()  # told to give up orders/1 only

    assert set(stage.client.fetches) == {("orders", 0)}
    assert stage.member.state == "revoking"
    stage.command("revoked")
    assert stage.to_groups(JoinGroupRequest).member_id == "c1-m"
    assert stage.member.state == "joining"


def test_an_earlier_generations_unanswered_positions_request_does_not_unseat_the_member(stage):
    """The simulator's seed 2423 (denser faults): the committed offsets asked for generation 3's
    partitions were never answered; the member joined generation 4 and held a partition there,
    then the old request timed out and put it back to "unjoined" — it joined generation 5 without
    revoking what it held, and two members held that partition in one generation. Rejoining drops
    what an earlier generation still waits for, as it drops an earlier SyncGroup."""
    stage.command("subscribe", topics=["orders"])
    stage.metadata()
    stage.join_as_follower(3, assignment(("orders", 1)))
    stage.to_groups(OffsetFetchRequest)  # never answered
    stage.heartbeat_answer(ErrorCode.REBALANCE_IN_PROGRESS)
    stage.command("revoked")
    stage.join_as_follower(4, assignment(("orders", 0)))
    fetch = stage.to_groups(OffsetFetchRequest)
    stage.answer(OffsetFetchResponse(correlation_id=fetch.correlation_id,
                                     offsets=[OffsetEntry(topic="orders", partition=0, offset=5)]))
    assert (stage.member.state, stage.member.generation, stage.member.owned) == ("stable", 4, [("orders", 0)])

    for _ in range(110):  # past the first request's timeout (30 s), answering every heartbeat
        stage.harness.advance(HEARTBEAT_MS)
        for beat in stage.harness.take(GROUPS, HeartbeatRequest):
            stage.answer(HeartbeatResponse(correlation_id=beat.correlation_id))

    assert (stage.member.state, stage.member.generation, stage.member.owned) == ("stable", 4, [("orders", 0)])
    assert stage.harness.take(GROUPS, JoinGroupRequest) == []


@pytest.mark.parametrize("code, keeps_id", [(ErrorCode.ILLEGAL_GENERATION, True),
                                            (ErrorCode.UNKNOWN_MEMBER_ID, False)])
def test_a_fenced_generation_loses_the_partitions_without_a_commit_and_rejoins(stage, code, keeps_id):
    stage.joined_alone()

    stage.heartbeat_answer(code)

    assert stage.notified("revoke") == [([("orders", 0), ("orders", 1)], True)]
    assert stage.client.fetches == {}
    assert stage.harness.received(GROUPS, JoinGroupRequest) == [], "rejoined before the shell gave them up"
    stage.command("revoked")
    join = stage.to_groups(JoinGroupRequest)
    assert join.member_id == ("c1-m" if keeps_id else "")
    assert stage.member.state == "joining"
    assert stage.client.fetches == {}


def test_a_fenced_static_instance_is_fatal():
    stage = Stage(instance="host-1")
    stage.joined_alone()

    stage.heartbeat_answer(ErrorCode.FENCED_INSTANCE_ID)

    assert stage.member.state == "fenced"
    [error] = stage.notified("fatal")
    assert error.code == ErrorCode.FENCED_INSTANCE_ID
    stage.harness.advance(HEARTBEAT_MS * 3)
    assert stage.harness.received(GROUPS, HeartbeatRequest) == []


def test_leaving_sends_leave_group_and_drops_the_assignment(stage):
    stage.joined_alone()

    effects = stage.command("leave", reason="shutting down")

    leave = stage.to_groups(LeaveGroupRequest)
    assert (leave.member_id, leave.reason) == ("c1-m", "shutting down")
    assert stage.member.state == "left"
    assert stage.client.fetches == {}
    assert notices(effects, "result") == [(9, None, None)]


def test_a_static_member_leaves_quietly_so_its_restart_does_not_rebalance():
    stage = Stage(instance="host-1")
    stage.joined_alone()

    stage.command("leave")

    assert stage.harness.received(GROUPS, LeaveGroupRequest) == []
    assert stage.member.member_id == "c1-m"


def test_without_a_poll_for_max_poll_interval_the_member_leaves_until_the_next_poll():
    stage = Stage(max_poll_ms=2_000)
    stage.joined_alone()

    stage.harness.advance(2_100)

    leave = only(stage.harness.take(GROUPS, LeaveGroupRequest), LeaveGroupRequest)
    assert leave.reason.startswith("max_poll_interval_ms")
    assert stage.member.state == "left"
    assert stage.client.fetches == {}
    stage.command("polled")
    join = stage.to_groups(JoinGroupRequest)
    assert join.member_id == ""


def test_polling_keeps_the_member_in_the_group():
    stage = Stage(max_poll_ms=2_000)
    stage.joined_alone()

    for _ in range(5):
        stage.harness.advance(1_000)
        stage.command("polled")

    assert stage.member.state == "stable"
    assert stage.harness.received(GROUPS, LeaveGroupRequest) == []


def test_a_partition_count_change_makes_the_leader_rebalance(stage):
    stage.joined_alone()

    stage.harness.deliver("c1", MetadataResponse(correlation_id=0, topics=[topic(3)],
                                                 group_coordinator_endpoint=GROUPS), BOOTSTRAP)

    assert stage.member.state == "revoking"
    assert stage.notified("revoke")


def test_a_partition_the_topic_gained_is_read_from_its_start_when_the_group_reads_the_topic_already():
    """auto_offset_reset=latest is for a group new to a topic. A partition the topic gained while
    the group read it has no commit yet, and its records were written while the group was
    subscribed: started at its end, the group skipped them (live: 0 of 20 acknowledged records of
    the new partition delivered, with the Consumer's defaults)."""
    stage = Stage()
    stage.client.settings = msgspec.structs.replace(stage.client.settings, auto_offset_reset="latest")
    stage.command("subscribe", topics=["orders"])
    stage.metadata(partitions=1)
    for generation, partitions in ((1, [("orders", 0)]), (2, [("orders", 0), ("orders", 1)])):
        join = stage.to_groups(JoinGroupRequest)
        stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=generation,
                                       protocol_name="range", leader="c1-m", member_id="c1-m",
                                       members=[GroupMember(member_id="c1-m",
                                                            metadata=join.protocols[0].metadata)]))
        sync = stage.to_groups(SyncGroupRequest)
        stage.answer(SyncGroupResponse(correlation_id=sync.correlation_id,
                                       assignment=assignment(*partitions)))
        fetch = stage.to_groups(OffsetFetchRequest)
        stage.answer(OffsetFetchResponse(correlation_id=fetch.correlation_id, offsets=[
            OffsetEntry(topic="orders", partition=0, offset=10),
            OffsetEntry(topic="orders", partition=1, offset=-1)]))
        if generation == 1:  # the topic grows: the leader rebalances, after the shell's revocation
            stage.harness.deliver("c1", MetadataResponse(correlation_id=0, topics=[topic(2)],
                                                         group_coordinator_endpoint=GROUPS), BOOTSTRAP)
            stage.command("revoked")

    reset = only(stage.harness.take("tcp://127.0.0.1:6/orders/1", ListOffsetsRequest), ListOffsetsRequest)
    assert reset.timestamp_ms == EARLIEST, "from the start of the new partition"
    assert stage.client.fetches[("orders", 0)].position == 10


def test_a_topic_new_to_the_group_starts_at_its_end_with_latest():
    stage = Stage()
    stage.client.settings = msgspec.structs.replace(stage.client.settings, auto_offset_reset="latest")
    stage.command("subscribe", topics=["orders"])
    stage.metadata(partitions=2)
    join = stage.to_groups(JoinGroupRequest)
    stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=1, protocol_name="range",
                                   leader="c1-m", member_id="c1-m",
                                   members=[GroupMember(member_id="c1-m",
                                                        metadata=join.protocols[0].metadata)]))
    sync = stage.to_groups(SyncGroupRequest)
    stage.answer(SyncGroupResponse(correlation_id=sync.correlation_id,
                                   assignment=assignment(("orders", 0), ("orders", 1))))
    fetch = stage.to_groups(OffsetFetchRequest)
    stage.answer(OffsetFetchResponse(correlation_id=fetch.correlation_id, offsets=[
        OffsetEntry(topic="orders", partition=p, offset=-1) for p in range(2)]))

    resets = [request.timestamp_ms for p in range(2)
              for request in stage.harness.take(f"tcp://127.0.0.1:6/orders/{p}", ListOffsetsRequest)]
    assert resets == [LATEST, LATEST]


def test_a_subscribed_topic_created_after_the_assignment_makes_the_leader_rebalance(stage):
    """The group formed before its topic existed (a new cluster, a topic created after the
    consumers started): the leader assigned nothing, and must rebalance when the topic appears."""
    stage.command("subscribe", topics=["orders"])
    asked = stage.harness.take(BOOTSTRAP, MetadataRequest)
    stage.harness.deliver("c1", MetadataResponse(correlation_id=asked[-1].correlation_id, topics=[TopicMetadata(
        name="orders", error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)], group_coordinator_endpoint=GROUPS), BOOTSTRAP)
    join = stage.to_groups(JoinGroupRequest)
    stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=1, protocol_name="range",
                                   leader="c1-m", member_id="c1-m",
                                   members=[GroupMember(member_id="c1-m", metadata=join.protocols[0].metadata)]))
    sync = stage.to_groups(SyncGroupRequest)
    stage.answer(SyncGroupResponse(correlation_id=sync.correlation_id, assignment=assignment()))
    assert stage.member.state == "stable" and not stage.member.owned

    stage.harness.deliver("c1", MetadataResponse(correlation_id=0, topics=[topic(2)],
                                                 group_coordinator_endpoint=GROUPS), BOOTSTRAP)

    assert stage.member.state in ("revoking", "joining"), "the topic appeared and nobody was assigned it"


def test_a_stable_member_follows_its_group_to_a_new_coordinator_without_a_rebalance(stage):
    """The group coordinator failed over (the voter asked no longer leads: NOT_COORDINATOR). The
    group's state moved with it, so the member finds it again and carries on in its generation,
    as a Kafka member does; rejoining would stop every member of the group for a rebalance."""
    stage.joined_alone()
    stage.harness.advance(HEARTBEAT_MS)
    beat = stage.to_groups(HeartbeatRequest)
    stage.answer(ErrorResponse(correlation_id=beat.correlation_id, error=ErrorCode.NOT_COORDINATOR,
                               error_message="group-coordinator/1 does not lead"))
    assert stage.member.state == "stable" and stage.member.generation == 1 and stage.member.owned
    assert stage.member.coordinator == ""
    asked = stage.harness.take(BOOTSTRAP, MetadataRequest)
    assert asked, "the member did not look for its group coordinator again"
    moved = "tcp://127.0.0.1:9/groups-2"
    stage.harness.deliver("c1", MetadataResponse(correlation_id=asked[-1].correlation_id, topics=[topic(2)],
                                                 group_coordinator_endpoint=moved), BOOTSTRAP)
    stage.harness.advance(HEARTBEAT_MS)
    [beat] = stage.harness.take(moved, HeartbeatRequest)[-1:]
    assert (beat.generation, beat.member_id) == (1, "c1-m")
    assert stage.harness.take(moved, JoinGroupRequest) == [], "a failover must not cost a rebalance"


def test_a_commit_refused_for_want_of_a_coordinator_asks_where_it_is(stage):
    """Between a group coordinator's death and the next heartbeat, a commit that is refused
    ("not known yet") must itself look for the coordinator, or the caller's retries wait for the
    heartbeat interval."""
    stage.joined_alone()
    stage.member.coordinator = ""
    stage.harness.take(BOOTSTRAP, MetadataRequest)
    stage.command("commit", offsets=[["orders", 0, 5, ""]])
    assert stage.harness.take(BOOTSTRAP, MetadataRequest), "the refused commit did not ask for metadata"


def test_a_coordinator_endpoint_that_died_is_trusted_again_once_a_new_process_announces_it(stage):
    """A group voter dies (its endpoint is distrusted for a while: metadata may still name the
    dead process), restarts on the same port and becomes the active one again: metadata naming it
    with a new incarnation is news, not the stale answer the distrust is for."""
    stage.joined_alone()
    stale = MetadataResponse(correlation_id=0, topics=[topic(2)], group_coordinator_endpoint=GROUPS,
                             group_coordinator_incarnation=7)
    stage.harness.deliver("c1", stale, BOOTSTRAP)  # the process the member talks to is incarnation 7
    stage.harness.deliver("c1", PeerDisconnected(endpoint=GROUPS), b"")
    assert stage.member.coordinator == ""
    stage.harness.deliver("c1", stale, BOOTSTRAP)
    assert stage.member.coordinator == "", "the dead process's endpoint was trusted again"
    fresh = msgspec.structs.replace(stale, group_coordinator_incarnation=8)
    stage.harness.deliver("c1", fresh, BOOTSTRAP)
    assert stage.member.coordinator == GROUPS


def test_a_join_that_is_never_answered_is_asked_again_after_a_session_timeout(stage):
    stage.command("subscribe", topics=["orders"])
    stage.metadata()
    first = stage.to_groups(JoinGroupRequest)

    stage.harness.advance(max(stage.member.settings.session_timeout_ms, stage.member.settings.request_timeout_ms) + 200)

    again = [m for m in stage.harness.received(GROUPS) if isinstance(m, JoinGroupRequest)]
    assert again and again[-1].correlation_id != first.correlation_id, "the join is sent again"
    assert stage.member.state == "joining" and stage.member.coordinator == GROUPS


def test_a_member_that_lost_its_coordinator_never_sends_to_an_empty_address(stage):
    stage.joined_alone()

    stage.harness.deliver("c1", PeerDisconnected(endpoint=GROUPS), b"")
    stage.harness.advance(HEARTBEAT_MS * 2)

    assert [step for step in stage.harness.steps_of("c1")
            if any(isinstance(effect, Send) and effect.to == "" for effect in step.effects)] == []


# ---------------------------------------------------------------------------- revocations the user's thread answers late
# The shell answers each ("revoke", ...) in order, after the batch its user is processing and the
# commit the revocation makes (railmq/group_consumer.py). A member that rejoined meanwhile could be
# handed a revoked partition back, and the late answer would then make the shell forget it (the
# simulator's seed-171 finding): the member joins only once every revocation is answered.


def cooperative_stage_revoking() -> Stage:
    """A cooperative member that owns orders/0 and orders/1 and was told to give up orders/1."""
    stage = Stage(assignor="cooperative-sticky")
    stage.joined_alone()
    stage.heartbeat_answer(ErrorCode.REBALANCE_IN_PROGRESS)
    join = stage.to_groups(JoinGroupRequest)
    stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=2,
                                   protocol_name="cooperative-sticky", leader="other", member_id="c1-m"))
    sync = stage.to_groups(SyncGroupRequest)
    stage.answer(SyncGroupResponse(correlation_id=sync.correlation_id, assignment=assignment(("orders", 0))))
    assert stage.notified("revoke") == [([("orders", 1)], False)]
    return stage


def test_a_rebalance_announced_during_a_revocation_waits_for_the_shell_to_answer_it():
    stage = cooperative_stage_revoking()

    stage.heartbeat_answer(ErrorCode.REBALANCE_IN_PROGRESS)

    assert stage.harness.received(GROUPS, JoinGroupRequest) == [], "rejoined while orders/1 was being revoked"
    assert stage.member.state == "revoking"
    stage.command("revoked")
    join = stage.to_groups(JoinGroupRequest)
    assert msgspec.msgpack.decode(join.protocols[0].metadata, type=Subscription).owned == [("orders", 0)]


def test_a_membership_lost_during_a_revocation_rejoins_only_after_both_are_answered():
    stage = cooperative_stage_revoking()

    stage.heartbeat_answer(ErrorCode.ILLEGAL_GENERATION)  # the revocation's commit is slow; the session ends

    assert stage.notified("revoke") == [([("orders", 1)], False), ([("orders", 0)], True)]
    stage.command("revoked")  # the first revocation, answered late
    assert stage.harness.received(GROUPS, JoinGroupRequest) == [], "rejoined before the lost partitions were given up"
    stage.harness.advance(HEARTBEAT_MS * 3)
    assert stage.harness.received(GROUPS, HeartbeatRequest) == [], "heartbeats for a generation it no longer has"
    stage.command("revoked")
    join = stage.to_groups(JoinGroupRequest)
    assert join.member_id == "c1-m" and stage.member.state == "joining"


def test_a_revoked_partition_comes_back_only_after_the_shell_answered_its_revocation():
    """The seed-171 story: the coordinator would hand orders/1 straight back; the shell's late answer
    to its revocation must come before that, or the shell forgets the position it is given."""
    stage = cooperative_stage_revoking()
    stage.heartbeat_answer(ErrorCode.UNKNOWN_MEMBER_ID)
    before = len(stage.notified("assigned"))

    def assigned_since() -> list:
        return stage.notified("assigned")[before:]

    def coordinator_gives_everything_back() -> None:
        for join in stage.harness.take(GROUPS, JoinGroupRequest):
            stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=5,
                                           protocol_name="cooperative-sticky", leader="other", member_id="c1-new"))
        for sync in stage.harness.take(GROUPS, SyncGroupRequest):
            stage.answer(SyncGroupResponse(correlation_id=sync.correlation_id,
                                           assignment=assignment(("orders", 0), ("orders", 1))))
        for fetch in stage.harness.take(GROUPS, OffsetFetchRequest):
            stage.answer(OffsetFetchResponse(correlation_id=fetch.correlation_id, offsets=[
                OffsetEntry(topic="orders", partition=p, offset=40 + p) for p in (0, 1)]))

    coordinator_gives_everything_back()  # before the user's thread got to its revocations
    assert assigned_since() == [], "partitions handed back while their revocations were unanswered"
    stage.command("revoked")
    coordinator_gives_everything_back()
    assert assigned_since() == []
    stage.command("revoked")
    coordinator_gives_everything_back()

    assert assigned_since() == [(5, "c1-new", [("orders", 0), ("orders", 1)],
                                 [("orders", 0), ("orders", 1)])]
    assert set(stage.client.fetches) == {("orders", 0), ("orders", 1)}


# ---------------------------------------------------------------------------- with the real group coordinator


class MetadataServer:
    """Answers metadata like the cluster coordinator would; nothing else."""

    name = "metadata"

    def start(self, now_ns: int) -> list:
        return []

    def handle(self, message, sender, now_ns: int) -> list:
        if isinstance(message, MetadataRequest):
            return [Send(sender, MetadataResponse(correlation_id=message.correlation_id, topics=[topic(2)],
                                                  group_coordinator_endpoint=GROUPS))]
        return []

    def invariants(self) -> None:
        pass


class Group:
    """Consumers c1, c2 and a real GroupCoordinator; the test is each consumer's shell."""

    def __init__(self, assignor: str) -> None:
        self.harness = Harness()
        self.harness.add(BOOTSTRAP, MetadataServer())
        limits = Limits(group_initial_rebalance_delay_ms=100)
        self.harness.add(GROUPS, GroupCoordinator(
            state=DurableState.open("/g/state", fs=MemoryFileSystem()), coordinator=BOOTSTRAP,
            endpoint=GROUPS, incarnation=1, limits=limits, rng=random.Random(2)))
        self.assignor = assignor
        self.answered = 0

    def start(self, name: str) -> None:
        self.harness.add(name, consumer(name, assignor=self.assignor))
        self.harness.deliver(name, ClientCommand(command="subscribe", arguments={"topics": ["orders"]}), b"")

    def shell(self, milliseconds: int) -> None:
        """Time passes; each shell polls and confirms revocations as its user would."""
        for _ in range(milliseconds // 50):
            self.harness.advance(50)
            for address, notice in self.harness.notified[self.answered:]:
                if notice.kind == "revoke" and address in self.harness.actors:
                    self.harness.deliver(address, ClientCommand(command="revoked"), b"")
            self.answered = len(self.harness.notified)
            for name in ("c1", "c2"):
                if name in self.harness.actors:
                    self.harness.deliver(name, ClientCommand(command="polled"), b"")

    def owned(self, name: str) -> list:
        return self.harness.actors[name].member.owned

    def revocations(self, name: str) -> list:
        return [notice.payload[0] for address, notice in self.harness.notified
                if address == name and notice.kind == "revoke"]


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_a_second_consumer_gets_half_of_the_partitions(assignor):
    group = Group(assignor)
    group.start("c1")
    group.shell(1_000)
    assert group.owned("c1") == [("orders", 0), ("orders", 1)]

    group.start("c2")
    group.shell(3_000)

    assert sorted(group.owned("c1") + group.owned("c2")) == [("orders", 0), ("orders", 1)]
    assert len(group.owned("c1")) == len(group.owned("c2")) == 1


def test_eager_revocation_gives_up_every_partition_before_the_rebalance():
    group = Group("range")
    group.start("c1")
    group.shell(1_000)
    group.start("c2")
    group.shell(3_000)

    assert group.revocations("c1") == [[("orders", 0), ("orders", 1)]]


def test_cooperative_revocation_gives_up_only_the_partition_that_moves():
    group = Group("cooperative-sticky")
    group.start("c1")
    group.shell(1_000)
    group.start("c2")
    group.shell(3_000)

    moved = group.owned("c2")
    assert group.revocations("c1") == [moved]
    assert group.owned("c1") == [tp for tp in [("orders", 0), ("orders", 1)] if tp not in moved]


# ---------------------------------------------------------------------------- one join in flight
# A paused group coordinator answers, when it resumes, every heartbeat the member sent meanwhile,
# each with UNKNOWN_MEMBER_ID. Each answer asked for a rejoin, and with no member id yet each
# join made the coordinator a new member: the member adopted every identity it was answered
# with, synced as each, and owned the union of their assignments (the simulator's finding: one
# consumer held partitions the leader had given to others in the next generation).


def test_a_burst_of_fencing_answers_sends_one_join_and_follows_one_identity():
    stage = Stage()
    stage.joined_alone()
    beats = []
    for _ in range(3):  # the coordinator is paused: the member heartbeats on, unanswered
        stage.harness.advance(HEARTBEAT_MS)
        beats += stage.harness.take(GROUPS, HeartbeatRequest)
    assert len(beats) == 3
    stage.answer(HeartbeatResponse(correlation_id=beats[0].correlation_id, error=ErrorCode.UNKNOWN_MEMBER_ID))
    stage.command("revoked")  # the lost partitions, given up by the user's thread

    for beat in beats[1:]:
        stage.answer(HeartbeatResponse(correlation_id=beat.correlation_id, error=ErrorCode.UNKNOWN_MEMBER_ID))

    joins = stage.harness.take(GROUPS, JoinGroupRequest)
    assert len(joins) == 1, "one join in flight at a time"
    stage.answer(JoinGroupResponse(correlation_id=joins[0].correlation_id, generation=4, protocol_name="range",
                                   leader="other", member_id="c1-new"))
    stage.answer(SyncGroupResponse(correlation_id=stage.to_groups(SyncGroupRequest).correlation_id,
                                   assignment=assignment(("orders", 1))))
    fetch = stage.to_groups(OffsetFetchRequest)
    stage.answer(OffsetFetchResponse(correlation_id=fetch.correlation_id,
                                     offsets=[OffsetEntry(topic="orders", partition=1, offset=7)]))
    assert stage.member.member_id == "c1-new" and stage.member.owned == [("orders", 1)]



# ---------------------------------------------------------------------------- an answer that outlives the coordinator it came from


def test_a_join_answered_after_the_coordinator_was_lost_still_ends_in_a_sync(stage):
    """The simulator's seed-20326 finding. A heartbeat answered NOT_COORDINATOR while the member's
    join was in flight made it forget its coordinator; the join's answer then arrived, the member
    went to "syncing", and its SyncGroup had nowhere to go: it was dropped, no request was pending
    to time out, and once the coordinator was found again the member stayed "syncing" for good
    (heartbeats accepted, nothing assigned, nothing consumed)."""
    stage.joined_alone()
    stage.harness.advance(HEARTBEAT_MS)
    beat = stage.to_groups(HeartbeatRequest)  # in flight
    stage.answer(HeartbeatResponse(correlation_id=0, error=ErrorCode.REBALANCE_IN_PROGRESS))  # the notice
    stage.command("revoked")
    join = stage.to_groups(JoinGroupRequest)
    stage.answer(ErrorResponse(correlation_id=beat.correlation_id, error=ErrorCode.NOT_COORDINATOR,
                               error_message="group-coordinator/1 does not lead"))
    assert stage.member.coordinator == ""
    myself = GroupMember(member_id="c1-m", metadata=join.protocols[0].metadata)
    stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=2, protocol_name="range",
                                   leader="c1-m", member_id="c1-m", members=[myself]))
    stage.harness.take(GROUPS)
    stage.metadata()  # the coordinator is found again, at the same address

    stage.harness.advance(HEARTBEAT_MS * 3)
    asked = stage.harness.received(GROUPS, JoinGroupRequest) + stage.harness.received(GROUPS, SyncGroupRequest)
    assert asked, f"the member stays {stage.member.state!r} and never asks its group again"


def test_a_request_with_no_coordinator_to_go_to_fails_as_the_caller_expects(stage):
    """Every request the member sends finds its coordinator or is accounted for: a join, a sync or
    a positions request puts the member back to "unjoined" (the metadata it asks for rejoins it),
    never in a state that waits for an answer that was never asked for."""
    stage.joined_alone()
    stage.member.coordinator = ""
    stage.harness.take(BOOTSTRAP, MetadataRequest)
    effects = stage.member._sync(stage.harness.now_ns, [])
    assert not [e for e in effects if isinstance(e, Send) and e.to == GROUPS]
    assert stage.member.state == "unjoined" and not stage.member.pending
    assert [e for e in effects if isinstance(e, Send) and isinstance(e.message, MetadataRequest)]


def test_a_stable_member_wakes_for_its_heartbeats_not_every_100_ms(stage):
    stage.joined_alone()
    for beat in stage.harness.take(GROUPS, HeartbeatRequest):
        stage.answer(HeartbeatResponse(correlation_id=beat.correlation_id))
    before = len(stage.harness.steps_of("c1", TimerFired))
    for _ in range(10):
        stage.harness.advance(HEARTBEAT_MS)
        [beat] = stage.harness.take(GROUPS, HeartbeatRequest)
        stage.answer(HeartbeatResponse(correlation_id=beat.correlation_id))
    wakes = len(stage.harness.steps_of("c1", TimerFired)) - before
    assert 10 <= wakes <= 12, f"{wakes} wakes for 10 heartbeat intervals"


def test_a_member_that_stops_polling_leaves_when_max_poll_interval_passes_to_the_millisecond():
    stage = Stage(max_poll_ms=1_000)
    stage.joined_alone()
    polled_ns = stage.member.last_poll_ns
    stage.harness.advance_to(polled_ns + 1_000 * MS)
    assert stage.member.state == "stable"
    stage.harness.advance_to(polled_ns + 1_000 * MS + 1)
    assert stage.harness.received(GROUPS, LeaveGroupRequest), "still in the group past max_poll_interval_ms"


def rejoin_as(stage: Stage, member_id: str, generation: int) -> None:
    """The coordinator forgot the member: it rejoins alone and becomes `member_id`, stable again."""
    stage.heartbeat_answer(ErrorCode.UNKNOWN_MEMBER_ID)
    stage.command("revoked")  # the shell answers the revocation of what was lost
    join = stage.to_groups(JoinGroupRequest)
    assert join.member_id == ""
    stage.answer(JoinGroupResponse(correlation_id=join.correlation_id, generation=generation, protocol_name="range",
                                   leader=member_id, member_id=member_id,
                                   members=[GroupMember(member_id=member_id, metadata=join.protocols[0].metadata)]))
    sync = stage.to_groups(SyncGroupRequest)
    stage.answer(SyncGroupResponse(correlation_id=sync.correlation_id, assignment=sync.assignments[0].assignment))
    fetch = stage.to_groups(OffsetFetchRequest)
    stage.answer(OffsetFetchResponse(correlation_id=fetch.correlation_id, offsets=[
        OffsetEntry(topic="orders", partition=partition, offset=10) for partition in (0, 1)]))
    assert (stage.member.state, stage.member.member_id) == ("stable", member_id)


def test_a_late_fenced_answer_to_a_commit_sent_under_an_old_member_id_does_not_stop_the_member():
    """A static member commits as c1-m; the coordinator forgets it and it rejoins as c1-n; then the
    old commit's answer comes: FENCED_INSTANCE_ID, about c1-m. The commit failed; the member holds
    the instance as c1-n and carries on (the simulator's seed 32126 of its network-fault sweep)."""
    stage = Stage(instance="host-1")
    stage.joined_alone()
    stage.command("commit", offsets=[("orders", 0, 15, "")])
    old_commit = stage.to_groups(OffsetCommitRequest)
    assert old_commit.member_id == "c1-m"

    rejoin_as(stage, "c1-n", generation=2)
    effects = stage.answer(OffsetCommitResponse(
        correlation_id=old_commit.correlation_id, error=ErrorCode.FENCED_INSTANCE_ID,
        error_message="instance host-1 belongs to member c1-n now"))

    [(_, _, error)] = notices(effects, "result")
    assert error.code == ErrorCode.FENCED_INSTANCE_ID, "the commit itself failed"
    assert stage.member.state == "stable" and stage.notified("fatal") == []
    stage.harness.advance(HEARTBEAT_MS)
    assert stage.to_groups(HeartbeatRequest).member_id == "c1-n"


def test_a_fenced_answer_to_a_commit_under_the_current_member_id_is_fatal():
    stage = Stage(instance="host-1")
    stage.joined_alone()
    stage.command("commit", offsets=[("orders", 0, 15, "")])
    commit = stage.to_groups(OffsetCommitRequest)

    stage.answer(OffsetCommitResponse(correlation_id=commit.correlation_id, error=ErrorCode.FENCED_INSTANCE_ID,
                                      error_message="a newer instance joined"))

    assert stage.member.state == "fenced"
    [error] = stage.notified("fatal")
    assert error.code == ErrorCode.FENCED_INSTANCE_ID
