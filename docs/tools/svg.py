"""A small, deterministic SVG writer for the pictures in docs/pictures (docs/tools/draw_pictures.py).

Every picture is drawn by code from fixed inputs, so its file changes only when the drawing
code does, and `draw_pictures.py --check` can say exactly whether the committed files are
current. The output is self-contained: inline styles, a `<title>` and `<desc>` for screen
readers, no fonts, scripts or links.
"""

from __future__ import annotations

import html
from typing import Iterable

INK = "#1d2330"
MUTED = "#5b6474"
RULE = "#9aa3b2"
PALE = "#f4f6f9"
BLUE, BLUE_PALE = "#1f5fa8", "#dbe7f6"
GREEN, GREEN_PALE = "#137333", "#d9f0df"
AMBER, AMBER_PALE = "#8a5a00", "#fbeacc"
RED, RED_PALE = "#b3261e", "#f7d9d6"
PURPLE, PURPLE_PALE = "#6b3fa0", "#eadff5"

STYLE = ("text{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;fill:" + INK + "}"
         ".small{font-size:11px;fill:" + MUTED + "}.body{font-size:13px}.title{font-size:17px;font-weight:600}"
         ".head{font-size:14px;font-weight:600}.mono{font-family:ui-monospace,Menlo,monospace;font-size:12px}")


def _number(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


class Canvas:
    def __init__(self, width: int, height: int, title: str, description: str) -> None:
        self.width, self.height = width, height
        self.title, self.description = title, description
        self.parts: list[str] = []

    def rect(self, x: float, y: float, width: float, height: float, *, fill: str = PALE, stroke: str = RULE,
             radius: float = 4, dash: bool = False, stroke_width: float = 1) -> None:
        dashed = ' stroke-dasharray="5 4"' if dash else ""
        self.parts.append(f'<rect x="{_number(x)}" y="{_number(y)}" width="{_number(width)}" '
                          f'height="{_number(height)}" rx="{_number(radius)}" fill="{fill}" stroke="{stroke}" '
                          f'stroke-width="{_number(stroke_width)}"{dashed}/>')

    def text(self, x: float, y: float, words: str, *, css: str = "body", anchor: str = "start",
             fill: str | None = None, weight: str | None = None) -> None:
        colour = f' style="fill:{fill}"' if fill else ""
        bold = f' font-weight="{weight}"' if weight else ""
        self.parts.append(f'<text x="{_number(x)}" y="{_number(y)}" class="{css}" text-anchor="{anchor}"'
                          f'{colour}{bold}>{html.escape(words)}</text>')

    def lines(self, x: float, y: float, rows: Iterable[str], *, step: float = 16, **options: str) -> float:
        """Several lines of text from (x, y) down; returns the y after the last one."""
        for row in rows:
            self.text(x, y, row, **options)
            y += step
        return y

    def line(self, x1: float, y1: float, x2: float, y2: float, *, stroke: str = RULE, width: float = 1.5,
             dash: bool = False, arrow: bool = False) -> None:
        dashed = ' stroke-dasharray="5 4"' if dash else ""
        head = ' marker-end="url(#arrow)"' if arrow else ""
        self.parts.append(f'<line x1="{_number(x1)}" y1="{_number(y1)}" x2="{_number(x2)}" y2="{_number(y2)}" '
                          f'stroke="{stroke}" stroke-width="{_number(width)}"{dashed}{head}/>')

    def path(self, commands: str, *, stroke: str = RULE, width: float = 1.5, arrow: bool = False,
             dash: bool = False) -> None:
        dashed = ' stroke-dasharray="5 4"' if dash else ""
        head = ' marker-end="url(#arrow)"' if arrow else ""
        self.parts.append(f'<path d="{commands}" fill="none" stroke="{stroke}" stroke-width="{_number(width)}"'
                          f'{dashed}{head}/>')

    def circle(self, x: float, y: float, radius: float, *, fill: str, stroke: str = "none") -> None:
        self.parts.append(f'<circle cx="{_number(x)}" cy="{_number(y)}" r="{_number(radius)}" fill="{fill}" '
                          f'stroke="{stroke}"/>')

    def badge(self, x: float, y: float, number: int, *, fill: str = INK) -> None:
        """A numbered circle, the way the pictures point at what their captions explain."""
        self.circle(x, y, 10, fill=fill)
        self.text(x, y + 4, str(number), css="small", anchor="middle", fill="#ffffff", weight="600")

    def box(self, x: float, y: float, width: float, height: float, heading: str, rows: Iterable[str] = (), *,
            fill: str = PALE, stroke: str = RULE, dash: bool = False) -> None:
        """A rounded box with a bold heading and smaller lines under it."""
        self.rect(x, y, width, height, fill=fill, stroke=stroke, dash=dash)
        self.text(x + 10, y + 20, heading, css="head")
        self.lines(x + 10, y + 38, rows, css="small", step=15)

    def embed(self, x: float, y: float, svg: str) -> None:
        """Another SVG document (its root element) placed at (x, y)."""
        self.parts.append(svg.replace("<svg ", f'<svg x="{_number(x)}" y="{_number(y)}" ', 1))

    def render(self) -> str:
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width} {self.height}" '
                f'width="{self.width}" height="{self.height}" role="img" aria-labelledby="title desc">')
        defs = ('<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
                f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{MUTED}"/></marker></defs>')
        return "\n".join([head, f'<title id="title">{html.escape(self.title)}</title>',
                          f'<desc id="desc">{html.escape(self.description)}</desc>', f"<style>{STYLE}</style>", defs,
                          f'<rect x="0" y="0" width="{self.width}" height="{self.height}" fill="#ffffff"/>',
                          *self.parts, "</svg>"]) + "\n"
