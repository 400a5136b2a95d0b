"""A share member's records (KIP-932): per partition, acquire at the coordinator, then fetch the
acquired offsets' bytes from the partition leader.

A mixin of `ShareMember` (actors/share_member.py), which owns the membership, the metadata and
the requests in flight. Per partition, one acquire (a long poll at the coordinator) in flight
while the member holds fewer than `prefetch_records_max` locks (records buffered for `poll` and
records the user has not answered yet both count: a member busy with what it has does not take
more, so what it cannot handle in time stays with the others). The acquired offsets' bytes are
fetched from the partition leader with the ordinary FetchRequest and handed to the shell with
the acquired ranges, so it keeps only offsets this member holds.

The buffer is bounded in bytes, as a classic consumer's is (actors/consumer_client_fetch_loop.py):
the chunks the shell holds for `poll` (`buffered_bytes`, until the shell reports them "consumed")
and the bytes each partition's acquired records may still bring (`Reader.budget_bytes`, reserved
when the acquire is sent, asked for as the fetch's `max_bytes`, given back as the records come)
together stay within `buffer_bytes_max`. A partition acquires only with room for its share of
the buffer: records acquired and then left unfetched would only wait out their locks, unread.
Of a fetch answer the member keeps the leading batches up to the one holding the last offset it
acquired (what follows is other members' records), within the bytes asked after the first batch
(which comes whole, as Kafka's fetches do), copied out of the frame when they are less than all
of it: a slice would keep the whole frame (up to 32 MiB from whoever answers on a leader's port)
alive behind the bytes counted.

- An acquire answer is taken only if it is what was asked: the partition asked about, ranges in
  order, not overlapping, at offsets >= 0, holding at most the records asked for (the held map
  is bounded by what this member asks for). None of anything else is taken (the locks it names
  lapse at the coordinator).
- Acquired records whose locks expired before the bytes came, or that the log no longer holds,
  are dropped, not delivered.
- No acquire is in flight before the last one's records were fetched (checked by
  `ShareMember.invariants`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.actor import MS
from actors.consumer_client_fetch_loop import FETCH_SHARE_MIN_BYTES
from actors.effects import Effect, Notify, Trace
from actors.errors import ErrorCode
from actors.limits import SHARE_LOCK_CEILING_MS
from actors.messages import AcquiredRecords, FetchRequest, FetchResponse, ShareAcquireRequest, ShareAcquireResponse
from storage.batch import iter_batches
from storage.errors import StorageError

RETRY_BACKOFF_MS = 100
# Errors that mean "the coordinator does not know us, or we do not know it": rejoin or rediscover.
MEMBERSHIP_TROUBLE = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.NOT_COORDINATOR,
                                ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.REQUEST_TIMED_OUT})


class Reader:
    """One partition's acquire -> fetch pipeline."""

    __slots__ = ("topic", "partition", "acquiring", "reserved", "budget_bytes", "to_fetch",
                 "lock_deadline_ms", "fetching", "retry_at_ns", "topic_id")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.acquiring = 0  # correlation of the acquire in flight
        self.reserved = 0  # records that acquire may bring (counted against the prefetch bound)
        self.budget_bytes = 0  # bytes its acquired records may still bring (counted against the buffer)
        self.to_fetch: list[AcquiredRecords] = []  # acquired, bytes not fetched yet
        self.lock_deadline_ms = 0
        self.fetching = 0  # correlation of the fetch in flight
        self.retry_at_ns = 0
        self.topic_id = 0  # of the topic its acquired records are of (its fetch names it, for the leader)


