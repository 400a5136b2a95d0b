"""Leader election and ISR maintenance rules, as pure functions over one partition's record.

The coordinator calls `reconcile` whenever anything it knows about a partition's replicas
changes (a heartbeat from a new incarnation, a session timeout, a process exit). The rules:

1. An ISR member that is dead, or that restarted since it joined the ISR (its incarnation
   changed: its log may have lost an unflushed tail, and its in-memory state is gone), leaves the
   ISR — unless it is the last member. The ISR never becomes empty: its last member is the
   replica known to hold every acknowledged write (Kafka keeps the last member too). When every
   member must go, the survivor is the live one with the longest log, else the old leader.
2. The leader must be a live ISR member whose incarnation is the one that was elected. If it is
   not, the first live ISR member in replica order leads (Kafka's preferred-replica order).
3. With nobody eligible the partition goes offline (leader -1) rather than lose data — unless
   `unclean_leader_election` is on, when the live replica with the longest log leads and becomes
   the whole ISR. That choice can lose acknowledged writes: the result says so, so it is visible.
4. Every leader change (including to none and to a new incarnation of the same node) bumps the
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


class ReplicaView(NamedTuple):
    """What the coordinator knows of one replica right now."""

    live: bool
    incarnation: int
    log_end_offset: int


class Decision(NamedTuple):
    record: PartitionRecord
    events: list[tuple[str, dict]]


def reconcile(
    record: PartitionRecord,
    replicas: list[int],
    views: dict[int, ReplicaView],
    *,
    unclean_allowed: bool,
) -> Decision | None:
    """Apply the rules above; return the new record and what happened, or None if nothing changes."""
    incarnations = _adopt_first_seen(record, views)
    keep = [node for node in record.isr if _healthy(node, incarnations, views)]
    events: list[tuple[str, dict]] = []
    if not keep:
        survivor = _survivor(record, replicas, views)
        keep = [survivor]
        if survivor in views and views[survivor].live:
            incarnations[survivor] = views[survivor].incarnation
    leader, leader_incarnation = record.leader, record.leader_incarnation
    if leader_incarnation == 0 and leader in views and views[leader].live and record.leader_epoch == 0:
        leader_incarnation = views[leader].incarnation  # a new partition's first leader shows up
    leader_ok = (
        leader in keep and leader in views and views[leader].live
        and views[leader].incarnation == leader_incarnation
    )
    if not leader_ok:
        leader, leader_incarnation, keep, unclean = _elect(replicas, keep, views, unclean_allowed)
        if unclean:
            incarnations = {leader: leader_incarnation}
            events.append(("unclean-election", {"leader": leader, "isr_before": list(record.isr)}))
    incarnations = {node: incarnations.get(node, 0) for node in keep}
    new = PartitionRecord(
        leader=leader, leader_epoch=record.leader_epoch, partition_epoch=record.partition_epoch,
        leader_incarnation=leader_incarnation, isr=keep, isr_incarnations=incarnations,
    )
    if new == record:
        return None
    if (new.leader, new.leader_incarnation) != (record.leader, record.leader_incarnation) and (
        record.leader_incarnation != 0 or new.leader != record.leader
    ):
        new.leader_epoch += 1
        events.append(("leader-elected" if leader >= 0 else "partition-offline",
                       {"leader": leader, "leader_epoch": new.leader_epoch, "previous_leader": record.leader}))
    if new.isr != record.isr or new.leader != record.leader or new.leader_epoch != record.leader_epoch:
        new.partition_epoch += 1
        if new.isr != record.isr:
            events.append(("isr-changed", {"isr": list(new.isr), "previous_isr": list(record.isr)}))
    return Decision(new, events)


def _adopt_first_seen(record: PartitionRecord, views: dict[int, ReplicaView]) -> dict[int, int]:
    incarnations = dict(record.isr_incarnations)
    for node in record.isr:
        view = views.get(node)
        if incarnations.get(node, 0) == 0 and view is not None and view.live:
            incarnations[node] = view.incarnation
    return incarnations


def _healthy(node: int, incarnations: dict[int, int], views: dict[int, ReplicaView]) -> bool:
    view = views.get(node)
    if view is None or not view.live:
        return False
    known = incarnations.get(node, 0)
    return known == 0 or known == view.incarnation


def _survivor(record: PartitionRecord, replicas: list[int], views: dict[int, ReplicaView]) -> int:
    live = [node for node in record.isr if node in views and views[node].live]
    if live:
        return max(live, key=lambda node: (views[node].log_end_offset, -_rank(replicas, node)))
    return record.leader if record.leader in record.isr else record.isr[0]


def _rank(replicas: list[int], node: int) -> int:
    return replicas.index(node) if node in replicas else len(replicas)


def _elect(
    replicas: list[int], keep: list[int], views: dict[int, ReplicaView], unclean_allowed: bool,
) -> tuple[int, int, list[int], bool]:
    """(leader, its incarnation, isr, unclean?)"""
    for node in replicas:
        if node in keep and node in views and views[node].live:
            return node, views[node].incarnation, keep, False
    if unclean_allowed:
        live = [node for node in replicas if node in views and views[node].live]
        if live:
            chosen = max(live, key=lambda node: (views[node].log_end_offset, -_rank(replicas, node)))
            return chosen, views[chosen].incarnation, [chosen], True
    return -1, 0, keep, False


def check_alter_isr(
    record: PartitionRecord,
    replicas: list[int],
    leader: int,
    leader_epoch: int,
    partition_epoch: int,
    isr: list[int],
    isr_incarnations: list[int],
    views: dict[int, ReplicaView],
) -> tuple[ErrorCode, str] | PartitionRecord:
    """Validate a leader's ISR change request; return the new record or (error, sentence)."""
    if leader != record.leader or leader_epoch != record.leader_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH, (
            f"leader {leader} epoch {leader_epoch} is not the current leader "
            f"{record.leader} epoch {record.leader_epoch}")
    if partition_epoch != record.partition_epoch:
        return ErrorCode.INVALID_REQUEST, (
            f"stale partition epoch {partition_epoch}, current is {record.partition_epoch}")
    if len(set(isr)) != len(isr) or leader not in isr or any(node not in replicas for node in isr):
        return ErrorCode.INVALID_REQUEST, f"ISR {isr} must be distinct replicas including the leader"
    seen = dict(zip(isr, isr_incarnations)) if len(isr_incarnations) == len(isr) else {}
    incarnations = {}
    for node in isr:
        if node in record.isr:
            incarnations[node] = record.isr_incarnations.get(node, 0)
            continue
        view = views.get(node)
        if view is None or not view.live:
            return ErrorCode.INVALID_REQUEST, f"replica {node} is not alive and cannot join the ISR"
        if seen.get(node, view.incarnation) != view.incarnation:
            return ErrorCode.INVALID_REQUEST, f"replica {node} restarted since the leader saw it"
        incarnations[node] = view.incarnation
    return PartitionRecord(
        leader=record.leader, leader_epoch=record.leader_epoch,
        partition_epoch=record.partition_epoch + 1, leader_incarnation=record.leader_incarnation,
        isr=list(isr), isr_incarnations=incarnations,
    )
