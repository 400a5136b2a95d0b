"""Leader election and ISR maintenance rules, as pure functions over one partition's record.

The coordinator calls `reconcile` whenever anything it knows about a partition's replicas
changes (a heartbeat from a new incarnation or with new storage news, a session timeout, a
process exit). The rules:

1. An ISR member stays while it is live with the incarnation it joined with, or after it restarted
   from a *clean* shutdown with its storage intact (it lost nothing: KIP-966's clean-shutdown
   rule) and its log reaching every high watermark another live ISR member has seen (every ISR
   member holds that much; a shorter log is a directory put back from an older copy, whose own
   checkpoints agree with it — unless an unclean election rewrote the history). It leaves the ISR
   when it is dead, when it restarted uncleanly (its unflushed tail may be gone, its memory
   certainly is), and at once when it reports **lost or damaged data** — flushed offsets missing
   or refused as corrupt, or an empty directory where it held data before (docs/architecture.md,
   "Storage faults"). A damaged replica is never eligible to lead until it has repaired from a
   healthy leader and rejoined the ISR.
2. The ISR never becomes empty: its last member is the replica known to hold every acknowledged
   write. Who remains when every member would leave is decided on evidence, not on who reported
   last: while some member has not reported since this coordinator started (within its grace)
   nothing is decided; then, among the members that reported and lost nothing, the one with the
   highest (holds the known high watermark, last leader epoch, log end offset) stays and leads.
   A member is never dropped for not having reported (it is not known to be gone; a leader
   shrinks the ISR of followers that do not fetch): with nobody else eligible the partition
   waits for it. If every member lost data (or is dead), the last one stays as the ISR but is not
   eligible, and the partition goes offline saying why.
3. The leader must be a live ISR member whose incarnation is the one that was elected. If it is
   not, the first ISR member in replica order that is live at its known incarnation leads
   (Kafka's preferred-replica order); with none, the best of the cleanly restarted members,
   then of the eligible leader replicas (KIP-966). A member that restarted uncleanly may have
   lost its unflushed tail: it leads only when no ELR member is left to wait for.
4. With nobody eligible the partition goes offline (leader -1) rather than lose data — unless
   `unclean_leader_election` is on: then the best live replica (lossless first, then by the key of
   rule 2) leads and becomes the whole ISR. That choice can lose acknowledged writes: the result
   says so, and `last_unclean_epoch` tells followers they may truncate below what they had seen
   committed.
5. Every leader change (including to none and to a new incarnation of the same node) bumps the
   leader epoch; every leader or ISR change bumps the partition epoch (KIP-497).
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from actors.errors import ErrorCode


class PartitionRecord(msgspec.Struct, kw_only=True):
    """The durable state of one partition, as the coordinator stores it."""

    leader: int = -1
    leader_epoch: int = 0
    partition_epoch: int = 0
    leader_incarnation: int = 0  # 0: not yet seen (a brand-new partition)
    isr: list[int] = []
    isr_incarnations: dict[int, int] = {}  # node -> incarnation when it joined; 0: not yet seen
    last_unclean_epoch: int = -1  # the latest leader epoch that began with an unclean election
    offline_reason: str = ""  # why the partition has no leader, when it has none
    # Rebuilt from the replica directories (transport/metadata_rebuild.py): the members'
    # incarnations are unknown, so the first to report is not trusted over the others.
    unknown_history: bool = False
    # Eligible leader replicas (KIP-966): members that left the ISR while it was below
    # min_insync_replicas, with the incarnation they had. No acks=all write was acknowledged after
    # they left (the ISR was too small), so each holds every acknowledged write and may lead when
    # no ISR member can — unless it restarts uncleanly or reports damage, which takes it out.
    elr: dict[int, int] = {}
    # The partition epoch its leader and ISR were last decided at (-1: `partition_epoch` itself). A
    # settings change bumps the partition epoch (replicas take it so) but not this: a leader's
    # ISR change asked at any epoch from here on is asked of the same leader and ISR.
    isr_epoch: int = -1

    def isr_epoch_floor(self) -> int:
        """The oldest partition epoch an ISR change may be asked at."""
        return self.isr_epoch if self.isr_epoch >= 0 else self.partition_epoch


class ReplicaView(NamedTuple):
    """What the coordinator knows of one replica right now."""

    live: bool
    incarnation: int
    log_end_offset: int
    reported: bool = True  # False: presumed alive during a grace period, not heard from yet
    clean: bool = False  # this incarnation started from a clean shutdown of the previous one
    damaged: bool = False  # reports flushed data it lost or refuses as corrupt
    new_directory: bool = False  # started from an empty directory (holds none of the past)
    last_epoch: int = -1  # the leader epoch of the last batch it holds
    high_watermark: int = 0  # the committed end it had seen (restored from its checkpoint)


class Decision(NamedTuple):
    record: PartitionRecord
    events: list[tuple[str, dict]]


def reconcile(
    record: PartitionRecord,
    replicas: list[int],
    views: dict[int, ReplicaView],
    *,
    unclean_allowed: bool,
    min_insync: int = 1,
) -> Decision | None:
    """Apply the rules above; return the new record and what happened, or None if nothing changes."""
    incarnations = _adopt_first_seen(record, views)
    members = _classify(record, views, incarnations)
    elr, eligible = _eligible_leader_replicas(record, views)
    keep = [node for node in record.isr if members[node] in (CURRENT, CLEAN, PRESUMED, ABSENT)]
    for node in keep:
        if members[node] in (CURRENT, CLEAN):
            incarnations[node] = views[node].incarnation
    events: list[tuple[str, dict]] = []
    leader, leader_incarnation = record.leader, record.leader_incarnation
    if leader_incarnation == 0 and leader in views and views[leader].live and record.leader_epoch == 0:
        leader_incarnation = views[leader].incarnation  # a new partition's first leader shows up
    known_high_watermark = max((view.high_watermark for view in views.values() if view.reported), default=0)
    reported_keep = [node for node in keep if members[node] in (CURRENT, CLEAN)]
    waiting = [node for node in record.isr if members[node] == PRESUMED]
    absent = [node for node in record.isr if members[node] == ABSENT]
    if not reported_keep and waiting:
        # Nobody known to hold everything has reported yet: keep every member that may still hold
        # it (restarted ones included) and decide nothing until the rest report or the grace ends.
        keep = [node for node in record.isr if members[node] in (PRESUMED, ABSENT, UNCLEAN)]
    leader_ok = (leader in keep and members[leader] in (CURRENT, PRESUMED)
                 and views[leader].incarnation == leader_incarnation)
    unclean = False
    offline_reason = ""
    if leader_ok:
        pass
    elif reported_keep:
        leader = _first_current(replicas, reported_keep, members) or _best(reported_keep, views, replicas,
                                                                              known_high_watermark)
        leader_incarnation = views[leader].incarnation
    elif waiting:
        leader, leader_incarnation = -1, 0
        offline_reason = f"waiting for ISR members {waiting} to report after a restart"
    else:
        unclean_members = [node for node in record.isr if members[node] == UNCLEAN]
        # An ISR member that restarted uncleanly may have lost its unflushed tail, as an ELR member
        # that did (below): an eligible ELR member holds every acknowledged write and leads
        # instead, and while an ELR member has not been heard from the partition waits for it
        # (the simulator's seed 30951 elected the last ISR member, back without 10 committed
        # offsets, while the ELR member that held them was paused). ISR members dying in this same
        # decision leave for the ELR when what stays is below min_insync (next_elr): they are
        # waited for too (seed 81475 elected a member back without 5 committed offsets in the
        # decision that dropped the two dead members holding them).
        # ISR members not heard from since this coordinator started are not known to be dead and
        # may hold everything: they are waited for too (seed 4883: the coordinator that had
        # decided for them crashed before its decision was durable; the next one, hearing from
        # neither, elected the member back without 10 committed offsets).
        dying = {node: record.isr_incarnations.get(node, 0) for node in record.isr if members[node] == DEAD}
        joining = next_elr({}, unclean_members[:1], dying, min_insync)
        standing = [node for node in {**elr, **joining} if node not in eligible]
        restarted = eligible or ([] if standing or absent else unclean_members)
        if unclean_members and not restarted:
            leader, leader_incarnation = -1, 0
            awaited = (f"eligible leader replicas {standing}" if standing else "") + \
                (" and " if standing and absent else "") + (f"ISR members {absent}" if absent else "")
            offline_reason = (f"ISR members {unclean_members} restarted uncleanly and may lack acknowledged "
                              f"writes: waiting for {awaited} to report")
        elif restarted:
            leader = _best(restarted, views, replicas, known_high_watermark)
            leader_incarnation = views[leader].incarnation
            keep = [node for node in record.isr if node == leader or members[node] == ABSENT]
            if leader not in keep:
                keep.insert(0, leader)  # an eligible leader replica takes the lead
            incarnations[leader] = leader_incarnation
        elif absent:
            keep = [node for node in record.isr if members[node] == ABSENT]
            leader, leader_incarnation = -1, 0
            offline_reason = (f"waiting for ISR members {absent} to report: no in-sync replica that reported "
                              "can lead" + (f" ({_offline_reason(record, members)})" if len(absent) < len(record.isr)
                                            else ""))
        else:
            keep = [_survivor(record, replicas, views, members)]
            leader, leader_incarnation = -1, 0
            offline_reason = _offline_reason(record, members)
        if leader < 0 and unclean_allowed:
            chosen = _unclean_choice(replicas, views, record, known_high_watermark)
            if chosen is not None:
                leader, leader_incarnation, keep, unclean = chosen, views[chosen].incarnation, [chosen], True
                incarnations = {chosen: leader_incarnation}
                offline_reason = ""
                events.append(("unclean-election", {"leader": chosen, "isr_before": list(record.isr)}))
    if not keep:
        keep = [_survivor(record, replicas, views, members)]
    if unclean:
        elr = {}
    else:
        # A member that restarted uncleanly may have lost its unflushed tail: it does not join the
        # ELR (KIP-966); one that is only dead (or silent) holds what it held.
        left = {node: record.isr_incarnations.get(node, 0)
                for node in record.isr if node not in keep and members[node] == DEAD}
        elr = next_elr(elr, keep, left, min_insync)
    incarnations = {node: incarnations.get(node, 0) for node in keep}
    new = PartitionRecord(
        leader=leader, leader_epoch=record.leader_epoch, partition_epoch=record.partition_epoch,
        leader_incarnation=leader_incarnation, isr=keep, isr_incarnations=incarnations,
        last_unclean_epoch=record.last_unclean_epoch, offline_reason=offline_reason if leader < 0 else "",
        unknown_history=record.unknown_history and leader < 0, elr=elr, isr_epoch=record.isr_epoch,
    )
    if new == record:
        return None
    if (new.leader, new.leader_incarnation) != (record.leader, record.leader_incarnation) and (
        record.leader_incarnation != 0 or new.leader != record.leader
    ):
        new.leader_epoch += 1
        if unclean:
            new.last_unclean_epoch = new.leader_epoch
        events.append(("leader-elected" if leader >= 0 else "partition-offline",
                       {"leader": leader, "leader_epoch": new.leader_epoch, "previous_leader": record.leader,
                        **({"reason": new.offline_reason} if leader < 0 else {})}))
    # An ISR member's recorded process replaced by another counts as a change too: leaders fence
    # the earlier one by it, and a state saying so must not be taken for an older one with the
    # same epochs. (The first process seen, where none was known, fences nobody yet.)
    replaced = any(record.isr_incarnations.get(node, 0) not in (0, incarnation)
                   for node, incarnation in new.isr_incarnations.items())
    if new.isr != record.isr or new.leader != record.leader or new.leader_epoch != record.leader_epoch or replaced:
        new.partition_epoch += 1
        new.isr_epoch = -1
        if new.isr != record.isr:
            events.append(("isr-changed", {"isr": list(new.isr), "previous_isr": list(record.isr)}))
    return Decision(new, events)


CURRENT, CLEAN, UNCLEAN, LOST, DEAD = "current", "restarted-clean", "restarted-unclean", "lost-data", "dead"
PRESUMED = "not-reported-yet"  # presumed alive during a grace period: never dropped, never elected
ABSENT = "never-reported"  # not heard from since the coordinator started, grace over: not dropped


def _classify(record: PartitionRecord, views: dict[int, ReplicaView], incarnations: dict[int, int]) -> dict[int, str]:
    """Each ISR member's standing (rule 1)."""
    standing = {}
    for node in record.isr:
        view = views.get(node)
        known = incarnations.get(node, 0)
        if view is not None and not view.reported:
            standing[node] = PRESUMED if view.live else ABSENT
        elif view is None or not view.live:
            standing[node] = DEAD
        elif lost_data(node, record, view):
            standing[node] = LOST
        elif record.unknown_history and record.isr_incarnations.get(node, 0) == 0:
            standing[node] = UNCLEAN  # nothing is known of its past: judged with the others
        elif known == 0 or known == view.incarnation:
            standing[node] = CURRENT
        elif view.clean:
            holds_committed = view.log_end_offset >= _seen_committed_by_others(node, record, views)
            standing[node] = CLEAN if holds_committed else LOST
        else:
            standing[node] = UNCLEAN
    return standing


