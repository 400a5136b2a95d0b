"""Share groups in the simulator: members that work on their records, and the ledger of promises.

`ShareShell` plays `railmq.ShareConsumer` with a user: the production `ShareMember` acquires and
fetches, the shell polls what was fetched, processes it for a while (`processing_ms`; longer
than the visibility timeout sometimes, when the process is paused), then answers every record:
most are accepted, some released with a delay (a temporary failure), and "poison" records (every
`POISON_EVERY`-th value) are released or rejected until they are dead-lettered. A crash loses
whatever the shell held; the coordinator releases those locks when the member's session ends.

`ShareLedger` keeps, from what the group coordinator really answered (ShareAcquireResponse,
ShareAcknowledgeResponse), each record's lock, delivery count, release delay and fate, and checks:

- a record is locked by at most one member: an acquire never hands out a record whose lock is
  still valid, and only the member holding a record's lock (in that delivery) can answer it;
- its delivery count never goes back (each delivery counts higher than the last, across
  coordinator restarts) nor passes `max_delivery_attempts`, and a record released with a delay
  is not delivered before it;
- a record whose accept was acknowledged is never delivered again, and a restarted coordinator
  holds every accept and delivery count it acknowledged;
- after the run: every record of the topic below its high watermark was accepted or
  dead-lettered (or is being dead-lettered), never both, and the dead-letter topic holds each
  dead-lettered record once.
"""

from __future__ import annotations

import random
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from actors.errors import ErrorCode
from actors.messages import ClientCommand
from chaos.sim_invariants import recall, remember
from chaos.sim_network import MS

if TYPE_CHECKING:
    from chaos.sim_hosts import Host
    from chaos.simulator import Simulator

POISON_EVERY = 13  # a producer's every 13th value always fails its handler
RELEASE_DELAY_MS = (0, 300)
Later = Callable[[int, Callable[[int], list]], None]
Key = tuple[str, str, int, int]  # group, topic, partition, offset


def is_poison(value: bytes | None) -> bool:
    return value is not None and int(value.rsplit(b":", 1)[1]) % POISON_EVERY == 0


class ShareShell:
    """A share-group member's user: processes each fetched chunk, then answers its records."""

    def __init__(self, name: str, group: str, topic: str, rng: random.Random, processing_ms: tuple[int, int],
                 later: Later) -> None:
        self.name = name
        self.group = group
        self.topic = topic
        self.rng = rng
        self.processing_ms = processing_ms
        self.later = later
        self._reset()

    def _reset(self) -> None:
        self.membership = -1
        self.chunks: deque[tuple[int, str, int, list]] = deque()
        self.processing = False

    def start(self) -> list[Any]:
        return [ClientCommand(command="subscribe", arguments={"topics": [self.topic]})]

    def on_notify(self, kind: str, payload: Any, now_ns: int) -> list[Any]:
        if kind == "membership":
            self.membership = payload[0]
            self.chunks = deque(chunk for chunk in self.chunks if chunk[0] == self.membership)
        elif kind == "share-records":
            from railmq.share_consumer import decode_acquired

            membership, topic, partition, batches, ranges, lock_deadline_ms, _ = payload
            if membership == self.membership:
                records = decode_acquired(topic, partition, batches, ranges, lock_deadline_ms)
                if records:
                    self.chunks.append((membership, topic, partition, records))
            # Decoded at once (or dropped): the member's buffer has the room back, as after a poll.
            return [ClientCommand(command="consumed", arguments={"bytes": len(batches)})] + self._pump()
        return self._pump()

    def _pump(self) -> list[Any]:
        """A poll: everything fetched so far goes to processing together."""
        if self.processing or not self.chunks:
            return []
        taken, self.chunks = list(self.chunks), deque()
        self.processing = True
        self.later(self.rng.randint(*self.processing_ms) * MS, lambda now_ns: self._processed(taken, now_ns))
        return []

    def _processed(self, taken: list[tuple[int, str, int, list]], now_ns: int) -> list[Any]:
        self.processing = False
        entries: list[list] = []
        for membership, topic, partition, records in taken:
            if membership != self.membership:
                continue  # held under a membership that ended: those locks are gone
            for record in records:
                kind, delay_ms = self._verdict(record)
                entry = [topic, partition, record.offset, record.offset, kind, delay_ms,
                         "poison" if kind != "accept" else "", record.delivery_count]
                last = entries[-1] if entries else None
                if last is not None and last[:2] == entry[:2] and last[3] + 1 == record.offset \
                        and last[4:] == entry[4:]:
                    last[3] = record.offset  # one range, as railmq.ShareConsumer sends consecutive answers
                else:
                    entries.append(entry)
        commands = [ClientCommand(command="acknowledge", arguments={"acknowledgements": entries})] if entries else []
        return commands + self._pump()

    def _verdict(self, record: Any) -> tuple[str, int]:
        roll = self.rng.random()
        if is_poison(record.value):
            return ("reject", 0) if roll < 0.3 else ("release", 0)
        if roll < 0.9:
            return "accept", 0
        return "release", self.rng.randint(*RELEASE_DELAY_MS)

    def crashed(self, now_ns: int) -> None:
        self._reset()


