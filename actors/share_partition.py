"""One share-partition: the delivery state a share group keeps for one partition (KIP-932).

It owns the group's in-flight window over the partition: the share-partition start offset (SPSO,
`start_offset`), below which every record is done; the end offset (`end_offset`), the first offset
never acquired; and, for each offset in between, its state, delivery count, lock holder and
deadline, last error and earliest redelivery time.

    new offset --acquire--> acquired --accept--> accepted
    acquired --release / lock expiry / holder gone--> available (after the release's delay)
    available --acquire--> acquired                     (delivery count + 1)
    acquired --reject--> dead-lettering                (reason "rejected")
    released or expired at max attempts --> dead-lettering  (reason "max-attempts")
    available at max attempts --acquire--> dead-lettering   (reason "max-attempts")
    dead-lettering --dead-letter write acknowledged--> archived

The start offset moves past every leading accepted or archived offset. The window holds at most
`share_records_in_flight_max` offsets: a stuck record holds the start back, never the records
after it, until the window is full.

Invariants (`invariants()`): start <= end and the window is within its bound; every offset in it
has a record and the first is not done; an acquired record has one holder, a lock deadline and a
delivery count in 1..max attempts; no other record has a holder. A member answering a record it
does not hold changes nothing (INVALID_RECORD_STATE), so two members never hold one lock and a
late answer from an earlier holder never answers a later delivery.

Durability: `stored()` is the compact form (runs of offsets in the same state) the coordinator
persists after every change that `changed` flags; `restore()` reads it back with every lock void:
acquired records come back available with their delivery counts. Locks are never stored. Pure: no
clock, no I/O; callers pass `now_ns` (wall clock, so stored redelivery times survive a restart).
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

from sortedcontainers import SortedSet

from actors.actor import MS
from actors.dead_letter_records import DeadLetterItem
from actors.errors import ErrorCode
from actors.limits import Limits
from actors.messages import AcquiredRecords, ShareAcknowledgement, ShareAcknowledgementResult, ShareGroupSettings

AVAILABLE, ACQUIRED, ACCEPTED, DEAD_LETTERING, ARCHIVED = (
    "available", "acquired", "accepted", "dead-lettering", "archived")
DONE = frozenset({ACCEPTED, ARCHIVED})
REJECTED, MAX_ATTEMPTS = "rejected", "max-attempts"
ACKNOWLEDGEMENT_KINDS = ("accept", "release", "reject", "renew")
# Stored state codes: a lock is never stored, so acquired and available records store alike.
_CODE = {AVAILABLE: 0, ACQUIRED: 0, ACCEPTED: 1, DEAD_LETTERING: 2, ARCHIVED: 3}
_STATE = {0: AVAILABLE, 1: ACCEPTED, 2: DEAD_LETTERING, 3: ARCHIVED}


class InFlightRecord:
    __slots__ = ("state", "delivery_count", "holder", "lock_deadline_ns", "available_at_ns", "last_error",
                 "first_delivery_ms", "reason", "dead_lettered_ms")

    def __init__(self, state: str = AVAILABLE, delivery_count: int = 0) -> None:
        self.state = state
        self.delivery_count = delivery_count
        self.holder = ""
        self.lock_deadline_ns = 0
        self.available_at_ns = 0  # 0: at once; otherwise not redelivered before this time
        self.last_error = ""
        self.first_delivery_ms = 0
        self.reason = ""  # why it is dead-lettered: "rejected" | "max-attempts"
        self.dead_lettered_ms = 0

    def stored_key(self) -> tuple:
        if self.state in DONE:
            return (_CODE[self.state], self.delivery_count)  # runs of accepted records still merge
        return (_CODE[self.state], self.delivery_count, self.last_error, self.first_delivery_ms,
                self.available_at_ns // MS, self.reason, self.dead_lettered_ms)


class Acquisition(NamedTuple):
    acquired: list[AcquiredRecords]
    lock_deadline_ns: int


class SharePartition:
    def __init__(self, topic: str, partition: int, settings: ShareGroupSettings, limits: Limits) -> None:
        self.topic = topic
        self.partition = partition
        self.settings = settings
        self.limits = limits
        self.start_offset = -1  # -1 until the first high watermark is known
        self.end_offset = -1
        self.high_watermark = -1
        self.records: dict[int, InFlightRecord] = {}
        # The id of the topic the window's offsets belong to (0: unknown, stored before ids were
        # kept). A topic deleted and made again under the same name has another: the window then
        # starts again (ShareGroups._start_again_where_made_again).
        self.topic_id = 0
        # How many partitions the topic had when the window's start was placed (0: not known, or
        # placed before this was kept). A sibling numbered at or past it is one the topic gained
        # while the group read it (`gained_while_read`).
        self.topic_partitions = 0
        self.counted_records = 0  # len(records) as the coordinator's total last counted it
        self.available: SortedSet = SortedSet()
        self.last_available_at_ns = 0  # the latest time a delayed release was set to end
        self.next_lock_deadline_ns: int | None = None  # no lock expires before this
        self.new_dead_letters: list[int] = []  # offsets that became dead-lettering, for the writer
        self.changed = False  # a change `stored()` would show, not yet persisted
        # Lock holders found by the last full `invariants()` pass, or None once anything that pass
        # looked at may have changed: every method that changes the window clears it.
        self._verified_holders: frozenset[str] | None = None

    @property
    def initialized(self) -> bool:
        return self.start_offset >= 0

    # ------------------------------------------------------------------ the log's bounds

    def observe_log(self, log_start_offset: int, high_watermark: int, topic_partitions: int = 0,
                    gained_while_read: bool = False) -> None:
        """What the partition leader said; the first answer places the start: auto_offset_reset,
        or the log's start for a partition the topic gained while the group read it (its records
        were written while the group was subscribed: `latest` skipped them, KAFKA-12261)."""
        self.high_watermark = high_watermark  # not looked at by invariants(): the verified holders stay
        if not self.initialized:
            self._verified_holders = None
            from_start = self.settings.auto_offset_reset == "earliest" or gained_while_read
            start = log_start_offset if from_start else high_watermark
            self.start_offset = self.end_offset = start
            self.topic_partitions = topic_partitions
            self.changed = True
            return
        if log_start_offset > self.start_offset:
            self._forget_below(log_start_offset)

    def _forget_below(self, offset: int) -> None:
        """Retention deleted the records below `offset`: nothing is left there to deliver."""
        self._verified_holders = None
        for gone in range(self.start_offset, min(offset, self.end_offset)):
            del self.records[gone]
            self.available.discard(gone)
        self.start_offset = offset
        self.end_offset = max(self.end_offset, offset)
        self.changed = True
        self._advance_start()

    def _new_limit(self) -> int:
        """New offsets may be acquired up to (not including) this one."""
        return min(self.high_watermark, self.start_offset + self.limits.share_records_in_flight_max)

    # ------------------------------------------------------------------ acquire

    def acquire(self, member_id: str, max_records: int, now_ns: int, new_records_max: int = 1 << 62) -> Acquisition:
        """Lock up to `max_records` records to the member: redeliveries first (lowest offsets
        first, once their delay has passed), then at most `new_records_max` new offsets up to the
        high watermark."""
        self.expire_locks(now_ns)  # which clears the verified holders if a lock expired
        deadline = now_ns + self.settings.visibility_timeout_ms * MS
        taken: list[tuple[int, int]] = []
        due = [offset for offset in self.available if self.records[offset].available_at_ns <= now_ns]
        # The verified holders are cleared only by an acquire that changes the window (a record
        # locked or dead-lettered): most acquires of parked members find nothing to take.
        for offset in due:
            if len(taken) >= max_records:
                break
            self._verified_holders = None
            record = self.records[offset]
            self.available.discard(offset)
            if record.delivery_count >= self.settings.max_delivery_attempts:
                self._dead_letter(offset, record, MAX_ATTEMPTS, now_ns)
                continue
            taken.append((offset, self._lock(record, member_id, deadline, now_ns)))
        limit = min(self._new_limit(), self.end_offset + new_records_max)
        while self.end_offset < limit and len(taken) < max_records:
            self._verified_holders = None
            record = self.records[self.end_offset] = InFlightRecord()
            taken.append((self.end_offset, self._lock(record, member_id, deadline, now_ns)))
            self.end_offset += 1
        if taken:
            self.changed = True
            self.next_lock_deadline_ns = min(deadline, self.next_lock_deadline_ns or deadline)
        return Acquisition(_ranges(sorted(taken)), deadline)

    def _lock(self, record: InFlightRecord, member_id: str, deadline_ns: int, now_ns: int) -> int:
        if record.delivery_count == 0:
            record.first_delivery_ms = now_ns // MS
        record.state, record.holder, record.lock_deadline_ns = ACQUIRED, member_id, deadline_ns
        record.available_at_ns = 0
        record.delivery_count += 1
        return record.delivery_count

    def next_available_ns(self, after_ns: int) -> int:
        """When the next record released with a delay becomes available again, after `after_ns`
        (0: none waits that long)."""
        if self.last_available_at_ns <= after_ns:
            return 0  # every delay set so far has ended
        records = self.records
        ahead = [at for at in [records[offset].available_at_ns for offset in self.available] if at > after_ns]
        return min(ahead) if ahead else 0

    def can_acquire(self, now_ns: int) -> bool:
        """Would `acquire` change anything now (a record to lock or to dead-letter)?"""
        if self.end_offset < self._new_limit():
            return True
        return any(self.records[offset].available_at_ns <= now_ns for offset in self.available)

    # ------------------------------------------------------------------ acknowledge

    def acknowledge(self, member_id: str, acknowledgement: ShareAcknowledgement,
                    now_ns: int) -> ShareAcknowledgementResult:
        """Apply one acknowledgement range, all of it or (with an error) none of it."""
        self._verified_holders = None
        first, last = acknowledgement.first_offset, acknowledgement.last_offset
        problem = self._check_acknowledgement(acknowledgement)
        if problem is None:
            self.expire_locks(now_ns)
            problem = self._check_held(member_id, first, last, acknowledgement.delivery_count)
        if problem is not None:
            code, text = problem
            return ShareAcknowledgementResult(first_offset=first, last_offset=last, error=code, error_message=text)
        kind = acknowledgement.kind
        if kind == "renew":
            deadline = now_ns + self.settings.visibility_timeout_ms * MS
            for offset in range(first, last + 1):
                self.records[offset].lock_deadline_ns = deadline
            return ShareAcknowledgementResult(first_offset=first, last_offset=last, lock_deadline_ms=deadline // MS)
        error_text = _cut(acknowledgement.error, self.limits.share_error_text_bytes_max)
        for offset in range(first, last + 1):
            record = self.records[offset]
            if kind == "accept":
                record.state, record.holder = ACCEPTED, ""
            elif kind == "release":
                record.last_error = error_text
                self._release(offset, record, acknowledgement.delay_ms, now_ns)
            else:
                record.last_error = error_text
                self._dead_letter(offset, record, REJECTED, now_ns)
        self.changed = True
        self._advance_start()
        return ShareAcknowledgementResult(first_offset=first, last_offset=last)

    def _check_acknowledgement(self, acknowledgement: ShareAcknowledgement) -> tuple[int, str] | None:
        first, last = acknowledgement.first_offset, acknowledgement.last_offset
        if acknowledgement.kind not in ACKNOWLEDGEMENT_KINDS:
            return ErrorCode.INVALID_REQUEST, f"kind must be one of {', '.join(ACKNOWLEDGEMENT_KINDS)}"
        if not 0 <= acknowledgement.delay_ms <= self.limits.share_release_delay_max_ms:
            return ErrorCode.INVALID_REQUEST, f"delay_ms must be 0..{self.limits.share_release_delay_max_ms}"
        if first > last or last - first >= self.limits.share_records_in_flight_max:
            return ErrorCode.INVALID_REQUEST, (
                f"a range is first <= last and at most {self.limits.share_records_in_flight_max} offsets")
        return None

    def _check_held(self, member_id: str, first: int, last: int, delivery_count: int) -> tuple[int, str] | None:
        for offset in range(first, last + 1):
            record = self.records.get(offset)
            if record is None or record.state != ACQUIRED or record.holder != member_id:
                return ErrorCode.INVALID_RECORD_STATE, (
                    f"{self.topic}/{self.partition}@{offset} is not locked to {member_id} "
                    f"({'not in flight' if record is None else record.state}); nothing in {first}..{last} changed")
            if delivery_count and record.delivery_count != delivery_count:
                return ErrorCode.INVALID_RECORD_STATE, (
                    f"{self.topic}/{self.partition}@{offset}: the lock of delivery {delivery_count} expired and "
                    f"the record was delivered again (delivery {record.delivery_count}); nothing in "
                    f"{first}..{last} changed")
        return None

    # ------------------------------------------------------------------ locks ending

    def expire_locks(self, now_ns: int) -> bool:
        """Release every lock whose deadline has passed; True if any did."""
        if self.next_lock_deadline_ns is None or now_ns < self.next_lock_deadline_ns:
            return False
        self._verified_holders = None
        expired = False
        next_deadline: int | None = None
        for offset, record in self.records.items():
            if record.state != ACQUIRED:
                continue
            if record.lock_deadline_ns <= now_ns:
                self._release(offset, record, 0, now_ns)
                expired = True
            elif next_deadline is None or record.lock_deadline_ns < next_deadline:
                next_deadline = record.lock_deadline_ns
        self.next_lock_deadline_ns = next_deadline
        return expired

    def release_member(self, member_id: str, now_ns: int) -> bool:
        """The member left or its session expired: its records are available again."""
        self._verified_holders = None
        held = [offset for offset, record in self.records.items()
                if record.state == ACQUIRED and record.holder == member_id]
        for offset in held:
            self._release(offset, self.records[offset], 0, now_ns)
        return bool(held)

    def _release(self, offset: int, record: InFlightRecord, delay_ms: int, now_ns: int) -> None:
        record.holder, record.lock_deadline_ns = "", 0
        if record.delivery_count >= self.settings.max_delivery_attempts:
            self._dead_letter(offset, record, MAX_ATTEMPTS, now_ns)
            return
        record.state = AVAILABLE
        record.available_at_ns = now_ns + delay_ms * MS if delay_ms > 0 else 0
        self.last_available_at_ns = max(self.last_available_at_ns, record.available_at_ns)
        self.available.add(offset)
        self.changed = True

    # ------------------------------------------------------------------ dead letters

    def _dead_letter(self, offset: int, record: InFlightRecord, reason: str, now_ns: int) -> None:
        record.state, record.holder, record.lock_deadline_ns = DEAD_LETTERING, "", 0
        record.reason, record.dead_lettered_ms = reason, now_ns // MS
        self.available.discard(offset)
        self.new_dead_letters.append(offset)
        self.changed = True

    def take_new_dead_letters(self, group_id: str) -> list[DeadLetterItem]:
        """The records that started dead-lettering since the last call (for the writer)."""
        found = []
        for offset in self.new_dead_letters:
            record = self.records.get(offset)
            if record is not None and record.state == DEAD_LETTERING:
                found.append(DeadLetterItem(group_id, self.topic, self.partition, offset, record.reason,
                                            record.delivery_count, record.last_error, record.first_delivery_ms,
                                            record.dead_lettered_ms))
        self.new_dead_letters = []
        return found

    def archive(self, offsets: Iterable[int]) -> None:
        """The dead-letter topic has these records now (or their source is gone for good)."""
        self._verified_holders = None
        for offset in offsets:
            record = self.records.get(offset)
            if record is not None and record.state == DEAD_LETTERING:
                record.state = ARCHIVED
                self.changed = True
        self._advance_start()

    def _advance_start(self) -> None:
        while self.start_offset < self.end_offset and self.records[self.start_offset].state in DONE:
            del self.records[self.start_offset]
            self.start_offset += 1

    # ------------------------------------------------------------------ durability

    def stored(self) -> dict[str, Any]:
        """The compact durable form: the window's bounds and runs of offsets in the same state."""
        runs: list[list[Any]] = []
        previous_key: tuple | None = None
        for offset in range(self.start_offset, self.end_offset):
            key = self.records[offset].stored_key()
            if key == previous_key:
                runs[-1][1] = offset
            else:
                runs.append([offset, offset, *key])
                previous_key = key
        stored: dict[str, Any] = {"start": self.start_offset, "end": self.end_offset, "runs": runs}
        if self.topic_id:
            stored["topic_id"] = self.topic_id
        if self.topic_partitions:
            stored["topic_partitions"] = self.topic_partitions
        return stored

    @classmethod
    def restore(cls, topic: str, partition: int, settings: ShareGroupSettings, limits: Limits,
                stored: dict[str, Any]) -> "SharePartition":
        """The share-partition as stored, every lock void (its records available again)."""
        restored = cls(topic, partition, settings, limits)
        restored.start_offset, restored.end_offset = int(stored["start"]), int(stored["end"])
        restored.topic_id = int(stored.get("topic_id", 0))
        restored.topic_partitions = int(stored.get("topic_partitions", 0))
        for run in stored["runs"]:
            first, last, code, *rest = run
            for offset in range(first, last + 1):
                record = restored.records[offset] = InFlightRecord(_STATE[code])
                if len(rest) == 1:
                    record.delivery_count = rest[0]
                elif rest:
                    (record.delivery_count, record.last_error, record.first_delivery_ms, available_at_ms,
                     record.reason, record.dead_lettered_ms) = rest
                    record.available_at_ns = available_at_ms * MS
                    restored.last_available_at_ns = max(restored.last_available_at_ns, record.available_at_ns)
                if record.state == AVAILABLE:
                    restored.available.add(offset)
                elif record.state == DEAD_LETTERING:
                    restored.new_dead_letters.append(offset)
        restored._advance_start()
        return restored

    # ------------------------------------------------------------------ views

    def held_by(self, member_id: str) -> int:
        return sum(1 for record in self.records.values() if record.state == ACQUIRED and record.holder == member_id)

    def invariants(self, members: Any = None) -> None:
        """`members`: the group's members, when the caller knows them; every lock holder is one.

        Nothing changed since the last full pass (the simulator runs this after every step of the
        coordinator, for every share-partition, and most steps touch one or none): only whether
        each holder that pass found is still a member."""
        verified = self._verified_holders
        if verified is not None and (members is None or all(holder in members for holder in verified)):
            return
        if not self.initialized:
            assert not self.records, f"{self.topic}/{self.partition}: records before the start is known"
            return
        assert self.start_offset <= self.end_offset, f"start {self.start_offset} past end {self.end_offset}"
        assert self.end_offset - self.start_offset <= self.limits.share_records_in_flight_max, "window too large"
        assert len(self.records) == self.end_offset - self.start_offset, "a window offset without a record"
        if self.records:
            assert self.records[self.start_offset].state not in DONE, "the start did not move past done records"
        attempts, earliest, records = self.settings.max_delivery_attempts, self.next_lock_deadline_ns, self.records
        available = 0
        holders: set[str] = set()
        for offset, record in records.items():  # after every step of the simulator: kept lean
            state = record.state
            if state != ACQUIRED:
                available += state == AVAILABLE
                assert not record.holder, f"@{offset}: {state} with holder {record.holder!r}"
                continue
            holder = record.holder
            assert holder, f"@{offset}: acquired without a holder"
            assert members is None or holder in members, f"@{offset}: a lock held by departed {holder}"
            holders.add(holder)
            assert 1 <= record.delivery_count <= attempts, (
                f"@{offset}: delivery count {record.delivery_count} outside 1..{attempts}")
            assert earliest is not None and earliest <= record.lock_deadline_ns, (
                f"@{offset}: its lock deadline is before the earliest one tracked")
        # The available set is exactly the available records: as many, and each of them one.
        assert available == len(self.available) and all(
            offset in records and records[offset].state == AVAILABLE for offset in self.available), (
            "the available set is wrong")
        self._verified_holders = frozenset(holders)


def _ranges(taken: list[tuple[int, int]]) -> list[AcquiredRecords]:
    """(offset, delivery count) pairs, sorted, as runs of consecutive offsets with one count."""
    ranges: list[AcquiredRecords] = []
    for offset, count in taken:
        if ranges and ranges[-1].last_offset == offset - 1 and ranges[-1].delivery_count == count:
            ranges[-1].last_offset = offset
        else:
            ranges.append(AcquiredRecords(first_offset=offset, last_offset=offset, delivery_count=count))
    return ranges


def _cut(text: str, bytes_max: int) -> str:
    """`text` cut to at most `bytes_max` UTF-8 bytes, on a character boundary."""
    encoded = text.encode("utf-8")
    if len(encoded) <= bytes_max:
        return text
    return encoded[:bytes_max].decode("utf-8", "ignore")
