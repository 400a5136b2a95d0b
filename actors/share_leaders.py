"""What the share groups read from the rest of the cluster: metadata, partition leaders, the
leaders' high watermarks, and the requests in flight that fetch them.

`PartitionLeaders` belongs to `ShareGroups` (actors/share_group.py) and is shared with its
`DeadLetterWriter` (actors/share_dead_letters.py). It owns no share state and never decides
what a member gets; it answers "where is this partition's leader" and "how far does its log
reach", and numbers, times out and forgets the requests the coordinator sends. `ShareGroups`
routes each answer by its `Outbound` kind and tells this class what came back.

- Leaders come from metadata (the coordinator's endpoint). An error or a dropped connection
  forgets a leader and asks metadata again, and an endpoint that disconnected is not trusted
  for `share_request_timeout_ms`, so a leader failover costs a retry and never share state.
- One metadata request at a time, at most one per METADATA_INTERVAL_MIN_MS (a leaderless
  partition must not make a request loop); it always covers every topic a member subscribes
  to and every topic already known, and is repeated every METADATA_REFRESH_MS while share
  groups have members.
- High watermarks come from the partition leader (ListOffsets, latest), at most one request in
  flight per partition and one per `share_high_watermark_refresh_ms`; no offset at or above the
  last one read is ever handed out. Once one is known, the request is a long poll: the leader
  answers when its high watermark passes it, or after HIGH_WATERMARK_WAIT_MS — so acquires
  waiting on an idle partition cost a request per wait, not one per refresh interval. A
  share-partition behind the high watermark reads the bounds again only every
  `share_log_start_refresh_ms`, at once, for the log start retention moves under a backlog.
- Every request carries a correlation id of its own and a deadline; `overdue` and `disconnected`
  name the ones that will never be answered, and `ShareGroups` fails them with a retriable
  error, so nothing waits for ever.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import msgspec

from actors.actor import MS
from actors.controller_endpoints import ControllerEndpoints
from actors.deadlines import lowered
from actors.effects import Effect, Send
from actors.errors import ErrorCode
from actors.limits import Limits
from actors.messages import ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse, TopicMetadata
from actors.share_partition import SharePartition

# Metadata is re-read this often while share groups have members: partitions added to a topic
# reach the members' heartbeat answers within it.
METADATA_REFRESH_MS = 5000
# Metadata requests are at least this far apart (the timer sends one that had to wait).
METADATA_INTERVAL_MIN_MS = 50
# How long a leader may hold a high-watermark read that nothing new has answered (well within
# share_request_timeout_ms, which fails a request never answered).
HIGH_WATERMARK_WAIT_MS = 500


class PartitionWatch:
    """What the coordinator last read of one partition's log bounds at its leader."""

    __slots__ = ("log_start_offset", "high_watermark", "correlation", "sent_ns")

    def __init__(self) -> None:
        self.log_start_offset = -1
        self.high_watermark = -1  # -1: never read
        self.correlation = 0  # the ListOffsets in flight, 0 if none
        self.sent_ns = 0


class Outbound(NamedTuple):
    kind: str
    key: Any
    endpoint: str
    deadline_ns: int


