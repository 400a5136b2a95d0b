"""`consume -f FORMAT`: records printed by a format string, as kcat's `-f` and rpk's `--format` do.

Tokens (kcat's names, with rpk's where kcat has none):

    %t topic        %p partition    %o offset        %T timestamp (ms since the epoch)
    %k key          %K key length   %s or %v value   %S or %V value length
    %h headers as name=value pairs, comma-separated  %H header count
    %%  a percent sign;  \\n \\t \\r \\\\  newline, tab, carriage return, backslash

A null key or value prints as nothing (its length as -1, as kcat does); bytes that are not UTF-8
print with backslash escapes. There is no implicit newline: end the format with `\\n`.
`compile_format` checks the whole string once and raises ValueError naming an unknown token.
"""

from __future__ import annotations

from typing import Callable

from railmq.records import ConsumerRecord

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


def compile_format(text: str) -> Callable[[ConsumerRecord], str]:
    """A function rendering one record by `text`; ValueError for an unknown % token or escape."""
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
                pieces += ["".join(literal), TOKENS[following]]
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
