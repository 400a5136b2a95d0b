"""The chaos report: summary.json fields, a self-contained HTML page, the timeline it draws.

Given a small hand-written history (two producers' sends, a leader kill, a pause, a heal, a final
read that lacks one acknowledged value), when the report is written, then summary.json carries
the measures the issue names, report.html is one file with an inline SVG and no `http` anywhere,
and the lost message is named on the page."""

from __future__ import annotations

import json
import re

import pytest

from chaos.checker import check_file
from chaos.report import render_html, render_terminal, verdict, write_report
from chaos.timeline import build_timeline, failover_after_fault, fault_bands, leader_changes, per_second

SECOND = 1_000_000_000
WALL_ORIGIN_NS = 1_700_000_000 * SECOND
RUN_INFO = {"scenario": "leader-kill", "seed": 7, "wall_origin_ns": WALL_ORIGIN_NS}


def send(kind: str, at_ns: int, value: str, key: str = "k1", **fields) -> dict:
    return {"type": kind, "f": "send", "time_ns": at_ns, "process": "producer-1", "topic": "t", "key": key,
            "value": value, **fields}


def history_lines(lost_value: str = "v3") -> list[dict]:
    lines = [{"type": "config", "time_ns": 0, "scenario": "leader-kill", "seed": 7, "expect_loss": False,
              "wall_origin_ns": WALL_ORIGIN_NS}]
    offsets = {}
    for index, value in enumerate(["v0", "v1", "v2", "v3"]):
        start = (index + 1) * SECOND
        lines.append(send("invoke", start, value))
        lines.append(send("ok", start + (index + 1) * 2_000_000, value, partition=0, offset=index))
        offsets[value] = index
    lines += [
        {"type": "fault", "time_ns": int(2.5 * SECOND), "nemesis": "kill", "target": "replica/t/0/n1",
         "role": "leader", "topic": "t", "partition": 0},
        {"type": "fault", "time_ns": int(3.2 * SECOND), "nemesis": "pause", "target": "g1/member-1",
         "role": "member"},
        {"type": "fault", "time_ns": int(4.4 * SECOND), "nemesis": "pause", "target": "g1/member-1",
         "role": "member", "phase": "stop"},
        {"type": "heal", "time_ns": 5 * SECOND},
        {"type": "final-read", "time_ns": 6 * SECOND, "topic": "t", "partition": 0,
         "entries": [[offsets[value], "k1", value] for value in offsets if value != lost_value]},
        {"type": "hygiene", "time_ns": 7 * SECOND, "leftover_processes": [], "leftover_shm": []},
    ]
    return sorted(lines, key=lambda line: line["time_ns"])


