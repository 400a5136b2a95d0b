"""When a share group's work falls due: the deadlines of `ShareGroups` (actors/share_group.py).

A mixin of `ShareGroups`, which owns `groups`, `parked`, `waiting_heartbeats`, `leaders`,
`dead_letters`, `step_ns` and the floors. Each kind of work keeps a floor, the earliest deadline
of its kind still ahead: a step lowers a floor when it makes something due sooner, and the tick
sets every floor exactly with one scan (`_set_floors`). The coordinator's timer fires at the
lowest floor (`_next_deadline`); its invariants check that no deadline (`deadlines`) is missed.
"""

from __future__ import annotations

from actors.actor import MS
from actors.share_group_membership import HEARTBEAT_METADATA_WAIT_MS


class ShareDeadlines:
    def deadlines(self) -> list[int]:
        """When each thing `tick` does falls due, every one of them: sessions, locks, parked
        acquires (their wait, a delayed release, the next high-watermark read), heartbeats waiting
        for metadata, requests in flight, metadata and dead-letter retries. The coordinator's timer
        fires no later (its invariants() check it); with none of it, there is no timer. A scan of
        everything: the tick runs it, a step lowers floors instead. Lists, not generators: the
        coordinator's invariants() scans them all after every step that went to the share groups."""
        deadlines = self._session_deadlines()
        deadlines += self._lock_deadlines()
        for key in self.parked:
            deadlines += self._parked_deadlines_of(key)
        deadlines += self._step_deadlines()
        deadlines += self.leaders.pending_deadlines()
        deadlines += self.dead_letters.deadlines()
        return deadlines

    def _session_deadlines(self) -> list[int]:
        return [member.last_seen_ns + member.session_timeout_ms * MS + 1
                for group in self.groups.values() for member in group.members.values()]

    def _lock_deadlines(self) -> list[int]:
        return [share_partition.next_lock_deadline_ns
                for group in self.groups.values() for share_partition in group.partitions.values()
                if share_partition.next_lock_deadline_ns is not None]

    def _parked_deadlines_of(self, key: tuple[str, str, int]) -> list[int]:
        deadlines = [parked.deadline_ns for parked in self.parked.get(key, ())]
        deadlines.append(self.groups[key[0]].partitions[key[1], key[2]].next_available_ns(self.step_ns))
        deadlines.append(self.leaders.watch_due_ns(key[1:]))
        return deadlines

    def _step_deadlines(self) -> list[int]:
        """The few deadlines a step looks at directly: heartbeats waiting for metadata, and the
        next metadata request."""
        deadlines = [since_ns + HEARTBEAT_METADATA_WAIT_MS * MS
                     for _, _, since_ns in self.waiting_heartbeats.values()]
        deadlines += self.leaders.metadata_deadlines(self.session_floor_ns is not None)
        return deadlines

    def _set_floors(self, now_ns: int) -> None:
        """Every floor exactly: the earliest deadline of its kind still ahead (the tick's scan)."""
        def earliest(deadlines: list[int]) -> int | None:
            ahead = [deadline_ns for deadline_ns in deadlines if deadline_ns > now_ns]
            return min(ahead) if ahead else None

        self.session_floor_ns = earliest(self._session_deadlines())
        self.lock_floor_ns = earliest(self._lock_deadlines())
        self.parked_floor_ns = earliest([deadline_ns for key in self.parked
                                         for deadline_ns in self._parked_deadlines_of(key)])
        self.leaders.pending_floor_ns = earliest(self.leaders.pending_deadlines())
        self.dead_letters.retry_floor_ns = earliest(self.dead_letters.deadlines())

    def _next_deadline(self, now_ns: int) -> int | None:
        floors = [floor for floor in (self.session_floor_ns, self.lock_floor_ns, self.parked_floor_ns,
                                      self.leaders.pending_floor_ns, self.dead_letters.retry_floor_ns)
                  if floor is not None]
        floors += [deadline_ns for deadline_ns in self._step_deadlines() if deadline_ns > now_ns]
        return min(floors, default=None)
