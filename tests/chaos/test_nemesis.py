"""The nemesis: which link faults a network fault needs, and real faults on real processes.

Pure stories first: isolation, split, one-way and slow-link plans, and the fault board that
combines them per actor and clears them on heal. Then, on a running cluster (`integration`):
kill by role ("the current leader of partition P", "a follower"), pause and resume, isolation
through the transport's fault switch (the target becomes unreachable, a new leader is elected,
heal brings it back into the ISR), a full disk (produce gets DISK_FULL), a failed fsync (the
actor crashes and is restarted), and a group member crashed between its poll and its commit.
Two tests reproduce bugs the harness found in code outside chaos/ (since fixed).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import psutil
import pytest

from actors.errors import ErrorCode, RailmqError
from actors.messages import LinkFault
from chaos.links import (
    CLUSTER_PEER_PREFIXES, ActorRef, FaultBoard, isolation_plan, one_way_plan, slow_link_plan, split_plan,
)
from chaos.scenarios import FaultStep
from tests.helpers import wait_for

LEADER = ActorRef("replica/t/0/n1", "tcp://127.0.0.1:5001", 1)
FOLLOWER = ActorRef("replica/t/0/n2", "tcp://127.0.0.1:5002", 2)
OTHER = ActorRef("replica/t/0/n3", "tcp://127.0.0.1:5003", 3)
COORDINATOR = ActorRef("coordinator", "tcp://127.0.0.1:5000", 0)
EVERYONE = [COORDINATOR, LEADER, FOLLOWER, OTHER]


# --------------------------------------------------------------------------- link plans


def matches(links: list[LinkFault], peer: str, direction: str) -> bool:
    """Whether `peer` is dropped in `direction`, as transport/faults.py decides."""
    return any(link.drop_probability >= 1.0 and link.direction in (direction, "both")
               and any(prefix == "*" or peer.startswith(prefix) for prefix in link.peers) for link in links)


def test_isolation_cuts_the_target_off_from_everyone_but_the_harness():
    plan = isolation_plan(LEADER, EVERYONE)
    own = plan[LEADER.name]
    for peer in (FOLLOWER.endpoint, COORDINATOR.endpoint, "replica/t/0/n2|77|0", "coordinator|5|1",
                 "chaos-producer-1-1|9|0", "group-coordinator|3|2"):
        assert matches(own, peer, "in") and matches(own, peer, "out"), peer
    assert not matches(own, "admin|123|4", "in") and not matches(own, "admin|123|4", "out"), \
        "heal and observation still reach the isolated actor"
    for other in (FOLLOWER, OTHER, COORDINATOR):
        assert matches(plan[other.name], LEADER.endpoint, "out")
        assert matches(plan[other.name], f"{LEADER.name}|42|0", "in")
        assert not matches(plan[other.name], f"{FOLLOWER.name}|42|0", "in")


def test_a_name_prefix_does_not_catch_a_longer_name():
    plan = isolation_plan(ActorRef("replica/t/1/n1", "tcp://127.0.0.1:6001", 1),
                          [ActorRef("replica/t/1/n12", "tcp://127.0.0.1:6012", 12)])
    assert not matches(plan["replica/t/1/n12"], "replica/t/1/n12|1|0", "in")
    assert matches(plan["replica/t/1/n12"], "replica/t/1/n1|1|0", "in")


def test_a_split_cuts_between_sides_only():
    plan = split_plan([LEADER], [FOLLOWER, OTHER, COORDINATOR])
    assert matches(plan[LEADER.name], FOLLOWER.endpoint, "out")
    assert matches(plan[LEADER.name], "coordinator|1|0", "in")
    assert not matches(plan[FOLLOWER.name], OTHER.endpoint, "out")
    assert not matches(plan[FOLLOWER.name], "chaos-producer-1-1|1|0", "in"), "clients reach both sides"


def test_a_one_way_cut_drops_only_what_the_source_sends():
    plan = one_way_plan(LEADER, [FOLLOWER])
    assert list(plan) == [LEADER.name]
    assert matches(plan[LEADER.name], FOLLOWER.endpoint, "out")
    assert matches(plan[LEADER.name], f"{FOLLOWER.name}|3|0", "out"), "replies to the follower's fetches too"
    assert not matches(plan[LEADER.name], f"{FOLLOWER.name}|3|0", "in")


def test_a_slow_link_delays_and_drops_some_both_ways():
    [link] = slow_link_plan(LEADER, [FOLLOWER], delay_ms=50, drop_probability=0.2)[LEADER.name]
    assert (link.direction, link.delay_ms, link.drop_probability) == ("both", 50, 0.2)
    assert FOLLOWER.endpoint in link.peers


class RecordingSwitches:
    def __init__(self, down: set[str] = frozenset()) -> None:
        self.state: dict[str, tuple[list[LinkFault], bool, bool]] = {}
        self.endpoints = {ref.name: ref.endpoint for ref in EVERYONE}
        self.down = set(down)

    def endpoint_of(self, name: str) -> str:
        return "" if name in self.down else self.endpoints[name]

    def set_faults(self, endpoint, links, disk_full, fail_next_fsync) -> None:
        name = next(name for name, known in self.endpoints.items() if known == endpoint)
        self.state[name] = (list(links), disk_full, fail_next_fsync)


def test_the_board_sends_each_actor_the_union_of_its_active_faults():
    switches = RecordingSwitches()
    board = FaultBoard(switches.endpoint_of, switches.set_faults)
    isolate_id, problems = board.start_links(isolation_plan(LEADER, EVERYONE))
    assert problems == []
    disk_id, _ = board.start_disk_full(FOLLOWER.name)
    links, disk_full, _ = switches.state[FOLLOWER.name]
    assert disk_full, "the disk fault reached the follower"
    assert links == isolation_plan(LEADER, EVERYONE)[FOLLOWER.name], "and its push kept the isolation's links"
    board.stop(isolate_id)
    assert switches.state[FOLLOWER.name] == ([], True, False) and switches.state[LEADER.name][0] == []
    board.stop(disk_id)
    assert switches.state[FOLLOWER.name] == ([], False, False)
    assert not board.active


def test_heal_clears_every_actor_and_reports_the_ones_it_cannot_reach():
    switches = RecordingSwitches(down={OTHER.name})
    board = FaultBoard(switches.endpoint_of, switches.set_faults)
    board.start_links(split_plan([LEADER], [FOLLOWER, OTHER]))
    problems = board.heal([ref.name for ref in EVERYONE])
    assert problems == [f"{OTHER.name} is not running"]
    assert all(state == ([], False, False) for state in switches.state.values())
    assert set(switches.state) == {COORDINATOR.name, LEADER.name, FOLLOWER.name}


def test_the_harness_admin_client_is_never_among_the_cut_peers():
    assert not any("admin|".startswith(prefix) or prefix.startswith("admin")
                   for prefix in CLUSTER_PEER_PREFIXES)


# --------------------------------------------------------------------------- on real processes


class NoWorkers:
    def alive_names(self, role: str) -> list[str]:
        return []


@pytest.fixture
def nemesis_for(cluster, tmp_path):
    """A nemesis on the shared cluster for one topic; heals and closes whatever the test does."""
    from chaos.nemesis import FaultLog, Nemesis
    from chaos.workload import LineRecorder

    made = []

    def make(topic: str, workers=None) -> tuple:
        history = LineRecorder(str(tmp_path / f"{topic}-history.jsonl"), time.monotonic_ns())
        detail = LineRecorder(str(tmp_path / f"{topic}-faults.jsonl"), time.monotonic_ns())
        log = FaultLog(history, detail, topic)
        nemesis = Nemesis(cluster, workers or NoWorkers(), topic, random.Random(1), log)
        made.append(nemesis)
        return nemesis, tmp_path / f"{topic}-history.jsonl"

    try:
        yield make
    finally:
        for nemesis in made:
            nemesis.heal()
            nemesis.close()


def create(cluster, topic: str, **config) -> None:
    from railmq.admin import Admin

    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3,
                           config={"min_insync_replicas": 2, **config})
        admin.wait_for_leaders(topic, full_isr=True)


def delete(cluster, topic: str) -> None:
    from railmq.admin import Admin

    with Admin(cluster.bootstrap) as admin:
        admin.delete_topic(topic)


def partition(cluster, topic: str):
    from railmq.admin import Admin

    with Admin(cluster.bootstrap) as admin:
        return admin.describe_topic(topic).partitions[0]


def fault_lines(path: Path) -> list[dict]:
    return [line for line in map(json.loads, path.read_text().splitlines()) if line["type"] == "fault"]


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_kill_the_current_leader_of_a_partition(cluster, nemesis_for, unique_name):
    topic = unique_name()
    create(cluster, topic)
    before = partition(cluster, topic)
    old = cluster.replica_name(topic, 0, before.leader)
    old_pid = cluster.actor(old).pid
    nemesis, history = nemesis_for(topic)
    nemesis.perform(FaultStep(at_s=0, action="kill", role="leader", partition=0))
    gone = (lambda: not psutil.pid_exists(old_pid)
            or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE)
    wait_for(gone, timeout_s=5, what="the old leader to die")
    wait_for(lambda: partition(cluster, topic).leader not in (-1, before.leader),
             timeout_s=20, what="a new leader")
    [line] = fault_lines(history)
    assert (line["nemesis"], line["target"], line["role"], line["topic"], line["partition"]) == (
        "kill", old, "leader", topic, 0)
    wait_for(lambda: cluster.actor(old).alive and cluster.actor(old).pid != old_pid,
             timeout_s=20, what="the supervisor's restart")


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_kill_a_follower_leaves_the_leader_alone(cluster, nemesis_for, unique_name):
    topic = unique_name()
    create(cluster, topic)
    before = partition(cluster, topic)
    nemesis, history = nemesis_for(topic)
    nemesis.perform(FaultStep(at_s=0, action="kill", role="follower", partition=0))
    [line] = fault_lines(history)
    assert line["role"] == "follower" and line["target"] != cluster.replica_name(topic, 0, before.leader)
    assert partition(cluster, topic).leader == before.leader


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_pause_holds_the_process_stopped_then_resumes_it(cluster, nemesis_for, unique_name):
    import threading

    topic = unique_name()
    create(cluster, topic)
    leader = cluster.replica_name(topic, 0, partition(cluster, topic).leader)
    process = psutil.Process(cluster.actor(leader).pid)
    nemesis, history = nemesis_for(topic)
    step = FaultStep(at_s=0, action="pause", role="leader", partition=0, duration_s=1.0)
    worker = threading.Thread(target=nemesis.perform, args=(step,))
    worker.start()
    wait_for(lambda: process.status() == psutil.STATUS_STOPPED, timeout_s=5, what="SIGSTOP")
    worker.join(10)
    assert process.status() != psutil.STATUS_STOPPED
    phases = [(line["phase"], line["target"]) for line in fault_lines(history)]
    assert phases == [("start", leader), ("stop", leader)]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_isolating_a_leader_makes_it_unreachable_and_heal_brings_it_back(cluster, nemesis_for, unique_name):
    import threading

    from actors.messages import ProduceRequest
    from railmq.producer import Producer
    from storage.batch import encode_batch
    from transport.rpc import RequestTimeout, RpcClient

    topic = unique_name()
    create(cluster, topic)
    with Producer(cluster.bootstrap, acks="all") as producer:
        # a write in the first leader's epoch: see the strict xfail below for the case without one
        producer.send(topic, b"written in the first leader's epoch", partition=0).result(30)
    before = partition(cluster, topic)
    nemesis, history = nemesis_for(topic)
    step = FaultStep(at_s=0, action="isolate", role="leader", partition=0, duration_s=60.0)
    worker = threading.Thread(target=nemesis.perform, args=(step,))
    worker.start()
    try:
        wait_for(lambda: fault_lines(history), timeout_s=10, what="the isolation")
        wait_for(lambda: partition(cluster, topic).leader not in (-1, before.leader),
                 timeout_s=20, what="a leader elsewhere")
        rpc = RpcClient("chaos-test-client")
        try:
            with pytest.raises(RequestTimeout):
                rpc.request(before.leader_endpoint, ProduceRequest(
                    correlation_id=0, topic=topic, partition=0, acks=1,
                    batch=encode_batch([(0, None, b"to the isolated", None)], 1)), timeout_ms=1500)
        finally:
            rpc.close()
        with Producer(cluster.bootstrap, acks="all", request_timeout_ms=2000) as producer:
            assert producer.send(topic, b"through the new leader", partition=0).result(30).offset >= 0
    finally:
        nemesis.abort.set()  # ends the isolation early: perform() undoes it before returning
        worker.join(20)
    assert [line["phase"] for line in fault_lines(history)] == ["start", "stop"]
    wait_for(lambda: before.leader in partition(cluster, topic).isr, timeout_s=30,
             what="the healed replica in the ISR")


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_leader_paused_before_its_first_write_rejoins_the_isr(cluster, nemesis_for, unique_name):
    topic = unique_name()
    create(cluster, topic)
    before = partition(cluster, topic)
    nemesis, _ = nemesis_for(topic)
    try:
        nemesis.perform(FaultStep(at_s=0, action="pause", role="leader", partition=0, label="old"))
        wait_for(lambda: partition(cluster, topic).leader not in (-1, before.leader),
                 timeout_s=20, what="a new leader")
        nemesis.perform(FaultStep(at_s=0, action="resume", role="label", label="old"))
        wait_for(lambda: before.leader in partition(cluster, topic).isr, timeout_s=10,
                 what="the old leader in the ISR")
    finally:
        delete(cluster, topic)  # its looping follower would keep a core busy for the rest of the module


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_full_disk_refuses_produce_with_disk_full(cluster, nemesis_for, unique_name):
    from railmq.producer import Producer

    topic = unique_name()
    create(cluster, topic)
    leader = cluster.replica_name(topic, 0, partition(cluster, topic).leader)
    nemesis, _ = nemesis_for(topic)
    fault_id, problems = nemesis.board.start_disk_full(leader)
    assert problems == []
    try:
        with Producer(cluster.bootstrap, acks=1, delivery_timeout_ms=3000) as producer:
            with pytest.raises(RailmqError) as refused:
                producer.send(topic, b"no room", partition=0).result(10)
        assert refused.value.code == ErrorCode.DISK_FULL
    finally:
        nemesis.board.stop(fault_id)
    with Producer(cluster.bootstrap, acks=1) as producer:
        assert producer.send(topic, b"room again", partition=0).result(10).offset == 0


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_failed_fsync_crashes_the_actor_and_it_is_restarted(cluster, nemesis_for, unique_name):
    from railmq.producer import Producer

    topic = unique_name()
    create(cluster, topic, flush_policy="every_batch")
    leader = cluster.replica_name(topic, 0, partition(cluster, topic).leader)
    restarts = cluster.actor(leader).restarts
    nemesis, history = nemesis_for(topic)
    nemesis.perform(FaultStep(at_s=0, action="fsync-fail", role="leader", partition=0))
    with Producer(cluster.bootstrap, acks=1, delivery_timeout_ms=20_000, request_timeout_ms=1000) as producer:
        producer.send(topic, b"needs an fsync", partition=0).result(30)
    wait_for(lambda: cluster.actor(leader).restarts > restarts,
             timeout_s=20, what="the crashed actor's restart")
    assert fault_lines(history)[0]["nemesis"] == "fsync-fail"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_member_is_crashed_between_its_poll_and_its_commit(cluster, nemesis_for, unique_name, tmp_path):
    from chaos.workers import WorkerPool
    from chaos.workload import MemberSpec, ProducerSpec

    topic = unique_name()
    create(cluster, topic)
    origin_ns = time.monotonic_ns()
    specs = [
        ProducerSpec(process="producer-1", client_id="chaos-producer-1", bootstrap=cluster.bootstrap,
                     topic=topic, history_path="", origin_ns=origin_ns, keys=["k0", "k1"], rate_per_s=200),
        MemberSpec(process="g1/member-1", client_id="chaos-member-1", bootstrap=cluster.bootstrap,
                   topic=topic, group=f"g-{topic}", history_path="", origin_ns=origin_ns, processing_ms=30),
    ]
    pool = WorkerPool(specs, str(tmp_path / "workers"), origin_ns, restart_delay_ms=100)
    pool.start()
    try:
        nemesis, history = nemesis_for(topic, workers=pool)
        wait_for(lambda: pool.acknowledged() > 20, timeout_s=20, what="acknowledged writes")
        nemesis.perform(FaultStep(at_s=0, action="crash-member", role="member"))
        [line] = [json.loads(raw) for raw in (tmp_path / f"{topic}-faults.jsonl").read_text().splitlines()]
        assert line["nemesis"] == "crash-member" and line["before_commit"] is True
        wait_for(lambda: pool.alive_names("member") == ["g1/member-1#2"],
                 timeout_s=20, what="the member's next incarnation")
    finally:
        pool.stop()
    first = [json.loads(raw) for raw in Path(pool.incarnations()[1].history_path).read_text().splitlines()]
    assert first[-1]["f"] in ("poll", "commit") and first[-1]["type"] in ("ok", "invoke"), \
        "the first incarnation died holding polled records it had not committed"
    assert all(not incarnation.killed or incarnation.ended_ns for incarnation in pool.incarnations())


@pytest.mark.integration
@pytest.mark.timeout(60)
@pytest.mark.parametrize("controllers", [0, 3])
def test_a_killed_coordinator_is_back_within_its_restart_delay(fresh_cluster, controllers):
    cluster = fresh_cluster(restart_delay_ms=200, controllers=controllers)
    name = "coordinator" if not controllers else cluster.active_controller()
    old_pid = cluster.actor(name).pid
    started = time.monotonic()
    cluster.kill(name)
    wait_for(lambda: cluster.actor(name).alive and cluster.actor(name).pid != old_pid,
             timeout_s=10, what=f"{name}'s restart")
    assert time.monotonic() - started < 1.0, "restarted within its delay plus a supervisor round"
