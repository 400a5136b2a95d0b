"""A node heartbeat that still carries the report of a replica process the coordinator has
already heard exit: the report is dropped (the dead stay dead), the heartbeat answered.

How it happens: a replica sends its node agent a report and dies; the agent reaps it, tells the
controller `ReplicaExited`, and only then reads the report waiting on its socket, which the next
heartbeat carries. Found by the simulator once its replicas reported through node agents: the
coordinator raised AttributeError on the report's missing answer, and an active controller that
raises dies (docs/failure-modes.md).
"""

from __future__ import annotations

from actors.messages import ReplicaExited
from tests.unit.test_coordinator import Cluster
from tests.unit.test_node_liveness import node_beat, report, started


def test_a_carried_report_of_a_process_already_exited_is_dropped_and_the_heartbeat_answered():
    cluster = Cluster()
    leader, replicas = started(cluster)
    last_words = report(cluster, leader)
    cluster.ask(ReplicaExited(topic="orders", partition=0, node=leader, incarnation=last_words.incarnation))
    assert cluster.record().leader != leader

    answer = node_beat(cluster, reports=[last_words])  # the agent read the dead process's last report late

    assert answer is not None and not answer.error
    assert cluster.record().leader != leader, "the exited incarnation came back to life"
