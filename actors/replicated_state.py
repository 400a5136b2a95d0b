"""The coordinator's key-value map, replicated by the controller quorum (docs/raft.md §9).

It offers what the coordinator uses of `storage.state.DurableState` — `get`, `items(prefix)`,
`put`, `put_many`, `delete`, `flush` — and is the Raft `StateMachine` of every controller:

- `committed`: the map as of the last applied entry, on every voter alike;
- `working`: what the active controller's `Coordinator` reads, the committed map plus its own
  writes not yet committed. On a voter that does not lead, `working` *is* `committed`.

A write is recorded in `working` and in `pending`; the controller turns everything pending into
one Raft command at the end of the coordinator's step (`take_command`), so a group of changes
(a new topic and its partitions) commits all together or not at all, as `PUT_MANY` does in the
journal. `flush` does nothing: durability is the commit of the proposal, which the controller
waits for before releasing what the coordinator guarded with `AfterFlush`.

A command is a msgpack list of operations `[PUT, key, value]` or `[DELETE, key]`; a snapshot is
the committed map as a msgpack map. Both are decoded as untrusted (they come from the Raft log,
which a peer wrote): a malformed command raises `BadCommand`, which the controller treats as
corruption of its log, never as something to skip.
"""

from __future__ import annotations

from typing import Any, Iterable

import msgspec
from sortedcontainers import SortedDict

from storage.raft_log import ENTRY_COMMAND, RaftEntry
from storage.state import items_with_prefix

PUT, DELETE = 0, 1
KEY_BYTES_MAX = 1024

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


def decode_command(data: bytes) -> list[tuple[int, str, Any]]:
    try:
        raw = _decoder.decode(data)
    except (msgspec.DecodeError, RecursionError) as error:
        raise BadCommand(f"an undecodable command ({error})") from None
    if not isinstance(raw, list):
        raise BadCommand("a command is a list of operations")
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

    def take_command(self) -> bytes | None:
        """Everything written since the last call, as one command (None when nothing was)."""
        if not self.pending:
            return None
        data, self.pending = encode_command(self.pending), []
        return data

    # ------------------------------------------------------------------ the StateMachine face

    def apply(self, entry: RaftEntry) -> list[Any]:
        if entry.kind == ENTRY_COMMAND:
            for op, key, value in decode_command(entry.data):
                _apply_operation(self.committed, [op, key, value] if op == PUT else [op, key])
            self.applied_commands += 1
        self.applied_index = entry.index
        return []

    def snapshot(self) -> bytes:
        return _encoder.encode(dict(self.committed))

    def restore(self, data: bytes, index: int) -> None:
        try:
            raw = _decoder.decode(data) if data else {}
        except (msgspec.DecodeError, RecursionError) as error:
            raise BadCommand(f"an undecodable snapshot ({error})") from None
        if not isinstance(raw, dict):
            raise BadCommand("a snapshot is a map of keys to values")
        self.committed = SortedDict({_check_key(key): value for key, value in raw.items()})
        self.working = self.committed
        self.pending = []
        self.applied_index = index


def _apply_operation(target: SortedDict, operation: list[Any]) -> None:
    if operation[0] == PUT:
        target[operation[1]] = operation[2]
    else:
        target.pop(operation[1], None)
