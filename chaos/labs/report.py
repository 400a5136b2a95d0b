"""The labs' report: one self-contained HTML page per lab, an index, and standalone pictures.

`write_report(directory, results)` writes `index.html` (every lab's verdict and every measure:
expected, band, measured) and `lab-<name>.html` (the claim with its article, the measures, what
happened, and the plots as inline SVG). The pages follow the chaos report's rules
(chaos/report.py, whose style sheet they share): no script, no external reference, everything
escaped. `write_pictures(directory, results)` writes each lab's plots as `labs-<name>.svg`
(then `labs-<name>-2.svg`, ...) — the pictures docs/labs.md shows.
"""

from __future__ import annotations

import html
import os

from chaos.labs.framework import LabResult, format_number
from chaos.labs.plots import plot_svg
from chaos.report import STYLE

VERDICT_CLASS = {"PASS": "valid", "FAIL": "invalid", "ERROR": "invalid"}


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _page(title: str, body: list[str]) -> str:
    return "\n".join(['<!doctype html>', '<html lang="en"><head><meta charset="utf-8">',
                      f"<title>{_e(title)}</title>",
                      f"<style>{STYLE}</style></head><body>", f"<h1>{_e(title)}</h1>", *body,
                      "</body></html>"])


def _measure_table(result: LabResult) -> str:
    rows = ["<table><tr><th>measure</th><th>expected</th><th>band</th><th>measured</th><th>verdict</th>"
            "<th>where the expected value comes from</th></tr>"]
    for measure in result.measures:
        css = VERDICT_CLASS[measure.verdict]
        rows.append(f"<tr><td>{_e(measure.name)}</td>"
                    f'<td class="number">{_e(format_number(measure.expected))}</td>'
                    f"<td>{_e(measure.band.text())}</td>"
                    f'<td class="number">{_e(format_number(measure.measured))}</td>'
                    f'<td class="{css}">{_e(measure.verdict)}</td><td>{_e(measure.how)}</td></tr>')
    rows.append("</table>")
    return "".join(rows)


def lab_page(result: LabResult) -> str:
    lab = result.lab
    size = "quick" if result.quick else "full"
    body = [f"<p><strong>Claim</strong> ({_e(lab.article)}): {_e(lab.claim)}</p>",
            f'<p class="{VERDICT_CLASS[result.verdict]}"><strong>{_e(result.verdict)}</strong> — {size} run, '
            f"{result.elapsed_s:.1f} s</p>", "<h2>Expected against measured</h2>", _measure_table(result)]
    if result.error:
        body.append(f'<p class="invalid">The experiment broke: {_e(result.error)}</p>')
    if result.facts:
        body += ["<h2>What happened</h2>",
                 "<ul>"] + [f"<li>{_e(fact)}</li>" for fact in result.facts] + ["</ul>"]
    if lab.look_at:
        body.append(f"<p><em>What to look at:</em> {_e(lab.look_at)}.</p>")
    for plot in result.plots:
        body += [f"<h2>{_e(plot.title)}</h2>", plot_svg(plot)]
    body.append('<p><a href="index.html">all labs</a></p>')
    return _page(f"railmq lab {lab.number}: {lab.name}", body)


def index_page(results: list[LabResult]) -> str:
    passed = sum(result.passed for result in results)
    rows = ["<table><tr><th>lab</th><th>measure</th><th>expected</th><th>band</th><th>measured</th>"
            "<th>verdict</th></tr>"]
    for result in results:
        link = f'<a href="lab-{_e(result.lab.name)}.html">{result.lab.number} {_e(result.lab.name)}</a>'
        for measure in result.measures or []:
            rows.append(f"<tr><td>{link}</td><td>{_e(measure.name)}</td>"
                        f'<td class="number">{_e(format_number(measure.expected))}</td>'
                        f"<td>{_e(measure.band.text())}</td>"
                        f'<td class="number">{_e(format_number(measure.measured))}</td>'
                        f'<td class="{VERDICT_CLASS[measure.verdict]}">{_e(measure.verdict)}</td></tr>')
        if result.error:
            rows.append(f'<tr><td>{link}</td><td colspan="4">{_e(result.error)}</td>'
                        '<td class="invalid">ERROR</td></tr>')
    rows.append("</table>")
    total_s = sum(result.elapsed_s for result in results)
    summary = f"<p>{passed} of {len(results)} labs passed ({total_s:.0f} s of experiments).</p>"
    return _page("railmq labs", [summary, "".join(rows)])


def write_report(directory: str, results: list[LabResult]) -> str:
    """Write every page; returns the index's path."""
    os.makedirs(directory, exist_ok=True)
    for result in results:
        with open(os.path.join(directory, f"lab-{result.lab.name}.html"), "w", encoding="utf-8") as handle:
            handle.write(lab_page(result))
    index = os.path.join(directory, "index.html")
    with open(index, "w", encoding="utf-8") as handle:
        handle.write(index_page(results))
    return index


def picture_names(result: LabResult) -> list[str]:
    return [f"labs-{result.lab.name}{'' if index == 0 else f'-{index + 1}'}.svg"
            for index in range(len(result.plots))]


def write_pictures(directory: str, results: list[LabResult]) -> list[str]:
    """Each lab's plots as standalone SVG files; returns the paths written."""
    os.makedirs(directory, exist_ok=True)
    written = []
    for result in results:
        for name, plot in zip(picture_names(result), result.plots):
            path = os.path.join(directory, name)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(plot_svg(plot, standalone=True) + "\n")
            written.append(path)
    return written
