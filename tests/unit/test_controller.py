"""The controller quorum with the coordinator inside (actors/controller.py, actors/replicated_state.py).

Each test plays an attacker's or a failure's part: a client at a follower, a leader that loses its
quorum with a decision in flight, a crash of the active controller, a full restart, a log cut
short by a snapshot, a malformed command in the log.
"""

from __future__ import annotations

import msgspec
import pytest

from actors.errors import ErrorCode
from actors.messages import (
    ControllerStatusRequest, ControllerStatusResponse, CreateTopicRequest, CreateTopicResponse, ErrorResponse,
    InitProducerIdRequest, InitProducerIdResponse, MetadataRequest, MetadataResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetEntry, OffsetFetchRequest, ReplicaHeartbeat,
)
from actors.raft_messages import RaftVoteRequest
from actors.replicated_state import BadCommand, ReplicatedState, decode_command, encode_command
from storage.raft_log import ENTRY_COMMAND, RaftEntry
from tests.unit.controller_harness import CLUSTER_ID, ControllerNet, voter_endpoint

CLIENT = "tcp://client"


def create(net: ControllerNet, node: int, name: str, correlation_id: int = 1) -> None:
    net.send(CLIENT, node, CreateTopicRequest(correlation_id=correlation_id, name=name, partitions=2,
                                              replication_factor=3))


def test_one_controller_becomes_active_and_the_others_redirect_to_it():
    net = ControllerNet()
    active = net.run_until_active()
    assert net.active() == [active]
    follower = next(node for node in net.voters if node != active)
    net.send(CLIENT, follower, MetadataRequest(correlation_id=5, topics=None))
    net.deliver()
    [answer] = net.answers(CLIENT)
    assert isinstance(answer, ErrorResponse) and answer.error == ErrorCode.NOT_CONTROLLER
    assert answer.correlation_id == 5
    assert (answer.controller_id, answer.controller_endpoint) == (active, voter_endpoint(active))


def test_a_metadata_answer_names_every_voter_and_the_cluster():
    net = ControllerNet()
    active = net.run_until_active()
    net.send(CLIENT, active, MetadataRequest(correlation_id=2, topics=None))
    net.deliver()
    [answer] = net.answers(CLIENT)
    assert isinstance(answer, MetadataResponse)
    assert answer.controller_endpoints == [voter_endpoint(node) for node in (1, 2, 3)]
    assert answer.controller_id == active and answer.cluster_id == CLUSTER_ID


def test_a_topic_is_acknowledged_only_once_a_majority_holds_it():
    net = ControllerNet()
    active = net.run_until_active()
    net.isolate(active)  # the leader hears nobody: its proposal cannot commit
    create(net, active, "orders")
    net.run_for(100)
    assert net.answers(CLIENT) == [], "acknowledged before a majority had it"
    net.heal()
    net.run_for(50)
    answers = net.answers(CLIENT)
    if net.controllers[active].coordinator is not None:  # still leading: the entry committed
        assert [type(a) for a in answers] == [CreateTopicResponse] and answers[0].error == ErrorCode.NONE
    else:  # check-quorum deposed it first: the proposal died, and the asker was told to ask again
        assert [(type(a), a.error) for a in answers] == [(ErrorResponse, ErrorCode.NOT_CONTROLLER)]


def test_a_decision_in_flight_when_the_leader_loses_its_quorum_is_never_announced():
    net = ControllerNet()
    old = net.run_until_active()
    net.isolate(old)
    create(net, old, "lost")
    net.run_for(3_000)  # check-quorum deposes the isolated leader; the others elect among themselves
    assert net.controllers[old].coordinator is None, "an isolated leader kept deciding"
    new = net.active()
    assert new and new != [old]
    [refusal] = net.answers(CLIENT)  # not acknowledged, and not left to time out either
    assert isinstance(refusal, ErrorResponse) and refusal.error == ErrorCode.NOT_CONTROLLER, (
        "a decision that never committed was acknowledged")
    assert refusal.correlation_id == 1
    net.heal()
    net.run_for(1_000)
    for controller in net.controllers.values():
        assert controller.state.get("topic/lost") is None, "an uncommitted topic survived on a voter"


