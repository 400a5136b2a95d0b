"""The controller quorum against an unauthenticated client (actors/controller.py, actors/coordinator.py).

Any local process may send every client request to any voter: create, delete and grow topics,
alter their settings, ask for producer ids and metadata. Each test here plays such a client and
counts what it leaves behind or makes the quorum do (entries, state pushes, rebuilds), never time.
"""

from __future__ import annotations

from collections import Counter

import pytest

from actors.errors import ErrorCode
from actors.limits import Limits
from actors.messages import (
    CreateTopicRequest, CreateTopicResponse, ErrorResponse, InitProducerIdRequest, InitProducerIdResponse,
    MetadataRequest, MetadataResponse, ReplicaHeartbeat,
)
from tests.unit.controller_harness import ControllerNet

CLIENT = "tcp://client"
REPLICAS = "tcp://replicas"


def _topic_with_live_replicas(net: ControllerNet, active: int, name: str = "orders") -> int:
    """A topic of three partitions whose replicas report, so metadata names their leaders."""
    net.send(CLIENT, active, CreateTopicRequest(correlation_id=1, name=name, partitions=3,
                                                replication_factor=3))
    net.run_for(50)
    [created] = net.answers(CLIENT)
    assert isinstance(created, CreateTopicResponse) and created.error == ErrorCode.NONE
    for _ in range(15):
        for partition in range(3):
            for node in (1, 2, 3):
                net.send(REPLICAS, active, ReplicaHeartbeat(
                    topic=name, topic_id=created.topic.topic_id, partition=partition, node=node,
                    endpoint=f"tcp://replica-{partition}-{node}", pid=node, incarnation=7))
        net.run_for(100)
    net.answers(REPLICAS)
    return created.topic.topic_id


def _leader_endpoints(net: ControllerNet, active: int, name: str = "orders") -> list[str]:
    net.send(CLIENT, active, MetadataRequest(correlation_id=2, topics=[name]))
    net.run_for(1)
    [answer] = [answer for answer in net.answers(CLIENT) if answer.correlation_id == 2]
    assert isinstance(answer, MetadataResponse), answer
    return [partition.leader_endpoint for partition in answer.topics[0].partitions]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("burst", ["producer ids", "large topics"])
def test_a_burst_of_client_decisions_is_refused_busy_before_it_fills_the_uncommitted_log(burst):
    """Requests that decide (InitProducerId, CreateTopic, ...) each propose an entry, and a burst
    of them arrives faster than followers acknowledge. Past `uncommitted_entries_max` (4,096) or
    `uncommitted_bytes_max` the leader refused the next proposal, and the controller then dropped
    its coordinator, refused every answer it held (all 5,000 askers got NOT_CONTROLLER, though
    4,096 of their decisions committed) and rebuilt it from the committed map, forgetting every
    replica's liveness: metadata named no leader for any partition until replicas reported again.
    Client decisions may fill only `controller_client_uncommitted_percent` of what may be
    uncommitted; past it they are BUSY at once, and the rest stays the cluster's own."""
    raft_fields = {} if burst == "producer ids" else {"uncommitted_bytes_max": 256 * 1024}
    net = ControllerNet(limits=Limits(replica_processes_per_node_max=10_000), **raft_fields)
    active = net.run_until_active()
    _topic_with_live_replicas(net, active)
    controller = net.controllers[active]
    coordinator = controller.coordinator
    endpoints = _leader_endpoints(net, active)
    assert all(endpoints)

    for number in range(5_000 if burst == "producer ids" else 40):
        request = InitProducerIdRequest(correlation_id=100 + number) if burst == "producer ids" else \
            CreateTopicRequest(correlation_id=100 + number, name=f"t{number}", partitions=100,
                               replication_factor=3)
        net.send(CLIENT, active, request)
    net.deliver()  # every request reaches the leader before any follower's acknowledgement
    kinds = Counter((type(answer).__name__, answer.error) for answer in net.answers(CLIENT))

    assert not [trace for trace in net.traces if trace.event == "controller-inactive"], kinds
    assert controller.coordinator is coordinator, "the coordinator was dropped and rebuilt"
    assert _leader_endpoints(net, active) == endpoints, "replicas' liveness was lost"
    assert kinds[("ErrorResponse", ErrorCode.NOT_CONTROLLER)] == 0, kinds
    assert kinds[("ErrorResponse", ErrorCode.BUSY)] > 0, kinds
    answered = {("ErrorResponse", ErrorCode.BUSY), ("InitProducerIdResponse", ErrorCode.NONE),
                ("CreateTopicResponse", ErrorCode.NONE)}
    assert set(kinds) <= answered, kinds


class _CountingSet(set):
    """A set that counts the elements each difference copies (`askers - {key}`)."""

    copied = 0

    def __sub__(self, other):
        _CountingSet.copied += len(self)
        return _CountingSet(set.__sub__(self, other))


