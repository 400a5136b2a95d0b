"""What a node agent knows of its replicas between two of its heartbeats (transport/node_agent.py).

Each replica process reports to its node agent; the agent keeps the latest report of each, sends
the coordinator the new ones with its next node heartbeat (at once when one is news: a new
incarnation, endpoint, epoch or storage state), and says of every replica whether it was heard
within its keepalive timeout. The simulator's agents keep the same book (chaos/sim_agents.py).
"""

from __future__ import annotations

from actors.messages import NodeHeartbeat, ReplicaHeartbeat, ReplicaLiveness


def _identity(report: ReplicaHeartbeat) -> tuple:
    return (report.incarnation, report.endpoint, report.leader_epoch, report.partition_epoch, report.storage.state)


class ReplicaReportBook:
    """The latest report of each replica process, when it came, and whether the coordinator has it."""

    def __init__(self, keepalive_timeout_ms: int) -> None:
        self.keepalive_timeout_ns = keepalive_timeout_ms * 1_000_000
        self.latest: dict[tuple[str, int, int], tuple[ReplicaHeartbeat, int]] = {}
        self.unsent: set[tuple[str, int, int]] = set()

    def take(self, report: ReplicaHeartbeat, now_ns: int) -> bool:
        """Keep the report; True if it is news that should not wait for the next heartbeat (a new
        incarnation or endpoint, new epochs, a new storage state): progress alone can wait."""
        key = (report.topic, report.partition, report.node)
        previous = self.latest.get(key)
        self.latest[key] = (report, now_ns)
        if previous is not None and previous[0] == report:
            return False
        self.unsent.add(key)
        return previous is None or _identity(previous[0]) != _identity(report)

    def forget(self, topic: str, partition: int, node: int, incarnation: int = 0) -> None:
        key = (topic, partition, node)
        known = self.latest.get(key)
        if known is not None and incarnation in (0, known[0].incarnation):
            del self.latest[key]
            self.unsent.discard(key)

    def heartbeat(self, nodes: list[int], version: str, now_ns: int, *, everything: bool,
                  agent_id: str = "") -> NodeHeartbeat:
        liveness = [ReplicaLiveness(topic=topic, partition=partition, node=node, incarnation=report.incarnation,
                                    responsive=now_ns - heard_ns <= self.keepalive_timeout_ns)
                    for (topic, partition, node), (report, heard_ns) in sorted(self.latest.items())]
        keys = sorted(self.latest) if everything else sorted(self.unsent)
        return NodeHeartbeat(correlation_id=0, nodes=nodes, replicas=liveness,
                             reports=[self.latest[key][0] for key in keys], assignments_version=version,
                             agent_id=agent_id)

    def delivered(self, heartbeat: NodeHeartbeat) -> None:
        for report in heartbeat.reports:
            key = (report.topic, report.partition, report.node)
            if self.latest.get(key, (None,))[0] == report:
                self.unsent.discard(key)
