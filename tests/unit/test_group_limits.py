"""The group coordinator's state is bounded: groups, partitions with commits per group, bytes.

A client that sends thousands of admin commits for invented group ids and topics (the attack an
adversarial test made: 3,000 commits grew the coordinator from 25 to 287 MB and its journal to
122 MB) fills bounded stores and gets LIMIT_REACHED, while every group within the bounds works."""

from __future__ import annotations

import random

import pytest

from actors.errors import ErrorCode
from actors.group_coordinator import GroupCoordinator
from actors.limits import Limits
from actors.messages import JoinGroupRequest, JoinGroupResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetEntry
from storage.memory import MemoryFileSystem
from storage.state import DurableState
from tests.unit.actor_harness import Harness, only

GROUPS = "tcp://127.0.0.1:5/groups"


def coordinator(**limits) -> tuple[Harness, GroupCoordinator, MemoryFileSystem]:
    fs = MemoryFileSystem()
    harness = Harness()
    actor = GroupCoordinator(state=DurableState.open("/g/groups.state", fs=fs), coordinator="coordinator",
                             endpoint=GROUPS, incarnation=1, limits=Limits(group_initial_rebalance_delay_ms=0, **limits),
                             rng=random.Random(1))
    harness.add(GROUPS, actor)
    return harness, actor, fs


def commit(harness: Harness, group: str, entries: list[OffsetEntry]) -> OffsetCommitResponse:
    request = OffsetCommitRequest(correlation_id=1, group_id=group, generation=-1, offsets=entries)
    return only(harness.deliver(GROUPS, request, "admin"), OffsetCommitResponse)


def test_commits_for_invented_group_ids_stop_at_groups_max():
    harness, actor, _ = coordinator(groups_max=50)

    answers = [commit(harness, f"group-{index}", [OffsetEntry(topic="t", partition=0, offset=1)]) for index in range(80)]

    assert [a.error for a in answers[:50]] == [ErrorCode.NONE] * 50
    assert all(a.error == ErrorCode.LIMIT_REACHED and "groups_max" in a.error_message for a in answers[50:])
    assert len(actor.groups) == 50


def test_a_join_that_would_create_a_group_past_groups_max_is_refused():
    harness, _, _ = coordinator(groups_max=1)
    commit(harness, "first", [OffsetEntry(topic="t", partition=0, offset=1)])

    answer = only(harness.deliver(GROUPS, JoinGroupRequest(correlation_id=2, group_id="second"), "member"),
                  JoinGroupResponse)

    assert answer.error == ErrorCode.LIMIT_REACHED


def test_one_group_commits_for_at_most_group_offsets_max_partitions():
    harness, actor, _ = coordinator(group_offsets_max=100)

    answer = commit(harness, "g", [OffsetEntry(topic=f"topic-{index}", partition=0, offset=1) for index in range(100)])
    more = commit(harness, "g", [OffsetEntry(topic="one-more", partition=0, offset=1),
                                 OffsetEntry(topic="topic-7", partition=0, offset=9)])

    assert answer.error == ErrorCode.NONE
    assert [entry.error for entry in more.offsets] == [ErrorCode.LIMIT_REACHED, ErrorCode.NONE], "updates still work"
    assert len(actor.offsets.get("g")) == 100


def test_the_bytes_of_committed_state_are_bounded_in_total():
    harness, actor, _ = coordinator(group_offsets_bytes_max=200_000)

    for index in range(200):
        commit(harness, f"g{index % 40}", [OffsetEntry(topic=f"t{index}", partition=0, offset=1, metadata="m" * 4000)])

    assert actor.offsets.total_bytes <= 200_000


def test_the_byte_count_is_the_same_after_a_restart():
    harness, actor, fs = coordinator()
    commit(harness, "g", [OffsetEntry(topic="orders", partition=p, offset=p, metadata="x" * p) for p in range(20)])
    before = actor.offsets.total_bytes
    fs.crash()

    again = GroupCoordinator(state=DurableState.open("/g/groups.state", fs=fs), coordinator="coordinator",
                             endpoint=GROUPS, incarnation=2, rng=random.Random(2))

    assert again.offsets.total_bytes == before > 0


@pytest.mark.parametrize("entry, code", [
    (OffsetEntry(topic="not a topic!", partition=0, offset=1), ErrorCode.INVALID_REQUEST),
    (OffsetEntry(topic="t" * 300, partition=0, offset=1), ErrorCode.INVALID_REQUEST),
    (OffsetEntry(topic="t", partition=-1, offset=1), ErrorCode.INVALID_REQUEST),
    (OffsetEntry(topic="t", partition=10**9, offset=1), ErrorCode.INVALID_REQUEST),
    (OffsetEntry(topic="t", partition=0, offset=1, metadata="m" * 5000), ErrorCode.OFFSET_METADATA_TOO_LARGE),
], ids=["bad-name", "long-name", "negative-partition", "huge-partition", "long-metadata"])
def test_an_entry_railmq_could_not_have_made_is_refused(entry, code):
    harness, actor, _ = coordinator()

    answer = commit(harness, "g", [entry])

    assert answer.offsets[0].error == code
    assert actor.offsets.total_bytes == 0