def test_a_read_after_an_uncommitted_decision_waits_for_its_commit():
    """Metadata, state pushes, node heartbeat answers read the working map: while a decision in it
    has not committed (an active controller cut off from the others), none of them may go out —
    an isolated controller once shrank an ISR in its working map, pushed it to the leader beside it,
    and the leader counted writes as committed that the quorum's next leader did not have."""
    net = ControllerNet()
    old = net.run_until_active()
    create(net, old, "orders")
    net.run_for(50)
    net.answers(CLIENT)
    net.isolate(old)
    create(net, old, "lost", correlation_id=2)
    net.send(CLIENT, old, MetadataRequest(correlation_id=3, topics=None))
    net.run_for(20)
    revealed = [answer for answer in net.answers(CLIENT) if isinstance(answer, MetadataResponse)]
    assert not [topic.name for answer in revealed for topic in answer.topics if topic.name == "lost"], (
        "a read named a topic the quorum never committed")
    assert revealed == [], "a read answered from a working map ahead of the commit"
    net.heal()
    net.run_for(50)
    if net.controllers[old].coordinator is not None:  # still leading: "lost" committed, the read follows it
        answers = net.answers(CLIENT)
        assert [type(answer) for answer in answers] == [CreateTopicResponse, MetadataResponse]
        assert "lost" in {topic.name for topic in answers[1].topics}


def test_a_read_with_nothing_uncommitted_is_answered_at_once():
    net = ControllerNet()
    active = net.run_until_active()
    create(net, active, "orders")
    net.run_for(50)
    net.answers(CLIENT)
    net.isolate(active)  # nothing in flight: what it answers is committed
    net.send(CLIENT, active, MetadataRequest(correlation_id=3, topics=None))
    net.deliver()
    [answer] = net.answers(CLIENT)
    assert isinstance(answer, MetadataResponse) and [topic.name for topic in answer.topics] == ["orders"]


def test_committed_topics_survive_the_active_controller_crashing():
    net = ControllerNet()
    old = net.run_until_active()
    create(net, old, "orders")
    net.run_for(50)
    [reply] = net.answers(CLIENT)
    assert isinstance(reply, CreateTopicResponse) and reply.error == ErrorCode.NONE
    net.crash(old)
    new = net.run_until_active()
    assert new != old
    coordinator = net.controllers[new].coordinator
    assert "orders" in coordinator.topics and len(coordinator.topics["orders"].replicas) == 2
    assert coordinator.topics["orders"].topic_id == reply.topic.topic_id
    net.restart(old)
    net.run_for(500)
    assert net.controllers[old].state.get("topic/orders") is not None, "the restarted voter did not catch up"


def test_every_voter_restarting_keeps_the_metadata_and_the_producer_ids():
    net = ControllerNet()
    active = net.run_until_active()
    create(net, active, "orders")
    net.send(CLIENT, active, InitProducerIdRequest(correlation_id=9))
    net.run_for(50)
    ids = [a.producer_id for a in net.answers(CLIENT) if isinstance(a, InitProducerIdResponse)]
    assert ids == [1]
    for node in list(net.controllers):
        net.crash(node)
    for node in net.voters:
        net.restart(node)
    active = net.run_until_active()
    assert "orders" in net.controllers[active].coordinator.topics
    net.send(CLIENT, active, InitProducerIdRequest(correlation_id=10))
    net.run_for(50)
    [answer] = [a for a in net.answers(CLIENT) if isinstance(a, InitProducerIdResponse)]
    assert answer.producer_id == 2, "a producer id was handed out twice across a full restart"


def test_a_voter_restored_from_a_snapshot_holds_the_same_map():
    net = ControllerNet(snapshot_interval_entries=4, snapshot_trailing_entries=1)
    active = net.run_until_active()
    follower = next(node for node in net.voters if node != active)
    net.crash(follower)
    for index in range(8):
        create(net, active, f"t{index}", correlation_id=index + 1)
        net.run_for(20)
    assert net.controllers[active].raft.log.snapshot is not None, "no snapshot was taken"
    net.restart(follower)
    net.run_for(500)
    assert dict(net.controllers[follower].state.committed) == dict(net.controllers[active].state.committed)


