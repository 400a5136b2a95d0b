"""Simulated clients: the production producer and consumer actors, with deterministic shells.

In real processes `railmq.Producer` and `railmq.Consumer` wrap the client actors with threads;
here small shells play that part inside the event loop. They feed the actors exactly the
internal messages the real shells do (`SendBatch`, `ClientCommand`), read the same `Notify`
effects, and write every operation to the history in the chaos harness's format
(docs/history.md), so `chaos.checker` judges simulated runs with the same rules as real ones.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from actors.errors import ErrorCode
from actors.messages import ClientCommand, RefreshMetadata, SendBatch
from railmq.partitioner import partition_for_key
from railmq.records import decode_fetched

History = Callable[[dict], None]


class ProducerShell:
    """Sends keyed records with unique values; records invoke/ok/info per record."""

    def __init__(self, name: str, topic: str, keys: list[str], rng: random.Random, history: History,
                 records_per_batch: tuple[int, int], delivery_timeout_ms: int) -> None:
        self.name = name
        self.topic = topic
        self.keys = keys
        self.rng = rng
        self.history = history
        self.records_per_batch = records_per_batch
        self.delivery_timeout_ns = delivery_timeout_ms * 1_000_000
        self.partition_count = 0
        self.sequence = 0
        self.batch_ids = 0
        self.pending: dict[int, list[tuple[str, str]]] = {}
        self.metadata_asked = False

    def start(self) -> list[Any]:
        return [RefreshMetadata(topics=[self.topic])]

    def next_batch(self, now_ns: int) -> SendBatch | None:
        """One batch of records for one key's partition, or None until metadata is known."""
        if not self.partition_count:
            return None
        key = self.rng.choice(self.keys)
        partition = partition_for_key(key.encode(), self.partition_count)
        count = self.rng.randint(*self.records_per_batch)
        records, entries = [], []
        for _ in range(count):
            self.sequence += 1
            value = f"{self.name}:{key}:{self.sequence}"
            records.append((0, key.encode(), value.encode(), None))
            entries.append((key, value))
            self.history({"type": "invoke", "f": "send", "time_ns": now_ns, "process": self.name,
                          "topic": self.topic, "key": key, "value": value})
        self.batch_ids += 1
        self.pending[self.batch_ids] = entries
        return SendBatch(batch_id=self.batch_ids, topic=self.topic, partition=partition, records=records,
                         first_timestamp_ms=now_ns // 1_000_000, max_timestamp_ms=now_ns // 1_000_000,
                         deadline_ns=now_ns + self.delivery_timeout_ns)

    def on_notify(self, kind: str, payload: Any, now_ns: int) -> list[Any]:
        if kind == "metadata":
            for topic in payload:
                if topic.name == self.topic and topic.error == ErrorCode.NONE:
                    self.partition_count = len(topic.partitions)
            return []
        if kind != "batch-done":
            return []
        batch_id, partition, base_offset, error = payload
        for index, (key, value) in enumerate(self.pending.pop(batch_id, [])):
            line = {"time_ns": now_ns, "f": "send", "process": self.name, "topic": self.topic,
                    "key": key, "value": value}
            if error is None:
                line.update(type="ok", partition=partition, offset=base_offset + index)
            else:
                line.update(type="info", error=error.name)  # never definite: an earlier try may have landed
            self.history(line)
        return []

    def crashed(self, now_ns: int) -> None:
        """A killed producer's outstanding sends are indeterminate."""
        for entries in self.pending.values():
            for key, value in entries:
                self.history({"type": "info", "f": "send", "time_ns": now_ns, "process": self.name,
                              "topic": self.topic, "key": key, "value": value, "error": "crashed"})
        self.pending.clear()


