"""Simulated clients: the production producer and consumer actors, with deterministic shells.

In real processes `railmq.Producer` and `railmq.Consumer` wrap the client actors with threads;
here small shells play that part inside the event loop. They feed the actors exactly the
internal messages the real shells do (`SendBatch`, `ClientCommand`), read the same `Notify`
effects, and write every operation to the history in the chaos harness's format
(docs/history.md), so `chaos.checker` judges simulated runs with the same rules as real ones.

The consumer shell plays `railmq.Consumer` with a user who processes what `poll` returns: a poll
takes fetched records, processing them takes simulated time (`processing_ms`), and only then are
they consumed (a `poll` line in the history) and committable — the at-least-once rule "commit
what was processed, not what was fetched". As in railmq/group_consumer.py, assignments apply at
once (the I/O thread) while revocations wait for the user's thread: after the batch being
processed, the revoked partitions' processed positions are committed (synchronously: one commit
at a time, its answer awaited), then "revoked" is answered. Share-group members are in
chaos/sim_share.py.
"""

from __future__ import annotations

import random
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from actors.errors import ErrorCode
from actors.messages import ClientCommand, RefreshMetadata, SendBatch
from chaos.sim_hosts import Host
from chaos.sim_network import MS
from railmq.partitioner import partition_for_key
from railmq.records import decode_fetched

if TYPE_CHECKING:
    from chaos.simulator import Simulator

History = Callable[[dict], None]
METADATA_ASK_AGAIN_NS = 500 * 1_000_000  # the real shell's wait asks again at least this often
Later = Callable[[int, Callable[[int], list]], None]  # (delay_ns, action(now_ns) -> messages)
POLL_CHUNKS_MAX = 4  # fetched chunks one poll hands to processing


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
        self.metadata_asked_ns = 0

    def start(self) -> list[Any]:
        self.pending.clear()  # a new process: the batches of the one that died never get an outcome
        return [RefreshMetadata(topics=[self.topic])]

    def next_batch(self, now_ns: int) -> SendBatch | RefreshMetadata | None:
        """One batch of records for one key's partition; until metadata is known, the topic is
        asked for again every half second (as railmq/producer.py's wait does: the actor forgets a
        name no batch needs once nobody asked for it for a while), or None."""
        if not self.partition_count:
            if now_ns - self.metadata_asked_ns < METADATA_ASK_AGAIN_NS:
                return None
            self.metadata_asked_ns = now_ns
            return RefreshMetadata(topics=[self.topic])
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


Partition = tuple[str, int]


