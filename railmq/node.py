"""`ClusterNode`: one node of a cluster that spans machines (`railmq node`), docs/deploy.md.

    node = ClusterNode(2, voters={1: "10.0.0.1", 2: "10.0.0.2", 3: "10.0.0.3"}, data_dir="/var/lib/railmq",
                       bind_host="10.0.0.2").start()

A node runs, under its own supervisor: its voter of the controller quorum (on `port`), its voter of
the group-coordination quorum (on `port + 1`), and a node agent that starts the node's replica
processes (on free ports) as the active controller assigns them. Every node is a voter of both
quorums (the voter set is fixed from configuration: `voters` maps each node id to the host its
peers reach it at; every node uses the same `port`). Membership changes are not supported, so a
cluster's nodes are the voters it was formed with; a lost node comes back under the same id,
empty or not.

The cluster's identity — its id and its secret, which authenticates every message between its
processes — must be the same on every node and never travels over the network: the first node
creates it, and every other node is given a copy (`identity_from`: a directory holding
`cluster.meta` and `cluster.secret`), as Kafka formats every node's storage with one cluster id.

Shared-memory rings are for processes of one host: a node's replicas use ZeroMQ only, unless
`shared_memory` (all nodes on one machine, such as network namespaces of one kernel).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import msgspec

from actors.limits import NODE_ID_MAX, NODES_MAX, Limits
from railmq.quorum_formed import FormedCheck, VoterAddressTaken
from storage.directory import (
    CLUSTER_META_NAME, CLUSTER_SECRET_NAME, ClusterIdentity, ClusterMismatch, DirectoryLock, adopt_identity,
    check_identity,
)
from transport.actor_main import ActorSpec
from transport.node_agent import NodeAgent
from transport.supervisor import Supervisor

DEFAULT_NODE_PORT = 7411
# Every limit named, with room to spare, is ~10 KB of JSON; a larger file is not a limits file.
LIMITS_FILE_BYTES_MAX = 1024 * 1024


class NodeConfigError(ValueError):
    """A node configuration that cannot form a cluster (the sentence says what to change)."""


def parse_voters(text: str) -> dict[int, str]:
    """`1=10.0.0.1,2=10.0.0.2,3=host-3` -> {1: "10.0.0.1", ...}."""
    voters: dict[int, str] = {}
    for part in (piece.strip() for piece in text.split(",") if piece.strip()):
        node, separator, host = part.partition("=")
        if not separator or not node.strip().isdigit() or not 1 <= int(node) <= NODE_ID_MAX or not host.strip():
            raise NodeConfigError(
                f"{part!r} is not NODE=HOST (a node id of 1 to {NODE_ID_MAX}, then its address)")
        if int(node) in voters:
            raise NodeConfigError(f"node {int(node)} is named twice in {text!r}")
        if not _utf8(host):
            raise NodeConfigError(f"{part!r}: its address is not UTF-8 text")
        voters[int(node)] = host.strip()
    if not voters:
        raise NodeConfigError("--voters names no node")
    if len(voters) > NODES_MAX:
        raise NodeConfigError(f"--voters names {len(voters)} nodes; a cluster has at most {NODES_MAX}")
    return voters


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def load_limits(path: str) -> Limits:
    """The defaults with the changes a JSON object in `path` names (`{"replica_session_timeout_ms": 3000}`);
    an unknown name or a value of the wrong type is refused, naming it."""
    try:
        with open(path, "rb") as handle:
            content = handle.read(LIMITS_FILE_BYTES_MAX + 1)  # never whole: it may be /dev/zero
    except OSError as error:
        raise NodeConfigError(f"--limits {path}: {error.strerror}") from None
    if len(content) > LIMITS_FILE_BYTES_MAX:
        raise NodeConfigError(f"--limits {path} is larger than {LIMITS_FILE_BYTES_MAX} bytes: "
                              "not a limits file")
    try:
        changes = msgspec.json.decode(content)
    except msgspec.DecodeError as error:
        raise NodeConfigError(f"--limits {path} is not JSON: {error}") from None
    if not isinstance(changes, dict):
        raise NodeConfigError(f"--limits {path} must hold a JSON object of limit names and values")
    unknown = sorted(set(changes) - set(Limits.__struct_fields__))
    if unknown:
        raise NodeConfigError(f"--limits {path} names no limit called {', '.join(unknown)} (see actors/limits.py)")
    try:
        return msgspec.convert(changes, Limits)
    except msgspec.ValidationError as error:
        raise NodeConfigError(f"--limits {path}: {error}") from None


class ClusterNode:
    def __init__(self, node: int, *, voters: dict[int, str], data_dir: str, port: int = DEFAULT_NODE_PORT,
                 bind_host: str = "", advertise_host: str = "", identity_from: str = "",
                 limits: Limits | None = None, shared_memory: bool = False, trace: bool = True,
                 log_level: str = "WARNING", restart_delay_ms: int = 500) -> None:
        if node not in voters:
            raise NodeConfigError(f"node {node} is not one of the voters {sorted(voters)}: every node is a voter")
        if not 0 < port < 65535:
            raise NodeConfigError(f"--port must leave room for the group voter on port + 1, got {port}")
        self.node = node
        self.voters = dict(voters)
        self.port = port
        self.advertise_host = advertise_host or voters[node]
        self.bind_host = bind_host or self.advertise_host
        self.data_dir = data_dir
        self.identity_from = identity_from
        self.limits = limits or Limits()
        self.shared_memory = shared_memory
        self.trace_path = os.path.join(data_dir, "trace.jsonl") if trace else ""
        self.log_level = log_level
        self.supervisor = Supervisor(restart_delay_ms=restart_delay_ms)
        self.agent: NodeAgent | None = None
        self._lock: DirectoryLock | None = None
        self.cluster_id, self.secret = "", b""

    @property
    def controller_endpoints(self) -> dict[int, str]:
        return {node: f"tcp://{host}:{self.port}" for node, host in sorted(self.voters.items())}

    @property
    def group_voter_endpoints(self) -> dict[int, str]:
        return {node: f"tcp://{host}:{self.port + 1}" for node, host in sorted(self.voters.items())}

    @property
    def bootstrap(self) -> str:
        return ",".join(self.controller_endpoints.values())

    def start(self, stop: threading.Event | None = None) -> "ClusterNode":
        """Start the node's voters and agent. A voter with an empty log first waits for the other
        voters to say whether its quorum formed (`QuorumUndecided` if `stop` is set meanwhile)."""
        os.makedirs(self.data_dir, exist_ok=True)
        self._lock = DirectoryLock(self.data_dir).acquire()
        try:
            self._adopt_identity()
            identity = ClusterIdentity.load_or_create(self.data_dir)
            self.cluster_id, self.secret = identity.cluster_id, identity.secret
            for kind, name, port, voters in (("controller", f"controller/{self.node}", self.port,
                                              self.controller_endpoints),
                                             ("group-coordinator", f"group-coordinator/{self.node}", self.port + 1,
                                              self.group_voter_endpoints)):
                spec = self._spec(kind, name, port, voters)
                spec.quorum_formed = self._formed_elsewhere(kind, voters, port, stop)
                self.supervisor.start(spec)
            self.agent = NodeAgent(
                supervisor=self.supervisor, coordinator=self.bootstrap, nodes=[self.node], data_dir=self.data_dir,
                cluster_id=self.cluster_id, limits=self.limits, trace_path=self.trace_path,
                log_level=self.log_level, shared_memory=self.shared_memory, secret=self.secret,
                bind_host=self.bind_host, advertise_host=self.advertise_host)
            self.agent.start()
        except BaseException:
            self.stop()
            raise
        return self

    def _formed_elsewhere(self, kind: str, voters: dict[int, str], port: int,
                          stop: threading.Event | None) -> bool:
        """Whether this voter's quorum formed without it (so an empty log here is a lost one, and it
        must wait to be caught up, docs/raft.md §7): only the other voters' answers decide
        (railmq/quorum_formed.py), as the data directories of other machines cannot be looked at,
        as LocalCluster's can."""
        raft = os.path.join(self.data_dir, f"node-{self.node}", kind, "raft")
        if os.path.isdir(raft) and os.listdir(raft):
            return False  # it has a log: nothing was lost
        others = {node: endpoint for node, endpoint in voters.items() if node != self.node}
        check = FormedCheck(f"tcp://{self.bind_host}:{port}", others, voters=len(voters))
        try:
            return check.run(stop)
        except VoterAddressTaken as error:
            raise NodeConfigError(f"the {kind} voter's address is in use by another process ({error})") \
                from None

    def _adopt_identity(self) -> None:
        """Copy the cluster's identity from `identity_from` into a data directory that has none, or
        check that the one it has is that one."""
        if not self.identity_from:
            return
        if os.path.exists(os.path.join(self.data_dir, CLUSTER_META_NAME)):
            if os.path.lexists(os.path.join(self.identity_from, CLUSTER_META_NAME)):
                try:
                    check_identity(self.identity_from, self.data_dir)
                except ClusterMismatch as error:
                    raise NodeConfigError(f"--identity-from {self.identity_from}: {error}") from None
            return
        for name in (CLUSTER_META_NAME, CLUSTER_SECRET_NAME):
            if not os.path.lexists(os.path.join(self.identity_from, name)):
                raise NodeConfigError(f"{self.identity_from} has no {name}: copy it from the node that formed "
                                      "the cluster")
        try:
            adopt_identity(self.identity_from, self.data_dir)  # checked before anything is written
        except ClusterMismatch as error:
            raise NodeConfigError(f"--identity-from {self.identity_from}: {error}") from None

    def _spec(self, kind: str, name: str, port: int, voters: dict[int, str]) -> ActorSpec:
        return ActorSpec(kind=kind, name=name, cluster_id=self.cluster_id, data_dir=self.data_dir, port=port,
                         coordinator=self.bootstrap, node=self.node, nodes=sorted(self.voters), limits=self.limits,
                         trace_path=self.trace_path, log_level=self.log_level, secret=self.secret, voters=voters,
                         bind_host=self.bind_host, advertise_host=self.advertise_host)

    def actors(self) -> list[dict[str, Any]]:
        with self.supervisor.lock:
            return [{"name": managed.name, "pid": managed.pid if managed.alive else 0, "endpoint": managed.endpoint,
                     "alive": managed.alive} for managed in self.supervisor.actors.values()]

    def kill(self, name: str) -> int:
        return self.supervisor.signal(name, signal.SIGKILL)

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
            self.agent = None
        self.supervisor.stop_all()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "ClusterNode":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
