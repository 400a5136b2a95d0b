"""Tables that fit the terminal: a column list in, a rich Table out, never an ellipsis in every cell.

A command describes its table as a list of `Column`s (name, alignment, whether it may be dropped)
and rows of cells (text with rich markup). `fit_table` measures each column's natural width; while
the table would be wider than the console (80 columns when output is not a terminal), it drops
the optional columns, last listed first, and says which ones it dropped; what still does not fit
is wrapped, cell by cell, instead of cut. Adding a column to a command is adding it to its list.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

# rich's default box: one space of padding on each side of a cell and one rule between cells.
CELL_OVERHEAD = 3
TABLE_OVERHEAD = 1


class Column(NamedTuple):
    name: str
    justify: str = "left"  # "left" | "right"
    optional: bool = False  # may be dropped on a narrow terminal


def _cell_width(cell: str | Text) -> int:
    text = cell if isinstance(cell, Text) else Text.from_markup(cell)
    return max((len(line) for line in text.plain.split("\n")), default=0)


def _needed(columns: Sequence[Column], rows: Sequence[Sequence[str | Text]], keep: list[int]) -> int:
    widths = [max([len(columns[index].name)] + [_cell_width(row[index]) for row in rows]) for index in keep]
    return sum(widths) + CELL_OVERHEAD * len(keep) + TABLE_OVERHEAD


def fit_table(columns: Sequence[Column], rows: Sequence[Sequence[str | Text]], width: int,
              title: str | None = None) -> tuple[Table, list[str]]:
    """The table with the columns that fit `width`, and the names of those it dropped."""
    keep = list(range(len(columns)))
    optional = [index for index, column in enumerate(columns) if column.optional]
    dropped: list[str] = []
    while optional and _needed(columns, rows, keep) > width:
        index = optional.pop()
        keep.remove(index)
        dropped.insert(0, columns[index].name)
    table = Table(title=title, title_justify="left")
    for index in keep:
        table.add_column(columns[index].name, justify=columns[index].justify, overflow="fold")
    for row in rows:
        table.add_row(*(row[index] for index in keep))
    return table, dropped


def print_table(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str | Text]],
                title: str | None = None) -> None:
    table, dropped = fit_table(columns, rows, console.width, title)
    console.print(table)
    if dropped:
        console.print(f"({', '.join(dropped)} hidden to fit {console.width} columns; --json shows everything)",
                      highlight=False, style="dim")
