"""Another local user against railmq's shared memory (transport/shm.py, transport/ring_link.py).

/dev/shm is writable by every user (mode 1777): anyone may make a file there under any free name,
with any contents and mode, and truncate it whenever they like. The boundary railmq keeps is the
Unix user (docs/security.md): a segment it maps, or removes, must be a regular file of its own
user that no other user may open. These tests play the other user as uid 65534 (nobody): a file
made by this (root) process and given to nobody is, to the kernel, nobody's file. Where the
attack needs railmq itself to run unprivileged, a forked child drops to another uid.
"""

from __future__ import annotations

import os
import pickle
from typing import Callable

import pytest

from actors.messages import FetchRequest, FetchResponse
from transport.ring import RingReader, unlink_orphaned_rings
from transport.ring_link import RingLinks
from transport.shm import SHM_DIRECTORY, SegmentNotOwned, attach_segment, list_segments, unlink_segments

OTHER_USER = 65534  # nobody
CLUSTER_USER = 65533  # an unprivileged user running the cluster, in the tests that need one
RING_BYTES = 64 * 1024
CHILD_TIMEOUT_S = 20

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays another user: needs root to chown, setuid")


@pytest.fixture
def foreign(segments):
    """Paths of files given to another user; removed directly (railmq no longer removes them)."""
    paths: list[str] = []
    try:
        yield paths
    finally:
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def give_to_other_user(path: str, foreign: list[str], mode: int = 0o666) -> None:
    foreign.append(path)
    os.chown(path, OTHER_USER, OTHER_USER)
    os.chmod(path, mode)


def foreign_ring(segments, foreign: list[str], purpose: str = "offered") -> tuple[str, int]:
    """A well-formed ring that belongs to the other user, mode 0666; (its name, its key)."""
    reader = RingReader.create(segments.name(purpose), RING_BYTES, payload_crc=False)
    name, key = reader.name, reader.key
    give_to_other_user(str(SHM_DIRECTORY / name), foreign)
    reader.close()  # its reader end is free: the attacker could hold it from its own process
    return name, key


def test_a_leader_does_not_write_into_a_ring_another_user_made(segments, foreign):
    # Before: the leader attached as the writer of nobody's 0666 ring (the key is the attacker's
    # own) and wrote answers into it; nobody then truncated the file and the leader's next
    # write died of SIGBUS (exit 135), a crash the attacker could repeat at every restart.
    name, key = foreign_ring(segments, foreign)
    leader = RingLinks(actor_id="leader", cluster_id=segments.cluster_id, zero_copy=False, counters={})
    try:
        request = FetchRequest(correlation_id=7, topic="t", partition=0, offset=0, ring=name, ring_key=key,
                               host=leader.host)
        leader.incoming(b"attacker", request)
        sent = leader.divert(b"attacker", FetchResponse(correlation_id=7, records=b"r" * 100))

        assert name not in leader.writers
        assert leader.counters.get("ring_offers_refused") == 1
        assert bytes(sent.records) == b"r" * 100 and sent.ring_bytes == -1  # the answer went over ZeroMQ
    finally:
        leader.close()


@pytest.mark.parametrize("mode", [0o600, 0o666])
def test_a_segment_of_another_user_is_never_mapped(segments, foreign, mode):
    name, _ = foreign_ring(segments, foreign, purpose=f"mapped-{mode:o}")
    os.chmod(SHM_DIRECTORY / name, mode)

    with pytest.raises(SegmentNotOwned):
        attach_segment(name)


def test_a_segment_others_may_open_or_a_link_in_its_place_is_never_mapped(segments, foreign):
    own = RingReader.create(segments.name("own"), RING_BYTES)
    try:
        os.chmod(SHM_DIRECTORY / own.name, 0o666)  # ours, but open to every user: not ours alone
        with pytest.raises(SegmentNotOwned):
            attach_segment(own.name)
        link = SHM_DIRECTORY / segments.name("link")
        foreign.append(str(link))
        os.symlink(SHM_DIRECTORY / own.name, link)
        with pytest.raises(OSError):  # shm_open does not follow links; neither does the check
            attach_segment(link.name)
    finally:
        own.close()
        own.unlink()



def run_as(uid: int, work: Callable[[], object]) -> object:
    """Run `work` in a forked child under `uid`; its result, or the exception it raised."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                outcome: object = work()
            except Exception as error:  # noqa: BLE001 - handed to the parent to look at
                outcome = error
            os.write(write_end, pickle.dumps(outcome))
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
    finally:
        os.waitpid(pid, 0)
    return pickle.loads(data)


def test_a_start_is_not_stopped_by_files_under_the_cluster_prefix_it_cannot_use(segments, foreign):
    # Before: `railmq up` sweeps rings a killed run left (unlink_orphaned_rings over the cluster
    # prefix, which any client learns from metadata). An empty file of another user under it
    # failed the start (ValueError: "cannot mmap an empty file"; SegmentNotOwned once segments
    # were checked), and so did an empty file of our own, which a kill between shm_open and
    # ftruncate leaves: every start failed until someone removed the file by hand.
    empty_foreign = SHM_DIRECTORY / segments.name("empty-foreign")
    empty_foreign.touch()
    give_to_other_user(str(empty_foreign), foreign)
    empty_own = SHM_DIRECTORY / segments.name("empty-own")
    empty_own.touch(mode=0o600)
    foreign.append(str(empty_own))
    dead, _ = foreign_ring(segments, foreign, purpose="dead-holders")  # a ring of the other user

    assert unlink_orphaned_rings(segments.prefix) == []
    assert sorted([empty_foreign.name, empty_own.name, dead]) == segments.existing()


def test_cleanup_run_by_an_unprivileged_cluster_removes_its_own_rings_and_leaves_other_users_files(segments,
                                                                                                  foreign):
    # Before: a cluster running as an ordinary user could not unlink another user's file in
    # /dev/shm (sticky bit), and the PermissionError escaped unlink_segments: the supervisor
    # calls it for every actor that exits (Supervisor._reap, from poll), so the node agent's
    # loop died there and nothing on the node was restarted again. The name to use is the dead
    # actor's prefix, which anyone who knows the cluster id and a topic name computes.
    planted = SHM_DIRECTORY / segments.name("planted")
    planted.touch()
    give_to_other_user(str(planted), foreign)
    own_name = segments.name("own")
    foreign.append(str(SHM_DIRECTORY / own_name))

    def cluster_cleans_up() -> tuple[list[str], list[str]]:
        RingReader.create(own_name, RING_BYTES).close()  # the cluster user's own ring
        return unlink_segments(segments.prefix), list_segments(segments.prefix)

    outcome = run_as(CLUSTER_USER, cluster_cleans_up)

    assert outcome == ([own_name], [planted.name])
