"""Histories that break the promise where the checker once looked away: a partition it has no
final read of, a record a consumer read that the log later dropped, a record in the log that a
group skipped though its send was never acknowledged, and a group that took its partitions and
never delivered a record. Each must fail the verdict."""

from __future__ import annotations

from tests.chaos.test_checker import History


def test_acknowledged_sends_on_a_partition_without_a_final_read_are_unchecked_not_safe():
    # The final read of partition 1 could not finish (its leader never came back): nothing proves
    # that b0 survived, so the verdict may not call the run clean.
    history = History().send("a0", 0).send("b0", 0, key="b", partition=1)
    history.event("heal").final_read((0, "k", "a0"))
    result = history.check()
    assert result.lost == 0
    assert result.unchecked == 1
    assert result.unchecked_partitions == [("t", 1)]
    assert not result.valid
    assert any("could not be checked" in sentence and "t/1" in sentence for sentence in result.violations)


def test_a_history_with_acknowledged_sends_and_no_final_read_at_all_is_unchecked():
    result = History().send("a0", 0).send("a1", 1).check()
    assert result.unchecked == 2 and not result.valid


def test_a_send_judged_lost_by_the_polls_is_lost_not_unchecked():
    history = History().send("a0", 0).send("a1", 1).poll((0, 1, "k", "a1"))
    result = history.check()
    assert [message.value for message in result.lost_messages] == ["a0"]
    assert result.unchecked == 1  # a1 was read once, but no final read shows it survived


def test_indeterminate_and_failed_sends_need_no_final_read():
    history = History().send("a0", 0, outcome="info").send("a1", 0, outcome="fail")
    result = history.check()
    assert result.unchecked == 0 and result.valid, result.violations


def test_an_empty_history_checks_nothing_and_says_so_only_through_its_counts():
    result = History().check()
    assert (result.sends, result.acknowledged, result.unchecked) == (0, 0, 0)


def test_a_consumed_record_of_an_unacknowledged_send_missing_from_the_final_read_is_lost():
    # The send timed out (info), yet a consumer read it: it was committed. A log that ends before
    # it after the recovery window dropped a committed record.
    history = History().send("a0", 0, outcome="info").poll((0, 0, "k", "a0"))
    history.event("heal").final_read()
    result = history.check()
    assert result.lost == 1
    [lost] = result.lost_messages
    assert (lost.partition, lost.offset, lost.value) == (0, 0, "a0")
    assert "g1/consumer-1" in lost.reason
    assert not result.valid


def test_an_unacknowledged_send_nobody_read_may_be_missing_from_the_final_read():
    history = History().send("a0", 0, outcome="info").event("heal").final_read()
    result = history.check()
    assert result.lost == 0 and result.valid, result.violations


def test_a_consumed_record_lost_in_a_teaching_run_is_reported_not_judged():
    history = History(expect_loss=True).send("a0", 0, outcome="info").poll((0, 0, "k", "a0"))
    result = history.event("heal").final_read().check()
    assert result.lost == 1 and result.valid, result.violations


def test_a_record_in_the_log_of_an_unacknowledged_send_that_the_group_skipped_is_unseen():
    # a0 timed out but landed at offset 0; the group committed past it and polled only a1.
    history = History().send("a0", 0, outcome="info").send("a1", 1)
    history.poll((0, 1, "k", "a1")).commit(2).event("heal")
    history.final_read((0, "k", "a0"), (1, "k", "a1"))
    result = history.check()
    assert result.unseen == 1
    [unseen] = result.unseen_messages
    assert (unseen.group, unseen.partition, unseen.offset, unseen.value) == ("g1", 0, 0, "a0")
    assert not result.valid


def test_an_unacknowledged_send_absent_from_the_log_need_not_be_seen():
    history = History().send("a0", None, outcome="info").send("a1", 0)
    history.poll((0, 0, "k", "a1")).event("heal").final_read((0, "k", "a1"))
    result = history.check()
    assert result.unseen == 0 and result.valid, result.violations


def test_a_group_that_was_assigned_its_partitions_and_never_polled_leaves_every_value_unseen():
    # The group's member took partition 0 and then delivered nothing, for the whole run.
    history = History().send("a0", 0)
    history.event("ok", f="assign", process="g1/consumer-1", group="g1", member="m-1", generation=1,
                  topic="t", partitions=[0])
    history.event("heal").final_read((0, "k", "a0"))
    result = history.check()
    assert result.unseen == 1 and result.unseen_by_group == {"g1": 1}
    assert not result.valid and any("never polled" in sentence for sentence in result.violations)
