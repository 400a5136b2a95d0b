"""A share member's acknowledgements (KIP-932): the shell's answers go to the coordinator per
partition, and their per-range results go back as one answer.

A mixin of `ShareMember` (actors/share_member.py), which owns the membership and the requests in
flight. An "acknowledge" command becomes one ShareAcknowledgeRequest per partition;
`AcknowledgeCall` collects their results, and the shell hears them once all are in (with a token
of 0, as an "acknowledged" notification). Without a member id or a coordinator nothing is sent
and every range is answered with the error.

- An acknowledged offset (other than a renewal) stops counting against the prefetch bound when
  the acknowledgement is sent; a renewal's new lock deadline is taken only for offsets still held.
- An answer that does not hold one result per acknowledgement, for its range, is trusted for
  none of them (and a range far wider than ours must not be walked).
"""

from __future__ import annotations

from typing import Any

from actors.actor import MS
from actors.effects import Effect, Notify, Trace
from actors.errors import ErrorCode
from actors.messages import ErrorResponse, ShareAcknowledgement, ShareAcknowledgeRequest
from actors.share_member_fetch import MEMBERSHIP_TROUBLE


class AcknowledgeCall:
    """Results collected for one "acknowledge" command across its per-partition requests."""

    __slots__ = ("token", "waiting", "results")

    def __init__(self, token: int) -> None:
        self.token = token
        self.waiting: set[int] = set()
        self.results: list[list[Any]] = []  # [topic, partition, first, last, error, lock_deadline_ms]


class ShareAcknowledging:
    """Mixed into `ShareMember` (actors/share_member.py), which owns `settings`, `member_id`,
    `coordinator`, `held`, the `timer` told of each renewed lock's deadline, `_send` and
    `_on_member_error`."""

    def _acknowledge(self, token: int, entries: list[list[Any]], now_ns: int) -> list[Effect]:
        call = AcknowledgeCall(token)
        # One request per partition and topic id: records of a topic deleted and made again
        # under its name are answered apart from the new one's at the same offsets.
        by_partition: dict[tuple[str, int, int], list[ShareAcknowledgement]] = {}
        for topic, partition, first, last, kind, delay_ms, error, *delivery in entries:
            topic_id = delivery[1] if len(delivery) > 1 else 0
            by_partition.setdefault((topic, partition, topic_id), []).append(ShareAcknowledgement(
                first_offset=first, last_offset=last, kind=kind, delay_ms=delay_ms, error=error,
                delivery_count=delivery[0] if delivery else 0))
        effects: list[Effect] = []
        for (topic, partition, topic_id), acknowledgements in sorted(by_partition.items()):
            key = (topic, partition)
            if not self.member_id or not self.coordinator:
                code = ErrorCode.UNKNOWN_MEMBER_ID if not self.member_id else ErrorCode.COORDINATOR_NOT_AVAILABLE
                call.results += [[*key, a.first_offset, a.last_offset, code, 0] for a in acknowledgements]
                continue
            held = self.held.get(key, {})
            for acknowledgement in acknowledgements:
                if acknowledgement.kind != "renew":
                    for offset in range(acknowledgement.first_offset, acknowledgement.last_offset + 1):
                        held.pop(offset, None)
            request = ShareAcknowledgeRequest(correlation_id=0, group_id=self.settings.group_id,
                                              member_id=self.member_id, member_secret=self.member_secret,
                                              topic=key[0], partition=key[1],
                                              acknowledgements=acknowledgements, topic_id=topic_id)
            send = self._send("acknowledge", (call, key, acknowledgements), self.coordinator, request, now_ns)
            call.waiting.add(send.message.correlation_id)
            effects.append(send)
        return effects + self._answer_if_complete(call)

    def _on_acknowledged(self, key: tuple, response: Any, now_ns: int) -> list[Effect]:
        call, (topic, partition), acknowledgements = key
        call.waiting.discard(response.correlation_id)
        effects: list[Effect] = []
        if response.error != ErrorCode.NONE or isinstance(response, ErrorResponse):
            call.results += [[topic, partition, a.first_offset, a.last_offset, response.error, 0]
                             for a in acknowledgements]
            if response.error in MEMBERSHIP_TROUBLE:
                effects += self._on_member_error(response.error, response.error_message, now_ns)
        elif not _results_match(response.results, acknowledgements):
            # One result per acknowledgement, for its range: anything else says nothing we can
            # trust about ours (and a range far wider than ours must not be walked).
            call.results += [[topic, partition, a.first_offset, a.last_offset, ErrorCode.UNKNOWN_SERVER_ERROR, 0]
                             for a in acknowledgements]
            effects.append(Trace("share-acknowledge-mismatch", {"topic": topic, "partition": partition,
                                                                "results": len(response.results)}))
        else:
            held = self.held.get((topic, partition), {})
            for result in response.results:
                call.results.append([topic, partition, result.first_offset, result.last_offset, result.error,
                                     result.lock_deadline_ms])
                if result.lock_deadline_ms and not result.error:
                    deadline_ms = self._believed_lock_deadline_ms(result.lock_deadline_ms, now_ns)
                    self.timer.want(deadline_ms * MS)
                    for offset in range(result.first_offset, result.last_offset + 1):
                        if offset in held:
                            held[offset] = deadline_ms
        return effects + self._answer_if_complete(call)

    def _answer_if_complete(self, call: AcknowledgeCall) -> list[Effect]:
        if call.waiting:
            return []
        if call.token:
            return [Notify("result", (call.token, call.results, None))]
        return [Notify("acknowledged", call.results)] if call.results else []


def _results_match(results: list[Any], acknowledgements: list[ShareAcknowledgement]) -> bool:
    return len(results) == len(acknowledgements) and all(
        (result.first_offset, result.last_offset) == (acknowledgement.first_offset, acknowledgement.last_offset)
        for result, acknowledgement in zip(results, acknowledgements))
