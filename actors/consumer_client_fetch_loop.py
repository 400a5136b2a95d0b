"""The consumer's fetch loop: which partitions to fetch now, from which leader, and how many
bytes each may ask for.

A mixin of `ConsumerClient` (actors/consumer_client.py), kept apart because the buffer's bound
is its own idea:
- The buffer is bounded in bytes: the records waiting for `poll` and what the fetches in flight
  may bring (each asks for `max_bytes`) together stay within `buffer_bytes_max`, so a consumer of
  a thousand partitions holds no more than one of four.
- Each partition may claim an equal share of the buffer, up to `fetch_partition_bytes_max` and
  at least `FETCH_SHARE_MIN_BYTES`; a partition without room waits for the next answer to free
  some, and rounds start after the partition last fetched, so none starves. Fetching stops while
  the buffer is full and resumes when the shell reports records consumed (the broker never
  pushes; a slow consumer only slows itself).
- One fetch in flight per partition, none for a paused or held one, nor before its retry time.
  A position that is not known yet is resolved first, with ListOffsets at the leader; a
  partition with neither a position nor an `auto_offset_reset` policy is reported to the shell
  once, and waits for a seek.
- A position read from a committed offset is not fetched with metadata older than the leader
  epoch it was committed under (KIP-320, Kafka's cure for KAFKA-6262): a deposed leader that has
  not heard of its successor may lack the records before it, answer OFFSET_OUT_OF_RANGE, and
  the reset would rewind the group or skip records. The loop asks metadata instead; an answer
  to a request asked after the position was known that still names an older epoch is the
  coordinator's word (a topic deleted and made again starts its epochs over) and is followed.
- A partition without a usable leader makes the loop ask metadata, but not at once after an
  answer that named no usable leader (the controller may not know of the death yet): the timer
  asks again when the backoff ends, as Kafka's retry.backoff.ms waits.
This class reads no answer: actors/consumer_client_answers.py does, and calls the loop again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.actor import MS
from actors.effects import Effect, Notify, Send, Trace
from actors.errors import ErrorCode, RailmqError
from actors.messages import FetchRequest, ListOffsetsRequest

if TYPE_CHECKING:
    from actors.consumer_client import PartitionFetch

RETRY_BACKOFF_MS = 100
# A fetch asks for at least this much (its share of the buffer when many partitions share it),
# unless the whole buffer is smaller: tiny fetches would cost a round trip per few records.
FETCH_SHARE_MIN_BYTES = 64 * 1024


class FetchLoop:
    def _fetch_all(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        missing: set[str] = set()
        fetches = list(self.fetches.values())
        order = [(self.fetch_turn + step) % len(fetches) for step in range(len(fetches))]
        ready = [(index, fetches[index]) for index in order if not (
            fetches[index].paused or fetches[index].held or fetches[index].correlation
            or fetches[index].reset_correlation or now_ns < fetches[index].retry_at_ns)]
        # Each partition that fetches may claim an equal part of the buffer (up to its own limit).
        active = sum(1 for fetch in fetches if not (fetch.paused or fetch.held))
        share = min(self.settings.fetch_partition_bytes_max,
                    max(FETCH_SHARE_MIN_BYTES, self.settings.buffer_bytes_max // max(1, active)))
        room = self._fetch_room()
        for index, fetch in ready:
            endpoint, epoch = self._leader(fetch.topic, fetch.partition, now_ns)
            if endpoint and epoch < fetch.epoch_floor:
                if self.metadata_answered_correlation <= fetch.floor_correlation:
                    endpoint = ""  # older than the epoch the position was read under: ask who leads now
                else:
                    effects.append(Trace("committed-epoch-superseded", {
                        "topic": fetch.topic, "partition": fetch.partition, "committed_epoch": fetch.epoch_floor,
                        "leader_epoch": epoch}))
                    fetch.epoch_floor = -1  # asked since, and still older: the coordinator's word (a topic made again)
            if not endpoint:
                missing.add(fetch.topic)
                continue
            current = self._topic_id(fetch.topic)
            if fetch.topic_id and current and fetch.topic_id != current:
                # The topic was deleted and made again under its name: the position (committed or
                # reached) is an offset of the old one, and would skip the new one's records.
                effects.append(Trace("position-of-a-deleted-topic", {
                    "topic": fetch.topic, "partition": fetch.partition, "position": fetch.position,
                    "old_topic_id": fetch.topic_id, "topic_id": current}))
                self._new_session(fetch)
                fetch.position, fetch.reset, fetch.epoch_floor, fetch.topic_id = -1, self._default_reset(), -1, 0
            fetch.topic_id = fetch.topic_id or current
            if fetch.position < 0:
                if fetch.reset is None:
                    if not fetch.reported:
                        fetch.reported = True
                        effects.append(Notify("partition-error", (fetch.topic, fetch.partition, RailmqError(
                            ErrorCode.OFFSET_OUT_OF_RANGE,
                            f"{fetch.topic}/{fetch.partition} has no committed offset and auto_offset_reset=none: "
                            "seek it to a position"))))
                    continue
                effects.append(self._send_reset(fetch, endpoint, epoch))
                continue
            asked = min(share, room)
            if asked <= 0 or (asked < min(share, FETCH_SHARE_MIN_BYTES) and room < self.settings.buffer_bytes_max):
                continue  # no room for a useful fetch while others are out or buffered: the next answer makes some
            room -= asked
            self.fetch_turn = index + 1  # the next round starts after this one: every partition gets its turn
            self.correlation += 1
            fetch.correlation, fetch.sent_ns, fetch.endpoint, fetch.asked = self.correlation, now_ns, endpoint, asked
            self.by_correlation[self.correlation] = ("fetch", fetch)
            effects.append(Send(endpoint, FetchRequest(
                correlation_id=self.correlation, topic=fetch.topic, partition=fetch.partition,
                topic_id=self._topic_id(fetch.topic),
                offset=fetch.position, max_bytes=asked,
                max_wait_ms=self.settings.fetch_max_wait_ms, min_bytes=self.settings.fetch_min_bytes,
                leader_epoch=epoch)))
        self.leaders_missing = bool(missing)
        if missing and now_ns - self.metadata_answered_ns >= RETRY_BACKOFF_MS * MS:
            # Not at once after an answer that named no usable leader (the controller may not
            # know of the death yet): the timer asks again, as Kafka's retry.backoff.ms waits.
            effects += self.request_metadata(sorted(missing))
        return effects

    def _fetch_room(self) -> int:
        """Bytes the buffer can still take: what `poll` has not consumed and what the fetches in
        flight may bring both count, so the two together stay within `buffer_bytes_max` (a
        first batch larger than a fetch's share still comes whole, as Kafka's fetches do)."""
        in_flight = sum(fetch.asked for fetch in self.fetches.values() if fetch.correlation)
        return self.settings.buffer_bytes_max - self.buffered_bytes - in_flight

    def _send_reset(self, fetch: PartitionFetch, endpoint: str, epoch: int) -> Send:
        fetch.endpoint = endpoint
        self.correlation += 1
        fetch.reset_correlation = self.correlation
        self.by_correlation[self.correlation] = ("reset", fetch)
        return Send(endpoint, ListOffsetsRequest(correlation_id=self.correlation, topic=fetch.topic,
                                                 partition=fetch.partition, topic_id=self._topic_id(fetch.topic),
                                                 timestamp_ms=fetch.reset, leader_epoch=epoch))
