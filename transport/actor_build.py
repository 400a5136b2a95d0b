"""Building an actor over real storage from its spec: the coordinator, the voters of both quorums,
the group coordinator, a replica.

Before an actor touches its directory it checks whose it is: a replica directory of another
cluster, topic id, partition or node, a coordinator whose state file is missing, short or corrupt
while replica directories exist — each raises `RefusedToStart` (transport/actor_spec.py), having
changed nothing. The directory's lock (storage/directory.py) is taken before any of this, by
`build_actor` in transport/actor_main.py. A voter that comes back empty to a quorum that had
formed writes a durable mark and does not vote until a leader has caught it up (docs/raft.md §7).
Building never runs the actor and never touches a socket: that is the runtime's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from typing import Any, Iterator

import msgspec

from actors.messages import TopicConfig
from transport.actor_spec import LEGACY_REJOINING_MARK, ActorSpec, RefusedToStart

# Beside a voter's `raft/`: the cluster whose log it holds (`check_voter_cluster`), ~40 bytes.
VOTER_META_NAME = "voter.meta"
VOTER_META_BYTES_MAX = 64 * 1024


def log_config_for(config: TopicConfig) -> Any:
    """Storage settings for a topic. `every_batch` flushing is done by the actor (AfterFlush, so
    one fsync covers many requests), so the log itself is told NEVER for that policy."""
    from storage.log import FlushPolicy, LogConfig

    policy = FlushPolicy.INTERVAL if config.flush_policy == "interval" else FlushPolicy.NEVER
    return LogConfig(
        segment_bytes=config.segment_bytes, segment_ms=config.segment_ms, retention_ms=config.retention_ms,
        retention_bytes=config.retention_bytes, flush_policy=policy, flush_interval_ms=config.flush_interval_ms,
        batch_bytes_max=config.batch_bytes_max,
    )


class StorageFaults:
    """Lets the runtime's FaultControlRequest reach the actor's file system."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def __call__(self, *, disk_full: bool, fail_next_fsync: bool) -> None:
        self.fs.faults.set_write_quota(0 if disk_full else None)
        if fail_next_fsync:
            self.fs.faults.fail_next_fsync()


def build_kind(spec: ActorSpec, fs: Any, directory: str, endpoint: str, incarnation: int) -> tuple[Any, Any]:
    """(actor, storage fault hook) for a spec whose directory lock is already held."""
    if spec.kind == "coordinator":
        return _build_coordinator(spec, fs, directory, incarnation), StorageFaults(fs)
    if spec.kind == "controller":
        return _build_controller(spec, fs, directory, endpoint, incarnation), StorageFaults(fs)
    if spec.kind == "group-coordinator" and spec.voters:
        return _build_group_voter(spec, fs, directory, endpoint, incarnation), StorageFaults(fs)
    if spec.kind == "group-coordinator":
        from actors.group_coordinator import GroupCoordinator
        from storage.state import DurableState

        path = os.path.join(directory, "groups.state")
        if not spec.reset_group_state:
            check_group_state_present(spec.data_dir, path, os.path.getsize(path) if os.path.exists(path) else -1)
        state = DurableState.open(path, fs=fs)
        actor = GroupCoordinator(state=state, coordinator=spec.coordinator, endpoint=endpoint,
                                 incarnation=incarnation, pid=os.getpid(), limits=spec.limits,
                                 rng=random.Random(incarnation), client_key=spec.secret)
        return actor, StorageFaults(fs)
    if spec.kind == "replica":
        return _build_replica(spec, fs, directory, endpoint, incarnation), StorageFaults(fs)
    raise ValueError(f"unknown actor kind {spec.kind!r}")


def _build_coordinator(spec: ActorSpec, fs: Any, directory: str, incarnation: int) -> Any:
    from actors.coordinator import Coordinator
    from storage.errors import CorruptState
    from storage.state import DurableState
    from transport.metadata_rebuild import check_state_present, rebuild_state

    path = os.path.join(directory, "metadata.state")
    if spec.rebuild_metadata:
        rebuild_state(spec.data_dir, path, spec.cluster_id, fs)
    check_state_present(spec.data_dir, path)
    try:
        state = DurableState.open(path, fs=fs, confirm=True)  # storage/state.py: epochs must not be lost to bit rot
    except CorruptState as error:
        raise RefusedToStart(f"the coordinator's state is corrupt ({error}); see `railmq up --help` "
                             "for --rebuild-metadata") from None
    try:
        return Coordinator(state=state, nodes=spec.nodes, rng=random.Random(incarnation), limits=spec.limits,
                           cluster_id=spec.cluster_id, client_key=spec.secret)
    except ValueError as error:
        raise RefusedToStart(str(error)) from None