def _seen_committed_by_others(node: int, record: PartitionRecord, views: dict[int, ReplicaView]) -> int:
    """The highest high watermark another live ISR member reported. Every ISR member holds at
    least that: a leader moves its high watermark only once the whole ISR has fetched past it, and
    a replica joins the ISR caught up. Not after an unclean election (0): the checkpoints may
    still name offsets of the history it dropped."""
    if record.last_unclean_epoch >= 0:
        return 0
    return max((views[other].high_watermark for other in record.isr
                if other != node and other in views and views[other].reported and views[other].live), default=0)


def lost_data(node: int, record: PartitionRecord, view: ReplicaView) -> bool:
    """The replica reports damage, or an empty directory where an earlier process of it held
    data: another incarnation had reported to this partition, so the emptiness is a loss (the
    first process of a brand-new replica reports an empty directory too, and loses nothing)."""
    if view.damaged:
        return True
    if not view.new_directory:
        return False
    known = {record.isr_incarnations.get(node, 0), record.leader_incarnation if node == record.leader else 0}
    return any(incarnation not in (0, view.incarnation) for incarnation in known)


def _first_current(replicas: list[int], candidates: list[int], members: dict[int, str]) -> int | None:
    for node in replicas:
        if node in candidates and members[node] == CURRENT:
            return node
    return None


