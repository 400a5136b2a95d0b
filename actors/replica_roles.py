"""How a partition replica changes role: the coordinator's partition state taken, leadership
taken, refused or left, the ISR updated, the replica stopped for good.

A mixin of `PartitionReplica` (actors/partition_replica.py), kept apart because it is the
replica's one state machine (unknown, leader, follower, stopped; the transitions are drawn at the
top of that module): which state wins (the higher leader epoch and partition epoch), what a
leader owes its clients and parked fetches when it leaves, and why a replica that knows its
storage is damaged refuses a clean election.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.effects import Effect, Exit, Trace
from actors.errors import ErrorCode
from actors.messages import AlterIsrResponse, PartitionState
from actors.replica_follower import FollowerRole
from actors.replica_leader import LeaderRole
from storage.errors import StorageError

if TYPE_CHECKING:
    from actors.partition_replica import PartitionReplica


class RoleChanges:
    def apply_state(self: "PartitionReplica", state: PartitionState, now_ns: int) -> list[Effect]:
        current = self.state
        if current is not None and (state.leader_epoch, state.partition_epoch) < (current.leader_epoch,
                                                                                  current.partition_epoch):
            return []  # older news
        if self.node not in state.replicas:
            return self._stop_for_good("this node no longer holds a replica of the partition")
        if state.leader == self.node and state.leader_incarnation not in (0, self.incarnation):
            # Elected was an earlier process of this node: this answer is late news (a new
            # incarnation never leads in its predecessor's epoch); the coordinator will elect again.
            return [Trace("stale-leadership-ignored", {"topic": self.topic, "partition": self.partition,
                                                       "leader_epoch": state.leader_epoch})]
        self.state = state
        if (state.config.retention_ms, state.config.retention_bytes) != (self.config.retention_ms,
                                                                          self.config.retention_bytes):
            self.log.set_retention(state.config.retention_ms, state.config.retention_bytes)
        self.config = state.config
        new_epoch = current is None or state.leader_epoch != current.leader_epoch
        if state.leader == self.node:
            if self.storage.damaged and state.last_unclean_epoch != state.leader_epoch:
                return self._refuse_leadership(now_ns)
            if self.role != "leader" or new_epoch:
                return self._become_leader(now_ns)
            if state.partition_epoch == current.partition_epoch:
                # The state it has, said again (a heartbeat answer): not the answer to a pending
                # ISR change, which would come with the next partition epoch. Taking it for one
                # would forget the proposal and count the ISR without the member it adds.
                return self.leader.after_log_growth(now_ns)
            return self._leader_isr_updated(now_ns)
        if self.role != "follower" or new_epoch:
            return self._become_follower(now_ns)
        if state.leader_endpoint and state.leader_endpoint != self.follower.leader_endpoint:
            return self.follower.leader_moved(state.leader_endpoint, now_ns)
        # Same leader: an empty endpoint only means the coordinator has not heard from it yet.
        return self.follower.nudge(now_ns) if (state.partition_epoch, state.isr) != (
            current.partition_epoch, current.isr) else []

    def _become_leader(self: "PartitionReplica", now_ns: int) -> list[Effect]:
        effects = self._leave_role(ErrorCode.NOT_LEADER, "leadership moved")
        effects += self.storage.on_elected()
        self.log.assign_epoch(self.state.leader_epoch, self.log.log_end_offset)
        self.role = "leader"
        self.leader = LeaderRole(self, now_ns)
        effects.append(Trace("became-leader", {"topic": self.topic, "partition": self.partition, "node": self.node,
                                               "leader_epoch": self.state.leader_epoch,
                                               "log_end_offset": self.log.log_end_offset,
                                               "high_watermark": self.high_watermark}))
        return effects + self.leader.after_log_growth(now_ns)

    def _refuse_leadership(self: "PartitionReplica", now_ns: int) -> list[Effect]:
        """Elected in a clean election while this replica knows its storage is damaged: the news
        of the damage has not reached the coordinator (lost, cut off), which believes it holds
        every committed offset. Leading would serve, and make followers truncate to, a log that
        lacks some. It leads nothing, says why at once, and waits for the next state — another
        leader to repair from, or an unclean election, which may choose it knowing."""
        if self.role == "unknown" and self.refused_epoch == self.state.leader_epoch:
            return []  # the same election said again: the report is already on its way
        self.refused_epoch = self.state.leader_epoch
        effects = self._leave_role(ErrorCode.NOT_LEADER, "this replica's storage is damaged: it does not lead")
        effects.append(Trace("leadership-refused", {
            "topic": self.topic, "partition": self.partition, "node": self.node,
            "leader_epoch": self.state.leader_epoch, "log_end_offset": self.log.log_end_offset,
            "damage": [(item.first_offset, item.last_offset) for item in self.storage.health.damage]}))
        return effects + self.heartbeat_now()

    def _leader_isr_updated(self: "PartitionReplica", now_ns: int) -> list[Effect]:
        self.leader.pending_isr = None
        # A follower that left the ISR gets its parked fetch answered now (it polls briskly from
        # then on): records that arrive later must not sit in the socket of a process the
        # cluster has given up on (paused, cut off) and be appended when it comes back.
        isr = self.state.isr
        left = self._answer_parked(lambda parked: self._read(parked.request)
                                   if 0 <= parked.replica and parked.replica not in isr else None,
                                   now_ns)
        return left + self.leader.after_log_growth(now_ns) + self.leader.complete_purgatory()

    def _become_follower(self: "PartitionReplica", now_ns: int) -> list[Effect]:
        effects = self._leave_role(ErrorCode.NOT_LEADER, "this replica is no longer the leader")
        self.role = "follower"
        self.follower = FollowerRole(self)
        try:
            effects += self.storage.prepare_to_follow()
        except StorageError as error:
            return effects + self.storage_failure(error)
        effects.append(Trace("became-follower", {"topic": self.topic, "partition": self.partition, "node": self.node,
                                                 "leader": self.state.leader, "leader_epoch": self.state.leader_epoch}))
        return effects + self.follower.begin(now_ns)

    def _leave_role(self: "PartitionReplica", code: ErrorCode, text: str) -> list[Effect]:
        effects: list[Effect] = []
        if self.leader is not None:
            effects += self.leader.abandon(code, text)
            self.leader = None
        self.follower = None
        effects += self._answer_parked(lambda parked: self._fetch_error(parked.request, code, text))
        self.role = "unknown"
        return effects

    def _stop_for_good(self: "PartitionReplica", reason: str) -> list[Effect]:
        effects = self._leave_role(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, reason)
        self.role = "stopped"
        return effects + [Trace("replica-stopped", {"reason": reason}), Exit(reason)]

    def _on_alter_isr_response(self: "PartitionReplica", response: AlterIsrResponse,
                               now_ns: int) -> list[Effect]:
        if self.leader is None or not self.leader.isr_answered(response.correlation_id):
            return []
        if response.state is not None:
            return self.apply_state(response.state, now_ns)
        return []