def test_every_voter_answers_its_status():
    net = ControllerNet()
    active = net.run_until_active()
    for node in net.voters:
        net.send(CLIENT, node, ControllerStatusRequest(correlation_id=node))
    net.deliver()
    answers = {a.node: a for a in net.answers(CLIENT)}
    assert all(isinstance(a, ControllerStatusResponse) for a in answers.values())
    assert answers[active].active and answers[active].role == "leader"
    assert set(answers[active].followers) == set(net.voters) - {active}
    assert {a.leader for a in answers.values()} == {active}
    assert len({a.term for a in answers.values()}) == 1


def test_raft_messages_and_liveness_need_the_cluster_tag_but_metadata_does_not():
    net = ControllerNet()
    controller = net.controllers[1]
    vote = RaftVoteRequest(source=2, destination=1, term=9, last_log_index=0, last_log_term=0)
    beat = ReplicaHeartbeat(topic="t", partition=0, node=1, endpoint="tcp://r", pid=1, incarnation=1)
    assert controller.needs_authentication(vote) and controller.needs_authentication(beat)
    assert not controller.needs_authentication(MetadataRequest(correlation_id=1))


def test_a_malformed_command_in_the_log_is_refused_not_skipped():
    state = ReplicatedState()
    for bad in (b"\xc1", encode_command([[7, "k", 1]]), encode_command([[0, "", 1]]), encode_command({"a": 1}),
                encode_command([[1, "k", "extra"]])):
        with pytest.raises(BadCommand):
            state.apply(RaftEntry(index=1, term=1, kind=ENTRY_COMMAND, data=bad))
    assert decode_command(encode_command([[0, "a", {"x": 1}], [1, "b"]])) == [(0, "a", {"x": 1}), (1, "b", None)]


def test_the_working_map_is_the_committed_one_on_a_voter_that_does_not_lead():
    state = ReplicatedState()
    with pytest.raises(RuntimeError):
        state.put("topic/x", {})
    state.activate()
    state.put("topic/x", {"a": 1})
    state.put_many([("partition/x/0", {}), ("partition/x/1", {})])
    assert [key for key, _ in state.items("partition/")] == ["partition/x/0", "partition/x/1"]
    assert "topic/x" not in state.committed
    [command] = state.take_commands(1024)
    state.apply(RaftEntry(index=1, term=1, kind=ENTRY_COMMAND, data=command))
    state.deactivate()
    assert state.get("topic/x") == {"a": 1} and len(state) == 3


# ---------------------------------------------------------------------------- the group quorum


def commit(net: ControllerNet, node: int, offset: int, correlation_id: int) -> None:
    net.send(CLIENT, node, OffsetCommitRequest(correlation_id=correlation_id, group_id="g", offsets=[
        OffsetEntry(topic="orders", partition=0, offset=offset)]))


def committed_offset(net: ControllerNet, node: int, correlation_id: int) -> int:
    net.send(CLIENT, node, OffsetFetchRequest(correlation_id=correlation_id, group_id="g", partitions=[("orders", 0)]))
    net.run_for(20)
    [answer] = [a for a in net.answers(CLIENT) if a.correlation_id == correlation_id]
    return answer.offsets[0].offset


def test_a_group_voter_answers_no_read_from_a_commit_the_quorum_may_lose_and_refuses_what_it_loses():
    """An active group voter cut off from the others takes a commit it cannot replicate: an offset
    fetch after it must not read that commit (a member would resume from an offset the quorum
    then loses), and once the voter is deposed both askers are refused NOT_COORDINATOR at once
    rather than left to wait out their request timeouts. The next leader has the offset the
    quorum committed."""
    net = ControllerNet(groups=True)
    old = net.run_until_active()
    commit(net, old, 10, correlation_id=1)
    net.run_for(50)
    assert [type(a) for a in net.answers(CLIENT)] == [OffsetCommitResponse]

    net.isolate(old)
    commit(net, old, 20, correlation_id=2)
    net.send(CLIENT, old, OffsetFetchRequest(correlation_id=3, group_id="g", partitions=[("orders", 0)]))
    net.run_for(20)
    assert net.answers(CLIENT) == [], "answered from a commit that had not committed"
    net.run_for(3_000)  # check-quorum deposes it; the other two elect a leader

    answers = net.answers(CLIENT)
    assert sorted((a.correlation_id, type(a).__name__, a.error) for a in answers) == [
        (2, "ErrorResponse", ErrorCode.NOT_COORDINATOR), (3, "ErrorResponse", ErrorCode.NOT_COORDINATOR)]
    net.heal()
    [new] = net.active()
    assert new != old and committed_offset(net, new, correlation_id=4) == 10