class ConsumerShell:
    """A group member's user: polls, processes for a while, commits what it processed."""

    def __init__(self, name: str, group: str, topic: str, history: History, rng: random.Random,
                 processing_ms: tuple[int, int], later: Later) -> None:
        self.name = name
        self.group = group
        self.topic = topic
        self.history = history
        self.rng = rng
        self.processing_ms = processing_ms
        self.later = later
        self.tokens = 0
        self._reset()

    def _reset(self) -> None:
        """A new process: nothing in memory but what the group and the log will tell it."""
        self.positions: dict[Partition, int] = {}  # the next offset to process: what a commit covers
        self.fetched: dict[Partition, int] = {}  # the next offset expected in fetched data
        self.sessions: dict[Partition, tuple[int, int]] = {}
        self.generation = -1
        self.member_id = ""
        self.owned: set[Partition] = set()
        self.chunks: deque[tuple[Partition, tuple[int, int], list]] = deque()  # fetched, not polled yet
        self.processing = False
        # Revocations waiting for the user's thread, in order: (partitions, lost, partitions of them
        # assigned again since: the answer must not take those from `owned`).
        self.callbacks: deque[tuple[list[Partition], bool, set[Partition]]] = deque()
        self.revoking: list[Partition] | None = None  # the revocation whose commit is awaited
        self.revoke_token = 0
        self.commits: dict[int, dict] = {}  # at most one in flight: the history pairs results by process
        self.commit_wanted = False

    def start(self) -> list[Any]:
        return [ClientCommand(command="subscribe", arguments={"topics": [self.topic]})]

    def holdings(self) -> set[Partition]:
        """The partitions this process works on: assigned, or revoked and not answered yet."""
        held = set(self.owned)
        for partitions, _, _ in self.callbacks:
            held.update(partitions)
        return held

    def on_notify(self, kind: str, payload: Any, now_ns: int) -> list[Any]:
        handler = getattr(self, f"_on_{kind.replace('-', '_')}", None)
        commands = handler(payload, now_ns) if handler is not None else []
        return commands + self._pump(now_ns)

    # ------------------------------------------------------------------ the I/O thread's side

    def _on_records(self, payload: Any, now_ns: int) -> list[Any]:
        topic, partition, session, batches, _, _ = payload
        key = (topic, partition)
        consumed = [ClientCommand(command="consumed", arguments={"bytes": len(batches)})]
        if session < self.sessions.get(key, (0, 0)) or key not in self.fetched:
            return consumed
        self.sessions[key] = session
        records = decode_fetched(topic, partition, batches, self.fetched[key])
        if records:
            self.fetched[key] = records[-1].offset + 1
            self.chunks.append((key, session, records))
        return consumed

    def _on_position(self, payload: Any, now_ns: int) -> list[Any]:
        topic, partition, session, offset = payload
        key = (topic, partition)
        if session >= self.sessions.get(key, (0, 0)):
            self.sessions[key] = session
            self.positions[key] = self.fetched[key] = offset
        return []

    def _on_assigned(self, payload: Any, now_ns: int) -> list[Any]:
        generation, member_id, owned, added = payload
        self.generation, self.member_id = generation, member_id
        self.owned = {tuple(tp) for tp in owned}
        fresh = {tuple(tp) for tp in added}
        for key in list(self.positions):
            if key not in self.owned or key in fresh:
                del self.positions[key]
                self.fetched.pop(key, None)
        self.chunks = deque(chunk for chunk in self.chunks if chunk[0] in self.owned and chunk[0] not in fresh)
        for key in fresh:
            self.sessions[key] = (0, 0)
        for partitions, _, came_back in self.callbacks:
            came_back.update(fresh & set(partitions))
        self.history({"type": "ok", "f": "assign", "time_ns": now_ns, "process": self.name, "group": self.group,
                      "member": member_id, "generation": generation, "topic": self.topic,
                      "partitions": sorted(p for _, p in self.owned)})
        return []

    def _on_revoke(self, payload: Any, now_ns: int) -> list[Any]:
        partitions, lost = payload
        self.callbacks.append(([tuple(tp) for tp in partitions], bool(lost), set()))
        return []

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
        if self.revoking is not None:
            if token == self.revoke_token:
                return self._finish_revocation()
            return self._commit_revoked(now_ns)  # the commit before it is done: now its own
        if self.commit_wanted:
            self.commit_wanted = False
            return self.commit(None, now_ns)
        return []

    # ------------------------------------------------------------------ the user's thread

    def _pump(self, now_ns: int) -> list[Any]:
        """What `poll` does when the user is free: run revocations in order, then take records."""
        commands: list[Any] = []
        while not self.processing and self.revoking is None and self.callbacks:
            partitions, lost, _ = self.callbacks[0]
            if lost:
                commands += self._finish_revocation()
                continue
            self.revoking = partitions
            self.revoke_token = 0
            if not self.commits:
                commands += self._commit_revoked(now_ns)
        if not self.processing and self.revoking is None and not self.callbacks:
            commands += self._poll()
        return commands

    def _commit_revoked(self, now_ns: int) -> list[Any]:
        offsets = {key: self.positions[key] for key in self.revoking if key in self.positions}
        commands = self._commit_offsets(offsets, now_ns)
        if not commands:
            return self._finish_revocation()
        self.revoke_token = self.tokens
        return commands

    def _finish_revocation(self) -> list[Any]:
        partitions, _, came_back = self.callbacks.popleft()
        self.revoking = None
        for key in partitions:  # as railmq/group_consumer.py does, whatever came back since
            self.positions.pop(key, None)
            self.fetched.pop(key, None)
        self.owned -= set(partitions) - came_back
        return [ClientCommand(command="revoked")]

    def _poll(self) -> list[Any]:
        taken: list[tuple[Partition, list]] = []
        while self.chunks and len(taken) < POLL_CHUNKS_MAX:
            key, session, records = self.chunks.popleft()
            position = self.positions.get(key)
            if position is None or session < self.sessions.get(key, (0, 0)):
                continue
            records = [record for record in records if record.offset >= position]
            if records:
                taken.append((key, records))
        if not taken:
            return []
        self.processing = True
        delay_ns = self.rng.randint(*self.processing_ms) * MS
        self.later(delay_ns, lambda now_ns: self._processed(taken, now_ns))
        return []

    def _processed(self, taken: list[tuple[Partition, list]], now_ns: int) -> list[Any]:
        self.processing = False
        for key, records in taken:
            if self.positions.get(key) == records[0].offset:
                self.positions[key] = records[-1].offset + 1
            self.history({"type": "ok", "f": "poll", "time_ns": now_ns, "process": self.name, "group": self.group,
                          "member": self.member_id, "generation": self.generation, "topic": key[0],
                          "records": [[r.partition, r.offset, r.key.decode(), r.value.decode()] for r in records]})
        return self.commit(None, now_ns) + self._pump(now_ns)  # processed: commit (at-least-once)

    def commit(self, partitions: list[Partition] | None, now_ns: int) -> list[Any]:
        """An asynchronous commit of processed positions (the auto-commit), one at a time."""
        if self.revoking is not None:
            return []  # the revocation's commit covers what matters now
        wanted = partitions if partitions is not None else list(self.positions)
        return self._commit_offsets({key: self.positions[key] for key in wanted if key in self.positions}, now_ns)

    def _commit_offsets(self, offsets: dict[Partition, int], now_ns: int) -> list[Any]:
        if self.commits:
            self.commit_wanted = True  # one commit at a time; the next covers the latest positions
            return []
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
        self._reset()


