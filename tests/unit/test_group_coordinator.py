"""The group coordinator (actors/group_coordinator.py): requests, durability and commit fencing.

The group coordinator runs in the harness over a DurableState on a MemoryFileSystem; consumers
are played by the test from their own addresses. A "restart" crashes the file system (what was
never flushed is lost) and builds a new GroupCoordinator over it.
"""

from __future__ import annotations

import random

import pytest

from actors.errors import ErrorCode
from actors.group_coordinator import GroupCoordinator
from actors.limits import Limits
from actors.messages import (
    DeleteGroupRequest, DeleteGroupResponse, DescribeGroupRequest, DescribeGroupResponse, ErrorResponse,
    FetchRequest, GroupProtocol, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, MemberAssignment,
    OffsetCommitRequest, OffsetCommitResponse, OffsetEntry, OffsetFetchRequest, OffsetFetchResponse,
    ServiceHeartbeat, SyncGroupRequest, SyncGroupResponse, TimerFired,
)
from storage.memory import MemoryFileSystem
from storage.state import DurableState
from tests.unit.actor_harness import MS, Harness, at_once, flushed, messages, only

GROUPS, COORDINATOR = "groups", "coordinator"
LIMITS = Limits(group_initial_rebalance_delay_ms=100, group_members_max=3)
STATE_PATH = "/groups/groups.state"


class Stage:
    def __init__(self) -> None:
        self.fs = MemoryFileSystem()
        self.harness = Harness()
        self.coordinator = self._build()
        self.harness.add(GROUPS, self.coordinator)
        self.ids: dict[str, str] = {}
        self.secrets: dict[str, bytes] = {}  # what each member's join answer gave it
        self.correlation = 0

    def _build(self) -> GroupCoordinator:
        return GroupCoordinator(state=DurableState.open(STATE_PATH, fs=self.fs), coordinator=COORDINATOR,
                                endpoint="tcp://127.0.0.1:5/groups", incarnation=1, limits=LIMITS,
                                rng=random.Random(4))

    def restart(self) -> None:
        self.harness.remove(GROUPS)
        self.fs.crash()
        self.coordinator = self._build()
        self.harness.add(GROUPS, self.coordinator)

    def ask(self, sender: str, message) -> list:
        return self.harness.deliver(GROUPS, message, sender)

    def member(self, name: str) -> dict:
        """How a request names `name` as a member: its id and the secret its join answer gave it."""
        return {"member_id": self.ids[name], "member_secret": self.secrets[name]}

    def next_correlation(self) -> int:
        self.correlation += 1
        return self.correlation

    def join(self, name: str, *, group: str = "g", instance: str | None = None, session_ms: int = 10_000,
             member_id: str | None = None, sender: str | None = None, rebalance_ms: int = 5_000) -> list:
        request = JoinGroupRequest(
            correlation_id=self.next_correlation(), group_id=group,
            member_id=self.ids.get(name, "") if member_id is None else member_id, group_instance_id=instance,
            member_secret=self.secrets.get(name, b""), client_id=name, session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            protocols=[GroupProtocol(name="range", metadata=name.encode())])
        return self.ask(sender or name, request)  # another sender: another process of that member

    def joined(self, name: str, sender: str | None = None) -> JoinGroupResponse:
        response = self.harness.received(sender or name, JoinGroupResponse)[-1]
        if response.error == ErrorCode.NONE:
            self.ids[name] = response.member_id
            self.secrets[name] = response.member_secret
        return response

    def stable(self, *names: str, instances: dict[str, str] | None = None) -> int:
        """The named members form generation N of group g; returns N."""
        instances = instances or {}
        for name in names:
            self.join(name, instance=instances.get(name))
        self.harness.advance(LIMITS.group_initial_rebalance_delay_ms + 50)
        for name in names:
            self.joined(name)
        leader = next(name for name in names if self.ids[name] == self.coordinator.groups["g"].leader)
        generation = self.coordinator.groups["g"].generation
        assignments = [MemberAssignment(member_id=self.ids[name], assignment=name.encode()) for name in names]
        self.ask(leader, SyncGroupRequest(
            correlation_id=self.next_correlation(), group_id="g", generation=generation,
            group_instance_id=instances.get(leader), assignments=assignments, **self.member(leader)))
        return generation

    def commit(self, name: str, offsets: dict[tuple[str, int], int], *, generation: int | None = None,
               member_id: str | None = None, instance: str | None = None, group: str = "g",
               metadata: str = "") -> list:
        request = OffsetCommitRequest(
            correlation_id=self.next_correlation(), group_id=group,
            generation=self.coordinator.groups[group].generation if generation is None else generation,
            member_id=self.ids.get(name, "") if member_id is None else member_id, group_instance_id=instance,
            member_secret=self.secrets.get(name, b""),
            offsets=[OffsetEntry(topic=topic, partition=partition, offset=offset, metadata=metadata)
                     for (topic, partition), offset in offsets.items()])
        return self.ask(name, request)

    def committed(self, group: str = "g", partitions=None) -> dict[tuple[str, int], int]:
        request = OffsetFetchRequest(correlation_id=self.next_correlation(), group_id=group,
                                     partitions=partitions)
        response = only(self.ask("admin", request), OffsetFetchResponse)
        return {(entry.topic, entry.partition): entry.offset for entry in response.offsets}