def write_history(directory, lines: list[dict]) -> str:
    path = directory / "history.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def write_trace(directory) -> None:
    events = [
        {"time_ns": WALL_ORIGIN_NS + int(2.6 * SECOND), "actor": "coordinator", "event": "leader-elected",
         "topic": "t", "partition": 0, "leader": 2},
        {"time_ns": WALL_ORIGIN_NS + int(2.7 * SECOND), "actor": "replica/t/0/n2", "event": "became-leader"},
    ]
    (directory / "trace.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events) + '{"torn')


@pytest.fixture
def report_dir(tmp_path):
    write_history(tmp_path, history_lines())
    write_trace(tmp_path)
    return tmp_path


def test_summary_json_carries_the_measures_the_issue_names(report_dir):
    result = check_file(report_dir / "history.jsonl")
    write_report(str(report_dir), result, RUN_INFO)
    summary = json.loads((report_dir / "summary.json").read_text())
    for name in ("acknowledged", "lost", "phantom", "order_violations", "inconsistent_offsets", "duplicates",
                 "failover_ms_p50", "failover_ms_p99", "faults"):
        assert name in summary, name
    assert summary["acknowledged"] == 4 and summary["lost"] == 1 and summary["faults"] == 2
    assert summary["run"]["seed"] == 7
    assert summary["failover_ms_p50"] == pytest.approx(506.0)  # kill at 2.5 s, next ok (v2) at 3.006 s


def test_the_html_is_one_self_contained_file_with_an_inline_svg(report_dir):
    result = check_file(report_dir / "history.jsonl")
    write_report(str(report_dir), result, RUN_INFO)
    page = (report_dir / "report.html").read_text()
    assert "<svg" in page and "</svg>" in page
    assert "http" not in page.lower(), "no link, script, font or namespace URL of any kind"
    assert not re.search(r"<(script|link|img|iframe)\b", page), "nothing loaded from anywhere"
    assert re.search(r"\bsrc=", page) is None


def test_the_page_names_the_lost_message_and_draws_faults_and_leader_ticks(report_dir):
    result = check_file(report_dir / "history.jsonl")
    write_report(str(report_dir), result, RUN_INFO)
    page = (report_dir / "report.html").read_text()
    assert "Lost messages (1)" in page and "<td>v3</td>" in page
    assert "kill leader t/0/n1</text>" in page, "the kill is a labelled fault band"
    assert "kill leader replica/t/0/n1</td>" in page, "and a row of the fault table"
    assert "pause member g1/member-1</text>" in page
    assert "leader elected t/0 → n2" in page, "the election from the trace is a tick"
    assert ">heal</text>" in page
    assert "INVALID" in page


def test_values_from_the_history_are_escaped(tmp_path):
    lines = history_lines(lost_value="<b>v3</b>")
    for line in lines:
        if line.get("value") == "v3":
            line["value"] = "<b>v3</b>"
    write_history(tmp_path, lines)
    result = check_file(tmp_path / "history.jsonl")
    page = render_html(result, {"scenario": "x"}, build_timeline(str(tmp_path / "history.jsonl")))
    assert "<b>v3</b>" not in page and "&lt;b&gt;v3&lt;/b&gt;" in page


def test_the_timeline_buckets_acknowledgements_and_latency_per_second(report_dir):
    timeline = build_timeline(str(report_dir / "history.jsonl"), str(report_dir / "trace.jsonl"))
    by_second = {second.second: second for second in timeline.seconds}
    assert [by_second[s].acknowledged for s in (1, 2, 3, 4)] == [1, 1, 1, 1]
    assert by_second[0].acknowledged == 0 and by_second[0].latency_ms_p50 is None
    assert by_second[3].latency_ms_p50 == pytest.approx(6.0)
    assert timeline.heal_s == pytest.approx(5.0)
    assert [change.label for change in timeline.leader_changes] == ["t/0 → n2"]
    assert timeline.leader_changes[0].time_s == pytest.approx(2.6)


def test_per_second_percentiles_are_nearest_rank():
    samples = [(0.1, 5.0), (0.2, 1.0), (0.3, 3.0), (1.5, 9.0)] + [(0.4, 2.0)] * 96 + [(0.5, 100.0)]
    seconds = per_second(samples, 2.0)
    assert seconds[0].acknowledged == 100
    assert seconds[0].latency_ms_p50 == 2.0 and seconds[0].latency_ms_p99 == 5.0
    assert seconds[1].latency_ms_p99 == 9.0


def test_fault_bands_pair_starts_with_stops_and_mark_instant_faults():
    lines = [
        {"type": "fault", "time_ns": 1 * SECOND, "nemesis": "isolate", "target": "a", "role": "leader"},
        {"type": "fault", "time_ns": 2 * SECOND, "nemesis": "kill", "target": "b", "role": "follower"},
        {"type": "fault", "time_ns": 4 * SECOND, "nemesis": "isolate", "target": "a", "role": "leader",
         "phase": "stop"},
        {"type": "fault", "time_ns": 5 * SECOND, "nemesis": "pause", "target": "c", "role": "leader"},
        {"type": "fault", "time_ns": 5 * SECOND, "nemesis": "pause", "target": "z", "phase": "stop"},
    ]
    bands = fault_bands(lines, end_s=9.0)
    assert [(band.start_s, band.end_s, band.instantaneous) for band in bands] == [
        (1.0, 4.0, False), (2.0, 2.25, True), (5.0, 5.25, True)]
    assert bands[0].label == "isolate leader a"


def test_failover_counts_only_sends_invoked_after_the_fault():
    kill = {"type": "fault", "time_ns": 100, "nemesis": "kill", "role": "leader", "topic": "t",
            "partition": 0}
    follower = {**kill, "role": "follower"}
    acknowledged = {("t", 0): [(90, 101), (120, 400), (130, 300)], ("t", 1): [(150, 160)]}
    assert failover_after_fault([kill, follower], acknowledged) == [200 / 1e6], \
        "the answer already on its way at 101 ns is not a failover; the earliest later send's is"
    assert failover_after_fault([{**kill, "partition": 2}], acknowledged) == [None]


def test_summary_and_page_carry_the_failover_measure(tmp_path):
    lines = history_lines()
    lines.append(send("invoke", int(2.4 * SECOND), "in-flight", key="k2"))
    lines.append(send("ok", int(2.51 * SECOND), "in-flight", key="k2", partition=0, offset=9))
    lines.append({"type": "final-read", "time_ns": 6 * SECOND, "topic": "t", "partition": 0,
                  "entries": [[0, "k1", "v0"], [1, "k1", "v1"], [2, "k1", "v2"], [3, "k1", "v3"],
                              [9, "k2", "in-flight"]]})
    write_history(tmp_path, sorted(lines, key=lambda line: line["time_ns"]))
    result = check_file(tmp_path / "history.jsonl")
    summary = write_report(str(tmp_path), result, RUN_INFO)
    assert summary["failover_ms_p50"] == pytest.approx(506.0), "the in-flight answer is not a failover"
    assert summary["run"]["failover_after_fault_ms_p50"] == pytest.approx(506.0), "both measures agree"
    assert "to the first acknowledged send invoked after it (ms)" in (tmp_path / "report.html").read_text()


def test_leader_changes_skip_torn_trace_lines_and_missing_files(tmp_path):
    write_trace(tmp_path)
    assert len(leader_changes(str(tmp_path / "trace.jsonl"), WALL_ORIGIN_NS)) == 1
    assert leader_changes(str(tmp_path / "absent.jsonl"), WALL_ORIGIN_NS) == []


def test_the_verdict_tells_an_expected_loss_from_a_violation(tmp_path):
    lines = history_lines()
    lines[0]["expect_loss"] = True
    write_history(tmp_path, lines)
    expected = check_file(tmp_path / "history.jsonl")
    assert verdict(expected)[0] == "expected" and "lost 1" in verdict(expected)[1]
    write_history(tmp_path, history_lines(lost_value="none"))
    assert verdict(check_file(tmp_path / "history.jsonl"))[0] == "valid"


def test_the_terminal_summary_lists_lost_messages_and_the_verdict(report_dir):
    from rich.console import Console

    console = Console(record=True, width=120)
    render_terminal(check_file(report_dir / "history.jsonl"), {"scenario": "leader-kill", "seed": 7}, console)
    text = console.export_text()
    assert "lost messages (first 1 of 1)" in text and "v3" in text
    assert "INVALID" in text and "violation" in text
