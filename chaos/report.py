"""The chaos report: `summary.json`, a self-contained `report.html`, and the terminal summary.

`summary.json` is the checker's summary (chaos.checker.summary_dict: `acknowledged`, `lost`,
`phantom`, `order_violations`, `inconsistent_offsets`, `duplicates`, `failover_ms_p50`,
`failover_ms_p99`, `faults`, ...) plus a `run` object (scenario, seed, durations, what the
harness observed). `report.html` is one file with no external reference of any kind (no script,
no font, no stylesheet link, no namespace URL): inline CSS and inline SVG — a timeline of
acknowledged writes per second, p50/p99 acknowledgement latency (log scale), both in 100 ms bins
around faults, labelled fault bands, the heal, and leader changes as ticks — then the summary
table, the violations, the lost messages by name with why each was lost (chaos/loss_explain.py:
the acknowledging leader and epoch, the election and the truncation that followed), the
failover samples, the faults and a glossary of every measure (chaos/glossary.py).
`summary.json` also carries `lost_explained`, those explanations as data.

Everything taken from a history (values, keys, targets) is escaped before it reaches the HTML.
"""

from __future__ import annotations

import html
import json
import math
import os
from typing import Any

from rich.console import Console
from rich.markup import escape as rich_escape
from rich.table import Table

import msgspec

from chaos.checker import CheckResult, summary_dict
from chaos.glossary import GLOSSARY, entries_for
from chaos.loss_explain import LossExplanation, explain_losses
from chaos.timeline import Timeline, build_timeline
from chaos.timeline import percentile_of_sorted as percentile

