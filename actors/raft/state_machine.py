"""The seam between Raft and what it replicates, and the answers of the proposal API.

Raft hands every committed entry to a `StateMachine`, in index order, exactly once per index per
incarnation (a restarted controller restores the last snapshot and is handed the entries after
it again: the state machine lives in memory and is rebuilt, never patched). No-op entries (one
per new leader) are handed over too, with `kind == ENTRY_NOOP`, so the applied index moves one
by one and a state machine can see leadership changes in its log.

Only the active controller (the leader) may propose. `RaftNode.propose` answers one of:

- `Proposed(index, term, effects)`: appended at `index` in `term`. It is committed when the state
  machine is handed the entry at `index` with that term; an entry of another term at that index
  means the proposal was lost with its leader (answer the client NOT_CONTROLLER and let it retry).
- `NotController(leader_id, leader_endpoint, term)`: this node is not the leader; the hint names
  the leader it last heard from (0 and "" when it knows none: an election is under way).
  On the wire this becomes Kafka's NOT_CONTROLLER (41) with the hint (docs/raft.md).
- `ProposalRefused(reason, message)`: the leader cannot take it now (BUSY: too many uncommitted
  entries; TOO_LARGE: the entry exceeds entry_bytes_max).

`RaftNode.propose_many` appends several commands at consecutive indexes, all of them or none, and
answers the same with the last one's index (a step in parts: actors/replicated_state.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from storage.raft_log import RaftEntry


class StateMachine(Protocol):
    def apply(self, entry: RaftEntry) -> list[Any]:
        """Apply one committed entry; return effects (replies to clients, for the active one)."""

    def snapshot(self) -> bytes:
        """The whole state as of the last applied entry."""

    def restore(self, data: bytes, index: int) -> None:
        """Replace the whole state with a snapshot taken at `index`."""


class Proposed(NamedTuple):
    index: int
    term: int
    effects: list


class NotController(NamedTuple):
    leader_id: int
    leader_endpoint: str
    term: int


class ProposalRefused(NamedTuple):
    reason: str  # "BUSY" | "TOO_LARGE"
    message: str


ProposeResult = Proposed | NotController | ProposalRefused