class ShareFetching:
    """Mixed into `ShareMember` (actors/share_member.py), which owns the membership (`state`,
    `member_id`, `membership`, the heartbeat's timing), `settings`, `topics`, `readers`, `held`,
    `pending`, the `timer` told of each lock's deadline, and the requests it sends (`_send`,
    `_heartbeat`, `_request_metadata`)."""

    # ------------------------------------------------------------------ acquire and fetch

    def _pump(self, now_ns: int) -> list[Effect]:
        """Start whatever can start now: metadata, a heartbeat, acquires and fetches."""
        if self.state in ("unsubscribed", "closing", "closed", "failed"):
            return []
        if not self.coordinator:
            return self._request_metadata(now_ns)
        effects: list[Effect] = []
        due = now_ns - self.last_heartbeat_ns >= self.heartbeat_interval_ms * MS
        if not self.heartbeat_in_flight and (self.state == "unjoined" or due):
            if self.state == "unjoined":
                self.state = "joining"
            effects += self._heartbeat(now_ns)
        if self.state != "stable":
            return effects
        share = max(1, self.settings.prefetch_records_max // max(1, len(self.readers)))
        holding = self.holding()
        for key in sorted(self.readers):
            reader = self.readers[key]
            if now_ns < reader.retry_at_ns:
                continue
            if reader.to_fetch and not reader.fetching:
                if not reader.budget_bytes:  # its records did not all fit what it asked: more room first
                    reader.budget_bytes = self._budget_bytes()
                if reader.budget_bytes or now_ns // MS >= reader.lock_deadline_ms:  # expired: dropped
                    effects += self._fetch(reader, now_ns)
            elif not reader.to_fetch and not reader.acquiring:
                room = self.settings.prefetch_records_max - holding
                budget_bytes = self._budget_bytes() if room > 0 else 0
                if budget_bytes:
                    effects += self._acquire(reader, min(room, share), now_ns)
                    reader.budget_bytes = budget_bytes
                    holding += reader.reserved
        return effects

    def _budget_bytes(self) -> int:
        """Bytes one partition may reserve of the buffer now (0: none, wait for the shell to use
        some up): an equal share of the buffer, up to `fetch_partition_bytes_max` and at least
        FETCH_SHARE_MIN_BYTES unless the buffer is empty (tiny fetches cost a round trip each)."""
        settings = self.settings
        share = min(settings.fetch_partition_bytes_max,
                    max(FETCH_SHARE_MIN_BYTES, settings.buffer_bytes_max // max(1, len(self.readers))))
        room = self.buffer_room_bytes()
        budget = min(share, room)
        if budget <= 0 or (budget < min(share, FETCH_SHARE_MIN_BYTES) and room < settings.buffer_bytes_max):
            return 0
        return budget

    def buffer_room_bytes(self) -> int:
        """What the buffer can still take: the shell's chunks and what acquired records may still
        bring both count."""
        reserved = sum(reader.budget_bytes for reader in self.readers.values())
        return self.settings.buffer_bytes_max - self.buffered_bytes - reserved

    def holding(self) -> int:
        """Locks held or asked for: the prefetch bound counts these."""
        return sum(len(held) for held in self.held.values()) + sum(r.reserved for r in self.readers.values())

    def _forget_reader_work(self, reader: Reader) -> None:
        self.pending.pop(reader.acquiring, None)
        self.pending.pop(reader.fetching, None)
        reader.acquiring = reader.fetching = reader.reserved = reader.budget_bytes = 0
        reader.to_fetch = []

    def _acquire(self, reader: Reader, max_records: int, now_ns: int) -> list[Effect]:
        request = ShareAcquireRequest(
            correlation_id=0, group_id=self.settings.group_id, member_id=self.member_id,
            member_secret=self.member_secret, topic=reader.topic, partition=reader.partition,
            max_records=max_records, max_wait_ms=self.settings.acquire_max_wait_ms)
        send = self._send("acquire", (reader.topic, reader.partition), self.coordinator, request, now_ns)
        reader.acquiring, reader.reserved = send.message.correlation_id, max_records
        return [send]

    def _on_acquired(self, key: tuple[str, int], response: Any, now_ns: int) -> list[Effect]:
        reader = self.readers.get(key)
        if reader is None:
            return []
        asked = reader.reserved
        reader.acquiring = reader.reserved = 0
        if response.error != ErrorCode.NONE or not response.acquired:
            reader.budget_bytes = 0  # nothing to fetch: the bytes reserved go back to the buffer
        refused = _acquired_refusal(response, key, asked) if response.error == ErrorCode.NONE else ""
        if refused:
            # Not what was asked: none of it is taken (the locks it names lapse at the coordinator).
            reader.budget_bytes = 0
            reader.retry_at_ns = now_ns + RETRY_BACKOFF_MS * MS
            return [Trace("share-acquire-refused", {"topic": key[0], "partition": key[1], "reason": refused})]
        if response.error != ErrorCode.NONE:
            reader.retry_at_ns = now_ns + RETRY_BACKOFF_MS * MS
            if response.error in MEMBERSHIP_TROUBLE:
                return self._on_member_error(response.error, response.error_message, now_ns)
            return [Trace("share-acquire-refused", {"topic": key[0], "partition": key[1], "error": response.error})]
        if not response.acquired:
            return []
        held = self.held.setdefault(key, {})
        deadline_ms = self._believed_lock_deadline_ms(response.lock_deadline_ms, now_ns)
        for acquired in response.acquired:
            for offset in range(acquired.first_offset, acquired.last_offset + 1):
                held[offset] = deadline_ms
        reader.to_fetch, reader.lock_deadline_ms = list(response.acquired), deadline_ms
        reader.topic_id = response.topic_id  # fetched naming it (0: metadata's)
        self.timer.want(deadline_ms * MS)
        return []

    def _believed_lock_deadline_ms(self, deadline_ms: int, now_ns: int) -> int:
        """A lock's deadline as an answer gives it, but no further away than the group's visibility
        timeout (and `SHARE_LOCK_CEILING_MS`): the coordinator locks a record for that long, and a
        hostile answer's 2**62 held records as locked for ever, never dropped when not fetched."""
        longest = min(self.group_settings.visibility_timeout_ms, SHARE_LOCK_CEILING_MS)
        return min(deadline_ms, now_ns // MS + max(longest, 0))

    def _fetch(self, reader: Reader, now_ns: int) -> list[Effect]:
        if now_ns // MS >= reader.lock_deadline_ms:
            self._drop_unfetched(reader, reader.to_fetch)  # the locks expired before the bytes came
            return []
        metadata = self.topics.get(reader.topic)
        if metadata is None or not 0 <= reader.partition < len(metadata.partitions) or \
                not self._reachable(metadata.partitions[reader.partition].leader_endpoint, now_ns) or \
                not metadata.partitions[reader.partition].leader_endpoint:
            reader.retry_at_ns = now_ns + RETRY_BACKOFF_MS * MS
            return self._request_metadata(now_ns)
        leader = metadata.partitions[reader.partition]
        # The acquisition's topic id: records a share-partition of a topic deleted and made again
        # under its name handed out are refused by the new topic's leader (UNKNOWN_TOPIC_ID), not
        # fetched from it and handed over under the old share-partition's locks (and the other
        # way round with metadata older than the coordinator's).
        reader.topic_id = reader.topic_id or metadata.topic_id
        request = FetchRequest(correlation_id=0, topic=reader.topic, partition=reader.partition,
                               topic_id=reader.topic_id, offset=reader.to_fetch[0].first_offset,
                               max_wait_ms=0, leader_epoch=leader.leader_epoch, max_bytes=reader.budget_bytes)
        send = self._send("fetch", (reader.topic, reader.partition), leader.leader_endpoint, request, now_ns)
        reader.fetching = send.message.correlation_id
        return [send]

    def _on_fetched(self, key: tuple[str, int], response: Any, now_ns: int) -> list[Effect]:
        reader = self.readers.get(key)
        if reader is None:
            return []
        reader.fetching = 0
        if response.error == ErrorCode.OFFSET_OUT_OF_RANGE and isinstance(response, FetchResponse):
            # Deleted or truncated away: nothing to deliver. Only the offsets below the log start
            # go of a range it moved into (one acquire is one range): dropping the range whole left
            # records the log still holds locked to this member, undelivered, until their locks
            # ran out and cost them a delivery attempt.
            deleted, reader.to_fetch = _split(reader.to_fetch, response.log_start_offset)
            truncated = [r for r in reader.to_fetch if r.first_offset >= response.log_end_offset]
            self._drop_unfetched(reader, deleted + truncated)
            reader.retry_at_ns = now_ns + RETRY_BACKOFF_MS * MS
            return []
        misdirected = isinstance(response, FetchResponse) and (response.topic, response.partition) != key
        if response.error != ErrorCode.NONE or misdirected:  # an answer for another partition: a stale endpoint
            return self._leader_trouble(reader, now_ns)
        records = response.records
        try:
            size, end = _kept_prefix(records, reader.to_fetch[0].first_offset,
                                     reader.to_fetch[-1].last_offset, reader.budget_bytes)
        except StorageError as error:  # a batch header that does not parse: ask again, later, whoever leads
            return [Trace("share-fetch-unreadable", {"topic": key[0], "partition": key[1], "reason": str(error)})] + \
                self._leader_trouble(reader, now_ns)
        covered, rest = _split(reader.to_fetch, end)
        if not covered:
            reader.retry_at_ns = now_ns + RETRY_BACKOFF_MS * MS  # a new leader's high watermark lags behind
            return []
        reader.to_fetch = rest
        self.buffered_bytes += size
        reader.budget_bytes = max(0, reader.budget_bytes - size) if rest else 0
        kept = records if size == len(records) else bytes(records[:size])  # not a whole frame behind a slice
        ranges = [[r.first_offset, r.last_offset, r.delivery_count] for r in covered]
        return [Notify("share-records", (self.membership, reader.topic, reader.partition, kept, ranges,
                                         reader.lock_deadline_ms, reader.topic_id))]

    def _drop_unfetched(self, reader: Reader, dropped: list[AcquiredRecords]) -> None:
        held = self.held.get((reader.topic, reader.partition), {})
        for acquired in dropped:
            for offset in range(acquired.first_offset, acquired.last_offset + 1):
                held.pop(offset, None)
        reader.to_fetch = [r for r in reader.to_fetch if r not in dropped]
        if not reader.to_fetch:
            reader.budget_bytes = 0  # nothing left to fetch: the bytes reserved go back to the buffer

    def _leader_trouble(self, reader: Reader, now_ns: int) -> list[Effect]:
        reader.retry_at_ns = now_ns + RETRY_BACKOFF_MS * MS
        metadata = self.topics.get(reader.topic)
        if metadata is not None and 0 <= reader.partition < len(metadata.partitions):
            metadata.partitions[reader.partition].leader_endpoint = ""
        return self._request_metadata(now_ns, force=True)


def _acquired_refusal(response: ShareAcquireResponse, key: tuple[str, int], asked: int) -> str:
    """Why an acquire answer is not what was asked ("" when it is): it must name the partition
    asked about, and ranges in order, not overlapping, at offsets >= 0, holding at most the
    `asked` records (the held map is bounded by what this member asks for)."""
    if (response.topic, response.partition) != key:
        return f"the answer names {response.topic}/{response.partition}, not {key[0]}/{key[1]}"
    total, end = 0, 0
    for acquired in response.acquired:
        first, last = acquired.first_offset, acquired.last_offset
        if first < end or last < first:
            return f"the range {first}..{last} is backwards, below 0 or overlaps the one before"
        total, end = total + last - first + 1, last + 1
        if total > asked:
            return f"the answer holds more than the {asked} records asked for"
    return ""


def _kept_prefix(records: Any, first: int, last: int, max_bytes: int) -> tuple[int, int]:
    """(bytes, end offset) of the leading batches of a fetch answer a member keeps: up to the one
    holding `last`, the last offset it acquired (what follows is others' records), and within
    `max_bytes` after the first batch (which comes whole). The end offset starts at `first`.
    Raises StorageError for a header among them that does not parse."""
    size, end = 0, first
    for start, header in iter_batches(records, verify=False):
        if size and start + header.size > max_bytes:
            break
        size, end = start + header.size, max(end, header.next_offset)
        if header.next_offset > last:
            break
    return size, end


def _split(ranges: list[AcquiredRecords], end: int) -> tuple[list[AcquiredRecords], list[AcquiredRecords]]:
    """The parts of `ranges` below `end`, and the rest."""
    covered: list[AcquiredRecords] = []
    rest: list[AcquiredRecords] = []
    for acquired in ranges:
        if acquired.last_offset < end:
            covered.append(acquired)
        elif acquired.first_offset >= end:
            rest.append(acquired)
        else:
            covered.append(msgspec.structs.replace(acquired, last_offset=end - 1))
            rest.append(msgspec.structs.replace(acquired, first_offset=end))
    return covered, rest
