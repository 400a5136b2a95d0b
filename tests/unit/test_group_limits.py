"""The group coordinator's state is bounded: groups, partitions with commits per group, bytes.

A client that sends thousands of admin commits for invented group ids and topics (the attack an
adversarial test made: 3,000 commits grew the coordinator from 25 to 287 MB and its journal to
122 MB) fills bounded stores and gets LIMIT_REACHED, while every group within the bounds works."""

from __future__ import annotations

import random
from bisect import bisect_right
from itertools import accumulate

import msgspec
import pytest

from actors.errors import ErrorCode
from actors.group_coordinator import GroupCoordinator
from actors.group_offsets import entry_bytes
from actors.limits import DEFAULT_LIMITS, Limits
from actors.messages import (
    DescribeGroupRequest, DescribeGroupResponse, ErrorResponse, GroupProtocol, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, MemberAssignment, OffsetCommitRequest, OffsetCommitResponse, OffsetEntry, OffsetFetchRequest,
    OffsetFetchResponse, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, ShareGroupSettings,
    SyncGroupRequest, SyncGroupResponse,
)
from storage.memory import MemoryFileSystem
from storage.state import DurableState
from tests.helpers import bytes_held_from
from tests.unit.actor_harness import Harness, messages, only
from transport.codec import Codec

LONGEST_TOPIC = DEFAULT_LIMITS.topic_name_length_max  # the largest entries a topic name allows

GROUPS = "tcp://127.0.0.1:5/groups"


def coordinator(**limits) -> tuple[Harness, GroupCoordinator, MemoryFileSystem]:
    fs = MemoryFileSystem()
    harness = Harness()
    actor = GroupCoordinator(state=DurableState.open("/g/groups.state", fs=fs), coordinator="coordinator",
                             endpoint=GROUPS, incarnation=1,
                             limits=Limits(**{"group_initial_rebalance_delay_ms": 0, **limits}),
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
    (OffsetEntry(topic="t", partition=0, offset=2**63), ErrorCode.INVALID_REQUEST),
    (OffsetEntry(topic="t", partition=0, offset=1, leader_epoch=2**31), ErrorCode.INVALID_REQUEST),
    (OffsetEntry(topic="t", partition=0, offset=1, topic_id=2**63), ErrorCode.INVALID_REQUEST),
], ids=["bad-name", "long-name", "negative-partition", "huge-partition", "long-metadata", "offset-past-int64",
        "epoch-past-int32", "topic-id-past-int64"])
def test_an_entry_railmq_could_not_have_made_is_refused(entry, code):
    harness, actor, _ = coordinator()

    answer = commit(harness, "g", [entry])

    assert answer.offsets[0].error == code
    assert actor.offsets.total_bytes == 0


# ---------------------------------------------------------------------------- membership bytes


def join(harness: Harness, group: str, client: str, metadata: bytes, member_id: str = "") -> list:
    request = JoinGroupRequest(correlation_id=7, group_id=group, member_id=member_id, client_id=client,
                               protocols=[GroupProtocol(name="range", metadata=metadata)])
    return messages(harness.deliver(GROUPS, request, client), JoinGroupResponse)


def membership_bytes(actor: GroupCoordinator) -> int:
    """What the members of every group hold, counted from the members themselves."""
    return sum(len(member.member_id) + len(member.instance_id or "") + len(member.client_id) + len(member.assignment)
               + sum(len(protocol.name) + len(protocol.metadata) for protocol in member.protocols)
               for group in actor.groups.values() for member in group.members.values())


