"""Text the cluster hands over, made safe to print on an operator's terminal.

Any local process may choose group ids, client ids, member ids, group instance ids, commit
metadata, error texts, record keys, values and headers (docs/security.md), and the operator's
tools print them. Printed raw, an ESC in one clears the screen or moves the cursor to rewrite
earlier rows (a table that lies), writes the clipboard (OSC 52) or plants a hyperlink (OSC 8); a
carriage return overwrites its line; U+202E shows what follows reversed. Through rich, a `[/]`
in it raised `MarkupError` and a `[link=...]` became a link.

The rule, kept by every command that prints such text:

- `visible(text)` replaces each control character (C0, DEL, C1), each bidirectional control and
  the Unicode line and paragraph separators with its Python escape (`\\x1b`, `\\r`, `\\u202e`):
  the operator sees that it is there, and the terminal does nothing with it. Everything else,
  backslashes included, is left as it is, so ordinary names print unchanged.
- `cell(text)` is `visible` for text that rich reads as markup: the result is also escaped, so
  client text is never markup.
- `json_visible(document)` does the same for JSON printed with `ensure_ascii=False`, as `\\u`
  escapes that decode to the same value: JSON escapes C0 itself but not DEL, C1 or U+202E.

This module is a leaf (rich only), so the command line, the group member and `railmq top` share it.
"""

from __future__ import annotations

import re

from rich.markup import escape

# C0 and C1 controls and DEL; ALM and the marks LRM and RLM; the line and paragraph separators and
# the bidi embeddings and overrides (U+2028..U+202E); the bidi isolates (U+2066..U+2069).
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
# What JSON leaves raw: it escapes C0 in strings itself, and C0 outside strings is its whitespace.
UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, keep: str = "") -> str:
    """`text` with every control character shown as its escape; those in `keep` stay as they are
    (a multi-line value printed on its own may keep its newlines and tabs)."""
    if not keep:
        return UNSAFE.sub(_escaped, text)
    return UNSAFE.sub(lambda match: match.group() if match.group() in keep else _escaped(match), text)


def cell(text: str) -> str:
    """`visible(text)` as rich markup that shows exactly that text."""
    return escape(visible(text))


def json_visible(document: str) -> str:
    """A JSON text with the controls JSON leaves raw (DEL, C1, bidi) as `\\u` escapes: the same
    value to a parser. Only strings hold such characters, so the structure is untouched."""
    return UNSAFE_IN_JSON.sub(lambda match: f"\\u{ord(match.group()):04x}", document)
