"""The share-partition state machine (actors/share_partition.py), method by method.

Given a share-partition over a partition whose leader reported a log start and a high watermark,
when members acquire, answer, let locks expire or leave, then records are handed out below the high
watermark only, each lock has one holder, delivery counts grow by one per delivery, a record at its
last attempt goes to the dead-letter path, and the start offset moves past every finished record.
A hypothesis property explores random interleavings against a model built only from what the
share-partition answered.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.errors import ErrorCode
from actors.limits import Limits
from actors.messages import ShareAcknowledgement, ShareGroupSettings
from actors.dead_letter_records import dead_letter_batch, dead_letter_headers, source_records
from actors.share_partition import ACCEPTED, ACQUIRED, AVAILABLE, DEAD_LETTERING, MAX_ATTEMPTS, REJECTED, SharePartition
from storage.batch import decode_records, encode_batch, parse_header

MS = 1_000_000
VISIBILITY_MS = 1000
LIMITS = Limits(share_records_in_flight_max=8, share_fetch_records_max=500, share_error_text_bytes_max=16)


def make(*, attempts: int = 3, reset: str = "earliest", log_start: int = 0, high_watermark: int = 100,
         limits: Limits = LIMITS) -> SharePartition:
    settings = ShareGroupSettings(visibility_timeout_ms=VISIBILITY_MS, max_delivery_attempts=attempts,
                                  auto_offset_reset=reset)
    share_partition = SharePartition("orders", 0, settings, limits)
    share_partition.observe_log(log_start, high_watermark)
    return share_partition


def offsets(acquisition) -> list[tuple[int, int]]:
    """(offset, delivery count) of every acquired record."""
    return [(offset, ranged.delivery_count) for ranged in acquisition.acquired
            for offset in range(ranged.first_offset, ranged.last_offset + 1)]


def answer(share_partition, member: str, first: int, last: int, kind: str, now_ns: int, **extra):
    result = share_partition.acknowledge(member, ShareAcknowledgement(first_offset=first, last_offset=last, kind=kind,
                                                                      **extra), now_ns)
    share_partition.invariants()
    return result


def states(share_partition) -> dict[int, str]:
    return {offset: record.state for offset, record in share_partition.records.items()}


# ---------------------------------------------------------------------------- where it starts


def test_the_start_is_the_log_start_for_earliest_and_the_high_watermark_for_latest():
    earliest = make(log_start=5, high_watermark=9)
    assert (earliest.start_offset, earliest.end_offset) == (5, 5)
    latest = make(reset="latest", log_start=5, high_watermark=9)
    assert (latest.start_offset, latest.end_offset) == (9, 9)
    assert offsets(latest.acquire("a", 10, 0)) == [], "latest: what was there before the group is not delivered"


def test_nothing_is_handed_out_at_or_above_the_high_watermark():
    share_partition = make(high_watermark=3)
    acquisition = share_partition.acquire("a", 10, 0)
    assert offsets(acquisition) == [(0, 1), (1, 1), (2, 1)]
    assert acquisition.lock_deadline_ns == VISIBILITY_MS * MS
    assert offsets(share_partition.acquire("b", 10, 0)) == [], "offset 3 is not visible yet"
    share_partition.observe_log(0, 5)
    assert offsets(share_partition.acquire("b", 10, 0)) == [(3, 1), (4, 1)]
    share_partition.invariants()


def test_max_records_bounds_one_acquire():
    share_partition = make()
    assert offsets(share_partition.acquire("a", 2, 0)) == [(0, 1), (1, 1)]
    assert offsets(share_partition.acquire("b", 2, 0)) == [(2, 1), (3, 1)]


# ---------------------------------------------------------------------------- locks


def test_an_expired_lock_makes_the_record_available_and_the_next_delivery_counts_two():
    share_partition = make(high_watermark=2)
    share_partition.acquire("a", 10, 0)
    assert offsets(share_partition.acquire("b", 10, VISIBILITY_MS * MS - 1)) == [], "locked until the deadline"
    redelivered = share_partition.acquire("b", 10, VISIBILITY_MS * MS)
    assert offsets(redelivered) == [(0, 2), (1, 2)]
    assert share_partition.records[0].holder == "b"
    share_partition.invariants()


def test_expire_locks_releases_only_what_is_due_and_reports_it():
    share_partition = make(high_watermark=4)
    share_partition.acquire("a", 2, 0)
    share_partition.acquire("b", 2, 500 * MS)
    assert share_partition.expire_locks(999 * MS) is False
    assert share_partition.expire_locks(1000 * MS) is True
    assert states(share_partition) == {0: AVAILABLE, 1: AVAILABLE, 2: ACQUIRED, 3: ACQUIRED}
    assert share_partition.records[2].holder == "b"
    share_partition.invariants()


def test_redeliveries_come_first_lowest_offset_first_then_new_offsets():
    share_partition = make(high_watermark=6)
    share_partition.acquire("a", 4, 0)
    answer(share_partition, "a", 3, 3, "release", 0)
    answer(share_partition, "a", 1, 1, "release", 0)
    assert offsets(share_partition.acquire("b", 3, 0)) == [(1, 2), (3, 2), (4, 1)]


def test_renew_extends_the_lock_by_the_visibility_timeout():
    share_partition = make(high_watermark=1)
    share_partition.acquire("a", 1, 0)
    result = answer(share_partition, "a", 0, 0, "renew", 800 * MS)
    assert (result.error, result.lock_deadline_ms) == (ErrorCode.NONE, 1800)
    assert offsets(share_partition.acquire("b", 1, 1500 * MS)) == [], "the renewed lock still holds"
    assert offsets(share_partition.acquire("b", 1, 1800 * MS)) == [(0, 2)]


def test_a_member_that_left_gives_its_records_back_with_their_counts():
    share_partition = make(high_watermark=3)
    share_partition.acquire("a", 2, 0)
    share_partition.acquire("b", 1, 0)
    assert share_partition.release_member("a", 10 * MS) is True
    assert share_partition.release_member("a", 10 * MS) is False
    assert states(share_partition) == {0: AVAILABLE, 1: AVAILABLE, 2: ACQUIRED}
    assert offsets(share_partition.acquire("c", 5, 10 * MS)) == [(0, 2), (1, 2)]


# ---------------------------------------------------------------------------- answers


def test_accept_moves_the_start_past_every_leading_finished_record():
    share_partition = make(high_watermark=4)
    share_partition.acquire("a", 4, 0)
    answer(share_partition, "a", 1, 2, "accept", 0)
    assert share_partition.start_offset == 0, "offset 0 is still in flight"
    answer(share_partition, "a", 0, 0, "accept", 0)
    assert (share_partition.start_offset, states(share_partition)) == (3, {3: ACQUIRED})


def test_a_stuck_record_holds_the_start_back_but_not_the_records_after_it():
    share_partition = make(high_watermark=5)
    share_partition.acquire("slow", 1, 0)
    taken = offsets(share_partition.acquire("fast", 10, 0))
    assert taken == [(1, 1), (2, 1), (3, 1), (4, 1)]
    answer(share_partition, "fast", 1, 4, "accept", 0)
    assert (share_partition.start_offset, share_partition.end_offset) == (0, 5)


def test_an_answer_for_a_record_the_member_does_not_hold_changes_nothing_in_its_range():
    share_partition = make(high_watermark=4)
    share_partition.acquire("a", 2, 0)
    share_partition.acquire("b", 2, 0)
    before = states(share_partition)
    result = answer(share_partition, "a", 1, 2, "accept", 0)
    assert result.error == ErrorCode.INVALID_RECORD_STATE
    assert "@2 is not locked to a" in result.error_message
    assert states(share_partition) == before, "offset 1 was held by a, but the range is refused whole"
    assert answer(share_partition, "a", 9, 9, "accept", 0).error == ErrorCode.INVALID_RECORD_STATE


def test_a_late_accept_from_the_previous_holder_never_answers_the_new_delivery():
    share_partition = make(high_watermark=1)
    share_partition.acquire("a", 1, 0)
    assert offsets(share_partition.acquire("b", 1, VISIBILITY_MS * MS)) == [(0, 2)]
    assert answer(share_partition, "a", 0, 0, "accept", VISIBILITY_MS * MS).error == ErrorCode.INVALID_RECORD_STATE
    assert share_partition.records[0].holder == "b"
    assert answer(share_partition, "b", 0, 0, "accept", VISIBILITY_MS * MS).error == ErrorCode.NONE
    assert share_partition.start_offset == 1


def test_an_answer_after_the_deadline_is_refused_even_before_any_tick_expired_it():
    share_partition = make(high_watermark=1)
    share_partition.acquire("a", 1, 0)
    assert answer(share_partition, "a", 0, 0, "accept", VISIBILITY_MS * MS).error == ErrorCode.INVALID_RECORD_STATE
    assert states(share_partition) == {0: AVAILABLE}


def test_a_release_with_a_delay_is_not_redelivered_before_the_delay():
    share_partition = make(high_watermark=2)
    share_partition.acquire("a", 2, 0)
    answer(share_partition, "a", 0, 0, "release", 100 * MS, delay_ms=500, error="busy downstream")
    assert share_partition.records[0].last_error == "busy downstream"
    assert offsets(share_partition.acquire("b", 5, 599 * MS)) == []
    assert share_partition.can_acquire(599 * MS) is False
    assert share_partition.can_acquire(600 * MS) is True
    assert offsets(share_partition.acquire("b", 5, 600 * MS)) == [(0, 2)]


def test_malformed_answers_are_refused_without_change():
    share_partition = make(high_watermark=2)
    share_partition.acquire("a", 2, 0)
    for acknowledgement, words in [
        (dict(first=0, last=0, kind="ignore"), "kind must be one of"),
        (dict(first=1, last=0, kind="accept"), "first <= last"),
        (dict(first=0, last=0, kind="release", delay_ms=LIMITS.share_release_delay_max_ms + 1), "delay_ms"),
        (dict(first=0, last=0, kind="release", delay_ms=-1), "delay_ms"),
    ]:
        first, last = acknowledgement.pop("first"), acknowledgement.pop("last")
        result = answer(share_partition, "a", first, last, now_ns=0, **acknowledgement)
        assert result.error == ErrorCode.INVALID_REQUEST and words in result.error_message
    assert states(share_partition) == {0: ACQUIRED, 1: ACQUIRED}


def test_error_text_is_cut_to_its_byte_limit_on_a_character_boundary():
    share_partition = make(high_watermark=1)
    share_partition.acquire("a", 1, 0)
    answer(share_partition, "a", 0, 0, "release", 0, error="ééééééééé-and-more")  # 2 bytes each
    assert share_partition.records[0].last_error == "éééééééé"
    assert len(share_partition.records[0].last_error.encode()) <= LIMITS.share_error_text_bytes_max


# ---------------------------------------------------------------------------- dead letters


def test_a_reject_dead_letters_at_once_and_archiving_moves_the_start():
    share_partition = make(high_watermark=2)
    share_partition.acquire("a", 2, 5 * MS)
    answer(share_partition, "a", 0, 0, "reject", 7 * MS, error="not json")
    answer(share_partition, "a", 1, 1, "accept", 7 * MS)
    assert states(share_partition) == {0: DEAD_LETTERING, 1: ACCEPTED}
    (item,) = share_partition.take_new_dead_letters("g")
    assert (item.group_id, item.topic, item.partition, item.offset, item.reason, item.attempts, item.last_error,
            item.first_delivery_ms, item.dead_lettered_ms) == ("g", "orders", 0, 0, REJECTED, 1, "not json", 5, 7)
    assert share_partition.take_new_dead_letters("g") == [], "each dead letter is handed over once"
    assert share_partition.start_offset == 0, "a record on its way to the dead-letter topic holds the start"
    share_partition.archive([0])
    assert (share_partition.start_offset, share_partition.records) == (2, {})


def test_the_last_attempt_released_or_expired_goes_to_the_dead_letter_path():
    share_partition = make(attempts=2, high_watermark=2)
    share_partition.acquire("a", 2, 0)
    answer(share_partition, "a", 0, 1, "release", 0, error="boom")
    assert offsets(share_partition.acquire("a", 2, 0)) == [(0, 2), (1, 2)]
    answer(share_partition, "a", 0, 0, "release", 0, error="boom again")
    share_partition.expire_locks(VISIBILITY_MS * MS)
    assert states(share_partition) == {0: DEAD_LETTERING, 1: DEAD_LETTERING}
    items = share_partition.take_new_dead_letters("g")
    assert [(item.offset, item.reason, item.attempts, item.last_error) for item in items] == [
        (0, MAX_ATTEMPTS, 2, "boom again"), (1, MAX_ATTEMPTS, 2, "boom")]


def test_an_available_record_already_at_its_limit_is_dead_lettered_instead_of_acquired():
    share_partition = make(attempts=1, high_watermark=2)
    share_partition.acquire("a", 2, 0)
    restored = SharePartition.restore("orders", 0, share_partition.settings, LIMITS, share_partition.stored())
    assert states(restored) == {0: AVAILABLE, 1: AVAILABLE}, "after a restart the locks are void"
    assert offsets(restored.acquire("b", 5, 0)) == []
    assert [item.offset for item in restored.take_new_dead_letters("g")] == [0, 1]
    restored.invariants()


# ---------------------------------------------------------------------------- bounds


def test_the_in_flight_window_is_bounded_and_reopens_as_the_start_moves():
    share_partition = make(high_watermark=100)
    assert len(offsets(share_partition.acquire("a", 100, 0))) == LIMITS.share_records_in_flight_max
    assert offsets(share_partition.acquire("b", 100, 0)) == [], "the window is full"
    assert share_partition.can_acquire(0) is False
    answer(share_partition, "a", 0, 2, "accept", 0)
    assert offsets(share_partition.acquire("b", 100, 0)) == [(8, 1), (9, 1), (10, 1)]
    share_partition.invariants()


def test_retention_past_the_start_forgets_the_deleted_records():
    share_partition = make(high_watermark=6)
    share_partition.acquire("a", 4, 0)
    share_partition.observe_log(3, 6)
    assert (share_partition.start_offset, sorted(share_partition.records)) == (3, [3])
    share_partition.observe_log(10, 12)
    assert (share_partition.start_offset, share_partition.end_offset, share_partition.records) == (10, 10, {})
    share_partition.invariants()


# ---------------------------------------------------------------------------- durability


def test_stored_form_is_runs_and_restores_counts_errors_and_states_with_locks_void():
    share_partition = make(attempts=5, high_watermark=8)
    share_partition.acquire("a", 8, 0)
    answer(share_partition, "a", 1, 1, "accept", 0)
    answer(share_partition, "a", 2, 3, "release", 0, delay_ms=5000, error="later")
    answer(share_partition, "a", 4, 4, "reject", 0, error="poison")
    stored = share_partition.stored()
    assert (stored["start"], stored["end"]) == (0, 8)
    assert len(stored["runs"]) == 5, "consecutive offsets in the same state share one run"
    restored = SharePartition.restore("orders", 0, share_partition.settings, LIMITS, stored)
    assert states(restored) == {0: AVAILABLE, 1: ACCEPTED, 2: AVAILABLE, 3: AVAILABLE, 4: DEAD_LETTERING,
                                5: AVAILABLE, 6: AVAILABLE, 7: AVAILABLE}
    assert [restored.records[offset].delivery_count for offset in (0, 2, 5)] == [1, 1, 1]
    assert restored.records[2].last_error == "later"
    assert [item.offset for item in restored.take_new_dead_letters("g")] == [4], "restored dead letters are resumed"
    assert offsets(restored.acquire("b", 10, 0)) == [(0, 2), (5, 2), (6, 2), (7, 2)], "2 and 3 wait out their delay"
    assert offsets(restored.acquire("c", 10, 4999 * MS)) == [(0, 3), (5, 3), (6, 3), (7, 3)], "b's locks expired"
    assert offsets(restored.acquire("c", 10, 5000 * MS)) == [(2, 2), (3, 2)]
    restored.invariants()


# ---------------------------------------------------------------------------- dead-letter records


def test_a_dead_letter_record_keeps_key_value_and_headers_after_the_railmq_headers():
    source = bytes(encode_batch([(0, b"k0", b"v0", None), (3, b"k1", b"v1", [("trace", b"t1")])], 1_000,
                                base_offset=40))
    found = source_records(source, {41})
    assert found == {41: (1_003, b"k1", b"v1", [("trace", b"t1")])}
    from actors.dead_letter_records import DeadLetterItem

    item = DeadLetterItem("g", "orders", 0, 41, REJECTED, 2, "bad", 1_010, 1_020)
    gone = DeadLetterItem("g", "orders", 0, 39, MAX_ATTEMPTS, 5, "", 1_000, 1_030)
    batch = dead_letter_batch([item, gone], found, producer_id=7, producer_epoch=0, base_sequence=12)
    header = parse_header(batch)
    assert (header.producer_id, header.base_sequence, header.record_count) == (7, 12, 2)
    (delta, key, value, headers), (gone_delta, gone_key, gone_value, gone_headers) = decode_records(batch)
    assert (header.first_timestamp_ms + delta, key, value) == (1_020, b"k1", b"v1")
    assert headers == dead_letter_headers(item, 1_003) + [("trace", b"t1")]
    assert dict(headers) == {
        "railmq.dlq.source_topic": b"orders", "railmq.dlq.source_partition": b"0", "railmq.dlq.source_offset": b"41",
        "railmq.dlq.group": b"g", "railmq.dlq.attempts": b"2", "railmq.dlq.reason": b"rejected",
        "railmq.dlq.last_error": b"bad", "railmq.dlq.source_timestamp_ms": b"1003",
        "railmq.dlq.first_delivery_ms": b"1010", "railmq.dlq.dead_lettered_ms": b"1020", "trace": b"t1"}
    assert (gone_key, gone_value) == (None, None), "a source deleted by retention still takes its place"
    assert dict(gone_headers)["railmq.dlq.source_timestamp_ms"] == b"-1"


# ---------------------------------------------------------------------------- property


class LockModel:
    """Who holds which lock until when, learned only from the share-partition's answers."""

    def __init__(self) -> None:
        self.holders: dict[int, tuple[str, int]] = {}
        self.counts: dict[int, int] = {}
        self.accepted: dict[int, str] = {}

    def held_by_other(self, offset: int, member: str, now_ns: int) -> bool:
        holder = self.holders.get(offset)
        return holder is not None and holder[0] != member and now_ns < holder[1]

    def holds(self, offset: int, member: str, now_ns: int) -> bool:
        holder = self.holders.get(offset)
        return holder is not None and holder[0] == member and now_ns < holder[1]