def test_joins_carrying_hundreds_of_kilobytes_each_stop_at_the_coordinators_membership_budget():
    """The attack: members of invented groups, each with ~200 KB of subscription metadata. Without a
    byte bound, 1,000 groups of 1,000 members could ask the coordinator to hold terabytes."""
    harness, actor, _ = coordinator()
    budget = actor.limits.groups_membership_bytes_max if hasattr(actor.limits, "groups_membership_bytes_max") \
        else 64 * 2**20

    answers = sum((join(harness, f"group-{index}", f"client-{index}", bytes(200_000)) for index in range(400)), [])

    refused = [answer for answer in answers if answer.error == ErrorCode.LIMIT_REACHED]
    assert membership_bytes(actor) <= budget, f"members hold {membership_bytes(actor):,} bytes"
    assert len(refused) >= 400 - budget // 200_000
    assert all("groups_membership_bytes_max" in answer.error_message for answer in refused)


def test_a_member_larger_than_group_member_bytes_max_is_refused_and_creates_no_group():
    harness, actor, _ = coordinator(group_member_bytes_max=100_000)

    [answer] = join(harness, "g", "big", bytes(100_001))

    assert answer.error == ErrorCode.LIMIT_REACHED and "group_member_bytes_max" in answer.error_message
    assert "g" not in actor.groups


def test_one_groups_members_stop_at_the_groups_byte_budget_and_other_groups_still_join():
    harness, actor, _ = coordinator(group_membership_bytes_max=1_000_000)

    answers = [join(harness, "g", f"client-{index}", bytes(150_000)) for index in range(10)]
    other = join(harness, "other", "client-other", bytes(150_000))

    refused = [answer for answer in sum(answers, []) if answer.error == ErrorCode.LIMIT_REACHED]
    assert len(actor.groups["g"].members) == 6 and len(refused) == 4
    assert all("group_membership_bytes_max" in answer.error_message for answer in refused)
    assert [answer.error for answer in other if answer.error == ErrorCode.LIMIT_REACHED] == []
    assert "other" in actor.groups and actor.groups["other"].members


def stable_group(harness: Harness, actor: GroupCoordinator, names: list[str]) -> tuple[str, dict[str, str]]:
    """Members `names` of group g, joined and past the first rebalance's delay (the coordinator's
    limits give it 100 ms); returns the leader's name and every member id (the leader has not synced)."""
    for name in names:
        join(harness, "g", name, name.encode())
    harness.advance(150)
    ids = {name: harness.received(name, JoinGroupResponse)[-1].member_id for name in names}
    leader = next(name for name in names if ids[name] == actor.groups["g"].leader)
    return leader, ids


def sync(harness: Harness, actor: GroupCoordinator, leader: str, ids: dict[str, str], sizes: dict[str, int]) -> list:
    request = SyncGroupRequest(correlation_id=9, group_id="g", generation=actor.groups["g"].generation,
                               member_id=ids[leader], member_secret=actor.secrets.of("g", ids[leader]),
                               assignments=[
                                   MemberAssignment(member_id=ids[name], assignment=bytes(size))
                                   for name, size in sizes.items()])
    return messages(harness.deliver(GROUPS, request, leader), SyncGroupResponse)


def test_a_leaders_assignments_past_a_members_byte_bound_are_refused_and_the_group_keeps_none():
    harness, actor, _ = coordinator(group_member_bytes_max=200_000, group_initial_rebalance_delay_ms=100)
    leader, ids = stable_group(harness, actor, ["a", "b"])

    [refused] = sync(harness, actor, leader, ids, {"a": 10, "b": 250_000})
    answers = sync(harness, actor, leader, ids, {"a": 10, "b": 20})

    assert refused.error == ErrorCode.LIMIT_REACHED and "group_member_bytes_max" in refused.error_message
    assert {len(member.assignment) for member in actor.groups["g"].members.values()} == {10, 20}
    assert [answer.error for answer in answers] == [ErrorCode.NONE]
    assert actor.membership.total_bytes == membership_bytes(actor)


def test_a_leaders_assignments_past_the_groups_byte_bound_are_refused():
    harness, actor, _ = coordinator(group_membership_bytes_max=300_000, group_initial_rebalance_delay_ms=100)
    leader, ids = stable_group(harness, actor, ["a", "b"])

    [refused] = sync(harness, actor, leader, ids, {"a": 160_000, "b": 160_000})

    assert refused.error == ErrorCode.LIMIT_REACHED and "group_membership_bytes_max" in refused.error_message
    assert membership_bytes(actor) < 300_000


