"""Broken variants of groups, members, assignors and share groups (see chaos/sim_variants.py).

Each function patches one rule out of the production code and returns what puts it back.
"""

from __future__ import annotations

from chaos.sim_variants import Restore, restore_all, swap, unwrap_flushes


def _stale_generation_commit() -> Restore:
    from actors import group_coordinator

    return swap(group_coordinator.GroupCoordinator, "_check_commit", lambda self, request, group: None)


def _commit_before_durable() -> Restore:
    """The commit's answer goes out with the offsets only put, not flushed."""
    from actors import group_coordinator

    original = group_coordinator.GroupCoordinator._on_commit
    return swap(group_coordinator.GroupCoordinator, "_on_commit",
                lambda self, request, sender, now_ns: unwrap_flushes(original(self, request, sender, now_ns)))


def _share_reply_before_durable() -> Restore:
    """Share-group answers go out without waiting for the state that records them to be flushed."""
    from actors import share_group

    original = share_group.ShareGroups._finish
    return swap(share_group.ShareGroups, "_finish",
                lambda self, effects, now_ns: unwrap_flushes(original(self, effects, now_ns)))


def _eager_rejoin_without_revoke() -> Restore:
    """An eager member rejoins at once, as a cooperative one does, keeping what it owns."""
    from actors import consumer_member

    original = consumer_member.ConsumerMember._begin_rebalance

    def begin_rebalance(self, reason, now_ns):
        if self.settings.assignor not in consumer_member.COOPERATIVE_ASSIGNORS:
            return self._join(now_ns)
        return original(self, reason, now_ns)

    return swap(consumer_member.ConsumerMember, "_begin_rebalance", begin_rebalance)


def _rejoin_before_revocations_answered() -> Restore:
    """A revocation sent to the shell is not counted, so the member rejoins without its answer."""
    from actors import consumer_member
    from actors.effects import Notify

    return swap(consumer_member.ConsumerMember, "_revoke",
                lambda self, partitions, *, lost: Notify("revoke", (partitions, lost)))


def _commit_fetched_position() -> Restore:
    """A commit covers where the fetch stands, not the offsets the user processed ("commit the
    consumer's position", with the fetch position taken for it)."""
    import msgspec

    from actors import consumer_member

    original = consumer_member.ConsumerMember._commit

    def commit(self, command, now_ns):
        fetches = self.client.fetches
        offsets = []
        for topic, partition, offset, metadata in command.arguments["offsets"]:
            fetch = fetches.get((topic, partition))
            offsets.append([topic, partition, fetch.position if fetch is not None and fetch.position >= 0 else offset,
                            metadata])
        command = msgspec.structs.replace(command, arguments={**command.arguments, "offsets": offsets})
        return original(self, command, now_ns)

    return swap(consumer_member.ConsumerMember, "_commit", commit)


def _cooperative_moves_held_partition() -> Restore:
    """KIP-429's adjustment withholds a moving partition only while its holder keeps it in its
    own target; one the holder gives up goes to its new owner at once, before it was revoked."""
    from actors import assignors, consumer_member

    def cooperative_adjust(target, owned):
        assignors._check_single_owner(target)
        held = assignors._deduplicated_claims(owned)
        holders: dict = {}
        for member, claims in held.items():
            for topic_partition in claims:
                holders.setdefault(topic_partition, []).append(member)
        assignment: dict = {}
        withheld: list = []
        for member, targeted in assignors._deduplicated_claims(target).items():
            assignment[member] = []
            for topic_partition in targeted:
                current_holders = holders.get(topic_partition, [])
                if current_holders and member not in current_holders and any(
                        topic_partition in target.get(holder, ()) for holder in current_holders):
                    withheld.append(topic_partition)
                else:
                    assignment[member].append(topic_partition)
        revocations = {}
        for member in sorted(set(target) | set(owned)):
            keeping = set(assignment.get(member, []))
            revocations[member] = [tp for tp in held.get(member, []) if tp not in keeping]
        return assignors.CooperativePlan(assignment=assignment, revocations=revocations, withheld=sorted(withheld))

    return restore_all(swap(assignors, "cooperative_adjust", cooperative_adjust),
                       swap(consumer_member, "cooperative_adjust", cooperative_adjust))


