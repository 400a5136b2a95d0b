"""A data directory's identity and lock (storage/directory.py) against a damaged file or a second
owner: a damaged `cluster.meta` is a `ClusterMismatch` naming it (never a bare ValueError, a
RecursionError or a new cluster's id), and a second lock on a held directory is `DirectoryInUse`
naming the holder, while a released one can be taken again at once."""

from __future__ import annotations

import os
import stat

import pytest

from storage.directory import (
    CLUSTER_META_NAME, CLUSTER_SECRET_NAME, ClusterIdentity, ClusterMismatch, DirectoryInUse, DirectoryLock,
)


@pytest.fixture
def data_dir(tmp_path) -> str:
    directory = str(tmp_path / "cluster")
    ClusterIdentity.load_or_create(directory, "orders-cluster")
    return directory


@pytest.mark.parametrize("content", [
    b'{"cluster_id": "orders-cluster", "created_ms": "yesterday"}',
    b'{"cluster_id": "orders-cluster", "created_ms": [1]}',
    b'{"cluster_id": "orders-cluster", "created_ms": 1e400}',
    b'{"cluster_id": "orders-cluster", "created_ms": NaN}',
    b"[" * 100_000,  # nesting deeper than the decoder's recursion
    b"\xff\xfe\x00",
    b"",
    b'{"cluster_id": ""}',
    b'["orders-cluster"]',
], ids=["string-time", "list-time", "infinite-time", "nan-time", "deep", "not-utf8", "empty", "no-id", "a-list"])
def test_a_damaged_cluster_meta_is_a_cluster_mismatch_naming_it(data_dir, content):
    path = os.path.join(data_dir, CLUSTER_META_NAME)
    with open(path, "wb") as handle:
        handle.write(content)
    with pytest.raises(ClusterMismatch, match=CLUSTER_META_NAME):
        ClusterIdentity.load_or_create(data_dir)
    with open(path, "rb") as handle:
        assert handle.read() == content, "a refused identity is left as it was"


def test_an_intact_identity_reads_back_the_same_id_and_secret(data_dir):
    first = ClusterIdentity.load_or_create(data_dir)
    again = ClusterIdentity.load_or_create(data_dir, "orders-cluster")
    assert (again.cluster_id, again.secret, again.created_now) == ("orders-cluster", first.secret, False)
    assert type(again.created_ms) is int and again.created_ms > 0


@pytest.mark.parametrize("damage", ["missing", "short", "directory"])
def test_a_lost_or_damaged_secret_beside_a_meta_is_refused_not_regenerated(data_dir, damage):
    path = os.path.join(data_dir, CLUSTER_SECRET_NAME)
    os.remove(path)
    if damage == "short":
        with open(path, "wb") as handle:
            handle.write(b"short")
    elif damage == "directory":
        os.mkdir(path)
    with pytest.raises(ClusterMismatch, match=CLUSTER_SECRET_NAME):
        ClusterIdentity.load_or_create(data_dir)


def test_a_lost_meta_beside_node_directories_is_refused_not_a_new_cluster(data_dir):
    os.makedirs(os.path.join(data_dir, "node-1", "orders-0-abc"))
    os.remove(os.path.join(data_dir, CLUSTER_META_NAME))
    with pytest.raises(ClusterMismatch, match="refusing to start a new cluster"):
        ClusterIdentity.load_or_create(data_dir)


def test_a_second_owner_of_a_held_directory_is_refused_naming_the_holder(tmp_path):
    directory = str(tmp_path / "node-1" / "controller")
    first = DirectoryLock(directory).acquire()
    try:
        with pytest.raises(DirectoryInUse) as refused:
            DirectoryLock(directory).acquire()  # another open file description: flock says no
        assert refused.value.holder_pid == os.getpid() and str(os.getpid()) in str(refused.value)
    finally:
        first.release()
    second = DirectoryLock(directory).acquire()  # released: free at once, no stale lock
    assert second.held
    second.release()


# ---------------------------------------------------------------------------- what an actor does with it


