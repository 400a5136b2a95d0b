"""A committed offset carries the leader epoch it was consumed under (KIP-320), so a consumer
starting from it never reads at a deposed leader its stale metadata still names.

The story (the simulator's seed 3476, faults every 150-600 ms): a consumer paused for seconds
kept metadata naming the leader of epoch 1; meanwhile epoch 2 appended offsets 455..502, another
member consumed them and committed 503. Back in the group, the paused consumer was assigned the
partition again and fetched 503 at the epoch-1 leader — a process that had not yet heard it was
deposed, whose log ended at 455. It was answered OFFSET_OUT_OF_RANGE and reset to the earliest
offset: the group's committed offset went from 503 back to 455 (with `latest` it would have
skipped records instead). Kafka's consumer had the same story (KAFKA-6262); its cure is the epoch
in the committed offset and no fetch with metadata older than it, which is what is tested here.
"""

from __future__ import annotations

from actors.errors import ErrorCode
from actors.messages import (
    FetchRequest, MetadataRequest, MetadataResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetEntry,
    OffsetFetchRequest, OffsetFetchResponse, PartitionMetadata, TopicMetadata,
)
from tests.unit.actor_harness import flushed, only
from tests.unit.test_consumer_member import BOOTSTRAP, GROUPS, assignment
from tests.unit.test_consumer_member import Stage as MemberStage
from tests.unit.test_group_coordinator import Stage as GroupStage

DEPOSED, CURRENT = "tcp://127.0.0.1:6/deposed", "tcp://127.0.0.1:6/current"


def led(endpoint: str, *epochs: int, topic_id: int = 0) -> TopicMetadata:
    return TopicMetadata(name="orders", topic_id=topic_id, partitions=[
        PartitionMetadata(partition=p, leader=1, leader_endpoint=endpoint, leader_epoch=epoch)
        for p, epoch in enumerate(epochs)])


class Member(MemberStage):
    def metadata_answer(self, topic: TopicMetadata) -> list:
        asked = self.harness.take(BOOTSTRAP, MetadataRequest)
        assert asked, "the consumer asked no metadata"
        return self.harness.deliver("c1", MetadataResponse(
            correlation_id=asked[-1].correlation_id, topics=[topic], group_coordinator_endpoint=GROUPS), BOOTSTRAP)

    def subscribed(self, topic: TopicMetadata) -> None:
        self.command("subscribe", topics=["orders"])
        self.metadata_answer(topic)

    def assigned_from(self, committed: list[OffsetEntry]) -> None:
        """Join as a follower given `committed`'s partitions, and answer the committed offsets the
        member asks for with `committed`."""
        self.join_as_follower(1, assignment(*[(entry.topic, entry.partition) for entry in committed]))
        fetch = self.to_groups(OffsetFetchRequest)
        self.answer(OffsetFetchResponse(correlation_id=fetch.correlation_id, offsets=committed))
        assert self.member.state == "stable"


# ---------------------------------------------------------------------------- the commit


def test_a_commit_carries_the_leader_epoch_the_member_knows_for_each_partition():
    member = Member()
    member.subscribed(led(CURRENT, 7, 3))
    member.join_as_follower(1, assignment())

    member.command("commit", offsets=[("orders", 0, 15, ""), ("orders", 1, 4, ""), ("unknown", 0, 1, "")])
    commit = member.to_groups(OffsetCommitRequest)

    assert [(e.topic, e.partition, e.offset, e.leader_epoch) for e in commit.offsets] == [
        ("orders", 0, 15, 7), ("orders", 1, 4, 3), ("unknown", 0, 1, -1)]


# ---------------------------------------------------------------------------- the group coordinator


def commit_with_epochs(stage: GroupStage, *entries: OffsetEntry) -> list:
    return stage.ask("c1", OffsetCommitRequest(
        correlation_id=stage.next_correlation(), group_id="g", generation=stage.coordinator.groups["g"].generation,
        member_id=stage.ids["c1"], member_secret=stage.secrets["c1"], offsets=list(entries)))


def fetched_offsets(stage: GroupStage) -> list[OffsetEntry]:
    request = OffsetFetchRequest(correlation_id=stage.next_correlation(), group_id="g")
    return only(stage.ask("admin", request), OffsetFetchResponse).offsets


