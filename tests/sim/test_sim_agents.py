"""The simulated node agents (chaos/sim_agents.py): replicas report to their node's agent, the
controller hears each node, a dead replica is forgotten by its agent, and an agent follows a
controller's redirect a bounded number of times per heartbeat round."""

from __future__ import annotations

import collections

import msgspec
import pytest

from actors.errors import ErrorCode
from actors.messages import ErrorResponse, NodeHeartbeat, NodeHeartbeatResponse, ReplicaHeartbeat, TimerFired
from chaos.sim_agents import REDIRECTS_PER_BEAT_MAX, SimNodeAgent, node_agent_name
from chaos.sim_network import MS
from chaos.simulator import SIM_LIMITS, START_NS, SimConfig, Simulator

pytestmark = pytest.mark.sim

QUIET = SimConfig(faults=(), duration_ms=2000, recovery_ms=1000)


def counted_run(config: SimConfig, seed: int = 7) -> tuple[Simulator, collections.Counter]:
    """A run with every delivered message counted by (receiving host kind, message type)."""
    sim = Simulator(seed, config)
    seen: collections.Counter = collections.Counter()
    step = sim._step

    def counting(host, message, sender):
        seen[(host.kind, type(message).__name__)] += 1
        step(host, message, sender)
    sim._step = counting
    sim.run().raise_for_problems()
    return sim, seen


def heartbeat_in(effects: list) -> NodeHeartbeat | None:
    return next((effect.message for effect in effects if isinstance(getattr(effect, "message", None), NodeHeartbeat)),
                None)


def test_replicas_report_to_their_nodes_agent_and_the_controller_hears_each_node():
    sim, seen = counted_run(QUIET)
    assert seen[("coordinator", "ReplicaHeartbeat")] == 0, "a replica reported straight to a controller"
    assert seen[("node-agent", "ReplicaHeartbeat")] > 0 and seen[("coordinator", "NodeHeartbeat")] > 0
    coordinator = sim.coordinator()
    for node in range(1, QUIET.nodes + 1):
        agent = sim.hosts[node_agent_name(node)]
        assert coordinator.node_owners[node][0] == agent.actor.agent_id
        replicas = {host.state["topic_partition"] for host in sim.hosts.values()
                    if host.kind == "replica" and host.node == node and host.alive}
        assert {(topic, partition) for topic, partition, _ in agent.actor.book.latest} == replicas


def test_without_node_agents_the_replicas_report_straight_to_the_coordinator():
    _, seen = counted_run(SimConfig(faults=(), duration_ms=2000, recovery_ms=1000, node_agents=False))
    assert seen[("coordinator", "ReplicaHeartbeat")] > 0 and seen[("coordinator", "NodeHeartbeat")] == 0


def test_a_crashed_replica_is_forgotten_by_its_agent_and_its_leadership_moves():
    sim = Simulator(7, QUIET)
    sim.build()
    sim.run_until(START_NS + 3000 * MS)
    record = sim.coordinator().partitions[("sim", 0)]
    leader = f"replica/sim/0/n{record.leader}"
    agent = sim.hosts[node_agent_name(record.leader)].actor
    assert ("sim", 0, record.leader) in agent.book.latest

    sim.faults.crash(leader, restart=False)
    sim.run_until(sim.now_ns + 1500 * MS)

    assert ("sim", 0, record.leader) not in agent.book.latest
    assert sim.coordinator().partitions[("sim", 0)].leader not in (record.leader, -1)


def test_an_agent_follows_redirects_a_bounded_number_of_times_per_round():
    agent = SimNodeAgent(1, "sim://controller/1,sim://controller/2,sim://controller/3", SIM_LIMITS, "a-1",
                         lambda topic, partition: 3)
    sent = agent.start(0)
    rounds = 0
    for _ in range(10):  # every voter says another leads, or that none does
        beat = heartbeat_in(sent)
        sent = agent.handle(ErrorResponse(correlation_id=beat.correlation_id, error=ErrorCode.NOT_CONTROLLER,
                                          error_message="no voter is known to be active"), b"", 0)
        if not sent:
            break
        rounds += 1
    assert rounds == REDIRECTS_PER_BEAT_MAX

    due = SIM_LIMITS.node_heartbeat_interval_ms * MS
    again = agent.handle(TimerFired(name="beat"), b"", due)
    assert heartbeat_in(again) is not None, "the next round asks again"


def test_an_answer_to_an_earlier_heartbeat_does_not_mark_newer_reports_delivered():
    agent = SimNodeAgent(1, "sim://controller/1", SIM_LIMITS, "a-1", lambda topic, partition: 3)
    first = heartbeat_in(agent.start(0))
    report = ReplicaHeartbeat(topic="sim", partition=0, node=1, endpoint="sim://r", pid=1, incarnation=3)
    agent.handle(report, b"", 1 * MS)
    agent.handle(TimerFired(name="beat"), b"", agent.next_beat_ns)  # the news goes out in a second heartbeat
    agent.handle(NodeHeartbeatResponse(correlation_id=first.correlation_id), b"", 30 * MS)
    assert ("sim", 0, 1) in agent.book.unsent, "the answer to the first heartbeat took the second one's report"


def test_an_agent_takes_a_report_only_from_the_process_it_runs():
    """As the real agent (transport/node_agent.py): an earlier process of the replica still alive
    (chaos/sim_zombies.py) reports in vain; the process the node runs now is heard."""
    agent = SimNodeAgent(1, "sim://controller/1", SIM_LIMITS, "a-1", lambda topic, partition: 3)
    agent.start(0)
    zombie = ReplicaHeartbeat(topic="sim", partition=0, node=1, endpoint="sim://r#1", pid=1, incarnation=2)
    agent.handle(zombie, b"", 1 * MS)
    assert ("sim", 0, 1) not in agent.book.latest
    agent.handle(msgspec.structs.replace(zombie, endpoint="sim://r#2", incarnation=3), b"", 2 * MS)
    assert agent.book.latest[("sim", 0, 1)][0].incarnation == 3