def zero_file(path: str) -> None:
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.write(bytes(size))


def test_a_group_coordinator_whose_state_is_zeroed_refuses_to_start_naming_the_file(tmp_path, actor_locks):
    from storage.state import DurableState
    from transport.actor_main import ActorSpec, RefusedToStart, build_actor

    spec = ActorSpec(kind="group-coordinator", name="group-coordinator", cluster_id="c1", data_dir=str(tmp_path))
    path = str(tmp_path / "group-coordinator" / "groups.state")
    state = DurableState.open(path)
    state.put("offset/payments/orders/0", 41)
    state.close()
    zero_file(path)  # a block of zeros where the journal was: it must not come back as no offsets
    with pytest.raises(RefusedToStart, match="groups.state"):
        build_actor(spec, "tcp://127.0.0.1:1", incarnation=1)


def test_a_controller_whose_raft_log_is_damaged_refuses_to_start_naming_the_file(tmp_path, actor_locks):
    from storage.raft_log import RaftEntry, RaftLog
    from transport.actor_main import ActorSpec, RefusedToStart, build_actor, controller_directory

    spec = ActorSpec(kind="controller", name="controller/1", cluster_id="c1", data_dir=str(tmp_path), node=1,
                     nodes=[1], voters={1: "tcp://127.0.0.1:1"})
    raft = os.path.join(controller_directory(str(tmp_path), 1), "raft")
    log = RaftLog.open(raft)
    log.set_hard_state(3, 1)
    log.append([RaftEntry(index=1, term=3, data=b"topic")])
    log.flush()
    log.close()
    zero_file(os.path.join(raft, "raft.log"))
    with pytest.raises(RefusedToStart, match="raft.log"):
        build_actor(spec, "tcp://127.0.0.1:1", incarnation=1)


def test_a_controller_whose_snapshot_holds_no_map_refuses_to_start(tmp_path, actor_locks):
    from storage.raft_log import RaftEntry, RaftLog, SnapshotMeta
    from transport.actor_main import ActorSpec, RefusedToStart, build_actor, controller_directory

    spec = ActorSpec(kind="controller", name="controller/1", cluster_id="c1", data_dir=str(tmp_path), node=1,
                     nodes=[1], voters={1: "tcp://127.0.0.1:1"})
    log = RaftLog.open(os.path.join(controller_directory(str(tmp_path), 1), "raft"))
    log.append([RaftEntry(index=1, term=1)])
    log.set_commit(1)
    log.save_snapshot(SnapshotMeta(index=1, term=1, voters=[1]), b"\x93\x01\x02\x03", keep_from=2)  # a list
    log.close()
    with pytest.raises(RefusedToStart, match="snapshot is a map"):
        build_actor(spec, "tcp://127.0.0.1:1", incarnation=1)


def _wiped_voter_spec(tmp_path, *, quorum_formed: bool):
    from transport.actor_main import ActorSpec

    voters = {node: f"tcp://127.0.0.1:{node}" for node in (1, 2, 3)}
    return ActorSpec(kind="controller", name="controller/1", cluster_id="c1", data_dir=str(tmp_path), node=1,
                     nodes=[1, 2, 3], voters=voters, quorum_formed=quorum_formed)


@pytest.mark.parametrize("leftover", ["raft.log.tmp", "raft.snapshot.tmp", "notes.txt"])
def test_a_voter_whose_journal_is_lost_beside_a_leftover_file_still_waits_to_be_caught_up(
        tmp_path, actor_locks, leftover):
    from storage.raft_log import rejoining_on_disk
    from transport.actor_main import build_actor, controller_directory

    spec = _wiped_voter_spec(tmp_path, quorum_formed=True)
    directory = controller_directory(str(tmp_path), 1)
    os.makedirs(os.path.join(directory, "raft"))
    with open(os.path.join(directory, "raft", leftover), "wb") as handle:
        handle.write(b"half of a rewrite the crash interrupted")
    actor, _ = build_actor(spec, "tcp://127.0.0.1:1", incarnation=1)
    assert actor.raft.rejoining, "a voter that lost its vote must not vote until a leader caught it up"
    assert rejoining_on_disk(os.path.join(directory, "raft"))


