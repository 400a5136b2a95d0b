"""What a replica directory says about itself: whose it is, and what it knows it has lost.

Two small files live beside the segments:

- `replica.meta`, written once when the directory is created: cluster id, topic, topic id,
  partition, node, the partition's replica list and the topic's config. A replica refuses a
  directory whose meta names another cluster, topic id, partition or node. The metas of all
  replica directories are also what `railmq up --rebuild-metadata` rebuilds a lost coordinator
  state from.
- `replica.health`, the damage this replica knows of and has not repaired: ranges of offsets it
  once held durably and no longer can serve (cut from the end, refused as corrupt, or unknown
  after a file went missing), and whether the directory was created empty (`new_directory`) —
  a replica whose directory was wiped comes back empty and must not look like one that never
  had data. The file is rewritten (atomically) whenever the damage changes, so what recovery
  finds once is remembered across restarts until a leader has given the data back.

The coordinator reads this through the replica's heartbeats: a replica with damage leaves the
ISR and is not eligible to lead until repaired (docs/architecture.md, "Storage faults").
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

import msgspec

from storage.checkpoint import RECOVERY_POINT_NAME
from storage.config import LogConfig
from storage.fs import FileSystem
from storage.log import PartitionLog
from storage.segment import parse_segment_file_name

META_NAME = "replica.meta"
HEALTH_NAME = "replica.health"
_MAGIC = b"RMH1"
# What is read of each small file at most (a device or a sparse file in its place is refused, not
# read until memory runs out): a meta holds ids and a topic's config. A health file holds a range
# per refused batch at worst (a stale epoch checkpoint refuses every batch after its last entry,
# ~80 bytes each), so its bound is generous: past it the replica would refuse to start.
META_BYTES_MAX = 1024 * 1024
HEALTH_BYTES_MAX = 256 * 1024 * 1024
UNKNOWN_END = -1  # a damage range whose end is not known (a checkpoint or meta file went missing)


class ReplicaMeta(msgspec.Struct, kw_only=True):
    cluster_id: str
    topic: str
    topic_id: int
    partition: int
    node: int
    replicas: list[int] = []
    config: dict = {}
    created_ms: int = 0


class Damage(msgspec.Struct, array_like=True, frozen=True):
    """Offsets `first_offset..last_offset` (inclusive; UNKNOWN_END: to wherever the log once ended)."""

    first_offset: int
    last_offset: int
    reason: str


class ReplicaHealth(msgspec.Struct, kw_only=True):
    damage: list[Damage] = []
    new_directory: bool = False

    @property
    def healthy(self) -> bool:
        return not self.damage and not self.new_directory

    def describe(self) -> str:
        if self.healthy:
            return "ok"
        parts = []
        if self.new_directory:
            parts.append("new directory (holds none of the partition's past)")
        for damage in self.damage[:3]:
            end = "?" if damage.last_offset == UNKNOWN_END else str(damage.last_offset)
            parts.append(f"offsets {damage.first_offset}..{end}: {damage.reason}")
        if len(self.damage) > 3:
            parts.append(f"and {len(self.damage) - 3} more ranges")
        return "; ".join(parts)


class MetaMismatch(RuntimeError):
    """The directory belongs to another cluster, topic incarnation, partition or node."""


class ReplicaFileUnusable(MetaMismatch):
    """A file of the directory cannot be opened or read (a directory in its place, no permission,
    an I/O error). Like a mismatch, it means: refuse to serve or change the directory, rather
    than guess what the file held."""


_meta_decoder = msgspec.msgpack.Decoder(ReplicaMeta)
_health_decoder = msgspec.msgpack.Decoder(ReplicaHealth)


def _seal(payload: bytes) -> bytes:
    return _MAGIC + zlib.crc32(payload).to_bytes(4, "little") + payload


def _unseal(data: bytes) -> bytes | None:
    if len(data) < 8 or data[:4] != _MAGIC or int.from_bytes(data[4:8], "little") != zlib.crc32(data[8:]):
        return None
    return data[8:]


def read_meta(fs: FileSystem, directory: str) -> ReplicaMeta | None:
    """The directory's meta; None when there is none. A damaged meta raises MetaMismatch: it is
    not safe to guess whose directory this is."""
    path = f"{directory}/{META_NAME}"
    if not fs.exists(path):
        return None
    try:
        raw = fs.read_file(path, META_BYTES_MAX)
    except OSError as error:
        raise ReplicaFileUnusable(f"{path} cannot be read ({error.strerror or error}); refusing to guess whose "
                                  "directory this is") from None
    payload = _unseal(raw)
    if payload is None:
        raise MetaMismatch(f"{path} is damaged (bad magic or CRC); refusing to guess whose directory this is")
    try:
        return _meta_decoder.decode(payload)
    except Exception as error:  # noqa: BLE001 - anything undecodable is damage
        raise MetaMismatch(f"{path} does not decode ({error})") from None


def write_meta(fs: FileSystem, directory: str, meta: ReplicaMeta) -> None:
    fs.write_file_atomic(f"{directory}/{META_NAME}", _seal(msgspec.msgpack.encode(meta)))


def check_meta(found: ReplicaMeta, expected: ReplicaMeta, directory: str) -> None:
    for field in ("cluster_id", "topic", "topic_id", "partition", "node"):
        if getattr(found, field) != getattr(expected, field):
            raise MetaMismatch(f"{directory} belongs to {field} {getattr(found, field)!r}, not "
                               f"{getattr(expected, field)!r}; refusing to serve or change it")


def owner_key(meta: ReplicaMeta) -> bytes:
    """What the directory's checkpoint is bound to: the fields `check_meta` compares."""
    return msgspec.msgpack.encode([meta.cluster_id, meta.topic, meta.topic_id, meta.partition, meta.node])


