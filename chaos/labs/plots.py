"""Self-contained SVG charts for the labs: lines over time and bars, in the chaos report's style.

`plot_svg(plot)` draws a `Plot` as inline SVG for an HTML page (the chaos report's convention:
no external reference of any kind); `standalone=True` adds the namespace and a style element, so
the same picture can live in its own file (docs/pictures/labs-*.svg). A `Plot` that carries a
ready-made `svg` (the chaos report's timeline, for the replication labs) is passed through.
Every label is escaped. Pure: data in, text out.
"""

from __future__ import annotations

import html
import math

from chaos.labs.framework import Plot, Series

WIDTH, HEIGHT = 720, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 20, 52, 56
PALETTE = ["#1f5fa8", "#d9822b", "#137333", "#6b3fa0", "#b3261e", "#8a5a00", "#39404f", "#7aa6d8"]
FONT = "font: 11px system-ui, sans-serif; fill: #39404f"
MARK_ROWS = 4  # labels of vertical marks take turns on this many rows, so neighbours do not collide
NAMESPACE = "http://www.w3.org/2000/svg"  # only in standalone files; HTML pages embed without it


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def nice_ticks(high: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least `high`."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(factor * magnitude for factor in (1, 2, 2.5, 5, 10) if factor * magnitude >= raw)
    ticks, value = [0.0], 0.0
    while value < high - 1e-9:  # the last tick is at or above `high`: no point is drawn off the top
        value += step
        ticks.append(round(value, 10))
    return ticks


def _label(value: float) -> str:
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _frame(plot: Plot, standalone: bool) -> list[str]:
    namespace = f' xmlns="{NAMESPACE}"' if standalone else ""
    parts = [f'<svg{namespace} viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
             f'aria-label="{_e(plot.title)}">']
    if standalone:
        # A picture on its own page says what it shows to a screen reader, as docs/tools/svg.py's do.
        names = ", ".join(series.label for series in plot.series)
        parts.append(f"<title>{_e(plot.title)}</title><desc>{_e(plot.y_label)} against {_e(plot.x_label)}"
                     f"{': ' + _e(names) if names else ''}</desc>")
        parts.append(f"<style>text {{ {FONT} }}</style>"
                     f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>')
    parts.append(f'<text x="{LEFT}" y="18" style="font-weight: 600">{_e(plot.title)}</text>')
    if plot.y_label:
        parts.append(f'<text x="14" y="{(TOP + HEIGHT - BOTTOM) / 2:.0f}" text-anchor="middle" '
                     'transform="rotate(-90 14 '
                     f'{(TOP + HEIGHT - BOTTOM) / 2:.0f})">{_e(plot.y_label)}</text>')
    if plot.x_label:
        parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle">'
                     f'{_e(plot.x_label)}</text>')
    return parts


def _y_axis(ticks: list[float], top_value: float) -> tuple[list[str], callable]:
    plot_height = HEIGHT - TOP - BOTTOM

    def y(value: float) -> float:
        return TOP + plot_height * (1 - value / top_value) if top_value else TOP + plot_height

    parts = []
    for tick in ticks:
        parts.append(f'<line x1="{LEFT}" y1="{y(tick):.1f}" x2="{WIDTH - RIGHT}" y2="{y(tick):.1f}" '
                     f'stroke="#e3e6ec"/><text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" '
                     f'text-anchor="end">{_e(_label(tick))}</text>')
    return parts, y


def _legend(series: list[Series]) -> list[str]:
    """One row of swatches under the title, right-aligned from the plot's left edge; an entry that
    would cross the right edge starts a second row above the plot area."""
    parts, x, y = [], LEFT, 30
    for index, line in enumerate(series):
        width = 28 + 6.2 * len(line.label)
        if x + width > WIDTH - RIGHT and x > LEFT:
            x, y = LEFT, y + 12
        color = line.color or PALETTE[index % len(PALETTE)]
        dash = ' stroke-dasharray="5 3"' if line.dashed else ""
        parts.append(f'<line x1="{x}" y1="{y}" x2="{x + 16}" y2="{y}" stroke="{color}" '
                     f'stroke-width="2.5"{dash}/><text x="{x + 20}" y="{y + 4}">{_e(line.label)}</text>')
        x += width
    return parts


def line_svg(plot: Plot, standalone: bool = False) -> str:
    points = [point for line in plot.series for point in line.points]
    parts = _frame(plot, standalone)
    if not points:
        return "".join(parts + [f'<text x="{LEFT}" y="{TOP + 20}">no samples</text></svg>'])
    low_x = min([0.0] + [x for x, _ in points])
    high_x = (max([x for x, _ in points] + [mark for mark, _ in plot.marks]) or 1.0) * 1.02
    ticks = nice_ticks(max(y for _, y in points) * 1.05)
    axis, y = _y_axis(ticks, ticks[-1])
    span = (WIDTH - LEFT - RIGHT) / max(high_x - low_x, 1e-9)

    def x(value: float) -> float:
        return LEFT + (value - low_x) * span

    parts += axis
    for tick in nice_ticks(high_x - low_x, 8):
        parts.append(f'<text x="{x(low_x + tick):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
                     f'{_e(_label(low_x + tick))}</text>')
    for row, (mark_x, text) in enumerate(sorted(plot.marks)):
        near_right = x(mark_x) + 6.2 * len(text) > WIDTH - RIGHT
        anchor, text_x = ("end", x(mark_x) - 3) if near_right else ("start", x(mark_x) + 3)
        parts.append(f'<line x1="{x(mark_x):.1f}" y1="{TOP}" x2="{x(mark_x):.1f}" y2="{HEIGHT - BOTTOM}" '
                     f'stroke="#b3261e" stroke-dasharray="4 3"/><text x="{text_x:.1f}" '
                     f'y="{TOP + 10 + 12 * (row % MARK_ROWS)}" text-anchor="{anchor}">{_e(text)}</text>')
    for index, line in enumerate(plot.series):
        color = line.color or PALETTE[index % len(PALETTE)]
        dash = ' stroke-dasharray="5 3"' if line.dashed else ""
        ordered = sorted(line.points)
        if line.step:
            ordered = [point for previous, current in zip([ordered[0]] + ordered, ordered)
                       for point in ((current[0], previous[1]), current)]
        path = " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in ordered)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}>'
                     f"<title>{_e(line.label)}</title></polyline>")
    parts += _legend(plot.series)
    parts.append("</svg>")
    return "".join(parts)


