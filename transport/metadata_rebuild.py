"""A lost coordinator state is never mistaken for a new cluster; it can be rebuilt from the replicas.

The coordinator's `metadata.state` holds every topic, its placement, epochs and ISR. If that file
is missing, shorter than its header or corrupt while replica directories exist under the data
directory, starting as an empty cluster would be a disaster: the node agent would stop every
replica it no longer hears of. So the coordinator refuses to start (`check_state_present`) and
says what to do: restore the file from a backup, or start once with `--rebuild-metadata`.

`rebuild_state` writes a fresh state from what every replica directory records about itself
(storage/replica_meta.py: cluster id, topic, topic id, partition, node, replica list, config),
and from each replica's leader-epoch checkpoint:

- each topic comes back with its id, config and, per partition, the replica list its metas name;
- no leader is recorded, and every replica is in the ISR with an unknown incarnation: the
  election after the grace then picks, among the replicas that report without data loss, the one
  with the highest (holds the known high watermark, last epoch, log end) — the same rule as after
  a full restart (actors/elections.py);
- leader and partition epochs start above every epoch any replica's log holds, so the new leader's
  epoch is newer than anything written before (a stale epoch would make its appends fail);
- producer ids restart far above any the old state can have handed out (the time in ms x 1024),
  so an idempotent producer never meets its own id reused by another;
- deleted-topic tombstones cannot be rebuilt: a directory of a topic deleted before the loss comes
  back as a topic (the replicas' data was still there, so nothing is lost by keeping it).

Group offsets live in the group coordinator's own state and are not touched.
"""

from __future__ import annotations

import os
import time

import msgspec

from actors.coordinator import TopicRecord
from actors.elections import PartitionRecord
from actors.messages import TopicConfig
from storage.epochs import EPOCH_CHECKPOINT_NAME, EpochCheckpointCorrupt, LeaderEpochCache
from storage.fs import FileSystem
from storage.replica_meta import META_NAME, MetaMismatch, ReplicaMeta, read_meta
from storage.state import HEADER_BYTES, DurableState

HOW_TO_RECOVER = (
    "restore {path} from a backup, or start once with --rebuild-metadata (`railmq up --data-dir DIR "
    "--rebuild-metadata`) to rebuild topics, placement and epochs from the replica directories")


VOTER_DIRECTORIES = {"controller", "group-coordinator"}  # a node's quorum voters: not replica data


class MetadataLost(RuntimeError):
    """The coordinator's state is gone while replica data exists."""


def replica_metas(data_dir: str, fs: FileSystem) -> list[tuple[str, ReplicaMeta]]:
    """(directory, meta) of every replica directory under the data directory."""
    found = []
    for node_name in sorted(_list(data_dir)):
        if not node_name.startswith("node-"):
            continue
        node_dir = os.path.join(data_dir, node_name)
        for replica_name in sorted(_list(node_dir)):
            directory = os.path.join(node_dir, replica_name)
            if not os.path.isdir(directory) or not fs.exists(os.path.join(directory, META_NAME)):
                continue
            try:
                meta = read_meta(fs, directory)
            except MetaMismatch:
                continue
            if meta is not None:
                found.append((directory, meta))
    return found


def _list(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []


def has_replica_data(data_dir: str) -> bool:
    for node_name in _list(data_dir):
        if node_name.startswith("node-") and set(_list(os.path.join(data_dir, node_name))) - VOTER_DIRECTORIES:
            return True
    return False


def check_state_present(data_dir: str, path: str) -> None:
    """Raise RefusedToStart when the state is missing or too short to hold anything while replica
    directories exist. A corrupt journal is caught when it is opened."""
    from transport.actor_main import RefusedToStart

    size = os.path.getsize(path) if os.path.exists(path) else -1
    if size > HEADER_BYTES or not has_replica_data(data_dir):
        return
    what = "missing" if size < 0 else f"only {size} bytes long"
    raise RefusedToStart(f"the coordinator's state {path} is {what}, but replica directories exist under "
                         f"{data_dir}: starting as a new cluster would abandon their data. "
                         + HOW_TO_RECOVER.format(path=path))


def rebuild_state(data_dir: str, path: str, cluster_id: str, fs: FileSystem) -> int:
    """Write a fresh coordinator state rebuilt from the replica directories; returns the number of
    topics rebuilt. The old file, if any, is kept beside it as `<path>.lost` (`.lost.1`, `.lost.2`...
    when an earlier rebuild already kept one: a second rebuild must not destroy the original)."""
    metas = [(directory, meta) for directory, meta in replica_metas(data_dir, fs) if meta.cluster_id == cluster_id]
    if os.path.exists(path):
        os.rename(path, unused_name(f"{path}.lost"))
        fs.sync_directory(os.path.dirname(path) or ".")
    state = DurableState.open(path, fs=fs, confirm=True)
    topics: dict[str, TopicRecord] = {}
    epochs: dict[tuple[str, int], int] = {}
    placement: dict[tuple[str, int], set[int]] = {}
    for directory, meta in metas:
        record = topics.get(meta.topic)
        if record is None or record.topic_id != meta.topic_id:
            config = msgspec.convert(meta.config, TopicConfig) if meta.config else TopicConfig()
            record = topics[meta.topic] = TopicRecord(name=meta.topic, topic_id=meta.topic_id, config=config, replicas=[])
        key = (meta.topic, meta.partition)
        placement.setdefault(key, set()).update(meta.replicas or [meta.node])
        epochs[key] = max(epochs.get(key, 0), _latest_epoch(fs, directory))
    nodes = sorted({meta.node for _, meta in metas})
    for name, record in topics.items():
        count = 1 + max(partition for topic, partition in placement if topic == name)
        factor = max(len(placed) for (topic, _), placed in placement.items() if topic == name)
        # A partition no directory holds any more comes back placed afresh (its data is gone).
        record.replicas = [sorted(placement.get((name, partition), set())) or _place(nodes, partition, factor)
                           for partition in range(count)]
        state.put(f"topic/{name}", msgspec.to_builtins(record))
        for partition, replicas in enumerate(record.replicas):
            epoch = epochs.get((name, partition), 0) + 1
            partition_record = PartitionRecord(leader=-1, leader_epoch=epoch, partition_epoch=epoch, isr=list(replicas),
                                               isr_incarnations={node: 0 for node in replicas}, unknown_history=True,
                                               offline_reason="rebuilt from the replica directories: electing")
            state.put(f"partition/{name}/{partition}", msgspec.to_builtins(partition_record))
    state.put("cluster/id", cluster_id)
    state.put("producer-id/next", time.time_ns() // 1_000_000 * 1024)
    state.flush()
    state.close()
    return len(topics)


def unused_name(path: str) -> str:
    candidate, number = path, 0
    while os.path.lexists(candidate):
        number += 1
        candidate = f"{path}.{number}"
    return candidate


def _place(nodes: list[int], partition: int, factor: int) -> list[int]:
    return sorted(nodes[(partition + offset) % len(nodes)] for offset in range(min(factor, len(nodes))))


def _latest_epoch(fs: FileSystem, directory: str) -> int:
    try:
        return max(0, LeaderEpochCache.load(fs, os.path.join(directory, EPOCH_CHECKPOINT_NAME)).latest_epoch())
    except (EpochCheckpointCorrupt, OSError):
        return 1_000  # unknown: far above any epoch a small cluster reaches, so never stale
