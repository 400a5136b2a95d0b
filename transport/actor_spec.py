"""What an actor process is told to be, and where its directory lies.

A process is told what to be by an `ActorSpec` (MessagePack bytes, so the spawn/forkserver hand-off
pickles nothing clever); transport/actor_main.py decodes it and transport/actor_build.py builds
the actor it names. An actor's directory follows from its spec alone (`actor_directory`); the
node agent and the tools find replica directories with the same functions. This module only
names things: it never opens, locks or writes a directory.
"""

from __future__ import annotations

import os

import msgspec

from actors.limits import Limits
from actors.messages import TopicConfig


class ActorSpec(msgspec.Struct, kw_only=True):
    kind: str  # "controller" | "coordinator" | "group-coordinator" | "replica"
    name: str
    cluster_id: str
    data_dir: str
    port: int = 0
    coordinator: str = ""
    node: int = 0
    nodes: list[int] = []
    topic: str = ""
    topic_id: int = 0
    partition: int = -1
    config: TopicConfig = TopicConfig()
    limits: Limits = Limits()
    trace_path: str = ""
    log_level: str = "WARNING"
    shared_memory: bool = True  # fetch payloads through shared-memory rings on this host
    secret: bytes = b""  # the cluster secret (transport/auth.py); handed over the pipe, never a socket
    faults_enabled: bool = False  # obey the chaos harness's fault switch (clusters started for chaos)
    replicas: list[int] = []  # replicas: the partition's replica list, recorded in its directory
    rebuild_metadata: bool = False  # coordinator: rebuild a lost state from the replica directories
    reset_group_state: bool = False  # group coordinator: start empty although its state is lost
    report_to: str = ""  # replicas: their node agent's endpoint ("": report to the coordinator)
    voters: dict[int, str] = {}  # controllers: the quorum, voter (node) id -> endpoint
    bind_host: str = "127.0.0.1"  # where the actor's ROUTER listens
    advertise_host: str = ""  # the address others reach it at ("": bind_host), docs/deploy.md
    quorum_formed: bool = False  # controllers: some voter already has a log (a new one joins empty)


class RefusedToStart(Exception):
    """The actor must not run on this directory; the sentence says why and what to do."""


def replica_directory(data_dir: str, node: int, topic: str, partition: int, topic_id: int) -> str:
    return os.path.join(data_dir, f"node-{node}", f"{topic}-{partition}-{topic_id:x}")


def actor_directory(spec: ActorSpec) -> str:
    if spec.kind == "replica":
        return replica_directory(spec.data_dir, spec.node, spec.topic, spec.partition, spec.topic_id)
    if spec.kind == "controller":
        return controller_directory(spec.data_dir, spec.node)
    if spec.kind == "group-coordinator" and spec.voters:
        return os.path.join(spec.data_dir, f"node-{spec.node}", "group-coordinator")
    return os.path.join(spec.data_dir, spec.kind)


# Where a voter's rejoining mark was kept before its journal's header held it (storage/raft_records.py):
# a file of this name beside `raft/`, read once and moved into the header.
LEGACY_REJOINING_MARK = "rejoining"


def controller_directory(data_dir: str, node: int) -> str:
    """A controller's Raft log lives with its node's replicas: losing the node loses both."""
    return os.path.join(data_dir, f"node-{node}", "controller")