@pytest.fixture
def stage() -> Stage:
    return Stage()


def admin_commit(stage: Stage, offsets: dict[tuple[str, int], int], group: str = "g") -> OffsetCommitResponse:
    effects = stage.commit("admin", offsets, generation=-1, member_id="", group=group)
    return only(effects, OffsetCommitResponse)


# ---------------------------------------------------------------------------- lifecycle


def test_it_announces_itself_to_the_coordinator_every_node_heartbeat_interval(stage):
    stage.harness.advance(LIMITS.node_heartbeat_interval_ms * 3)

    beats = stage.harness.received(COORDINATOR, ServiceHeartbeat)
    assert len(beats) == 4
    assert {(b.role, b.endpoint) for b in beats} == {("group-coordinator", "tcp://127.0.0.1:5/groups")}


def test_an_unknown_message_gets_a_typed_error(stage):
    request = FetchRequest(correlation_id=8, topic="t", partition=0, offset=0)

    response = only(stage.ask("x", request), ErrorResponse)

    assert (response.correlation_id, response.error) == (8, ErrorCode.UNKNOWN_MESSAGE)


# ---------------------------------------------------------------------------- joining


@pytest.mark.parametrize("group", ["", "a/b", "g" * 256])
def test_an_invalid_group_id_is_refused(stage, group):
    only(stage.join("a", group=group), JoinGroupResponse)

    assert stage.joined("a").error == ErrorCode.INVALID_REQUEST
    assert stage.coordinator.groups == {}


@pytest.mark.parametrize("session_ms", [LIMITS.group_session_timeout_min_ms - 1,
                                        LIMITS.group_session_timeout_max_ms + 1])
def test_a_session_timeout_outside_the_limits_is_refused(stage, session_ms):
    stage.join("a", session_ms=session_ms)

    assert stage.joined("a").error == ErrorCode.INVALID_SESSION_TIMEOUT


@pytest.mark.parametrize("rebalance_ms", [0, -1, LIMITS.group_rebalance_timeout_max_ms + 1, 2**62])
def test_a_rebalance_timeout_outside_the_limits_is_refused(stage, rebalance_ms):
    """A member's rebalance timeout is how long a rebalance waits for it to join again: one of
    2**62 ms held every rebalance of its group open for as long as it kept heartbeating without
    joining, and one of 0 or less, when it was the longest of its group, ended each one at once."""
    stage.join("a", rebalance_ms=rebalance_ms)

    answer = stage.joined("a")

    assert answer.error == ErrorCode.INVALID_REQUEST and "rebalance_timeout_ms" in answer.error_message
    assert stage.coordinator.groups == {}


def test_a_group_refuses_members_beyond_its_maximum(stage):
    for name in ("a", "b", "c"):
        stage.join(name)

    stage.join("d")

    assert stage.joined("d").error == ErrorCode.BUSY
    assert len(stage.coordinator.groups["g"].members) == 3


def test_a_new_generation_is_flushed_before_any_member_hears_of_it(stage):
    stage.join("a")
    stage.join("b")

    stage.harness.advance(LIMITS.group_initial_rebalance_delay_ms + 50)

    [step] = [step for step in stage.harness.steps_of(GROUPS) if messages(step.effects, JoinGroupResponse)]
    assert messages(at_once(step.effects), JoinGroupResponse) == []
    assert {m.generation for m in messages(flushed(step.effects), JoinGroupResponse)} == {1}
    assert stage.fs.durable_content(STATE_PATH)  # the journal reached the disk