def bar_svg(plot: Plot, standalone: bool = False) -> str:
    values = [(int(index), value) for line in plot.series for index, value in line.points]
    parts = _frame(plot, standalone)
    count = max(len(plot.categories), max((index for index, _ in values), default=0) + 1)
    ticks = nice_ticks(max([value for _, value in values] + [1.0]) * 1.1)
    axis, y = _y_axis(ticks, ticks[-1])
    parts += axis
    slot = (WIDTH - LEFT - RIGHT) / max(count, 1)
    rotate = count > 6
    color = (plot.series[0].color if plot.series and plot.series[0].color else PALETTE[0])
    for index, value in values:
        left = LEFT + index * slot + slot * 0.15
        parts.append(f'<rect x="{left:.1f}" y="{y(value):.1f}" width="{slot * 0.7:.1f}" '
                     f'height="{max(0.0, y(0) - y(value)):.1f}" '
                     f'fill="{color}"><title>{_e(_label(value))}</title></rect><text '
                     f'x="{left + slot * 0.35:.1f}" y="{y(value) - 4:.1f}" '
                     f'text-anchor="middle">{_e(_label(round(value, 2)))}</text>')
    for index, name in enumerate(plot.categories):
        center = LEFT + (index + 0.5) * slot
        base = HEIGHT - BOTTOM + 14
        transform = f' transform="rotate(-25 {center:.1f} {base})"' if rotate else ""
        anchor = "end" if rotate else "middle"
        parts.append(f'<text x="{center:.1f}" y="{base}" text-anchor="{anchor}"{transform}>{_e(name)}</text>')
    parts.append(f'<line x1="{LEFT}" y1="{y(0):.1f}" x2="{WIDTH - RIGHT}" y2="{y(0):.1f}" '
                 'stroke="#9aa3b2"/></svg>')
    return "".join(parts)


def plot_svg(plot: Plot, standalone: bool = False) -> str:
    if plot.svg:
        if not standalone:
            return plot.svg
        opening = plot.svg.index(">") + 1
        head, body = plot.svg[:opening], plot.svg[opening:]
        if not body.lstrip().startswith("<title"):  # a <title> further in is some element's tooltip
            body = f"<title>{_e(plot.title)}</title><desc>{_e(plot.title)}, as drawn by the chaos report</desc>{body}"
        if "xmlns=" in head:
            return head + body
        head = head.replace("<svg ", f'<svg xmlns="{NAMESPACE}" ', 1)
        background = '<rect x="0" y="0" width="100%" height="100%" fill="#ffffff"/>'
        return f"{head}<style>text {{ {FONT} }}</style>{background}{body}"
    return bar_svg(plot, standalone) if plot.kind == "bar" else line_svg(plot, standalone)