# ---------------------------------------------------------------------------- a step past one entry


def commit_many(net: ControllerNet, node: int, count: int, correlation_id: int, metadata_bytes: int = 200) -> None:
    net.send(CLIENT, node, OffsetCommitRequest(correlation_id=correlation_id, group_id="g", offsets=[
        OffsetEntry(topic="orders", partition=partition, offset=100 + partition, metadata="m" * metadata_bytes)
        for partition in range(count)]))


def stored_offsets(state: ReplicatedState) -> dict[int, int]:
    return {int(key.rsplit("/", 1)[1]): value[0] for key, value in state.committed.items()
            if key.startswith("offset/g/orders/")}


def test_a_step_whose_changes_pass_one_entry_commits_in_parts_and_is_acknowledged():
    """A step may change more than one entry of the log holds (a tick expiring locks in many
    share-partitions at once). Proposed as one entry it was refused TOO_LARGE: the asker got
    NOT_COORDINATOR, the coordinator rebuilt from the committed map and met the same step
    again. It is proposed as consecutive entries, applied together with the last one."""
    net = ControllerNet(groups=True, entry_bytes_max=4096)
    active = net.run_until_active()
    first_index = net.controllers[active].raft.log.last_index

    commit_many(net, active, 40, correlation_id=1)  # ~10 KB of offsets: at least three entries
    net.run_for(50)

    [answer] = net.answers(CLIENT)
    assert isinstance(answer, OffsetCommitResponse), answer
    assert all(entry.error == ErrorCode.NONE for entry in answer.offsets)
    assert net.active() == [active], "the coordinator stopped deciding"
    assert net.controllers[active].raft.log.last_index - first_index >= 3
    for controller in net.controllers.values():
        assert stored_offsets(controller.state) == {partition: 100 + partition for partition in range(40)}
    assert committed_offset(net, active, correlation_id=2) == 100


def test_a_step_whose_last_part_is_lost_with_its_leader_commits_none_of_its_parts():
    """The leader proposes a step's parts and dies after only the first reached the others. The
    next leader's no-op follows that part: every voter drops it, none applies a half step, and
    the asker was never told the commit succeeded."""
    net = ControllerNet(groups=True, entry_bytes_max=4096, append_entries_max=1)
    old = net.run_until_active()
    commit_many(net, old, 5, correlation_id=1, metadata_bytes=10)
    net.run_for(50)
    assert stored_offsets(net.controllers[old].state) == {partition: 100 + partition for partition in range(5)}
    first = net.controllers[old].raft.log.last_index + 1

    commit_many(net, old, 40, correlation_id=2)
    source, destination, request = net.queue.popleft()
    net._apply(destination, net.controllers[old].handle(request, source, net.now_ns))
    net.queue = type(net.queue)(item for item in net.queue
                                if getattr(item[2], "entries", None) and item[2].entries[0].index == first)
    assert net.queue, "the first part's appends were not sent"
    net.cut.update((voter_endpoint(node), voter_endpoint(old)) for node in net.voters)  # it hears no answer
    net.deliver()
    net.crash(old)
    net.heal()
    net.run_for(3_000)

    [new] = net.active()
    log = net.controllers[new].raft.log
    assert log.entry(first).term < log.entry(first + 1).term == net.controllers[new].raft.term, (
        "the new leader's no-op does not follow the first part")
    assert all(stored_offsets(net.controllers[node].state) == {p: 100 + p for p in range(5)}
               for node in net.controllers), "a half step was applied"
    assert all(controller.state.steps_dropped == 1 for controller in net.controllers.values())
    assert not [a for a in net.answers(CLIENT) if isinstance(a, OffsetCommitResponse) and a.correlation_id == 2]
    net.restart(old)
    net.run_for(500)
    assert stored_offsets(net.controllers[old].state) == {p: 100 + p for p in range(5)}
    assert net.controllers[old].state.steps_dropped == 1