def _election_key(node: int, views: dict[int, ReplicaView], replicas: list[int], high_watermark: int) -> tuple:
    view = views[node]
    return (view.log_end_offset >= high_watermark, view.last_epoch, view.log_end_offset, -_rank(replicas, node))


def _best(candidates: list[int], views: dict[int, ReplicaView], replicas: list[int], high_watermark: int) -> int:
    return max(candidates, key=lambda node: _election_key(node, views, replicas, high_watermark))


def _survivor(record: PartitionRecord, replicas: list[int], views: dict[int, ReplicaView],
              members: dict[int, str]) -> int:
    """The ISR's last member when nobody eligible remains: a live lossless one if any, else the
    one that led, else the first."""
    live = [node for node in record.isr if members.get(node) not in (DEAD, PRESUMED, ABSENT, None)]
    lossless = [node for node in live if members[node] != LOST]
    if lossless:
        return max(lossless, key=lambda node: (views[node].log_end_offset, -_rank(replicas, node)))
    return record.leader if record.leader in record.isr else record.isr[0]


def _offline_reason(record: PartitionRecord, members: dict[int, str]) -> str:
    lost = [node for node in record.isr if members[node] == LOST]
    dead = [node for node in record.isr if members[node] == DEAD]
    parts = []
    if lost:
        parts.append(f"ISR members {lost} lost or damaged data")
    if dead:
        parts.append(f"ISR members {dead} are not running")
    return "no in-sync replica can lead: " + "; ".join(parts) if parts else "no in-sync replica can lead"


