"""The coordinator's key-value map, replicated by the controller quorum (docs/raft.md §9).

It offers what the coordinator uses of `storage.state.DurableState` — `get`, `items(prefix)`,
`put`, `put_many`, `delete`, `flush` — and is the Raft `StateMachine` of every controller:

- `committed`: the map as of the last applied entry, on every voter alike;
- `working`: what the active controller's `Coordinator` reads, the committed map plus its own
  writes not yet committed. On a voter that does not lead, `working` *is* `committed`.

A write is recorded in `working` and in `pending`; the controller turns everything pending into
one Raft command at the end of the coordinator's step (`take_commands`), so a group of changes
(a new topic and its partitions) commits all together or not at all, as `PUT_MANY` does in the
journal. `flush` does nothing: durability is the commit of the proposal, which the controller
waits for before releasing what the coordinator guarded with `AfterFlush`.

A command is a msgpack list of operations `[PUT, key, value]` or `[DELETE, key]`; a snapshot is
the committed map as a msgpack map. Both are decoded as untrusted (they come from the Raft log,
which a peer wrote): a malformed command raises `BadCommand`, which the controller treats as
corruption of its log, never as something to skip.

A step whose command would not fit one entry of the log (`entry_bytes_max`: a tick that expires
locks in many share-partitions at once) is proposed as consecutive entries instead, each a
command whose first operation is `[PART, number, count]`. The parts are kept aside as they are
applied and reach the map together with the last one, so the step still commits whole or not at
all. The leader appends a step's parts in one go, so in a committed log part k + 1 follows
part k. A no-op after an unfinished step (the next leader's, after a leader that died between
its parts) means the rest was lost, and every voter drops the parts it kept; any other entry
there is corruption, as a malformed command is. Parts kept when a snapshot is taken travel in it
(`[map, [next number, count, operations]]`).
"""

from __future__ import annotations

from typing import Any, Iterable

import msgspec
from sortedcontainers import SortedDict

from storage.raft_log import ENTRY_COMMAND, ENTRY_NOOP, RaftEntry
from storage.state import items_with_prefix

PUT, DELETE, PART = 0, 1, 2
KEY_BYTES_MAX = 1024
PART_HEADER_BYTES_MAX = 32  # a list header and `[PART, number, count]` with 64-bit integers

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


class BadCommand(ValueError):
    """A committed entry that is not a list of well-formed operations."""


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key or len(key) > KEY_BYTES_MAX:
        raise BadCommand(f"a state key is a non-empty string of at most {KEY_BYTES_MAX} characters, got {key!r:.80}")
    return key


def encode_command(operations: list[list[Any]]) -> bytes:
    return _encoder.encode(operations)


def split_command(operations: list[list[Any]], entry_bytes_max: int) -> list[bytes]:
    """`operations` as one command, or, when that passes `entry_bytes_max`, as parts that each
    fit (an operation larger than an entry on its own stays alone, and is refused as TOO_LARGE)."""
    whole = encode_command(operations)
    if len(whole) <= entry_bytes_max:
        return [whole]
    room = entry_bytes_max - PART_HEADER_BYTES_MAX
    parts: list[list[list[Any]]] = [[]]
    used = 0
    for operation in operations:
        size = len(_encoder.encode(operation))
        if parts[-1] and used + size > room:
            parts.append([])
            used = 0
        parts[-1].append(operation)
        used += size
    return [encode_command([[PART, number, len(parts)], *part]) for number, part in enumerate(parts, 1)]


def decode_command(data: bytes) -> list[tuple[int, str, Any]]:
    """A plain command's operations (`decode_part` for one that may be a part)."""
    part, operations = decode_part(data)
    if part is not None:
        raise BadCommand(f"a part {part} where a whole command was expected")
    return operations


def decode_part(data: bytes) -> tuple[tuple[int, int] | None, list[tuple[int, str, Any]]]:
    """(number, count) of a part, or None for a whole command, and its operations."""
    try:
        raw = _decoder.decode(data)
    except (msgspec.DecodeError, RecursionError) as error:
        raise BadCommand(f"an undecodable command ({error})") from None
    if not isinstance(raw, list):
        raise BadCommand("a command is a list of operations")
    part = None
    if raw and isinstance(raw[0], list) and raw[0] and raw[0][0] == PART:
        header, raw = raw[0], raw[1:]
        if (len(header) != 3 or not all(type(field) is int for field in header[1:])
                or not 1 <= header[1] <= header[2] or header[2] < 2):
            raise BadCommand(f"a malformed part header {header!r:.80}")
        part = (header[1], header[2])
    return part, _operations(raw)


def _operations(raw: list) -> list[tuple[int, str, Any]]:
    operations = []
    for operation in raw:
        if not isinstance(operation, list) or not operation or operation[0] not in (PUT, DELETE):
            raise BadCommand(f"an unknown operation {operation!r:.80}")
        if operation[0] == PUT and len(operation) == 3:
            operations.append((PUT, _check_key(operation[1]), operation[2]))
        elif operation[0] == DELETE and len(operation) == 2:
            operations.append((DELETE, _check_key(operation[1]), None))
        else:
            raise BadCommand(f"a malformed operation {operation!r:.80}")
    return operations


