"""How the consumer reads what partition leaders answer: fetched records, ListOffsets, errors.

A mixin of `ConsumerClient` (actors/consumer_client.py), kept apart because an answer is a claim
to check before it moves a position:
- An answer counts only if it came from where its request went (a server reusing or guessing a
  correlation id is not answering it), and only for the partition asked: one naming another
  partition (a stale endpoint now serving something else) is taken as NOT_LEADER, and so is a
  ListOffsets answer giving an offset no log has.
- A fetched batch whose header does not parse ends the readable part of a response: the batches
  before it go to the shell, then an "unreadable" notice naming the offset where the bad batch
  starts, and the partition is *held* (no more fetches) until the shell starts a new session
  with a seek. A response with nothing usable in it is a confused leader, not a slow one.
- OFFSET_OUT_OF_RANGE resets the position with `auto_offset_reset` (none: the user is told to
  seek somewhere valid). An offset the last reset gave that is out of range at once, again, means
  the leader contradicts itself: asking at once would only loop, so the reset waits.
- A retriable error forgets the leader, asks metadata and retries after RETRY_BACKOFF_MS; an
  error no retry cures is told to the user once per streak, and the partition is asked again
  slowly.
This class sends no fetch itself: after an answer the fetch loop
(actors/consumer_client_fetch_loop.py) decides what to ask next. The user's own ListOffsets
requests are sent here, beside their answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from actors.actor import MS
from actors.client_metadata import clipped
from actors.consumer_client_fetch_loop import RETRY_BACKOFF_MS
from actors.effects import Effect, Notify, Send, Trace
from actors.errors import RETRIABLE, ErrorCode, RailmqError
from actors.fetch_answers import readable_batches
from actors.messages import ClientCommand, FetchResponse, ListOffsetsRequest, ListOffsetsResponse

if TYPE_CHECKING:
    from actors.consumer_client import PartitionFetch

LEADERSHIP_ERRORS = frozenset({ErrorCode.NOT_LEADER, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.FENCED_LEADER_EPOCH,
                               ErrorCode.UNKNOWN_LEADER_EPOCH})  # answers that mean: ask metadata who leads


class LeaderAnswers:
    @staticmethod
    def _misdirected(response: Any, fetch: PartitionFetch) -> bool:
        """An answer naming another partition than the one asked (a stale endpoint now serving
        something else): nothing in it is about ours."""
        return response.error == ErrorCode.NONE and (response.topic, response.partition) != (fetch.topic, fetch.partition)

    def _take_answer(self, correlation_id: int, sender: Any) -> tuple[str, Any] | None:
        """The request an answer is for, if the answer came from where that request went; an
        answer from elsewhere (a server reusing or guessing a correlation id) is not about it."""
        entry = self.by_correlation.get(correlation_id)
        if entry is None:
            return None
        kind, target = entry
        if sender != (target[3] if kind == "user" else target.endpoint):
            return None
        return self.by_correlation.pop(correlation_id)

    def _on_fetch_response(self, response: FetchResponse, sender: Any, now_ns: int) -> list[Effect]:
        entry = self._take_answer(response.correlation_id, sender)
        if entry is None:
            return []
        fetch: PartitionFetch = entry[1]
        fetch.correlation = 0
        if self._misdirected(response, fetch):
            return self._on_partition_error(fetch, ErrorCode.NOT_LEADER, "the answer names another partition", now_ns)
        if response.error == ErrorCode.NONE:
            fetch.failing = 0
            effects: list[Effect] = []
            records = response.records
            if len(records):
                taken = readable_batches(records, fetch.position, response.high_watermark, fetch.asked)
                if taken.last is not None:
                    fetch.position = taken.last.next_offset
                    self.buffered_bytes += taken.size
                    # The records are a view of the frame they came in: a slice of it would keep
                    # the whole frame (up to 32 MiB) alive behind the few bytes counted, so what
                    # is taken of a larger answer is copied out, and the frame goes.
                    kept = records if taken.size == len(records) else bytes(records[:taken.size])
                    effects.append(Notify("records", (fetch.topic, fetch.partition, fetch.session, kept,
                                                      response.high_watermark, fetch.topic_id)))
                if taken.unreadable:
                    fetch.held = True
                    effects.append(Notify("unreadable", (fetch.topic, fetch.partition, fetch.session,
                                                         fetch.position, taken.unreadable)))
                if taken.refused:
                    effects.append(Trace("fetch-answer-refused", {
                        "topic": fetch.topic, "partition": fetch.partition, "offset": fetch.position,
                        "reason": taken.refused}))
                    if taken.last is None:  # nothing in it was usable: a confused leader, not a slow one
                        return effects + self._on_partition_error(fetch, ErrorCode.NOT_LEADER, taken.refused, now_ns)
            return effects + self._fetch_all(now_ns)
        return self._on_partition_error(fetch, response.error, response.error_message, now_ns)

    def _on_partition_error(self, fetch: PartitionFetch, code: int, text: str, now_ns: int) -> list[Effect]:
        text = clipped(text)  # a leader's sentence, handed to the user
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            reset = self._default_reset()
            if reset is None:
                fetch.retry_at_ns = now_ns + 10 * RETRY_BACKOFF_MS * MS
                return [Notify("partition-error", (fetch.topic, fetch.partition, RailmqError(
                    code, f"{text}; auto_offset_reset=none, so seek somewhere valid")))]
            recent = fetch.reset_ns is not None and now_ns - fetch.reset_ns < RETRY_BACKOFF_MS * MS
            self._new_session(fetch)
            fetch.position, fetch.reset, fetch.resetting_out_of_range = -1, reset, True
            if recent:
                # The offset the last reset gave is out of range at once, again: the leader
                # contradicts itself, and asking at once would only loop.
                fetch.retry_at_ns = now_ns + RETRY_BACKOFF_MS * MS
                self._forget_leader(fetch.topic, fetch.partition)
                return self.request_metadata([fetch.topic])
            return self._fetch_all(now_ns)
        effects: list[Effect] = []
        if code in RETRIABLE or code == ErrorCode.STORAGE_ERROR:
            fetch.retry_at_ns = now_ns + RETRY_BACKOFF_MS * MS
        else:
            # No retry cures it (a request the leader calls invalid, a code this version does not
            # know): the user hears of it once per streak, and the partition is asked again slowly.
            fetch.retry_at_ns = now_ns + 10 * RETRY_BACKOFF_MS * MS
            if fetch.failing != code:
                fetch.failing = code
                effects.append(Notify("partition-error", (fetch.topic, fetch.partition, RailmqError(code, text))))
        self._forget_leader(fetch.topic, fetch.partition)
        return effects + self.request_metadata([fetch.topic])

    def _on_list_offsets(self, response: ListOffsetsResponse, sender: Any, now_ns: int) -> list[Effect]:
        entry = self._take_answer(response.correlation_id, sender)
        if entry is None:
            return []
        kind, target = entry
        if kind == "user":
            token, topic, partition, _ = target
            if response.error == ErrorCode.NONE and (response.topic, response.partition) != (topic, partition):
                response = msgspec.structs.replace(response, error=ErrorCode.NOT_LEADER,
                                                   error_message="the answer names another partition")
            elif response.error == ErrorCode.NONE and response.offset < 0:  # no log has such an offset
                response = msgspec.structs.replace(response, error=ErrorCode.NOT_LEADER,
                                                   error_message=f"the answer gives offset {response.offset}")
            if response.error != ErrorCode.NONE:
                effects: list[Effect] = [Notify("result", (token, None, RailmqError(response.error, response.error_message)))]
                if response.error in LEADERSHIP_ERRORS:  # the caller retries: let it find the current leader
                    self._forget_leader(topic, partition)
                    effects += self.request_metadata([topic])
                return effects
            return [Notify("result", (token, (response.offset, response.timestamp_ms), None))]
        fetch: PartitionFetch = target
        fetch.reset_correlation = 0
        if self._misdirected(response, fetch):
            return self._on_partition_error(fetch, ErrorCode.NOT_LEADER, "the answer names another partition", now_ns)
        if response.error != ErrorCode.NONE:
            return self._on_partition_error(fetch, response.error, response.error_message, now_ns)
        if response.offset < 0:  # no log has such an offset: ask again, later, whoever leads then
            return [Trace("list-offsets-refused", {"topic": fetch.topic, "partition": fetch.partition,
                                                   "offset": response.offset})] + self._on_partition_error(
                fetch, ErrorCode.NOT_LEADER, f"the answer gives offset {response.offset}", now_ns)
        fetch.position, fetch.reset = response.offset, None
        fetch.reset_ns = now_ns if fetch.resetting_out_of_range else None
        fetch.resetting_out_of_range = False
        return [Notify("position", (fetch.topic, fetch.partition, fetch.session, response.offset))] + self._fetch_all(now_ns)

    def _list_offsets_for_user(self, command: ClientCommand, now_ns: int) -> list[Effect]:
        arguments = command.arguments
        endpoint, epoch = self._leader(arguments["topic"], arguments["partition"])
        if not endpoint:
            effects = self.request_metadata([arguments["topic"]])
            return effects + [Notify("result", (command.token, None, RailmqError(
                ErrorCode.LEADER_NOT_AVAILABLE, f"no known leader for {arguments['topic']}/{arguments['partition']}")))]
        self.correlation += 1
        self.by_correlation[self.correlation] = ("user", (command.token, arguments["topic"], arguments["partition"],
                                                          endpoint))
        return [Send(endpoint, ListOffsetsRequest(correlation_id=self.correlation, topic=arguments["topic"],
                                                  partition=arguments["partition"],
                                                  topic_id=self._topic_id(arguments["topic"]),
                                                  timestamp_ms=arguments["timestamp"], leader_epoch=epoch))]