def test_the_group_coordinator_keeps_the_committed_epoch_across_a_restart():
    stage = GroupStage()
    stage.stable("c1")
    effects = commit_with_epochs(stage, OffsetEntry(topic="orders", partition=0, offset=503, leader_epoch=2),
                                 OffsetEntry(topic="orders", partition=1, offset=9))
    answer = only(flushed(effects), OffsetCommitResponse)
    assert [(e.offset, e.leader_epoch, e.error) for e in answer.offsets] == [(503, 2, 0), (9, -1, 0)]

    stage.restart()

    assert [(e.partition, e.offset, e.leader_epoch) for e in fetched_offsets(stage)] == [(0, 503, 2), (1, 9, -1)]


def test_an_offset_record_written_before_epochs_were_kept_still_loads():
    stage = GroupStage()
    stage.coordinator.state.put("offset/g/orders/0", [41, "meta", 1_000])  # [offset, metadata, timestamp]
    stage.coordinator.state.flush()
    stage.restart()

    assert [(e.offset, e.metadata, e.leader_epoch) for e in fetched_offsets(stage)] == [(41, "meta", -1)]


def test_a_commit_with_an_epoch_below_minus_one_is_refused_as_invalid():
    stage = GroupStage()
    stage.stable("c1")

    effects = commit_with_epochs(stage, OffsetEntry(topic="orders", partition=0, offset=5, leader_epoch=-7))

    answer = only(flushed(effects), OffsetCommitResponse)
    assert [entry.error for entry in answer.offsets] == [ErrorCode.INVALID_REQUEST]
    assert "epoch" in answer.error_message
    assert fetched_offsets(stage) == []


# ---------------------------------------------------------------------------- the consumer


def test_a_committed_epoch_newer_than_the_metadata_is_read_at_the_current_leader_not_the_deposed_one():
    member = Member()
    member.subscribed(led(DEPOSED, 1, 1))

    member.assigned_from([OffsetEntry(topic="orders", partition=0, offset=503, leader_epoch=2)])

    assert member.harness.take(DEPOSED, FetchRequest) == []  # its metadata names epoch 1: too old
    member.harness.advance(150)  # the metadata backoff
    member.metadata_answer(led(CURRENT, 2, 2))
    fetch = only(member.harness.take(CURRENT, FetchRequest), FetchRequest)
    assert (fetch.offset, fetch.leader_epoch) == (503, 2)
    assert member.harness.received(DEPOSED, FetchRequest) == []


def test_a_fresh_answer_naming_an_older_epoch_is_the_coordinators_word_and_is_followed():
    """The topic was deleted and made again (its epochs start over): the committed epoch bounds
    how stale cached metadata may be; it is not a wait for an epoch that will never come."""
    member = Member()
    member.subscribed(led(DEPOSED, 1, 1))

    member.assigned_from([OffsetEntry(topic="orders", partition=0, offset=503, leader_epoch=9)])
    assert member.harness.take(DEPOSED, FetchRequest) == []
    member.harness.advance(150)
    member.metadata_answer(led(CURRENT, 1, 1, topic_id=77))  # asked after the committed epoch was known

    fetch = only(member.harness.take(CURRENT, FetchRequest), FetchRequest)
    assert (fetch.offset, fetch.leader_epoch) == (503, 1)


def test_a_committed_offset_without_an_epoch_is_fetched_at_once():
    member = Member()
    member.subscribed(led(DEPOSED, 1, 1))

    member.assigned_from([OffsetEntry(topic="orders", partition=0, offset=20)])

    fetch = only(member.harness.take(DEPOSED, FetchRequest), FetchRequest)
    assert (fetch.offset, fetch.leader_epoch) == (20, 1)


def test_a_commit_made_before_the_metadata_caught_up_keeps_the_committed_epoch():
    member = Member()
    member.subscribed(led(DEPOSED, 1, 1))
    member.assigned_from([OffsetEntry(topic="orders", partition=0, offset=503, leader_epoch=2)])

    member.command("commit", offsets=[("orders", 0, 503, "")])  # the metadata still names epoch 1
    commit = member.to_groups(OffsetCommitRequest)

    assert [(e.offset, e.leader_epoch) for e in commit.offsets] == [(503, 2)]