def read_health(fs: FileSystem, directory: str) -> ReplicaHealth:
    """The recorded damage; a damaged health file is itself damage of unknown extent."""
    path = f"{directory}/{HEALTH_NAME}"
    if not fs.exists(path):
        return ReplicaHealth()
    payload = _unseal(fs.read_file(path, HEALTH_BYTES_MAX))  # OSError: refused by `open_replica_directory`
    health = None
    if payload is not None:
        try:
            health = _health_decoder.decode(payload)
        except Exception:  # noqa: BLE001
            health = None
    if health is None:
        return ReplicaHealth(damage=[Damage(0, UNKNOWN_END, f"{HEALTH_NAME} is damaged")])
    return health


def write_health(fs: FileSystem, directory: str, health: ReplicaHealth) -> None:
    fs.write_file_atomic(f"{directory}/{HEALTH_NAME}", _seal(msgspec.msgpack.encode(health)))


class HealthFile:
    """The replica's `replica.health`, as an injected storage object: the actor reads `current`
    and calls `replace` when damage is found or repaired (one atomic rewrite each time)."""

    def __init__(self, fs: FileSystem, directory: str, current: ReplicaHealth) -> None:
        self._fs = fs
        self._directory = directory
        self.current = current

    def replace(self, health: ReplicaHealth) -> None:
        if health == self.current:
            return
        write_health(self._fs, self._directory, health)
        self.current = health


class OpenedReplica(NamedTuple):
    log: PartitionLog
    health: HealthFile
    findings: list[str]  # what this open found, as sentences (for the replica's first trace)


def open_replica_directory(fs: FileSystem, directory: str, expected: ReplicaMeta, config: LogConfig,
                           now_ms: int) -> OpenedReplica:
    """Open a replica directory: check whose it is, recover its log, and work out what it has
    lost since it was last healthy (added to the damage it already knew of). A file that cannot
    be opened or read at all raises `ReplicaFileUnusable` naming it.

    - no meta and no data: a new directory (`new_directory`);
    - no meta but data: the meta went missing, so nothing in the directory can be trusted to be
      complete (damage of unknown extent);
    - meta but no recovery-point checkpoint, or one whose slots both fail their checks (zeroed,
      cut, garbage): recovery could not tell flushed from unflushed bytes and may have cut flushed
      data (damage of unknown extent);
    - meta but no health file: what it recorded (damage, or a new directory) is lost (damage of
      unknown extent);
    - ranges recovery refused or found missing below the recovery point: damage with their offsets.
    """
    try:
        return _open(fs, directory, expected, config, now_ms)
    except OSError as error:
        raise ReplicaFileUnusable(f"{error.filename or directory} cannot be used ({error.strerror or error}); "
                                  "refusing to open the replica directory") from None


def _open(fs: FileSystem, directory: str, expected: ReplicaMeta, config: LogConfig, now_ms: int) -> OpenedReplica:
    fs.make_directory(directory)
    meta = read_meta(fs, directory)
    if meta is not None:
        check_meta(meta, expected, directory)
    names = fs.list_directory(directory)
    had_segments = any(parse_segment_file_name(name) is not None for name in names)
    had_checkpoint = RECOVERY_POINT_NAME in names
    had_health = HEALTH_NAME in names
    health = read_health(fs, directory)
    log = PartitionLog.open(directory, config, fs=fs, now_ms=now_ms, owner=owner_key(expected))
    findings: list[str] = []
    damage = list(health.damage)
    new_directory = health.new_directory
    if meta is None and not had_segments and not had_checkpoint:
        new_directory = True
        findings.append("new directory")
    elif meta is None:
        damage.append(Damage(log.log_start_offset, UNKNOWN_END, f"{META_NAME} was missing"))
    elif not had_checkpoint:
        damage.append(Damage(log.log_start_offset, UNKNOWN_END, "the recovery-point checkpoint was missing"))
    elif not log.checkpoint_found:  # there, but neither slot reads: as good as missing
        damage.append(Damage(log.log_start_offset, UNKNOWN_END, "the recovery-point checkpoint was unreadable"))
    if meta is not None and not had_health:
        # Every open that finishes leaves a health file (a new directory's says so), so a meta
        # without one lost what it recorded: damage not yet repaired, or that it was new.
        damage.append(Damage(log.log_start_offset, UNKNOWN_END, f"{HEALTH_NAME} was missing"))
    for first, last in log.recovery.corrupt_ranges:
        reason = "flushed but missing" if first >= log.log_end_offset else "refused as corrupt"
        damage.append(Damage(first, last, reason))
    damage = _merge(damage)
    findings += [f"offsets {d.first_offset}..{'?' if d.last_offset == UNKNOWN_END else d.last_offset}: {d.reason}"
                 for d in damage if d not in health.damage]
    file = HealthFile(fs, directory, health)
    file.replace(ReplicaHealth(damage=damage, new_directory=new_directory))
    if meta is None:  # after the health file: a crash between the two leaves a meta-less directory
        write_meta(fs, directory, expected)
    return OpenedReplica(log, file, findings)


def _merge(damage: list[Damage]) -> list[Damage]:
    """Distinct ranges in offset order (the same range found twice is one)."""
    seen: dict[tuple[int, int], Damage] = {}
    for item in damage:
        seen.setdefault((item.first_offset, item.last_offset), item)
    return [seen[key] for key in sorted(seen)]
