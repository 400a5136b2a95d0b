"""How a member takes the assignment SyncGroup gives it: checking it, giving up what moved away,
and starting the new partitions from the group's committed offsets.

A mixin of `ConsumerMember` (actors/consumer_member.py), which runs the assignor as leader and
sends SyncGroup; this class never computes an assignment, it only takes one:
- An assignment must decode (at most `LONG_LIST_MAX` partitions), and name only subscribed topics
  and partitions that can exist (numbered below `PARTITIONS_PER_TOPIC_CEILING`: a hostile answer
  naming a million made a member hold 495 MB and take 1.5 s a step); a
  leader's own must be what it assigned itself (the coordinator hands each member what the
  leader sent). One that is refused is taken not at all, and the member asks the group again,
  as Kafka's consumer does with an assignment that does not match its subscription — after a
  backoff (`join_after_backoff`), so a coordinator sending only such answers is not asked once
  per round trip.
- Cooperative (KIP-429): the member keeps what it owns and revokes only what the new assignment
  moves away (in the user's thread: a ("revoke", ...) notification), then rejoins so the new
  owner can have it.
- Positions of newly assigned partitions come from the group's committed offsets (with the
  leader epoch each was committed under), or `auto_offset_reset` (the consumer client's, for a
  partition with none) — except that `latest` is for a topic new to the group: a partition
  without a commit in a topic the group has commits for (one the topic gained, or one whose
  owner died before its first commit) holds records written while the group read the topic,
  and starts from its beginning (Kafka's KAFKA-12261: at its end, the group skipped them). The
  committed offsets are asked for whole, so the answer shows the other partitions. An answer about an
  earlier generation, or one that comes after the member stopped being stable or revoking,
  changes nothing. The shell hears ("assigned", ...) once the positions are known.
"""

from __future__ import annotations

import msgspec

from actors.effects import Effect, Notify, Trace
from actors.errors import ErrorCode
from actors.consumer_client import EARLIEST
from actors.limits import PARTITIONS_PER_TOPIC_CEILING
from actors.messages import (
    ConsumerAssignment, OffsetEntry, OffsetFetchRequest, OffsetFetchResponse, SyncGroupResponse,
)

_assignment_decoder = msgspec.msgpack.Decoder(ConsumerAssignment)


class AssignmentIntake:
    def _on_sync_response(self, response: SyncGroupResponse, now_ns: int) -> list[Effect]:
        if response.error != ErrorCode.NONE:
            return self._on_group_error(response.error, response.error_message, now_ns)
        partitions, refused = self._assignment_of(response.assignment)
        if refused:
            # Kafka's consumer does the same with an assignment that does not match its
            # subscription: take none of it, and ask the group again.
            return [Trace("member-assignment-refused", {"generation": self.generation, "reason": refused})] + \
                self.join_after_backoff(f"the assignment was refused: {refused}", now_ns)
        self.broken_answers = 0
        previous = set(self.owned)
        added = [tp for tp in partitions if tp not in previous]
        revoked = [tp for tp in self.owned if tp not in set(partitions)]
        self.state = "stable"
        self.last_heartbeat_ns = now_ns
        effects: list[Effect] = [Trace("member-assigned", {"generation": self.generation, "member": self.member_id,
                                                           "partitions": partitions})]
        if revoked:
            # Cooperative: give up what moved away, then rejoin so the new owner can have it.
            self.owned = [tp for tp in self.owned if tp not in set(revoked)]
            self.client.assign(self.owned, now_ns)
            self.state = "revoking"
            self.join_after_revoke = True
            effects.append(self._revoke(revoked, lost=False))
        kept = [tp for tp in partitions if tp in previous]
        return effects + self._ask_positions(kept, added, now_ns)

    def _assignment_of(self, data: bytes) -> tuple[list[tuple[str, int]], str]:
        """The partitions an assignment gives this member, and why it is refused ("" if it is
        not): it must decode, and name only subscribed topics and partitions that can exist."""
        try:
            partitions = sorted({(topic, partition) for topic, partition in _assignment_decoder.decode(data).partitions}) \
                if data else []
        except msgspec.DecodeError as error:
            return [], f"it does not decode ({error})"
        subscribed = set(self.topics)
        most = PARTITIONS_PER_TOPIC_CEILING  # no cluster's topic has a partition past it
        strays = [tp for tp in partitions if tp[0] not in subscribed or not 0 <= tp[1] < most]
        if strays:
            return [], f"{strays[:10]} are not partitions of the subscribed topics {sorted(subscribed)[:10]}"
        if self.computed_own is not None and partitions != self.computed_own:
            # The coordinator hands each member what the leader sent: this leader knows its own.
            return [], f"the leader assigned itself {self.computed_own[:10]}, not {partitions[:10]}"
        return partitions, ""

    def _ask_positions(self, kept: list[tuple[str, int]], added: list[tuple[str, int]],
                       now_ns: int) -> list[Effect]:
        """The committed offsets of the newly assigned partitions (none new: the assignment is
        complete now)."""
        if added:  # every committed offset of the group (partitions=None): see _resets_of
            return self._send("positions", OffsetFetchRequest(correlation_id=0, group_id=self.settings.group_id,
                                                              partitions=None),
                              now_ns, (self.generation, kept, added))
        return [Notify("assigned", (self.generation, self.member_id, list(self.owned), []))]

    def _on_positions(self, response: OffsetFetchResponse, extra: tuple, now_ns: int) -> list[Effect]:
        generation, kept, added = extra
        if generation != self.generation or self.state not in ("stable", "revoking"):
            return []
        committed = {(entry.topic, entry.partition): entry for entry in response.offsets if entry.offset >= 0}
        mine = [committed[tp] for tp in added if tp in committed]
        positions = {(entry.topic, entry.partition): entry.offset for entry in mine}
        epochs = {(entry.topic, entry.partition): entry.leader_epoch for entry in mine}
        topic_ids = {(entry.topic, entry.partition): entry.topic_id for entry in mine}
        resets = self._resets_of([tp for tp in added if tp not in committed], committed)
        self.owned = sorted(set(self.owned) | set(added))
        effects = self.client.assign(self.owned, now_ns, positions, leader_epochs=epochs, topic_ids=topic_ids,
                                     resets=resets)
        if resets:
            effects.append(Trace("partition-new-to-a-reading-group", {"generation": self.generation,
                                                                      "partitions": sorted(resets)}))
        return [Notify("assigned", (self.generation, self.member_id, list(self.owned), list(added)))] + effects

    def _resets_of(self, uncommitted: list[tuple[str, int]],
                   committed: dict[tuple[str, int], OffsetEntry]) -> dict[tuple[str, int], int]:
        """EARLIEST for each partition without a commit whose topic the group has commits for
        (of this topic's id, when both are known), when the consumer would start it at the end."""
        if self.client.settings.auto_offset_reset != "latest":
            return {}
        read: set[str] = set()
        for (topic, _), entry in committed.items():
            metadata = self.client.topics.get(topic)
            current = metadata.topic_id if metadata is not None else 0
            if not entry.topic_id or not current or entry.topic_id == current:
                read.add(topic)
        return {tp: EARLIEST for tp in uncommitted if tp[0] in read}
