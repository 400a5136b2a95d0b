"""Checks on every inbound Raft message before any rule looks at it (STYLE rule 13).

The decoder already refused wrong types and negative numbers. What is left is what only the
receiver can judge: is the sender one of our voters (and not us), is the message for us, and is
its content something a correct peer could have sent (entries numbered one by one after
`prev_log_index`, terms that never go back and never pass the sender's term, sizes within the
configured bounds). A message that fails is dropped and counted (`dropped_<reason>`): it is an
operating error, and Raft tolerates lost messages by design.
"""

from __future__ import annotations

from actors.raft.config import RaftConfig
from actors.raft_messages import RaftAppendRequest, RaftMessage, RaftSnapshotRequest, RaftVoteRequest
from storage.raft_log import ENTRY_COMMAND, ENTRY_NOOP

ENTRY_KINDS = (ENTRY_COMMAND, ENTRY_NOOP)


def check_message(message: RaftMessage, config: RaftConfig) -> str | None:
    """None when `message` may be stepped; otherwise the reason to drop it."""
    if message.source not in config.voters:
        return "unknown_source"
    if message.source == config.node_id:
        return "from_self"
    if message.destination != config.node_id:
        return "wrong_destination"
    if isinstance(message, RaftAppendRequest):
        return _check_entries(message, config)
    if isinstance(message, RaftSnapshotRequest):
        if message.snapshot_term > message.term:
            return "snapshot_term_past_term"
        if len(message.data) > config.snapshot_chunk_bytes or message.offset + len(message.data) > config.snapshot_bytes_max:
            return "snapshot_too_large"
    if isinstance(message, RaftVoteRequest) and message.last_log_term > message.term:
        return "vote_log_term_past_term"
    return None


def _check_entries(message: RaftAppendRequest, config: RaftConfig) -> str | None:
    if message.prev_log_term > message.term:
        return "append_prev_term_past_term"
    if len(message.entries) > config.append_entries_max:
        return "append_too_many_entries"
    index, term = message.prev_log_index, message.prev_log_term
    for entry in message.entries:
        if entry.index != index + 1:
            return "append_entries_not_contiguous"
        if not term <= entry.term <= message.term:
            return "append_entry_term_out_of_order"
        if entry.kind not in ENTRY_KINDS:
            return "append_entry_unknown_kind"
        if len(entry.data) > config.entry_bytes_max:
            return "append_entry_too_large"
        index, term = entry.index, entry.term
    return None