def test_the_membership_count_follows_members_that_leave_or_expire_and_survives_a_restart():
    harness, actor, fs = coordinator(group_initial_rebalance_delay_ms=100)
    leader, ids = stable_group(harness, actor, ["a", "b", "c"])
    sync(harness, actor, leader, ids, {"a": 1000, "b": 2000, "c": 3000})
    counted, held = actor.membership.total_bytes, membership_bytes(actor)

    restarted = GroupCoordinator(state=DurableState.open("/g/groups.state", fs=fs), coordinator="coordinator",
                                 endpoint=GROUPS, incarnation=2, limits=actor.limits, rng=random.Random(2))
    harness.deliver(GROUPS, LeaveGroupRequest(correlation_id=10, group_id="g", member_id=ids["c"],
                                              member_secret=actor.secrets.of("g", ids["c"])), "c")
    harness.advance(60_000)  # every session expires

    assert counted == held > 6000
    assert restarted.membership.total_bytes == counted
    assert actor.membership.total_bytes == membership_bytes(actor) == 0


# ---------------------------------------------------------------------------- share members


def share_heartbeat(harness: Harness, group: str, client: str, topics: list[str]) -> list:
    # Topics of the longest names have no `<topic>.dlq`: their group names its dead-letter topic.
    request = ShareGroupHeartbeatRequest(correlation_id=11, group_id=group, client_id=client, topics=topics,
                                         session_timeout_ms=30_000,
                                         settings=ShareGroupSettings(dead_letter_topic="dead-letters"))
    return messages(harness.deliver(GROUPS, request, client), ShareGroupHeartbeatResponse)


def share_subscription_bytes(actor: GroupCoordinator) -> int:
    return sum(len(member.member_id) + len(member.client_id) + sum(map(len, member.topics))
               for group in actor.share.groups.values() for member in group.members.values())


def test_share_members_subscribing_to_thousands_of_long_invented_topics_stop_at_the_membership_budget():
    """~250 KB of topic names per member (as much as one member may hold): without a byte bound,
    1,000 share groups of 200 members could ask the coordinator to hold tens of gigabytes."""
    harness, actor, _ = coordinator(groups_membership_bytes_max=1_000_000)
    topics = [f"{index:05d}-".ljust(LONGEST_TOPIC, "t") for index in range(1000)]

    answers = sum((share_heartbeat(harness, f"queue-{index % 5}", f"client-{index}", topics) for index in range(12)), [])

    refused = [answer for answer in answers if answer.error == ErrorCode.LIMIT_REACHED]
    assert share_subscription_bytes(actor) <= 1_000_000
    assert len(refused) >= 12 - 5 and all("groups_membership_bytes_max" in answer.error_message for answer in refused)
    assert len(actor.share.waiting_heartbeats) <= 5, "a heartbeat waiting for metadata per member at most"


def test_a_share_member_naming_a_topic_that_cannot_exist_is_refused():
    harness, actor, _ = coordinator()

    [answer] = share_heartbeat(harness, "queue", "client", ["orders", "a/b" + "x" * 300])

    assert answer.error == ErrorCode.INVALID_REQUEST and "topic" in answer.error_message
    assert not any(group.members for group in actor.share.groups.values())


def test_a_share_member_heartbeating_while_its_metadata_is_awaited_waits_once():
    harness, actor, _ = coordinator()
    [first] = share_heartbeat(harness, "queue", "client", ["orders"]) or [None]
    member_id = next(iter(actor.share.groups["queue"].members))

    for _ in range(50):
        harness.deliver(GROUPS, ShareGroupHeartbeatRequest(
            correlation_id=12, group_id="queue", member_id=member_id, client_id="client", topics=["orders"],
            session_timeout_ms=30_000), "client")

    assert first is None, "the topic's metadata is unknown: the heartbeat waits for it"
    assert len(actor.share.waiting_heartbeats) == 1