class PartitionLeaders:
    def __init__(self, *, coordinator: str, limits: Limits, topics_in_use: Callable[[], set[str]]) -> None:
        self.controllers = ControllerEndpoints(coordinator)
        self.limits = limits
        self.topics_in_use = topics_in_use  # the topics members subscribe to: metadata always covers them
        self.topics: dict[str, TopicMetadata] = {}
        self.watches: dict[tuple[str, int], PartitionWatch] = {}
        self.pending: dict[int, Outbound] = {}
        self.correlation = 0
        self.metadata_correlation = 0
        self.metadata_wanted: set[str] = set()
        # Of those, the names only members' heartbeats asked for: each is asked for while a member
        # subscribes to it (`unsubscribed`). Kept after their members went, members of 10,000 fresh
        # names each whose sessions ended while a request waited left 280,000 after 30 of them.
        self.wanted_for_members: set[str] = set()
        self.metadata_turn = 0  # past `topics_max` names: where the next request's share starts
        self.last_metadata_ns = 0
        self.unreachable: dict[str, int] = {}  # endpoint -> until when metadata naming it is not trusted
        # No request in flight times out before this (a lower bound between the coordinator's
        # ticks, which set it exactly; None: nothing in flight).
        self.pending_floor_ns: int | None = None

    @property
    def coordinator(self) -> str:
        """Where metadata is asked for: the active controller, as far as known."""
        return self.controllers.current

    # ------------------------------------------------------------------ leaders and metadata

    def leader_endpoint(self, topic: str, partition: int, now_ns: int) -> str:
        metadata = self.topics.get(topic)
        if metadata is None or not 0 <= partition < len(metadata.partitions):
            return ""
        endpoint = metadata.partitions[partition].leader_endpoint
        return "" if self.unreachable.get(endpoint, 0) > now_ns else endpoint

    def forget_leader(self, topic: str, partition: int) -> None:
        metadata = self.topics.get(topic)
        if metadata is not None and 0 <= partition < len(metadata.partitions):
            metadata.partitions[partition].leader_endpoint = ""

    def refresh_leaders(self, topic: str, now_ns: int) -> list[Effect]:
        return self.request_metadata([topic], now_ns)

    def request_metadata(self, topics: list[str], now_ns: int, *, for_members: bool = False) -> list[Effect]:
        """One metadata request at a time, at most one per METADATA_INTERVAL_MIN_MS (a leaderless
        partition must not make a request loop); topics asked for meanwhile go with the next one,
        which the tick sends if nothing else does. `for_members`: names members subscribe to."""
        if for_members:
            self.wanted_for_members.update(topic for topic in topics if topic not in self.metadata_wanted)
        else:
            self.wanted_for_members.difference_update(topics)
        self.metadata_wanted.update(topics)
        if self.metadata_correlation or now_ns - self.last_metadata_ns < METADATA_INTERVAL_MIN_MS * MS:
            self.metadata_wanted.add("")  # something is wanted, even if only a refresh
            return []
        wanted = self._names_to_ask()
        self.metadata_wanted.difference_update(wanted)  # what did not fit goes with the next one
        self.wanted_for_members.difference_update(wanted)
        self.metadata_wanted.discard("")
        self.last_metadata_ns = now_ns
        send = self.send_request("metadata", None, self.coordinator, MetadataRequest(correlation_id=0, topics=wanted),
                                 now_ns)
        self.metadata_correlation = send.message.correlation_id
        return [send]

    def unsubscribed(self, topic: str) -> None:
        """No member subscribes to `topic` any more: if only members asked for it, it is not asked for."""
        if topic in self.wanted_for_members:
            self.wanted_for_members.discard(topic)
            self.metadata_wanted.discard(topic)

    def _names_to_ask(self) -> list[str]:
        """The names of one metadata request: what was asked for, the topics known and every
        topic members subscribe to, but at most `topics_max` (the controller refuses more). Members
        may subscribe to names that are no topic, 10,000 each: past the bound, what was asked for
        and the topics known go first, members' other names take the rest, each in turn."""
        asked = self.metadata_wanted - {""}
        known = set(self.topics) - asked
        others = self.topics_in_use() - asked - known - {""}
        most = self.limits.topics_max
        if len(asked) + len(known) + len(others) <= most:
            return sorted(asked | known | others)
        first = sorted(asked) + sorted(known)
        if len(first) >= most:
            return sorted(self._in_turn(first, most))
        return sorted(first + self._in_turn(sorted(others), most - len(first)))

    def _in_turn(self, names: list[str], count: int) -> list[str]:
        """`count` of `names`, starting where the last request's share ended."""
        start = self.metadata_turn % len(names) if names else 0
        self.metadata_turn = start + count
        return (names[start:] + names[:start])[:count]

    def pending_deadlines(self) -> list[int]:
        """When each request in flight times out (`overdue`)."""
        return [outbound.deadline_ns for outbound in self.pending.values()]

    def metadata_deadlines(self, members: bool) -> list[int]:
        """When `refresh_if_due` has something to do."""
        deadlines = [self.last_metadata_ns + METADATA_REFRESH_MS * MS + 1] if members else []
        if self.metadata_wanted and not self.metadata_correlation:
            deadlines.append(self.last_metadata_ns + METADATA_INTERVAL_MIN_MS * MS)
        return deadlines

    def watch_due_ns(self, key: tuple[str, int]) -> int:
        """When a waiting partition's high watermark may be read again (0: a read is in flight)."""
        watch = self.watches.get(key)
        if watch is None:
            return 1  # never read: at once
        return 0 if watch.correlation else watch.sent_ns + self.limits.share_high_watermark_refresh_ms * MS

    def refresh_if_due(self, members: bool, now_ns: int) -> list[Effect]:
        """The tick's metadata request: one that had to wait, or the periodic one while there are members."""
        stale = members and now_ns - self.last_metadata_ns > METADATA_REFRESH_MS * MS
        if stale or self.metadata_wanted:
            return self.request_metadata([], now_ns)
        return []

    def observe_metadata(self, response: MetadataResponse) -> None:
        self.metadata_correlation = 0
        self.controllers.learn(response.controller_endpoints)
        for topic in response.topics:
            if topic.error == ErrorCode.NONE:
                self.topics[topic.name] = topic
            elif topic.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                self.topics.pop(topic.name, None)

    # ------------------------------------------------------------------ high watermarks

    def watch_if_needed(self, share_partition: SharePartition, now_ns: int) -> list[Effect]:
        """Read the leader's high watermark again when the share-partition has caught up with it;
        behind it, read the log bounds every `share_log_start_refresh_ms` all the same (retention
        moves the log start under a backlog), without waiting at the leader."""
        key = (share_partition.topic, share_partition.partition)
        watch = self.watches.setdefault(key, PartitionWatch())
        if share_partition.initialized and share_partition.end_offset < watch.high_watermark:
            if now_ns - watch.sent_ns < self.limits.share_log_start_refresh_ms * MS:
                return []
            return self._refresh_watch(key, watch, now_ns, wait=False)
        return self._refresh_watch(key, watch, now_ns)

    def forget_watch(self, key: tuple[str, int]) -> None:
        """The partition's topic was made again: what was read of the old one's bounds means
        nothing, and an answer still to come speaks of the old topic (it is dropped as late)."""
        watch = self.watches.pop(key, None)
        if watch is not None and watch.correlation:
            self.pending.pop(watch.correlation, None)

    def refresh_high_watermark(self, key: tuple[str, int], now_ns: int) -> list[Effect]:
        return self._refresh_watch(key, self.watches.setdefault(key, PartitionWatch()), now_ns)

    def _refresh_watch(self, key: tuple[str, int], watch: PartitionWatch, now_ns: int,
                       wait: bool = True) -> list[Effect]:
        if watch.correlation or now_ns - watch.sent_ns < self.limits.share_high_watermark_refresh_ms * MS:
            return []
        endpoint = self.leader_endpoint(*key, now_ns)
        if not endpoint:
            return self.refresh_leaders(key[0], now_ns)
        watch.sent_ns = now_ns
        known = watch.high_watermark
        metadata = self.topics.get(key[0])
        request = ListOffsetsRequest(correlation_id=0, topic=key[0], partition=key[1], timestamp_ms=-1,
                                     topic_id=metadata.topic_id if metadata is not None else 0,
                                     wait_past_offset=known,
                                     max_wait_ms=self._high_watermark_wait_ms() if known >= 0 and wait else 0)
        send = self.send_request("list-offsets", key, endpoint, request, now_ns)
        watch.correlation = send.message.correlation_id
        return [send]

    def _high_watermark_wait_ms(self) -> int:
        return min(HIGH_WATERMARK_WAIT_MS, self.limits.share_request_timeout_ms // 2)

    def high_watermark_refused(self, key: tuple[str, int], now_ns: int) -> list[Effect]:
        """The leader refused a ListOffsets (or never answered): find out where the leader is now."""
        self.watches[key].correlation = 0
        self.forget_leader(*key)
        return self.refresh_leaders(key[0], now_ns)

    def observe_high_watermark(self, key: tuple[str, int], response: ListOffsetsResponse) -> bool:
        """Note the log bounds a leader answered; True if either bound moved forward."""
        watch = self.watches[key]
        watch.correlation = 0
        grew = response.high_watermark > watch.high_watermark or response.log_start_offset > watch.log_start_offset
        watch.high_watermark, watch.log_start_offset = response.high_watermark, response.log_start_offset
        return grew

    # ------------------------------------------------------------------ requests in flight

    def send_request(self, kind: str, key: Any, endpoint: str, message: Any, now_ns: int) -> Send:
        self.correlation += 1
        message = msgspec.structs.replace(message, correlation_id=self.correlation)
        deadline = now_ns + self.limits.share_request_timeout_ms * MS
        self.pending[self.correlation] = Outbound(kind, key, endpoint, deadline)
        self.pending_floor_ns = lowered(self.pending_floor_ns, deadline, now_ns)
        return Send(endpoint, message)

    def answered(self, correlation: int, response: Any) -> Outbound | None:
        """The request `response` answers, no longer pending; None if there is none (a late answer)."""
        outbound = self.pending.pop(correlation, None)
        if outbound is not None and outbound.endpoint in self.controllers:
            # Metadata, producer ids, dead-letter topics: whatever went to a controller follows a
            # NOT_CONTROLLER hint, and a voter that did not answer is passed over for the next.
            if not self.controllers.take(response) and getattr(response, "error", 0) == ErrorCode.REQUEST_TIMED_OUT:
                self.controllers.rotate()
        if outbound is not None and outbound.kind == "metadata":
            self.metadata_correlation = 0
            if not isinstance(response, MetadataResponse):
                self.metadata_wanted.add("")  # asked again when the interval allows
        return outbound

    def overdue(self, now_ns: int) -> list[int]:
        """The requests whose deadline has passed."""
        return [correlation for correlation, outbound in self.pending.items() if outbound.deadline_ns <= now_ns]

    def disconnected(self, endpoint: str, now_ns: int) -> list[int]:
        """A peer's process is gone: distrust it for a while; the requests whose answers will never come."""
        if endpoint not in self.controllers:
            self.unreachable[endpoint] = now_ns + self.limits.share_request_timeout_ms * MS
        return [correlation for correlation, outbound in self.pending.items() if outbound.endpoint == endpoint]
