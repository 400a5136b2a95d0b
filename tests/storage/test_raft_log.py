"""The durable Raft log (storage/raft_log.py): what survives a crash, what a torn write costs, and
that damage inside what was flushed is a typed error, never a silent loss of a vote or an entry."""

from __future__ import annotations

import pytest

from storage.errors import FsyncFailed, LogClosed
from storage.fs import OsFileSystem
from storage.memory import MemoryFileSystem
from storage.raft_log import (
    ENTRY_NOOP, HEADER_BYTES, LOG_NAME, SLOT_BYTES, SNAPSHOT_NAME, CorruptRaftLog, CorruptRaftSnapshot, RaftEntry,
    RaftLog, SnapshotMeta, encode_entry_record, encode_snapshot,
)

DIRECTORY = "/controller/raft"
LOG_PATH = f"{DIRECTORY}/{LOG_NAME}"
SNAPSHOT_PATH = f"{DIRECTORY}/{SNAPSHOT_NAME}"


def entries(first: int, terms: list[int]) -> list[RaftEntry]:
    return [RaftEntry(index=index, term=term, data=b"e%d" % index) for index, term in enumerate(terms, start=first)]


def reopen(fs: MemoryFileSystem) -> RaftLog:
    return RaftLog.open(DIRECTORY, fs=fs)


@pytest.fixture
def fs() -> MemoryFileSystem:
    return MemoryFileSystem()


def test_a_new_log_is_empty_with_no_term_and_no_vote(fs):
    log = reopen(fs)
    assert (log.first_index, log.last_index, log.last_term) == (1, 0, 0)
    assert tuple(log.hard_state) == (0, 0, 0)
    assert log.term_at(0) == 0 and log.term_at(1) is None
    assert not log.needs_flush


def test_entries_and_hard_state_survive_a_crash_once_flushed(fs):
    log = reopen(fs)
    log.append(entries(1, [1, 1, 2]))
    log.set_hard_state(2, 3)
    log.set_commit(2)
    assert log.needs_flush
    log.flush()
    assert not log.needs_flush
    fs.crash()
    again = reopen(fs)
    assert [entry.term for entry in again.entries(1, 10, 1 << 20)] == [1, 1, 2]
    assert tuple(again.hard_state) == (2, 3, 2)


def test_what_was_not_flushed_is_lost_on_a_crash_and_nothing_else(fs):
    log = reopen(fs)
    log.append(entries(1, [1, 1]))
    log.set_hard_state(1, 1)
    log.flush()
    log.append(entries(3, [2]))
    log.set_hard_state(2, 2)  # a vote never flushed: it was never revealed either
    fs.crash()
    again = reopen(fs)
    assert again.last_index == 2 and tuple(again.hard_state)[:2] == (1, 1)


def test_a_commit_index_alone_never_asks_for_a_flush_but_rides_along_with_the_next(fs):
    log = reopen(fs)
    log.append(entries(1, [1, 1]))
    log.flush()
    log.set_commit(2)
    assert not log.needs_flush
    log.set_hard_state(1, 2)
    log.flush()
    fs.crash()
    assert reopen(fs).hard_state.commit == 2


def test_a_divergent_suffix_is_replaced_by_appending_at_its_index(fs):
    log = reopen(fs)
    log.append(entries(1, [1, 2, 2, 2]))
    log.append(entries(3, [3]))  # the leader of term 3 disagrees from index 3 on
    assert [log.term_at(index) for index in range(1, 5)] == [1, 2, 3, None]
    log.flush()
    fs.crash()
    again = reopen(fs)
    assert [again.term_at(index) for index in range(1, 5)] == [1, 2, 3, None]
    assert again.recovery.replayed_records == 5  # the journal keeps the history; replay applies it


def test_a_torn_tail_past_the_last_flush_is_cut_and_counted(fs):
    log = reopen(fs)
    log.append(entries(1, [1, 1]))
    log.flush()
    log.append(entries(3, [1, 1]))
    size = len(fs.read_file(LOG_PATH))
    fs.set_content(LOG_PATH, fs.read_file(LOG_PATH)[: size - 3])  # the last record torn, as by a crash
    again = reopen(fs)
    assert again.last_index == 3
    assert again.recovery.truncated_records == 1 and again.recovery.truncated_bytes > 0


def test_a_flipped_byte_inside_the_flushed_region_is_a_typed_error(fs):
    log = reopen(fs)
    log.append(entries(1, [1, 1, 1]))
    log.flush()
    fs.corrupt(LOG_PATH, HEADER_BYTES + 12)
    with pytest.raises(CorruptRaftLog, match="inside the flushed region"):
        reopen(fs)


def test_a_log_cut_short_inside_the_flushed_region_is_a_typed_error(fs):
    log = reopen(fs)
    log.append(entries(1, [1, 1, 1]))
    log.flush()
    fs.cut(LOG_PATH, HEADER_BYTES + 10)
    with pytest.raises(CorruptRaftLog):
        reopen(fs)


