"""The node agent and a node directory it cannot list (transport/node_agent.py).

After every answer that carries assignments, the agent looks through each of its nodes'
directories for the data of deleted topics. A node directory that is gone is normal (nothing was
created there yet); one that is unusable — a regular file in its place (a lost disk that came
back as a file), or one it may not read — is the node's own problem, which its replicas already
report as they refuse to start. The agent says so once, not once per heartbeat, and carries on:
no traceback, and the assignments it was given are taken (their version too, so the coordinator
does not send them again and again).
"""

from __future__ import annotations

import logging
import os

from actors.messages import NodeHeartbeatResponse, ReplicaAssignment
from tests.unit.test_node_liveness import LIMITS
from transport.node_agent import NodeAgent

NODES = [1, 2]


class _Supervisor:
    """What the agent asks of its supervisor while it reconciles: start and stop processes."""

    def __init__(self) -> None:
        self.actors: dict = {}
        self.launched: list[str] = []

    def launch(self, spec) -> None:
        self.launched.append(spec.name)

    def stop(self, name: str) -> None:
        self.launched.remove(name)


class _Controller:
    """Answers every heartbeat with the assignments of the given version."""

    def __init__(self) -> None:
        self.version = "v1"
        self.deleted: list[int] = []
        self.heartbeats = []

    def request_controller(self, controllers, heartbeat, **options) -> NodeHeartbeatResponse:
        self.heartbeats.append(heartbeat)
        assignments = [ReplicaAssignment(topic="orders", topic_id=0xA1, partition=0, node=node) for node in NODES]
        return NodeHeartbeatResponse(correlation_id=0, cluster_id="c", assignments_version=self.version,
                                     assignments=assignments, deleted_topic_ids=self.deleted)


def _agent(data_dir) -> NodeAgent:
    return NodeAgent(supervisor=_Supervisor(), coordinator="tcp://127.0.0.1:9", nodes=NODES,
                     data_dir=str(data_dir), cluster_id="c", limits=LIMITS)


def _replace_by_a_file(path) -> None:
    with open(path, "wb") as handle:
        handle.write(b"x")


def _lines_about(caplog, path) -> list[str]:
    return [record.getMessage() for record in caplog.records if str(path) in record.getMessage()]


def test_a_node_directory_replaced_by_a_file_is_said_once_and_the_assignments_are_taken(tmp_path, caplog):
    node_dir = tmp_path / "node-1"
    _replace_by_a_file(node_dir)
    agent, controller = _agent(tmp_path), _Controller()
    with caplog.at_level(logging.INFO, logger="railmq.node_agent"):
        for version in ("v1", "v1", "v2", "v3"):  # the same answer again, then changed ones
            controller.version = version
            agent._heartbeat(controller)
            assert agent.assignments_version == version, "taken: not sent again on every heartbeat"
    assert agent.replica_names() == ["replica/orders/0/n1", "replica/orders/0/n2"]
    assert [record.exc_info for record in caplog.records if record.exc_info] == [], "no traceback"
    lines = _lines_about(caplog, node_dir)
    assert len(lines) == 1 and "not a directory" in lines[0], lines


def test_node_directories_that_work_are_still_cleaned_of_deleted_topics(tmp_path, caplog):
    _replace_by_a_file(tmp_path / "node-1")
    left = tmp_path / "node-2" / "gone-0-b2"
    left.mkdir(parents=True)
    agent, controller = _agent(tmp_path), _Controller()
    controller.deleted = [0xB2]
    agent._heartbeat(controller)
    assert not left.exists(), "node 2's directory is usable: the deleted topic's data goes"


def test_a_node_directory_usable_again_is_cleaned_and_said_again_if_it_breaks_again(tmp_path, caplog):
    node_dir = tmp_path / "node-1"
    _replace_by_a_file(node_dir)
    agent = _agent(tmp_path)
    with caplog.at_level(logging.INFO, logger="railmq.node_agent"):
        agent._reconcile([], set())
        os.unlink(node_dir)
        (node_dir / "gone-0-b2").mkdir(parents=True)
        agent._reconcile([], {0xB2})
        assert not (node_dir / "gone-0-b2").exists()
        os.rmdir(node_dir)
        _replace_by_a_file(node_dir)
        agent._reconcile([], set())
    unusable = [line for line in _lines_about(caplog, node_dir) if "not a directory" in line]
    assert len(unusable) == 2, unusable
