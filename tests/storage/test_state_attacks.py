"""An attacker's and a bad disk's view of the durable state that is not a segment log: the
coordinators' journal (storage/state.py), the controllers' raft log and snapshot
(storage/raft_log.py), a replica's recovery-point checkpoint, leader-epoch checkpoint, meta and
health files, and a data directory's lock and cluster identity (storage/directory.py).

One rule for each file: after any damage — cut at any byte, any byte flipped, zeroed, replaced
by garbage or by a directory, a write refused by a full disk, a crash at any sync — opening it
either gives back everything that was acknowledged, or refuses with a typed error naming the
file. It never starts empty or older in silence, and never raises a bare IndexError, TypeError,
struct.error or RecursionError.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tracemalloc
import zlib

import msgspec
import pytest

from storage.batch import encode_batch
from storage.checkpoint import RECOVERY_POINT_NAME, RecoveryPoint, RecoveryPointFile
from storage.config import LogConfig
from storage.epochs import EPOCH_CHECKPOINT_NAME, LeaderEpochCache
from storage.errors import CorruptState, FsyncFailed, LogClosed, StorageError, StorageFull
from storage.fs import OsFileSystem
from storage.journal_frames import RECORD
from storage.memory import MemoryFileSystem
from storage.raft_log import (
    HEADER_BYTES, LOG_NAME, SLOT_BYTES, SNAPSHOT_NAME, CorruptRaftLog, CorruptRaftSnapshot, RaftEntry, RaftLog, Slot,
    SnapshotMeta, encode_entry_record, encode_slot, encode_snapshot,
)
from storage.replica_meta import (
    HEALTH_NAME, META_NAME, UNKNOWN_END, MetaMismatch, ReplicaFileUnusable, ReplicaHealth, ReplicaMeta,
    open_replica_directory,
)
from storage.state import HEADER_BYTES as STATE_HEADER_BYTES
from storage.state import DurableState

STATE_PATH = "/coordinator/metadata.state"


def flip_every_byte(fs: MemoryFileSystem, path: str):
    """(position, a twin of `fs` with that byte of `path` flipped), for every byte."""
    for position in range(len(fs.read_file(path))):
        twin = fs.clone()
        twin.corrupt(path, position)
        yield position, twin


def cut_at_every_byte(fs: MemoryFileSystem, path: str):
    """(length, a twin of `fs` with `path` cut to that length), for every shorter length."""
    for length in range(len(fs.read_file(path))):
        twin = fs.clone()
        twin.cut(path, length)
        yield length, twin


def fail_sync_number(fs: MemoryFileSystem, number: int) -> None:
    """Make sync number `number` (0: the first, counting file and directory syncs) fail, and
    every one after it: the process is as good as crashed from there on."""
    seen = [0]

    def take_fsync_failure() -> bool:
        seen[0] += 1
        return seen[0] > number

    fs.faults.take_fsync_failure = take_fsync_failure


def count_syncs(story) -> int:
    fs = MemoryFileSystem()
    calls = [0]

    def take_fsync_failure() -> bool:
        calls[0] += 1
        return False

    fs.faults.take_fsync_failure = take_fsync_failure
    story(fs)
    return calls[0]


@contextlib.contextmanager
def allocations_bounded(bytes_max: int):
    """Fail if the block allocates more than `bytes_max` at its peak (a length field believed)."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < bytes_max, f"{peak} bytes allocated"


def forged_record(value: object) -> bytes:
    """A journal record whose framing and CRC check out, holding whatever `value` encodes to."""
    body = msgspec.msgpack.encode(value) if not isinstance(value, bytes) else value
    return RECORD.pack(len(body), zlib.crc32(body)) + body


# ---------------------------------------------------------------------------- DurableState


def confirmed_state(fs: MemoryFileSystem) -> list:
    """A coordinator-style journal (confirm=True) of three flushes, closed; returns its items."""
    state = DurableState.open(STATE_PATH, fs=fs, confirm=True)
    state.put("topic/orders", {"partitions": 3, "epoch": 7})
    state.flush()
    state.put_many([("partition/orders/0", [1, 2, 3]), ("partition/orders/1", [2, 3, 1])])
    state.flush()
    state.delete("partition/orders/1")
    state.put("producer/next", 4096)
    state.close()
    return DurableState.open(STATE_PATH, fs=fs.clone(), confirm=True).items()


def open_state(fs: MemoryFileSystem, **options) -> DurableState:
    return DurableState.open(STATE_PATH, fs=fs, confirm=True, **options)


def test_a_confirmed_state_cut_at_any_byte_keeps_everything_or_refuses():
    fs = MemoryFileSystem()
    acknowledged = confirmed_state(fs)
    for length, twin in cut_at_every_byte(fs, STATE_PATH):
        try:
            recovered = open_state(twin).items()
        except CorruptState as error:
            assert STATE_PATH in str(error)
            continue
        assert recovered == acknowledged, f"cut to {length} bytes: opened as {recovered}"