def _share_answer_after_expiry() -> Restore:
    """An acknowledgement is checked against the locks as they were at the last tick, so the
    holder's answer after its lock's deadline (and before the tick) is applied."""
    from actors import share_partition

    original = share_partition.SharePartition.acknowledge

    def acknowledge(self, member_id, acknowledgement, now_ns):
        self.expire_locks = lambda now_ns: False
        try:
            return original(self, member_id, acknowledgement, now_ns)
        finally:
            del self.expire_locks

    return swap(share_partition.SharePartition, "acknowledge", acknowledge)


def _share_count_not_restored() -> Restore:
    from actors import share_partition

    original = share_partition.SharePartition.restore

    def restore(cls, topic, partition, settings, limits, stored):
        restored = original(topic, partition, settings, limits, stored)
        for record in restored.records.values():
            if record.state not in share_partition.DONE:
                record.delivery_count = 0
        return restored

    return swap(share_partition.SharePartition, "restore", classmethod(restore))


def _share_release_delay_ignored() -> Restore:
    from actors import share_partition

    original = share_partition.SharePartition.acquire

    def acquire(self, member_id, max_records, now_ns):
        for offset in self.available:
            self.records[offset].available_at_ns = 0
        return original(self, member_id, max_records, now_ns)

    return swap(share_partition.SharePartition, "acquire", acquire)


def _share_start_passes_locked() -> Restore:
    """The start offset moves past every record nobody can take now: done ones and locked ones."""
    from actors import share_partition

    def advance_start(self):
        while self.start_offset < self.end_offset and self.records[self.start_offset].state in (
                share_partition.ACCEPTED, share_partition.ARCHIVED, share_partition.ACQUIRED):
            record = self.records.pop(self.start_offset)
            if record.state == share_partition.ACQUIRED:
                record.state, record.holder = share_partition.ARCHIVED, ""
            self.start_offset += 1

    return swap(share_partition.SharePartition, "_advance_start", advance_start)


def _share_accepts_not_restored() -> Restore:
    """Restoring a share-partition, accepted runs come back available (their state code misread)."""
    from actors import share_partition

    original = share_partition.SharePartition.restore

    def restore(cls, topic, partition, settings, limits, stored):
        restored = original(topic, partition, settings, limits, stored)
        for offset, record in restored.records.items():
            if record.state == share_partition.ACCEPTED:
                record.state = share_partition.AVAILABLE
                restored.available.add(offset)
        return restored

    return swap(share_partition.SharePartition, "restore", classmethod(restore))


def _share_one_delivery_too_many() -> Restore:
    """The delivery limit compared with `>` where it takes `>=`: one delivery more than allowed."""
    import msgspec

    from actors import share_partition

    cls = share_partition.SharePartition

    def one_more(method):
        def patched(self, *arguments):
            real = self.settings
            self.settings = msgspec.structs.replace(real, max_delivery_attempts=real.max_delivery_attempts + 1)
            try:
                return method(self, *arguments)
            finally:
                self.settings = real
        return patched

    return restore_all(swap(cls, "acquire", one_more(cls.acquire)), swap(cls, "_release", one_more(cls._release)))


def _dead_letter_written_twice() -> Restore:
    """New dead letters are queued without looking at the writes already stored."""
    from actors import share_dead_letters

    def enqueue(self, group_id, share_partition):
        self.unrouted += share_partition.take_new_dead_letters(group_id)

    return swap(share_dead_letters.DeadLetterWriter, "enqueue", enqueue)


PATCHES = {
    "stale-generation-commit": _stale_generation_commit,
    "commit-before-durable": _commit_before_durable,
    "share-reply-before-durable": _share_reply_before_durable,
    "eager-rejoin-without-revoke": _eager_rejoin_without_revoke,
    "rejoin-before-revocations-answered": _rejoin_before_revocations_answered,
    "commit-fetched-position": _commit_fetched_position,
    "cooperative-moves-held-partition": _cooperative_moves_held_partition,
    "share-answer-after-expiry": _share_answer_after_expiry,
    "share-count-not-restored": _share_count_not_restored,
    "share-release-delay-ignored": _share_release_delay_ignored,
    "share-start-passes-locked": _share_start_passes_locked,
    "dead-letter-written-twice": _dead_letter_written_twice,
    "share-accepts-not-restored": _share_accepts_not_restored,
    "share-one-delivery-too-many": _share_one_delivery_too_many,
}
