"""The checker's ledger: one pass over a history, keyed by value; judging happens afterwards.

It owns the reading of the lines and nothing else: it judges nothing and never talks to a
cluster. `Ledger.feed` takes each typed line once, in recorded order (format: docs/history.md,
parsing: chaos.history), and fills one `SendRecord` per value (values are unique across a run),
the log of every partition as acknowledgements, polls and final reads showed it, the conflicts
between them, the poll streams, the commits, the faults, the replica logs and the hygiene. The
rules of chaos/checker_rules.py read these records, so a field added here is a field they may
use; chaos/checker.py runs the pass, then the rules.

A malformed history (a send invoked twice, a completion naming no value) raises
`MalformedHistory` with its line number. Each step is constant time, so a million operations
pass in seconds.
"""

from __future__ import annotations

import msgspec

from chaos.history import (
    AssignLine,
    CommitLine,
    ConfigLine,
    FaultLine,
    FinalReadLine,
    HealLine,
    HistoryLine,
    HygieneLine,
    Key,
    MalformedHistory,
    PollLine,
    ReplicaLogLine,
    SendLine,
    Value,
)
from chaos.verdict import ANOMALIES_PER_KIND_MAX, PollBreak, Position


class SendRecord(msgspec.Struct, gc=False):
    """Everything the history says about one value. Created by its invoke, or by its first read.

    Untracked by the garbage collector (gc=False): a million of these would otherwise make every
    full collection walk them all, and they hold no reference cycles.
    """

    value: Value
    topic: str
    key: Key
    invoke_ns: int | None = None
    invoked: bool = False
    outcome: str | None = None  # "ok" | "fail" | "info" | None (never answered)
    complete_ns: int | None = None
    ack_partition: int | None = None
    ack_offset: int | None = None
    position: Position | None = None  # first place the value was seen (ack or read)
    reader: str | None = None  # who read it first (a process, or "final-read"); None: never read
    final: Position | None = None  # where the final read found it

    @property
    def sent(self) -> bool:
        return self.invoked or self.outcome is not None