# ---------------------------------------------------------------------------- what the group coordinator reads back


def group_coordinator_on(state):
    from actors.group_coordinator import GroupCoordinator

    return GroupCoordinator(state=state, coordinator="coordinator", endpoint="tcp://127.0.0.1:1", incarnation=1)


@pytest.mark.parametrize("key, value", [
    ("offset/payments/orders/0", 41),  # not [offset, metadata, timestamp]
    ("offset/payments/orders/0", [41, "meta"]),
    ("offset/payments/orders/0", ["41", "meta", 0]),
    ("offset/payments/orders/0", [-3, "meta", 0]),
    ("offset/payments/orders/0", [41, 7, 0]),
    ("offset/payments/orders/zero", [41, "meta", 0]),
    ("offset/payments-orders-0", [41, "meta", 0]),  # too few parts in the key
    ("group/payments", {"members": []}),  # no generation
    ("group/payments", [1, 2, 3]),
    ("group/payments", {"generation": 2, "leader": "m1", "protocol": "range", "members": [["m1", None]]}),
    ("share-group/payments", 5),
], ids=["number", "two-fields", "string-offset", "negative-offset", "number-metadata", "named-partition",
        "short-key", "no-generation", "a-list", "short-member", "share-group-number"])
def test_a_group_state_record_the_coordinator_cannot_have_written_refuses_naming_its_key(key, value):
    from storage.errors import CorruptState
    from storage.memory import MemoryFileSystem
    from storage.state import DurableState

    state = DurableState.open("/group-coordinator/groups.state", fs=MemoryFileSystem())
    state.put("offset/payments/orders/1", [7, "", 0])  # a good neighbour
    state.put(key, value)
    with pytest.raises(CorruptState, match=key.split("/")[0] + "/"):
        group_coordinator_on(state)


def test_well_formed_group_records_load_back(tmp_path):
    from storage.state import DurableState

    state = DurableState.open(str(tmp_path / "groups.state"))
    state.put("offset/payments/orders/1", [7, "checkpoint", 1_000])
    state.put("offset/payments/orders.v2/12", [0, "", 0])
    coordinator = group_coordinator_on(state)
    assert coordinator.offsets.get("payments")[("orders", 1)].offset == 7
    assert coordinator.offsets.get("payments")[("orders.v2", 12)].metadata == ""


def test_a_second_process_for_the_same_state_directory_refuses_to_start_naming_the_holder(tmp_path, actor_locks):
    from transport.actor_main import ActorSpec, RefusedToStart, build_actor

    spec = ActorSpec(kind="group-coordinator", name="group-coordinator", cluster_id="c1", data_dir=str(tmp_path))
    build_actor(spec, "tcp://127.0.0.1:1", incarnation=1)
    with pytest.raises(RefusedToStart, match=f"in use by process {os.getpid()}"):
        build_actor(spec, "tcp://127.0.0.1:2", incarnation=2)


def test_a_second_rebuild_of_the_coordinator_state_keeps_the_original_damaged_file(tmp_path):
    from storage.fs import OsFileSystem
    from transport.metadata_rebuild import rebuild_state

    path = tmp_path / "coordinator" / "metadata.state"
    path.parent.mkdir()
    path.write_bytes(b"the damaged original an operator may still want")
    rebuild_state(str(tmp_path), str(path), "c1", OsFileSystem())
    rebuild_state(str(tmp_path), str(path), "c1", OsFileSystem())  # run again (a start that failed later)
    kept = {file.name: file.read_bytes() for file in path.parent.iterdir() if ".lost" in file.name}
    assert b"the damaged original an operator may still want" in kept.values(), sorted(kept)
    assert len(kept) == 2