def test_join_sync_and_heartbeat_through_the_coordinator(stage):
    generation = stage.stable("a", "b")

    assert generation == 1
    assert only(stage.harness.received("a", SyncGroupResponse), SyncGroupResponse).assignment == b"a"
    stage.ask("b", SyncGroupRequest(correlation_id=50, group_id="g", generation=1, **stage.member("b")))
    assert stage.harness.received("b", SyncGroupResponse)[-1].assignment == b"b"
    heartbeat = only(stage.ask("a", HeartbeatRequest(correlation_id=51, group_id="g", generation=1,
                                                     **stage.member("a"))), HeartbeatResponse)
    assert heartbeat.error == ErrorCode.NONE


@pytest.mark.parametrize("request_", [
    SyncGroupRequest(correlation_id=3, group_id="nobody", generation=1, member_id="m"),
    HeartbeatRequest(correlation_id=3, group_id="nobody", generation=1, member_id="m"),
    LeaveGroupRequest(correlation_id=3, group_id="nobody", member_id="m"),
])
def test_requests_for_a_group_that_does_not_exist_are_unknown_member(stage, request_):
    response = only(stage.ask("a", request_), ErrorResponse)

    assert (response.correlation_id, response.error) == (3, ErrorCode.UNKNOWN_MEMBER_ID)


def test_a_member_whose_session_expires_is_removed_on_a_tick(stage):
    stage.join("a", session_ms=200)
    stage.harness.advance(LIMITS.group_initial_rebalance_delay_ms + 50)
    stage.joined("a")

    stage.harness.advance(300)

    assert stage.coordinator.groups["g"].members == {}
    assert stage.coordinator.groups["g"].state == "Empty"


# ---------------------------------------------------------------------------- commits and fencing


def test_a_member_commit_is_flushed_before_it_is_acknowledged_and_can_be_fetched(stage):
    generation = stage.stable("a")

    effects = stage.commit("a", {("orders", 0): 42, ("orders", 1): 7}, generation=generation, metadata="m")

    assert messages(at_once(effects), OffsetCommitResponse) == []
    response = only(flushed(effects), OffsetCommitResponse)
    assert response.error == ErrorCode.NONE
    assert [(e.partition, e.offset, e.error) for e in response.offsets] == [(0, 42, 0), (1, 7, 0)]
    assert stage.committed() == {("orders", 0): 42, ("orders", 1): 7}
    assert stage.committed(partitions=[("orders", 1), ("orders", 9)]) == {("orders", 1): 7, ("orders", 9): -1}


def test_a_commit_from_an_older_generation_is_illegal(stage):
    stage.stable("a")
    stage.join("b")  # rebalance: generation 2 is coming

    response = only(stage.commit("a", {("orders", 0): 5}, generation=0), OffsetCommitResponse)

    assert response.error == ErrorCode.ILLEGAL_GENERATION
    assert [entry.error for entry in response.offsets] == [ErrorCode.ILLEGAL_GENERATION]
    assert stage.committed() == {}


def test_a_commit_from_an_unknown_member_is_refused(stage):
    stage.stable("a")

    response = only(stage.commit("zombie", {("orders", 0): 5}, generation=1, member_id="zombie-1"),
                    OffsetCommitResponse)

    assert response.error == ErrorCode.UNKNOWN_MEMBER_ID
    assert stage.committed() == {}


def test_a_member_commit_to_a_group_that_does_not_exist_is_refused(stage):
    request = OffsetCommitRequest(correlation_id=1, group_id="other", generation=3, member_id="a-1",
                                  offsets=[OffsetEntry(topic="orders", partition=0, offset=5)])
    response = only(stage.ask("a", request), OffsetCommitResponse)

    assert response.error == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_commit_from_a_replaced_static_instance_is_fenced(stage):
    generation = stage.stable("a", instances={"a": "host-a"})
    old_id = stage.ids["a"]
    stage.join("a", instance="host-a", member_id="", sender="a-restarted")  # the restarted process takes over
    assert stage.joined("a", sender="a-restarted").member_id != old_id

    response = only(stage.commit("a", {("orders", 0): 5}, generation=generation, member_id=old_id,
                                 instance="host-a"), OffsetCommitResponse)

    assert response.error == ErrorCode.FENCED_INSTANCE_ID


