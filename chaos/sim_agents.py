"""The node agents of the simulated cluster: one per node, as `railmq node` runs one.

Each node's replicas report to their node's agent (`report_to`, as in the real cluster): once
when something in their report changes and otherwise a keepalive on the shared instants of
actors/replica_reports.py. The agent keeps the latest report of each in the real agent's book
(transport/replica_report_book.py, `ReplicaReportBook`) and sends the active controller one
`NodeHeartbeat` per `node_heartbeat_interval_ms` for all of them — sooner, `NEWS_DELAY_MS` after
news — naming itself with an agent id new at every start, exactly the messages the real agent
sends. So the simulator's seeds go through the path that decides elections in a real cluster:
node liveness, a replica that stopped answering its agent, reports carried in a node's heartbeat,
a second agent for one node refused (actors/node_liveness.py).

What the agent's thread does with processes is the simulator's: when a replica dies, its node's
agent forgets it (`forget`, as `_report_exits` does) and tells the controller `ReplicaExited`
(the notice that chaos/sim_faults.py delays or loses). Creating topics and reporting the
assignments stays with `TinyAgent` (chaos/sim_hosts.py), for which the simulator starts hosts.
"""

from __future__ import annotations

from typing import Any, Callable

import msgspec

from actors.actor import MS
from actors.controller_endpoints import ControllerEndpoints
from actors.effects import Effect, Send, SetTimer
from actors.limits import Limits
from actors.messages import (
    ErrorResponse, NodeHeartbeat, NodeHeartbeatResponse, PeerDisconnected, ReplicaHeartbeat, TimerFired,
)
from transport.node_agent import NEWS_DELAY_MS
from transport.replica_report_book import ReplicaReportBook


REDIRECTS_PER_BEAT_MAX = 3


def node_agent_name(node: int) -> str:
    return f"node-agent/{node}"


def node_agent_endpoint(node: int) -> str:
    return f"sim://{node_agent_name(node)}"


class SimNodeAgent:
    """The liveness half of transport/node_agent.py's `NodeAgent`, as an actor."""

    def __init__(self, node: int, controllers: str, limits: Limits, agent_id: str,
                 running: Callable[[str, int], int]) -> None:
        self.node = node
        # The incarnation of the process the agent runs for a replica of its node (0: none runs),
        # as the real agent's supervisor knows it: reports from any other are not taken.
        self.running = running
        self.controllers = ControllerEndpoints(controllers)
        self.limits = limits
        self.agent_id = agent_id
        self.book = ReplicaReportBook(limits.replica_keepalive_timeout_ms)
        self.assignments_version = ""
        self.full_report_wanted = False
        self.correlation = 0
        self.in_flight: NodeHeartbeat | None = None  # the heartbeat sent last, until answered
        self.next_beat_ns = 0
        self.redirects = 0  # redirects followed since the last round
        self.refused = ""

    def start(self, now_ns: int) -> list[Effect]:
        return self._on_timer(now_ns)

    def invariants(self) -> None:
        assert self.book.unsent <= set(self.book.latest), "a report to send that the book does not hold"
        assert all(key[2] == self.node for key in self.book.latest), "a report of another node's replica"

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        if isinstance(message, TimerFired):
            return self._on_timer(now_ns) if now_ns >= self.next_beat_ns else []
        if isinstance(message, ReplicaHeartbeat):
            # Only about a replica of this node, from the process it runs, as the real agent takes
            # only its own processes' (an earlier one may still be alive: chaos/sim_zombies.py).
            if message.node != self.node or not self._from_running_process(message) \
                    or not self.book.take(message, now_ns):
                return []
            soon = now_ns + NEWS_DELAY_MS * MS
            if soon < self.next_beat_ns:  # news: it waits a moment for more to share its heartbeat
                self.next_beat_ns = soon
                return [SetTimer("beat", soon)]
            return []
        if isinstance(message, (NodeHeartbeatResponse, ErrorResponse)):
            beat = self.in_flight
            if beat is None or message.correlation_id != beat.correlation_id:
                return []  # an answer to an earlier heartbeat: the book moved on since
            self.in_flight = None
            if self.controllers.take(message):
                # The voter named the active one (or none): follow, a few times per round, as
                # the real agent's request_controller does within its timeout.
                if self.redirects < REDIRECTS_PER_BEAT_MAX:
                    self.redirects += 1
                    return [self._send(now_ns)]
                return []
            if isinstance(message, NodeHeartbeatResponse):
                self._on_answer(message, beat)
            return []
        if isinstance(message, PeerDisconnected) and message.endpoint == self.controllers.current:
            self.controllers.rotate()
        return []

    def _from_running_process(self, report: ReplicaHeartbeat) -> bool:
        return report.incarnation == self.running(report.topic, report.partition)

    def forget(self, topic: str, partition: int, incarnation: int) -> None:
        """The replica's process exited (the agent reaped it)."""
        self.book.forget(topic, partition, self.node, incarnation)

    def _on_timer(self, now_ns: int) -> list[Effect]:
        if self.in_flight is not None:
            self.controllers.rotate()  # the last heartbeat went unanswered: that voter may be gone
        self.redirects = 0
        self.next_beat_ns = now_ns + self.limits.node_heartbeat_interval_ms * MS
        return [self._send(now_ns), SetTimer("beat", self.next_beat_ns)]

    def _send(self, now_ns: int) -> Send:
        self.correlation += 1
        self.in_flight = msgspec.structs.replace(
            self.book.heartbeat([self.node], self.assignments_version, now_ns, everything=self.full_report_wanted,
                                agent_id=self.agent_id),
            correlation_id=self.correlation)
        return Send(self.controllers.current, self.in_flight)

    def _on_answer(self, answer: NodeHeartbeatResponse, beat: NodeHeartbeat) -> None:
        if answer.error:
            self.refused = answer.error_message  # a second agent for this node: refused for now
            return
        self.refused = ""
        self.book.delivered(beat)
        self.full_report_wanted = answer.full_report_wanted
        if answer.assignments is not None:
            self.assignments_version = answer.assignments_version
