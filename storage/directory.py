"""Who owns a directory, and which cluster it belongs to.

Two rules for everything railmq keeps on disk (DESIGN.md, "Trust boundaries"):

- **One owner.** A data directory, a replica directory, a coordinator directory belongs to one
  process at a time. `DirectoryLock` takes an exclusive `flock` on `<directory>/.lock` and writes
  the holder's pid into it; a second `railmq up` on the same data directory, or a second process
  of the same replica, fails at once with `DirectoryInUse` naming that pid. The kernel drops the
  lock when the holder dies (even by SIGKILL), so a crash never leaves a stale lock behind.
- **One cluster.** The first start of a cluster writes `<data dir>/cluster.meta` (its id) and
  `<data dir>/cluster.secret` (32 random bytes, mode 0600: the key of transport/auth.py). Later
  starts read them; every replica directory records the cluster id too (storage/replica_meta.py),
  so a directory of another cluster is refused instead of being served or deleted.
"""

from __future__ import annotations

import errno
import fcntl
import hmac
import json
import os
import stat
import time
import uuid

LOCK_NAME = ".lock"
CLUSTER_META_NAME = "cluster.meta"
CLUSTER_SECRET_NAME = "cluster.secret"
SECRET_BYTES = 32
# What railmq writes is ~70 bytes of meta and 32 of secret; a file far larger is not one of them,
# and is never read whole (a device, /dev/zero, would be read until memory ran out).
META_BYTES_MAX = 64 * 1024
SECRET_BYTES_MAX = 1024


class DirectoryInUse(RuntimeError):
    """Another live process holds the directory's lock."""

    def __init__(self, directory: str, holder_pid: int | None) -> None:
        holder = f"process {holder_pid}" if holder_pid else "another process"
        super().__init__(f"{directory} is in use by {holder} (it holds {LOCK_NAME}); stop it first, "
                         "or use another directory")
        self.directory = directory
        self.holder_pid = holder_pid


class ClusterMismatch(RuntimeError):
    """A directory belongs to a different cluster than the one opening it."""


class SecretExposed(ClusterMismatch):
    """A cluster secret that users other than its owner may read or write."""