def test_a_commit_while_the_group_awaits_its_leaders_assignment_is_refused(stage):
    stage.join("a")
    stage.harness.advance(LIMITS.group_initial_rebalance_delay_ms + 50)
    stage.joined("a")

    response = only(stage.commit("a", {("orders", 0): 5}), OffsetCommitResponse)

    assert response.error == ErrorCode.REBALANCE_IN_PROGRESS


def test_an_admin_commit_is_refused_while_the_group_has_members(stage):
    stage.stable("a")

    response = admin_commit(stage, {("orders", 0): 0})

    assert response.error == ErrorCode.NON_EMPTY_GROUP
    assert stage.committed() == {}


def test_an_admin_commit_to_an_empty_or_new_group_is_accepted(stage):
    assert admin_commit(stage, {("orders", 0): 100}, group="fresh").error == ErrorCode.NONE

    assert stage.committed("fresh") == {("orders", 0): 100}
    assert "fresh" in stage.coordinator.groups


def test_invalid_entries_are_refused_one_by_one_and_the_rest_is_stored(stage):
    request = OffsetCommitRequest(correlation_id=1, group_id="g", generation=-1, offsets=[
        OffsetEntry(topic="orders", partition=0, offset=-5),
        OffsetEntry(topic="orders", partition=1, offset=3,
                    metadata="x" * (LIMITS.offset_metadata_length_max + 1)),
        OffsetEntry(topic="orders", partition=2, offset=9)])

    response = only(stage.ask("admin", request), OffsetCommitResponse)

    assert [entry.error for entry in response.offsets] == [
        ErrorCode.INVALID_REQUEST, ErrorCode.OFFSET_METADATA_TOO_LARGE, ErrorCode.NONE]
    assert stage.committed() == {("orders", 2): 9}


# ---------------------------------------------------------------------------- restarts


def heartbeat(stage: Stage, name: str, generation: int, member_id: str | None = None) -> HeartbeatResponse:
    request = HeartbeatRequest(correlation_id=stage.next_correlation(), group_id="g", generation=generation,
                               member_id=stage.ids[name] if member_id is None else member_id,
                               member_secret=stage.secrets[name])
    return only(stage.ask(name, request), HeartbeatResponse)


def test_a_stable_group_carries_on_through_a_restart_in_the_same_generation(stage):
    generation = stage.stable("a", "b")
    stage.commit("a", {("orders", 0): 42}, generation=generation)
    leader = stage.coordinator.groups["g"].leader

    stage.restart()

    group = stage.coordinator.groups["g"]
    assert (group.state, group.generation, group.leader) == ("Stable", generation, leader)
    assert [event for _, event in stage.harness.traced if event.event == "group-restored"]
    assert stage.committed() == {("orders", 0): 42}
    assert heartbeat(stage, "a", generation).error == ErrorCode.NONE
    assert heartbeat(stage, "b", generation).error == ErrorCode.NONE
    commit = only(stage.commit("a", {("orders", 0): 50}, generation=generation), OffsetCommitResponse)
    assert commit.error == ErrorCode.NONE and stage.committed() == {("orders", 0): 50}
    described = only(stage.ask("admin", DescribeGroupRequest(correlation_id=1, group_id="g")), DescribeGroupResponse)
    assert {member.client_id for member in described.members} == {"a", "b"}
    sync = only(stage.ask("b", SyncGroupRequest(correlation_id=2, group_id="g", generation=generation,
                                                 **stage.member("b"))), SyncGroupResponse)
    assert sync.error == ErrorCode.NONE and sync.assignment == b"b", "the assignment survived the restart"


def test_restored_members_get_a_fresh_session_and_those_that_never_return_time_out(stage):
    generation = stage.stable("a")
    stage.harness.advance(9_000)  # most of a's 10 s session is gone when the coordinator dies

    stage.restart()
    stage.harness.advance(9_000)
    assert "a" in [m.client_id for m in stage.coordinator.groups["g"].members.values()], "a full session after the restart"
    stage.harness.advance(2_000)

    group = stage.coordinator.groups["g"]
    assert (group.state, group.members) == ("Empty", {})
    assert heartbeat(stage, "a", generation).error == ErrorCode.UNKNOWN_MEMBER_ID
    stage.ids.clear()
    stage.join("a")
    stage.harness.advance(LIMITS.group_initial_rebalance_delay_ms + 50)
    assert stage.joined("a").generation > generation, "a generation was reused after the restart"


