"""Shared-memory segments: their names, their explicit lifetime, and who is still alive to use them.

This module owns three things the ring and the supervisor both need:

- **Names.** `segment_name(cluster_id, actor_id, purpose)` derives a short POSIX name from the ids
  (`railmq-<cluster>-<actor>-<purpose>`, each part a hash prefix, 29 characters in all, inside
  the 31-character limit some systems impose). All names of one cluster share
  `cluster_prefix(cluster_id)` and all names of one actor share `actor_prefix(...)`, so the
  supervisor can remove everything a dead actor or a stopped cluster left behind by prefix.
  Cluster processes key the actor's hash with the cluster secret (see `actor_prefix`).
- **Lifetime.** Python 3.11's `SharedMemory` registers every segment it opens, even one it only
  attaches to, with the resource tracker, which later unlinks it behind the owners' backs and
  warns about "leaked" segments. `create_segment` and `attach_segment` unregister right after
  opening, so a segment lives exactly until someone calls `unlink_segment` (its creator, or the
  supervisor for a dead creator). Nothing here unlinks implicitly.
- **Ownership.** /dev/shm is writable by every user (mode 1777), so another user can make a
  file under any name railmq would use, with a ring header, mode 0666, and truncate it under a
  mapping (the next write is SIGBUS) or read what is written into it. A segment is made with
  O_CREAT|O_EXCL and mode 0600 (`SharedMemory`), and `attach_segment` maps only a regular file
  of this process's user that no other user may open (`SegmentNotOwned` otherwise).
- **Liveness.** A process is identified by its pid *and* its start time (`ProcessIdentity`), so
  a recycled pid or an unreaped zombie is never mistaken for a live peer.

Listing relies on Linux exposing POSIX shared memory as files in /dev/shm (POSIX itself has no
listing call); on other systems `list_segments` returns nothing.
"""

from __future__ import annotations

import hashlib
import os
import stat
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import NamedTuple

import psutil

SEGMENT_PREFIX = "railmq-"
SHM_DIRECTORY = Path("/dev/shm")

# Hex digits of each id's hash inside a name. Clusters on one host are few (24 bits is plenty);
# actors in a cluster may be hundreds, and a prefix collision would let the cleanup of one dead
# actor remove a live actor's segments, so actors get 32 bits; purposes are few per actor, and
# a collision there fails loudly at creation (the name already exists).
CLUSTER_HASH_DIGITS = 6
ACTOR_HASH_DIGITS = 8
PURPOSE_HASH_DIGITS = 6
SEGMENT_NAME_CHARS_MAX = 30

# Start times come from the kernel's boot time plus ticks; two processes can compute values that
# differ by a clock step between their reads of the boot time. One second of slack absorbs that;
# a pid recycled within one second of the original process starting is not a realistic case.
START_TIME_SLACK_MS = 1000


class ProcessIdentity(NamedTuple):
    """A process as the ring header records it: pid plus start time (ms since the epoch)."""

    pid: int
    start_time_ms: int


def _id_hash(text: str, digits: int, key: bytes = b"") -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=key).hexdigest()[:digits]


def cluster_prefix(cluster_id: str) -> str:
    """The prefix every segment of this cluster starts with."""
    return f"{SEGMENT_PREFIX}{_id_hash(cluster_id, CLUSTER_HASH_DIGITS)}-"


def actor_prefix(cluster_id: str, actor_id: str, key: bytes = b"") -> str:
    """The prefix every segment created for this actor starts with.

    `key` is the cluster secret, for the actors of a cluster (and the supervisor that cleans up
    after them). A client knows the cluster id (metadata answers carry it) and chooses topic
    names, which replicas' actor ids follow from: unkeyed, it could search for a topic whose
    replica's prefix is another replica's (32 bits: minutes in C) and delete that topic, and
    the cleanup after its replica would unlink the other's live rings. Clients hold no secret;
    their rings are named after a random actor id, and only the cluster's stop removes them.
    """
    return f"{cluster_prefix(cluster_id)}{_id_hash(actor_id, ACTOR_HASH_DIGITS, key)}-"


def segment_name(cluster_id: str, actor_id: str, purpose: str, key: bytes = b"") -> str:
    """The POSIX shared-memory name (without the leading slash) of one actor's segment."""
    name = f"{actor_prefix(cluster_id, actor_id, key)}{_id_hash(purpose, PURPOSE_HASH_DIGITS)}"
    assert len(name) <= SEGMENT_NAME_CHARS_MAX, name
    return name


def _untrack(segment: SharedMemory) -> SharedMemory:
    # SharedMemory keeps its name with a leading slash; that is the key the tracker knows.
    resource_tracker.unregister(segment._name, "shared_memory")  # noqa: SLF001 - see module docstring
    return segment