def test_a_confirmed_state_with_any_byte_flipped_keeps_everything_or_refuses():
    fs = MemoryFileSystem()
    acknowledged = confirmed_state(fs)
    for position, twin in flip_every_byte(fs, STATE_PATH):
        try:
            recovered = open_state(twin).items()
        except CorruptState:
            continue
        assert recovered == acknowledged, f"byte {position} flipped: opened as {recovered}"


@pytest.mark.parametrize("content", [b"", b"\0" * 4096, b"\xa5" * 300, b"DST1" + b"\0" * 200],
                         ids=["empty", "zeroed", "garbage", "magic-then-zeros"])
def test_a_state_file_replaced_by_nothing_zeros_or_garbage_is_refused_not_read_as_empty(content):
    fs = MemoryFileSystem()
    confirmed_state(fs)
    fs.set_content(STATE_PATH, content)
    with pytest.raises(CorruptState, match="header slot"):
        open_state(fs)
    assert fs.read_file(STATE_PATH) == content, "a refused journal is left as it was for an operator"


def test_a_state_whose_two_header_slots_rotted_is_refused_even_though_its_records_check_out():
    fs = MemoryFileSystem()
    confirmed_state(fs)
    fs.corrupt(STATE_PATH, 4)
    fs.corrupt(STATE_PATH, 32 + 4)
    with pytest.raises(CorruptState):
        open_state(fs)


def state_story(fs: MemoryFileSystem, confirm: bool, acknowledged: list) -> None:
    """Writes that a coordinator makes; `acknowledged` gets the items each flush attempts, then
    the items once that flush has returned."""
    state = DurableState.open(STATE_PATH, fs=fs, confirm=confirm, compact_min_records=3)
    steps = [lambda: state.put("topic/a", 1),
             lambda: state.put_many([("topic/b", 2), ("topic/c", 3)]),
             lambda: state.delete("topic/a"),
             lambda: state.put("topic/b", 20),  # past compact_min_records: a rewrite
             lambda: state.put("topic/d", 4)]
    for step in steps:
        step()
        acknowledged.append(("attempted", state.items()))
        state.flush()
        acknowledged.append(("acked", state.items()))


@pytest.mark.parametrize("confirm", [False, True])
def test_a_crash_at_any_sync_of_the_state_keeps_what_was_acknowledged(confirm):
    syncs = count_syncs(lambda fs: state_story(fs, confirm, []))
    for failing in range(syncs):
        fs, seen = MemoryFileSystem(), []
        fail_sync_number(fs, failing)
        with pytest.raises(StorageError):
            state_story(fs, confirm, seen)
        fs.crash()
        del fs.faults.take_fsync_failure  # the restarted process's disk syncs again
        last_acked = ([[]] + [items for kind, items in seen if kind == "acked"])[-1]
        in_flight = seen[-1][1] if seen and seen[-1][0] == "attempted" else last_acked
        recovered = DurableState.open(STATE_PATH, fs=fs, confirm=confirm).items()
        assert recovered in (last_acked, in_flight), f"sync {failing} failed: {recovered}, acked {last_acked}"


@pytest.mark.parametrize("operation", [
    [2, None, 5],  # PUT_MANY of a number
    [2, None, [5]],  # PUT_MANY of things that are not pairs
    [2, None, [[1, 2]]],  # PUT_MANY with a key that is not a string
    [0, 7, "value"],  # PUT with an integer key
    [0, [1], "value"],  # PUT with an unhashable key
    [1, None],  # DELETE of no key (and only two fields)
    [True, "key", 1],  # an op that only looks like one
    "abc",  # a string of three characters unpacks as three fields
])
def test_a_record_whose_crc_checks_out_but_whose_content_is_malformed_is_damage_not_a_crash(operation):
    fs = MemoryFileSystem()
    acknowledged = confirmed_state(fs)
    journal = fs.read_file(STATE_PATH)
    forged = forged_record(operation)

    inside = fs.clone()  # the forged record where a flushed one was: damage
    first = STATE_HEADER_BYTES
    length = RECORD.size + RECORD.unpack_from(journal, first)[0]
    inside.set_content(STATE_PATH, journal[:first] + forged + journal[first + length:])
    with pytest.raises(CorruptState, match="at byte 64"):
        open_state(inside)

    past = fs.clone()  # the same record past the flushed region: a tail to cut
    past.set_content(STATE_PATH, journal + forged)
    recovered = open_state(past)
    assert recovered.items() == acknowledged and recovered.recovery.truncated_records == 1


def test_a_deeply_nested_record_is_damage_not_a_recursion_error():
    fs = MemoryFileSystem()
    acknowledged = confirmed_state(fs)
    nested = b"\x93\x00\xa1k" + b"\x91" * 100_000 + b"\x00"  # [PUT, "k", [[[[...]]]]]
    fs.set_content(STATE_PATH, fs.read_file(STATE_PATH) + forged_record(nested))
    recovered = open_state(fs)
    assert recovered.items() == acknowledged and recovered.recovery.truncated_records == 1