# ---------------------------------------------------------------------------- building the clients


def build_clients(sim: "Simulator") -> list[tuple[Host, Any]]:
    """Every client host of the run with its shell: producers, classic members, share members."""
    from chaos.sim_share import ShareShell
    from chaos.sim_config import GROUP, SHARE_GROUP, TOPIC

    config = sim.config
    rng = sim.workload_rng
    keys = [f"k{i}" for i in range(config.keys)]
    built: list[tuple[Host, Any]] = []
    for index in range(config.producers):
        name = f"producer-{index + 1}"
        shell = ProducerShell(name, TOPIC, keys, random.Random(sim.rng.getrandbits(64)), sim.history.append,
                              config.records_per_batch, 60_000)
        built.append((Host(name, "producer", 0, _producer_factory(sim), server=False), shell))
    for index in range(config.consumers):
        name = f"consumer-{index + 1}"
        static = index >= config.consumers - config.static_members
        shell = ConsumerShell(name, GROUP, TOPIC, sim.history.append, random.Random(rng.getrandbits(64)),
                              config.processing_ms, _later(sim, name))
        built.append((Host(name, "consumer", 0, _consumer_factory(sim, name if static else None), server=False), shell))
    for index in range(config.share_members):
        name = f"share-{index + 1}"
        shell = ShareShell(name, SHARE_GROUP, TOPIC, random.Random(rng.getrandbits(64)), config.processing_ms,
                           _later(sim, name))
        built.append((Host(name, "share", 0, _share_factory(sim), server=False), shell))
    return built


def _later(sim: "Simulator", name: str) -> Later:
    return lambda delay_ns, action: sim.later(name, delay_ns, action)


def _producer_factory(sim: "Simulator") -> Any:
    def build(host: Host, incarnation: int) -> Any:
        from actors.producer_client import ProducerClient, ProducerSettings

        settings = ProducerSettings(acks=-1, idempotent=True, request_timeout_ms=1000, retry_backoff_ms=50)
        return ProducerClient(bootstrap=sim.coordinator_endpoint, settings=settings, name=host.name)
    return build


def _consumer_factory(sim: "Simulator", instance_id: str | None) -> Any:
    def build(host: Host, incarnation: int) -> Any:
        from actors.consumer_client import ConsumerClient, ConsumerSettings
        from actors.consumer_member import ConsumerMember, GroupSettings
        from chaos.sim_config import GROUP

        client = ConsumerClient(bootstrap=sim.coordinator_endpoint, settings=ConsumerSettings(
            auto_offset_reset="earliest", fetch_max_wait_ms=200, request_timeout_ms=2000), name=host.name)
        client.member = ConsumerMember(client, GroupSettings(
            group_id=GROUP, group_instance_id=instance_id, client_id=host.name, assignor=sim.plan.assignor,
            session_timeout_ms=1500, heartbeat_interval_ms=200, max_poll_interval_ms=30_000, request_timeout_ms=2000))
        return client
    return build


def _share_factory(sim: "Simulator") -> Any:
    def build(host: Host, incarnation: int) -> Any:
        from actors.messages import ShareGroupSettings
        from actors.share_member import ShareMember, ShareMemberSettings
        from chaos.sim_config import DEAD_LETTER_TOPIC, SHARE_GROUP

        config = sim.config
        group = ShareGroupSettings(visibility_timeout_ms=config.share_visibility_timeout_ms,
                                   max_delivery_attempts=config.share_max_delivery_attempts,
                                   dead_letter_topic=DEAD_LETTER_TOPIC, auto_offset_reset="earliest")
        settings = ShareMemberSettings(group_id=SHARE_GROUP, client_id=host.name, group=group, session_timeout_ms=1500,
                                       heartbeat_interval_ms=200, acquire_max_wait_ms=500, prefetch_records_max=300,
                                       request_timeout_ms=2000, metadata_refresh_ms=1000)
        return ShareMember(bootstrap=sim.coordinator_endpoint, settings=settings, name=host.name)
    return build