MEMBERS = ("a", "b", "c")
steps = st.lists(st.one_of(
    st.tuples(st.just("acquire"), st.sampled_from(MEMBERS), st.integers(1, 5)),
    st.tuples(st.just("answer"), st.sampled_from(MEMBERS), st.integers(0, 12), st.integers(0, 2),
              st.sampled_from(["accept", "release", "reject", "renew"])),
    st.tuples(st.just("wait"), st.integers(1, 700)),
    st.tuples(st.just("leave"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("grow"), st.integers(1, 4)),
    st.tuples(st.just("archive"),),
    st.tuples(st.just("restart"),),
), max_size=60)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_two_members_never_hold_one_lock_and_every_delivery_counts_one_more(script):
    share_partition = make(attempts=4, high_watermark=4)
    model = LockModel()
    now_ns = 0
    for step in script:
        kind = step[0]
        if kind == "acquire":
            _, member, count = step
            acquisition = share_partition.acquire(member, count, now_ns)
            for offset, delivery in offsets(acquisition):
                assert not model.held_by_other(offset, member, now_ns), f"@{offset} handed to {member} while locked"
                assert offset not in model.accepted, f"@{offset} was accepted, yet delivered again"
                assert delivery == model.counts.get(offset, 0) + 1, f"@{offset}: delivery count skipped"
                assert offset < share_partition.high_watermark
                model.counts[offset] = delivery
                model.holders[offset] = (member, acquisition.lock_deadline_ns)
        elif kind == "answer":
            _, member, first, width, how = step
            last = first + width
            result = answer(share_partition, member, first, last, how, now_ns)
            all_held = all(model.holds(offset, member, now_ns) for offset in range(first, last + 1))
            assert (result.error == ErrorCode.NONE) == all_held, f"{how} {first}..{last} by {member}: {result}"
            for offset in range(first, last + 1) if all_held else ():
                if how == "renew":
                    model.holders[offset] = (member, result.lock_deadline_ms * MS)
                    continue
                del model.holders[offset]
                if how == "accept":
                    model.accepted[offset] = member
        elif kind == "wait":
            now_ns += step[1] * MS
        elif kind == "leave":
            share_partition.release_member(step[1], now_ns)
            model.holders = {offset: holder for offset, holder in model.holders.items() if holder[0] != step[1]}
        elif kind == "grow":
            share_partition.observe_log(0, share_partition.high_watermark + step[1])
        elif kind == "archive":
            share_partition.archive([item.offset for item in share_partition.take_new_dead_letters("g")])
        else:
            share_partition = SharePartition.restore("orders", 0, share_partition.settings, LIMITS,
                                                     share_partition.stored())
            share_partition.observe_log(0, max(share_partition.end_offset, 4))
            model.holders.clear()
        share_partition.invariants()
        for offset, record in share_partition.records.items():
            assert record.delivery_count == model.counts.get(offset, 0), f"@{offset}: count differs from deliveries"
    assert all(offset < share_partition.end_offset for offset in model.accepted)


@pytest.mark.parametrize("bad", [dict(visibility_timeout_ms=50), dict(max_delivery_attempts=0),
                                 dict(auto_offset_reset="middle"), dict(dead_letter_topic="no/slash")])
def test_group_settings_outside_their_bounds_are_refused(bad):
    from actors.share_group_membership import check_settings

    assert check_settings(ShareGroupSettings(**bad), Limits()) is not None
    assert check_settings(ShareGroupSettings(), Limits()) is None


def test_the_largest_share_partition_the_limits_admit_fits_one_entry_of_the_group_quorums_log():
    """A share-partition is stored as one record, proposed as one Raft entry: every record in
    flight released with the longest error text (each text its own, so no two runs merge) must
    fit, or the quorum refuses the entry and the coordinator rebuilds, again and again."""
    import msgspec

    from actors.raft import RaftConfig

    limits = Limits()
    window = limits.share_records_in_flight_max
    share_partition = make(limits=limits, log_start=10**12, high_watermark=10**12 + window, attempts=100)
    share_partition.acquire("member-" + "m" * 40, window, 0)
    for offset in range(10**12, 10**12 + window):
        text = f"{offset}: " + "e" * limits.share_error_text_bytes_max
        share_partition.acknowledge("member-" + "m" * 40, ShareAcknowledgement(
            first_offset=offset, last_offset=offset, kind="release", error=text, delay_ms=3_600_000), 0)

    key = "share-partition/" + "g" * 255 + "/" + "t" * 249 + "/999"
    record = msgspec.msgpack.encode([[0, key, share_partition.stored()]])

    assert len(share_partition.records) == window
    assert len(record) <= RaftConfig(node_id=1, voters={1: "a"}).entry_bytes_max, f"{len(record):,} bytes"