def _build_controller(spec: ActorSpec, fs: Any, directory: str, endpoint: str, incarnation: int) -> Any:
    """A voter of the quorum. A voter with an empty log on a cluster whose quorum never formed
    takes the metadata of a single-coordinator cluster (`coordinator/metadata.state`) as its
    first command if it is elected; with neither, while replica directories exist, it refuses to
    start, as the single coordinator does (the metadata is lost: `--rebuild-metadata`)."""
    from actors.controller import Controller
    from actors.coordinator import Coordinator

    raft_directory = os.path.join(directory, "raft")
    empty = voter_log_missing(raft_directory)
    bootstrap: list[tuple[str, Any]] = []
    if empty and not quorum_formed(spec, directory):  # checked before anything is written
        bootstrap = _first_metadata(spec, fs)
    log = _open_voter_log(spec, fs, directory, empty)
    config = _raft_config(spec)
    rng = random.Random(incarnation)

    def coordinator(state: Any) -> Any:
        return Coordinator(state=state, nodes=spec.nodes, rng=random.Random(rng.getrandbits(64)), limits=spec.limits,
                           cluster_id=spec.cluster_id, client_key=spec.secret)

    controller = Controller(config=config, log=log, rng=rng, coordinator_factory=coordinator,
                            endpoint=endpoint, pid=os.getpid(), bootstrap=bootstrap, name=spec.name)
    legacy = os.path.join(spec.data_dir, "coordinator", "metadata.state")
    _start_from_legacy(spec, controller, legacy, lambda: _read_legacy_metadata(fs, legacy), fs)
    return controller


def voter_log_missing(raft_directory: str) -> bool:
    """Whether a voter has no raft journal (new, or its disk was lost). Decided by the journal's
    name, not by an empty directory: a leftover temporary file beside a lost journal must not
    make a wiped voter look like one that still holds its vote."""
    from storage.raft_records import LOG_NAME

    return not os.path.exists(os.path.join(raft_directory, LOG_NAME))


def _open_voter_log(spec: ActorSpec, fs: Any, directory: str, empty: bool) -> Any:
    """The raft log of a voter of either quorum.

    A voter that comes back empty to a quorum that had formed (its disk was lost) must not vote
    until a leader has caught it up (docs/raft.md §7). Its new journal is created with the
    rejoining mark in its header, so the mark survives its crashes and is lost only with the
    journal, which marks it again. A mark from before the header held it (a file `rejoining`
    beside `raft/`) moves into the header, durably, before the file goes."""
    from storage.raft_log import RaftLog

    check_voter_cluster(spec, fs, directory)
    log = RaftLog.open(os.path.join(directory, "raft"), fs=fs,
                       rejoining_if_created=empty and quorum_formed(spec, directory))
    legacy_mark = os.path.join(directory, LEGACY_REJOINING_MARK)
    if os.path.exists(legacy_mark):
        log.set_rejoining(True)
        log.flush()
        os.unlink(legacy_mark)
        fs.sync_directory(directory)
    return log


def check_voter_cluster(spec: ActorSpec, fs: Any, directory: str) -> None:
    """`RefusedToStart` unless the voter's directory is this cluster's, as recorded in its
    `voter.meta` (written at the first start that finds none). A Raft journal does not name its
    cluster: `node-2/` of another cluster copied in (a restore from the wrong backup), whose entries
    had the indexes and terms this quorum's leader expected, was taken by log matching, and the
    voter's journal held the other cluster's topics beside this one's."""
    if not spec.cluster_id:
        return
    path = os.path.join(directory, VOTER_META_NAME)
    if not fs.exists(path):
        fs.make_directory(directory)
        fs.write_file_atomic(path, msgspec.json.encode({"cluster_id": spec.cluster_id}) + b"\n")
        return
    try:
        held = msgspec.json.decode(fs.read_file(path, bytes_max=VOTER_META_BYTES_MAX))["cluster_id"]
    except (OSError, msgspec.DecodeError, TypeError, KeyError) as error:
        raise RefusedToStart(f"{path} is unreadable ({str(error)[:120]}); refusing to guess which "
                             "cluster's log this voter holds") from None
    if held != spec.cluster_id:
        raise RefusedToStart(f"{directory} holds the log of cluster {str(held)[:60]!r}, not of this cluster "
                             f"{spec.cluster_id!r}: move it away (the voter then comes back empty and is "
                             "caught up by the leader) or restore this cluster's")