def test_one_unreadable_header_slot_costs_nothing(fs):
    log = reopen(fs)
    log.append(entries(1, [1]))
    log.set_hard_state(5, 2)
    log.flush()
    for slot in (0, 1):
        twin = fs.clone()
        twin.corrupt(LOG_PATH, slot * SLOT_BYTES + 9)
        assert tuple(reopen(twin).hard_state)[:2] == (5, 2), f"slot {slot}"


def test_both_header_slots_unreadable_is_a_typed_error(fs):
    log = reopen(fs)
    log.set_hard_state(5, 2)
    log.flush()
    fs.corrupt(LOG_PATH, 9)
    fs.corrupt(LOG_PATH, SLOT_BYTES + 9)
    with pytest.raises(CorruptRaftLog, match="neither header slot"):
        reopen(fs)


def test_a_flush_cut_between_its_two_slot_writes_falls_back_to_the_last_completed_one(fs):
    log = reopen(fs)
    log.append(entries(1, [1]))
    log.set_hard_state(1, 1)
    log.flush()
    slot_b = fs.read_file(LOG_PATH)[SLOT_BYTES:HEADER_BYTES]
    log.append(entries(2, [2]))
    log.set_hard_state(2, 3)
    log.flush()
    content = bytearray(fs.read_file(LOG_PATH))
    content[SLOT_BYTES:HEADER_BYTES] = slot_b  # slot A is new, slot B never got its copy
    fs.set_content(LOG_PATH, bytes(content))
    again = reopen(fs)
    assert tuple(again.hard_state)[:2] == (1, 1)  # the cut flush never returned: its vote was never revealed
    assert again.last_index == 2  # its records are an unconfirmed tail, kept because they check out



# ---------------------------------------------------------------------------- the rejoining mark


def test_a_journal_made_for_a_lost_one_is_marked_from_its_first_byte(fs):
    log = RaftLog.open(DIRECTORY, fs=fs, rejoining_if_created=True)
    assert log.rejoining and not log.needs_flush  # the creating write held it: no flush to wait for
    fs.crash()
    assert reopen(fs).rejoining
    assert rejoining_on_disk_of(fs)


def test_an_existing_journal_is_never_marked_by_opening_it(fs):
    reopen(fs).close()
    assert not RaftLog.open(DIRECTORY, fs=fs, rejoining_if_created=True).rejoining


def test_the_mark_survives_compaction_and_a_crash_and_clears_only_once_flushed(fs):
    log = RaftLog.open(DIRECTORY, fs=fs, rejoining_if_created=True)
    log.append(entries(1, [1, 1, 1]))
    log.set_commit(3)
    log.save_snapshot(SnapshotMeta(index=2, term=1, voters=[1, 2, 3]), b"state@2", keep_from=3)  # rewrites
    fs.crash()
    log = reopen(fs)
    assert log.rejoining
    log.set_rejoining(False)
    assert log.needs_flush
    fs.crash()  # before the flush: still marked, which only keeps it waiting longer
    log = reopen(fs)
    assert log.rejoining
    log.set_rejoining(False)
    log.flush()
    fs.crash()
    assert not reopen(fs).rejoining


def test_a_flush_clearing_the_mark_cut_between_its_slots_leaves_it_marked(fs):
    log = RaftLog.open(DIRECTORY, fs=fs, rejoining_if_created=True)
    log.append(entries(1, [1]))
    log.flush()
    slot_b = fs.read_file(LOG_PATH)[SLOT_BYTES:HEADER_BYTES]
    log.set_rejoining(False)
    log.flush()
    content = bytearray(fs.read_file(LOG_PATH))
    content[SLOT_BYTES:HEADER_BYTES] = slot_b  # slot A cleared the mark, slot B never got its copy
    fs.set_content(LOG_PATH, bytes(content))
    assert reopen(fs).rejoining


def rejoining_on_disk_of(fs: MemoryFileSystem) -> bool:
    """What `rejoining_on_disk` decides, on the memory disk's bytes (it reads real files)."""
    from storage.raft_records import choose_slot

    return choose_slot(fs.read_file(LOG_PATH)[:HEADER_BYTES], LOG_PATH)[0].rejoining

def test_snapshots_compact_the_log_and_survive_a_restart(fs):
    log = reopen(fs)
    log.append(entries(1, [1, 1, 2, 2, 2]))
    log.set_commit(4)
    log.save_snapshot(SnapshotMeta(index=4, term=2, voters=[1, 2, 3]), b"state@4", keep_from=3)
    assert (log.first_index, log.last_index, log.term_at(4), log.term_at(2)) == (3, 5, 2, None)
    fs.crash()
    again = reopen(fs)
    assert again.snapshot == SnapshotMeta(index=4, term=2, voters=[1, 2, 3])
    assert again.snapshot_data == b"state@4"
    assert (again.first_index, again.last_index, again.hard_state.commit) == (3, 5, 4)