class DirectoryLock:
    """An exclusive flock on `<directory>/.lock`, held until `release` or process exit."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> "DirectoryLock":
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a pipe or device: its pid could not be written
            os.close(fd)
            raise OSError(errno.EINVAL, "the directory's lock is not a regular file", self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = _read_pid(fd)
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DirectoryInUse(self.directory, holder) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def lock_holder(directory: str) -> int | None:
    """The pid written in a directory's lock file, if any (the lock itself is not tested)."""
    try:
        # O_NONBLOCK: a pipe in its place must not hold the open until some process writes to it.
        with open(os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC),
                  "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            text = handle.read(32).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class ClusterIdentity:
    """A cluster's id and secret, as kept in its data directory."""

    def __init__(self, cluster_id: str, secret: bytes, created_ms: int, created_now: bool) -> None:
        self.cluster_id = cluster_id
        self.secret = secret
        self.created_ms = created_ms
        self.created_now = created_now

    @classmethod
    def load_or_create(cls, data_dir: str, cluster_id: str | None = None) -> "ClusterIdentity":
        """Read the data directory's identity, or create it when the directory holds no cluster.
        A given `cluster_id` must match the stored one (`ClusterMismatch` otherwise)."""
        meta_path = os.path.join(data_dir, CLUSTER_META_NAME)
        secret_path = os.path.join(data_dir, CLUSTER_SECRET_NAME)
        if os.path.exists(meta_path):
            stored = _read_meta(meta_path)
            if cluster_id is not None and cluster_id != stored["cluster_id"]:
                raise ClusterMismatch(f"{data_dir} holds cluster {stored['cluster_id']!r}, not {cluster_id!r}")
            secret = _read_secret(secret_path)
            _check_private(secret_path)
            return cls(stored["cluster_id"], secret, stored.get("created_ms", 0), False)
        if _holds_cluster_data(data_dir):
            raise ClusterMismatch(
                f"{data_dir} holds cluster data (node or coordinator directories) but no {CLUSTER_META_NAME}; "
                "refusing to start a new cluster over it. Restore the file, or move the data away")
        os.makedirs(data_dir, exist_ok=True)
        identity = cls(cluster_id or uuid.uuid4().hex[:12], os.urandom(SECRET_BYTES), time.time_ns() // 1_000_000, True)
        _write_atomic(secret_path, identity.secret, mode=0o600)
        _write_atomic(meta_path, json.dumps({"cluster_id": identity.cluster_id, "created_ms": identity.created_ms,
                                             "format": 1}).encode() + b"\n", mode=0o644)
        return identity


def _holds_cluster_data(data_dir: str) -> bool:
    try:
        names = os.listdir(data_dir)
    except FileNotFoundError:
        return False
    return any(name.startswith("node-") or name in ("coordinator", "group-coordinator") for name in names)


def adopt_identity(source: str, data_dir: str) -> None:
    """Copy a cluster's identity from `source` (a directory holding its `cluster.meta` and
    `cluster.secret`) into `data_dir`, which has none. Both are read and checked first, within
    their bounds (`ClusterMismatch` naming the file: nothing is written); then the secret and
    last the meta are each written whole (temporary file, fsync, rename), so a crash between them
    leaves no meta, and the next start copies both again instead of refusing for want of a secret."""
    meta_path = os.path.join(source, CLUSTER_META_NAME)
    try:
        meta = _read_meta_bytes(meta_path)
        _check_meta(meta_path, meta)
        secret = _read_secret(os.path.join(source, CLUSTER_SECRET_NAME))
    except ClusterMismatch as error:
        raise ClusterMismatch(f"the identity to copy is not one: {error}") from None
    os.makedirs(data_dir, exist_ok=True)
    _write_atomic(os.path.join(data_dir, CLUSTER_SECRET_NAME), secret, mode=0o600)
    _write_atomic(os.path.join(data_dir, CLUSTER_META_NAME), meta, mode=0o644)


def check_identity(source: str, data_dir: str) -> None:
    """`ClusterMismatch` unless `data_dir`, which has an identity, has the one in `source`: a data
    directory another cluster left, started with `source` named as the identity to use, ran under
    the other cluster's id and secret, and no other voter could hear it."""
    meta_path = os.path.join(source, CLUSTER_META_NAME)
    try:
        wanted = _read_meta(meta_path)["cluster_id"]
        secret = _read_secret(os.path.join(source, CLUSTER_SECRET_NAME))
    except ClusterMismatch as error:
        raise ClusterMismatch(f"the identity to use is not one: {error}") from None
    held = ClusterIdentity.load_or_create(data_dir)
    if held.cluster_id != wanted or not hmac.compare_digest(held.secret, secret):
        what = "another secret" if held.cluster_id == wanted else f"cluster {held.cluster_id!r}"
        raise ClusterMismatch(f"{data_dir} holds {what}, not cluster {wanted!r} of {source}: it is another "
                              "cluster's; move it away to start this node empty, or name its own identity")


def _bounded_read(path: str, limit: int) -> bytes:
    """The whole of a regular file of at most `limit` bytes; ValueError for a larger one or for
    anything else in its place (a device, a pipe); OSError as reading raises it."""
    # O_NONBLOCK: a pipe in its place must not hold the open until some process writes to it.
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ValueError("not a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes: not a file railmq wrote")
    return data


def _read_meta(path: str) -> dict:
    return _check_meta(path, _read_meta_bytes(path))


def _read_meta_bytes(path: str) -> bytes:
    try:
        return _bounded_read(path, META_BYTES_MAX)
    except (OSError, ValueError) as error:
        raise ClusterMismatch(f"{path} is unreadable ({str(error)[:120]}); refusing to guess which cluster "
                              "this is") from None


def _check_meta(path: str, data: bytes) -> dict:
    try:
        meta = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise ClusterMismatch(f"{path} is unreadable ({str(error)[:120]}); refusing to guess which cluster "
                              "this is") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("cluster_id"), str) or not meta["cluster_id"]:
        raise ClusterMismatch(f"{path} names no cluster id; refusing to guess which cluster this is")
    created_ms = meta.get("created_ms", 0)
    if type(created_ms) is not int:  # json gives floats, strings, NaN as they were written
        raise ClusterMismatch(f"{path}: created_ms is {created_ms!r:.40}, not an integer; the file is damaged")
    return meta


def _read_secret(path: str) -> bytes:
    try:
        secret = _bounded_read(path, SECRET_BYTES_MAX)
    except (OSError, ValueError) as error:
        raise ClusterMismatch(f"the cluster secret {path} is unreadable ({error})") from None
    if len(secret) < 16:
        raise ClusterMismatch(f"the cluster secret {path} is shorter than 16 bytes")
    return secret


def _check_private(path: str) -> None:
    """Whoever can read the secret is a member of the cluster (docs/security.md): one that other
    users may read or write (a restore from a backup, a copy by hand) is refused, as ssh refuses
    such a key and PostgreSQL such a data directory, rather than used."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        raise SecretExposed(f"the cluster secret {path} has mode {mode:04o}: users other than its owner "
                              f"may read or write it; `chmod 600 {path}` (and regard it as known to them)")


def _write_atomic(path: str, data: bytes, *, mode: int) -> None:
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