def _unclean_choice(replicas: list[int], views: dict[int, ReplicaView], record: PartitionRecord,
                    high_watermark: int) -> int | None:
    live = [node for node in replicas if node in views and views[node].live and views[node].reported]
    if not live:
        return None
    lossless = [node for node in live if not lost_data(node, record, views[node])]
    return _best(lossless or live, views, replicas, high_watermark)


def _eligible_leader_replicas(record: PartitionRecord, views: dict[int, ReplicaView]) -> tuple[dict[int, int], list[int]]:
    """(the ELR still standing, the members of it that may lead now). A member at the incarnation
    it left with, or restarted from a clean shutdown, holds what it held and may lead. One that
    reports lost data leaves it, and so does one that restarted uncleanly (KIP-966): whatever it
    held unflushed may be gone, and nothing it reports says how much — the replica that holds the
    known high watermark may be the one not heard from (the simulator's seed 1415 lost 25
    acknowledged writes electing such a member). One not heard from stays, not eligible."""
    elr: dict[int, int] = {}
    eligible: list[int] = []
    for node, incarnation in sorted(record.elr.items()):
        view = views.get(node)
        if node in record.isr:
            continue
        if view is None or not view.reported or not view.live:
            elr[node] = incarnation
        elif lost_data(node, record, view):
            continue
        elif (incarnation != 0 and view.incarnation == incarnation) or view.clean:
            elr[node] = view.incarnation
            eligible.append(node)
    return elr, eligible