@pytest.mark.timeout(120)
def test_refusing_the_answers_held_behind_a_lost_proposal_costs_a_walk_not_a_copy_per_answer():
    """Reads that reach the leader while a proposal is in flight wait behind it, each remembered
    as an asker of that proposal (up to `controller_held_bytes_max`: ~290,000 small metadata
    answers). When the proposal is lost with the leadership, each held answer becomes a refusal,
    and each refusal copied the set of askers left: 5,000 askers took 0.1 s, 20,000 took 1.9 s,
    and the budget's 290,000 would take minutes of the voter's only thread. One walk now."""
    net = ControllerNet()
    active = net.run_until_active()
    controller = net.controllers[active]
    net.isolate(active)  # its proposal cannot commit
    net.send(CLIENT, active, CreateTopicRequest(correlation_id=1, name="pending", partitions=1,
                                                replication_factor=3))
    reads = 3_000
    for number in range(reads):
        net.send(CLIENT, active, MetadataRequest(correlation_id=10 + number, topics=["x"]))
    net.deliver()
    assert sum(map(len, controller.askers.values())) == reads + 1
    for index, askers in controller.askers.items():
        controller.askers[index] = _CountingSet(askers)
    _CountingSet.copied = 0

    net.run_for(3_000)  # check-quorum deposes it; every held answer is refused

    assert controller.coordinator is None
    refused = [answer for answer in net.answers(CLIENT) if isinstance(answer, ErrorResponse)]
    assert len(refused) == reads + 1 and {answer.error for answer in refused} == {ErrorCode.NOT_CONTROLLER}
    assert _CountingSet.copied <= 2 * reads, f"{_CountingSet.copied:,} askers copied to refuse {reads:,}"


@pytest.mark.timeout(120)
def test_each_proposal_of_a_burst_reads_a_bounded_number_of_entries(monkeypatch):
    """A proposal is refused past `uncommitted_bytes_max`, so the leader counts the bytes not yet
    committed at every proposal, and did so by summing every uncommitted entry: a burst of n
    client decisions read n**2 / 2 entries (2,000 InitProducerId: 4 million, ~1 s of the leader;
    the 4,096 the log may hold: 8.4 million). The log keeps running totals instead."""
    import storage.raft_log

    reads = Counter()

    def counting_len(value):
        reads["len"] += 1
        return len(value)

    net = ControllerNet()
    active = net.run_until_active()
    monkeypatch.setattr(storage.raft_log, "len", counting_len, raising=False)
    burst = 2_000
    for number in range(burst):
        net.send(CLIENT, active, InitProducerIdRequest(correlation_id=100 + number))
    net.deliver()

    answers = net.answers(CLIENT)
    assert len([answer for answer in answers if isinstance(answer, InitProducerIdResponse)]) == burst
    assert reads["len"] <= 50 * burst, f"{reads['len']:,} lengths read for {burst:,} proposals"


class _CountingHeld(dict):
    """The held proposals, counting the keys each walk of them reads."""

    walked = 0

    def __iter__(self):
        for key in dict.__iter__(self):
            _CountingHeld.walked += 1
            yield key


@pytest.mark.timeout(120)
def test_applying_a_burst_of_held_decisions_reads_a_bounded_number_of_held_proposals():
    """Every applied entry looked through all proposals held for their commit to find those it
    settles: a leader that proposed n decisions while its followers were cut off, then
    reconnected, read n**2 / 2 held proposals as the n entries applied (1,500 InitProducerId:
    1.13 million; the 4,096 the log may hold: 8.4 million). Proposals are held in the order of
    their indexes, so each entry reads only the ones it settles and the next."""
    net = ControllerNet()
    active = net.run_until_active()
    controller = net.controllers[active]
    net.isolate(active)  # nothing commits until the links come back
    burst = 1_500
    for number in range(burst):
        net.send(CLIENT, active, InitProducerIdRequest(correlation_id=100 + number))
    net.deliver()
    assert len(controller.held) == burst
    controller.held = _CountingHeld(controller.held)
    _CountingHeld.walked = 0
    checks, controller.invariants = controller.invariants, lambda: None  # they walk everything held

    net.heal()
    net.run_for(500)
    walked = _CountingHeld.walked
    checks()

    answers = [answer for answer in net.answers(CLIENT) if isinstance(answer, InitProducerIdResponse)]
    assert len(answers) == burst and not controller.held
    assert walked <= 4 * burst, f"{walked:,} held proposals read for {burst:,} entries"


def _held_answer_bytes(controller) -> tuple[int, int]:
    """(bytes of every answer held, the largest one), as encoded."""
    import msgspec

    from actors.effects import Send

    sizes = [len(msgspec.msgpack.encode(effect.message)) for _, effects in controller.held.values()
             for effect in effects if isinstance(effect, Send)]
    return sum(sizes), max(sizes, default=0)


@pytest.mark.timeout(120)
def test_answers_to_decisions_held_behind_a_stuck_quorum_count_in_the_held_bytes_budget():
    """Reads held behind an uncommitted proposal count in `controller_held_bytes_max`, but the
    answers to decisions did not: a leader whose followers were cut off held every CreateTopic's
    answer (the whole topic's metadata, several times its entry) until the uncommitted log was
    full. With a 1 MiB budget, 60 topics of 1,000 partitions held 5.1 MB of answers. Past the
    budget a client's decision is now BUSY before it is made."""
    budget = 1 << 20
    net = ControllerNet(limits=Limits(replica_processes_per_node_max=100_000,
                                      controller_held_bytes_max=budget))
    active = net.run_until_active()
    controller = net.controllers[active]
    net.isolate(active)
    for number in range(60):
        net.send(CLIENT, active, CreateTopicRequest(correlation_id=100 + number, name=f"t{number}",
                                                    partitions=1000, replication_factor=3))
    net.deliver()
    held, largest = _held_answer_bytes(controller)
    busy = [answer for answer in net.answers(CLIENT) if answer.error == ErrorCode.BUSY]

    assert held <= budget + largest, f"{held:,} bytes of answers held with a budget of {budget:,}"
    assert busy and all("commit" in answer.error_message for answer in busy)
    assert controller.held_read_bytes == held
    net.heal()
    net.run_for(500)
    created = [answer for answer in net.answers(CLIENT) if isinstance(answer, CreateTopicResponse)]
    assert len(created) == 60 - len(busy) and all(answer.error == ErrorCode.NONE for answer in created)