class Lock(NamedTuple):
    member: str
    deadline_ns: int
    delivery_count: int


class ShareLedger:
    def __init__(self, sim: "Simulator") -> None:
        self.sim = sim
        self.locks: dict[Key, Lock] = {}
        self.counts: dict[Key, int] = {}  # the last delivery count handed out
        self.not_before: dict[Key, int] = {}  # a release's delay: no delivery before (coordinator clock)
        self.accepted: set[Key] = set()
        self.rejected: set[Key] = set()
        # (sender, correlation) -> each copy received (chaos/sim_invariants.py `remember`)
        self.acquires: dict[tuple[Any, int], list[tuple[str, str]]] = {}  # (group, member)
        self.answers: dict[tuple[Any, int], list[tuple[Any, int]]] = {}  # (request, when it was handled)

    def problem(self, text: str) -> None:
        self.sim.problems.append(text)

    # ------------------------------------------------------------------ what the coordinator received

    def on_acquire(self, host: "Host", request: Any, sender: Any, now_ns: int) -> None:
        if host.kind == "group-coordinator":
            remember(self.acquires, (sender, request.correlation_id), (request.group_id, request.member_id))

    def on_acknowledge(self, host: "Host", request: Any, sender: Any, now_ns: int) -> None:
        if host.kind == "group-coordinator":
            remember(self.answers, (sender, request.correlation_id), (request, now_ns))

    # ------------------------------------------------------------------ what it answered

    def on_acquired(self, host: "Host", to: Any, response: Any) -> None:
        asked = recall(self.acquires, (to, response.correlation_id))
        if host.kind != "group-coordinator" or asked is None or response.error != ErrorCode.NONE:
            return
        group, member = asked
        deadline_ns = response.lock_deadline_ms * MS
        acquired_ns = deadline_ns - self.sim.config.share_visibility_timeout_ms * MS  # when it was handled
        for acquired in response.acquired:
            for offset in range(acquired.first_offset, acquired.last_offset + 1):
                self._delivered((group, response.topic, response.partition, offset), member, acquired.delivery_count,
                                acquired_ns, deadline_ns)

    def _delivered(self, key: Key, member: str, count: int, acquired_ns: int, deadline_ns: int) -> None:
        if key in self.accepted:
            self.problem(f"share record {_where(key)} was delivered again (to {member}) after its accept was "
                         "acknowledged")
        lock = self.locks.get(key)
        if lock is not None and lock.deadline_ns > acquired_ns + MS:  # deadlines are whole milliseconds
            self.problem(f"share record {_where(key)} locked by two members: {lock.member} "
                         f"(delivery {lock.delivery_count}, lock valid "
                         f"{(lock.deadline_ns - acquired_ns) / MS:.0f} ms more) and {member}")
        if count > self.sim.config.share_max_delivery_attempts:
            self.problem(f"share record {_where(key)} delivered a {count}th time; max_delivery_attempts is "
                         f"{self.sim.config.share_max_delivery_attempts}")
        if count <= self.counts.get(key, 0):
            self.problem(f"share record {_where(key)}: delivery count went back from {self.counts[key]} "
                         f"to {count}")
        if self.not_before.get(key, 0) > acquired_ns + MS:  # the lock deadline is in whole milliseconds
            self.problem(f"share record {_where(key)} redelivered "
                         f"{(self.not_before[key] - acquired_ns) / MS:.0f} ms before its release delay ended")
        self.locks[key] = Lock(member, deadline_ns, count)
        self.counts[key] = max(count, self.counts.get(key, 0))

    def on_acknowledged(self, host: "Host", to: Any, response: Any) -> None:
        asked = recall(self.answers, (to, response.correlation_id))
        if host.kind != "group-coordinator" or asked is None or response.error != ErrorCode.NONE:
            return
        request, now_ns = asked
        for acknowledgement, result in zip(request.acknowledgements, response.results):
            if result.error != ErrorCode.NONE:
                continue
            for offset in range(acknowledgement.first_offset, acknowledgement.last_offset + 1):
                key = (request.group_id, request.topic, request.partition, offset)
                self._answered(key, request.member_id, acknowledgement, result, now_ns)

    def _answered(self, key: Key, member: str, acknowledgement: Any, result: Any, now_ns: int) -> None:
        lock = self.locks.get(key)
        if lock is None or lock.member != member or lock.deadline_ns + MS <= now_ns:
            held = "nobody's lock" if lock is None else (
                f"the lock of {lock.member}" + (" (expired)" if lock.deadline_ns + MS <= now_ns else ""))
            self.problem(f"share record {_where(key)}: {member}'s {acknowledgement.kind} was accepted "
                         f"while it was under {held}")
        elif acknowledgement.delivery_count and acknowledgement.delivery_count != lock.delivery_count:
            self.problem(f"share record {_where(key)}: an answer to delivery "
                         f"{acknowledgement.delivery_count} was accepted for delivery {lock.delivery_count}")
        kind = acknowledgement.kind
        if kind == "renew":
            if lock is not None:
                self.locks[key] = lock._replace(deadline_ns=result.lock_deadline_ms * MS)
            return
        self.locks.pop(key, None)
        if kind == "accept":
            self.accepted.add(key)
        elif kind == "release" and acknowledgement.delay_ms:
            self.not_before[key] = now_ns + acknowledgement.delay_ms * MS
        elif kind == "release":
            # Available at once: no time to compare against. (The coordinator's clock is a wall
            # clock: after it jumped back, "now" came before the release's "now", seed 2274.)
            self.not_before.pop(key, None)
        else:
            self.rejected.add(key)

    def on_member_removed(self, group: str, member: str) -> None:
        """The coordinator released every lock of a member that left or timed out."""
        for key in [key for key, lock in self.locks.items() if key[0] == group and lock.member == member]:
            del self.locks[key]

    # ------------------------------------------------------------------ coordinator restarts

    def on_coordinator_crash(self) -> None:
        """Locks are never stored: a restarted coordinator starts with none."""
        self.locks.clear()
        self.acquires.clear()
        self.answers.clear()

    def on_coordinator_boot(self, host: "Host") -> None:
        from actors.share_partition import DONE

        share = host.actor.share
        for group_id, group in sorted(share.groups.items()):
            for (topic, partition), share_partition in sorted(group.partitions.items()):
                for offset, record in share_partition.records.items():
                    key = (group_id, topic, partition, offset)
                    if key in self.accepted and record.state not in DONE:
                        self.problem(f"group coordinator #{host.incarnation} restarted with share record {group_id} "
                                     f"{topic}/{partition}@{offset} {record.state}; its accept was acknowledged")
                    if record.delivery_count < self.counts.get(key, 0):
                        self.problem(f"group coordinator #{host.incarnation} restarted with share record {group_id} "
                                     f"{topic}/{partition}@{offset} at delivery count {record.delivery_count}; "
                                     f"delivery {self.counts[key]} was handed out")

    # ------------------------------------------------------------------ after the run

    def final_check(self, group: str, topic: str, high_watermarks: dict[int, int],
                    dead_letters: list[tuple[str, str, int, int]], dead_lettering: set[Key]) -> None:
        """Every record below the high watermark accepted or dead-lettered (never both), each
        dead-lettered once. A record the coordinator still holds as dead-lettering counts as
        dead-lettered: its write waits for the dead-letter partition (a slow recovery there is
        not a broken promise; a second copy would be)."""
        seen: dict[Key, int] = {}
        for source in dead_letters:
            seen[source] = seen.get(source, 0) + 1
        twice = sorted(key for key, count in seen.items() if count > 1)
        if twice:
            self.problem(f"{len(twice)} share records dead-lettered more than once; first: {twice[0]} "
                         f"({seen[twice[0]]} times)")
        for partition, high_watermark in sorted(high_watermarks.items()):
            keys = [(group, topic, partition, offset) for offset in range(high_watermark)]
            both = [key for key in keys if key in self.accepted and key in seen]
            if both:
                self.problem(f"{len(both)} share records both accepted and dead-lettered; first: {both[0]}")
            missing = [key for key in keys if key not in self.accepted and key not in seen and key not in dead_lettering]
            if missing:
                rejected = sum(1 for key in missing if key in self.rejected)
                self.problem(f"{len(missing)} records of {topic}/{partition} below its high watermark "
                             f"{high_watermark} were neither accepted nor dead-lettered by share group {group} "
                             f"({rejected} of them rejected); first: offset {missing[0][3]}")


def dead_lettering(host: "Host", group_id: str) -> set[Key]:
    """The records a running group coordinator holds as dead-lettering (their write is pending)."""
    from actors.share_partition import DEAD_LETTERING

    group = host.actor.share.groups.get(group_id) if host.alive else None
    if group is None:
        return set()
    return {(group_id, topic, partition, offset) for (topic, partition), share_partition in group.partitions.items()
            for offset, record in share_partition.records.items() if record.state == DEAD_LETTERING}


def _where(key: Key) -> str:
    """A share record as problems name it (formatted only for a problem: the checks run for every
    record)."""
    return f"{key[0]} {key[1]}/{key[2]}@{key[3]}"