def test_a_length_field_claiming_gigabytes_is_cut_as_a_tail_without_allocating_it():
    fs = MemoryFileSystem()
    acknowledged = confirmed_state(fs)
    fs.set_content(STATE_PATH, fs.read_file(STATE_PATH) + RECORD.pack(0xFFFF_FFF0, 0) + b"x" * 16)
    with allocations_bounded(1 << 20):
        recovered = open_state(fs)
    assert recovered.items() == acknowledged and recovered.recovery.truncated_bytes == RECORD.size + 16


def test_a_put_that_fits_but_whose_compaction_does_not_succeeds_and_is_kept():
    fs = MemoryFileSystem()
    state = DurableState.open(STATE_PATH, fs=fs, compact_min_records=4)
    for value in range(4):
        state.put("offset/g/orders/0", value)
    state.flush()
    fs.faults.set_write_quota(60)  # room for two records, not for the rewrite the first triggers
    state.put("offset/g/orders/0", 99)  # no StorageFull: the put itself happened
    assert state.get("offset/g/orders/0") == 99
    state.put("offset/g/orders/1", 5)  # the next put does not try the whole rewrite again
    fs.faults.set_write_quota(None)
    state.flush()
    fs.crash()
    assert open_state(fs).items() == [("offset/g/orders/0", 99), ("offset/g/orders/1", 5)]


def test_a_put_the_disk_has_no_room_for_raises_and_is_not_kept():
    fs = MemoryFileSystem()
    state = DurableState.open(STATE_PATH, fs=fs, compact_min_records=4)
    state.put("a", 1)
    fs.faults.set_write_quota(5)
    with pytest.raises(StorageFull):
        state.put("b", 2)
    fs.faults.set_write_quota(None)
    assert state.get("b") is None
    state.close()
    assert DurableState.open(STATE_PATH, fs=fs).items() == [("a", 1)]


def test_a_flush_refused_by_a_full_disk_then_retried_keeps_the_newest_slot_as_the_backup():
    fs = MemoryFileSystem()
    state = DurableState.open(STATE_PATH, fs=fs)  # without confirm: one slot write per flush
    state.put("a", 1)
    state.flush()
    record_a_end = len(fs.read_file(STATE_PATH))
    state.put("b", 2)
    state.flush()  # its slot says record "a" is certainly durable
    state.put("c", 3)
    fs.faults.set_write_quota(0)
    with pytest.raises(StorageFull):
        state.flush()
    fs.faults.set_write_quota(None)
    state.flush()
    state.close()
    # The slot the retry wrote rots, and so does record "a": the other slot must still be the one
    # saying "a" was flushed, so this is refused, not cut back to an empty state in silence.
    sequences = [int.from_bytes(fs.read_file(STATE_PATH)[slot * 32 + 4: slot * 32 + 12], "little") for slot in (0, 1)]
    fs.corrupt(STATE_PATH, sequences.index(max(sequences)) * 32 + 4)
    fs.corrupt(STATE_PATH, record_a_end - 2)
    with pytest.raises(CorruptState):
        DurableState.open(STATE_PATH, fs=fs)


def test_reading_a_journal_another_process_owns_gives_what_open_would_and_writes_nothing():
    fs = MemoryFileSystem()
    acknowledged = confirmed_state(fs)
    writer = open_state(fs)  # the owner, still writing: one record whole, the next one torn
    writer.put("topic/late", 1)
    torn = fs.read_file(STATE_PATH) + forged_record([0, "topic/torn", 2])[:-3]
    fs.set_content(STATE_PATH, torn)
    assert DurableState.read(STATE_PATH, fs=fs, confirm=True) == sorted(acknowledged + [("topic/late", 1)])
    assert fs.read_file(STATE_PATH) == torn, "a reader must not cut the owner's tail"
    for content in (b"", bytes(4096)):
        fs.set_content(STATE_PATH, content)
        with pytest.raises(CorruptState):
            DurableState.read(STATE_PATH, fs=fs)


def test_a_state_path_that_is_a_directory_is_refused_naming_it(tmp_path):
    path = tmp_path / "coordinator" / "metadata.state"
    path.mkdir(parents=True)
    with pytest.raises(CorruptState, match="metadata.state"):
        DurableState.open(str(path), fs=OsFileSystem(), confirm=True)


# ---------------------------------------------------------------------------- the raft log

RAFT_DIRECTORY = "/node-1/controller/raft"
RAFT_LOG = f"{RAFT_DIRECTORY}/{LOG_NAME}"
RAFT_SNAPSHOT = f"{RAFT_DIRECTORY}/{SNAPSHOT_NAME}"


def open_raft(fs) -> RaftLog:
    return RaftLog.open(RAFT_DIRECTORY, fs=fs)


def raft_entries(first: int, terms: list[int]) -> list[RaftEntry]:
    return [RaftEntry(index=index, term=term, data=b"cmd%d" % index) for index, term in enumerate(terms, start=first)]


def raft_content(log: RaftLog) -> tuple:
    """What a voter must not forget: its term and vote, its snapshot, and every entry after it."""
    snapshot = log.snapshot
    after = snapshot.index + 1 if snapshot is not None else log.first_index
    entries = [(index, log.term_at(index), log.entry(index).data) for index in range(after, log.last_index + 1)]
    return tuple(log.hard_state)[:2], (snapshot.index, snapshot.term) if snapshot else None, entries