def test_installing_a_leaders_snapshot_keeps_only_a_suffix_that_agrees_with_it(fs):
    log = reopen(fs)
    log.append(entries(1, [1, 1, 1]))
    log.install_snapshot(SnapshotMeta(index=2, term=1), b"s")
    assert (log.first_index, log.last_index) == (3, 3)
    log.install_snapshot(SnapshotMeta(index=10, term=4), b"t")  # beyond the log: everything goes
    assert (log.first_index, log.last_index, log.last_term, log.hard_state.commit) == (11, 10, 4, 10)


def test_a_crash_between_installing_a_snapshot_and_rewriting_the_journal_is_repaired_on_open(fs):
    log = reopen(fs)
    log.append(entries(1, [1, 1, 3, 3]))
    log.flush()
    # The snapshot file landed, the journal rewrite did not: a leader's snapshot at index 3, term 2.
    fs.set_content(SNAPSHOT_PATH, encode_snapshot(SnapshotMeta(index=3, term=2), b"leader-state"))
    again = reopen(fs)
    assert again.recovery.rewritten
    assert (again.first_index, again.last_index, again.last_term) == (4, 3, 2)  # the divergent entries went
    assert reopen(fs).snapshot.index == 3


def test_a_damaged_snapshot_is_a_typed_error(fs):
    log = reopen(fs)
    log.append(entries(1, [1, 1]))
    log.set_commit(2)
    log.save_snapshot(SnapshotMeta(index=2, term=1), b"state", keep_from=3)
    fs.corrupt(SNAPSHOT_PATH, 20)
    with pytest.raises(CorruptRaftSnapshot, match="CRC"):
        reopen(fs)


def test_a_missing_snapshot_the_journal_relies_on_is_a_typed_error(fs):
    log = reopen(fs)
    log.append(entries(1, [1, 1]))
    log.set_commit(2)
    log.save_snapshot(SnapshotMeta(index=2, term=1), b"state", keep_from=3)
    fs.destroy(SNAPSHOT_PATH)
    with pytest.raises(CorruptRaftSnapshot, match="missing"):
        reopen(fs)


def test_a_missing_journal_beside_a_snapshot_is_a_typed_error_not_a_fresh_voter(fs):
    log = reopen(fs)
    log.append(entries(1, [1]))
    log.set_commit(1)
    log.save_snapshot(SnapshotMeta(index=1, term=1), b"state", keep_from=2)
    fs.destroy(LOG_PATH)
    with pytest.raises(CorruptRaftLog, match="must not vote again"):
        reopen(fs)


def test_a_record_that_breaks_the_log_rules_inside_the_flushed_region_is_damage(fs):
    log = reopen(fs)
    log.append(entries(1, [2, 2]))
    log.flush()
    # A well-formed record (its CRC checks out) claiming index 5 where index 2 was: no writer
    # makes that gap, so inside the flushed region it is damage.
    second = HEADER_BYTES + len(encode_entry_record(entries(1, [2])[0]))
    forged = encode_entry_record(RaftEntry(index=5, term=2, data=b"e2"))
    content = bytearray(fs.read_file(LOG_PATH))
    content[second: second + len(forged)] = forged
    fs.set_content(LOG_PATH, bytes(content))
    with pytest.raises(CorruptRaftLog, match="outside"):
        reopen(fs)


def test_the_same_record_past_the_flushed_region_is_only_a_tail_to_cut(fs):
    log = reopen(fs)
    log.append(entries(1, [2]))
    log.flush()
    fs.set_content(LOG_PATH, fs.read_file(LOG_PATH) + encode_entry_record(RaftEntry(index=5, term=2)))
    again = reopen(fs)
    assert again.last_index == 1 and again.recovery.truncated_records == 1


def test_a_failed_fsync_closes_the_log_for_good(fs):
    log = reopen(fs)
    log.append([RaftEntry(index=1, term=1, kind=ENTRY_NOOP)])
    fs.faults.fail_next_fsync()
    with pytest.raises(FsyncFailed):
        log.flush()
    with pytest.raises(LogClosed):
        log.append(entries(2, [1]))


def test_on_real_files_too(tmp_path):
    directory = str(tmp_path / "raft")
    log = RaftLog.open(directory, fs=OsFileSystem())
    log.append(entries(1, [1, 2]))
    log.set_hard_state(2, 1)
    log.flush()
    log.close()
    again = RaftLog.open(directory, fs=OsFileSystem())
    try:
        assert (again.last_index, again.last_term, tuple(again.hard_state)[:2]) == (2, 2, (2, 1))
    finally:
        again.close()


@pytest.mark.parametrize("what", ["file", "journal-directory"])
def test_a_raft_directory_that_cannot_be_used_is_refused_naming_it(tmp_path, what):
    """A regular file where the raft directory should be (or a directory where its journal should
    be) is `CorruptRaftLog` naming the path, which the actor turns into a refusal to start: it was
    a FileExistsError, and the voter was restarted every half second for ever."""
    directory = tmp_path / "raft"
    if what == "file":
        directory.write_bytes(b"not a directory")
    else:
        (directory / "raft.log").mkdir(parents=True)
    with pytest.raises(CorruptRaftLog, match=str(directory)):
        RaftLog.open(str(directory), fs=OsFileSystem())
