"""When a replica says how it stands: its reports (`ReplicaHeartbeat`) and their cadence.

A report carries the replica's incarnation, endpoint, epochs, log range, committed offset and
storage health. Where it goes decides how often it is sent:

- to its node agent (`report_to`, the real cluster): once when anything in it changes (at most
  every `replica_heartbeat_interval_ms`, so a busy leader sends five a second, not one per
  batch) and otherwise a keepalive every `replica_keepalive_interval_ms`. The node agent sends
  the coordinator one `NodeHeartbeat` per interval for all its replicas (Kafka's broker
  heartbeat), with the reports that changed, and tells it which replicas stopped answering. An
  idle replica so sends one small local message per keepalive interval, and the coordinator
  hears from each node, not from each replica. Keepalives fall on shared instants (multiples of
  the interval on the host's clock, never less than half an interval after the last report), so
  the node agent reads a whole round of them in one wake-up instead of one wake-up each.
- straight to the coordinator (no node agent: tests of one actor, `SimConfig(node_agents=False)`): every
  `replica_heartbeat_interval_ms`, as the coordinator's session timeout expects.

Each report also records the committed offset in the log's checkpoint (it survives a restart
with the next flush).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors.actor import MS
from actors.effects import Effect, Send, SetTimer

if TYPE_CHECKING:
    from actors.partition_replica import PartitionReplica


class ReplicaReporter:
    def __init__(self, replica: "PartitionReplica", report_to: str) -> None:
        self.replica = replica
        self.via_node_agent = bool(report_to) and report_to not in replica.controllers
        self.node_agent = report_to if self.via_node_agent else ""
        self.last_sent_ns = -1
        self.last_sent: Any = None
        self.change_timer_armed = False

    @property
    def report_to(self) -> str:
        """The node agent, or else the controller believed active (it follows redirects)."""
        return self.node_agent or self.replica.coordinator

    @property
    def keepalive_ms(self) -> int:
        limits = self.replica.limits
        return limits.replica_keepalive_interval_ms if self.via_node_agent else limits.replica_heartbeat_interval_ms

    def start(self, now_ns: int) -> list[Effect]:
        return self.send(now_ns)

    def send(self, now_ns: int) -> list[Effect]:
        """A report now, and the keepalive restarted from now."""
        replica = self.replica
        replica.log.note_high_watermark(replica.committed_offset, replica.committed_epoch)
        message = replica.report_message()
        self.last_sent, self.last_sent_ns = self._key(), now_ns
        return [Send(self.report_to, message), SetTimer("heartbeat", self._keepalive_due(now_ns))]

    def _keepalive_due(self, now_ns: int) -> int:
        interval = self.keepalive_ms * MS
        if not self.via_node_agent:
            return now_ns + interval
        due = (now_ns // interval + 1) * interval  # the next shared instant...
        if due - now_ns < interval // 2:
            due += interval  # ...unless it is too soon after this report: at most 1.5 intervals apart
        return due

    def send_now(self) -> list[Effect]:
        """News that must not wait (storage damage found or repaired): a report now, timers as they are."""
        self.last_sent = self._key()
        return [Send(self.report_to, self.replica.report_message())]

    def _key(self) -> tuple:
        """What a report would say that a change of is news (it runs after every step, so it builds
        no message): equal exactly when the reports' endpoint, epochs, log range, committed offset
        and storage report are."""
        replica = self.replica
        state, log = replica.state, replica.log
        return (replica.endpoint, state.leader_epoch if state else -1, state.partition_epoch if state else -1,
                log.log_start_offset, log.log_end_offset, replica.committed_offset, replica.storage.report_key())

    def on_change_timer(self, now_ns: int) -> list[Effect]:
        self.change_timer_armed = False
        return self.after_handling(now_ns)

    def after_handling(self, now_ns: int) -> list[Effect]:
        """Through a node agent, a changed report goes out now, or once the shortest interval
        since the last one has passed."""
        if not self.via_node_agent or self.last_sent_ns < 0:
            return []
        if self._key() == self.last_sent:
            return []
        due_ns = self.last_sent_ns + self.replica.limits.replica_heartbeat_interval_ms * MS
        if now_ns >= due_ns:
            return self.send(now_ns)
        if self.change_timer_armed:
            return []
        self.change_timer_armed = True
        return [SetTimer("report", due_ns)]