def flushed_raft(fs: MemoryFileSystem) -> tuple:
    """A voter's log after two flushes (entries, a vote, a commit), closed; returns its content."""
    log = open_raft(fs)
    log.set_hard_state(2, 3)
    log.append(raft_entries(1, [1, 2]))
    log.flush()
    log.append(raft_entries(3, [2]))
    log.set_commit(2)
    log.flush()
    log.close()
    return raft_content(open_raft(fs.clone()))


def still_acknowledges(fs: MemoryFileSystem) -> None:
    """Reopened, the log takes one more entry and keeps it across a crash."""
    log = open_raft(fs)
    index = log.last_index + 1
    log.append([RaftEntry(index=index, term=max(log.last_term, 2), data=b"after")])
    log.flush()
    fs.crash()
    again = open_raft(fs)
    assert again.last_index == index and again.entry(index).data == b"after"


def test_a_raft_log_cut_at_any_byte_keeps_its_vote_and_entries_or_refuses():
    fs = MemoryFileSystem()
    acknowledged = flushed_raft(fs)
    for length, twin in cut_at_every_byte(fs, RAFT_LOG):
        try:
            recovered = raft_content(open_raft(twin))
        except CorruptRaftLog as error:
            assert RAFT_LOG in str(error)
            continue
        assert recovered == acknowledged, f"cut to {length} bytes: opened as {recovered}"


def test_a_vote_only_log_cut_inside_its_second_slot_keeps_the_vote_and_what_it_acknowledges_next():
    fs = MemoryFileSystem()
    log = open_raft(fs)
    log.set_hard_state(3, 2)  # a fresh voter's first vote: no entries yet
    log.flush()
    log.close()
    for length in range(SLOT_BYTES, HEADER_BYTES):
        twin = fs.clone()
        twin.cut(RAFT_LOG, length)
        reopened = open_raft(twin)
        assert tuple(reopened.hard_state)[:2] == (3, 2), f"cut to {length}"
        assert reopened.recovery.header_repaired
        reopened.close()
        still_acknowledges(twin)


def test_a_raft_log_with_any_byte_flipped_keeps_its_vote_and_entries_or_refuses():
    fs = MemoryFileSystem()
    acknowledged = flushed_raft(fs)
    for position, twin in flip_every_byte(fs, RAFT_LOG):
        try:
            log = open_raft(twin)
        except CorruptRaftLog:
            continue
        assert raft_content(log) == acknowledged, f"byte {position} flipped"
        log.close()
        still_acknowledges(twin)


def snapshotted_raft(fs: MemoryFileSystem) -> tuple:
    log = open_raft(fs)
    log.set_hard_state(2, 1)
    log.append(raft_entries(1, [1, 1, 2, 2]))
    log.set_commit(3)
    log.save_snapshot(SnapshotMeta(index=3, term=2, voters=[1, 2, 3]), b"map@3", keep_from=3)
    log.close()
    return raft_content(open_raft(fs.clone()))


def test_a_raft_snapshot_cut_or_flipped_at_any_byte_is_refused_by_name():
    fs = MemoryFileSystem()
    acknowledged = snapshotted_raft(fs)
    twins = list(cut_at_every_byte(fs, RAFT_SNAPSHOT)) + list(flip_every_byte(fs, RAFT_SNAPSHOT))
    for where, twin in twins:
        try:
            recovered = raft_content(open_raft(twin))
        except CorruptRaftSnapshot as error:
            assert RAFT_SNAPSHOT in str(error)
            continue
        assert recovered == acknowledged, f"snapshot damaged at {where}: opened as {recovered}"


def test_a_snapshot_that_disagrees_with_a_committed_entry_is_refused_before_the_journal_is_touched():
    fs = MemoryFileSystem()
    log = open_raft(fs)
    log.set_hard_state(3, 1)
    log.append(raft_entries(1, [3, 3, 3, 3, 3]))
    log.set_commit(5)
    log.flush()
    log.close()
    journal = fs.read_file(RAFT_LOG)
    # A snapshot from another quorum (a copied directory): its entry 3 has term 1, ours term 3.
    fs.set_content(RAFT_SNAPSHOT, encode_snapshot(SnapshotMeta(index=3, term=1), b"someone else's map"))
    with pytest.raises(CorruptRaftSnapshot, match="committed entry"):
        open_raft(fs)
    assert fs.read_file(RAFT_LOG) == journal, "the committed entries are still there for an operator"


def test_a_leaders_snapshot_past_the_commit_index_still_replaces_a_divergent_journal():
    fs = MemoryFileSystem()
    log = open_raft(fs)
    log.append(raft_entries(1, [1, 1, 3, 3]))
    log.set_commit(2)
    log.flush()
    log.close()
    fs.set_content(RAFT_SNAPSHOT, encode_snapshot(SnapshotMeta(index=3, term=2), b"leader's map"))
    again = open_raft(fs)
    assert again.recovery.rewritten and (again.first_index, again.last_index, again.last_term) == (4, 3, 2)