def test_a_new_quorum_reads_the_single_coordinators_state_without_writing_to_it(tmp_path, actor_locks):
    from storage.state import DurableState
    from transport.actor_main import ActorSpec, build_actor

    legacy = tmp_path / "coordinator" / "metadata.state"
    state = DurableState.open(str(legacy), confirm=True)
    state.put("topic/orders", {"partitions": 3})
    state.flush()
    state.close()
    content = legacy.read_bytes() + b"\x10\x00\x00\x00"  # a record the coordinator was writing, torn
    legacy.write_bytes(content)
    spec = ActorSpec(kind="controller", name="controller/1", cluster_id="c1", data_dir=str(tmp_path), node=1,
                     nodes=[1], voters={1: "tcp://127.0.0.1:1"})
    actor, _ = build_actor(spec, "tcp://127.0.0.1:1", incarnation=1)
    assert actor.bootstrap == [("topic/orders", {"partitions": 3})]
    assert legacy.read_bytes() == content, "the coordinator's file is read, never cut or rewritten"


def test_the_voters_of_a_new_quorum_rebuild_and_read_the_legacy_state_one_at_a_time(tmp_path, actor_locks,
                                                                                     monkeypatch):
    import fcntl

    from storage.state import DurableState
    from transport import metadata_rebuild
    from transport.actor_main import METADATA_BOOTSTRAP_LOCK, ActorSpec, build_actor

    def held_by_someone() -> bool:
        fd = os.open(str(tmp_path / METADATA_BOOTSTRAP_LOCK), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    seen: list[tuple[str, bool]] = []
    rebuild, read = metadata_rebuild.rebuild_state, DurableState.read
    monkeypatch.setattr(metadata_rebuild, "rebuild_state",
                        lambda *args: (seen.append(("rebuild", held_by_someone())), rebuild(*args))[1])
    monkeypatch.setattr(DurableState, "read", classmethod(
        lambda cls, *args, **options: (seen.append(("read", held_by_someone())), read(*args, **options))[1]))
    spec = ActorSpec(kind="controller", name="controller/1", cluster_id="c1", data_dir=str(tmp_path), node=1,
                     nodes=[1], voters={1: "tcp://127.0.0.1:1"}, rebuild_metadata=True)
    build_actor(spec, "tcp://127.0.0.1:1", incarnation=1)
    assert seen == [("rebuild", True), ("read", True)], "another voter could interleave with either"
    assert not held_by_someone(), "released once the voter has its starting point"


def test_a_lock_file_replaced_by_a_directory_refuses_the_start_naming_it(tmp_path, actor_locks):
    from storage.directory import LOCK_NAME
    from transport.actor_main import ActorSpec, RefusedToStart, build_actor

    (tmp_path / "group-coordinator" / LOCK_NAME).mkdir(parents=True)
    spec = ActorSpec(kind="group-coordinator", name="group-coordinator", cluster_id="c1", data_dir=str(tmp_path))
    with pytest.raises(RefusedToStart, match=LOCK_NAME):
        build_actor(spec, "tcp://127.0.0.1:1", incarnation=1)




def _stop_voter(actor) -> None:
    """What the process's exit does: the log closed, the directory lock given back."""
    from transport import actor_main

    actor.raft.log.close()
    actor_main._LOCKS.pop().release()


def test_a_rejoining_voter_stays_rejoining_whatever_is_lost_beside_its_journal(tmp_path, actor_locks):
    """The mark that keeps a wiped voter from voting lives in its journal's header: losing any
    other file of its directory (and restarting where nothing says the quorum had formed) must not
    turn it into a voter that trusts its empty vote."""
    from railmq.cli_health import quorum_facts
    from storage.directory import LOCK_NAME
    from storage.raft_records import LOG_NAME
    from transport.actor_main import build_actor, controller_directory

    actor, _ = build_actor(_wiped_voter_spec(tmp_path, quorum_formed=True), "tcp://127.0.0.1:1", incarnation=1)
    assert actor.raft.rejoining
    _stop_voter(actor)
    directory = controller_directory(str(tmp_path), 1)
    kept = {os.path.join(directory, "raft", LOG_NAME), os.path.join(directory, LOCK_NAME)}
    lost = [os.path.join(root, name) for root, _, files in os.walk(directory) for name in files]
    for path in set(lost) - kept:
        os.remove(path)

    rebuilt, _ = build_actor(_wiped_voter_spec(tmp_path, quorum_formed=False), "tcp://127.0.0.1:1", incarnation=2)
    assert rebuilt.raft.rejoining, "a voter still catching up forgot that it lost its vote"
    assert quorum_facts([rebuilt.status()])["voters"][0]["rejoining"], "operators cannot see it waiting"


def test_a_mark_kept_in_the_old_file_moves_into_the_journal(tmp_path, actor_locks):
    """A directory written before the header held the mark: the file `rejoining` beside `raft/`
    still keeps the voter from voting, and after the move only the journal holds it."""
    from storage.raft_log import rejoining_on_disk
    from transport.actor_main import build_actor, controller_directory
    from transport.actor_spec import LEGACY_REJOINING_MARK

    spec = _wiped_voter_spec(tmp_path, quorum_formed=False)
    first, _ = build_actor(spec, "tcp://127.0.0.1:1", incarnation=1)
    assert not first.raft.rejoining  # a new voter of a new cluster
    _stop_voter(first)
    directory = controller_directory(str(tmp_path), 1)
    with open(os.path.join(directory, LEGACY_REJOINING_MARK), "wb") as handle:
        handle.write(b"this voter lost its log: it votes again once a leader has caught it up\n")

    rebuilt, _ = build_actor(spec, "tcp://127.0.0.1:1", incarnation=2)
    assert rebuilt.raft.rejoining
    assert rejoining_on_disk(os.path.join(directory, "raft"))
    assert not os.path.exists(os.path.join(directory, LEGACY_REJOINING_MARK))


# ------------------------------------------------------------------------- identity files of any size


@pytest.mark.parametrize("name", [CLUSTER_META_NAME, CLUSTER_SECRET_NAME])
def test_an_identity_file_far_larger_than_railmq_writes_is_refused_without_reading_it_whole(data_dir, name):
    """`cluster.meta` and `cluster.secret` were read whole: a 2 MB secret was taken as the
    cluster's key (every message then failed its tag, with nothing said), and one that is a
    device (/dev/zero) was read until memory ran out."""
    path = os.path.join(data_dir, name)
    os.remove(path)
    with open(path, "wb") as handle:
        handle.write(b'{"cluster_id": "orders-cluster"}' + b" " * (2 << 20) if name == CLUSTER_META_NAME
                     else os.urandom(2 << 20))
    with pytest.raises(ClusterMismatch, match=f"{name}.*larger than"):
        ClusterIdentity.load_or_create(data_dir)


def test_an_identity_file_that_never_ends_is_refused(data_dir):
    os.remove(os.path.join(data_dir, CLUSTER_SECRET_NAME))
    os.symlink("/dev/zero", os.path.join(data_dir, CLUSTER_SECRET_NAME))
    with pytest.raises(ClusterMismatch, match=CLUSTER_SECRET_NAME):
        ClusterIdentity.load_or_create(data_dir)


@pytest.mark.parametrize("damage", ["large-secret", "secret-is-a-directory", "meta-names-no-cluster",
                                    "device"])
def test_an_identity_source_that_is_not_one_copies_nothing_and_a_good_one_is_adopted_after(
        data_dir, tmp_path, damage):
    """`railmq node --identity-from DIR` copied cluster.meta, then cluster.secret, with no check
    and no bound: a secret that is a device filled the data directory's disk (a 2 MiB tmpfs: 100%,
    `OS_ERROR: No space left on device`), a 2 MB secret was taken as the key, and a secret that
    could not be copied left cluster.meta alone, so every later start refused for want of a secret
    and never copied it again."""
    from storage.directory import adopt_identity

    source = tmp_path / "identity"
    source.mkdir()
    for name in (CLUSTER_META_NAME, CLUSTER_SECRET_NAME):
        with open(os.path.join(data_dir, name), "rb") as original:
            (source / name).write_bytes(original.read())
    secret = source / CLUSTER_SECRET_NAME
    if damage == "large-secret":
        secret.write_bytes(os.urandom(2 << 20))
    elif damage == "secret-is-a-directory":
        secret.unlink()
        secret.mkdir()
    elif damage == "meta-names-no-cluster":
        (source / CLUSTER_META_NAME).write_bytes(b"{}")
    else:
        secret.unlink()
        secret.symlink_to("/dev/zero")
    node_dir = tmp_path / "node-2-data"
    node_dir.mkdir()

    with pytest.raises(ClusterMismatch, match="identity"):
        adopt_identity(str(source), str(node_dir))
    assert sorted(os.listdir(node_dir)) == [], "a refused identity leaves nothing behind"

    secret.unlink() if not secret.is_dir() else secret.rmdir()
    for name in (CLUSTER_META_NAME, CLUSTER_SECRET_NAME):
        with open(os.path.join(data_dir, name), "rb") as original:
            (source / name).write_bytes(original.read())
    adopt_identity(str(source), str(node_dir))
    adopted = ClusterIdentity.load_or_create(str(node_dir))
    original = ClusterIdentity.load_or_create(data_dir)
    assert (adopted.cluster_id, adopted.secret) == ("orders-cluster", original.secret)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620], ids=oct)
