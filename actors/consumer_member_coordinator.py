"""How a group member reaches its coordinator: finding it in metadata, numbering and timing out
the requests it sends there, and giving them up when the coordinator's process is gone.

A mixin of `ConsumerMember` (actors/consumer_member.py), kept apart because the link to the
coordinator has its own rules, whatever the request is for:
- Every request carries a correlation id of its own (the client's counter), a deadline, and the
  endpoint it went to; an answer from anywhere else is not an answer to anything asked there (a
  server reusing a correlation id). `handle` routes each answer by the kind its request was sent
  with: this class interprets none of them.
- With no coordinator known nothing is sent: metadata is asked for instead, and a join, sync or
  positions request leaves the member unjoined, so it never waits in "syncing" for good (the
  simulator's seed 20326).
- A request that will never be answered (its deadline passed, or the coordinator it went to is
  gone or replaced) ends as a timeout. A join or sync whose deadline passed while the member
  still joins is asked again; otherwise the member finds the coordinator again (it may have
  restarted elsewhere), a user's commit or committed-offsets call gets REQUEST_TIMED_OUT, and a
  join, sync or positions request leaves the member unjoined. Nothing is re-sent to a
  coordinator whose answers are lost.
- A coordinator's process that disconnected is distrusted for UNREACHABLE_MS: metadata that still
  names it (the cluster coordinator may not know yet) is not followed, unless a new process
  announced itself there (another incarnation). At most UNREACHABLE_ENDPOINTS_MAX dead
  incarnations are remembered.
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.actor import MS
from actors.client_metadata import distrust
from actors.controller_endpoints import named_endpoint
from actors.effects import Effect, Notify, Send, Trace
from actors.errors import ErrorCode, RailmqError
from actors.messages import MetadataResponse

UNREACHABLE_MS = 3000  # a dead coordinator's endpoint is distrusted this long (unless a new process announces it)
UNREACHABLE_ENDPOINTS_MAX = 64  # dead coordinators remembered (their incarnations): bounded


def caller_of(kind: str, token: Any) -> Any:
    """The shell's token of a pending request (a commit's also holds the offsets it asked)."""
    return token[0] if kind == "commit" else token


class CoordinatorLink:
    def _send(self, kind: str, message: Any, now_ns: int, token: Any = None, timeout_ms: int | None = None) -> list[Effect]:
        if not self.coordinator:  # find it first
            if kind in ("join", "sync", "positions"):
                # Nothing is pending to time out or be answered: the member must not wait in
                # "syncing" for good (the simulator's seed 20326). Unjoined, the metadata asked
                # for rejoins it once the coordinator is known.
                self.state = "unjoined"
            return self.client.request_metadata(list(self.topics))
        client = self.client
        client.correlation += 1
        message = msgspec.structs.replace(message, correlation_id=client.correlation)
        deadline = now_ns + (timeout_ms or self.settings.request_timeout_ms) * MS
        self.pending[client.correlation] = (kind, token, deadline, self.coordinator)
        return [Send(self.coordinator, message)]

    def _take_answer(self, message: Any, sender: Any) -> tuple[str, Any, int, str] | None:
        """The pending request an answer is for, if the answer came from where that request went."""
        correlation_id = getattr(message, "correlation_id", -1)
        entry = self.pending.get(correlation_id)
        if entry is None or entry[3] != sender:
            return None
        del self.pending[correlation_id]
        return entry

    def _on_busy(self, kind: str, token: Any, text: str, now_ns: int) -> list[Effect]:
        """A busy group quorum refused a request that writes (actors/group_quorum.py). A join is
        asked again after the backoff, the leader's sync too, in its generation: joining instead
        would start a new rebalance of the whole group. Nothing else is asked again (a leave
        lapses with the session; a user's commit hears BUSY)."""
        trace = Trace("member-busy", {"kind": kind, "message": text, "state": self.state})
        if kind == "join" and self.state == "joining":
            return [trace] + self.join_after_backoff(f"the group coordinator was busy: {text}", now_ns)
        if kind == "sync" and self.state == "syncing":
            self.sync_again = (now_ns + self._backoff_ms() * MS, token)
        return [trace]

    def _sync_again(self, now_ns: int) -> list[Effect]:
        """The leader's sync refused BUSY, unless the member has moved on since."""
        _, request = self.sync_again
        self.sync_again = None
        moved_on = (request.generation, request.member_id) != (self.generation, self.member_id)
        if self.state != "syncing" or moved_on:
            return []
        return self._send("sync", request, now_ns, request, timeout_ms=self._join_retry_ms())

    def _learn_coordinator(self, response: MetadataResponse, now_ns: int) -> list[Effect]:
        """Follow the coordinator metadata names, unless it is the dead process still named there
        or an endpoint no cluster process has (`named_endpoint`)."""
        effects: list[Effect] = []
        found = response.group_coordinator_endpoint
        found = found if named_endpoint(found) else ""
        if found and found == self.coordinator:
            self.coordinator_incarnation = response.group_coordinator_incarnation
        if found in self.unreachable and response.group_coordinator_incarnation not in (
                0, self.dead_incarnation.get(found, 0)):
            del self.unreachable[found]  # a new process announced itself there: not the dead one
        if found and found != self.coordinator and self.unreachable.get(found, 0) <= now_ns:
            self.coordinator_incarnation = response.group_coordinator_incarnation
            effects += self._abandon_pending(now_ns)  # asked of a coordinator that is gone
            self.coordinator = found
            effects.append(Trace("group-coordinator-found", {"endpoint": self.coordinator}))
        return effects

    def _expire_pending(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        for correlation, (kind, token, deadline, _) in list(self.pending.items()):
            if now_ns > deadline:
                del self.pending[correlation]
                effects += self._on_timeout(kind, token, now_ns)
        return effects

    def on_disconnect(self, endpoint: str, now_ns: int) -> list[Effect]:
        """The group coordinator's process is gone: its answers will never come, and metadata
        that still names it (the cluster coordinator may not know yet) is not trusted for a while."""
        distrust(self.unreachable, endpoint, now_ns + UNREACHABLE_MS * MS, now_ns)
        if endpoint == self.coordinator:
            self.dead_incarnation[endpoint] = self.coordinator_incarnation
            if len(self.dead_incarnation) > UNREACHABLE_ENDPOINTS_MAX:
                self.dead_incarnation.pop(next(iter(self.dead_incarnation)))
        if endpoint != self.coordinator:
            return []
        effects = self._abandon_pending(now_ns)
        self.coordinator = ""
        return effects

    def _abandon_pending(self, now_ns: int) -> list[Effect]:
        self.coordinator = ""  # nothing is re-sent to the coordinator whose answers are lost
        effects: list[Effect] = []
        for correlation, (kind, token, *_) in list(self.pending.items()):
            del self.pending[correlation]
            effects += self._on_timeout(kind, token, now_ns)
        return effects

    def _on_timeout(self, kind: str, token: Any, now_ns: int) -> list[Effect]:
        if kind in ("join", "sync") and self.coordinator and self.state in ("joining", "syncing"):
            return [Trace("member-retrying", {"kind": kind})] + self._join(now_ns)
        self.coordinator = ""  # rediscover it: it may have restarted elsewhere
        effects = self.client.request_metadata(list(self.topics))
        if kind in ("commit", "user-fetch"):
            effects.append(Notify("result", (caller_of(kind, token), None, RailmqError(
                ErrorCode.REQUEST_TIMED_OUT, "the group coordinator did not answer"))))
        if kind in ("join", "sync", "positions"):
            self.state = "unjoined"
        return effects