def test_a_header_that_starts_the_journal_past_entry_one_without_a_snapshot_is_refused():
    fs = MemoryFileSystem()
    log = open_raft(fs)
    log.set_hard_state(2, 2)
    log.flush()
    log.close()
    slot = encode_slot(Slot(sequence=5, length=HEADER_BYTES, base_index=40, term=2, vote=2, commit=0,
                            snapshot_index=0))
    fs.set_content(RAFT_LOG, slot + slot)  # CRC-valid, but entries 1..39 are nowhere
    with pytest.raises(CorruptRaftLog, match="no snapshot"):
        open_raft(fs)


def test_a_raft_record_claiming_gigabytes_is_damage_inside_the_flushed_region_and_a_tail_past_it():
    fs = MemoryFileSystem()
    acknowledged = flushed_raft(fs)
    claim = RECORD.pack(0xFFFF_FFF0, 0) + b"x" * 16
    past = fs.clone()
    past.set_content(RAFT_LOG, fs.read_file(RAFT_LOG) + claim)
    with allocations_bounded(1 << 20):
        assert raft_content(open_raft(past)) == acknowledged
    inside = fs.clone()
    journal = fs.read_file(RAFT_LOG)
    inside.set_content(RAFT_LOG, journal[:HEADER_BYTES] + claim + journal[HEADER_BYTES + len(claim):])
    with pytest.raises(CorruptRaftLog, match="absurd record length"):
        open_raft(inside)


@pytest.mark.parametrize("entry", [RaftEntry(index=3, term=2, kind=7, data=b"cmd3"), RaftEntry(index=3, term=-1),
                                   RaftEntry(index=-5, term=2)], ids=["unknown-kind", "negative-term", "negative-index"])
def test_a_raft_record_whose_crc_checks_out_but_whose_entry_is_impossible_is_damage_or_a_tail(entry):
    fs = MemoryFileSystem()
    acknowledged = flushed_raft(fs)
    journal = fs.read_file(RAFT_LOG)
    record = encode_entry_record(entry)
    past = fs.clone()  # after the flushed region: a tail to cut
    past.set_content(RAFT_LOG, journal + record)
    assert raft_content(open_raft(past)) == acknowledged
    inside = fs.clone()  # in place of the flushed entry 3 (the last record): damage
    last = len(journal) - len(encode_entry_record(RaftEntry(index=3, term=2, data=b"cmd3")))
    inside.set_content(RAFT_LOG, journal[:last] + record)
    with pytest.raises(CorruptRaftLog):
        open_raft(inside)


def raft_story(fs: MemoryFileSystem, acked: list) -> None:
    """What a voter writes: votes, entries, a divergent suffix replaced, a snapshot of its own,
    then a leader's; `acked` gets the content once each durable step has returned."""
    log = open_raft(fs)
    acked.append(raft_content(log))

    def step(change) -> None:
        change()
        log.flush()
        acked.append(raft_content(log))

    step(lambda: log.set_hard_state(1, 1))
    step(lambda: log.append(raft_entries(1, [1, 1, 1])))
    step(lambda: (log.set_hard_state(2, 2), log.append(raft_entries(3, [2, 2]))))
    log.set_commit(3)
    step(lambda: log.save_snapshot(SnapshotMeta(index=3, term=2), b"map@3", keep_from=2))
    step(lambda: log.append(raft_entries(5, [2])))
    step(lambda: log.install_snapshot(SnapshotMeta(index=9, term=4), b"leader's map@9"))
    step(lambda: (log.set_hard_state(4, 3), log.append(raft_entries(10, [4]))))


def test_a_crash_at_any_sync_of_the_raft_log_keeps_what_was_acknowledged():
    whole: list = []
    syncs = count_syncs(lambda fs: raft_story(fs, whole))
    empty = raft_content(open_raft(MemoryFileSystem()))
    for failing in range(syncs):
        fs, acked = MemoryFileSystem(), []
        fail_sync_number(fs, failing)
        with pytest.raises(StorageError):
            raft_story(fs, acked)
        fs.crash()
        del fs.faults.take_fsync_failure
        last_acked = acked[-1] if acked else empty
        in_flight = whole[len(acked)] if len(acked) < len(whole) else last_acked
        recovered = raft_content(open_raft(fs))
        # A flush cut between its two slot writes keeps the older term and vote (never revealed)
        # beside the newer records (they check out): each half is one of the two.
        assert recovered[0] in (last_acked[0], in_flight[0]), f"sync {failing}: {recovered}"
        assert recovered[1:] in (last_acked[1:], in_flight[1:]), f"sync {failing}: {recovered}"