# Lost messages, failover samples and faults listed in the HTML; the counts stay exact.
HTML_ROWS_MAX = 200
TERMINAL_LOST_ROWS_MAX = 10
# Timeline geometry (SVG user units).
WIDTH, LEFT, RIGHT = 960, 64, 16
LABEL_ROWS, LABEL_ROW_HEIGHT, LABEL_CHAR_WIDTH = 4, 13, 8.0
THROUGHPUT_TOP, CHART_HEIGHT, CHART_GAP = 78, 150, 46
LATENCY_TOP = THROUGHPUT_TOP + CHART_HEIGHT + CHART_GAP
AXIS_Y = LATENCY_TOP + CHART_HEIGHT
HEIGHT = AXIS_Y + 30
FAULT_LABEL_CHARS_MAX = 40

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1000px; color: #1d2330; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
.valid { color: #137333; } .invalid { color: #b3261e; } .expected { color: #8a5a00; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { padding: 3px 10px; border-bottom: 1px solid #e3e6ec; }
th { text-align: left; background: #f4f6f9; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
.legend span { display: inline-block; margin-right: 18px; } .swatch { display: inline-block; width: 12px;
  height: 12px; margin-right: 5px; vertical-align: -1px; }
svg text { font: 11px system-ui, sans-serif; fill: #39404f; }
code { font-size: 12px; }
"""


def write_report(report_dir: str, result: CheckResult, run_info: dict[str, Any]) -> dict[str, Any]:
    """Write summary.json and report.html into `report_dir` (history.jsonl must be there)."""
    timeline = build_timeline(os.path.join(report_dir, "history.jsonl"),
                              os.path.join(report_dir, "trace.jsonl"), run_info.get("wall_origin_ns"))
    run_info = {**run_info, **failover_figures(timeline)}
    explanations = explanations_for(report_dir, result, run_info)
    summary = {**summary_dict(result), "run": run_info, "lost_explained": msgspec.to_builtins(explanations)}
    with open(os.path.join(report_dir, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2, default=str)
    with open(os.path.join(report_dir, "report.html"), "w", encoding="utf-8") as handle:
        handle.write(render_html(result, run_info, timeline, explanations))
    return summary


def explanations_for(report_dir: str, result: CheckResult, run_info: dict[str, Any]) -> list[LossExplanation]:
    """Why each listed lost message was lost, from the history and trace in `report_dir`."""
    return explain_losses(result.lost_messages, os.path.join(report_dir, "history.jsonl"),
                          os.path.join(report_dir, "trace.jsonl"), run_info.get("wall_origin_ns"))


def failover_figures(timeline: Timeline) -> dict[str, Any]:
    """p50/p99/max of failover measured from sends invoked after each leader fault."""
    samples = sorted(sample for sample in timeline.failover_ms if sample is not None)
    return {
        "failover_after_fault_ms_p50": percentile(samples, 0.50),
        "failover_after_fault_ms_p99": percentile(samples, 0.99),
        "failover_after_fault_ms_max": samples[-1] if samples else None,
        "failover_after_fault_samples": len(timeline.failover_ms),
    }


# --------------------------------------------------------------------------- HTML


def _e(value: Any) -> str:
    return html.escape("-" if value is None else str(value), quote=True)


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def verdict(result: CheckResult) -> tuple[str, str]:
    """(css class, words) for the run's outcome."""
    if not result.valid:
        return "invalid", "INVALID: safety violations found"
    if result.expect_loss and result.lost:
        return "expected", f"lost {result.lost} acknowledged messages, as this teaching scenario expects"
    if result.expect_loss:
        return "expected", "this teaching scenario lost nothing this time (try another seed)"
    return "valid", "VALID: no safety violation"


def render_html(result: CheckResult, run_info: dict[str, Any], timeline: Timeline,
                explanations: list[LossExplanation] | None = None) -> str:
    css_class, words = verdict(result)
    scenario, seed = run_info.get("scenario", result.scenario), run_info.get("seed", result.seed)
    title = f"railmq chaos: {scenario} seed {seed}"
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{_e(title)}</title>",
        f"<style>{STYLE}</style></head><body>", f"<h1>{_e(title)}</h1>",
        f'<p class="{css_class}"><strong>{_e(words)}</strong></p>',
        "<h2>Timeline</h2>", timeline_svg(timeline), _legend(),
        "<h2>Summary</h2>", _summary_table(result, run_info),
    ]
    if result.violations:
        parts += ["<h2>Violations</h2><ul>"] + [f"<li>{_e(sentence)}</li>" for sentence in result.violations]
        parts.append("</ul>")
    if result.lost_messages:
        parts += [f"<h2>Lost messages ({result.lost})</h2>", _lost_table(result, explanations)]
    parts += ["<h2>Failovers</h2>", _failover_table(result, timeline)]
    parts += ["<h2>Faults</h2>", _fault_table(timeline)]
    parts += ["<h2>Glossary</h2>", _glossary()]
    parts.append("</body></html>")
    return "\n".join(parts)


def _rows(header: list[str], rows: list[list[Any]], numeric: frozenset[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(name)}</th>" for name in header)
    body = "".join("<tr>" + "".join(_cell(cell, index in numeric) for index, cell in enumerate(row)) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value: Any, numeric: bool) -> str:
    return f'<td class="number">{_e(_number(value))}</td>' if numeric else f"<td>{_e(value)}</td>"


def summary_rows(result: CheckResult, run_info: dict[str, Any]) -> list[tuple[str, Any]]:
    """The measures every summary shows, in order (shared by the HTML and the terminal)."""
    return [
        ("scenario", run_info.get("scenario", result.scenario)), ("seed", run_info.get("seed", result.seed)),
        ("fault phase (s)", run_info.get("duration_s")), ("faults", result.faults),
        ("sends", result.sends), ("acknowledged", result.acknowledged), ("failed", result.failed_sends),
        ("indeterminate", result.indeterminate_sends), ("lost", result.lost),
        ("unchecked", result.unchecked), ("phantom", result.phantom),
        ("order violations", result.order_violations), ("inconsistent offsets", result.inconsistent_offsets),
        ("poll violations", result.poll_violations), ("commit regressions", result.commit_regressions),
        ("divergences", result.divergences), ("unseen", result.unseen),
        ("duplicates", result.duplicates), ("duplicate rate (%)", round(result.duplicate_rate * 100, 3)),
        ("failover p50 (ms)", result.failover_ms_p50), ("failover p99 (ms)", result.failover_ms_p99),
        ("failover max (ms)", result.failover_ms_max),
        ("failovers unrecovered", result.failovers_unrecovered),
        ("failover p50, sends after the fault (ms)", run_info.get("failover_after_fault_ms_p50")),
        ("failover p99, sends after the fault (ms)", run_info.get("failover_after_fault_ms_p99")),
        ("leftover processes", len(result.leftover_processes)), ("leftover shm", len(result.leftover_shm)),
        ("converged after heal", _converged(run_info.get("converged"))),
        ("partitions the final read could not finish", run_info.get("final_read_incomplete") or "none"),
    ]


def _converged(facts: dict[str, bool] | None) -> str:
    if not facts:
        return "-"
    return ", ".join(f"{name.replace('_', ' ')}: {'yes' if held else 'NO'}" for name, held in facts.items())


def _summary_table(result: CheckResult, run_info: dict[str, Any]) -> str:
    rows = [[name, _number(value)] for name, value in summary_rows(result, run_info)]
    return _rows(["measure", "value"], rows, frozenset({1}))


def _why(index: int, reason: str, explanations: list[LossExplanation] | None) -> str:
    if explanations and index < len(explanations) and explanations[index].sentence:
        return explanations[index].sentence
    return reason


def _lost_table(result: CheckResult, explanations: list[LossExplanation] | None = None) -> str:
    rows = [[lost.topic, lost.partition, lost.offset, lost.key, lost.value, _why(index, lost.reason, explanations)]
            for index, lost in enumerate(result.lost_messages[:HTML_ROWS_MAX])]
    return _rows(["topic", "partition", "offset", "key", "value", "why"], rows, frozenset({1, 2}))


def _glossary() -> str:
    items = "".join(f"<dt><strong>{_e(term)}</strong></dt><dd>{_e(words)}</dd>" for term, words in GLOSSARY)
    return f"<dl>{items}</dl>"


def _failover_table(result: CheckResult, timeline: Timeline) -> str:
    if not result.failover_samples:
        return "<p>No fault took a leader away.</p>"
    strict = timeline.failover_ms if len(timeline.failover_ms) == len(result.failover_samples) else []
    rows = []
    for index, sample in enumerate(result.failover_samples[:HTML_ROWS_MAX]):
        after = strict[index] if strict else None
        rows.append([f"{sample.fault_ns / 1e9:.2f}", sample.nemesis, f"{sample.topic}/{sample.partition}",
                     sample.failover_ms if sample.failover_ms is not None else "never",
                     after if after is not None else "never"])
    header = ["at (s)", "nemesis", "partition", "to the next acknowledgement (ms)",
              "to the first acknowledged send invoked after it (ms)"]
    return _rows(header, rows, frozenset({3, 4}))


def _fault_table(timeline: Timeline) -> str:
    if not timeline.faults:
        return "<p>No fault was performed.</p>"
    rows = [[f"{band.start_s:.2f}", "instant" if band.instantaneous else f"{band.end_s - band.start_s:.2f}",
             band.label] for band in timeline.faults[:HTML_ROWS_MAX]]
    return _rows(["at (s)", "lasted (s)", "fault"], rows)


def _legend() -> str:
    items = [("#7aa6d8", "acknowledged writes per second"), ("#1f5fa8", "latency p50"),
             ("#d9822b", "latency p99"), ("rgba(214,69,65,0.18)", "fault"), ("#6b3fa0", "leader elected"),
             ("#b3261e", "unclean election")]
    spans = "".join(f'<span><i class="swatch" style="background:{color}"></i>{_e(text)}</span>'
                    for color, text in items)
    return f'<p class="legend">{spans}</p>'


# --------------------------------------------------------------------------- SVG


def _x(time_s: float, end_s: float) -> float:
    return LEFT + (WIDTH - LEFT - RIGHT) * max(0.0, min(time_s, end_s)) / max(end_s, 1e-9)


def _latency_y(latency_ms: float, top_ms: float) -> float:
    span = math.log10(max(top_ms, 10.0))
    fraction = math.log10(max(latency_ms, 1.0)) / span
    return LATENCY_TOP + CHART_HEIGHT * (1 - min(1.0, fraction))


def timeline_svg(timeline: Timeline) -> str:
    end_s = max(timeline.end_s, 1.0)
    parts = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
             f'aria-label="throughput, latency and faults over time">']
    parts += _fault_svg(timeline, end_s) + _throughput_svg(timeline, end_s) + _latency_svg(timeline, end_s)
    parts += _leader_svg(timeline, end_s) + _time_axis_svg(end_s)
    if timeline.heal_s is not None:
        x = _x(timeline.heal_s, end_s)
        parts.append(f'<line x1="{x:.1f}" y1="{THROUGHPUT_TOP}" x2="{x:.1f}" y2="{AXIS_Y}" stroke="#137333" '
                     f'stroke-dasharray="4 3"/><text x="{x + 3:.1f}" y="{AXIS_Y - 4}">heal</text>')
    parts.append("</svg>")
    return "".join(parts)


def _fault_svg(timeline: Timeline, end_s: float) -> list[str]:
    parts = []
    row_ends = [0.0] * LABEL_ROWS  # where the last label of each row ends (x)
    for band in timeline.faults:
        x1, x2 = _x(band.start_s, end_s), _x(band.end_s, end_s)
        label = band.label.replace("replica/", "")  # "kill leader chaos/0/n2": topic/partition/node
        if len(label) > FAULT_LABEL_CHARS_MAX:
            label = label[:FAULT_LABEL_CHARS_MAX - 1] + "…"
        width = len(label) * LABEL_CHAR_WIDTH
        anchor = "end" if x1 + width > WIDTH - RIGHT else "start"  # near the right edge: label to the left
        text_x = x1 - 2 if anchor == "end" else x1 + 2
        left = text_x - width if anchor == "end" else text_x
        row = next((row for row, row_end in enumerate(row_ends) if row_end < left),
                   row_ends.index(min(row_ends)))  # every row taken: overlap the one that ends first
        row_ends[row] = left + width + 8
        y = 14 + row * LABEL_ROW_HEIGHT
        parts.append(f'<rect x="{x1:.1f}" y="{THROUGHPUT_TOP}" width="{max(x2 - x1, 2.0):.1f}" '
                     f'height="{AXIS_Y - THROUGHPUT_TOP}" fill="rgba(214,69,65,0.18)">'
                     f"<title>{_e(band.label)} at {band.start_s:.2f} s</title></rect>")
        parts.append(f'<line x1="{x1:.1f}" y1="{y + 3}" x2="{x1:.1f}" y2="{THROUGHPUT_TOP}" '
                     f'stroke="rgba(214,69,65,0.5)"/>'
                     f'<text x="{text_x:.1f}" y="{y}" text-anchor="{anchor}">{_e(label)}</text>')
    return parts


def _throughput_svg(timeline: Timeline, end_s: float) -> list[str]:
    bins = timeline.drawn_bins()
    peak = max([round(one.rate_per_s) for one in bins] + [1])
    fine = any(one.width_s < 1 for one in bins)
    title = "acknowledged writes per second" + (" (100 ms bins around faults)" if fine else "")
    parts = [f'<text x="{LEFT - 6}" y="{THROUGHPUT_TOP + 10}" text-anchor="end">{peak:,}</text>',
             f'<text x="{LEFT - 6}" y="{THROUGHPUT_TOP + CHART_HEIGHT}" text-anchor="end">0</text>',
             f'<text x="{LEFT}" y="{THROUGHPUT_TOP - 4}">{title}</text>',
             f'<line x1="{LEFT}" y1="{THROUGHPUT_TOP + CHART_HEIGHT}" x2="{WIDTH - RIGHT}" '
             f'y2="{THROUGHPUT_TOP + CHART_HEIGHT}" stroke="#9aa3b2"/>']
    scale = (WIDTH - LEFT - RIGHT) / max(end_s, 1e-9)
    for one in bins:
        height = CHART_HEIGHT * min(1.0, one.rate_per_s / peak)
        x = _x(one.start_s, end_s)
        gap = 1 if one.width_s >= 1 else 0.3
        parts.append(f'<rect x="{x:.1f}" y="{THROUGHPUT_TOP + CHART_HEIGHT - height:.1f}" '
                     f'width="{max(scale * one.width_s - gap, 0.6):.1f}" height="{height:.1f}" fill="#7aa6d8">'
                     f"<title>{one.start_s:g}-{one.start_s + one.width_s:g} s: {one.acknowledged} acknowledged"
                     f"</title></rect>")
    return parts


def _latency_svg(timeline: Timeline, end_s: float) -> list[str]:
    bins = timeline.drawn_bins()
    top_ms = max([one.latency_ms_p99 or 0.0 for one in bins] + [10.0])
    title = "acknowledgement latency p50 / p99 (ms, log scale)"
    parts = [f'<text x="{LEFT}" y="{LATENCY_TOP - 4}">{title}</text>']
    for grid_ms in (1, 10, 100, 1000, 10000):
        if grid_ms <= top_ms * 1.01 or grid_ms == 1:
            y = _latency_y(grid_ms, top_ms)
            parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
                         f'stroke="#e3e6ec"/><text x="{LEFT - 6}" y="{y + 4:.1f}" '
                         f'text-anchor="end">{grid_ms:,}</text>')
    for field_name, color in (("latency_ms_p50", "#1f5fa8"), ("latency_ms_p99", "#d9822b")):
        for run in _runs(bins, field_name):
            points = " ".join(f"{_x(middle_s, end_s):.1f},{_latency_y(value, top_ms):.1f}" for middle_s, value in run)
            parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.6"/>')
    return parts


def _runs(bins: list, field_name: str) -> list[list[tuple[float, float]]]:
    """Consecutive bins that have a value (at their middles): a gap (no acknowledgement) breaks the line."""
    runs: list[list[tuple[float, float]]] = [[]]
    for one in bins:
        value = getattr(one, field_name)
        if value is None:
            runs.append([])
        else:
            runs[-1].append((one.start_s + one.width_s / 2, value))
    return [run for run in runs if run]


def _leader_svg(timeline: Timeline, end_s: float) -> list[str]:
    parts = []
    base = THROUGHPUT_TOP + CHART_HEIGHT
    for change in sorted(timeline.leader_changes, key=lambda change: change.unclean):  # unclean on top
        x = _x(change.time_s, end_s)
        color = "#b3261e" if change.unclean else "#6b3fa0"
        kind = "unclean election" if change.unclean else "leader elected"
        parts.append(f'<line x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 10}" stroke="{color}" '
                     f'stroke-width="2"><title>{_e(kind)} {_e(change.label)} at {change.time_s:.2f} s'
                     f"</title></line>")
    return parts


def _time_axis_svg(end_s: float) -> list[str]:
    step_s = next(step for step in (1, 2, 5, 10, 20, 30, 60, 120, 300, 600) if end_s / step <= 16)
    parts = [f'<line x1="{LEFT}" y1="{AXIS_Y}" x2="{WIDTH - RIGHT}" y2="{AXIS_Y}" stroke="#9aa3b2"/>']
    for tick in range(0, int(end_s) + 1, step_s):
        x = _x(tick, end_s)
        parts.append(f'<line x1="{x:.1f}" y1="{AXIS_Y}" x2="{x:.1f}" y2="{AXIS_Y + 5}" stroke="#9aa3b2"/>'
                     f'<text x="{x:.1f}" y="{AXIS_Y + 18}" text-anchor="middle">{tick} s</text>')
    return parts


# --------------------------------------------------------------------------- terminal


def render_terminal(result: CheckResult, run_info: dict[str, Any], console: Console,
                    explanations: list[LossExplanation] | None = None) -> None:
    """The summary table, the first lost messages and why, what the anomalies found mean, the
    violations and the verdict."""
    title = f"chaos run: {run_info.get('scenario')} seed {run_info.get('seed')}"
    table = Table(title=rich_escape(title), show_header=False)
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in summary_rows(result, run_info):
        table.add_row(name, rich_escape(_number(value)))
    console.print(table)
    if result.lost_messages:
        shown = min(result.lost, TERMINAL_LOST_ROWS_MAX)
        lost = Table(title=f"lost messages (first {shown} of {result.lost})")
        for column in ("partition", "offset", "key", "value", "why"):
            lost.add_column(column)
        for index, message in enumerate(result.lost_messages[:TERMINAL_LOST_ROWS_MAX]):
            cells = (message.partition, message.offset, message.key, message.value,
                     _why(index, message.reason, explanations))
            lost.add_row(*(rich_escape(_number(cell)) for cell in cells))
        console.print(lost)
    found = entries_for({name: getattr(result, name) for name in
                         ("lost", "unchecked", "phantom", "failed_reads", "inconsistent_offsets",
                          "order_violations", "poll_violations", "commit_regressions", "divergences",
                          "unseen", "duplicates", "indeterminate_sends")})
    for term, words in found:
        console.print(f"[bold]{rich_escape(term)}[/]: {rich_escape(words)}", highlight=False)
    for sentence in result.violations:
        console.print(f"[bold red]violation[/]: {rich_escape(sentence)}", highlight=False)
    css_class, words = verdict(result)
    color = {"valid": "green", "invalid": "red", "expected": "yellow"}[css_class]
    console.print(f"[bold {color}]{rich_escape(words)}[/]")
