"""The user-thread side of group membership: callbacks, commits and auto-commit.

Kafka runs rebalance callbacks and auto-commits inside `poll()`, in the caller's thread, and so
does railmq: the membership state machine (actors/consumer_member.py, in the I/O thread) asks for
a revocation with a notification; the next `poll` (which returns early when one is waiting)
commits the revoked partitions' positions if auto-commit is on, calls `on_revoke` (or `on_lost`
when the membership was lost and committing is no longer possible), and answers "revoked".

Delivery semantics follow from when positions are committed: auto-commit commits what earlier
polls returned, so a record is committed only after the poll that follows its processing
(at-least-once); committing before processing gives at-most-once. That is why the auto-commit
runs as a poll starts (Kafka's `maybeAutoCommitOffsetsAsync`), with the positions earlier polls
left: committed after the poll gathered its records, the positions already counted those records,
and a member killed while processing them left them committed and never delivered again.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

from actors.consumer_member import ConsumerMember, GroupSettings
from actors.errors import ErrorCode, RailmqError
from actors.messages import ClientCommand
from railmq.records import TopicPartition

if TYPE_CHECKING:
    from railmq.consumer import Consumer

GROUP_OPTIONS = {"group_instance_id", "assignor", "session_timeout_ms", "heartbeat_interval_ms",
                 "max_poll_interval_ms", "enable_auto_commit", "auto_commit_interval_ms", "metadata_refresh_ms"}

COMMIT_RETRY_S = 0.1  # between tries of a commit refused BUSY


class GroupShell:
    def __init__(self, consumer: "Consumer", settings: GroupSettings, auto_commit: bool, auto_commit_interval_ms: int) -> None:
        self.consumer = consumer
        self.settings = settings
        self.auto_commit = auto_commit
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000
        self.last_auto_commit = time.monotonic()
        self.callbacks: deque = deque()
        self.on_assign: Callable[[list[TopicPartition]], None] | None = None
        self.on_revoke: Callable[[list[TopicPartition]], None] | None = None
        self.on_lost: Callable[[list[TopicPartition]], None] | None = None
        self.generation = -1
        self.member_id = ""
        self.subscribed = False
        # The positions as the last poll started: what earlier polls returned, which the user had
        # handled by then (the last poll's own records may not all be).
        self.handled_positions: dict[TopicPartition, int] = {}

    # ------------------------------------------------------------------ engine thread (under consumer._ready)

    def on_notify(self, kind: str, payload: Any) -> None:
        consumer = self.consumer
        if kind == "revoke":
            partitions, lost = payload
            self.callbacks.append(("revoke", [TopicPartition(*tp) for tp in partitions], lost))
        elif kind == "assigned":
            generation, member_id, owned, added = payload
            owned_tps = [TopicPartition(*tp) for tp in owned]
            added_tps = [TopicPartition(*tp) for tp in added]
            self.generation, self.member_id = generation, member_id
            consumer._assignment = owned_tps
            fresh = set(added_tps)
            consumer._chunks = deque(c for c in consumer._chunks
                                     if TopicPartition(c[0], c[1]) in set(owned_tps) and TopicPartition(c[0], c[1]) not in fresh)
            for tp in list(consumer._positions):
                if tp not in owned_tps or tp in fresh:
                    del consumer._positions[tp]
            for tp in list(consumer._corrupt):
                if tp not in owned_tps or tp in fresh:
                    del consumer._corrupt[tp]
            for tp in list(consumer._set_aside):
                if tp not in owned_tps or tp in fresh:
                    del consumer._set_aside[tp]
            for tp in added_tps:
                consumer._sessions[tp] = (0, 0)
            if consumer._current_key is not None and consumer._current_key[0] not in owned_tps:
                consumer._current, consumer._current_key = [], None
            self.callbacks.append(("assign", added_tps, False))
        elif kind == "fatal":
            consumer._errors.append(payload)

    def needs_attention(self) -> bool:
        return bool(self.callbacks)

    # ------------------------------------------------------------------ user thread

    def start_poll(self) -> None:
        """Once, as a poll starts: every record earlier polls returned is processed now, and
        none of this poll's is gathered yet."""
        if self.auto_commit:
            self.handled_positions = self.current_offsets()
        if self.auto_commit and time.monotonic() - self.last_auto_commit >= self.auto_commit_interval_s:
            self.last_auto_commit = time.monotonic()
            self._commit_quietly(None, asynchronous=True)

    def before_poll(self) -> None:
        self.consumer._engine.submit(ClientCommand(command="polled"))
        while self.callbacks:
            kind, partitions, lost = self.callbacks.popleft()
            if kind == "assign":
                if self.on_assign is not None:
                    self.on_assign(partitions)
                continue
            if not lost and self.auto_commit:
                self._commit_quietly(partitions)
            callback = self.on_lost if lost and self.on_lost is not None else self.on_revoke
            if callback is not None:
                callback(partitions)
            with self.consumer._ready:
                for tp in partitions:
                    self.consumer._positions.pop(tp, None)
            self.consumer._engine.submit(ClientCommand(command="revoked"))

    def _commit_quietly(self, partitions: list[TopicPartition] | None, asynchronous: bool = False) -> None:
        self._commit_quietly_offsets(self.current_offsets(partitions), asynchronous)

    def _commit_quietly_offsets(self, offsets: dict[TopicPartition, int], asynchronous: bool = False) -> None:
        try:
            self.commit(offsets, asynchronous=asynchronous)
        except RailmqError:
            pass  # a failed auto-commit only means more redelivery; the next one covers it

    def current_offsets(self, partitions: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        consumer = self.consumer
        with consumer._ready:
            wanted = list(partitions) if partitions is not None else list(consumer._assignment)
            return {tp: consumer._positions[tp] for tp in wanted if tp in consumer._positions}

    def commit(self, offsets: dict[TopicPartition, int] | None, *, metadata: str = "", asynchronous: bool = False) -> Any:
        if offsets is None:
            offsets = self.current_offsets()
        if not offsets:
            return None
        entries = [[tp.topic, tp.partition, int(offset), metadata] for tp, offset in sorted(offsets.items())]
        if asynchronous:
            self.consumer._command("commit", token=0, offsets=entries)
            return None
        results = self._commit_until_taken(entries)
        failed = [entry for entry in results or [] if entry.error]
        if failed:
            raise RailmqError(failed[0].error, f"commit refused for {failed[0].topic}/{failed[0].partition}")
        return results

    def _commit_until_taken(self, entries: list) -> Any:
        """A commit a busy group quorum refused (BUSY: its log is full of uncommitted writes,
        actors/group_quorum.py) is asked again until the request timeout, as Kafka's commitSync
        retries a retriable error; any other error is the caller's at once."""
        deadline = time.monotonic() + self.consumer.request_timeout_s
        while True:
            try:
                return self.consumer.call("commit", offsets=entries)
            except RailmqError as error:
                if error.code != ErrorCode.BUSY or time.monotonic() > deadline:
                    raise
                time.sleep(COMMIT_RETRY_S)

    def committed(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        entries = self.consumer.call("committed", partitions=[list(tp) for tp in partitions])
        return {TopicPartition(e.topic, e.partition): (e.offset if e.offset >= 0 else None) for e in entries}

    def subscribe(self, topics: list[str] | None, pattern: str | None, on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        self.on_assign, self.on_revoke, self.on_lost = on_assign, on_revoke, on_lost
        self.subscribed = True
        self.consumer._command("subscribe", topics=topics or [], pattern=pattern)

    def close(self, handled_all: bool = True) -> None:
        """Leave the group; with auto-commit, commit first: every position, or (`handled_all`
        False: a `with` block left by an exception, maybe raised by the handler amid the last
        poll's records) only what earlier polls returned. Committing every position there
        committed the records after the one that failed, and no one handled them."""
        if self.auto_commit and self.subscribed:
            if handled_all:
                self._commit_quietly(None)
            else:
                current = self.current_offsets()  # never past it (a seek back since), never another's
                self._commit_quietly_offsets({tp: min(offset, current[tp]) for tp, offset
                                              in self.handled_positions.items() if tp in current})
        try:
            self.consumer.call("leave", timeout=2.0, reason="the consumer closed")
        except RailmqError:
            pass


def attach_group(consumer: "Consumer", actor: Any, group_id: str, options: dict[str, Any]) -> GroupShell:
    unknown = set(options) - GROUP_OPTIONS
    if unknown:
        raise TypeError(f"unknown consumer options: {', '.join(sorted(unknown))}")
    auto_commit = bool(options.pop("enable_auto_commit", True))
    interval = int(options.pop("auto_commit_interval_ms", 5000))
    settings = GroupSettings(group_id=group_id, client_id=actor.name, **options)
    if settings.heartbeat_interval_ms >= settings.session_timeout_ms:
        raise ValueError("heartbeat_interval_ms must be smaller than session_timeout_ms")
    actor.member = ConsumerMember(actor, settings)
    return GroupShell(consumer, settings, auto_commit, interval)


def not_in_group() -> RailmqError:
    return RailmqError(ErrorCode.INVALID_REQUEST, "this consumer has no group_id")