def next_elr(elr: dict[int, int], isr: list[int], left: dict[int, int], min_insync: int) -> dict[int, int]:
    """The ELR after an ISR change (KIP-966): an ISR of at least `min_insync` members holds every
    acknowledged write by itself, so the ELR empties; below it, the members that just left join."""
    if len(isr) >= min_insync:
        return {}
    merged = {node: incarnation for node, incarnation in {**elr, **left}.items() if node not in isr}
    return dict(sorted(merged.items()))


def _adopt_first_seen(record: PartitionRecord, views: dict[int, ReplicaView]) -> dict[int, int]:
    incarnations = dict(record.isr_incarnations)
    for node in record.isr:
        view = views.get(node)
        if incarnations.get(node, 0) == 0 and view is not None and view.live:
            incarnations[node] = view.incarnation
    return incarnations


def _rank(replicas: list[int], node: int) -> int:
    return replicas.index(node) if node in replicas else len(replicas)


def check_alter_isr(
    record: PartitionRecord,
    replicas: list[int],
    leader: int,
    leader_epoch: int,
    partition_epoch: int,
    isr: list[int],
    isr_incarnations: list[int],
    views: dict[int, ReplicaView],
    min_insync: int = 1,
) -> tuple[ErrorCode, str] | PartitionRecord:
    """Validate a leader's ISR change request; return the new record or (error, sentence)."""
    if leader != record.leader or leader_epoch != record.leader_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH, (
            f"leader {leader} epoch {leader_epoch} is not the current leader "
            f"{record.leader} epoch {record.leader_epoch}")
    if not record.isr_epoch_floor() <= partition_epoch <= record.partition_epoch:
        return ErrorCode.INVALID_REQUEST, (
            f"stale partition epoch {partition_epoch}, current is {record.partition_epoch}")
    if len(set(isr)) != len(isr) or leader not in isr or any(node not in replicas for node in isr):
        return ErrorCode.INVALID_REQUEST, f"ISR {isr} must be distinct replicas including the leader"
    left = {node: record.isr_incarnations.get(node, 0) for node in record.isr if node not in isr}
    seen = dict(zip(isr, isr_incarnations)) if len(isr_incarnations) == len(isr) else {}
    incarnations = {}
    for node in isr:
        if node in record.isr:
            incarnations[node] = record.isr_incarnations.get(node, 0)
            continue
        view = views.get(node)
        if view is None or not view.live:
            return ErrorCode.INVALID_REQUEST, f"replica {node} is not alive and cannot join the ISR"
        if view.damaged or view.new_directory:
            return ErrorCode.INVALID_REQUEST, (f"replica {node} reports lost or damaged data and joins the ISR "
                                               "only once it has repaired from the leader")
        if seen.get(node, view.incarnation) != view.incarnation:
            return ErrorCode.INVALID_REQUEST, f"replica {node} restarted since the leader saw it"
        incarnations[node] = view.incarnation
    return PartitionRecord(
        leader=record.leader, leader_epoch=record.leader_epoch,
        partition_epoch=record.partition_epoch + 1, leader_incarnation=record.leader_incarnation,
        isr=list(isr), isr_incarnations=incarnations, last_unclean_epoch=record.last_unclean_epoch,
        elr=next_elr(record.elr, list(isr), left, min_insync),
    )