def part_entries(operations: list, entry_bytes_max: int) -> list[RaftEntry]:
    state = ReplicatedState()
    state.activate()
    for key, value in operations:
        state.put(key, value)
    commands = state.take_commands(entry_bytes_max)
    return [RaftEntry(index=10 + number, term=1, kind=ENTRY_COMMAND, data=data)
            for number, data in enumerate(commands)]


OPERATIONS = [(f"offset/g/t/{index}", [index, "m" * 100]) for index in range(30)]


def test_a_step_is_split_into_entries_that_each_fit_and_applied_only_with_its_last():
    entries = part_entries(OPERATIONS, 1024)
    state = ReplicatedState()

    assert len(entries) >= 3 and all(len(entry.data) <= 1024 for entry in entries)
    for entry in entries[:-1]:
        state.apply(entry)
        assert not state.committed, "a part was applied before its last part"
    state.apply(entries[-1])
    assert dict(state.committed) == dict(OPERATIONS)
    assert part_entries(OPERATIONS[:3], 1024)[0].data == encode_command([[0, k, v] for k, v in OPERATIONS[:3]]), (
        "a step that fits one entry is one plain command, as before")


def test_a_snapshot_taken_between_parts_carries_them_to_the_voter_that_restores_it():
    entries = part_entries(OPERATIONS, 1024)
    state = ReplicatedState()
    state.apply(entries[0])
    restored = ReplicatedState()
    restored.restore(state.snapshot(), entries[0].index)

    for entry in entries[1:]:
        restored.apply(entry)

    assert dict(restored.committed) == dict(OPERATIONS)


def test_an_entry_after_an_unfinished_step_drops_its_parts_on_every_voter():
    from storage.raft_log import ENTRY_NOOP

    entries = part_entries(OPERATIONS, 1024)
    state = ReplicatedState()
    state.apply(entries[0])
    state.apply(entries[1])
    state.apply(RaftEntry(index=entries[2].index, term=2, kind=ENTRY_NOOP, data=b""))
    state.apply(RaftEntry(index=entries[2].index + 1, term=2, kind=ENTRY_COMMAND,
                          data=encode_command([[0, "k", 1]])))

    assert dict(state.committed) == {"k": 1}
    assert state.snapshot() == msgspec.msgpack.encode({"k": 1}), "the dropped parts live on in the snapshot"


def test_a_part_out_of_its_sequence_is_corruption_not_something_to_skip():
    entries = part_entries(OPERATIONS, 1024)
    state = ReplicatedState()
    with pytest.raises(BadCommand):
        state.apply(entries[1])  # a second part with no first before it
    state = ReplicatedState()
    state.apply(entries[0])
    with pytest.raises(BadCommand):
        state.apply(entries[2])  # a part skipped
    for header in ([2, 0, 3], [2, 4, 3], [2, 1, 1], [2, "1", 3], [2, 1]):
        with pytest.raises(BadCommand):
            ReplicatedState().apply(RaftEntry(index=1, term=1, kind=ENTRY_COMMAND,
                                              data=encode_command([header, [0, "k", 1]])))


# ---------------------------------------------------------------------------- the log, bounded in bytes


def held_bytes(controller) -> int:
    log = controller.raft.log
    return sum(len(log.entry(index).data) for index in range(log.first_index, log.last_index + 1))


