"""What a consumer-group member tells its operator on stderr: membership and where it reads.

A `railmq consume --group` member prints one line when it joins, is assigned partitions (and
where it starts reading each: its committed offset, or `auto_offset_reset` when the group has
none), has partitions revoked or loses them, retries a record and dead-letters one, and leaves.
Records go to stdout; these lines go to stderr, so a pipe of records stays clean, and `--quiet`
silences them (errors are printed whatever `--quiet` says).

The lines are built by pure functions (`joined_line`, `start_line`, ...), which tests read. A line
may quote an error a handler raised about a record, so `Notices` prints each control character in
it as its escape (railmq/terminal_text.py): one notice, one line, nothing a terminal acts on.
"""

from __future__ import annotations

import sys
from typing import TextIO

from railmq.records import TopicPartition
from railmq.terminal_text import visible

# A line names at most this many partitions, then says how many more.
PARTITIONS_SHOWN_MAX = 12


def partition_list(partitions: list[TopicPartition]) -> str:
    names = [f"{tp.topic}/{tp.partition}" for tp in sorted(partitions)]
    if not names:
        return "no partitions"
    extra = len(names) - PARTITIONS_SHOWN_MAX
    return ", ".join(names[:PARTITIONS_SHOWN_MAX]) + (f" and {extra} more" if extra > 0 else "")


def joined_line(group: str, member_id: str, generation: int) -> str:
    return f"group {group}: joined as {member_id} (generation {generation})"


def assigned_line(group: str, partitions: list[TopicPartition], generation: int) -> str:
    if not partitions:
        return (f"group {group}: generation {generation} assigned this member nothing new "
                "(more members than partitions leaves some idle)")
    return f"group {group}: assigned {partition_list(partitions)} (generation {generation})"


def start_line(group: str, starts: dict[TopicPartition, int], committed: dict[TopicPartition, int | None],
               reset: str) -> str:
    """Where each newly assigned partition starts: `orders/0 at 5 (committed)`, or at the reset
    position when the group has no commit for it — with the way to read what is already there."""
    parts = []
    for tp in sorted(starts):
        why = "committed" if committed.get(tp) is not None else f"no commit yet: {reset}"
        parts.append(f"{tp.topic}/{tp.partition} at {starts[tp]} ({why})")
    line = f"group {group}: starts " + ", ".join(parts)
    if reset == "latest" and any(committed.get(tp) is None for tp in starts):
        line += "; records already there are skipped (--from-beginning reads them)"
    return line


def revoked_line(group: str, partitions: list[TopicPartition]) -> str:
    return f"group {group}: revoked {partition_list(partitions)} (a rebalance moves them; committed first)"


def lost_line(group: str, partitions: list[TopicPartition]) -> str:
    return (f"group {group}: lost {partition_list(partitions)} (this member was fenced; whoever owns "
            "them now redelivers what was not committed)")


def left_line(group: str, handled: int) -> str:
    return f"group {group}: left after handling {handled} record{'' if handled == 1 else 's'}"


def error_text(error: BaseException) -> str:
    """`Type: message`. A handler's exception whose str() fails itself must not turn a notice
    into a second failure: that one escaped the retry loop on every redelivery, for good."""
    try:
        return f"{type(error).__name__}: {error}"
    except Exception:
        return f"{type(error).__name__}: <str() failed>"


def retry_line(where: str, attempt: int, attempts: int, backoff_ms: int, error: BaseException) -> str:
    return (f"retrying {where} in {backoff_ms} ms (attempt {attempt} of {attempts} failed: "
            f"{error_text(error)})")


def dead_letter_line(where: str, destination: str, attempts: int, reason: str, error: BaseException) -> str:
    return (f"dead-lettered {where} to {destination} after {attempts} attempt{'' if attempts == 1 else 's'} "
            f"({reason}: {error_text(error)})")


class Notices:
    """Prints notice lines to `output` (stderr by default) unless quiet."""

    def __init__(self, quiet: bool = False, output: TextIO | None = None) -> None:
        self.quiet = quiet
        self.output = output

    def __call__(self, line: str) -> None:
        if self.quiet:
            return
        output = self.output or sys.stderr
        output.write(visible(line) + "\n")
        output.flush()
