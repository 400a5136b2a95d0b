"""Node heartbeats (actors/node_liveness.py, transport/node_agent.py's ReplicaReportBook): the
coordinator judges replicas by their node agent's word, hears each node, not each replica, and
sends a node agent its assignments only when they changed."""

from __future__ import annotations

import contextlib
import itertools
import time

import msgspec
import pytest

from actors.errors import ErrorCode
from actors.messages import (
    NodeHeartbeat, NodeHeartbeatResponse, ReplicaHeartbeat, ReplicaHeartbeatResponse, ReplicaLiveness, StorageReport,
)
from tests.unit.test_coordinator import CREATION_GRACE_MS, LIMITS, Cluster, endpoint
from transport.replica_report_book import ReplicaReportBook

AGENT = "node-agent"
MS = 1_000_000


@pytest.fixture
def world() -> Cluster:
    return Cluster()


def report(cluster: Cluster, node: int, partition: int = 0, **fields) -> ReplicaHeartbeat:
    key = ("orders", partition, node)
    incarnation = cluster.incarnations.setdefault(key, 1000 * node + partition + 1)
    return ReplicaHeartbeat(topic="orders", topic_id=cluster.coordinator.topics["orders"].topic_id, partition=partition,
                            node=node, endpoint=endpoint("orders", partition, node), pid=node,
                            incarnation=incarnation, **fields)


BEAT_IDS = itertools.count(7)  # an agent numbers its heartbeats upwards, as transport/rpc.py does


def node_beat(cluster: Cluster, *, reports=(), unresponsive=(), version: str = "", nodes=(1, 2, 3),
              partitions=(0,), agent_id: str = "agent-a", about=None, leaving: bool = False,
              correlation_id: int | None = None) -> NodeHeartbeatResponse:
    """One heartbeat from the node agent `agent_id` for `nodes`, with liveness for the replicas of
    `about` (its own nodes unless told otherwise)."""
    liveness = [ReplicaLiveness(topic="orders", partition=partition, node=node,
                                incarnation=cluster.incarnations.get(("orders", partition, node), 1000 * node + 1),
                                responsive=node not in unresponsive)
                for partition in partitions for node in (nodes if about is None else about)]
    beat = NodeHeartbeat(correlation_id=next(BEAT_IDS) if correlation_id is None else correlation_id, nodes=list(nodes), replicas=liveness, reports=list(reports),
                         assignments_version=version, agent_id=agent_id, leaving=leaving)
    cluster.harness.deliver("coordinator", beat, AGENT)
    answers = cluster.harness.take(AGENT, NodeHeartbeatResponse)
    return answers[-1] if answers else None