def create_segment(name: str, size_bytes: int) -> SharedMemory:
    """Create a new segment (FileExistsError if the name is taken) whose lifetime is explicit.

    The pages are reserved up front when the system allows it, so a full /dev/shm fails here
    with OSError instead of killing a process with SIGBUS on its first write into a hole.
    """
    segment = _untrack(SharedMemory(name=name, create=True, size=size_bytes))
    try:
        _reserve_pages(name, size_bytes)
    except BaseException:
        segment.close()
        unlink_segment(name)
        raise
    return segment


def _reserve_pages(name: str, size_bytes: int) -> None:
    path = SHM_DIRECTORY / name
    if not hasattr(os, "posix_fallocate") or not path.exists():
        return
    descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.posix_fallocate(descriptor, 0, size_bytes)
    finally:
        os.close(descriptor)


class SegmentNotOwned(PermissionError):
    """A segment that is not a regular file of this process's user, closed to every other user."""


# The permission bits a segment of ours may have: read and write for its owner, nothing for the
# group or others (what `SharedMemory` creates with). Any other bit lets another user in.
SEGMENT_MODE_BITS = 0o600


def _check_own(name: str, status: os.stat_result) -> None:
    """Refuse a segment another user made, could open, or put in place as a link or a device."""
    mode = stat.S_IMODE(status.st_mode)
    if stat.S_ISREG(status.st_mode) and status.st_uid == os.geteuid() and not mode & ~SEGMENT_MODE_BITS:
        return
    raise SegmentNotOwned(f"segment {name} is not ours alone (owner uid {status.st_uid}, "
                          f"mode {stat.filemode(status.st_mode)}); not mapping it")


def attach_segment(name: str) -> SharedMemory:
    """Map an existing segment of our own (FileNotFoundError if absent, SegmentNotOwned if it is
    not ours alone); detaching never unlinks it."""
    if SHM_DIRECTORY.is_dir():
        _check_own(name, os.lstat(SHM_DIRECTORY / name))  # before mapping: no link, no other owner
    segment = _untrack(SharedMemory(name=name, create=False))
    try:
        # The very file mapped, whatever the name holds by now.
        _check_own(name, os.fstat(segment._fd))  # noqa: SLF001 - SharedMemory keeps no public descriptor
    except BaseException:
        segment.close()
        raise
    return segment


def unlink_segment(name: str) -> bool:
    """Remove a segment's name if it is ours; True if it existed and was. Processes that mapped
    it keep their mapping. Another user's file under the name is left alone: names are derived
    from ids anyone may know, and a cluster running as an ordinary user could not remove it
    anyway (/dev/shm has the sticky bit), which must not stop its cleanup."""
    segment_path = SHM_DIRECTORY / name
    if SHM_DIRECTORY.is_dir():
        try:
            if os.lstat(segment_path).st_uid != os.geteuid():
                return False
            segment_path.unlink()
        except FileNotFoundError:
            return False
        return True
    try:  # no /dev/shm: reopen through the portable API, then unlink through it
        segment = attach_segment(name)
    except (FileNotFoundError, SegmentNotOwned):
        return False
    segment.close()
    resource_tracker.register(segment._name, "shared_memory")  # noqa: SLF001 - unlink() unregisters it
    segment.unlink()
    return True


def list_segments(prefix: str = SEGMENT_PREFIX) -> list[str]:
    """Names of the existing segments that start with `prefix`, sorted."""
    if not prefix.startswith(SEGMENT_PREFIX):
        raise ValueError(f"prefix {prefix!r} must start with {SEGMENT_PREFIX!r}")
    if not SHM_DIRECTORY.is_dir():
        return []
    return sorted(entry.name for entry in SHM_DIRECTORY.iterdir() if entry.name.startswith(prefix))


def unlink_segments(prefix: str) -> list[str]:
    """Unlink every segment of ours whose name starts with `prefix`; returns the names removed."""
    return [name for name in list_segments(prefix) if unlink_segment(name)]


def current_process_identity() -> ProcessIdentity:
    """This process's identity, as it will be recorded in a ring header."""
    return _identity_of(psutil.Process())


def _identity_of(process: psutil.Process) -> ProcessIdentity:
    return ProcessIdentity(process.pid, int(round(process.create_time() * 1000)))


def process_alive(identity: ProcessIdentity) -> bool:
    """True if the process that recorded `identity` still runs (not exited, not a zombie)."""
    if identity.pid <= 0:
        return False
    try:
        process = psutil.Process(identity.pid)
        if abs(_identity_of(process).start_time_ms - identity.start_time_ms) > START_TIME_SLACK_MS:
            return False  # the pid now belongs to another process
        return process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True  # it exists; we only may not look at it