class ConsumerShell:
    """A group member that processes every record it polls and commits its positions."""

    def __init__(self, name: str, group: str, topic: str, history: History) -> None:
        self.name = name
        self.group = group
        self.topic = topic
        self.history = history
        self.positions: dict[tuple[str, int], int] = {}
        self.sessions: dict[tuple[str, int], tuple[int, int]] = {}
        self.generation = -1
        self.member_id = ""
        self.commits: dict[int, dict] = {}  # at most one in flight: the history pairs results by process
        self.tokens = 0
        self.commit_wanted = False
        self.revoked_after_commit = False

    def start(self) -> list[Any]:
        return [ClientCommand(command="subscribe", arguments={"topics": [self.topic]})]

    def on_notify(self, kind: str, payload: Any, now_ns: int) -> list[Any]:
        handler = getattr(self, f"_on_{kind.replace('-', '_')}", None)
        return handler(payload, now_ns) if handler is not None else []

    def _on_records(self, payload: Any, now_ns: int) -> list[Any]:
        topic, partition, session, batches, _ = payload
        key = (topic, partition)
        consumed = [ClientCommand(command="consumed", arguments={"bytes": len(batches)})]
        if session < self.sessions.get(key, (0, 0)) or key not in self.positions:
            return consumed
        self.sessions[key] = session
        records = decode_fetched(topic, partition, batches, self.positions[key])
        if not records:
            return consumed
        self.positions[key] = records[-1].offset + 1
        self.history({"type": "ok", "f": "poll", "time_ns": now_ns, "process": self.name, "group": self.group,
                      "member": self.member_id, "generation": self.generation, "topic": topic,
                      "records": [[r.partition, r.offset, r.key.decode(), r.value.decode()] for r in records]})
        return consumed + self.commit(None, now_ns)  # processed: commit (at-least-once)

    def _on_position(self, payload: Any, now_ns: int) -> list[Any]:
        topic, partition, session, offset = payload
        key = (topic, partition)
        if session >= self.sessions.get(key, (0, 0)):
            self.sessions[key] = session
            self.positions[key] = offset
        return []

    def _on_assigned(self, payload: Any, now_ns: int) -> list[Any]:
        generation, member_id, owned, added = payload
        self.generation, self.member_id = generation, member_id
        owned_keys = {tuple(tp) for tp in owned}
        for key in list(self.positions):
            if key not in owned_keys or key in {tuple(tp) for tp in added}:
                del self.positions[key]
        for key in added:
            self.sessions[tuple(key)] = (0, 0)
        self.history({"type": "ok", "f": "assign", "time_ns": now_ns, "process": self.name, "group": self.group,
                      "member": member_id, "generation": generation, "topic": self.topic,
                      "partitions": sorted(p for _, p in owned)})
        return []

    def _on_revoke(self, payload: Any, now_ns: int) -> list[Any]:
        """Commit what was processed of the revoked partitions, then let the rebalance go on
        (a real shell commits synchronously in on_revoke before answering)."""
        partitions, lost = payload
        if lost:
            for tp in partitions:
                self.positions.pop(tuple(tp), None)
            return [ClientCommand(command="revoked")]
        if self.commits:
            self.revoked_after_commit = True  # the commit in flight covers them: answer when it is done
            self.pending_revocation = [tuple(tp) for tp in partitions]
            return []
        commands = self.commit([tuple(tp) for tp in partitions], now_ns)
        for tp in partitions:
            self.positions.pop(tuple(tp), None)
        return commands + [ClientCommand(command="revoked")]

    def _on_result(self, payload: Any, now_ns: int) -> list[Any]:
        token, _, error = payload
        invoked = self.commits.pop(token, None)
        if invoked is None:
            return []
        line = dict(invoked, time_ns=now_ns)
        if error is None:
            line["type"] = "ok"
        else:
            definite = error.code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID,
                                      ErrorCode.FENCED_INSTANCE_ID, ErrorCode.REBALANCE_IN_PROGRESS)
            line.update(type="fail" if definite else "info", error=error.name)
        self.history(line)
        commands: list[Any] = []
        if self.revoked_after_commit:
            self.revoked_after_commit = False
            partitions = self.pending_revocation
            commands += self.commit(partitions, now_ns)
            for tp in partitions:
                self.positions.pop(tp, None)
            commands.append(ClientCommand(command="revoked"))
        elif self.commit_wanted:
            self.commit_wanted = False
            commands += self.commit(None, now_ns)
        return commands

    def commit(self, partitions: list[tuple[str, int]] | None, now_ns: int) -> list[Any]:
        if self.commits:
            self.commit_wanted = True  # one commit at a time; the next covers the latest positions
            return []
        wanted = partitions if partitions is not None else list(self.positions)
        offsets = {key: self.positions[key] for key in wanted if key in self.positions}
        if not offsets or self.generation < 0:
            return []
        self.tokens += 1
        line = {"type": "invoke", "f": "commit", "time_ns": now_ns, "process": self.name, "group": self.group,
                "member": self.member_id, "generation": self.generation, "topic": self.topic,
                "offsets": {str(partition): offset for (_, partition), offset in sorted(offsets.items())}}
        self.history(line)
        self.commits[self.tokens] = line
        entries = [[topic, partition, offset, ""] for (topic, partition), offset in sorted(offsets.items())]
        return [ClientCommand(command="commit", arguments={"offsets": entries}, token=self.tokens)]

    def crashed(self, now_ns: int) -> None:
        for line in self.commits.values():
            self.history(dict(line, type="info", time_ns=now_ns, error="crashed"))
        self.commits.clear()
        self.commit_wanted = self.revoked_after_commit = False
        self.positions.clear()
        self.sessions.clear()