def started(cluster: Cluster) -> tuple[int, list[int]]:
    cluster.create("orders")
    replicas = cluster.replicas()
    node_beat(cluster, reports=[report(cluster, node) for node in replicas])
    for _ in range(CREATION_GRACE_MS // LIMITS.node_heartbeat_interval_ms + 1):
        cluster.harness.advance(LIMITS.node_heartbeat_interval_ms)
        node_beat(cluster)
    assert cluster.record().leader == replicas[0]
    return replicas[0], replicas


def test_replicas_stay_alive_on_their_node_agents_heartbeats_alone(world):
    cluster = world
    leader, replicas = started(cluster)
    epoch = cluster.record().leader_epoch

    for _ in range(10):  # ten node sessions of silence from the replicas themselves
        cluster.harness.advance(LIMITS.node_heartbeat_interval_ms)
        node_beat(cluster)
        cluster.harness.advance(LIMITS.node_session_timeout_ms - LIMITS.node_heartbeat_interval_ms)
        node_beat(cluster)

    assert (cluster.record().leader, cluster.record().leader_epoch, cluster.record().isr) == (leader, epoch, replicas)


def test_a_replica_its_agent_calls_unresponsive_is_replaced_at_once(world):
    cluster = world
    leader, replicas = started(cluster)

    node_beat(cluster, unresponsive={leader})

    assert cluster.record().leader == replicas[1]
    assert leader not in cluster.record().isr


def test_when_the_node_agent_goes_silent_its_replicas_are_judged_after_the_node_session(world):
    cluster = world
    leader, replicas = started(cluster)

    cluster.harness.advance(LIMITS.node_session_timeout_ms - 100)
    assert cluster.record().leader == leader, "still inside the node session"
    cluster.harness.advance(200)

    assert cluster.record().leader != leader or cluster.record().offline_reason


def test_a_second_node_agent_for_a_running_node_is_refused_and_changes_nothing(world):
    """Node 2 started twice (a cloned machine, a second `railmq node --node 2` elsewhere): the
    agent the coordinator hears now keeps the node; the other is refused with a typed error, gets
    no assignments (so it starts no replicas) and cannot call the node's replicas dead."""
    cluster = world
    leader, replicas = started(cluster)
    epoch = cluster.record().leader_epoch

    refused = node_beat(cluster, nodes=(leader,), unresponsive={leader}, agent_id="agent-b")

    assert refused.error == ErrorCode.DUPLICATE_BROKER_REGISTRATION
    assert "agent-a" in refused.error_message and f"node {leader}" in refused.error_message
    assert refused.assignments is None
    assert (cluster.record().leader, cluster.record().leader_epoch) == (leader, epoch)
    assert node_beat(cluster).error == 0, "the running agent keeps its nodes"


def test_a_node_agent_takes_a_node_over_once_the_previous_one_is_silent_for_a_node_session(world):
    cluster = world
    leader, replicas = started(cluster)

    cluster.harness.advance(LIMITS.node_session_timeout_ms - 100)
    assert node_beat(cluster, agent_id="agent-b").error == ErrorCode.DUPLICATE_BROKER_REGISTRATION
    cluster.harness.advance(200)
    restarted = node_beat(cluster, agent_id="agent-b")

    assert restarted.error == 0 and restarted.assignments is not None
    assert node_beat(cluster, agent_id="agent-a").error == ErrorCode.DUPLICATE_BROKER_REGISTRATION, (
        "the old agent, back from a pause, is now the second one")


def test_the_agent_that_runs_a_node_is_remembered_by_the_next_coordinator(world):
    """The agent is recorded with the metadata: after the coordinator restarts (a controller
    failover), a second agent heard before the first is still the second one — it was the race
    the multi-host clone once won, starting node 2's replicas on the clone — until the recorded one
    has been silent for a session from the new coordinator's start."""
    cluster = world
    started(cluster)
    cluster.restart()

    assert node_beat(cluster, agent_id="agent-b").error == ErrorCode.DUPLICATE_BROKER_REGISTRATION
    assert node_beat(cluster).error == 0
    cluster.restart()
    cluster.harness.advance(LIMITS.node_session_timeout_ms + 100)  # the recorded agent never came back
    assert node_beat(cluster, agent_id="agent-b").error == 0


def test_an_agent_that_stops_cleanly_hands_its_nodes_over_at_once(world):
    cluster = world
    started(cluster)

    assert node_beat(cluster, leaving=True).error == 0
    cluster.restart()  # and the record of it is gone too
    assert node_beat(cluster, agent_id="agent-b").error == 0


def test_a_heartbeat_speaking_for_a_node_it_does_not_name_or_the_cluster_lacks_is_refused(world):
    """A header is a claim: a heartbeat for node 1 that says node 2's replica stopped answering,
    or one for a node the cluster does not have, takes nothing."""
    cluster = world
    leader, replicas = started(cluster)
    other = next(node for node in (1, 2, 3) if node != leader)

    misnamed = node_beat(cluster, nodes=(other,), about=(leader,), unresponsive={leader})
    unknown = node_beat(cluster, nodes=(1, 2, 3, 9), agent_id="agent-a")

    assert misnamed.error == ErrorCode.INVALID_REQUEST and f"node {leader}" in misnamed.error_message
    assert unknown.error == ErrorCode.INVALID_REQUEST and "9" in unknown.error_message
    assert cluster.record().leader == leader and leader in cluster.record().isr


def test_assignments_travel_only_when_they_changed_and_a_restarted_coordinator_asks_for_every_report(world):
    cluster = world
    started(cluster)
    first = node_beat(cluster)
    assert first.assignments is not None and len(first.assignments) == 3
    unchanged = node_beat(cluster, version=first.assignments_version)
    assert unchanged.assignments is None and unchanged.full_report_wanted is False

    cluster.create("payments")
    grown = node_beat(cluster, version=first.assignments_version)
    assert grown.assignments is not None and len(grown.assignments) == 6

    cluster.restart()
    after_restart = node_beat(cluster, version=grown.assignments_version)
    assert after_restart.full_report_wanted, "it has none of the replicas' reports"


def test_each_nodes_agent_gets_its_own_nodes_assignments_round_after_round(world):
    """One agent per node, in turn, as a real cluster runs them: the answers the coordinator keeps
    for each set of nodes never hand one node's replicas to another, before and after a topic is
    added."""
    cluster = world
    cluster.create("orders")
    for topic, rounds in (("orders", 2), ("payments", 2)):
        if topic == "payments":
            cluster.create("payments")
        for _ in range(rounds):
            for node in (1, 2, 3):
                answer = node_beat(cluster, nodes=(node,), agent_id=f"agent-{node}")
                assert answer.error == ErrorCode.NONE, answer.error_message
                assert answer.assignments, f"node {node} got no assignments"
                assert {assignment.node for assignment in answer.assignments} == {node}
                assert {assignment.topic for assignment in answer.assignments} == (
                    {"orders"} if topic == "orders" else {"orders", "payments"})


def test_a_replica_whose_last_report_shows_older_epochs_gets_the_state_pushed_again_at_most_once_a_session(world):
    cluster = world
    leader, replicas = started(cluster)
    follower = replicas[1]
    stale = report(cluster, follower, leader_epoch=-1, partition_epoch=-1)
    node_beat(cluster, reports=[stale])
    cluster.harness.take(endpoint("orders", 0, follower), ReplicaHeartbeatResponse)

    for _ in range(LIMITS.node_session_timeout_ms // LIMITS.node_heartbeat_interval_ms):
        cluster.harness.advance(LIMITS.node_heartbeat_interval_ms)
        node_beat(cluster)
    cluster.harness.advance(1)
    node_beat(cluster)
    node_beat(cluster)

    pushed = cluster.harness.take(endpoint("orders", 0, follower), ReplicaHeartbeatResponse)
    assert len(pushed) == 1 and pushed[0].state.leader == leader
    assert cluster.record().leader == leader, "nobody was judged: the node heartbeats kept coming"


def test_a_follower_reporting_current_epochs_but_no_leader_endpoint_gets_the_state_pushed_again(world):
    cluster = world
    leader, replicas = started(cluster)
    record = cluster.record()
    current = {"leader_epoch": record.leader_epoch, "partition_epoch": record.partition_epoch}
    lost, knows = replicas[1], replicas[2]
    node_beat(cluster, reports=[report(cluster, lost, leader_endpoint="", **current),
                                report(cluster, knows, leader_endpoint=endpoint("orders", 0, leader), **current)])
    for node in replicas:
        cluster.harness.take(endpoint("orders", 0, node), ReplicaHeartbeatResponse)

    for _ in range(LIMITS.node_session_timeout_ms // LIMITS.node_heartbeat_interval_ms):
        cluster.harness.advance(LIMITS.node_heartbeat_interval_ms)  # the agent has nothing new to carry
        node_beat(cluster)
    cluster.harness.advance(1)
    node_beat(cluster)
    assert cluster.record().leader_epoch == record.leader_epoch and cluster.record().isr == record.isr

    pushed = cluster.harness.take(endpoint("orders", 0, lost), ReplicaHeartbeatResponse)
    assert len(pushed) == 1 and pushed[0].state.leader_endpoint == endpoint("orders", 0, leader)
    assert cluster.harness.take(endpoint("orders", 0, knows), ReplicaHeartbeatResponse) == []


def test_a_carried_report_of_storage_damage_is_taken_as_if_the_replica_had_sent_it(world):
    cluster = world
    leader, replicas = started(cluster)

    node_beat(cluster, reports=[report(cluster, leader, storage=StorageReport(state="damaged", damage=[(0, 5)]))])

    assert cluster.coordinator.liveness[("orders", 0, leader)].storage.state == "damaged"
    assert cluster.harness.trace_events("replica-storage")


def test_a_delayed_copy_of_an_earlier_heartbeat_does_not_undo_what_a_later_one_said(world):
    """The simulator's seed 4333 (faults every 150-600 ms): a wiped replica repaired and its agent
    reported "ok"; then a copy of an earlier heartbeat, held up by a lossy network, arrived with
    the report "new" (an empty directory) — and an older process's report too. The coordinator
    took them, refused the replica's ISR seat for good (it never reported again: nothing changed
    on its side), and with the ISR below min_insync the high watermark stayed behind ten
    acknowledged writes. An agent numbers its heartbeats upwards: one numbered at or below the
    last taken from the same agent is stale, and changes nothing."""
    cluster = world
    leader, replicas = started(cluster)
    follower = replicas[1]
    node_beat(cluster, reports=[report(cluster, follower, storage=StorageReport(state="new"))], correlation_id=900)
    node_beat(cluster, reports=[report(cluster, follower, storage=StorageReport(state="ok"))], correlation_id=901)

    late = node_beat(cluster, reports=[report(cluster, follower, storage=StorageReport(state="new"))],
                     unresponsive={leader}, correlation_id=900)

    assert late is None, "a stale heartbeat is not answered: its agent has moved on"
    assert cluster.coordinator.liveness[("orders", 0, follower)].storage.state == "ok"
    assert cluster.record().leader == leader, "its liveness claims were not taken either"
    assert node_beat(cluster, correlation_id=902).error == 0
    assert node_beat(cluster, agent_id="agent-b", correlation_id=1).error == ErrorCode.DUPLICATE_BROKER_REGISTRATION


def test_the_first_heartbeat_of_an_agent_without_an_id_is_taken(world):
    """The fuzzer's case: an agent id of "" (the default) for a node never heard from matched the
    empty placeholder of the order check, which then read a number it did not have (KeyError)."""
    cluster = world
    started(cluster)
    cluster.coordinator.node_beats.clear()
    cluster.coordinator.node_owners.clear()  # nobody runs node 1 yet: the heartbeat is not refused

    answer = node_beat(cluster, agent_id="", nodes=(1,), about=(), correlation_id=2)

    assert answer is not None


def test_an_idle_cluster_never_wakes_the_coordinator_while_node_heartbeats_keep_coming(world):
    cluster = world
    started(cluster)
    fired_before = len([step for step in cluster.harness.steps_of("coordinator") if step.message.__class__.__name__ ==
                        "TimerFired"])
    for _ in range(20):
        cluster.harness.advance(LIMITS.node_heartbeat_interval_ms)
        node_beat(cluster)

    fired = len([step for step in cluster.harness.steps_of("coordinator")
                 if step.message.__class__.__name__ == "TimerFired"])
    assert fired == fired_before, "the liveness timer kept moving ahead of the heartbeats"


# ---------------------------------------------------------------------------- the agent's book


def beat(node: int = 1, incarnation: int = 5, **fields) -> ReplicaHeartbeat:
    return ReplicaHeartbeat(topic="orders", partition=0, node=node, endpoint=f"tcp://127.0.0.1:{node}", pid=1,
                            incarnation=incarnation, **fields)


def test_the_book_calls_a_new_incarnation_epoch_or_storage_state_news_and_progress_not():
    book = ReplicaReportBook(keepalive_timeout_ms=3000)

    assert book.take(beat(), 0) is True
    assert book.take(beat(), 1) is False, "a keepalive"
    assert book.take(beat(log_end_offset=10), 2) is False, "progress waits for the next heartbeat"
    assert book.take(beat(leader_epoch=3), 3) is True
    assert book.take(beat(leader_epoch=3, storage=StorageReport(state="damaged")), 4) is True
    assert book.take(beat(incarnation=6, leader_epoch=3, storage=StorageReport(state="damaged")), 5) is True


def test_the_book_sends_what_changed_until_it_is_delivered_and_calls_a_silent_replica_unresponsive():
    book = ReplicaReportBook(keepalive_timeout_ms=3000)
    book.take(beat(1), 0)
    book.take(beat(2), 0)
    first = book.heartbeat([1, 2], "", 1000 * MS, everything=False)
    assert len(first.reports) == 2
    book.delivered(first)
    book.take(beat(2, log_end_offset=4), 2000 * MS)

    second = book.heartbeat([1, 2], "v", 3500 * MS, everything=False)

    assert [(r.node, r.log_end_offset) for r in second.reports] == [(2, 4)]
    assert {item.node: item.responsive for item in second.replicas} == {1: False, 2: True}
    assert len(book.heartbeat([1, 2], "v", 3500 * MS, everything=True).reports) == 2
    book.forget("orders", 0, 1, incarnation=5)
    assert [item.node for item in book.heartbeat([1, 2], "v", 3500 * MS, everything=False).replicas] == [2]


class _Process:
    """A supervised process as the agent reads it: whether it said it is ready, with which
    incarnation, and a "ready" it sent that the supervisor has not read yet (`waiting`)."""

    def __init__(self, incarnation: int = 5, *, ready: bool = True) -> None:
        self.ready = ready
        self.incarnation = incarnation if ready else 0
        self.waiting = 0 if ready else incarnation
        self.process = object()


class _Supervised:
    """What the agent reads of its supervisor: the actors it runs (and it sets on_exit)."""

    def __init__(self, names: list[str] | dict[str, _Process]) -> None:
        import threading

        self.actors = dict(names) if isinstance(names, dict) else {name: _Process() for name in names}
        self.on_exit = None
        self.lock = threading.RLock()

    def check_ready(self, managed: _Process) -> bool:
        if managed.waiting:
            managed.ready, managed.incarnation, managed.waiting = True, managed.waiting, 0
        return managed.ready

    def poll(self) -> list:
        return []

    def watch(self) -> tuple[list[int], None]:
        return [], None  # nothing to watch: no process runs

    def close_watch(self) -> None:
        pass


@contextlib.contextmanager
def _agent_with_a_sender(tmp_path, supervised: "_Supervised"):
    """A real node agent on its reports socket, and a DEALER writing to it: (agent, send)."""
    import zmq

    from transport.codec import Codec
    from transport.node_agent import NodeAgent

    agent = NodeAgent(supervisor=supervised, coordinator="tcp://127.0.0.1:9", nodes=[1], data_dir=str(tmp_path),
                      cluster_id="c", limits=LIMITS)
    agent.start()
    sender = zmq.Context.instance().socket(zmq.DEALER)
    codec = Codec()
    try:
        sender.setsockopt(zmq.LINGER, 0)
        sender.connect(agent.endpoint)
        yield agent, lambda report: sender.send_multipart(codec.encode(report))
    finally:
        sender.close()
        agent.stop()


def _wait_for_reports(agent, count: int, quiet_s: float = 0.2) -> None:
    """Until the book holds `count` reports, then `quiet_s` more for any that should not be there."""
    deadline = time.monotonic() + 10
    while len(agent.book.latest) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(quiet_s)


@pytest.mark.timeout(30)
def test_the_agent_keeps_reports_only_about_replicas_it_runs_whoever_writes_to_its_socket(tmp_path):
    with _agent_with_a_sender(tmp_path, _Supervised(["replica/orders/0/n1"])) as (agent, send):
        for report in (beat(1), beat(2), ReplicaHeartbeat(topic="made-up", partition=7, node=1, endpoint="x", pid=1,
                                                          incarnation=1)):
            send(report)
        _wait_for_reports(agent, 1)  # the other two, had they been taken, arrived with the first
        assert sorted(agent.book.latest) == [("orders", 0, 1)], "node 2 is not this agent's; made-up/7 not a replica it runs"


@pytest.mark.timeout(30)
def test_the_agent_keeps_reports_only_from_the_process_it_runs_not_from_an_earlier_one(tmp_path):
    """A zombie: the earlier process of a replica, paused while its node replaced it on a new disk,
    resumes and reports as before. Taken, its report would tell the coordinator that the process
    on record is the one whose disk is lost. A process that said it is ready, in a message the
    supervisor has not read yet, is read first: its first report is news, not to be dropped."""
    running = {"replica/orders/0/n1": _Process(5), "replica/orders/1/n1": _Process(8, ready=False)}
    with _agent_with_a_sender(tmp_path, _Supervised(running)) as (agent, send):
        send(beat(1, incarnation=4))
        send(msgspec.structs.replace(beat(1, incarnation=8), partition=1))
        _wait_for_reports(agent, 1)  # the zombie's, had it been taken, arrived before the other
        assert {key: report.incarnation for key, (report, _) in agent.book.latest.items()} == {("orders", 1, 1): 8}
        assert agent.counters.get("reports_from_other_processes") == 1

        send(beat(1, incarnation=5))  # the process it runs
        _wait_for_reports(agent, 2, quiet_s=0)
        assert agent.book.latest[("orders", 0, 1)][0].incarnation == 5


def test_the_answers_kept_for_node_sets_stay_bounded_whatever_sets_heartbeats_name():
    """A header is a claim: a sender naming ever new sets of nodes (every subset of a 7-node
    cluster, 127 of them) makes the coordinator build answers, and what it keeps of them stays
    within ASSIGNMENT_CACHE_ENTRIES_MAX."""
    import random

    from actors.coordinator import Coordinator
    from actors.node_liveness import ASSIGNMENT_CACHE_ENTRIES_MAX
    from storage.memory import MemoryFileSystem
    from storage.state import DurableState

    nodes = list(range(1, 8))
    coordinator = Coordinator(state=DurableState.open("/c/metadata.state", fs=MemoryFileSystem()), nodes=nodes,
                              rng=random.Random(3), limits=LIMITS)
    named = [[node for node in nodes if mask >> (node - 1) & 1] for mask in range(1, 1 << len(nodes))]
    for number, subset in enumerate(named, start=1):
        answer = coordinator._node_heartbeat_response(
            NodeHeartbeat(correlation_id=number, nodes=subset, agent_id="hostile"), False)
        assert answer.assignments == [], "no topic exists: nothing is assigned to anyone"
        assert len(coordinator._assignments_cache) <= ASSIGNMENT_CACHE_ENTRIES_MAX
    assert len(named) > ASSIGNMENT_CACHE_ENTRIES_MAX
