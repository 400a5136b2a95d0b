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

import zlib

import msgspec
import pytest

from storage.errors import CorruptState, StorageError, StorageFull
from storage.fs import OsFileSystem
from storage.memory import MemoryFileSystem
from storage.state import HEADER_BYTES as STATE_HEADER_BYTES
from storage.state import DurableState
from storage.journal_frames import RECORD

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


def test_a_state_path_that_is_a_directory_is_refused_naming_it(tmp_path):
    path = tmp_path / "coordinator" / "metadata.state"
    path.mkdir(parents=True)
    with pytest.raises(CorruptState, match="metadata.state"):
        DurableState.open(str(path), fs=OsFileSystem(), confirm=True)
