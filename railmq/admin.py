"""`Admin`: create, describe, grow and delete topics; read metadata and actor counters.

Synchronous: each call is one request to the coordinator (or a partition leader) and raises
`RailmqError` with the broker's typed error code and sentence when refused.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from actors import messages

from actors.client_metadata import checked_topic
from actors.controller_endpoints import ENDPOINTS_MAX, ControllerEndpoints, named_endpoint
from actors.errors import ErrorCode, RailmqError
from actors.messages import (
    ControllerStatusRequest, ControllerStatusResponse, CreatePartitionsRequest, CreateTopicRequest,
    DeleteTopicRequest, ErrorResponse, FaultControlRequest, LinkFault, ListOffsetsRequest, ListOffsetsResponse,
    MetadataRequest, MetadataResponse, RuntimeStatsRequest, RuntimeStatsResponse, TopicConfig, TopicMetadata,
)
from actors.topic_admin import topic_config_from
from transport.rpc import RequestTimeout, RpcClient


@functools.cache
def _answer_kind(request_kind: type) -> type:
    """The message that answers `request_kind` (`XRequest` is answered by `XResponse`)."""
    return getattr(messages, request_kind.__name__.removesuffix("Request") + "Response")


def answer_to(request: Any, reply: Any, wrong_kind: int = ErrorCode.UNKNOWN_SERVER_ERROR) -> Any:
    """`reply` when it is the answer `request` asks for or an ErrorResponse. A request's answer
    is taken by correlation id alone (transport/rpc.py), so a stale or hostile process can answer
    with any message: another kind is the error `wrong_kind`, which names both (taken, a
    HeartbeatResponse to CreateTopic was an AttributeError, and one to DeleteTopic a success)."""
    if isinstance(reply, (_answer_kind(type(request)), ErrorResponse)):
        return reply
    raise RailmqError(wrong_kind, f"{type(request).__name__} was answered with a {type(reply).__name__}")


def _check(reply: Any) -> Any:
    if isinstance(reply, ErrorResponse) or getattr(reply, "error", 0) != ErrorCode.NONE:
        raise RailmqError(reply.error, reply.error_message)
    return reply


def listed_offsets(reply: Any, topic: str, partition: int) -> ListOffsetsResponse:
    """A leader's ListOffsets answer about `topic`/`partition`, or the error it is. An answer is a
    claim, checked as the consumer checks it (actors/consumer_client_answers.py): one naming
    another partition (a stale or hostile process on the leader's port) or an offset no log has
    is NOT_LEADER. Taken, a group's offsets reset to another partition's high watermark."""
    if not isinstance(reply, ListOffsetsResponse):
        if isinstance(reply, ErrorResponse):
            raise RailmqError(reply.error, reply.error_message)
        raise RailmqError(ErrorCode.NOT_LEADER, f"ListOffsets was answered with a {type(reply).__name__}")
    if reply.error != ErrorCode.NONE:
        raise RailmqError(reply.error, reply.error_message)
    if (reply.topic, reply.partition) != (topic, partition):
        raise RailmqError(ErrorCode.NOT_LEADER, (
            f"the answer names {reply.topic[:60]!r}/{reply.partition}, not {topic!r}/{partition}"))
    if min(reply.offset, reply.log_start_offset, reply.high_watermark) < 0:
        raise RailmqError(ErrorCode.NOT_LEADER, (
            f"the answer gives offset {reply.offset}, log start {reply.log_start_offset} and high watermark "
            f"{reply.high_watermark}: no log has an offset below 0"))
    return reply


def topic_config(settings: dict[str, Any]) -> TopicConfig:
    """Settings given by name, every name known and every value of its type, else `INVALID_CONFIG`
    before anything is sent (the coordinator reads them the same way: actors/topic_admin.py)."""
    config, problem = topic_config_from(settings)
    if problem is not None:
        raise RailmqError(*problem)
    return config


class AdminClosed(RailmqError):
    def __init__(self) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, "the admin client is closed")


class Admin:
    def __init__(self, bootstrap: str, *, timeout_ms: int = 10_000, secret: bytes | None = None) -> None:
        """`secret`: the cluster secret (`LocalCluster.secret`), needed only for the fault switch."""
        self.bootstrap = bootstrap
        self.controllers = ControllerEndpoints(bootstrap)
        self.timeout_ms = timeout_ms
        self.rpc = RpcClient(identity="admin", secret=secret)
        self._closed = False

    def _request(self, endpoint: str, message: Any, timeout_ms: int | None = None, *,
                 wrong_kind: int = ErrorCode.UNKNOWN_SERVER_ERROR) -> Any:
        """One request; to the active controller when `endpoint` is the bootstrap. An answer of
        another kind than `message` asks for is the error `wrong_kind` (`answer_to`)."""
        self.check_open()
        try:
            if endpoint == self.bootstrap:
                reply = self.rpc.request_controller(self.controllers, message, timeout_ms or self.timeout_ms)
            else:
                reply = self.rpc.request(endpoint, message, timeout_ms or self.timeout_ms)
        except RequestTimeout as timeout:
            raise RailmqError(ErrorCode.REQUEST_TIMED_OUT, str(timeout)) from None
        return answer_to(message, reply, wrong_kind)

    def quorum_status(self, timeout_s: float = 2.0) -> list[ControllerStatusResponse]:
        """Every voter's own view of the quorum (one request to each; a voter that does not answer
        within `timeout_s` is listed with `role="unreachable"`). Empty with a single coordinator.
        At most `ENDPOINTS_MAX` voters, each once: the list is the answering process's claim, and
        1,000 names that never answer held this call for 1,000 x `timeout_s`. A voter named at
        an endpoint no cluster process has (`named_endpoint`: a local socket) is not asked."""
        first = self._request(self.bootstrap, MetadataRequest(correlation_id=0, topics=[]), int(timeout_s * 1000))
        named = first.controller_endpoints if isinstance(first, MetadataResponse) else []
        endpoints = list(dict.fromkeys(e for e in named if named_endpoint(e)))[:ENDPOINTS_MAX]
        answers = []
        for endpoint in endpoints:
            try:
                answer = self.rpc.request(endpoint, ControllerStatusRequest(correlation_id=0),
                                          int(timeout_s * 1000))
            except RequestTimeout:
                answer = None
            if not isinstance(answer, ControllerStatusResponse):  # no answer, or not a voter's
                answer = ControllerStatusResponse(correlation_id=0, endpoint=endpoint, role="unreachable")
            answers.append(answer)
        return answers

    # ------------------------------------------------------------------ topics

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     config: TopicConfig | dict | None = None, *, wait: bool = True,
                     timeout_s: float = 30.0) -> TopicMetadata:
        """Create a topic; with `wait`, return once every partition has a live leader."""
        if isinstance(config, dict):
            config = topic_config(config)
        request = CreateTopicRequest(correlation_id=0, name=name, partitions=partitions,
                                     replication_factor=replication_factor, config=config or TopicConfig())
        reply = _check(self._request(self.bootstrap, request))
        return self.wait_for_leaders(name, timeout_s) if wait else reply.topic

    def delete_topic(self, name: str) -> None:
        _check(self._request(self.bootstrap, DeleteTopicRequest(correlation_id=0, name=name)))

    def create_partitions(self, name: str, total_partitions: int, *, wait: bool = True,
                          timeout_s: float = 30.0) -> None:
        _check(self._request(self.bootstrap, CreatePartitionsRequest(
            correlation_id=0, name=name, total_partitions=total_partitions)))
        if wait:
            self.wait_for_leaders(name, timeout_s)

    def alter_topic_config(self, name: str, changes: dict[str, Any]) -> TopicConfig:
        """Change settings of a live topic: retention_ms, retention_bytes, min_insync_replicas,
        unclean_leader_election. Returns the topic's settings after the change."""
        from actors.messages import AlterTopicConfigRequest

        reply = _check(self._request(self.bootstrap, AlterTopicConfigRequest(correlation_id=0, name=name,
                                                                             changes=dict(changes))))
        return reply.config

    def metadata(self, topics: list[str] | None = None) -> MetadataResponse:
        return _check(self._request(self.bootstrap, MetadataRequest(correlation_id=0, topics=topics)))

    def list_topics(self) -> list[str]:
        return [topic.name for topic in self.metadata().topics]

    def describe_topic(self, name: str) -> TopicMetadata:
        """The answer's topic named `name`, its partitions 0..n-1 in order. The answer is a claim,
        taken as the clients take metadata (actors/client_metadata.py): one that does not describe
        the topic asked for, or whose partitions are not 0..n-1, is LEADER_NOT_AVAILABLE (asked
        again by `wait_for_leaders`), never another topic's description."""
        topics = self.metadata([name]).topics
        topic = next((checked_topic(topic) for topic in topics if topic.name == name), None)
        if topic is None:
            raise RailmqError(ErrorCode.LEADER_NOT_AVAILABLE, (
                f"the metadata answer describes {len(topics)} topics, none of them {name!r}"))
        if topic.error != ErrorCode.NONE:
            raise RailmqError(topic.error, topic.error_message)
        return topic

    def wait_for_leaders(self, name: str, timeout_s: float = 30.0, *, full_isr: bool = False,
                         on_progress: Callable[[int, int], None] | None = None) -> TopicMetadata:
        """Wait until every partition has a live leader (and, with `full_isr`, every replica in the
        ISR); `on_progress(ready, total)` hears how many are there after each look."""
        started = time.monotonic()
        deadline = started + timeout_s
        ready, total = 0, 0
        while True:
            try:
                topic = self.describe_topic(name)
                total = len(topic.partitions)
                ready = sum(1 for p in topic.partitions
                            if p.leader_endpoint and (not full_isr or len(p.isr) == len(p.replicas)))
                if on_progress is not None:
                    on_progress(ready, total)
                if ready == total:
                    return topic
            except RailmqError as error:
                if not error.retriable:
                    raise
            if time.monotonic() > deadline:
                what = "a leader" + (" and a full ISR" if full_isr else "")
                raise RailmqError(ErrorCode.LEADER_NOT_AVAILABLE, (
                    f"topic {name!r} exists, but after {time.monotonic() - started:.0f} s only {ready} of {total} "
                    f"partitions have {what}; their replicas are still starting (see topics describe)"))
            time.sleep(0.05 if time.monotonic() - started < 2 else 0.25)

    # ------------------------------------------------------------------ offsets

    def list_offsets(self, topic: str, partition: int, timestamp_ms: int) -> ListOffsetsResponse:
        """-2: earliest, -1: latest (high watermark), or the first offset at or after a time."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            partitions = self.describe_topic(topic).partitions
            if not 0 <= partition < len(partitions):  # partitions[-1] is the last one's leader
                raise RailmqError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                  f"{topic} has no partition {partition}")
            leader = partitions[partition].leader_endpoint
            if leader:
                try:
                    reply = self._request(leader, ListOffsetsRequest(
                        correlation_id=0, topic=topic, partition=partition, timestamp_ms=timestamp_ms),
                        wrong_kind=ErrorCode.NOT_LEADER)
                    return listed_offsets(reply, topic, partition)
                except RailmqError as error:
                    if not error.retriable:
                        raise
            if time.monotonic() > deadline:
                raise RailmqError(ErrorCode.LEADER_NOT_AVAILABLE, f"no leader answered for {topic}/{partition}")
            time.sleep(0.05)

    # ------------------------------------------------------------------ actors

    def runtime_stats(self, endpoint: str) -> RuntimeStatsResponse:
        return _check(self._request(endpoint, RuntimeStatsRequest(correlation_id=0)))

    def set_faults(self, endpoint: str, links: list[LinkFault] | None = None, *, disk_full: bool = False,
                   fail_next_fsync: bool = False) -> None:
        _check(self._request(endpoint, FaultControlRequest(
            correlation_id=0, links=links or [], disk_full=disk_full, fail_next_fsync=fail_next_fsync)))

    def check_open(self) -> None:
        """`AdminClosed` once closed: its sockets are gone, and opening new ones would outlive the
        caller's close (for callers of its RPC client too: railmq/lag.py)."""
        if self._closed:
            raise AdminClosed()

    def close(self) -> None:
        self._closed = True
        self.rpc.close()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
