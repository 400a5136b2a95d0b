"""What a replica knows of its own disk, and how it gets back what it lost.

A replica's storage is one of (reported in every heartbeat as `StorageReport.state`):

    ok         nothing lost that it knows of
    new        its directory was created empty: it holds none of the partition's past
    damaged    it lost flushed data (cut from the end, a missing file) or refuses a range as
               corrupt (found on open, by a read, or by the scrubber)
    repairing  damaged, and following a leader to fetch the data back

The coordinator removes a damaged or new replica from the ISR and never elects it while it is so
(actors/elections.py); a damaged replica elected on news older than its damage report refuses to
lead unless the election was unclean (`PartitionReplica._refuse_leadership`). Repair is a
follower's ordinary fetch loop: a refused range inside the log is truncated away first (a log
only grows at its end), then the follower fetches from the leader; a damage range counts as
repaired once the log end has passed it — or has reached the leader's log end, when the leader
never had all of it (the lost tail held records that were never committed). A new directory is repaired once it has caught up with a leader, or when the
coordinator elects it (a brand-new partition). Every change is persisted in `replica.health`
before the next heartbeat says it (storage/replica_meta.py), so a restart never forgets damage.

The scrubber reads the log in the background, `scrub_bytes_per_tick` at a time, and lets the read
path's CRC check find bit rot in data nobody fetches (a follower's log is never read otherwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors.actor import MS
from actors.effects import Effect, SetTimer, Trace
from actors.messages import StorageReport
from storage.errors import CorruptLog, OffsetOutOfRange
from storage.replica_meta import UNKNOWN_END, Damage, ReplicaHealth

if TYPE_CHECKING:
    from actors.partition_replica import PartitionReplica


class MemoryHealth:
    """A health record that is not persisted (unit tests that build a replica by hand)."""

    def __init__(self) -> None:
        self.current = ReplicaHealth()

    def replace(self, health: ReplicaHealth) -> None:
        self.current = health


class ReplicaStorage:
    def __init__(self, replica: "PartitionReplica", health: Any, findings: list[str]) -> None:
        self.replica = replica
        self.file = health if health is not None else MemoryHealth()
        self.findings = list(findings)
        self.clean_shutdown = bool(getattr(replica.log, "clean_shutdown", False))
        self.scrub_offset = -1  # the next offset the scrubber reads; -1: no pass under way
        self.scrub_pass_end = 0  # the log end when the current pass began: where it stops
        self.scrub_pass_started_ns = 0
        self.refusals_seen = getattr(replica.log, "refused_count", 0)

    # ------------------------------------------------------------------ state

    @property
    def health(self) -> ReplicaHealth:
        return self.file.current

    @property
    def damaged(self) -> bool:
        return bool(self.health.damage)

    @property
    def healthy(self) -> bool:
        return self.health.healthy

    def state(self) -> str:
        if self.health.damage:
            return "repairing" if self.replica.role == "follower" else "damaged"
        return "new" if self.health.new_directory else "ok"

    def report(self) -> StorageReport:
        health = self.health
        return StorageReport(
            state=self.state(), clean_shutdown=self.clean_shutdown,
            damage=[(item.first_offset, item.last_offset) for item in health.damage],
            detail=health.describe(), last_epoch=self.replica.last_batch_epoch())

    def report_key(self) -> tuple:
        """`report()` as a tuple that compares equal exactly when the reports do."""
        health = self.health
        if health.healthy:
            return (self.state(), self.clean_shutdown, self.replica.last_batch_epoch())
        return (self.state(), self.clean_shutdown, [(item.first_offset, item.last_offset) for item in health.damage],
                health.describe(), self.replica.last_batch_epoch())

    def _replace(self, health: ReplicaHealth, event: str, details: dict) -> list[Effect]:
        before = self.state()
        self.file.replace(health)
        replica = self.replica
        effects: list[Effect] = [Trace(event, {"topic": replica.topic, "partition": replica.partition,
                                               "node": replica.node, "state": self.state(), **details})]
        if self.state() != before:
            effects += replica.heartbeat_now()
        return effects

    # ------------------------------------------------------------------ finding damage

    def record_corruption(self, error: CorruptLog) -> list[Effect]:
        """A read (a fetch, the scrubber) refused a range: remember it, say it at once."""
        first, last = error.first_offset, error.last_offset
        damage = Damage(first, last, "refused as corrupt by a read")
        if any((item.first_offset, item.last_offset) == (first, last) for item in self.health.damage):
            return []
        health = ReplicaHealth(damage=sorted([*self.health.damage, damage], key=lambda d: d.first_offset),
                               new_directory=self.health.new_directory)
        return self._replace(health, "storage-damage-found", {"first_offset": first, "last_offset": last,
                                                               "reason": str(error)[:200]})

    def record_refusals(self) -> list[Effect]:
        """Record every range the log refuses that the health record does not name yet."""
        log = self.replica.log
        self.refusals_seen = log.refused_count
        effects: list[Effect] = []
        for first, last in log.corrupt_ranges:
            effects += self.record_corruption(CorruptLog(f"offsets {first}..{last} refused by a read", first, last))
        return effects

    # ------------------------------------------------------------------ repairing

    def prepare_to_follow(self) -> list[Effect]:
        """Before fetching: cut the log below the first refused range inside it, so the fetch loop
        re-fetches it (and everything after it) from the leader. Only once there is a leader to
        fetch from: without one, what follows the damage may be the best copy there is."""
        target = self.cut_offset()
        return [] if target is None else self.cut_to(target)

    def cut_to(self, target: int) -> list[Effect]:
        log = self.replica.log
        before = log.log_end_offset
        if target < log.log_start_offset:
            log.reset_to(target)  # lost below the first file (storage/recovery.py): everything comes again
        else:
            try:
                log.truncate_to(target)
            except CorruptLog as error:  # a header damaged since the open on the way: cut below it
                target = min(target, error.first_offset)
                log.truncate_to(target)
        if before > target:
            # What the cut dropped is missing now, not only the damage: the replica is repaired
            # once it holds all of it again (or all the leader has), not as soon as its log end
            # passes the damaged range — it would report healthy, in the ISR, without what it
            # held (the simulator's seed 32101: healthy at 147 of 331 committed offsets).
            health = self.health
            kept = [item for item in health.damage if item.last_offset < target or item.last_offset == UNKNOWN_END]
            cut = Damage(target, before - 1, "cut below damage, to be fetched again")
            self.file.replace(ReplicaHealth(damage=sorted([*kept, cut], key=lambda d: d.first_offset),
                                            new_directory=health.new_directory))
        self.replica.lost_own_data(log.log_end_offset)
        return [Trace("repair-truncated", {"topic": self.replica.topic, "partition": self.replica.partition,
                                           "node": self.replica.node, "from": before, "to": log.log_end_offset})]

    def cut_offset(self) -> int | None:
        """Where `prepare_to_follow` would cut the log: below the first damaged range inside it,
        once there is a leader to fetch the rest from; None when it would not cut."""
        state = self.replica.state
        if state is None or state.leader < 0:
            return None
        log = self.replica.log
        inside = [item.first_offset for item in self.health.damage
                  if item.first_offset < log.log_end_offset and item.last_offset != UNKNOWN_END
                  and item.last_offset >= log.log_start_offset]
        if inside:
            return max(min(inside), log.log_start_offset)
        # Offsets lost below the log's first file: the log restarts empty there.
        below = [item.first_offset for item in self.health.damage
                 if item.last_offset != UNKNOWN_END and item.last_offset < log.log_start_offset]
        return min(below) if below else None

    def after_fetch(self, leader_log_end: int) -> list[Effect]:
        """A fetch from the leader appended: drop the damage the log has got back."""
        if self.healthy:
            return []
        log = self.replica.log
        end = log.log_end_offset
        caught_up = end >= leader_log_end
        refused = log.corrupt_ranges
        kept = [item for item in self.health.damage if not _repaired(item, end, leader_log_end, refused)]
        new_directory = self.health.new_directory and not caught_up
        if len(kept) == len(self.health.damage) and new_directory == self.health.new_directory:
            return []
        return self._replace(ReplicaHealth(damage=kept, new_directory=new_directory), "storage-repaired",
                             {"log_end_offset": end, "leader_log_end_offset": leader_log_end,
                              "damage_left": len(kept)})

    def on_elected(self) -> list[Effect]:
        """The coordinator chose this replica to lead: for a new directory that means a brand-new
        partition (or an unclean election); its past is whatever it holds."""
        if not self.health.new_directory:
            return []
        return self._replace(ReplicaHealth(damage=list(self.health.damage)), "storage-adopted", {})

    # ------------------------------------------------------------------ scrubbing

    def scrub(self, now_ns: int) -> list[Effect]:
        """One tick of a pass: a pass reads the log from its start to where it ended when the pass
        began, `scrub_bytes_per_tick` per `scrub_interval_ms`; the next pass begins
        `scrub_pass_interval_ms` after this one began. Between passes nothing runs, so an idle
        replica costs nothing, and each pass starts over at the log start (a cursor that followed
        the log end would never look at old data again while writes went on)."""
        replica = self.replica
        limits = replica.limits
        log = replica.log
        tick: list[Effect] = [SetTimer("scrub", now_ns + limits.scrub_interval_ms * MS)]
        if self.scrub_offset < 0:
            if log.log_end_offset <= log.log_start_offset:
                return [SetTimer("scrub", now_ns + limits.scrub_pass_interval_ms * MS)]  # nothing to read yet
            self.scrub_offset, self.scrub_pass_end, self.scrub_pass_started_ns = (
                log.log_start_offset, log.log_end_offset, now_ns)
        effects = tick
        start = max(self.scrub_offset, log.log_start_offset)
        try:
            self.scrub_offset = start if start >= self.scrub_pass_end else log.scrub(start, limits.scrub_bytes_per_tick)
        except CorruptLog as error:
            self.scrub_offset = error.last_offset + 1
            effects += self.record_corruption(error)
        except OffsetOutOfRange:
            self.scrub_offset = log.log_start_offset
        if self.scrub_offset >= min(self.scrub_pass_end, log.log_end_offset):
            self.scrub_offset = -1  # the pass is done
            next_pass_ns = max(now_ns + limits.scrub_interval_ms * MS,
                               self.scrub_pass_started_ns + limits.scrub_pass_interval_ms * MS)
            effects[0] = SetTimer("scrub", next_pass_ns)
        if log.refused_count != self.refusals_seen:
            effects += self.record_refusals()
        if self.damaged and replica.follower is not None and self.cut_offset() is not None:
            # Found while following: fetch it again from below the damage. The cut itself waits
            # for that fetch's answer (replica_follower.py).
            effects += replica.follower.fetch_from_cut(now_ns)
        return effects


def _repaired(item: Damage, log_end: int, leader_log_end: int, refused: list[tuple[int, int]]) -> bool:
    """The log end has passed the damage (or reached the leader's end, if the leader never had all
    of it), and no range the log still refuses overlaps it."""
    wanted = leader_log_end if item.last_offset == UNKNOWN_END else min(item.last_offset + 1, leader_log_end)
    last = log_end if item.last_offset == UNKNOWN_END else item.last_offset
    overlapping = any(first <= last and item.first_offset <= end for first, end in refused)
    return log_end >= wanted and not overlapping
