"""The chaos report explains itself: why each message was lost, what each word means, and what
happened inside a second around a fault.

Given a history where a leader acknowledged a write in epoch 3, an unclean election then made
another replica leader, and the old leader truncated its log on return, when the report is
written (and when `chaos check` reads the same folder), then the lost message's row names the
acknowledging leader and epoch, the election and the truncation; the page carries a glossary;
and acknowledgements near the fault are binned by 100 ms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from chaos.__main__ import render_result, run_info_beside
from chaos.checker import check_file
from chaos.loss_explain import explain_losses
from chaos.report import write_report
from chaos.timeline import FINE_BIN_S, build_timeline

REPOSITORY = Path(__file__).resolve().parents[2]
SECOND = 1_000_000_000
WALL_ORIGIN_NS = 1_700_000_000 * SECOND
RUN_INFO = {"scenario": "unclean-election", "seed": 3, "wall_origin_ns": WALL_ORIGIN_NS}


def send(kind: str, at_ns: int, value: str, **fields) -> dict:
    return {"type": kind, "f": "send", "time_ns": at_ns, "process": "producer-1", "topic": "t", "key": "k",
            "value": value, **fields}


def lossy_run(directory: Path) -> Path:
    lines = [{"type": "config", "time_ns": 0, "scenario": "unclean-election", "seed": 3, "expect_loss": False,
              "wall_origin_ns": WALL_ORIGIN_NS}]
    for index in range(5):
        at = SECOND + index * SECOND // 2
        lines += [send("invoke", at, f"v{index}"), send("ok", at + 3_000_000, f"v{index}", partition=0, offset=index)]
    lines += [
        {"type": "fault", "time_ns": int(3.4 * SECOND), "nemesis": "kill", "target": "replica/t/0/n1",
         "role": "leader", "topic": "t", "partition": 0},
        {"type": "heal", "time_ns": 6 * SECOND},
        {"type": "final-read", "time_ns": 7 * SECOND, "topic": "t", "partition": 0,
         "entries": [[0, "k", "v0"], [1, "k", "v1"], [2, "k", "v2"]]},
    ]
    (directory / "history.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    trace = [
        {"time_ns": WALL_ORIGIN_NS + SECOND // 2, "actor": "replica/t/0/n1", "event": "became-leader", "topic": "t",
         "partition": 0, "node": 1, "leader_epoch": 3},
        {"time_ns": WALL_ORIGIN_NS + int(3.6 * SECOND), "actor": "coordinator", "event": "unclean-election",
         "topic": "t", "partition": 0, "leader": 2, "isr_before": [1]},
        {"time_ns": WALL_ORIGIN_NS + int(3.6 * SECOND), "actor": "coordinator", "event": "leader-elected",
         "topic": "t", "partition": 0, "leader": 2, "leader_epoch": 4, "previous_leader": 1},
        {"time_ns": WALL_ORIGIN_NS + int(5.2 * SECOND), "actor": "replica/t/0/n1", "event": "follower-truncated",
         "topic": "t", "partition": 0, "from": 5, "to": 3, "leader_epoch": 3, "leader_end_offset": 3},
    ]
    (directory / "trace.jsonl").write_text("".join(json.dumps(event) + "\n" for event in trace))
    return directory / "history.jsonl"


def test_each_lost_message_names_its_leader_the_election_and_the_truncation(tmp_path):
    result = check_file(lossy_run(tmp_path))
    assert result.lost == 2
    explained = explain_losses(result.lost_messages, str(tmp_path / "history.jsonl"), str(tmp_path / "trace.jsonl"),
                               WALL_ORIGIN_NS)
    by_value = {one.value: one for one in explained}
    v3 = by_value["v3"]
    assert (v3.leader, v3.leader_epoch, v3.acknowledged_s) == (1, 3, pytest.approx(2.503))
    assert v3.election == "an unclean election at 3.60 s made n2 leader although it was outside the ISR [1]"
    assert v3.truncation == "n1 truncated its log from offset 5 back to 3 at 5.20 s, the end of epoch 3 on the new leader"
    assert v3.sentence.startswith("acknowledged at 2.50 s by n1 as leader in epoch 3; an unclean election")
    without_trace = explain_losses(result.lost_messages, str(tmp_path / "history.jsonl"), "", None)
    assert all("missing from the final read" in one.sentence for one in without_trace), "no guessing"


def test_the_report_carries_the_explanations_a_glossary_and_fine_bins_around_the_fault(tmp_path):
    result = check_file(lossy_run(tmp_path))
    summary = write_report(str(tmp_path), result, RUN_INFO)
    assert [one["value"] for one in summary["lost_explained"]] == ["v3", "v4"]
    assert json.loads((tmp_path / "summary.json").read_text())["lost_explained"][0]["leader_epoch"] == 3
    page = (tmp_path / "report.html").read_text()
    assert "by n1 as leader in epoch 3" in page and "n1 truncated its log from offset 5 back to 3" in page
    assert "<h2>Glossary</h2>" in page and "<strong>phantom</strong>" in page
    assert "(100 ms bins around faults)" in page and "http" not in page.lower()

    timeline = build_timeline(str(tmp_path / "history.jsonl"), str(tmp_path / "trace.jsonl"), WALL_ORIGIN_NS)
    widths = {round(one.start_s, 1): one.width_s for one in timeline.bins}
    assert widths[0.0] == 1.0 and widths[3.3] == pytest.approx(FINE_BIN_S), "fine from a second before the kill"
    assert widths[5.0] == pytest.approx(FINE_BIN_S) and widths[6.0] == 1.0, "and two seconds after it"
    assert sum(one.acknowledged for one in timeline.bins) == 5
    fine = {round(one.start_s, 1): one.acknowledged for one in timeline.bins if one.width_s < 1}
    assert fine[2.5] == 1 and fine[2.6] == 0, "a 100 ms bin holds what was acknowledged in it"


def test_chaos_check_prints_the_run_summary_in_words_with_seconds(tmp_path):
    history = lossy_run(tmp_path)
    result = check_file(history)
    write_report(str(tmp_path), result, RUN_INFO)
    assert run_info_beside(str(history), result)["wall_origin_ns"] == WALL_ORIGIN_NS
    console = Console(record=True, width=200)
    render_result(result, console, run_info_beside(str(history), result), str(tmp_path))
    text = console.export_text()
    assert "chaos run: unclean-election seed 3" in text and "lost messages (first 2 of 2)" in text
    assert "by n1 as leader in epoch 3" in text
    assert "lost: acknowledged sends missing from the final read" in text, "the glossary of what was found"
    assert "failover samples (first 1 of 1 listed)" in text and "fault (s)" in text and "3.400" in text
    assert "fault_ns" not in text and "3400000000" not in text
    completed = subprocess.run([sys.executable, "-m", "chaos", "check", str(history)], cwd=REPOSITORY,
                               capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert completed.returncode == 1 and "by n1 as leader in epoch 3" in completed.stdout
