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

import pytest

from actors.messages import FetchRequest, FetchResponse
from transport.ring import RingReader
from transport.ring_link import RingLinks
from transport.shm import SHM_DIRECTORY, SegmentNotOwned, attach_segment

OTHER_USER = 65534  # nobody
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