def quorum_formed(spec: ActorSpec, directory: str) -> bool:
    """Whether this voter's quorum had formed before: the cluster said so at start, or another
    voter of it on this machine has written a record or a snapshot (this one was wiped while the
    cluster runs). A voter that merely started has a log of headers only."""
    from storage.raft_records import HEADER_BYTES, LOG_NAME, SNAPSHOT_NAME

    if spec.quorum_formed:
        return True
    kind = os.path.basename(directory)
    for node in spec.voters:
        raft = os.path.join(spec.data_dir, f"node-{node}", kind, "raft")
        if node == spec.node:
            continue
        log = os.path.join(raft, LOG_NAME)
        if os.path.exists(os.path.join(raft, SNAPSHOT_NAME)) or (
                os.path.exists(log) and os.path.getsize(log) > HEADER_BYTES):
            return True
    return False


def _raft_config(spec: ActorSpec) -> Any:
    from actors.raft import RaftConfig

    return RaftConfig(node_id=spec.node, voters=dict(spec.voters),
                      election_timeout_ms=spec.limits.controller_election_timeout_ms,
                      heartbeat_interval_ms=spec.limits.controller_heartbeat_interval_ms,
                      idle_heartbeat_interval_ms=spec.limits.controller_idle_heartbeat_interval_ms,
                      campaign_at_first_start=True)


def _build_group_voter(spec: ActorSpec, fs: Any, directory: str, endpoint: str, incarnation: int) -> Any:
    """A voter of the group-coordination quorum (actors/group_quorum.py). A new quorum on a
    cluster that had a single group coordinator starts from its `groups.state`."""
    from actors.group_coordinator import GroupCoordinator
    from actors.group_quorum import GroupQuorumVoter
    from storage.state import DurableState

    raft_directory = os.path.join(directory, "raft")
    empty = voter_log_missing(raft_directory)
    legacy = os.path.join(spec.data_dir, "group-coordinator", "groups.state")
    starting_point = os.path.exists(legacy) or spec.reset_group_state
    if empty and not quorum_formed(spec, directory) and not starting_point:
        check_group_state_present(spec.data_dir, legacy, -1)
    log = _open_voter_log(spec, fs, directory, empty)
    rng = random.Random(incarnation)

    def group_coordinator(state: Any) -> Any:
        return GroupCoordinator(state=state, coordinator=spec.coordinator, endpoint=endpoint,
                                incarnation=rng.getrandbits(62) + 1, pid=os.getpid(), limits=spec.limits,
                                rng=random.Random(rng.getrandbits(64)), client_key=spec.secret)

    voter = GroupQuorumVoter(config=_raft_config(spec), log=log, rng=rng,
                             coordinator_factory=group_coordinator, endpoint=endpoint, pid=os.getpid(),
                             name=spec.name)
    # Another actor's file: read, never written (DurableState.read), and retired once superseded.
    _start_from_legacy(spec, voter, legacy, lambda: DurableState.read(legacy, fs=fs), fs)
    return voter


def _start_from_legacy(spec: ActorSpec, voter: Any, legacy: str, read: Any, fs: Any) -> None:
    """Give a voter the single coordinator's state (`legacy`: `--controllers 0` ran this cluster)
    while its quorum may not have committed it yet, and retire the file once it has.

    The committed map the voter's own log holds says which. Empty: the quorum may never have
    applied the file — its first start can have been cut short after every voter made its journal
    and before the first leader committed anything (a start that read the file only when the
    journal was missing then came up as a new, empty cluster) — so the voter takes the file as its
    starting point; its first leader applies it only to an empty map (actors/controller.py). Not
    empty: a majority holds the quorum's own state, newer than the file, which is renamed
    `<file>.migrated`, so a quorum that later loses every log is refused as any such quorum is,
    instead of starting again from the file's old topics, epochs and offsets. Under the bootstrap
    lock, as another voter may be reading the file at that moment."""
    from transport.metadata_rebuild import unused_name

    with _metadata_bootstrap_lock(spec.data_dir):
        if not os.path.exists(legacy):
            return
        if not _commits_anything(voter.raft.log):
            voter.bootstrap = voter.bootstrap or read()
            return
        try:
            os.rename(legacy, unused_name(legacy + ".migrated"))
            fs.sync_directory(os.path.dirname(legacy))
        except OSError as error:  # the voter runs; the file is retired at a later start
            logging.getLogger("railmq.actor").warning("%s: cannot retire %s (%s)", spec.name, legacy, error)


def _commits_anything(log: Any) -> bool:
    """Whether the committed map a voter's log holds (its snapshot, then its entries up to its
    commit index, applied as the voter will apply them once started) has any key."""
    from actors.replicated_state import ReplicatedState

    state = ReplicatedState()
    if log.snapshot is not None:
        state.restore(log.snapshot_data, log.snapshot.index)
    for index in range(state.applied_index + 1, log.hard_state.commit + 1):
        if len(state.committed):
            break
        state.apply(log.entry(index))
    return bool(len(state.committed))