@pytest.mark.timeout(60)
def test_the_log_a_voter_holds_is_bounded_in_bytes_not_only_in_entries():
    """A client commits ~700 KB of offsets over and over (the same offsets: the state stays under
    1 MiB). A snapshot every 1,024 entries let each voter keep ~700 MiB of entries in memory and in
    its journal before the first one. A snapshot is also due once the entries since the last one
    pass `snapshot_interval_bytes` (20 MiB, as KRaft's metadata.log.max.record.bytes.between.
    snapshots) or the last snapshot's size, and trailing entries stop at `snapshot_trailing_bytes`."""
    net = ControllerNet(groups=True)
    active = net.run_until_active()
    config = net.controllers[active].raft.config
    bound = config.snapshot_interval_bytes + config.snapshot_trailing_bytes + config.entry_bytes_max

    largest = 0
    for number in range(60):
        net.send(CLIENT, active, OffsetCommitRequest(correlation_id=number + 1, group_id="g", offsets=[
            OffsetEntry(topic="orders", partition=partition, offset=number, metadata=f"{number:04d}" * 975)
            for partition in range(180)]))
        net.run_for(20)
        largest = max([largest, *(held_bytes(controller) for controller in net.controllers.values())])

    answers = net.answers(CLIENT)
    assert len(answers) == 60 and all(isinstance(a, OffsetCommitResponse) for a in answers), answers[:1]
    assert all(controller.raft.log.snapshot is not None for controller in net.controllers.values())
    print(f"the most a voter held: {largest:,} bytes of entries")
    assert largest <= bound, f"a voter held {largest:,} bytes of entries (bound {bound:,})"
    assert all(stored_offsets(controller.state) == {partition: 59 for partition in range(180)}
               for controller in net.controllers.values())


def test_voters_restored_from_snapshots_taken_between_parts_hold_the_same_map(monkeypatch):
    """One entry per append: the commit index, and a snapshot every third entry, fall between a
    step's parts again and again. A voter that was down catches up from them (the leader's
    snapshot, then the rest of the step's parts), and one restarted replays its own."""
    restored_between_parts = []
    restore = ReplicatedState.restore

    def counting_restore(state, data, index):
        restore(state, data, index)
        restored_between_parts.append(state.assembling is not None)

    monkeypatch.setattr(ReplicatedState, "restore", counting_restore)
    net = ControllerNet(groups=True, entry_bytes_max=1024, append_entries_max=1, snapshot_interval_entries=3,
                        snapshot_trailing_entries=0)
    active = net.run_until_active()
    follower = next(node for node in net.voters if node != active)
    net.crash(follower)
    for number in range(6):
        net.send(CLIENT, active, OffsetCommitRequest(correlation_id=number + 1, group_id="g", offsets=[
            OffsetEntry(topic="orders", partition=partition, offset=number * 100 + partition, metadata="m" * 150)
            for partition in range(20)]))
        net.run_for(20)
    assert all(isinstance(answer, OffsetCommitResponse) for answer in net.answers(CLIENT))
    leader_state = net.controllers[active].state
    assert leader_state.steps_in_parts == 6 and net.controllers[active].raft.counters.get("snapshots_taken", 0) >= 6

    net.restart(follower)
    other = next(node for node in net.voters if node not in (active, follower))
    net.crash(other)
    net.restart(other)
    net.run_for(1_000)

    expected = {partition: 500 + partition for partition in range(20)}
    for node in net.voters:
        assert stored_offsets(net.controllers[node].state) == expected, node
        assert dict(net.controllers[node].state.committed) == dict(leader_state.committed)
    assert net.controllers[follower].raft.counters.get("snapshots_installed", 0) >= 1
    assert any(restored_between_parts), "no voter restored a snapshot taken between parts"


def test_an_operation_larger_than_an_entry_stays_whole_and_the_step_is_refused_too_large():
    """Parts split a step between its operations, never one operation: a record larger than an
    entry goes alone into a part that is still too large, and the leader refuses the step whole
    (the per-record bounds keep every record the coordinators write under an entry)."""
    from actors.replicated_state import split_command
    from tests.unit.raft_harness import Net

    operations = [[0, "small", "x" * 100], [0, "huge", "y" * 5000], [0, "other", "z" * 100]]
    parts = split_command(operations, 1024)
    net = Net(3, entry_bytes_max=1024)
    net.campaign(1)
    net.deliver()
    before = net.nodes[1].log.last_index

    assert len(parts) == 3 and [len(part) > 1024 for part in parts] == [False, True, False]
    assert net.nodes[1].propose_many(parts, net.now_ns).reason == "TOO_LARGE"
    assert net.nodes[1].log.last_index == before