def test_a_group_caught_mid_rebalance_restarts_without_members_and_fences_the_old_ones(stage):
    generation = stage.stable("a", "b")
    old_a = stage.ids["a"]
    stage.ask("b", LeaveGroupRequest(correlation_id=1, group_id="g", **stage.member("b")))
    assert stage.coordinator.groups["g"].state == "PreparingRebalance"

    stage.restart()

    assert stage.coordinator.groups["g"].members == {}
    assert heartbeat(stage, "a", generation).error == ErrorCode.UNKNOWN_MEMBER_ID
    zombie = only(stage.commit("a", {("orders", 0): 1}, generation=generation, member_id=old_a), OffsetCommitResponse)
    assert zombie.error == ErrorCode.UNKNOWN_MEMBER_ID
    stage.ids.clear()
    stage.join("a")
    stage.harness.advance(LIMITS.group_initial_rebalance_delay_ms + 50)
    assert stage.joined("a").generation == generation + 1, "a generation was reused after the restart"


def test_a_group_emptied_before_a_restart_remembers_the_generation_it_ended(stage):
    stage.stable("a")
    stage.ask("a", LeaveGroupRequest(correlation_id=1, group_id="g", **stage.member("a")))
    ended = stage.coordinator.groups["g"].generation

    stage.restart()

    assert stage.coordinator.groups["g"].generation == ended


# ---------------------------------------------------------------------------- member secrets


def test_a_member_id_read_from_describe_group_does_not_let_another_client_act_as_that_member(stage):
    """DescribeGroup shows every member id and the generation. Before member secrets, a client
    that read them left the group as another member, committed offsets in its name (the group
    skipped records it never handled), heartbeat for a dead member, and rejoined as it."""
    generation = stage.stable("a", "b")
    described = only(stage.ask("mallory", DescribeGroupRequest(correlation_id=90, group_id="g")),
                     DescribeGroupResponse)
    victim = next(member.member_id for member in described.members if member.client_id == "a")
    leader = described.leader
    stage.commit("a", {("orders", 0): 3})
    group = stage.coordinator.groups["g"]

    refused = [
        only(stage.ask("mallory", HeartbeatRequest(correlation_id=91, group_id="g", generation=generation,
                                                   member_id=victim)), HeartbeatResponse),
        only(stage.ask("mallory", OffsetCommitRequest(
            correlation_id=92, group_id="g", generation=generation, member_id=victim,
            offsets=[OffsetEntry(topic="orders", partition=0, offset=900)])), OffsetCommitResponse),
        only(stage.ask("mallory", SyncGroupRequest(correlation_id=93, group_id="g", generation=generation,
                                                   member_id=leader, assignments=[])), SyncGroupResponse),
        only(stage.ask("mallory", LeaveGroupRequest(correlation_id=94, group_id="g", member_id=victim)),
             LeaveGroupResponse),
        only(stage.ask("mallory", JoinGroupRequest(
            correlation_id=95, group_id="g", member_id=victim, client_id="a", session_timeout_ms=10_000,
            rebalance_timeout_ms=5_000, protocols=[GroupProtocol(name="range", metadata=b"x")])),
            JoinGroupResponse),
    ]

    assert [answer.error for answer in refused] == [ErrorCode.UNKNOWN_MEMBER_ID] * 5
    assert all("secret" in answer.error_message for answer in refused)
    assert stage.committed() == {("orders", 0): 3}
    assert (group.state, group.generation) == ("Stable", generation)
    assert sorted(group.members) == sorted(stage.ids.values())
    # The member itself, with the secret its join answer gave it, carries on.
    mine = only(stage.ask("a", HeartbeatRequest(correlation_id=96, group_id="g", generation=generation,
                                                member_id=victim, member_secret=stage.secrets["a"])),
                HeartbeatResponse)
    assert mine.error == ErrorCode.NONE
    assert stage.secrets["a"] != stage.secrets["b"] and len(stage.secrets["a"]) == 16