def test_a_full_disk_during_a_snapshots_journal_rewrite_closes_the_log_and_loses_nothing():
    fs = MemoryFileSystem()
    log = open_raft(fs)
    log.set_hard_state(1, 1)
    log.append(raft_entries(1, [1, 1, 1, 1, 1]))
    log.set_commit(4)
    log.flush()
    acknowledged = raft_content(log)
    snapshot_bytes = len(encode_snapshot(SnapshotMeta(index=4, term=1), b"map@4"))
    fs.faults.set_write_quota(snapshot_bytes)  # the snapshot fits; the journal rewrite does not
    with pytest.raises(StorageFull):
        log.save_snapshot(SnapshotMeta(index=4, term=1), b"map@4", keep_from=3)
    fs.faults.set_write_quota(None)
    with pytest.raises(LogClosed):  # appending to the old journal would confirm a base it lacks
        log.append(raft_entries(6, [1]))
    fs.crash()
    again = open_raft(fs)
    assert again.recovery.rewritten and again.snapshot.index == 4
    assert raft_content(again)[0] == acknowledged[0] and again.last_index == 5
    still_acknowledges(fs)


@pytest.mark.parametrize("room_bytes", [0, SLOT_BYTES], ids=["slot-a-refused", "slot-b-refused"])
def test_a_flush_refused_by_a_full_disk_then_retried_and_cut_at_any_sync_reopens(room_bytes):
    for failing in range(3):
        fs = MemoryFileSystem()
        log = open_raft(fs)
        log.set_hard_state(1, 1)
        log.append(raft_entries(1, [1]))
        log.flush()
        log.set_hard_state(2, 2)
        fs.faults.set_write_quota(room_bytes)
        with pytest.raises(StorageFull):
            log.flush()
        fs.faults.set_write_quota(None)
        fail_sync_number(fs, failing)  # the retry is cut at its first, second or no sync
        try:
            log.flush()
        except StorageError:
            pass
        fs.crash()
        del fs.faults.take_fsync_failure
        assert tuple(open_raft(fs).hard_state)[:2] in ((1, 1), (2, 2)), f"room {room_bytes}, sync {failing}"


def test_raft_files_replaced_by_directories_are_refused_by_name(tmp_path):
    directory = tmp_path / "controller" / "raft"
    log = RaftLog.open(str(directory), fs=OsFileSystem())
    log.set_hard_state(1, 1)
    log.flush()
    log.close()
    (directory / SNAPSHOT_NAME).mkdir()
    with pytest.raises(CorruptRaftSnapshot, match=SNAPSHOT_NAME):
        RaftLog.open(str(directory), fs=OsFileSystem())
    (directory / SNAPSHOT_NAME).rmdir()
    (directory / LOG_NAME).unlink()
    (directory / LOG_NAME).mkdir()
    with pytest.raises(CorruptRaftLog, match=LOG_NAME):
        RaftLog.open(str(directory), fs=OsFileSystem())


# ---------------------------------------------------------------------------- a replica directory's small files

REPLICA_DIRECTORY = "/data/node-1/orders-0-abc"
REPLICA_META = ReplicaMeta(cluster_id="c1", topic="orders", topic_id=0xABC, partition=0, node=1, replicas=[1, 2, 3])
REPLICA_CONFIG = LogConfig(segment_bytes=4096)


def open_replica(fs):
    return open_replica_directory(fs, REPLICA_DIRECTORY, REPLICA_META, REPLICA_CONFIG, now_ms=0)


def healthy_replica(fs: MemoryFileSystem) -> int:
    """A replica directory holding 12 flushed batches, repaired (healthy), closed; its log end."""
    opened = open_replica(fs)
    for index in range(12):
        records = [(0, f"k{index}-{n}".encode(), b"v" * 100, None) for n in range(2)]
        opened.log.append_producer_batch(bytes(encode_batch(records, 1_000)), 1, 0)
    opened.log.flush()
    opened.health.replace(ReplicaHealth())
    end = opened.log.log_end_offset
    opened.log.close()
    return end


def unknown_loss(health: ReplicaHealth) -> bool:
    return any(damage.last_offset == UNKNOWN_END for damage in health.damage)


@pytest.mark.parametrize("content", [b"", bytes(128), b"\xa5" * 128, b"RPC2" + bytes(60)],
                         ids=["empty", "zeroed", "garbage", "magic-then-zeros"])
def test_a_recovery_point_checkpoint_that_is_there_but_unreadable_is_damage_like_a_missing_one(content):
    fs = MemoryFileSystem()
    healthy_replica(fs)
    fs.set_content(f"{REPLICA_DIRECTORY}/{RECOVERY_POINT_NAME}", content)
    opened = open_replica(fs)
    assert unknown_loss(opened.health.current), opened.health.current
    assert "checkpoint was unreadable" in opened.health.current.describe()


def test_a_recovery_point_checkpoint_cut_or_flipped_anywhere_is_read_or_counted_as_damage():
    fs = MemoryFileSystem()
    end = healthy_replica(fs)
    path = f"{REPLICA_DIRECTORY}/{RECOVERY_POINT_NAME}"
    for where, twin in list(cut_at_every_byte(fs, path)) + list(flip_every_byte(fs, path)):
        opened = open_replica(twin)
        if opened.log.checkpoint_found:
            assert opened.health.current.healthy and opened.log.log_end_offset == end, f"checkpoint damaged at {where}"
        else:
            assert unknown_loss(opened.health.current), f"checkpoint damaged at {where}: {opened.health.current}"