def test_a_quorum_whose_state_belongs_to_another_cluster_says_so_to_every_client():
    """cluster.meta with one character changed: the controllers start as another cluster than their
    state's. The leader refuses to decide anything, and said so only in a trace: every client was
    told NOT_CONTROLLER and went round the voters until it gave up (CLUSTER_UNREACHABLE), with
    nothing in any log. Now every request gets INCONSISTENT_CLUSTER_ID naming both clusters."""
    net = ControllerNet()
    active = net.run_until_active()
    net.send(CLIENT, active, CreateTopicRequest(correlation_id=1, name="orders", partitions=1, replication_factor=3))
    net.run_for(50)
    net.cluster_id = "ga2e30f919a4"
    for node in (1, 2, 3):
        net.crash(node)
    for node in (1, 2, 3):
        net.restart(node)
    net.run_for(3_000)
    assert net.active() == [] and net.leader()
    for node in (1, 2, 3):
        net.send(CLIENT, node, MetadataRequest(correlation_id=10 + node, topics=None))
    net.deliver()
    answers = {answer.correlation_id: answer for answer in net.answers(CLIENT) if answer.correlation_id > 10}
    leader = answers[10 + net.leader()]
    assert isinstance(leader, ErrorResponse) and leader.error == ErrorCode.INCONSISTENT_CLUSTER_ID, leader
    assert CLUSTER_ID in leader.error_message and "ga2e30f919a4" in leader.error_message
    assert "cluster.meta" in leader.error_message


def test_a_settings_change_that_changes_nothing_is_answered_without_a_new_entry():
    """Kafka answers an IncrementalAlterConfigs that sets what is already set without writing a
    record; each one here was a new entry of the quorum's log and a new epoch for every partition."""
    from actors.messages import AlterTopicConfigRequest, AlterTopicConfigResponse

    net = ControllerNet()
    active = net.run_until_active()
    create(net, active, "orders")
    net.send(CLIENT, active, AlterTopicConfigRequest(correlation_id=2, name="orders",
                                                      changes={"retention_ms": 60_000}))
    net.run_for(50)
    net.answers(CLIENT)
    controller = net.controllers[active]
    entries_before = controller.raft.log.last_index
    epochs_before = {key: record.partition_epoch for key, record in controller.coordinator.partitions.items()}

    nothing_new = [{"retention_ms": 60_000}, {}, {"retention_bytes": None}]
    for correlation_id, changes in enumerate(nothing_new, start=3):
        net.send(CLIENT, active, AlterTopicConfigRequest(correlation_id=correlation_id, name="orders",
                                                          changes=changes))
    net.run_for(50)

    answers = net.answers(CLIENT)
    assert [(type(answer), answer.correlation_id, answer.error) for answer in answers] == [
        (AlterTopicConfigResponse, correlation_id, ErrorCode.NONE) for correlation_id in (3, 4, 5)]
    assert all(answer.config.retention_ms == 60_000 for answer in answers)
    assert controller.raft.log.last_index == entries_before, "a change of nothing was a new entry"
    epochs_after = {key: record.partition_epoch for key, record in controller.coordinator.partitions.items()}
    assert epochs_after == epochs_before


def test_a_settings_change_that_changes_nothing_new_waits_for_the_change_it_repeats_to_commit():
    from actors.messages import AlterTopicConfigRequest

    net = ControllerNet()
    active = net.run_until_active()
    create(net, active, "orders")
    net.run_for(50)
    net.answers(CLIENT)
    net.isolate(active)  # the first change cannot commit
    for correlation_id in (2, 3):
        net.send(CLIENT, active, AlterTopicConfigRequest(correlation_id=correlation_id, name="orders",
                                                          changes={"retention_ms": 60_000}))
    net.run_for(20)

    assert net.answers(CLIENT) == [], "a repeat of an uncommitted change was answered as done"
