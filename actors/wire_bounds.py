"""How many items a request's list or map may carry on the wire, as msgspec types for the fields
of actors/messages.py and actors/raft_messages.py. A message is decoded whole before any rule
reads it, so the decoder checks these lengths before it builds a list (actors/limits.py,
`LONG_LIST_MAX`, says what a list of tiny items cost without them); docs/protocol.md shows each.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from actors.limits import LONG_LIST_MAX, SETTINGS_MAX, SHORT_LIST_MAX

LONG = msgspec.Meta(max_length=LONG_LIST_MAX)
SHORT = msgspec.Meta(max_length=SHORT_LIST_MAX)
SETTINGS = msgspec.Meta(max_length=SETTINGS_MAX)
Names = Annotated[list[str], LONG]
PartitionKeys = Annotated[list[tuple[str, int]], LONG]
NodeIds = Annotated[list[int], SHORT]
# One setting's value: a TopicConfig field's type, or a wrong one the coordinator names
# (INVALID_CONFIG); never a list or a map, which could hold millions of items.
Setting = int | float | bool | str | None
Settings = Annotated[dict[str, Setting], SETTINGS]


def text_bytes(text: str) -> int:
    """The bytes a client's text takes as msgpack carries it and the state stores it (UTF-8). A
    count of characters is not a bound in bytes: a character above U+FFFF is 4 bytes, and one of
    4,096 such characters was counted as 4 KiB of a byte budget while it took 16 KiB in every
    answer and record (in memory, 4 bytes a character and 4 more once encoded, which CPython keeps)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
