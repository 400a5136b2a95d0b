"""`consume -f FORMAT`: records printed by a format string, as kcat's `-f` and rpk's `--format` do.

Tokens (kcat's names, with rpk's where kcat has none):

    %t topic        %p partition    %o offset        %T timestamp (ms since the epoch)
    %k key          %K key length   %s or %v value   %S or %V value length
    %h headers as name=value pairs, comma-separated  %H header count
    %%  a percent sign;  \\n \\t \\r \\\\  newline, tab, carriage return, backslash

A null key or value prints as nothing (its length as -1, as kcat does); bytes that are not UTF-8
print with backslash escapes. There is no implicit newline: end the format with `\\n`.
`compile_format` checks the whole string once and raises ValueError naming an unknown token.

Keys, values and headers are whatever a producer wrote. To a pipe or a file they go as they are,
as kcat and Kafka's console consumer print them; on a terminal (`terminal=True`) every control
character in them but newline and tab is shown as its escape (`\\x1b`), as `ls` shows file names
on a terminal, so a record cannot clear the screen, rewrite earlier lines or set the clipboard
(railmq/terminal_text.py). `record_renderer` picks the format a consumer prints with.
"""

from __future__ import annotations

from typing import Callable

from railmq.cli_common import render_record
from railmq.records import ConsumerRecord
from railmq.terminal_text import visible

Piece = Callable[[ConsumerRecord], str]


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", errors="backslashreplace")


def _length(data: bytes | None) -> str:
    return "-1" if data is None else str(len(data))


def _headers(record: ConsumerRecord) -> str:
    return ",".join(f"{name}={_text(data)}" for name, data in record.headers or [])


TOKENS: dict[str, Piece] = {
    "t": lambda record: record.topic,
    "p": lambda record: str(record.partition),
    "o": lambda record: str(record.offset),
    "T": lambda record: str(record.timestamp_ms),
    "k": lambda record: _text(record.key),
    "K": lambda record: _length(record.key),
    "s": lambda record: _text(record.value),
    "v": lambda record: _text(record.value),
    "S": lambda record: _length(record.value),
    "V": lambda record: _length(record.value),
    "h": _headers,
    "H": lambda record: str(len(record.headers or [])),
}
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
# The tokens printing what a producer wrote (the topic's name is the cluster's: checked when made).
PRODUCERS_TOKENS = frozenset("kKsvh")


def _on_a_terminal(piece: Piece) -> Piece:
    return lambda record: visible(piece(record), keep="\n\t")


def compile_format(text: str, terminal: bool = False) -> Callable[[ConsumerRecord], str]:
    """A function rendering one record by `text`; ValueError for an unknown % token or escape.
    `terminal`: show the controls in keys, values and headers as escapes."""
    pieces: list[Piece | str] = []
    literal: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        following = text[index + 1] if index + 1 < len(text) else ""
        if char == "%":
            if following == "%":
                literal.append("%")
            elif following in TOKENS:
                piece = TOKENS[following]
                shown = terminal and following in PRODUCERS_TOKENS
                pieces += ["".join(literal), _on_a_terminal(piece) if shown else piece]
                literal = []
            else:
                raise ValueError(f"unknown format token %{following} at position {index}; known: "
                                 + " ".join(f"%{name}" for name in TOKENS))
            index += 2
        elif char == "\\" and following in ESCAPES:
            literal.append(ESCAPES[following])
            index += 2
        else:
            literal.append(char)
            index += 1
    pieces.append("".join(literal))
    parts = [piece for piece in pieces if piece != ""]

    def render(record: ConsumerRecord) -> str:
        return "".join(piece if isinstance(piece, str) else piece(record) for piece in parts)
    return render


def record_renderer(output_format: str | None, as_json: bool,
                    terminal: bool) -> Callable[[ConsumerRecord], str]:
    """How a consumer prints each record: by `-f`'s format, else as JSON or as the human line
    (both always free of terminal controls: railmq/cli_common.py)."""
    if output_format:
        return compile_format(output_format, terminal=terminal)
    return lambda record: render_record(record, as_json) + "\n"