class Ledger:
    """One pass over the history, keyed by value; judging happens afterwards."""

    def __init__(self) -> None:
        self.config = ConfigLine(type="config", time_ns=0)
        self.sends: dict[Value, SendRecord] = {}
        self.pending_sends: dict[tuple[str, Key], Value] = {}
        self.log: dict[tuple[str, int], dict[int, Value]] = {}
        self.offset_conflicts: dict[Position, list[Value]] = {}
        self.value_conflicts: dict[Value, list[Position]] = {}
        self.highest_polled: dict[tuple[str, int], int] = {}
        self.final_partitions: set[tuple[str, int]] = set()
        self.final_topics: set[str] = set()
        self.polls = 0
        self.deliveries: dict[str, dict[Value, int]] = {}
        self.group_topics: dict[str, set[str]] = {}
        self.poll_positions: dict[tuple[str, str, int | None, str, int], int] = {}
        self.poll_violations = 0
        self.poll_breaks_by_partition: dict[tuple[str, int], int] = {}
        self.poll_breaks: list[PollBreak] = []
        self.pending_commits: dict[str, tuple[int, dict[int, int]]] = {}
        self.commits: dict[tuple[str, str, int], list[tuple[int | None, int, int]]] = {}
        self.faults: list[FaultLine] = []
        self.heal_ns: int | None = None
        self.hygiene = HygieneLine(type="hygiene", time_ns=0)
        self.replica_logs: dict[tuple[str, int], list[ReplicaLogLine]] = {}

    def feed(self, typed: HistoryLine, line_number: int) -> None:
        match typed:
            case SendLine(type="invoke"):
                self._on_send_invoke(typed, line_number)
            case SendLine():
                self._on_send_completion(typed, line_number)
            case PollLine(type="ok"):
                self._on_poll(typed)
            case CommitLine(type="invoke"):
                self.pending_commits[typed.process] = (typed.time_ns, typed.offsets)
            case CommitLine(type="ok"):
                self._on_commit_ok(typed)
            case CommitLine():
                self.pending_commits.pop(typed.process, None)
            case AssignLine(type="ok"):
                self.group_topics.setdefault(typed.group, set()).add(typed.topic)
            case FaultLine():
                self.faults.append(typed)
            case HealLine():
                self.heal_ns = typed.time_ns if self.heal_ns is None else self.heal_ns
            case FinalReadLine():
                self._on_final_read(typed)
            case ReplicaLogLine():
                self.replica_logs.setdefault((typed.topic, typed.partition), []).append(typed)
            case HygieneLine():
                self.hygiene = typed
            case ConfigLine():
                self.config = typed
            case _:
                pass  # polls that returned nothing, failed polls and assigns, kinds from newer writers

    def _send_for(self, value: Value, topic: str, key: Key) -> SendRecord:
        record = self.sends.get(value)
        if record is None:
            record = self.sends[value] = SendRecord(value, topic, key)
        return record

    def _partition_log(self, topic: str, partition: int) -> dict[int, Value]:
        slot = self.log.get((topic, partition))
        if slot is None:
            slot = self.log[(topic, partition)] = {}
        return slot

    def _on_send_invoke(self, line: SendLine, line_number: int) -> None:
        if line.value is None:
            raise MalformedHistory(line_number, "send invoke without a value")
        record = self._send_for(line.value, line.topic, line.key)
        if record.invoked:
            raise MalformedHistory(line_number, f"value {line.value!r} is sent twice (values must be unique)")
        record.invoked, record.invoke_ns = True, line.time_ns
        record.topic, record.key = line.topic, line.key
        self.pending_sends[(line.process, line.key)] = line.value

    def _on_send_completion(self, line: SendLine, line_number: int) -> None:
        pairing = (line.process, line.key)
        pending = self.pending_sends.pop(pairing, None)
        value = line.value if line.value is not None else pending
        if value is None:
            raise MalformedHistory(line_number, f"send {line.type} names no value and completes no invoke")
        if pending is not None and pending != value:
            self.pending_sends[pairing] = pending  # this completion belongs to another invoke
        record = self._send_for(value, line.topic, line.key)
        if record.outcome is not None:
            raise MalformedHistory(line_number, f"send of value {value!r} completes twice")
        record.outcome, record.complete_ns = line.type, line.time_ns
        if line.type == "ok":
            record.ack_partition, record.ack_offset = line.partition, line.offset
            if line.partition is not None and line.offset is not None:
                slot = self._partition_log(line.topic, line.partition)
                self._observe(slot, line.topic, line.partition, line.offset, value, None)

    def _observe(
        self, slot: dict[int, Value], topic: str, partition: int, offset: int, value: Value,
        reader: str | None,
    ) -> SendRecord:
        """Note that `value` sits at (topic, partition, offset), `slot` being that partition's
        log; `reader` is None for an acknowledgement. The hottest path of the checker."""
        held = slot.setdefault(offset, value)
        if held != value:
            values = self.offset_conflicts.setdefault((topic, partition, offset), [held])
            if value not in values:
                values.append(value)
        record = self.sends.get(value)
        if record is None:
            record = self.sends[value] = SendRecord(value, topic, None)
        position = record.position
        if position is None:
            record.position = (topic, partition, offset)
        elif position[2] != offset or position[1] != partition or position[0] != topic:
            positions = self.value_conflicts.setdefault(value, [position])
            if (topic, partition, offset) not in positions:
                positions.append((topic, partition, offset))
        if reader is not None and record.reader is None:
            record.reader = reader
        return record

    def _on_poll(self, line: PollLine) -> None:
        self.polls += 1
        counts = self.deliveries.setdefault(line.group, {})
        self.group_topics.setdefault(line.group, set()).add(line.topic)
        member = line.member if line.member is not None else line.process
        topic, reader = line.topic, line.process
        for partition, offset, _key, value in line.records:
            counts[value] = counts.get(value, 0) + 1
            self._observe(self._partition_log(topic, partition), topic, partition, offset, value, reader)
            if offset > self.highest_polled.get((topic, partition), -1):
                self.highest_polled[(topic, partition)] = offset
            self._step_poll((line.group, member, line.generation, topic, partition), offset)

    def _step_poll(self, stream: tuple[str, str, int | None, str, int], offset: int) -> None:
        previous = self.poll_positions.get(stream)
        self.poll_positions[stream] = offset
        if previous is None or offset == previous + 1:
            return
        self.poll_violations += 1
        partition_key = (stream[3], stream[4])
        self.poll_breaks_by_partition[partition_key] = self.poll_breaks_by_partition.get(partition_key, 0) + 1
        if len(self.poll_breaks) < ANOMALIES_PER_KIND_MAX:
            kind = "backwards" if offset <= previous else "skip"
            self.poll_breaks.append(PollBreak(*stream, previous_offset=previous, offset=offset, kind=kind))

    def _on_commit_ok(self, line: CommitLine) -> None:
        invoke_ns, invoked_offsets = self.pending_commits.pop(line.process, (None, {}))
        for partition, offset in (line.offsets or invoked_offsets).items():
            stream = (line.group, line.topic, partition)
            self.commits.setdefault(stream, []).append((invoke_ns, line.time_ns, offset))

    def _on_final_read(self, line: FinalReadLine) -> None:
        topic, partition = line.topic, line.partition
        self.final_partitions.add((topic, partition))
        self.final_topics.add(topic)
        slot = self._partition_log(topic, partition)
        for offset, _key, value in line.entries:
            record = self._observe(slot, topic, partition, offset, value, "final-read")
            position = record.position
            if position is not None and position == (topic, partition, offset):
                record.final = position  # the common case: where it was first seen
            elif record.final is None or (record.ack_offset == offset and record.ack_partition == partition):
                record.final = (topic, partition, offset)  # the acknowledged place wins among several
