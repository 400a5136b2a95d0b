"""`Consumer`: read records from partitions you assign, or (with `group_id`) that a group gives you.

The consumer pulls. A background I/O thread (transport/client_engine.py) runs the fetch logic
(actors/consumer_client.py), keeping one long-poll fetch in flight per partition and at most
`buffer_bytes_max` fetched bytes waiting; `poll` decodes and returns records from that buffer in
offset order per partition, and advances the consumed position.

Positions: `position(tp)` is the offset of the next record `poll` will return for `tp`. After
`seek`, data fetched before the seek is discarded (each seek opens a new fetch session). A
paused partition keeps what was fetched for it: `poll` returns it, in order, once it is resumed.

`poll(timeout_ms)` waits up to `timeout_ms` for the first record, whatever happens meanwhile: a
group member joining, being assigned partitions or giving some up runs its callbacks inside the
same call and keeps waiting (Kafka's poll does the same), so a first poll on a new member returns
records as soon as the group has handed it partitions that hold some.

An unreadable batch (bad header, CRC or records) is never skipped silently nor fetched in a
loop: the partition stops at the batch and every `poll` raises `CorruptBatchError` (offset and
all) until the user moves past it with `skip_corrupt_batch(error)` or `seek`; the records of
every batch before it are returned first.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from typing import Any, Iterable

from actors.consumer_client import EARLIEST, LATEST, ConsumerClient, ConsumerSettings
from actors.errors import ErrorCode, RailmqError
from actors.messages import ClientCommand
from railmq.client_shell import ClientShell
from railmq.records import (ConsumerRecord, CorruptBatchError, TopicPartition, checked_int64, checked_offsets,
                            decode_fetched_prefix, integer, partition_of, topic_names)
from transport.client_engine import ClientEngine

Session = tuple[int, int]


class Consumer(ClientShell):
    _client_noun = "consumer"

    def __init__(self, bootstrap: str, *, group_id: str | None = None, auto_offset_reset: str = "latest",
                 fetch_max_wait_ms: int = 500, fetch_min_bytes: int = 1,
                 fetch_partition_bytes_max: int = 4 * 1024 * 1024,
                 buffer_bytes_max: int = 64 * 1024 * 1024, max_poll_records: int = 500,
                 check_crcs: bool = True, request_timeout_ms: int = 30_000, client_id: str = "consumer",
                 shared_memory: bool = False, **group_options: Any) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(f"auto_offset_reset must be earliest, latest or none, not {auto_offset_reset!r}")
        if max_poll_records <= 0:
            raise ValueError("max_poll_records must be positive")
        if fetch_min_bytes < 0 or fetch_max_wait_ms < 0:
            raise ValueError("fetch_min_bytes and fetch_max_wait_ms must not be negative")
        super().__init__(request_timeout_ms)
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.max_poll_records = max_poll_records
        self.check_crcs = check_crcs
        self._chunks: deque = deque()
        self._current: list[ConsumerRecord] = []
        self._current_index = 0
        self._current_key: tuple[TopicPartition, Session] | None = None
        self._positions: dict[TopicPartition, int] = {}
        self._sessions: dict[TopicPartition, Session] = {}
        self._assignment: list[TopicPartition] = []
        self._paused: set[TopicPartition] = set()
        self._corrupt: dict[TopicPartition, CorruptBatchError] = {}  # held at an unreadable batch
        # Records of a partition paused after they were fetched: the fetch position is past them,
        # so they wait here (and its later chunks in `_chunks`) until it is resumed.
        self._set_aside: dict[TopicPartition, tuple[Session, list[ConsumerRecord], int]] = {}
        self._seek_epoch = 0
        settings = ConsumerSettings(auto_offset_reset=auto_offset_reset, fetch_max_wait_ms=fetch_max_wait_ms,
                                    fetch_min_bytes=fetch_min_bytes, fetch_partition_bytes_max=fetch_partition_bytes_max,
                                    buffer_bytes_max=buffer_bytes_max, request_timeout_ms=request_timeout_ms)
        self._actor = ConsumerClient(bootstrap=bootstrap, settings=settings, name=client_id)
        self._group = None
        if group_id is not None:
            from railmq.group_consumer import attach_group

            self._group = attach_group(self, self._actor, group_id, group_options)
        elif group_options:
            raise TypeError(f"group options need a group_id: {sorted(group_options)}")
        links = None
        if shared_memory:
            # Fetched records come through a shared-memory ring when the leader is on this host
            # (transport/ring_link.py); copied out at once, since records outlive the I/O step.
            # Off by default: that copy costs more than the socket path saves (bench.ring measures
            # consumer fetches at ~0.9x with the ring); followers, which append straight from the
            # ring, gain (~1.2x) and use it by default.
            from transport.ring_link import RingLinks

            links = RingLinks(actor_id=f"{client_id}-{uuid.uuid4().hex[:12]}", zero_copy=False, counters={},
                              capacity_bytes=2 * fetch_partition_bytes_max + 4096)
        self._engine = ClientEngine(self._actor, name=client_id, on_notify=self._on_notify, ring_links=links)
        self._engine.start()

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[Any]) -> None:
        if self._group is not None:
            raise RailmqError(ErrorCode.INVALID_REQUEST, "a group member gets its partitions from the group")
        self._set_assignment([partition_of(tp) for tp in partitions])

    def _set_assignment(self, partitions: list[TopicPartition]) -> None:
        with self._ready:
            self._seek_epoch += 1
            epoch = self._seek_epoch
            added = [tp for tp in partitions if tp not in self._assignment]
            self._assignment = list(partitions)
            for tp in list(self._positions):
                if tp not in partitions:
                    del self._positions[tp]
            for tp in list(self._sessions):
                if tp not in partitions:
                    del self._sessions[tp]
            for tp in added:
                self._sessions[tp] = (epoch, 0)
            self._paused &= set(partitions)
            for tp in [tp for tp in self._corrupt if tp not in partitions]:
                del self._corrupt[tp]
            for tp in [tp for tp in self._set_aside if tp not in partitions or tp in added]:
                del self._set_aside[tp]
        self._command("assign", partitions=[list(tp) for tp in partitions], epoch=epoch)

    def assignment(self) -> list[TopicPartition]:
        return list(self._assignment)

    # ------------------------------------------------------------------ groups

    def subscribe(self, topics: Iterable[str] | None = None, *, pattern: str | None = None,
                  on_assign: Any = None, on_revoke: Any = None, on_lost: Any = None) -> None:
        """Join the consumer's group for these topics (or every topic matching `pattern`).

        Callbacks run inside `poll`, in this thread: `on_revoke(partitions)` before partitions
        move away (commit there to avoid redelivery), `on_assign(partitions)` after new ones
        arrive, `on_lost(partitions)` when membership was lost and committing is impossible.
        """
        group = self._require_group()
        if (topics is None) == (pattern is None):
            raise ValueError("subscribe to a list of topics or to a pattern, not both or neither")
        names = topic_names(topics) if topics is not None else None
        group.subscribe(names, pattern, on_assign, on_revoke, on_lost)

    def commit(self, offsets: dict[Any, int] | None = None, *, metadata: str = "") -> None:
        """Commit (synchronously) the given next-offsets, or the current positions of every
        assigned partition. Raises ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID if this member was
        fenced: its partitions belong to someone else now."""
        checked = checked_offsets(offsets)
        self._require_group().commit(checked, metadata=metadata)

    def commit_async(self, offsets: dict[Any, int] | None = None, *, metadata: str = "") -> None:
        checked = checked_offsets(offsets)
        self._require_group().commit(checked, metadata=metadata, asynchronous=True)

    def committed(self, partitions: Iterable[Any]) -> dict[TopicPartition, int | None]:
        return self._require_group().committed([partition_of(p) for p in partitions])

    def member_id(self) -> str:
        return self._require_group().member_id

    def generation(self) -> int:
        return self._require_group().generation

    def _require_group(self) -> Any:
        if self._group is None:
            raise RailmqError(ErrorCode.INVALID_REQUEST, "this consumer has no group_id")
        return self._group

    # ------------------------------------------------------------------ positions

    def seek(self, partition: Any, offset: int) -> None:
        tp = partition_of(partition)
        self._require_assigned(tp)
        offset = checked_int64(offset, "offsets")
        epoch = self._next_seek_epoch(tp)
        with self._ready:
            self._positions[tp] = offset
        self._command("seek", topic=tp.topic, partition=tp.partition, offset=offset, epoch=epoch)

    def skip_corrupt_batch(self, corrupt: CorruptBatchError | Any) -> int:
        """Move past the unreadable batch `poll` raised for (`corrupt.topic`, `corrupt.partition`),
        or for the partition given; returns the new position. The records of that batch are not
        read: skipping is the user's decision, which is why it is never made for them."""
        tp = corrupt.topic_partition if isinstance(corrupt, CorruptBatchError) else partition_of(corrupt)
        with self._ready:
            error = self._corrupt.get(tp)
        if error is None:
            raise RailmqError(ErrorCode.INVALID_REQUEST, f"{tp.topic}/{tp.partition} is not held at an unreadable batch")
        if error.next_offset is None:
            raise RailmqError(ErrorCode.CORRUPT_MESSAGE,
                              f"{tp.topic}/{tp.partition}: the header of the batch at offset {error.offset} is "
                              "unreadable, so where the next batch starts is unknown; seek to an offset you choose")
        self.seek(tp, error.next_offset)
        return error.next_offset

    def seek_to_beginning(self, partitions: Iterable[Any] | None = None) -> None:
        self._seek_reset(partitions, EARLIEST)

    def seek_to_end(self, partitions: Iterable[Any] | None = None) -> None:
        self._seek_reset(partitions, LATEST)

    def _seek_reset(self, partitions: Iterable[Any] | None, timestamp: int) -> None:
        for tp in [partition_of(p) for p in partitions] if partitions is not None else list(self._assignment):
            self._require_assigned(tp)
            epoch = self._next_seek_epoch(tp)
            with self._ready:
                self._positions.pop(tp, None)
            self._command("reset", topic=tp.topic, partition=tp.partition, timestamp=timestamp, epoch=epoch)

    def _next_seek_epoch(self, tp: TopicPartition) -> int:
        with self._ready:
            self._corrupt.pop(tp, None)  # a new session refetches from wherever the seek goes
            self._set_aside.pop(tp, None)
            self._seek_epoch += 1
            self._sessions[tp] = (self._seek_epoch, 0)
            return self._seek_epoch

    def position(self, partition: Any, timeout: float | None = None) -> int:
        """The offset of the next record `poll` returns for this partition (waits for a reset)."""
        tp = partition_of(partition)
        self._require_assigned(tp)
        with self._ready:
            self._wait_until(lambda: tp in self._positions, timeout, f"the position of {tp} is not known yet")
            return self._positions[tp]

    def positions(self) -> dict[TopicPartition, int]:
        """The known position of every assigned partition, without waiting (a partition whose
        starting offset is still being looked up is absent)."""
        with self._ready:
            return {tp: self._positions[tp] for tp in self._assignment if tp in self._positions}

    def _require_assigned(self, tp: TopicPartition) -> None:
        if tp not in self._assignment:
            raise RailmqError(ErrorCode.INVALID_REQUEST, f"{tp.topic}/{tp.partition} is not assigned to this consumer")

    def offsets_for_times(self, timestamps: dict[Any, int]) -> dict[TopicPartition, tuple[int, int] | None]:
        """For each partition, the earliest (offset, timestamp_ms) at or after the time, or None."""
        out: dict[TopicPartition, tuple[int, int] | None] = {}
        for partition, timestamp in timestamps.items():
            tp = partition_of(partition)
            offset, found = self._list_offsets(tp, checked_int64(timestamp, "timestamps"))
            out[tp] = None if found < 0 else (offset, found)
        return out

    def beginning_offsets(self, partitions: Iterable[Any]) -> dict[TopicPartition, int]:
        return {partition_of(p): self._list_offsets(partition_of(p), EARLIEST)[0] for p in partitions}

    def end_offsets(self, partitions: Iterable[Any]) -> dict[TopicPartition, int]:
        """The high watermark of each partition: the offset the next visible record will get."""
        return {partition_of(p): self._list_offsets(partition_of(p), LATEST)[0] for p in partitions}

    def _list_offsets(self, tp: TopicPartition, timestamp: int) -> tuple[int, int]:
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            try:
                return self.call("list-offsets", topic=tp.topic, partition=tp.partition, timestamp=timestamp)
            except RailmqError as error:
                if not error.retriable or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    # ------------------------------------------------------------------ pause / resume

    def pause(self, partitions: Iterable[Any]) -> None:
        """Stop returning records of these assigned partitions until resumed. A partition not
        assigned is refused, as Kafka's pause does: kept, it stayed paused when assigned later."""
        tps = self._assigned(partitions)
        self._paused |= set(tps)
        self._command("pause", partitions=[list(tp) for tp in tps])

    def resume(self, partitions: Iterable[Any]) -> None:
        tps = self._assigned(partitions)
        self._paused -= set(tps)
        self._command("resume", partitions=[list(tp) for tp in tps])

    def _assigned(self, partitions: Iterable[Any]) -> list[TopicPartition]:
        tps = [partition_of(p) for p in partitions]
        for tp in tps:
            self._require_assigned(tp)
        return tps

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    # ------------------------------------------------------------------ polling

    def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[ConsumerRecord]:
        """Return up to `max_records` records, waiting up to `timeout_ms` for the first (group
        callbacks run meanwhile, in this thread, and do not end the wait)."""
        self._check_usable()
        limit = self.max_poll_records if max_records is None else integer(max_records, "max_records values")
        if limit <= 0:  # 0 meant max_poll_records, and a negative count returned [] at once
            raise ValueError(f"max_records must be positive, got {max_records}")
        deadline = time.monotonic() + timeout_ms / 1000
        out: list[ConsumerRecord] = []
        consumed = 0
        if self._group is not None:
            self._group.start_poll()  # auto-commit: what earlier polls returned, never this one's
        try:
            while True:
                if self._group is not None:
                    self._group.before_poll()  # rebalance callbacks, outside the lock
                with self._ready:
                    consumed += self._gather(out, limit, deadline)
                attention = self._group is not None and self._group.needs_attention()
                if out or not attention or time.monotonic() >= deadline:
                    break
        finally:
            if consumed:
                self._engine.submit(ClientCommand(command="consumed", arguments={"bytes": consumed}))
        return out

    def _gather(self, out: list[ConsumerRecord], limit: int, deadline: float) -> int:
        """Fill `out` from the buffer until `limit`, the deadline, or a group callback waiting
        (then the caller runs it); returns the fetched bytes it used up. Holding `_ready`."""
        consumed = 0
        while len(out) < limit:
            self._raise_errors()
            if self._take_current(out, limit):
                continue
            if not out:
                self._raise_corrupt()
            if self._take_set_aside():
                continue
            chunk = self._next_chunk()
            if chunk is not None:
                consumed += self._open_chunk(chunk)
                continue
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                break
            self._ready.wait(min(remaining, 0.1))
            if self._group is not None and self._group.needs_attention():
                break
        return consumed

    def _raise_corrupt(self) -> None:
        """Raise the error of a partition held at an unreadable batch once its good records are
        all returned; it stays, and is raised again, until a seek moves the partition."""
        for tp, error in self._corrupt.items():
            if tp in self._assignment and tp not in self._paused:
                raise error

    def _take_current(self, out: list[ConsumerRecord], limit: int) -> bool:
        if self._current_key is None:
            return False
        tp, session = self._current_key
        if self._sessions.get(tp, (0, 0)) > session or tp not in self._positions:
            self._current, self._current_key = [], None
            return True
        if tp in self._paused:  # kept for when it is resumed: the fetch position is past these records
            self._set_aside[tp] = (session, self._current, self._current_index)
            self._current, self._current_key = [], None
            return True
        start = self._current_index
        take = self._current[start: start + (limit - len(out))]
        out.extend(take)
        self._current_index += len(take)
        if take:
            self._positions[tp] = take[-1].offset + 1
        if self._current_index >= len(self._current):
            self._current, self._current_key = [], None
        return bool(take) or self._current_key is None

    def _take_set_aside(self) -> bool:
        """Make the set-aside records of a resumed partition the current ones, if they still
        continue its position (a seek or a new assignment since voids them)."""
        for tp in [tp for tp in self._set_aside if tp not in self._paused]:
            session, records, index = self._set_aside.pop(tp)
            if session == self._sessions.get(tp) and tp in self._assignment and \
                    self._positions.get(tp) == records[index].offset:
                self._current, self._current_index, self._current_key = records, index, (tp, session)
                return True
        return False

    def _next_chunk(self) -> tuple | None:
        """The first fetched chunk of a partition that is neither paused nor has records set aside
        (those stay, in order, until it is resumed)."""
        for index, chunk in enumerate(self._chunks):
            tp = TopicPartition(chunk[0], chunk[1])
            if tp not in self._paused and tp not in self._set_aside:
                del self._chunks[index]
                return chunk
        return None

    def _open_chunk(self, chunk: tuple) -> int:
        """Make a fetched chunk the current records; its last slot is the high watermark, or the
        `CorruptBatchError` of an unreadable header the I/O thread met after its batches; then the
        id of the topic the records were fetched from."""
        topic, partition, session, records, after, topic_id = chunk
        tp = TopicPartition(topic, partition)
        known = self._sessions.get(tp, (0, 0))
        if session < known or tp not in self._positions or tp not in self._assignment or tp in self._corrupt:
            return len(records)
        self._sessions[tp] = session
        decoded, corrupt = decode_fetched_prefix(topic, partition, records, self._positions[tp],
                                                 check_crcs=self.check_crcs, topic_id=topic_id)
        if corrupt is None and isinstance(after, CorruptBatchError):
            corrupt = after
        if corrupt is not None:
            self._corrupt[tp] = corrupt
            self._engine.submit(ClientCommand(command="hold", arguments={
                "topic": topic, "partition": partition, "session": list(session)}))
        if decoded:
            self._current, self._current_index, self._current_key = decoded, 0, (tp, session)
        return len(records)

    # ------------------------------------------------------------------ the engine thread (under _ready)

    def _handle_notice(self, kind: str, payload: Any) -> None:
        if kind == "records":
            self._chunks.append(payload)
        elif kind == "unreadable":
            topic, partition, session, offset, reason = payload
            self._chunks.append((topic, partition, session, b"",
                                 CorruptBatchError(topic, partition, offset, None, reason), 0))
        elif kind == "position":
            topic, partition, session, offset = payload
            tp = TopicPartition(topic, partition)
            if session >= self._sessions.get(tp, (0, 0)):
                self._sessions[tp] = session
                self._positions[tp] = offset
        elif kind == "partition-error":
            self._errors.append(payload[2])
        elif kind == "metadata":
            pass  # the I/O thread keeps the metadata it needs; nothing here depends on it
        elif self._group is not None:
            self._group.on_notify(kind, payload)

    def close(self, *, handled_all: bool = True) -> None:
        """Leave the group (with auto-commit, committing the positions first) and stop.
        `handled_all=False` says the last poll's records may not all be handled (the handler
        failed): auto-commit then commits only what earlier polls returned."""
        if self._closed:
            return
        try:
            if self._group is not None:
                self._group.close(handled_all)
        finally:
            self._closed = True
            self._engine.stop()

    def __exit__(self, exc_type: Any, *rest: object) -> None:
        self.close(handled_all=exc_type is None)  # an exception may have come from the handler