def check_group_state_present(data_dir: str, path: str, size: int) -> None:
    """Raise RefusedToStart when the group state (`size` bytes; -1: missing) cannot hold even its
    header while replica directories exist: the cluster has run, so its groups' committed offsets,
    generations and share-group state were lost, and starting empty would send every consumer back
    to its `auto_offset_reset`. A journal of only its header is intact: no group committed yet."""
    from storage.state import HEADER_BYTES
    from transport.metadata_rebuild import has_replica_data

    if size >= HEADER_BYTES or not has_replica_data(data_dir):
        return
    what = "missing" if size < 0 else f"only {size} bytes long"
    raise RefusedToStart(
        f"the group coordinator's state {path} is {what}, but replica directories exist under {data_dir}: "
        "starting empty would lose every group's committed offsets and generations (consumers would start "
        f"over at their auto_offset_reset). Restore {path} from a backup, or start once with "
        "--reset-group-state (`railmq up --data-dir DIR --reset-group-state`) to accept the loss")


def _first_metadata(spec: ActorSpec, fs: Any) -> list[tuple[str, Any]]:
    """What the first leader of a new quorum starts from: the single coordinator's state when
    this cluster had one (rebuilt from the replica directories with `--rebuild-metadata`), or
    nothing for a new cluster. Refuses when replica directories exist but no metadata does."""
    from transport.metadata_rebuild import rebuild_state

    legacy = os.path.join(spec.data_dir, "coordinator", "metadata.state")
    with _metadata_bootstrap_lock(spec.data_dir):
        if spec.rebuild_metadata:
            rebuild_state(spec.data_dir, legacy, spec.cluster_id, fs)
        return _read_first_metadata(spec, fs, legacy)


@contextlib.contextmanager
def _metadata_bootstrap_lock(data_dir: str) -> Iterator[None]:
    """Every voter of a new quorum on this machine rebuilds and reads the same legacy file at its
    first start: one at a time (an exclusive flock on `<data dir>/.metadata-bootstrap`, waited
    for; the kernel drops it if its holder dies), or one could read another's half-written
    rebuild, or find the file renamed away mid-read."""
    import fcntl

    fd = os.open(os.path.join(data_dir, METADATA_BOOTSTRAP_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for one rebuild and one read: milliseconds
        yield
    finally:
        os.close(fd)


METADATA_BOOTSTRAP_LOCK = ".metadata-bootstrap"


def _read_first_metadata(spec: ActorSpec, fs: Any, legacy: str) -> list[tuple[str, Any]]:
    from storage.state import HEADER_BYTES
    from transport.metadata_rebuild import HOW_TO_RECOVER, has_replica_data

    size = os.path.getsize(legacy) if os.path.exists(legacy) else -1
    if size <= HEADER_BYTES:
        if has_replica_data(spec.data_dir):
            raise RefusedToStart(
                f"no controller of this cluster has its log (node-N/controller/raft under {spec.data_dir}) and "
                f"there is no coordinator state {legacy}, but replica directories exist: starting as a new "
                "cluster would abandon their data. " + HOW_TO_RECOVER.format(path="the controllers' logs"))
        return []
    return _read_legacy_metadata(fs, legacy)


def _read_legacy_metadata(fs: Any, legacy: str) -> list[tuple[str, Any]]:
    from storage.errors import CorruptState
    from storage.state import DurableState

    try:
        return DurableState.read(legacy, fs=fs, confirm=True)  # the other voters read it too: never written
    except CorruptState as error:
        raise RefusedToStart(f"the coordinator's state is corrupt ({error}); see `railmq up --help` "
                             "for --rebuild-metadata") from None


def _build_replica(spec: ActorSpec, fs: Any, directory: str, endpoint: str, incarnation: int) -> Any:
    from actors.partition_replica import PartitionReplica
    from storage.replica_meta import MetaMismatch, ReplicaMeta, open_replica_directory

    now_ms = time.time_ns() // 1_000_000
    expected = ReplicaMeta(cluster_id=spec.cluster_id, topic=spec.topic, topic_id=spec.topic_id,
                           partition=spec.partition, node=spec.node, replicas=list(spec.replicas),
                           config=msgspec.to_builtins(spec.config), created_ms=now_ms)
    try:
        opened = open_replica_directory(fs, directory, expected, log_config_for(spec.config), now_ms)
    except MetaMismatch as error:
        raise RefusedToStart(str(error)) from None
    return PartitionReplica(
        topic=spec.topic, topic_id=spec.topic_id, partition=spec.partition, node=spec.node, endpoint=endpoint,
        coordinator=spec.coordinator, log=opened.log, config=spec.config, incarnation=incarnation, pid=os.getpid(),
        limits=spec.limits, health=opened.health, findings=opened.findings, report_to=spec.report_to,
        client_key=spec.secret)
