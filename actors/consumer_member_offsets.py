"""The group's committed offsets as the user reads and writes them through its member: commits
and committed-offsets lookups.

A mixin of `ConsumerMember` (actors/consumer_member.py), kept apart because offsets have their
own rules:
- A commit is asked only in a generation the member is in (stable, or revoking before it
  rejoins); otherwise the caller hears REBALANCE_IN_PROGRESS. Each offset carries the leader
  epoch the consumer knows for its partition (KIP-320): whoever starts from it later reads with
  metadata at least that new (actors/consumer_client_fetch_loop.py). With no coordinator known, a
  user's request is refused at once (COORDINATOR_NOT_AVAILABLE) and the metadata asked for finds
  it for the next call.
- A commit's answer holds one result per offset (with its own error code). An offset it has no
  result for is not reported as committed: the caller is told that whether it is committed is
  unknown. An answer saying the membership is gone (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
  FENCED_INSTANCE_ID) is also handled as the member's group error.
This class never changes the membership itself, nor what the member owns: the positions of
newly assigned partitions, read from the same committed offsets, are the business of
actors/consumer_member_assignment.py.
"""

from __future__ import annotations

from typing import Any

from actors.effects import Effect, Notify
from actors.errors import ErrorCode, RailmqError
from actors.messages import (
    ClientCommand, OffsetCommitRequest, OffsetCommitResponse, OffsetEntry, OffsetFetchRequest,
)


def _unconfirmed(asked: list[OffsetEntry], results: list[OffsetEntry]) -> list[tuple[str, int, int]]:
    """The committed (topic, partition, offset)s an answer has no result for: a commit's answer
    holds one result per offset (with its own error code)."""
    answered = {(entry.topic, entry.partition, entry.offset) for entry in results}
    return [key for key in ((entry.topic, entry.partition, entry.offset) for entry in asked) if key not in answered]


class MemberOffsets:
    def _commit(self, command: ClientCommand, now_ns: int) -> list[Effect]:
        offsets = [OffsetEntry(topic=topic, partition=partition, offset=offset, metadata=metadata,
                               leader_epoch=self.client.known_leader_epoch(topic, partition),
                               topic_id=self.client.position_topic_id(topic, partition))
                   for topic, partition, offset, metadata in command.arguments["offsets"]]
        if self.state not in ("stable", "revoking") or self.generation < 0:
            return [Notify("result", (command.token, None, RailmqError(
                ErrorCode.REBALANCE_IN_PROGRESS, f"cannot commit while {self.state}; the group is rebalancing")))]
        request = OffsetCommitRequest(correlation_id=0, group_id=self.settings.group_id, generation=self.generation,
                                      member_id=self.member_id, member_secret=self.member_secret,
                                      group_instance_id=self.settings.group_instance_id, offsets=offsets)
        identity = (self.generation, self.member_id)  # what the answer's group errors are about
        return self._with_coordinator(command, lambda: self._send("commit", request, now_ns,
                                                                  (command.token, offsets, identity)))

    def _committed(self, command: ClientCommand, now_ns: int) -> list[Effect]:
        partitions = [tuple(tp) for tp in command.arguments["partitions"]]
        return self._with_coordinator(command, lambda: self._send(
            "user-fetch", OffsetFetchRequest(correlation_id=0, group_id=self.settings.group_id,
                                             partitions=partitions), now_ns, command.token))

    def _with_coordinator(self, command: ClientCommand, action: Any) -> list[Effect]:
        if not self.coordinator:  # refused now; the metadata asked for finds it for the next call
            return [Notify("result", (command.token, None, RailmqError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE, "the group coordinator is not known yet")))] + \
                self.client.request_metadata(list(self.topics))
        return action()

    def _on_commit_response(self, response: OffsetCommitResponse, token: Any, now_ns: int) -> list[Effect]:
        caller, asked, identity = token
        error = RailmqError(response.error, response.error_message) if response.error else None
        unconfirmed = _unconfirmed(asked, response.offsets) if error is None else []
        if unconfirmed:
            error = RailmqError(ErrorCode.UNKNOWN_SERVER_ERROR, (
                f"the coordinator's answer does not confirm the commit of {unconfirmed[:5]}: "
                "whether they are committed is unknown"))
        effects: list[Effect] = [Notify("result", (caller, response.offsets, error))]
        if response.error in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID) \
                and identity == (self.generation, self.member_id):
            # About the identity the commit went under. One sent before the member rejoined (its
            # answer late) speaks of an identity it no longer has: the commit failed, the member
            # did not (the simulator's seed 32126 of the network faults: a static member answered
            # FENCED_INSTANCE_ID for its old member id stopped for good, though it held the new one).
            effects += self._on_group_error(response.error, response.error_message, now_ns)
        return effects