def test_a_member_secret_holds_through_a_coordinator_restart_and_is_never_stored(stage):
    generation = stage.stable("a")
    secret = stage.secrets["a"]
    stage.restart()

    answer = only(stage.ask("a", HeartbeatRequest(correlation_id=97, group_id="g", generation=generation,
                                                  member_id=stage.ids["a"], member_secret=secret)),
                  HeartbeatResponse)

    assert answer.error == ErrorCode.NONE
    assert secret not in bytes(stage.fs.durable_content(STATE_PATH))


# ---------------------------------------------------------------------------- admin


def test_list_and_describe_groups(stage):
    stage.stable("a", "b")
    stage.commit("a", {("orders", 0): 3})
    admin_commit(stage, {("orders", 0): 1}, group="idle")

    listed = only(stage.ask("admin", ListGroupsRequest(correlation_id=1)), ListGroupsResponse)
    described = only(stage.ask("admin", DescribeGroupRequest(correlation_id=2, group_id="g")),
                     DescribeGroupResponse)
    missing = only(stage.ask("admin", DescribeGroupRequest(correlation_id=3, group_id="nope")),
                   DescribeGroupResponse)

    assert [(g.group_id, g.state, g.members) for g in listed.groups] == [
        ("g", "Stable", 2), ("idle", "Empty", 0)]
    assert (described.state, described.generation, described.protocol_name) == ("Stable", 1, "range")
    assert sorted(m.member_id for m in described.members) == sorted(stage.ids.values())
    assert [(o.partition, o.offset) for o in described.offsets] == [(0, 3)]
    assert missing.error == ErrorCode.GROUP_ID_NOT_FOUND


def test_deleting_a_group_needs_it_empty_and_removes_its_offsets_durably(stage):
    stage.stable("a")
    stage.commit("a", {("orders", 0): 3})

    busy = only(stage.ask("admin", DeleteGroupRequest(correlation_id=1, group_id="g")), DeleteGroupResponse)
    stage.ask("a", LeaveGroupRequest(correlation_id=2, group_id="g", **stage.member("a")))
    effects = stage.ask("admin", DeleteGroupRequest(correlation_id=3, group_id="g"))
    stage.restart()

    assert busy.error == ErrorCode.NON_EMPTY_GROUP
    assert only(flushed(effects), DeleteGroupResponse).error == ErrorCode.NONE
    assert "g" not in stage.coordinator.groups
    assert stage.committed() == {}
    unknown = only(stage.ask("admin", DeleteGroupRequest(correlation_id=4, group_id="g")),
                   DeleteGroupResponse)
    assert unknown.error == ErrorCode.GROUP_ID_NOT_FOUND


# ---------------------------------------------------------------------------- deleting offsets


def test_offsets_of_one_topic_can_be_deleted_while_the_group_has_no_members(stage):
    from actors.messages import OffsetDeleteRequest, OffsetDeleteResponse

    admin_commit(stage, {("orders", 0): 5, ("orders", 1): 7, ("payments", 0): 3})
    request = OffsetDeleteRequest(correlation_id=9, group_id="g", partitions=[("orders", 0), ("orders", 1), ("orders", 2)])

    answer = only(flushed(stage.ask("admin", request)), OffsetDeleteResponse)

    assert answer.error == ErrorCode.NONE and sorted(map(tuple, answer.deleted)) == [("orders", 0), ("orders", 1)]
    assert stage.committed() == {("payments", 0): 3}
    stage.restart()
    assert stage.committed() == {("payments", 0): 3}, "the deletion is durable"


def test_offsets_of_a_group_with_members_are_not_deleted(stage):
    from actors.messages import OffsetDeleteRequest, OffsetDeleteResponse

    stage.join("m1")
    request = OffsetDeleteRequest(correlation_id=9, group_id="g", partitions=[("orders", 0)])

    assert only(stage.ask("admin", request), OffsetDeleteResponse).error == ErrorCode.NON_EMPTY_GROUP


def test_with_no_member_anywhere_the_group_coordinator_sets_no_tick_and_a_join_starts_it_again():
    stage = Stage()
    stage.harness.advance(500)  # the tick set at start fires once and finds nothing to do
    assert stage.harness.timers[GROUPS].deadline("tick") is None

    stage.join("a", session_ms=1_000)
    assert stage.harness.timers[GROUPS].deadline("tick") is not None

    stage.harness.advance(3_000)  # the member never heartbeats: its session ends on a tick
    assert stage.coordinator.groups["g"].members == {}
    stage.harness.advance(500)
    assert stage.harness.timers[GROUPS].deadline("tick") is None


