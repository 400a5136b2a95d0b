"""The checker's rules, one hand-written history per anomaly, each proven to fire (and a clean
history that passes), plus the CLI's exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaos.checker import ANOMALIES_PER_KIND_MAX, check_file, check_history, summary_dict
from chaos.history import MalformedHistory, SendLine

REPOSITORY = Path(__file__).resolve().parents[2]
MS = 1_000_000  # nanoseconds per millisecond


class History:
    """A history written by hand: each call appends lines, with a clock that only moves forward."""

    def __init__(self, **config: Any) -> None:
        self.now_ns = 0
        self.lines: list[dict[str, Any]] = [
            {"type": "config", "time_ns": 0, "scenario": "hand", "seed": 1, **config}
        ]

    def tick(self, at_ns: int | None = None) -> int:
        self.now_ns = at_ns if at_ns is not None else self.now_ns + 1
        return self.now_ns

    def invoke(self, value: str, *, key: str | None = "k", topic: str = "t", process: str = "producer-1",
               at_ns: int | None = None) -> "History":
        return self.event("invoke", f="send", at_ns=at_ns, process=process, topic=topic, key=key, value=value)

    def complete(self, value: str, outcome: str = "ok", *, partition: int | None = 0,
                 offset: int | None = None, key: str | None = "k", process: str = "producer-1",
                 at_ns: int | None = None) -> "History":
        if outcome == "ok":
            result = {"partition": partition, "offset": offset}
        else:
            result = {"error": "NOT_ENOUGH_REPLICAS" if outcome == "fail" else "timeout"}
        return self.event(outcome, f="send", at_ns=at_ns, process=process, topic="t", key=key, value=value,
                          **result)

    def send(self, value: str, offset: int | None, outcome: str = "ok", **fields: Any) -> "History":
        """An invoke and its completion, back to back."""
        partition = fields.pop("partition", 0)
        self.invoke(value, **fields)
        return self.complete(value, outcome, partition=partition, offset=offset, **fields)

    def poll(self, *records: tuple[int, int, str, str], group: str = "g1", member: str = "m-1",
             generation: int = 1, process: str = "g1/consumer-1") -> "History":
        return self.event("ok", f="poll", process=process, group=group, member=member, generation=generation,
                          topic="t", records=[list(record) for record in records])

    def commit(self, offset: int, *, partition: int = 0, outcome: str = "ok", group: str = "g1",
               process: str = "g1/consumer-1", invoke: bool = True, complete: bool = True) -> "History":
        fields = {"f": "commit", "process": process, "group": group, "member": "m-1", "generation": 1,
                  "topic": "t", "offsets": {str(partition): offset}}
        if invoke:
            self.event("invoke", **fields)
        if complete:
            self.event(outcome, **fields)
        return self

    def final_read(self, *entries: tuple[int, str, str], partition: int = 0) -> "History":
        return self.event("final-read", topic="t", partition=partition, entries=[list(e) for e in entries])

    def replica_log(self, replica: str, high_watermark: int, *entries: tuple[int, str, str]) -> "History":
        return self.event("replica-log", topic="t", partition=0, replica=replica,
                          high_watermark=high_watermark, entries=[list(entry) for entry in entries])

    def event(self, kind: str, *, at_ns: int | None = None, **fields: Any) -> "History":
        self.lines.append({"type": kind, "time_ns": self.tick(at_ns), **fields})
        return self

    def check(self):
        return check_history(self.lines)


def clean_history() -> History:
    """Two keys, two partitions, one group that reads everything once, a healed fault, a tidy exit."""
    history = History()
    history.send("a0", 0, key="a").send("a1", 1, key="a").send("b0", 0, key="b", partition=1)
    history.poll((0, 0, "a", "a0"), (1, 0, "b", "b0")).poll((0, 1, "a", "a1"))
    history.commit(2).event("heal")
    history.final_read((0, "a", "a0"), (1, "a", "a1")).final_read((0, "b", "b0"), partition=1)
    history.replica_log("n1", 2, (0, "a", "a0"), (1, "a", "a1"))
    history.replica_log("n2", 2, (0, "a", "a0"), (1, "a", "a1"))
    return history.event("hygiene", leftover_processes=[], leftover_shm=[])


def test_a_clean_history_is_valid_and_counts_what_happened():
    result = clean_history().check()
    assert result.valid, result.violations
    assert result.violations == []
    assert (result.sends, result.acknowledged, result.polls, result.deliveries) == (3, 3, 2, 3)
    assert (result.lost, result.phantom, result.failed_reads, result.inconsistent_offsets) == (0, 0, 0, 0)
    assert (result.order_violations, result.poll_violations, result.commit_regressions) == (0, 0, 0)
    assert (result.divergences, result.unseen, result.duplicates) == (0, 0, 0)
    assert result.healed and result.scenario == "hand" and result.seed == 1


def test_an_acknowledged_send_missing_from_the_final_read_is_lost_and_named():
    history = History().send("a0", 0).send("a1", 1).final_read((0, "k", "a0"))
    result = history.check()
    assert result.lost == 1
    [lost] = result.lost_messages
    assert (lost.topic, lost.partition, lost.offset, lost.key, lost.value) == ("t", 0, 1, "k", "a1")
    assert "missing" in lost.reason
    assert not result.valid
    assert "lost" in result.violations[0] and "a1" in result.violations[0]


def test_an_acknowledged_send_found_at_another_offset_is_lost_and_inconsistent():
    history = History().send("a0", 0).send("a1", 1).final_read((0, "k", "a0"), (2, "k", "a1"))
    result = history.check()
    assert result.lost == 1 and "offset 2" in result.lost_messages[0].reason
    assert result.inconsistent_offsets == 1
    [moved] = result.value_conflicts
    assert moved.value == "a1" and moved.positions == [("t", 0, 1), ("t", 0, 2)]
    assert not result.valid


def test_without_a_final_read_an_unread_send_below_the_highest_polled_offset_is_lost():
    history = History().send("a0", 0).send("a1", 1).send("a2", 2).send("a3", 3)
    history.poll((0, 1, "k", "a1"), (0, 2, "k", "a2"))
    result = history.check()
    # a0 sits below offset 2, which a poll reached, and nobody ever read it: lost (Jepsen's rule).
    # a3 sits above every polled offset: not yet judged lost, only unseen.
    assert [message.value for message in result.lost_messages] == ["a0"]
    assert result.poll_violations == 0


def test_a_value_no_send_invoked_is_a_phantom():
    history = History().send("a0", 0).poll((0, 0, "k", "a0"), (0, 1, "k", "ghost"))
    result = history.check()
    assert result.phantom == 1
    [phantom] = result.phantom_reads
    assert (phantom.value, phantom.partition, phantom.offset) == ("ghost", 0, 1)
    assert phantom.reader == "g1/consumer-1"
    assert not result.valid and any("phantom" in sentence for sentence in result.violations)


def test_reading_the_value_of_a_definitely_failed_send_is_a_failed_read():
    history = History().send("a0", None, outcome="fail").final_read((0, "k", "a0"))
    result = history.check()
    assert result.failed_sends == 1
    assert result.failed_reads == 1 and result.failed_read_records[0].reader == "final-read"
    assert not result.valid


def test_an_info_send_is_neither_lost_nor_failed_whether_or_not_it_appears():
    history = History().send("a0", 0)
    history.send("maybe-in", None, outcome="info").send("maybe-out", None, outcome="info")
    history.final_read((0, "k", "a0"), (1, "k", "maybe-in"))
    result = history.check()
    assert result.indeterminate_sends == 2
    assert (result.lost, result.failed_reads, result.phantom) == (0, 0, 0)
    assert result.valid, result.violations


def test_an_unanswered_send_counts_as_indeterminate():
    result = History().invoke("a0").check()
    assert (result.sends, result.indeterminate_sends, result.lost) == (1, 1, 0)


def test_two_values_at_one_offset_are_inconsistent_offsets():
    history = History().send("a0", 0, key="x").send("a1", 1, key="y")
    history.send("a2", None, outcome="info", key="z")
    history.poll((0, 0, "x", "a0"), (0, 1, "z", "a2"))  # offset 1 was acknowledged as a1
    result = history.check()
    assert result.inconsistent_offsets == 1
    [clash] = result.offset_conflicts
    assert (clash.topic, clash.partition, clash.offset, clash.values) == ("t", 0, 1, ["a1", "a2"])
    assert (result.lost, result.phantom, result.failed_reads) == (0, 0, 0)
    assert not result.valid and any("inconsistent" in sentence for sentence in result.violations)


def test_one_value_at_two_offsets_is_an_inconsistent_offset():
    history = History().send("a0", 0).send("a1", 1, key="j").poll((0, 0, "k", "a0"), (0, 1, "j", "a1"))
    history.poll((0, 2, "k", "a0"), group="g2", process="g2/consumer-1")
    result = history.check()
    assert result.inconsistent_offsets == 1
    assert result.value_conflicts[0].positions == [("t", 0, 0), ("t", 0, 2)]
    assert not result.valid


def test_per_key_order_breaks_when_a_later_send_lands_before_an_earlier_acknowledged_one():
    history = History().send("first", 1).send("second", 0)
    result = history.check()
    assert result.order_violations == 1
    [broken] = result.order_breaks
    assert (broken.earlier_value, broken.earlier_offset) == ("first", 1)
    assert (broken.later_value, broken.later_offset) == ("second", 0)
    assert not result.valid


def test_a_later_send_at_the_same_offset_as_an_earlier_acknowledged_one_is_out_of_order():
    result = History().send("first", 3).send("second", 3, key="k").check()
    assert result.order_violations == 1 and result.inconsistent_offsets == 1


def test_the_final_read_decides_order_over_the_acknowledged_offsets():
    history = History().send("first", 0).send("second", 1).final_read((0, "k", "second"), (1, "k", "first"))
    result = history.check()
    assert result.order_violations == 1  # besides the lost/moved reports for both values


def test_concurrent_sends_and_different_keys_may_land_in_any_order():
    history = History()
    history.invoke("x", at_ns=10).invoke("y", process="producer-2", at_ns=11)
    history.complete("y", offset=0, process="producer-2", at_ns=12).complete("x", offset=1, at_ns=13)
    history.send("other-key-first", 3, key="j").send("other-key-second", 2, key="i")
    result = history.check()
    assert result.order_violations == 0, result.order_breaks


def test_a_key_written_to_two_partitions_is_an_order_violation():
    history = History().send("a0", 0, partition=0).send("a1", 0, partition=1)
    result = history.check()
    assert result.order_violations == 1
    assert {result.order_breaks[0].earlier_partition, result.order_breaks[0].later_partition} == {0, 1}


def test_order_is_checked_in_n_log_n_against_the_running_maximum():
    # Sequential sends, each acknowledged before the next: offsets must rise. One out of place.
    history = History()
    offsets = list(range(200))
    offsets[150], offsets[151] = offsets[151], offsets[150]
    for index, offset in enumerate(offsets):
        history.send(f"v{index}", offset)
    result = history.check()
    assert result.order_violations == 1
    assert (result.order_breaks[0].earlier_value, result.order_breaks[0].later_value) == ("v150", "v151")


@pytest.mark.parametrize(
    ("offsets", "kind"),
    [([0, 1, 3], "skip"), ([0, 1, 1], "backwards"), ([4, 5, 2], "backwards")],
)
def test_polls_that_skip_or_go_backwards_within_a_generation_are_violations(offsets, kind):
    history = History()
    for index, offset in enumerate(offsets):
        history.send(f"v{index}", offset)
    history.poll(*[(0, offset, "k", f"v{index}") for index, offset in enumerate(offsets)][:2])
    history.poll((0, offsets[2], "k", "v2"))
    result = history.check()
    assert result.poll_violations == 1
    [broken] = result.poll_breaks
    assert (broken.previous_offset, broken.offset, broken.kind) == (offsets[1], offsets[2], kind)
    assert (broken.group, broken.member, broken.generation) == ("g1", "m-1", 1)
    assert not result.valid


def test_a_new_generation_or_another_member_may_start_anywhere():
    history = History().send("v0", 0).send("v1", 1)
    history.poll((0, 0, "k", "v0"), (0, 1, "k", "v1"))
    history.poll((0, 0, "k", "v0"), generation=2)  # rebalance: replays from the committed offset
    history.poll((0, 1, "k", "v1"), group="g2", member="m-9", process="g2/consumer-1")
    result = history.check()
    assert result.poll_violations == 0
    assert result.duplicates == 1 and result.duplicates_by_group["g1"].max_deliveries == 2


def test_a_commit_invoked_after_a_higher_commit_completed_must_not_regress():
    history = History().commit(5).commit(3)
    result = history.check()
    assert result.commit_regressions == 1
    [regression] = result.commit_breaks
    assert (regression.earlier_offset, regression.later_offset, regression.partition) == (5, 3, 0)
    assert not result.valid


def test_overlapping_and_failed_commits_do_not_regress():
    history = History()
    history.commit(5, complete=False, process="a")
    history.commit(3, invoke=False, process="b")  # only b's ok: its start is unknown
    history.commit(3, process="c", invoke=True, complete=False)
    history.commit(5, process="a", invoke=False)  # a completes after c was invoked: concurrent
    history.commit(3, process="c", invoke=False)
    history.commit(1, outcome="fail", process="d")
    history.commit(5, process="e")  # committing the same offset again is no regression
    result = history.check()
    assert result.commit_regressions == 0, result.commit_breaks


def test_replicas_that_differ_below_the_smaller_high_watermark_diverge():
    history = History()
    history.replica_log("n1", 3, (0, "k", "a"), (1, "k", "b"), (2, "k", "c"))
    history.replica_log("n2", 2, (0, "k", "a"), (1, "k", "X"))
    result = history.check()
    assert result.divergences == 1
    [divergence] = result.divergent_replicas
    assert (divergence.replica, divergence.other_replica, divergence.offset) == ("n1", "n2", 1)
    assert (divergence.entry, divergence.other_entry) == ([1, "k", "b"], [1, "k", "X"])
    assert not result.valid


def test_replicas_may_differ_above_the_smaller_high_watermark_and_below_a_later_log_start():
    history = History()
    history.replica_log("n1", 2, (0, "k", "a"), (1, "k", "b"), (2, "k", "uncommitted"))
    history.replica_log("n2", 3, (1, "k", "b"), (2, "k", "other"))  # log start 1: offset 0 deleted
    history.replica_log("n3", 0)
    result = history.check()
    assert result.divergences == 0, result.divergent_replicas


def test_a_replica_missing_committed_entries_diverges():
    history = History().replica_log("n1", 2, (0, "k", "a"), (1, "k", "b")).replica_log("n2", 2, (0, "k", "a"))
    assert history.check().divergences == 1


def test_acknowledged_values_a_group_never_polled_after_heal_are_unseen_violations():
    history = History().send("v0", 0).send("v1", 1).poll((0, 0, "k", "v0")).event("heal")
    result = history.check()
    assert result.unseen == 1 and result.unseen_by_group == {"g1": 1}
    assert result.unseen_messages[0].value == "v1"
    assert not result.valid and any("never polled" in sentence for sentence in result.violations)


def test_unseen_values_before_any_heal_are_reported_but_not_violations():
    history = History().send("v0", 0).send("v1", 1).poll((0, 0, "k", "v0"))
    result = history.final_read((0, "k", "v0"), (1, "k", "v1")).check()
    assert result.unseen == 1
    assert result.valid, result.violations


def test_lost_values_are_not_also_counted_as_unseen():
    history = History().send("v0", 0).send("v1", 1).poll((0, 0, "k", "v0")).event("heal")
    history.final_read((0, "k", "v0"))
    result = history.check()
    assert result.lost == 1 and result.unseen == 0


def test_duplicate_deliveries_are_counted_per_group_with_rate_and_maximum():
    history = History().send("v0", 0).send("v1", 1)
    history.poll((0, 0, "k", "v0"), (0, 1, "k", "v1"))
    history.poll((0, 0, "k", "v0"), (0, 1, "k", "v1"), generation=2)
    history.poll((0, 0, "k", "v0"), generation=3)
    result = history.final_read((0, "k", "v0"), (1, "k", "v1")).check()
    stats = result.duplicates_by_group["g1"]
    assert (stats.deliveries, stats.distinct, stats.duplicates, stats.max_deliveries) == (5, 2, 3, 3)
    assert stats.rate == pytest.approx(1.5)
    assert (result.duplicates, result.duplicate_max, result.duplicate_rate) == (3, 3, pytest.approx(1.5))
    assert result.valid  # at-least-once delivery is allowed to duplicate


def test_failover_time_runs_from_a_leader_fault_to_the_next_acknowledged_send_on_its_partition():
    history = History()
    history.event("fault", nemesis="kill", target="replica/t/0/n1", role="leader", topic="t", partition=0,
                  phase="start", at_ns=1000 * MS)
    history.send("elsewhere", 0, partition=1, key="j", at_ns=1100 * MS)
    history.invoke("x", at_ns=1200 * MS).complete("x", offset=0, at_ns=1250 * MS)
    history.event("fault", nemesis="pause", target="replica/t/0/n2", role="leader", topic="t", partition=0,
                  phase="start", at_ns=2000 * MS)
    history.invoke("y", at_ns=2010 * MS).complete("y", offset=1, at_ns=2050 * MS)
    history.event("fault", nemesis="kill", target="replica/t/0/n3", role="follower", topic="t", partition=0,
                  phase="start", at_ns=3000 * MS)
    history.event("fault", nemesis="kill", target="replica/t/1/n1", role="leader", topic="t", partition=1,
                  phase="start", at_ns=4000 * MS)
    history.final_read((0, "k", "x"), (1, "k", "y")).final_read((0, "j", "elsewhere"), partition=1)
    result = history.check()
    assert result.faults == 4
    recovered = [(sample.nemesis, sample.failover_ms) for sample in result.failover_samples]
    assert recovered == [("kill", 250.0), ("pause", 50.0), ("kill", None)]
    assert result.failovers_unrecovered == 1
    assert (result.failover_ms_p50, result.failover_ms_p99, result.failover_ms_max) == (50.0, 250.0, 250.0)
    assert result.valid


def test_leftover_processes_or_shared_memory_segments_are_violations():
    history = History().event("hygiene", leftover_processes=[{"pid": 4242, "name": "railmq-replica"}],
                              leftover_shm=["/railmq-ring-7"])
    result = history.check()
    assert not result.valid
    assert result.leftover_shm == ["/railmq-ring-7"]
    assert "left 1 processes and 1 /dev/shm segments" in result.violations[0]


def test_expect_loss_reports_loss_and_failed_reads_without_calling_them_violations():
    def lossy(**config: Any) -> History:
        history = History(**config).send("kept", 0).send("dropped", 1).send("refused", None, outcome="fail")
        history.send("replacement", 1, key="j", process="producer-2")  # the new leader reused offset 1
        return history.final_read((0, "k", "kept"), (1, "k", "replacement"), (2, "k", "refused"))

    strict = lossy().check()
    assert (strict.lost, strict.failed_reads, strict.inconsistent_offsets) == (1, 1, 1)
    assert not strict.valid
    teaching = lossy(expect_loss=True).check()
    assert (teaching.lost, teaching.failed_reads, teaching.inconsistent_offsets) == (1, 1, 1)
    assert teaching.expect_loss and teaching.valid, teaching.violations


def test_expect_loss_still_fails_on_anything_that_is_not_loss():
    history = History(expect_loss=True).send("a0", 0).poll((0, 0, "k", "a0"), (0, 1, "k", "ghost"))
    history.poll((0, 5, "k", "a0"))
    result = history.check()
    assert result.phantom == 1 and result.poll_violations == 1 and not result.valid


def test_expect_loss_does_not_excuse_two_surviving_values_at_one_offset():
    history = History(expect_loss=True).send("a0", 0).send("a1", None, outcome="info", key="j")
    history.poll((0, 0, "j", "a1")).final_read((0, "k", "a0"))
    result = history.check()
    # a0 survived; a1 was read, so committed, and is gone: lost, though never acknowledged. Only an
    # acknowledged loss is what a teaching run expects, so the conflict stays a violation.
    assert (result.lost, result.inconsistent_offsets) == (1, 1)
    assert not result.valid and "inconsistent" in result.violations[0]


def test_completions_without_a_value_pair_with_the_latest_invoke_of_their_process_and_key():
    history = History().invoke("a0")
    history.lines.append({"type": "ok", "f": "send", "time_ns": history.tick(), "process": "producer-1",
                          "topic": "t", "key": "k", "partition": 0, "offset": 0})
    history.final_read((0, "k", "a0"))
    result = history.check()
    assert (result.acknowledged, result.lost) == (1, 0)


def test_typed_lines_are_checked_like_dicts():
    lines = [
        SendLine(type="invoke", f="send", time_ns=1, process="p", topic="t", key="k", value="v"),
        SendLine(type="ok", f="send", time_ns=2, process="p", topic="t", key="k", value="v",
                 partition=0, offset=0),
    ]
    assert check_history(lines).acknowledged == 1


def test_anomaly_lists_are_bounded_but_counts_are_exact():
    history = History()
    for index in range(ANOMALIES_PER_KIND_MAX + 10):
        history.send(f"v{index}", index, key=f"k{index}")
    history.final_read()
    result = history.check()
    assert result.lost == ANOMALIES_PER_KIND_MAX + 10
    assert len(result.lost_messages) == ANOMALIES_PER_KIND_MAX


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        (
            {"type": "ok", "f": "poll", "time_ns": 1, "process": "p", "group": "g", "topic": "t",
             "records": [[0, "x", "k", "v"]]},
            "records",
        ),
        ({"type": "ok", "f": "send", "time_ns": 1, "process": "p", "topic": "t"}, "names no value"),
        ({"type": "final-read", "time_ns": 1, "topic": "t", "partition": "zero", "entries": []}, "partition"),
        ({"type": "ok", "time_ns": 1}, "'f'"),
        ({"time_ns": 1}, "type"),
    ],
)
def test_a_malformed_line_is_refused_with_its_position(line, complaint):
    with pytest.raises(MalformedHistory) as raised:
        check_history([{"type": "heal", "time_ns": 0}, line])
    assert raised.value.line_number == 2
    assert complaint in str(raised.value)


def test_a_value_sent_twice_is_refused_because_values_must_be_unique():
    with pytest.raises(MalformedHistory, match="sent twice"):
        History().invoke("v").invoke("v").check()


def test_the_summary_has_the_documented_fields_and_is_json():
    result = History().send("a0", 0).send("a1", 1).final_read((0, "k", "a0")).check()
    summary = json.loads(json.dumps(summary_dict(result)))
    for field in ("acknowledged", "lost", "phantom", "order_violations", "inconsistent_offsets", "duplicates",
                  "failover_ms_p50", "failover_ms_p99", "faults", "valid", "violations"):
        assert field in summary
    assert summary["acknowledged"] == 2 and summary["lost"] == 1 and summary["valid"] is False
    assert summary["anomalies"]["lost_messages"][0]["value"] == "a1"


# --- the command line -------------------------------------------------------------------------


def write_history(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def run_cli(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chaos", *arguments],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=60,
    )


def test_cli_exits_zero_on_a_valid_history_and_prints_the_summary(tmp_path):
    path = write_history(tmp_path / "history.jsonl", clean_history().lines)
    completed = run_cli("check", str(path))
    assert completed.returncode == 0, completed.stderr
    assert "acknowledged" in completed.stdout and "VALID" in completed.stdout


def test_cli_exits_one_on_a_safety_violation_and_names_it(tmp_path):
    history = History().send("a0", 0).send("a1", 1).final_read((0, "k", "a0"))
    path = write_history(tmp_path / "history.jsonl", history.lines)
    completed = run_cli("check", str(path))
    assert completed.returncode == 1
    assert "lost_messages" in completed.stdout and "a1" in completed.stdout and "INVALID" in completed.stdout


def test_cli_json_prints_the_summary(tmp_path):
    path = write_history(tmp_path / "history.jsonl", History().send("a0", 0).final_read().lines)
    completed = run_cli("check", str(path), "--json")
    assert completed.returncode == 1
    summary = json.loads(completed.stdout)
    assert (summary["acknowledged"], summary["lost"], summary["valid"]) == (1, 1, False)


def test_cli_exits_two_on_a_malformed_line_and_names_the_line(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text('{"type":"heal","time_ns":1}\n{"type": "ok", "f": "send", \n', encoding="utf-8")
    completed = run_cli("check", str(path))
    assert completed.returncode == 2
    assert "line 2" in completed.stderr and "not valid JSON" in completed.stderr


def test_cli_exits_two_on_a_missing_file(tmp_path):
    completed = run_cli("check", str(tmp_path / "absent.jsonl"))
    assert completed.returncode == 2
    assert "cannot open" in completed.stderr


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_cli_exits_two_on_a_device_instead_of_reading_it_for_ever():
    """`chaos check /dev/zero` read one endless line until memory ran out (MemoryError)."""
    completed = run_cli("check", "/dev/zero")
    assert completed.returncode == 2, completed.stderr
    assert "is a device" in completed.stderr and "Traceback" not in completed.stderr


def test_check_file_streams_the_same_verdict_as_check_history(tmp_path):
    lines = History().send("a0", 0).send("a1", 1).poll((0, 0, "k", "a0"), (0, 2, "k", "a1")).lines
    from_file = check_file(write_history(tmp_path / "history.jsonl", lines))
    assert summary_dict(from_file) == summary_dict(check_history(lines))
