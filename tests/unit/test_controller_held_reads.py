"""Reads held behind an uncommitted proposal are bounded in bytes (actors/controller.py).

A metadata answer is read from the working map, so while a proposal is in flight it waits for
that commit (a read index). Counted in nothing, the held answers grew with every request: in
this harness, 2,000 metadata requests for 300 topics behind one stuck proposal held 653 MB. Past
`controller_held_bytes_max` a read is answered BUSY at once instead (clients retry it), and a push
nobody asked for is dropped (the next heartbeat brings it again); answers to decisions are never
dropped: they are what the asker must learn.
"""

from __future__ import annotations

import msgspec

from actors.effects import Send
from actors.errors import ErrorCode
from actors.limits import Limits
from actors.messages import CreateTopicRequest, CreateTopicResponse, ErrorResponse, MetadataRequest, MetadataResponse
from tests.unit.controller_harness import ControllerNet

CLIENT = "tcp://client"
BUDGET = 256 * 1024
READS = 200


def _held_read_bytes(net: ControllerNet, node: int) -> int:
    return sum(len(msgspec.msgpack.encode(effect.message)) for _, effects in net.controllers[node].held.values()
               for effect in effects if isinstance(effect, Send) and isinstance(effect.message, MetadataResponse))


def test_reads_held_behind_an_uncommitted_decision_stay_within_their_bytes_and_the_rest_are_busy():
    net = ControllerNet(limits=Limits(controller_held_bytes_max=BUDGET, replica_processes_per_node_max=1000))
    active = net.run_until_active()
    for number in range(20):
        net.send(CLIENT, active, CreateTopicRequest(correlation_id=number + 1, name=f"t{number:02d}-" + "x" * 200,
                                                    partitions=10, replication_factor=3))
        net.run_for(5)
    assert len([answer for answer in net.answers(CLIENT) if isinstance(answer, CreateTopicResponse)]) == 20
    net.isolate(active)  # what it decides now never commits while it is cut off
    net.send(CLIENT, active, CreateTopicRequest(correlation_id=500, name="pending", partitions=1,
                                                replication_factor=3))
    for number in range(READS):
        net.send(CLIENT, active, MetadataRequest(correlation_id=1_000 + number, topics=None))
    net.deliver()

    assert _held_read_bytes(net, active) <= BUDGET
    busy = [answer for answer in net.answers(CLIENT) if isinstance(answer, ErrorResponse)]
    assert busy and all(answer.error == ErrorCode.BUSY and answer.correlation_id >= 1_000 for answer in busy)
    held = [effect.message.correlation_id for _, effects in net.controllers[active].held.values()
            for effect in effects if isinstance(effect, Send) and isinstance(effect.message, MetadataResponse)]
    assert len(held) + len(busy) == READS and held, (len(held), len(busy))

    net.heal()
    net.run_for(100)
    if net.controllers[active].coordinator is not None:  # still leading: the held reads follow the commit
        answered = {answer.correlation_id for answer in net.answers(CLIENT) if isinstance(answer, MetadataResponse)}
        assert set(held) <= answered
    assert net.controllers[active].held_read_bytes == 0 or net.controllers[active].held
