"""A cluster that ran the single coordinator (`--controllers 0`) and then starts its quorums: the
single coordinator's `coordinator/metadata.state` and `group-coordinator/groups.state` hold every
topic and every committed offset until a quorum has committed them, and are out of date after.

- A first quorum start cut short (every voter made its journal, none committed the old state yet)
  must start from those files again, not as a new, empty cluster: every topic and committed
  offset would be gone, and nothing would say so.
- Once a voter holds the quorum's committed state, the file is retired (renamed `.migrated`):
  a quorum that later lost every log is refused as any such quorum is, instead of starting
  again from the file's old topics, epochs and offsets.
- A quorum applies the old state once: a group deleted after the move does not come back at a
  later leader's start.
"""

from __future__ import annotations

import os

import pytest

from actors.messages import DeleteGroupRequest, OffsetFetchRequest, OffsetFetchResponse
from actors.replicated_state import PUT, encode_command
from storage.raft_log import ENTRY_COMMAND, RaftEntry, RaftLog
from storage.state import DurableState
from tests.unit.controller_harness import ControllerNet
from transport.actor_main import ActorSpec, RefusedToStart, build_actor, controller_directory

VOTERS = {node: f"tcp://127.0.0.1:{node}" for node in (1, 2, 3)}


def voter_spec(tmp_path, kind: str, node: int = 1) -> ActorSpec:
    return ActorSpec(kind=kind, name=f"{kind}/{node}", cluster_id="c1", data_dir=str(tmp_path), node=node,
                     nodes=[1, 2, 3], voters=VOTERS)


def raft_directory(tmp_path, kind: str, node: int) -> str:
    if kind == "controller":
        return os.path.join(controller_directory(str(tmp_path), node), "raft")
    return os.path.join(str(tmp_path), f"node-{node}", "group-coordinator", "raft")


def single_coordinator_files(tmp_path) -> tuple[str, str]:
    """What `--controllers 0` left: a topic with its replica directory, and a committed offset."""
    metadata = str(tmp_path / "coordinator" / "metadata.state")
    state = DurableState.open(metadata, confirm=True)
    state.put("cluster/id", "c1")
    state.put("topic/orders", {"name": "orders", "topic_id": 7, "replicas": [[1, 2, 3]]})
    state.close()
    groups = str(tmp_path / "group-coordinator" / "groups.state")
    state = DurableState.open(groups)
    state.put("offset/payments/orders/0", [41, "", 0])
    state.close()
    os.makedirs(tmp_path / "node-1" / "orders-0-7")
    return metadata, groups


@pytest.mark.parametrize("kind, key", [("controller", "topic/orders"),
                                       ("group-coordinator", "offset/payments/orders/0")])
def test_a_first_quorum_start_cut_short_before_its_first_commit_starts_from_the_old_state_again(
        tmp_path, actor_locks, kind, key):
    single_coordinator_files(tmp_path)
    for node in (1, 2, 3):  # each voter made its journal; then every process was killed
        RaftLog.open(raft_directory(tmp_path, kind, node)).close()

    voter, _ = build_actor(voter_spec(tmp_path, kind), VOTERS[1], incarnation=2)

    assert key in dict(voter.bootstrap), "the quorum would start as a new, empty cluster"


def committed_log(directory: str, key: str, value: object) -> None:
    """A voter's log holding one committed command: the quorum's own state."""
    log = RaftLog.open(directory)
    log.set_hard_state(1, 1)
    log.append([RaftEntry(index=1, term=1, kind=ENTRY_COMMAND, data=encode_command([[PUT, key, value]]))])
    log.set_commit(1)
    log.flush()
    log.close()


@pytest.mark.parametrize("kind", ["controller", "group-coordinator"])
def test_once_a_voter_holds_the_quorums_state_the_old_file_is_retired_and_a_quorum_without_logs_is_refused(
        tmp_path, actor_locks, kind):
    metadata, groups = single_coordinator_files(tmp_path)
    old = metadata if kind == "controller" else groups
    with open(old, "rb") as handle:
        content = handle.read()
    committed_log(raft_directory(tmp_path, kind, 1), "cluster/id" if kind == "controller" else "offset/g/t/0",
                  "c1" if kind == "controller" else [5, "", 0])

    voter, _ = build_actor(voter_spec(tmp_path, kind), VOTERS[1], incarnation=2)
    voter.raft.log.close()
    from transport import actor_main

    actor_main._LOCKS.pop().release()

    assert voter.bootstrap == []
    assert not os.path.exists(old), "the out-of-date file stays where a quorum without logs would read it"
    with open(old + ".migrated", "rb") as handle:
        assert handle.read() == content, "the file is kept, under another name"

    for node in (1, 2, 3):  # every voter's log is lost: the quorum's decisions since the move are gone
        if os.path.exists(raft_directory(tmp_path, kind, node)):
            os.rename(raft_directory(tmp_path, kind, node), raft_directory(tmp_path, kind, node) + ".lost")
    remedy = "--rebuild-metadata" if kind == "controller" else "--reset-group-state"
    with pytest.raises(RefusedToStart, match=remedy):
        build_actor(voter_spec(tmp_path, kind), VOTERS[1], incarnation=3)


def fetch_offsets(net: ControllerNet, leader: int) -> list:
    net.send("client", leader, OffsetFetchRequest(correlation_id=1, group_id="payments"))
    net.run_for(200)
    answers = [answer for answer in net.answers("client") if isinstance(answer, OffsetFetchResponse)]
    assert answers and answers[-1].error == 0, answers
    return answers[-1].offsets


def test_a_group_deleted_after_the_move_does_not_come_back_when_a_later_leader_starts():
    net = ControllerNet(groups=True)
    net.bootstrap = {node: [("offset/payments/orders/0", [41, "", 0])] for node in (1, 2, 3)}
    for node in (1, 2, 3):
        net.restart(node)  # each voter read the single coordinator's file as it started
    leader = net.run_until_active()
    assert [entry.offset for entry in fetch_offsets(net, leader)] == [41]
    net.send("client", leader, DeleteGroupRequest(correlation_id=2, group_id="payments"))
    net.run_for(200)
    assert fetch_offsets(net, leader) == []

    net.crash(leader)  # the next leader, which read the same file at its start, takes over
    net.restart(leader)
    net.isolate(leader)
    successor = net.run_until_active()
    assert successor != leader

    assert fetch_offsets(net, successor) == [], "the deleted group's old offset came back"
