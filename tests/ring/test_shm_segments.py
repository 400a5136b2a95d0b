"""Segment names, explicit lifetime and process liveness (transport/shm.py)."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from tests.ring import ring_children
from transport.shm import (
    SEGMENT_NAME_CHARS_MAX,
    SEGMENT_PREFIX,
    ProcessIdentity,
    actor_prefix,
    attach_segment,
    cluster_prefix,
    create_segment,
    current_process_identity,
    list_segments,
    process_alive,
    segment_name,
    unlink_segment,
    unlink_segments,
)

CHILD_TIMEOUT_S = 20


def test_names_are_short_recognizable_and_derived_from_the_ids():
    name = segment_name("cluster-a", "partition-orders-3-replica-1", "replication")

    assert name == segment_name("cluster-a", "partition-orders-3-replica-1", "replication")
    assert name.startswith(actor_prefix("cluster-a", "partition-orders-3-replica-1"))
    assert actor_prefix("cluster-a", "x").startswith(cluster_prefix("cluster-a"))
    assert cluster_prefix("cluster-a").startswith(SEGMENT_PREFIX)
    assert len(name) <= SEGMENT_NAME_CHARS_MAX
    assert "/" not in name


def test_every_id_changes_the_name():
    variants = [("c", "a", "p"), ("c2", "a", "p"), ("c", "a2", "p"), ("c", "a", "p2")]
    names = {segment_name(*ids) for ids in variants}
    assert len(names) == 4
    assert not segment_name("c", "a2", "p").startswith(actor_prefix("c", "a"))


def test_segments_are_listed_and_unlinked_by_prefix(segments):
    first, second = segments.name("first"), segments.name("second")
    for name in (first, second):
        create_segment(name, 4096).close()

    assert segments.existing() == sorted([first, second])
    assert unlink_segments(segments.prefix) == sorted([first, second])
    assert segments.existing() == []
    assert unlink_segment(first) is False


def test_list_refuses_prefixes_outside_the_project():
    with pytest.raises(ValueError):
        list_segments("psm_")


def test_a_name_cannot_be_created_twice(ring_name):
    create_segment(ring_name, 4096).close()
    with pytest.raises(FileExistsError):
        create_segment(ring_name, 4096)


def test_an_attaching_process_that_exits_leaves_the_segment_alone(ring_name, processes):
    segment = create_segment(ring_name, 4096)
    try:
        segment.buf[:4] = b"data"
        ours, theirs = processes.pipe()
        child = processes.start(ring_children.attach_then_exit, ring_name, theirs)
        assert ours.poll(CHILD_TIMEOUT_S) and ours.recv() == b"data"
        child.join(CHILD_TIMEOUT_S)
        assert child.exitcode == 0

        again = attach_segment(ring_name)  # the resource tracker did not unlink it
        assert bytes(again.buf[:4]) == b"data"
        again.close()
    finally:
        segment.close()


def test_a_creator_that_exits_without_unlinking_leaves_the_segment_for_the_supervisor(segments, processes):
    name = segments.name()
    ours, theirs = processes.pipe()
    child = processes.start(ring_children.create_then_exit, name, 4096, theirs)
    assert ours.poll(CHILD_TIMEOUT_S) and ours.recv() == "created"
    child.join(CHILD_TIMEOUT_S)

    assert segments.existing() == [name]
    assert unlink_segments(segments.prefix) == [name]
    assert segments.existing() == []


def test_this_process_is_alive():
    assert process_alive(current_process_identity())


def test_a_recycled_pid_is_not_mistaken_for_the_old_process():
    me = current_process_identity()
    assert not process_alive(ProcessIdentity(me.pid, me.start_time_ms - 3_600_000))
    assert not process_alive(ProcessIdentity(0, 0))


def test_a_killed_child_is_dead_even_before_it_is_reaped(processes):
    ours, theirs = processes.pipe()
    child = processes.start(ring_children.sleep_forever, theirs)
    assert ours.poll(CHILD_TIMEOUT_S) and ours.recv() == "started"
    identity = _identity_of_child(child.pid)
    assert process_alive(identity)

    os.kill(child.pid, 9)
    _wait_for_zombie(child.pid)

    assert not process_alive(identity)  # a zombie: killed but not yet reaped by its parent
    child.join(CHILD_TIMEOUT_S)
    assert not process_alive(identity)


def _identity_of_child(pid: int) -> ProcessIdentity:
    return ProcessIdentity(pid, int(round(psutil.Process(pid).create_time() * 1000)))


def _wait_for_zombie(pid: int) -> None:
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} did not die")


def test_a_new_segment_has_its_pages_reserved_up_front(ring_name):
    size_bytes = 4 * 1024 * 1024
    segment = create_segment(ring_name, size_bytes)
    try:
        assert os.stat(f"/dev/shm/{ring_name}").st_blocks * 512 >= size_bytes  # not a sparse file
    finally:
        segment.close()


def test_a_topic_named_to_collide_with_a_replicas_prefix_does_not_take_its_rings_away(monkeypatch):
    # A client knows the cluster id (metadata answers carry it) and chooses topic names, and a
    # replica's actor id follows from its topic's. With an unkeyed hash it could search for a
    # topic whose replica's prefix is a victim replica's (32 bits: minutes in C; 12 here) and
    # delete that topic: the supervisor then unlinked every segment under the prefix, the live
    # victim's ring too (before: the victim's ring was gone from /dev/shm, so a leader that
    # restarted could not attach it again, and another user could take the free name).
    from actors.messages import FetchRequest
    from transport.actor_spec import ActorSpec
    from transport.ring_link import RingLinks
    from transport.supervisor import ManagedActor, Supervisor

    monkeypatch.setattr("transport.shm.ACTOR_HASH_DIGITS", 3)
    cluster_id, secret = "collision-test-cluster", bytes(range(32))
    victim_id = "replica/orders/0/n2"
    public_prefix = actor_prefix(cluster_id, victim_id)  # all a client can compute: no secret
    topic = next(f"t{i}" for i in range(1_000_000)
                 if actor_prefix(cluster_id, f"replica/t{i}/0/n2") == public_prefix)
    victim = RingLinks(actor_id=victim_id, cluster_id=cluster_id, secret=secret, zero_copy=True, counters={})
    try:
        offered = victim.outgoing("tcp://127.0.0.1:1", FetchRequest(correlation_id=1, topic="orders",
                                                                    partition=0, offset=0))
        assert offered.ring in list_segments(cluster_prefix(cluster_id))
        attacker = ManagedActor(ActorSpec(kind="replica", name=f"replica/{topic}/0/n2", cluster_id=cluster_id,
                                          data_dir="/nonexistent", secret=secret))
        attacker.process = _ExitedProcess()

        Supervisor()._reap(attacker)  # its topic was deleted: the replica stopped  # noqa: SLF001

        assert offered.ring in list_segments(cluster_prefix(cluster_id))
    finally:
        victim.close()
        unlink_segments(cluster_prefix(cluster_id))


class _ExitedProcess:
    """What the supervisor reads of an actor process that has exited."""

    exitcode = 0

    def join(self, timeout: float | None = None) -> None:
        return None