def test_a_leader_epoch_checkpoint_cut_or_flipped_anywhere_is_rebuilt_from_the_batches():
    fs = MemoryFileSystem()
    end = healthy_replica(fs)
    path = f"{REPLICA_DIRECTORY}/{EPOCH_CHECKPOINT_NAME}"
    entries = LeaderEpochCache.load(fs, path).entries
    for where, twin in list(cut_at_every_byte(fs, path)) + list(flip_every_byte(fs, path)):
        opened = open_replica(twin)
        assert opened.log.log_end_offset == end, f"epochs damaged at {where}"
        assert LeaderEpochCache.load(twin, path).entries == entries, f"epochs damaged at {where}"


@pytest.mark.parametrize("forged", [[(5, 0), (3, 10)], [(1, 10), (2, 5)], [(1, 0), (1, 3)], [(-4, 0)], [(1, -7)]],
                         ids=["epoch-goes-back", "start-goes-back", "epoch-repeats", "negative-epoch", "negative-start"])
def test_a_leader_epoch_checkpoint_whose_crc_checks_out_but_whose_entries_are_impossible_is_rebuilt(forged):
    fs = MemoryFileSystem()
    end = healthy_replica(fs)
    path = f"{REPLICA_DIRECTORY}/{EPOCH_CHECKPOINT_NAME}"
    entries = LeaderEpochCache.load(fs, path).entries
    payload = msgspec.msgpack.encode(forged)
    fs.set_content(path, zlib.crc32(payload).to_bytes(4, "little") + payload)
    opened = open_replica(fs)
    assert not opened.log.corrupt_ranges, "good batches refused on the word of an impossible checkpoint"
    assert opened.log.log_end_offset == end and LeaderEpochCache.load(fs, path).entries == entries
    assert any("leader-epoch checkpoint rebuilt" in problem for problem in opened.log.recovery.problems)


@pytest.mark.parametrize("name", [META_NAME, HEALTH_NAME])
def test_a_meta_or_health_file_cut_or_flipped_anywhere_is_refused_or_counted_as_damage(name):
    fs = MemoryFileSystem()
    healthy_replica(fs)
    path = f"{REPLICA_DIRECTORY}/{name}"
    for where, twin in list(cut_at_every_byte(fs, path)) + list(flip_every_byte(fs, path)):
        try:
            opened = open_replica(twin)
        except MetaMismatch as error:
            assert name == META_NAME and META_NAME in str(error), f"{name} damaged at {where}"
            continue
        assert name == HEALTH_NAME and unknown_loss(opened.health.current), f"{name} damaged at {where}"


def test_a_new_directory_that_crashed_before_its_health_file_was_written_is_not_taken_for_healthy():
    fs = MemoryFileSystem()
    opened = open_replica(fs)  # new: meta, checkpoint, an empty segment and health = new directory
    opened.log.close()
    fs.destroy(f"{REPLICA_DIRECTORY}/{HEALTH_NAME}")  # what a crash before the health write leaves
    again = open_replica(fs).health.current
    assert not again.healthy, "an empty replica must not look like one that holds the partition's past"


def test_a_lost_health_file_does_not_forget_the_damage_it_recorded():
    fs = MemoryFileSystem()
    healthy_replica(fs)
    for name in [name for name in fs.list_directory(REPLICA_DIRECTORY) if name.endswith(".log")][-1:]:
        fs.destroy(f"{REPLICA_DIRECTORY}/{name}")  # the tail segment is lost...
    first = open_replica(fs)
    assert not first.health.current.healthy  # ...found once (the checkpoint moves down to the new end)
    first.log.close()
    fs.destroy(f"{REPLICA_DIRECTORY}/{HEALTH_NAME}")  # ...then the record of it is lost too
    again = open_replica(fs).health.current
    assert unknown_loss(again) and HEALTH_NAME in again.describe()


@pytest.mark.parametrize("name", [META_NAME, HEALTH_NAME, RECOVERY_POINT_NAME, EPOCH_CHECKPOINT_NAME])
def test_a_replica_file_replaced_by_a_directory_is_refused_by_name(tmp_path, name):
    directory = str(tmp_path / "node-1" / "orders-0-abc")
    opened = open_replica_directory(OsFileSystem(), directory, REPLICA_META, REPLICA_CONFIG, now_ms=0)
    opened.log.close()
    path = tmp_path / "node-1" / "orders-0-abc" / name
    if path.exists():
        path.unlink()
    path.mkdir()
    with pytest.raises(ReplicaFileUnusable, match=name):
        open_replica_directory(OsFileSystem(), directory, REPLICA_META, REPLICA_CONFIG, now_ms=0)


