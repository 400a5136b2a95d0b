"""A group coordinator whose `groups.state` is gone (with `--controllers 0`, the only copy of every
group's committed offsets, generations and share-group state) while the cluster holds replica
data refuses to start rather than start empty: an empty state would send every consumer back to
its `auto_offset_reset` (re-reading everything, or with `latest` skipping what was not yet read)
and restart generations at 1. The same holds for the first group voter of a new quorum with no
single coordinator's file to start from. `--reset-group-state` (ActorSpec.reset_group_state)
accepts the loss, once, knowingly."""

from __future__ import annotations

import os

import pytest

from storage.state import DurableState
from transport.actor_main import ActorSpec, RefusedToStart, build_actor


def single(tmp_path, **options) -> ActorSpec:
    return ActorSpec(kind="group-coordinator", name="group-coordinator", cluster_id="c1",
                     data_dir=str(tmp_path), **options)


def voter(tmp_path, **options) -> ActorSpec:
    return ActorSpec(kind="group-coordinator", name="group-coordinator/1", cluster_id="c1", data_dir=str(tmp_path),
                     node=1, nodes=[1], voters={1: "tcp://127.0.0.1:1"}, **options)


def with_replica_data(tmp_path) -> None:
    (tmp_path / "node-1" / "orders-0-1a2b").mkdir(parents=True)


def stop_actors() -> None:
    """Give back the directory locks build_actor keeps, as a stopped process would."""
    from transport import actor_main

    while actor_main._LOCKS:
        actor_main._LOCKS.pop().release()


def groups_state(tmp_path) -> str:
    return str(tmp_path / "group-coordinator" / "groups.state")


def test_a_missing_group_state_beside_replica_data_refuses_to_start_and_says_what_to_do(tmp_path, actor_locks):
    with_replica_data(tmp_path)

    with pytest.raises(RefusedToStart, match="groups.state") as refused:
        build_actor(single(tmp_path), "tcp://127.0.0.1:1", incarnation=1)

    assert "--reset-group-state" in str(refused.value)
    assert not os.path.exists(groups_state(tmp_path)), "a refused start must not create the file it lacks"


def test_a_group_state_shorter_than_its_header_is_refused_like_a_missing_one(tmp_path, actor_locks):
    with_replica_data(tmp_path)
    os.makedirs(os.path.dirname(groups_state(tmp_path)))
    with open(groups_state(tmp_path), "wb") as handle:
        handle.write(b"RMQ")

    with pytest.raises(RefusedToStart, match="groups.state"):
        build_actor(single(tmp_path), "tcp://127.0.0.1:1", incarnation=1)


def test_the_reset_flag_starts_empty_on_purpose(tmp_path, actor_locks):
    with_replica_data(tmp_path)

    actor, _ = build_actor(single(tmp_path, reset_group_state=True), "tcp://127.0.0.1:1", incarnation=1)

    assert actor is not None
    assert os.path.getsize(groups_state(tmp_path)) > 0, "the new, empty state is written"


def test_a_first_start_and_an_intact_state_start_as_always(tmp_path, actor_locks):
    build_actor(single(tmp_path), "tcp://127.0.0.1:1", incarnation=1)  # no replica data yet: a new cluster
    stop_actors()
    with_replica_data(tmp_path)
    state = DurableState.open(groups_state(tmp_path))
    state.put("offset/payments/orders/0", [41, "", 0, -1])
    state.close()

    build_actor(single(tmp_path), "tcp://127.0.0.1:2", incarnation=2)


def test_an_empty_but_intact_group_state_is_not_a_loss(tmp_path, actor_locks):
    """A cluster whose groups never committed anything has a state of only its header."""
    DurableState.open(groups_state(tmp_path)).close()
    with_replica_data(tmp_path)

    build_actor(single(tmp_path), "tcp://127.0.0.1:1", incarnation=1)


def test_a_new_group_quorum_with_nothing_to_start_from_beside_replica_data_refuses(tmp_path, actor_locks):
    with_replica_data(tmp_path)

    with pytest.raises(RefusedToStart, match="--reset-group-state"):
        build_actor(voter(tmp_path), "tcp://127.0.0.1:1", incarnation=1)
    stop_actors()

    build_actor(voter(tmp_path, reset_group_state=True), "tcp://127.0.0.1:1", incarnation=2)


def test_a_new_group_quorum_starts_from_the_single_coordinators_state(tmp_path, actor_locks):
    with_replica_data(tmp_path)
    state = DurableState.open(groups_state(tmp_path))
    state.put("offset/payments/orders/0", [41, "", 0, -1])
    state.close()

    actor, _ = build_actor(voter(tmp_path), "tcp://127.0.0.1:1", incarnation=1)

    assert actor.bootstrap == [("offset/payments/orders/0", [41, "", 0, -1])]