def test_a_silent_member_is_removed_when_its_session_ends_to_the_millisecond():
    stage = Stage()
    stage.stable("a", "b")
    group = stage.coordinator.groups["g"]
    silent = group.members[stage.ids["b"]]
    expires_ns = silent.last_heartbeat_ns + silent.session_timeout_ms * MS
    for _ in range(30):  # "a" heartbeats every 300 ms; "b" never does
        stage.harness.advance(300)
        stage.ask("a", HeartbeatRequest(correlation_id=stage.next_correlation(), group_id="g",
                                        generation=group.generation, **stage.member("a")))
        if stage.harness.now_ns >= expires_ns - 300 * MS:
            break
    stage.harness.advance_to(expires_ns)
    assert stage.ids["b"] in group.members
    stage.harness.advance_to(expires_ns + 1)
    assert stage.ids["b"] not in group.members, "kept a member past its session"


def test_a_stable_group_costs_wakes_only_at_its_session_deadlines():
    """Members heartbeating well within their sessions: the coordinator's timer keeps moving
    to the next session's end, so it wakes a few times a session, not 20 times a second."""
    stage = Stage()
    stage.stable("a", "b")
    group = stage.coordinator.groups["g"]
    def ticks() -> int:  # (not its announcements to the controller, on their own timer)
        return sum(1 for step in stage.harness.steps_of(GROUPS, TimerFired) if step.message.name == "tick")

    before = ticks()
    for _ in range(20):  # 6 s, a heartbeat from each every 300 ms
        stage.harness.advance(300)
        for name in ("a", "b"):
            stage.ask(name, HeartbeatRequest(correlation_id=stage.next_correlation(), group_id="g",
                                             generation=group.generation, **stage.member(name)))
    wakes = ticks() - before
    assert wakes <= 2, f"{wakes} wakes in 6 s of a stable group with 10 s sessions"
    assert len(group.members) == 2


def test_a_session_deadline_the_coordinator_timer_would_miss_breaks_its_invariants():
    stage = Stage()
    stage.stable("a")
    member = stage.coordinator.groups["g"].members[stage.ids["a"]]
    stage.coordinator.timer.armed_ns = member.last_heartbeat_ns + member.session_timeout_ms * MS + 2
    with pytest.raises(AssertionError, match="timer would fire after"):
        stage.coordinator.invariants()


def test_a_committed_offset_keeps_the_id_of_its_topic_through_a_restart_and_old_records_read_as_unknown(stage):
    generation = stage.stable("a")
    request = OffsetCommitRequest(correlation_id=stage.next_correlation(), group_id="g", generation=generation,
                                  **stage.member("a"), offsets=[
                                      OffsetEntry(topic="orders", partition=0, offset=42, topic_id=4711)])
    assert only(flushed(stage.ask("a", request)), OffsetCommitResponse).error == ErrorCode.NONE
    stage.coordinator.state.put("offset/old/orders/0", [7, "", 1_000, 3])  # written before topic ids were kept
    stage.coordinator.state.flush()

    stage.restart()
    fetched = only(stage.ask("admin", OffsetFetchRequest(correlation_id=stage.next_correlation(), group_id="g")),
                   OffsetFetchResponse)
    old = only(stage.ask("admin", OffsetFetchRequest(correlation_id=stage.next_correlation(), group_id="old")),
               OffsetFetchResponse)

    assert [(entry.offset, entry.topic_id) for entry in fetched.offsets] == [(42, 4711)]
    assert [(entry.offset, entry.leader_epoch, entry.topic_id) for entry in old.offsets] == [(7, 3, 0)]


def test_a_negative_topic_id_is_refused(stage):
    generation = stage.stable("a")
    request = OffsetCommitRequest(correlation_id=stage.next_correlation(), group_id="g", generation=generation,
                                  **stage.member("a"), offsets=[
                                      OffsetEntry(topic="orders", partition=0, offset=42, topic_id=-5)])

    [entry] = only(stage.ask("a", request), OffsetCommitResponse).offsets

    assert entry.error == ErrorCode.INVALID_REQUEST