def test_a_secret_other_users_can_read_or_write_is_refused_naming_the_file(data_dir, mode):
    """A `cluster.secret` of mode 0644 (a restore from a backup, a copy by hand) was used as it
    was: every local user who could read it was a member of the cluster (docs/security.md). As
    ssh refuses such a key and PostgreSQL such a data directory, it is refused, left as it was."""
    path = os.path.join(data_dir, CLUSTER_SECRET_NAME)
    os.chmod(path, mode)

    with pytest.raises(ClusterMismatch, match=f"{CLUSTER_SECRET_NAME}.*chmod 600"):
        ClusterIdentity.load_or_create(data_dir)

    assert stat.S_IMODE(os.stat(path).st_mode) == mode
    os.chmod(path, 0o400)  # the owner alone may read it: taken
    assert ClusterIdentity.load_or_create(data_dir).secret


@pytest.mark.parametrize("kind", ["controller", "group-coordinator"])
def test_a_voter_directory_of_another_cluster_is_refused_not_joined(tmp_path, kind):
    """`node-2/` of cluster E copied into cluster D's data directory (a restore from the wrong
    backup): both had created one topic, so E's entries had the indexes and terms D's leader
    expected, Raft's log matching took them, and voter 2's journal held E's topic `tE` beside
    D's `tD`, while `railmq up` and `cluster info` showed a healthy quorum."""
    from storage.fs import OsFileSystem
    from transport.actor_build import build_kind
    from transport.actor_spec import ActorSpec, RefusedToStart, actor_directory

    voters = {node: f"tcp://127.0.0.1:{20_000 + node}" for node in (1, 2, 3)}

    def start(cluster_id: str) -> None:
        spec = ActorSpec(kind=kind, name=f"{kind}/2", cluster_id=cluster_id, data_dir=str(tmp_path), node=2,
                         nodes=[1, 2, 3], voters=voters, quorum_formed=True, reset_group_state=True)
        build_kind(spec, OsFileSystem(), actor_directory(spec), voters[2], 1)

    start("cluster-d")
    start("cluster-d")  # its own directory again: taken
    with pytest.raises(RefusedToStart, match="cluster-e.*cluster-d|cluster-d.*cluster-e"):
        start("cluster-e")


@pytest.mark.timeout(30)
def test_a_lock_that_is_not_a_regular_file_is_refused_naming_it(tmp_path):
    """A FIFO as a data directory's `.lock` made `railmq up` end with `OS_ERROR: [Errno 22]
    Invalid argument`, naming no file (the pid is written over the lock, and a pipe cannot be
    truncated)."""
    os.mkfifo(tmp_path / ".lock")
    with pytest.raises(OSError) as refused:
        DirectoryLock(str(tmp_path)).acquire()
    assert str(tmp_path / ".lock") in str(refused.value) and "regular file" in str(refused.value)
