"""An administrative commit names the topic id of each topic it commits offsets of.

A commit keeps the id of the topic it was read from, and a member whose commit names another id
than the topic's now starts from its reset policy (the topic was deleted and made again under its
name). `groups reset-offsets` committed without ids, and a commit without one is taken as the
topic's, whatever topic it is now: reset to offset 30, then the topic deleted and made again, the
group resumed the new topic at 30 and never delivered its first 30 records. No cluster: the commit
is read as it is handed to the group coordinator.
"""

from __future__ import annotations

import pytest

from actors.errors import ErrorCode, RailmqError
from actors.messages import OffsetCommitResponse, PartitionMetadata, TopicMetadata
from railmq.group_admin import GroupAdminClient

NOBODY = "tcp://127.0.0.1:1"


@pytest.fixture
def groups():
    client = GroupAdminClient(NOBODY, timeout_ms=300)
    client.sent = []

    def answer(message):
        client.sent.append(message)
        return OffsetCommitResponse(correlation_id=0, offsets=message.offsets)

    client._group_request = answer
    yield client
    client.close()


@pytest.mark.timeout(30)
def test_an_administrative_commit_names_the_topic_id_of_what_it_commits(groups):
    groups._topics["orders"] = TopicMetadata(name="orders", topic_id=77,
                                             partitions=[PartitionMetadata(partition=0)])

    groups.commit_as_admin("g", {("orders", 0): 30})

    [commit] = groups.sent
    assert [(entry.topic, entry.offset, entry.topic_id) for entry in commit.offsets] == [("orders", 30, 77)]


@pytest.mark.timeout(30)
def test_a_commit_for_a_topic_not_made_yet_names_no_topic_id(groups):
    def unknown(name):
        raise RailmqError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name)

    groups.topic = unknown
    groups.commit_as_admin("g", {("later", 0): 5})

    [commit] = groups.sent
    assert [(entry.topic, entry.offset, entry.topic_id) for entry in commit.offsets] == [("later", 5, 0)]
