"""`GroupAdminClient`: synchronous requests to the group coordinator and to partition leaders,
for the tools that look at groups from outside (railmq/lag.py, `railmq groups`, dead-letter
redrives, the console, the labs).

Each answer is a claim (docs/security.md): one of another kind than the request asks for is a
typed error, a ListOffsets answer must name the partition asked and an offset a log can have,
the group coordinator must be named at an endpoint a cluster process can have, and a log start
that moves at every fetch is followed only a few times. Retriable errors are retried within the
client's timeout; a closed client refuses at once (`AdminClosed`).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from actors.controller_endpoints import named_endpoint
from actors.errors import ErrorCode, RailmqError
from actors.messages import (
    DeleteGroupRequest, DescribeGroupRequest, DescribeGroupResponse, ErrorResponse, FetchRequest,
    GroupSummary, ListGroupsRequest, ListOffsetsRequest, OffsetCommitRequest, OffsetEntry, TopicMetadata,
)
from railmq.admin import Admin, answer_to, listed_offsets
from railmq.records import decode_fetched
from transport.rpc import RequestTimeout

EARLIEST, LATEST = -2, -1  # ListOffsets' special timestamps
# `timestamp_at` follows a log start this many times in a row: retention may move it again
# between two fetches, but not at every fetch; a leader that says so answers for no log.
LOG_START_FOLLOWS_MAX = 3
RETRY_PAUSE_S = 0.05
TopicPartitionKey = tuple[str, int]


def _checked(reply: Any) -> Any:
    if isinstance(reply, ErrorResponse) or getattr(reply, "error", ErrorCode.NONE) != ErrorCode.NONE:
        raise RailmqError(reply.error, reply.error_message)
    return reply


class GroupAdminClient:
    """Synchronous requests to the group coordinator and to partition leaders (one thread)."""

    def __init__(self, bootstrap: str, *, timeout_ms: int = 10_000,
                 clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        self.admin = Admin(bootstrap, timeout_ms=timeout_ms)
        self.timeout_ms = timeout_ms
        self.clock_ms = clock_ms
        self._topics: dict[str, TopicMetadata] = {}

    def close(self) -> None:
        self.admin.close()

    def __enter__(self) -> "GroupAdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ask(self, endpoint: str, message: Any, wrong_kind: int) -> Any:
        """One request; an answer of another kind than `message` asks for is `wrong_kind`."""
        self.admin.check_open()
        try:
            reply = self.admin.rpc.request(endpoint, message, self.timeout_ms)
        except RequestTimeout as timeout:
            raise RailmqError(ErrorCode.REQUEST_TIMED_OUT, str(timeout)) from None
        return answer_to(message, reply, wrong_kind)

    def _retrying(self, attempt: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            try:
                return attempt()
            except RailmqError as error:
                # A timeout already waited the whole budget; other retriable errors pass quickly.
                waited_out = error.code == ErrorCode.REQUEST_TIMED_OUT or time.monotonic() > deadline
                if not error.retriable or waited_out:
                    raise
                self._topics.clear()
                time.sleep(RETRY_PAUSE_S)

    # ------------------------------------------------------------------ group coordinator

    def _coordinator(self) -> str:
        endpoint = self.admin.metadata([]).group_coordinator_endpoint
        if not endpoint:
            raise RailmqError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                              "the group coordinator has not announced itself yet")
        if not named_endpoint(endpoint):  # a claim: a local socket, a source address, a 10 KB name
            raise RailmqError(ErrorCode.COORDINATOR_NOT_AVAILABLE, (
                f"the metadata names the group coordinator at {endpoint[:80]!r}, no endpoint of a cluster"))
        return endpoint

    def _group_request(self, message: Any) -> Any:
        wrong_kind = ErrorCode.NOT_COORDINATOR
        return self._retrying(lambda: _checked(self._ask(self._coordinator(), message, wrong_kind)))

    def list_groups(self) -> list[GroupSummary]:
        return self._group_request(ListGroupsRequest(correlation_id=0)).groups

    def describe_group(self, group_id: str) -> DescribeGroupResponse:
        return self._group_request(DescribeGroupRequest(correlation_id=0, group_id=group_id))

    def delete_group(self, group_id: str) -> None:
        self._group_request(DeleteGroupRequest(correlation_id=0, group_id=group_id))

    def delete_offsets(self, group_id: str, partitions: list[TopicPartitionKey]) -> list[TopicPartitionKey]:
        """Forget the group's commits for these partitions (Kafka's OffsetDelete); the group must
        have no members. Returns the partitions that had a commit."""
        from actors.messages import OffsetDeleteRequest

        reply = self._group_request(OffsetDeleteRequest(correlation_id=0, group_id=group_id,
                                                        partitions=[tuple(p) for p in partitions]))
        return [tuple(partition) for partition in reply.deleted]

    def commit_as_admin(self, group_id: str, offsets: dict[TopicPartitionKey, int]) -> None:
        """Commit with generation -1: accepted only while the group has no members (else NON_EMPTY_GROUP).
        Each offset names its topic's id, as a member's commit does: without one, a commit is taken
        for whatever topic has the name when a member reads it, a topic made again under it too."""
        entries = [OffsetEntry(topic=topic, partition=partition, offset=offset,
                               topic_id=self._topic_id(topic))
                   for (topic, partition), offset in sorted(offsets.items())]
        reply = self._group_request(OffsetCommitRequest(correlation_id=0, group_id=group_id, offsets=entries))
        refused = [entry for entry in reply.offsets if entry.error]
        if refused:
            first = refused[0]
            raise RailmqError(first.error, f"the commit for {first.topic}/{first.partition} was refused")

    # ------------------------------------------------------------------ partition leaders

    def _topic_id(self, name: str) -> int:
        """The topic's id now; 0 for a topic not made yet (its commit is taken by the first one)."""
        try:
            return self.topic(name).topic_id
        except RailmqError as error:
            if error.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise
            return 0

    def topic(self, name: str) -> TopicMetadata:
        if name not in self._topics:
            self._topics[name] = self.admin.describe_topic(name)
        return self._topics[name]

    def _leader(self, topic: str, partition: int) -> str:
        partitions = self.topic(topic).partitions
        if not 0 <= partition < len(partitions):
            raise RailmqError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}")
        endpoint = partitions[partition].leader_endpoint
        if not endpoint:
            raise RailmqError(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}/{partition} has no leader right now")
        return endpoint

    def list_offset(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """EARLIEST, LATEST (the high watermark), or the first offset at or after a time (-1: none)."""
        def attempt() -> int:
            request = ListOffsetsRequest(correlation_id=0, topic=topic, partition=partition,
                                         timestamp_ms=timestamp_ms)
            reply = self._ask(self._leader(topic, partition), request, ErrorCode.NOT_LEADER)
            return listed_offsets(reply, topic, partition).offset
        return self._retrying(attempt)

    def list_offsets(self, keys: list[TopicPartitionKey], timestamp_ms: int) -> dict[TopicPartitionKey, int]:
        """`list_offset` for many partitions in one round trip (every leader asked at once), so the
        offsets are of one moment; if any answer is a retriable error, each is asked again alone."""
        try:
            requests = [(self._leader(topic, partition), ListOffsetsRequest(
                correlation_id=0, topic=topic, partition=partition, timestamp_ms=timestamp_ms))
                for topic, partition in keys]
            self.admin.check_open()
            try:
                replies = self.admin.rpc.request_many(requests, self.timeout_ms)
            except RequestTimeout as timeout:
                raise RailmqError(ErrorCode.REQUEST_TIMED_OUT, str(timeout)) from None
            return {key: listed_offsets(reply, *key).offset for key, reply in zip(keys, replies)}
        except RailmqError as error:
            if not error.retriable:
                raise
            self._topics.clear()
            return {key: self.list_offset(key[0], key[1], timestamp_ms) for key in keys}

    def timestamp_at(self, topic: str, partition: int, offset: int) -> int | None:
        """The timestamp of the first record at or after `offset` (None when there is none yet).
        When retention removed it, the oldest record left is the one: the log start the answer
        names is read instead, at most `LOG_START_FOLLOWS_MAX` times (it called itself for each,
        and a leader naming offset + 1 every time ended in a RecursionError after 986 fetches)."""
        def attempt() -> int | None:
            position = offset
            for _ in range(LOG_START_FOLLOWS_MAX + 1):
                request = FetchRequest(correlation_id=0, topic=topic, partition=partition, offset=position,
                                       max_bytes=1, max_wait_ms=0)
                reply = self._ask(self._leader(topic, partition), request, ErrorCode.NOT_LEADER)
                out_of_range = getattr(reply, "error", 0) == ErrorCode.OFFSET_OUT_OF_RANGE
                if not (out_of_range and position < reply.log_start_offset):
                    records = decode_fetched(topic, partition, _checked(reply).records, position)
                    return records[0].timestamp_ms if records else None
                position = reply.log_start_offset
            raise RailmqError(ErrorCode.OFFSET_OUT_OF_RANGE, (
                f"the log start of {topic}/{partition} moved past each of {LOG_START_FOLLOWS_MAX + 1} "
                f"fetches from offset {offset} on (to {position})"))
        return self._retrying(attempt)