class ReplicatedState:
    def __init__(self) -> None:
        self.committed: SortedDict = SortedDict()
        self.working: SortedDict = self.committed
        self.pending: list[list[Any]] = []
        self.applied_index = 0
        self.applied_commands = 0
        # The parts of a step applied so far: (the next part's number, their count, operations).
        self.assembling: tuple[int, int, list[tuple[int, str, Any]]] | None = None
        self.steps_in_parts = 0  # steps applied whole from parts
        self.steps_dropped = 0  # steps whose last part never came (their leader died between parts)

    # ------------------------------------------------------------------ the DurableState face

    def get(self, key: str, default: Any = None) -> Any:
        return self.working.get(key, default)

    def items(self, prefix: str = "") -> list[tuple[str, Any]]:
        return items_with_prefix(self.working, prefix)

    def __len__(self) -> int:
        return len(self.working)

    def put(self, key: str, value: Any) -> None:
        self._write([PUT, _check_key(key), value])

    def put_many(self, items: Iterable[tuple[str, Any]]) -> None:
        for key, value in items:
            self.put(key, value)

    def delete(self, key: str) -> None:
        if key in self.working:
            self._write([DELETE, _check_key(key)])

    def flush(self) -> None:
        """Nothing to do: the controller waits for the command's commit instead."""

    def _write(self, operation: list[Any]) -> None:
        if self.working is self.committed:
            raise RuntimeError("a write to the replicated state on a controller that is not active")
        _apply_operation(self.working, operation)
        self.pending.append(operation)

    # ------------------------------------------------------------------ leading

    def activate(self) -> None:
        """This voter's coordinator starts writing: it reads committed state plus its own writes."""
        self.working = self.committed.copy()
        self.pending = []

    def deactivate(self) -> None:
        """Leadership is lost: uncommitted writes are forgotten (the entries may still commit
        under the new leader, and then arrive through `apply` like anyone else's)."""
        self.working = self.committed
        self.pending = []

    @property
    def active(self) -> bool:
        return self.working is not self.committed

    def take_commands(self, entry_bytes_max: int) -> list[bytes]:
        """Everything written since the last call, as commands of at most `entry_bytes_max` bytes
        each: one when it fits, else the parts of one step (empty when nothing was written)."""
        if not self.pending:
            return []
        commands, self.pending = split_command(self.pending, entry_bytes_max), []
        return commands

    # ------------------------------------------------------------------ the StateMachine face

    def apply(self, entry: RaftEntry) -> list[Any]:
        part, operations = decode_part(entry.data) if entry.kind == ENTRY_COMMAND else (None, [])
        if self.assembling is not None and entry.kind == ENTRY_NOOP:
            self.assembling = None  # a new leader: the rest of that step was lost with its leader
            self.steps_dropped += 1
        elif self.assembling is not None and part is None:
            raise BadCommand(f"a whole command where part {self.assembling[0]} of {self.assembling[1]} was due")
        if part is not None:
            operations = self._assemble(part, operations)
        if entry.kind == ENTRY_COMMAND and operations is not None:
            for op, key, value in operations:
                _apply_operation(self.committed, [op, key, value] if op == PUT else [op, key])
            self.applied_commands += 1
        self.applied_index = entry.index
        return []

    def _assemble(self, part: tuple[int, int], operations: list) -> list | None:
        """Keep a part aside; the whole step's operations once its last part came (else None)."""
        number, count = part
        if number == 1 and self.assembling is None:
            kept: list = []
        elif self.assembling is not None and self.assembling[:2] == (number, count):
            kept = self.assembling[2]
        else:
            due = "no part" if self.assembling is None else f"part {self.assembling[0]} of {self.assembling[1]}"
            raise BadCommand(f"part {number} of {count} where {due} was due")
        kept.extend(operations)
        if number == count:
            self.assembling = None
            self.steps_in_parts += 1
            return kept
        self.assembling = (number + 1, count, kept)
        return None

    def snapshot(self) -> bytes:
        if self.assembling is None:
            return _encoder.encode(dict(self.committed))
        number, count, operations = self.assembling
        return _encoder.encode([dict(self.committed), [number, count, [list(op) if op[0] == PUT else list(op[:2])
                                                                        for op in operations]]])

    def restore(self, data: bytes, index: int) -> None:
        try:
            raw = _decoder.decode(data) if data else {}
        except (msgspec.DecodeError, RecursionError) as error:
            raise BadCommand(f"an undecodable snapshot ({error})") from None
        assembling = None
        if isinstance(raw, list) and len(raw) == 2 and isinstance(raw[1], list) and len(raw[1]) == 3:
            raw, (number, count, operations) = raw
            if not (type(number) is int and type(count) is int and 2 <= number <= count
                    and isinstance(operations, list)):
                raise BadCommand(f"a snapshot with a malformed unfinished step {number!r:.20}/{count!r:.20}")
            assembling = (number, count, _operations(operations))
        if not isinstance(raw, dict):
            raise BadCommand("a snapshot is a map of keys to values")
        self.committed = SortedDict({_check_key(key): value for key, value in raw.items()})
        self.working = self.committed
        self.pending = []
        self.assembling = assembling
        self.applied_index = index


def _apply_operation(target: SortedDict, operation: list[Any]) -> None:
    if operation[0] == PUT:
        target[operation[1]] = operation[2]
    else:
        target.pop(operation[1], None)
