"""How a partition replica answers fetches and offset lookups: checks, long polls, reads.

A mixin of `PartitionReplica` (actors/partition_replica.py), kept apart because serving reads has
its own rules:
- a request is answered only for this replica's own (topic, topic id, partition): anything else
  gets NOT_LEADER ("this process serves another partition: refresh metadata") or UNKNOWN_TOPIC_ID
  (the same name, another incarnation of the topic), never this partition's data;
- consumers see offsets below the high watermark only; followers see up to the log end, and a
  follower fetch must carry the cluster's authentication tag (transport/auth.py) — it moves the
  high watermark, so a client must not be able to pose as one;
- a fetch with nothing to return waits (the purgatory) until data arrives or its `max_wait_ms`
  ends: clients' waits `purgatory_fetch_max` deep, and one seat per follower besides, so clients
  filling it cannot turn replication into polling;
- a read that meets a range failing its CRC answers STORAGE_ERROR and records the damage
  (actors/replica_health.py), which the coordinator hears of at once.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Callable

from actors.actor import MS
from actors.effects import Effect, Send, SetTimer
from actors.errors import ErrorCode
from actors.messages import EpochEndOffset, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from storage.errors import CorruptLog, OffsetOutOfRange

LATEST, EARLIEST = -1, -2


class ParkedFetch:
    """A fetch waiting for data, or a ListOffsets(latest) waiting for the high watermark to pass
    its `wait_past_offset` (`replica` is -1 for both a consumer's fetch and a ListOffsets)."""

    __slots__ = ("sender", "request", "deadline_ns", "replica")

    def __init__(self, sender: Any, request: FetchRequest | ListOffsetsRequest, deadline_ns: int) -> None:
        self.sender = sender
        self.request = request
        self.deadline_ns = deadline_ns
        self.replica = request.replica if isinstance(request, FetchRequest) else -1


class BatchWalk:
    """Whole batches in log order, each as its next offset and the bytes of the walk up to its end:
    what `min_bytes` are there from any offset the walk covers, read off it without walking again."""

    __slots__ = ("next_offsets", "totals", "complete")

    def __init__(self) -> None:
        self.next_offsets: list[int] = []
        self.totals: list[int] = []
        self.complete = True  # False: cut short before the end it was walking to

    def add(self, next_offset: int, size: int) -> None:
        self.next_offsets.append(next_offset)
        self.totals.append((self.totals[-1] if self.totals else 0) + size)

    def ready(self, offset: int, enough: int, batches_max: int) -> bool:
        """`enough` bytes of whole batches from the one holding `offset`, or `batches_max` batches;
        a walk cut short before them cannot tell, and so does not keep the fetch waiting."""
        first = bisect_right(self.next_offsets, offset)  # the batch holding `offset`
        batches = len(self.next_offsets) - first
        counted = (self.totals[-1] if self.totals else 0) - (self.totals[first - 1] if first else 0)
        return counted >= enough or batches >= batches_max or not self.complete


class FetchServing:
    # ------------------------------------------------------------------ who the request is for

    def misdirected(self, request: Any) -> tuple[ErrorCode, str] | None:
        """(error, sentence) when a request names another partition than this replica's."""
        if request.topic != self.topic or request.partition != self.partition:
            return ErrorCode.NOT_LEADER, (
                f"this process serves {self.topic}/{self.partition}, not {request.topic}/{request.partition}: "
                "refresh metadata")
        topic_id = getattr(request, "topic_id", 0)
        if topic_id and topic_id != self.topic_id:
            return ErrorCode.UNKNOWN_TOPIC_ID, (
                f"topic {self.topic!r} here has id {self.topic_id:x}, not {topic_id:x} (it was deleted and "
                "created again): refresh metadata")
        return None

    # ------------------------------------------------------------------ fetch

    def _on_fetch(self, request: FetchRequest, sender: Any, now_ns: int) -> list[Effect]:
        problem = self._check_fetch(request, now_ns)
        if problem is not None:
            return [Send(sender, problem)]
        effects: list[Effect] = []
        if request.replica >= 0:
            diverging = self._diverging(request)
            if diverging is not None:
                return [Send(sender, self._fetch_response(request, diverging=diverging))]
            self.leader.on_follower_fetch(request, now_ns)
            effects = self.leader.after_log_growth(now_ns) + self.leader.expand_isr_if_caught_up(request.replica, now_ns)
        if self._has_data(request) or request.max_wait_ms <= 0:
            return effects + [Send(sender, self._read(request))]
        if request.replica >= 0:
            # One seat per follower, outside the clients' bound: a follower that asks again (it
            # gave up, or a copy arrived) replaces its older wait, whose answer it would ignore.
            self.parked = [parked for parked in self.parked if parked.replica != request.replica]
        elif self._clients_parked() >= self.limits.purgatory_fetch_max:
            return effects + [Send(sender, self._fetch_error(request, ErrorCode.BUSY, "too many waiting fetches"))]
        return effects + self._park(sender, request, now_ns)

    def _clients_parked(self) -> int:
        """Parked consumer fetches and ListOffsets long polls: what `purgatory_fetch_max` bounds."""
        return sum(1 for parked in self.parked if parked.replica < 0)

    def _park(self, sender: Any, request: FetchRequest | ListOffsetsRequest, now_ns: int) -> list[Effect]:
        wait_ms = min(request.max_wait_ms, self.limits.fetch_wait_max_ms)
        self.parked.append(ParkedFetch(sender, request, now_ns + wait_ms * MS))
        return [SetTimer("fetch-expiry", min(parked.deadline_ns for parked in self.parked))]

    def _check_fetch(self, request: FetchRequest, now_ns: int) -> FetchResponse | None:
        misdirected = self.misdirected(request)
        if misdirected is not None:
            return self._fetch_error(request, *misdirected)
        if self.leader is None:
            return self._fetch_error(request, ErrorCode.NOT_LEADER, self._not_leader_text())
        epoch = self.leader.epoch
        if request.leader_epoch >= 0 and request.leader_epoch < epoch:
            return self._fetch_error(request, ErrorCode.FENCED_LEADER_EPOCH,
                                     f"epoch {request.leader_epoch} is older than the leader's {epoch}")
        if request.leader_epoch > epoch:
            return self._fetch_error(request, ErrorCode.UNKNOWN_LEADER_EPOCH,
                                     f"epoch {request.leader_epoch} is newer than this leader's {epoch}")
        if request.max_bytes <= 0 or request.max_wait_ms < 0 or request.min_bytes < 0:
            return self._fetch_error(request, ErrorCode.INVALID_REQUEST,
                                     "max_bytes must be positive, max_wait_ms and min_bytes not negative")
        if request.replica >= 0:
            if request.replica not in self.state.replicas or request.replica == self.node:
                return self._fetch_error(request, ErrorCode.INVALID_REQUEST,
                                         f"node {request.replica} is not a follower of this partition")
            recorded = self._isr_incarnation(request.replica)
            if recorded and request.incarnation != recorded:
                return self._fetch_error(request, ErrorCode.STALE_BROKER_EPOCH, (
                    f"node {request.replica} is in the ISR as process {recorded:x}, not {request.incarnation:x}: "
                    "a replaced process's fetches do not count"))
            # Below the log start whatever its epoch, as Kafka's Partition.readRecords rules: retention
            # may have taken every epoch entry up to the follower's last one, and the diverging
            # epoch (-1) then answered told it to truncate to its own start, below what it had seen
            # committed; it refused, and asked again every second for ever. Out of range, it starts
            # again at this log start (FollowerRole._reset_past_leader_start).
            if request.offset < self.log.log_start_offset:
                return self._out_of_range(request)
            return None
        if not self.log.log_start_offset <= request.offset <= self.log.log_end_offset:
            return self._out_of_range(request)
        return None

    def _isr_incarnation(self, node: int) -> int:
        """The process of ISR member `node` the coordinator recorded (0: not a member, or not known)."""
        state = self.state
        if node not in state.isr or len(state.isr_incarnations) != len(state.isr):
            return 0
        return state.isr_incarnations[state.isr.index(node)]

    def _diverging(self, request: FetchRequest) -> EpochEndOffset | None:
        """KIP-595-style divergence check for a follower fetch (truncation by epoch)."""
        if request.last_fetched_epoch < 0:
            if request.offset > self.log.log_end_offset:
                return EpochEndOffset(epoch=-1, end_offset=self.log.log_start_offset)
            return None
        epoch, end_offset = self.log.end_offset_for_epoch(request.last_fetched_epoch)
        if epoch != request.last_fetched_epoch or end_offset < request.offset:
            return EpochEndOffset(epoch=epoch, end_offset=end_offset)
        return None

    def _has_data(self, request: FetchRequest | ListOffsetsRequest) -> bool:
        """Enough to answer now: any data, or with `min_bytes` above 1 that many bytes of whole
        batches (Kafka's fetch.min.bytes: fewer, larger answers for a consumer that can wait); for
        a ListOffsets long poll, a high watermark past its offset."""
        if isinstance(request, ListOffsetsRequest):
            return self.high_watermark > request.wait_past_offset
        counting = self._bytes_to_count(request)
        if counting is None:
            return self._end_of(request) > request.offset
        end, enough = counting
        return self._bytes_ready(request.offset, end, enough) >= enough

    def _end_of(self, request: FetchRequest) -> int:
        """Where what `request` may read ends: the log end for a follower, the high watermark else."""
        return self.log.log_end_offset if request.replica >= 0 else self.high_watermark

    def _bytes_to_count(self, request: FetchRequest) -> tuple[int, int] | None:
        """(end, enough) when whether `request` can be answered depends on the bytes of the batches
        from its offset to `end`; None when it does not (no data there, or any data will do)."""
        end = self._end_of(request)
        # More than one answer may carry is never there to wait for.
        enough = min(request.min_bytes, request.max_bytes, self.limits.fetch_bytes_max)
        return (end, enough) if end > request.offset and enough > 1 else None

    def _bytes_ready(self, offset: int, end: int, enough: int) -> int:
        """Bytes of the whole batches from the one holding `offset` up to `end`, counted to `enough`;
        `enough` once `fetch_ready_batches_max` batches are there, so a check walks a bounded part
        of the log however far behind the fetch is."""
        total = 0
        try:
            for walked, header in enumerate(self.log.iter_headers(offset), 1):
                if header.base_offset >= end:
                    break
                total += header.size
                if total >= enough or walked >= self.limits.fetch_ready_batches_max:
                    return enough
        except (OffsetOutOfRange, CorruptLog):
            return enough  # answer now: the read reports the problem
        return total

    def _walk_batches(self, start: int, end: int) -> "BatchWalk | None":
        """The whole batches from the one holding `start` up to `end`, at most twice
        `fetch_ready_batches_max` of them; None when the log cannot be walked from `start`
        (answer now: the read reports the problem)."""
        walk = BatchWalk()
        try:
            for header in self.log.iter_headers(start):
                if header.base_offset >= end:
                    break
                if len(walk.next_offsets) >= 2 * self.limits.fetch_ready_batches_max:
                    walk.complete = False
                    break
                walk.add(header.next_offset, header.size)
        except (OffsetOutOfRange, CorruptLog):
            return None
        return walk

    def _read(self, request: FetchRequest | ListOffsetsRequest) -> FetchResponse | ListOffsetsResponse:
        if isinstance(request, ListOffsetsRequest):
            return self._list_offsets(request)
        bound = None if request.replica >= 0 else self.high_watermark
        max_bytes = min(request.max_bytes, self.limits.fetch_bytes_max)
        try:
            records = self.log.read(request.offset, max_bytes, max_offset=bound)
        except OffsetOutOfRange:
            return self._out_of_range(request)
        except CorruptLog as error:
            self.deferred += self.storage.record_corruption(error)
            return self._fetch_error(request, ErrorCode.STORAGE_ERROR, f"refusing corrupt range: {error}")
        if self.log.refused_count != self.storage.refusals_seen:
            # The read stopped early at a bad batch and refused it without raising.
            self.deferred += self.storage.record_refusals()
        return self._fetch_response(request, records=records)

    def _fetch_response(self, request: FetchRequest, *, records: Any = b"",
                        diverging: EpochEndOffset | None = None) -> FetchResponse:
        return FetchResponse(
            correlation_id=request.correlation_id, topic=self.topic, partition=self.partition,
            high_watermark=self.high_watermark, log_start_offset=self.log.log_start_offset,
            log_end_offset=self.log.log_end_offset, leader_epoch=self.leader.epoch if self.leader else -1,
            diverging_epoch=diverging, records=records)

    def _fetch_error(self, request: FetchRequest | ListOffsetsRequest, code: ErrorCode,
                     text: str) -> FetchResponse | ListOffsetsResponse:
        if isinstance(request, ListOffsetsRequest):
            return ListOffsetsResponse(correlation_id=request.correlation_id, topic=request.topic,
                                       partition=request.partition, error=code, error_message=text,
                                       log_start_offset=self.log.log_start_offset, high_watermark=self.high_watermark,
                                       log_end_offset=self.log.log_end_offset)
        return FetchResponse(
            correlation_id=request.correlation_id, topic=request.topic, partition=request.partition, error=code,
            error_message=text, high_watermark=self.high_watermark, log_start_offset=self.log.log_start_offset,
            log_end_offset=self.log.log_end_offset)

    def _out_of_range(self, request: FetchRequest) -> FetchResponse:
        return self._fetch_error(request, ErrorCode.OFFSET_OUT_OF_RANGE, (
            f"offset {request.offset} is outside [{self.log.log_start_offset}, {self.log.log_end_offset}]"))

    def wake_parked_fetches(self, now_ns: int) -> list[Effect]:
        if not self.parked:
            return []
        ready = self._parked_ready()
        effects = self._answer_parked(
            lambda parked: self._read(parked.request) if ready(parked) else None, now_ns)
        return effects + self._hasten_for_high_watermark(now_ns)

    def _parked_ready(self) -> Callable[[ParkedFetch], bool]:
        """Which parked requests can be answered now. Whether a fetch's `min_bytes` are there is
        read off one walk of the batch headers per end (the high watermark, the log end) shared by
        every parked fetch counting to it: a walk of its own for each, at every append and every
        follower fetch, made 10,000 fetches parked with `min_bytes=2**62` read up to 1.4 million
        headers per batch committed (2-2.5 s of the leader each)."""
        log_start = self.log.log_start_offset
        counting = {id(parked): self._bytes_to_count(parked.request) for parked in self.parked
                    if isinstance(parked.request, FetchRequest)}
        starts: dict[int, int] = {}  # end -> the lowest offset whose bytes are counted to it
        for parked in self.parked:
            found = counting.get(id(parked))  # None for a ListOffsets long poll
            if found is not None and parked.request.offset >= log_start:
                offset = parked.request.offset
                starts[found[0]] = min(starts.get(found[0], offset), offset)
        walks = {end: self._walk_batches(start, end) for end, start in starts.items()}

        def ready(parked: ParkedFetch) -> bool:
            request = parked.request
            if not isinstance(request, FetchRequest):
                return self._has_data(request)
            found = counting[id(parked)]
            if found is None:
                return self._end_of(request) > request.offset
            if request.offset < log_start:
                return True  # the read says it is out of range
            end, enough = found
            walk = walks[end]
            return walk is None or walk.ready(request.offset, enough, self.limits.fetch_ready_batches_max)

        return ready

    def _hasten_for_high_watermark(self, now_ns: int) -> list[Effect]:
        """A follower waiting at the end with an older high watermark than ours learns the new one
        within `replica_high_watermark_notice_ms`: its wait is cut short to then, unless new data
        answers it first (under load it always does, so no extra round trip is made)."""
        soon_ns = now_ns + self.limits.replica_high_watermark_notice_ms * MS
        hastened = False
        for parked in self.parked:
            request = parked.request
            if 0 <= parked.replica and 0 <= request.high_watermark < self.high_watermark and parked.deadline_ns > soon_ns:
                parked.deadline_ns = soon_ns
                hastened = True
        if not hastened:
            return []
        return [SetTimer("fetch-expiry", min(parked.deadline_ns for parked in self.parked))]

    def _expire_parked(self, now_ns: int) -> list[Effect]:
        effects = self._answer_parked(
            lambda parked: self._read(parked.request) if parked.deadline_ns <= now_ns else None, now_ns)
        if self.parked:
            effects.append(SetTimer("fetch-expiry", min(parked.deadline_ns for parked in self.parked)))
        return effects

    def _answer_parked(self, answer: Any, now_ns: int | None = None) -> list[Effect]:
        effects: list[Effect] = []
        waiting: list[ParkedFetch] = []
        for parked in self.parked:
            response = answer(parked)
            if response is None:
                waiting.append(parked)
                continue
            if now_ns is not None and self.leader is not None and parked.replica >= 0:
                self.leader.note_parked_answered(parked.request, now_ns)
            effects.append(Send(parked.sender, response))
        self.parked = waiting
        return effects

    # ------------------------------------------------------------------ offsets

    def _on_list_offsets(self, request: ListOffsetsRequest, sender: Any, now_ns: int) -> list[Effect]:
        """Answer now, or — a long poll for latest whose offset the high watermark has not passed —
        when it does, or when the wait ends. A full purgatory answers at once instead: the caller
        asks again, as it would after the wait."""
        response = self._list_offsets(request)
        if (response.error != ErrorCode.NONE or request.timestamp_ms != LATEST or request.max_wait_ms <= 0
                or self._has_data(request) or self._clients_parked() >= self.limits.purgatory_fetch_max):
            return [Send(sender, response)]
        return self._park(sender, request, now_ns)

    def _list_offsets(self, request: ListOffsetsRequest) -> ListOffsetsResponse:
        base = dict(correlation_id=request.correlation_id, topic=request.topic, partition=request.partition,
                    log_start_offset=self.log.log_start_offset, high_watermark=self.high_watermark,
                    log_end_offset=self.log.log_end_offset)
        misdirected = self.misdirected(request)
        if misdirected is not None:
            code, text = misdirected
            return ListOffsetsResponse(**base, error=code, error_message=text)
        if self.leader is None:
            return ListOffsetsResponse(**base, error=ErrorCode.NOT_LEADER, error_message=self._not_leader_text())
        epoch = self.leader.epoch
        if 0 <= request.leader_epoch < epoch:  # the caller's metadata is older than this leader (KIP-320)
            return ListOffsetsResponse(**base, error=ErrorCode.FENCED_LEADER_EPOCH,
                                       error_message=f"epoch {request.leader_epoch} is older than the leader's {epoch}")
        if request.leader_epoch > epoch:  # this replica has not heard of the caller's leader yet
            return ListOffsetsResponse(**base, error=ErrorCode.UNKNOWN_LEADER_EPOCH,
                                       error_message=f"epoch {request.leader_epoch} is newer than this leader's {epoch}")
        if request.timestamp_ms == EARLIEST:
            offset = self.log.log_start_offset
        elif request.timestamp_ms == LATEST:
            offset = self.high_watermark
        elif request.timestamp_ms < 0:
            return ListOffsetsResponse(**base, error=ErrorCode.INVALID_REQUEST,
                                       error_message=f"timestamp {request.timestamp_ms} is not -1, -2 or a time")
        else:
            try:
                offset, timestamp = self._first_at_or_after(request.timestamp_ms)
            except CorruptLog as error:  # damaged on disk: refused, said, not served
                self.deferred += self.storage.record_corruption(error)
                return ListOffsetsResponse(**base, error=ErrorCode.STORAGE_ERROR,
                                           error_message=f"refusing corrupt range: {error}")
            return ListOffsetsResponse(**base, offset=offset, leader_epoch=self.leader.epoch,
                                       timestamp_ms=timestamp)
        timestamp = self.log.batch_timestamp(offset) if offset < self.high_watermark else None
        return ListOffsetsResponse(**base, offset=offset, leader_epoch=self.leader.epoch,
                                   timestamp_ms=-1 if timestamp is None else timestamp)

    def _first_at_or_after(self, timestamp_ms: int) -> tuple[int, int]:
        """Kafka's answer to a ListOffsets by time: the first visible record stamped `timestamp_ms`
        or later, and its time; (high watermark, -1) when none is. The batch holding it is found
        by its headers, the record by that batch's times: a batch's first offset and time were
        answered before, up to a whole batch of records earlier than asked."""
        found = self.log.offset_for_timestamp(timestamp_ms)
        if found is None or found >= self.high_watermark:
            return self.high_watermark, -1
        record = self.log.first_record_at_or_after(found, timestamp_ms)
        if record is None:  # its later records lie before the log start: the batch's, never later
            timestamp = self.log.batch_timestamp(found)
            return found, -1 if timestamp is None else timestamp
        offset, timestamp = record
        return (offset, timestamp) if offset < self.high_watermark else (self.high_watermark, -1)