def test_the_largest_group_the_budget_admits_fits_one_entry_of_the_group_quorums_log():
    """A stable group is stored as one record, proposed as one Raft entry: a record past
    `entry_bytes_max` is refused there, the group coordinator rebuilds, and the group never gets
    stable. So the budget must refuse such a group at its join or sync instead."""
    from actors.classic_group import STABLE, ClassicGroup, Member
    from actors.group_membership_budget import member_bytes
    from actors.raft import RaftConfig

    limits = Limits()
    count = limits.group_members_max
    group = ClassicGroup("g" * 255, generation=2**31)
    for index in range(count):
        member = Member(f"client-{index:04d}-{index:012x}", f"instance-{index}", f"client-{index:04d}", 300_000,
                        300_000, [], 0)
        room = limits.group_membership_bytes_max // count - member_bytes(member)
        member.protocols = [GroupProtocol(name="cooperative-sticky", metadata=bytes(room // 2))]
        member.assignment = bytes(room - room // 2 - len("cooperative-sticky"))
        group.members[member.member_id] = member
    group.state, group.leader, group.protocol_name = STABLE, next(iter(group.members)), "cooperative-sticky"

    held = sum(member_bytes(member) for member in group.members.values())
    record = msgspec.msgpack.encode([[0, f"group/{group.group_id}", group.record()]])

    assert limits.group_membership_bytes_max - count <= held <= limits.group_membership_bytes_max
    assert len(record) <= RaftConfig(node_id=1, voters={1: "a"}).entry_bytes_max, f"{len(record):,} bytes"


def test_one_commit_is_bounded_in_bytes_so_it_fits_one_entry_of_the_group_quorums_log():
    """300 offsets with 4,000 bytes of metadata each were one 1.2 MB entry: the group quorum
    refused it, answered NOT_COORDINATOR and stopped deciding while it rebuilt. Such a commit is
    refused as a whole (commit in smaller requests), and the largest one admitted fits."""
    from actors.raft import RaftConfig

    harness, actor, _ = coordinator()
    too_large = commit(harness, "g", [OffsetEntry(topic="t", partition=partition, offset=1, metadata="m" * 4000)
                                      for partition in range(300)])
    entries = [OffsetEntry(topic=f"{partition:05d}".ljust(LONGEST_TOPIC, "t"), partition=999, offset=2**62, metadata="m" * 4000,
                           leader_epoch=2**31 - 1, topic_id=2**62, commit_timestamp_ms=2**62) for partition in range(1000)]
    sizes = list(accumulate(entry_bytes("g" * 255, entry) for entry in entries))
    largest = entries[:bisect_right(sizes, actor.limits.group_commit_bytes_max)]
    admitted = commit(harness, "g" * 255, largest)
    operations = [[0, f"offset/{'g' * 255}/{entry.topic}/{entry.partition}",
                   [entry.offset, entry.metadata, entry.commit_timestamp_ms, entry.leader_epoch, entry.topic_id]]
                  for entry in largest]

    assert too_large.error == ErrorCode.LIMIT_REACHED and "group_commit_bytes_max" in too_large.error_message
    assert "g" not in actor.offsets
    assert admitted.error == ErrorCode.NONE and all(entry.error == ErrorCode.NONE for entry in admitted.offsets)
    assert len(msgspec.msgpack.encode(operations)) <= RaftConfig(node_id=1, voters={1: "a"}).entry_bytes_max


def test_a_join_names_at_most_group_protocols_max_assignors():
    """Three members naming 6,000 assignors each made one rebalance 2.8 s of the group
    coordinator's CPU (choosing the protocol compares every name with every member's), and 20,000
    fit a member's bytes. A consumer names a handful of assignors. (Past SHORT_LIST_MAX, 1,024,
    the decoder refuses the frame before the coordinator sees it: tests/unit/test_codec_amplification.py.)"""
    harness, actor, _ = coordinator()

    answers = join_with(harness, "g", "many", [GroupProtocol(name=f"p{index:05d}") for index in range(1000)])
    few = join_with(harness, "other", "few", [GroupProtocol(name=name) for name in ("cooperative-sticky", "range")])

    assert [answer.error for answer in answers] == [ErrorCode.INVALID_REQUEST]
    assert "group_protocols_max" in answers[0].error_message and "g" not in actor.groups
    assert [answer.error for answer in few if answer.error] == []


def join_with(harness: Harness, group: str, client: str, protocols: list[GroupProtocol]) -> list:
    request = JoinGroupRequest(correlation_id=8, group_id=group, client_id=client, protocols=protocols)
    return messages(harness.deliver(GROUPS, request, client), JoinGroupResponse)


def fill_group(harness: Harness, group: str, count: int) -> list[OffsetCommitResponse]:
    """`count` partitions of the largest entries a commit admits, committed in requests that fit."""
    entries = [OffsetEntry(topic=f"{index:06d}".ljust(LONGEST_TOPIC, "t"), partition=index % 1000, offset=1, metadata="m" * 4096)
               for index in range(count)]
    return [commit(harness, group, entries[start:start + 150]) for start in range(0, count, 150)]


@pytest.mark.timeout(120)
def test_every_answer_about_one_group_fits_a_frame_a_client_accepts():
    """One group may have commits for 10,000 partitions with 4 KiB of metadata each: ~43 MB. An
    OffsetFetch for all of them (what `railmq groups describe` and lag views ask) was an answer
    past the 32 MiB every client refuses to decode, so nobody could read that group's offsets.
    One group's offsets are bounded in bytes so that the answer fits; an OffsetFetch naming more
    partitions than a group may hold is refused instead of answered entry by entry."""
    from transport.codec import Codec

    harness, actor, _ = coordinator()
    answers = fill_group(harness, "g", 10_000)
    fetched = only(harness.deliver(GROUPS, OffsetFetchRequest(correlation_id=2, group_id="g"), "admin"),
                   OffsetFetchResponse)
    described = only(harness.deliver(GROUPS, DescribeGroupRequest(correlation_id=3, group_id="g"), "admin"),
                     DescribeGroupResponse)
    named = only(harness.deliver(GROUPS, OffsetFetchRequest(correlation_id=4, group_id="g", partitions=[
        ("t" * LONGEST_TOPIC, partition) for partition in range(actor.limits.group_offsets_max + 1)]), "admin"), ErrorResponse)

    codec = Codec()
    for answer in (fetched, described):
        frames = codec.encode(answer)
        size = sum(map(len, frames))
        assert size < codec.frame_bytes_max, f"{type(answer).__name__} of {size:,} bytes"
        codec.decode([bytes(frame) for frame in frames])
    refused = [entry for answer in answers for entry in answer.offsets if entry.error != ErrorCode.NONE]
    assert refused and all(entry.error == ErrorCode.LIMIT_REACHED for entry in refused)
    assert "offset_bytes_per_group_max" in next(answer.error_message for answer in answers if answer.error_message)
    assert named.error == ErrorCode.INVALID_REQUEST and "group_offsets_max" in named.error_message


def test_share_members_are_bounded_per_member_and_per_group_so_a_description_fits_a_frame():
    """Share members counted only against the coordinator's total (64 MiB): 200 members of one
    group with 100 KB client ids were admitted, and a DescribeGroup of that group (each member's id
    and client id) was 40 MB, past the 32 MiB a client decodes. As for classic members, one share
    member holds at most group_member_bytes_max and one group group_membership_bytes_max."""
    from transport.codec import Codec

    harness, actor, _ = coordinator()
    [huge] = share_heartbeat(harness, "queue", "c" * 300_000, [])
    answers = sum((share_heartbeat(harness, "queue", f"{index:03d}" + "c" * 100_000, [])
                   for index in range(200)), [])
    described = only(harness.deliver(GROUPS, DescribeGroupRequest(correlation_id=3, group_id="queue"), "admin"),
                     DescribeGroupResponse)

    assert huge.error == ErrorCode.LIMIT_REACHED and "group_member_bytes_max" in huge.error_message
    admitted = [answer for answer in answers if answer.error == ErrorCode.NONE]
    refused = [answer for answer in answers if answer.error != ErrorCode.NONE]
    assert admitted and refused and all(answer.error == ErrorCode.LIMIT_REACHED and
                                        "group_membership_bytes_max" in answer.error_message for answer in refused)
    assert share_subscription_bytes(actor) <= actor.limits.group_membership_bytes_max
    assert sum(map(len, Codec().encode(described))) < Codec().frame_bytes_max


def test_an_offset_fetch_naming_one_partition_many_times_is_answered_once():
    """An OffsetFetch was answered entry by entry, repeats included: naming one partition with
    4 KiB of committed metadata 10,000 times (40 KB with a short topic name) made a 41 MB answer,
    past the 32 MiB every client decodes, from the one process every group shares. Each
    partition named is answered once."""
    from transport.codec import Codec

    harness, _, _ = coordinator()
    commit(harness, "g", [OffsetEntry(topic="t", partition=0, offset=5, metadata="m" * 4096)])
    request = OffsetFetchRequest(correlation_id=2, group_id="g", partitions=[("t", 0), ("t", 1)] * 5_000)

    answer = only(harness.deliver(GROUPS, request, "admin"), OffsetFetchResponse)

    answered = [(entry.topic, entry.partition, entry.offset) for entry in answer.offsets]
    assert answered == [("t", 0, 5), ("t", 1, -1)]
    assert sum(map(len, Codec().encode(answer))) < 10_000


@pytest.mark.timeout(120)
def test_offsets_with_non_ascii_metadata_are_counted_in_bytes_so_a_groups_answer_fits_a_frame():
    """The bounds on committed offsets counted characters: metadata of 4,096 characters from
    above U+FFFF (4 bytes each in UTF-8, as msgpack carries them and the state stores them) was
    counted as 4 KiB, so `offset_bytes_per_group_max` (16 MiB) admitted 3,817 such partitions in
    one group, and its OffsetFetch answer was 63.7 MB, past the 32 MiB every client decodes.
    Offsets are counted in the bytes they are encoded in."""
    from transport.codec import Codec

    harness, actor, _ = coordinator()
    wide = "\U0001F600" * actor.limits.offset_metadata_length_max
    entries = [OffsetEntry(topic=f"{index:06d}".ljust(LONGEST_TOPIC, "t"), partition=index % 1000, offset=1,
                           metadata=wide) for index in range(5_000)]
    answers = [commit(harness, "g", entries[start:start + 40]) for start in range(0, len(entries), 40)]
    fetched = only(harness.deliver(GROUPS, OffsetFetchRequest(correlation_id=2, group_id="g"), "admin"),
                   OffsetFetchResponse)

    size = sum(map(len, Codec().encode(fetched)))
    assert size < Codec().frame_bytes_max, f"an OffsetFetch answer of {size:,} bytes"
    assert any(entry.error == ErrorCode.LIMIT_REACHED for answer in answers for entry in answer.offsets)
    stored = sum(len(msgspec.msgpack.encode(entry.metadata)) for entry in actor.offsets.get("g").values())
    assert stored <= actor.limits.offset_bytes_per_group_max


def members_encoded_bytes(actor: GroupCoordinator) -> int:
    """What classic and share members hold, in the bytes msgpack encodes their texts in."""
    from actors.wire_bounds import text_bytes

    classic = sum(text_bytes(member.member_id) + text_bytes(member.client_id)
                  + text_bytes(member.instance_id or "") + len(member.assignment)
                  + sum(text_bytes(protocol.name) + len(protocol.metadata) for protocol in member.protocols)
                  for group in actor.groups.values() for member in group.members.values())
    share = sum(text_bytes(member.member_id) + text_bytes(member.client_id)
                + sum(map(text_bytes, member.topics))
                for group in actor.share.groups.values() for member in group.members.values())
    return classic + share


def test_members_with_non_ascii_ids_are_counted_in_bytes():
    """The membership budgets counted characters: a client id of 20,000 characters above U+FFFF
    (80 KB in UTF-8, and twice over, in the member id made from it) counted as 40 KB, so members
    held four times each budget: 20 such classic members and 20 share members within a total of
    1 MB held 6.4 MB, and one member's record, counted under `group_member_bytes_max`, could take
    the whole 1 MiB entry of the group quorum's log. They are counted in encoded bytes."""
    harness, actor, _ = coordinator(groups_membership_bytes_max=1_000_000)
    wide = "\U0001F600" * 20_000
    classic = sum((join_with(harness, f"g{index}", wide, [GroupProtocol(name="range")])
                   for index in range(20)), [])
    share = sum((share_heartbeat(harness, f"queue{index}", wide, []) for index in range(20)), [])

    assert members_encoded_bytes(actor) <= 2 * 1_000_000, f"{members_encoded_bytes(actor):,} bytes of members"
    refused = [answer for answer in classic + share if answer.error == ErrorCode.LIMIT_REACHED]
    assert refused and all("groups_membership_bytes_max" in answer.error_message for answer in refused)


def test_a_heartbeat_costs_the_same_in_a_group_whose_members_subscribe_to_many_names():
    """Each share heartbeat summed the bytes of every member of its group, topic name by topic
    name: in a group whose 25 members subscribed to 10,000 names each (~750 KB, within the group's
    budget) a 100-byte heartbeat of another member cost ~9 ms of the coordinator every group
    shares, ~90 times one in an empty group: ~110 heartbeats a second (11 KB/s) kept it busy.
    A group's count is kept as members come, change and go: counted here as members measured, one
    per member of the group at every heartbeat before."""
    import itertools
    import string

    from actors.share_group_membership import ShareMemberState

    harness, actor, _ = coordinator()
    letters = string.ascii_letters + string.digits
    names = ["".join(name) for name in itertools.product(letters, repeat=3)]
    for index in range(25):
        share_heartbeat(harness, "crowded", f"many-{index}", names[:10_000])
    assert sum(member.held_bytes() for member in actor.share.groups["crowded"].members.values()) > 700_000
    measured = [0]
    held_bytes = ShareMemberState.held_bytes

    def counted(member: ShareMemberState) -> int:
        measured[0] += 1
        return held_bytes(member)

    def measured_per_heartbeat(group: str) -> float:
        measured[0] = 0
        for index in range(50):
            actor.handle(ShareGroupHeartbeatRequest(
                correlation_id=11, group_id=group, client_id=f"few-{index}", topics=["orders"],
                session_timeout_ms=30_000, settings=ShareGroupSettings(dead_letter_topic="dead-letters")),
                f"few-{index}", 0)
        return measured[0] / 50

    ShareMemberState.held_bytes = counted
    try:
        empty, crowded = measured_per_heartbeat("empty"), measured_per_heartbeat("crowded")
    finally:
        ShareMemberState.held_bytes = held_bytes
    assert crowded <= 2 and empty <= 2, f"{crowded:.1f} members measured a heartbeat ({empty:.1f} when new)"
    actor.invariants()


def test_a_share_heartbeat_waiting_for_metadata_holds_its_member_not_its_repeated_names():
    """A heartbeat naming a topic the coordinator has no metadata for waits for it (up to
    HEARTBEAT_METADATA_WAIT_MS, one per member), and it was kept whole: a member is counted for the
    names it subscribes to, once each, but its request may name one 234-character name 10,000
    times (2.4 MB on the wire), 10,000 strings held for up to a second, ~2.9 MB per member. The
    waiting heartbeat keeps what its answer needs, not the names."""
    harness, actor, _ = coordinator()
    codec = Codec()
    name = "x" * LONGEST_TOPIC
    frames = [[bytes(frame) for frame in codec.encode(ShareGroupHeartbeatRequest(
        correlation_id=11, group_id="queue", client_id=f"client-{index}", topics=[name] * 10_000,
        session_timeout_ms=30_000, settings=ShareGroupSettings(dead_letter_topic="dead-letters")))]
        for index in range(5)]

    with bytes_held_from(__file__, at_most=200_000) as held:
        for index, frame in enumerate(frames):
            actor.handle(codec.decode(frame), f"client-{index}", harness.now_ns)

    assert len(actor.share.waiting_heartbeats) == 5, "each member's heartbeat waits for the name's metadata"
    assert held[0] < 200_000, f"5 waiting heartbeats hold {held[0]:,} bytes"


def test_names_only_members_gone_asked_for_are_not_asked_for_any_more():
    """A heartbeat subscribing to names the coordinator has no metadata for adds them to those its
    next metadata request asks for, at most `topics_max` a request, one request in flight (up to
    `share_request_timeout_ms`, 5 s, when the controller does not answer). They stayed when their
    member went: members of 10,000 fresh names each, their sessions ending (100 ms) while one
    request waited, left 280,000 names to ask for after 30 of them (each request sorting them all),
    and ~1 million for every 5 s the controller was silent. Only names members subscribe to wait."""
    harness, actor, _ = coordinator()
    for cycle in range(30):
        request = ShareGroupHeartbeatRequest(
            correlation_id=11, group_id="queue", client_id=f"client-{cycle}", session_timeout_ms=100,
            topics=[f"c{cycle}-{index}" for index in range(10_000)])
        harness.deliver(GROUPS, request, f"client-{cycle}")
        harness.advance(200)  # its session ends; the controller never answers
        harness.steps.clear()

    assert not any(group.members for group in actor.share.groups.values())
    wanted = actor.share.leaders.metadata_wanted - {""}
    assert not wanted, f"{len(wanted):,} names of members gone are still to be asked for"


@pytest.mark.timeout(120)
def test_the_names_share_members_subscribe_to_are_bounded_so_a_metadata_request_stays_cheap():
    """Every metadata request of the group coordinator collected and sorted every name any share
    member subscribes to, to ask for them in turn: 100 members naming 10,000 distinct invented
    names each (4 MB, within the membership budget) made each request 0.9 s of the process every
    group shares, sent every 50 ms while a name is wanted; the 64 MiB budget admits 16 times
    that. At most `share_subscribed_topics_max` distinct names are subscribed over all share
    groups; a heartbeat naming more is LIMIT_REACHED, and members of the names held go on."""
    import itertools
    import string

    harness, actor, _ = coordinator()
    letters = string.ascii_letters + string.digits
    names = ("".join(name) for name in itertools.product(letters, repeat=4))
    answers = []
    for index in range(40):
        batch = list(itertools.islice(names, 10_000))
        answers += share_heartbeat(harness, f"queue-{index % 10}", f"member-{index}", batch)
    again = share_heartbeat(harness, "queue-0", "known-names", ["aaaa", "aaab"])

    refused = [answer for answer in answers if answer.error == ErrorCode.LIMIT_REACHED]
    assert refused and all("share_subscribed_topics_max" in answer.error_message for answer in refused)
    assert len(actor.share._topics_in_use()) <= 20_000
    assert [answer.error for answer in again] in ([], [ErrorCode.NONE]), "names already held are taken"
    leaders = actor.share.leaders
    leaders.metadata_wanted.add("")
    assert len(leaders._names_to_ask()) <= actor.share.limits.topics_max, "one request's names"