def test_a_checkpoint_store_refused_by_a_full_disk_then_retried_never_overwrites_the_newest_point():
    fs = MemoryFileSystem()
    fs.make_directory("/replica")
    path = "/replica/" + RECOVERY_POINT_NAME
    points = [RecoveryPoint(recovery_offset=offset, segment_base_offset=0, position=offset * 10, log_start_offset=0)
              for offset in (10, 20, 30, 40)]
    checkpoint = RecoveryPointFile(fs, path)
    checkpoint.store(points[0])
    checkpoint.store(points[1])
    fs.faults.set_write_quota(0)
    with pytest.raises(StorageFull):
        checkpoint.store(points[2])
    fs.faults.set_write_quota(None)
    checkpoint.store(points[3])
    assert RecoveryPointFile(fs.clone(), path).point == points[3]
    newest_slot = next(slot for slot in (0, 1) if _slot_holds(fs, path, slot, points[3]))
    fs.corrupt(path, newest_slot * 64 + 12)  # what a write torn by a power cut leaves of it
    assert RecoveryPointFile(fs, path).point == points[1], "falls back one store, not two"


def _slot_holds(fs: MemoryFileSystem, path: str, slot: int, point) -> bool:
    twin = fs.clone()
    twin.corrupt(path, (1 - slot) * 64 + 12)  # with the other slot unreadable, this one is the point
    return RecoveryPointFile(twin, path).point == point


def test_a_raft_log_closed_by_a_failed_fsync_still_gives_its_file_back(tmp_path):
    def open_files() -> int:
        return len(os.listdir("/proc/self/fd"))

    fs = OsFileSystem()
    before = open_files()
    log = RaftLog.open(str(tmp_path / "raft"), fs=fs)
    log.set_hard_state(1, 1)
    fs.faults.fail_next_fsync()
    with pytest.raises(FsyncFailed):
        log.flush()
    log.close()  # what a stopping runtime does after the failure
    assert open_files() == before
    with pytest.raises(LogClosed, match="fsync failed"):
        log.append(raft_entries(1, [1]))


def bytes_written(story) -> int:
    fs = MemoryFileSystem()
    fs.faults.set_write_quota(1 << 40)
    story(fs)
    return (1 << 40) - fs.faults.write_quota_bytes


def test_a_disk_that_fills_at_any_byte_of_the_raft_log_story_keeps_what_was_acknowledged():
    whole: list = []
    total = bytes_written(lambda fs: raft_story(fs, whole))
    empty = raft_content(open_raft(MemoryFileSystem()))
    for room in range(total):
        fs, acked = MemoryFileSystem(), []
        fs.faults.set_write_quota(room)
        with pytest.raises(StorageError):
            raft_story(fs, acked)  # an actor stops at the first refusal (EXIT_DISK_FULL)
        fs.crash()
        fs.faults.set_write_quota(None)
        last_acked = acked[-1] if acked else empty
        in_flight = whole[len(acked)] if len(acked) < len(whole) else last_acked
        recovered = raft_content(open_raft(fs))
        assert recovered[0] in (last_acked[0], in_flight[0]), f"room {room}: {recovered}"
        assert recovered[1:] in (last_acked[1:], in_flight[1:]), f"room {room}: {recovered}"


@pytest.mark.parametrize("confirm", [False, True])
def test_a_disk_that_fills_at_any_byte_of_the_state_story_keeps_what_was_acknowledged(confirm):
    total = bytes_written(lambda fs: state_story(fs, confirm, []))
    for room in range(total):
        fs, seen = MemoryFileSystem(), []
        fs.faults.set_write_quota(room)
        try:
            state_story(fs, confirm, seen)
        except StorageFull:
            pass  # an actor stops at the first refusal (EXIT_DISK_FULL)
        fs.crash()
        fs.faults.set_write_quota(None)
        last_acked = ([[]] + [items for kind, items in seen if kind == "acked"])[-1]
        in_flight = seen[-1][1] if seen and seen[-1][0] == "attempted" else last_acked
        recovered = DurableState.open(STATE_PATH, fs=fs, confirm=confirm).items()
        assert recovered in (last_acked, in_flight), f"room {room}: {recovered}, acked {last_acked}"


class UnreadableDisk(MemoryFileSystem):
    """A disk whose sectors under `path` fail to read (EIO), as a dying disk's do."""

    def __init__(self, source: MemoryFileSystem, path: str) -> None:
        super().__init__()
        self.__dict__.update(source.clone().__dict__)
        self.unreadable = path

    def open(self, path: str, *, create: bool = False):
        handle = super().open(path, create=create)
        if path == self.unreadable:
            def read_at(position: int, length: int) -> bytes:
                raise OSError(errno.EIO, "Input/output error", path)
            handle = _Handle(handle, read_at)
        return handle


class _Handle:
    def __init__(self, handle, read_at) -> None:
        self._handle, self.read_at = handle, read_at

    def __getattr__(self, name: str):
        return getattr(self._handle, name)


def test_an_io_error_reading_the_state_or_the_raft_log_is_a_typed_error_naming_the_file():
    fs = MemoryFileSystem()
    confirmed_state(fs)
    with pytest.raises(CorruptState, match=f"{STATE_PATH}: cannot be read"):
        open_state(UnreadableDisk(fs, STATE_PATH))
    raft = MemoryFileSystem()
    flushed_raft(raft)
    with pytest.raises(CorruptRaftLog, match=f"{RAFT_LOG}: cannot be read"):
        open_raft(UnreadableDisk(raft, RAFT_LOG))
