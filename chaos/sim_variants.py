"""Deliberately broken variants of the production actors, to prove the simulator catches bugs.

Each variant patches one rule out of the real code for the duration of a `with` block:

- `ack-before-replication`: a leader answers acks=all requests as soon as it has appended,
  without waiting for the high watermark (the in-sync replicas) to pass the batch;
- `elect-outside-isr`: whenever a live replica is outside the ISR (lagging, or restarted and not
  caught up yet), the coordinator makes it the leader;
- `stale-generation-commit`: the group coordinator accepts offset commits without checking the
  member and its generation, so a zombie's late commit moves the group's offset back;
- `elect-last-reporter`: the coordinator judges ISR members by incarnation alone, as it did before
  replicas reported their storage: a replica not heard from yet counts as healthy, a damaged one
  too, and a restarted one leaves the ISR unless it is the last — so after a restart the last
  replica to report leads, whatever it lost;
- `trust-damaged-replicas`: the storage report is read but a damaged replica is still eligible
  (one forgotten check in `lost_data`).

A test runs seeds with a variant until the simulator reports a violation; it must within a
bounded number of seeds, or the simulator is not doing its job.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

VARIANTS = ("ack-before-replication", "elect-outside-isr", "stale-generation-commit", "elect-last-reporter",
            "trust-damaged-replicas")


@contextlib.contextmanager
def broken(variant: str) -> Iterator[None]:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    restore = _PATCHES[variant]()
    try:
        yield
    finally:
        restore()


def _ack_before_replication():
    from actors import replica_leader

    original = replica_leader.LeaderRole._acknowledge

    def acknowledge(self, request, sender, base_offset, last_offset, now_ns):
        if request.acks == -1:
            return self.replica.durable_reply(sender, self._response(request.correlation_id, base_offset, last_offset))
        return original(self, request, sender, base_offset, last_offset, now_ns)

    replica_leader.LeaderRole._acknowledge = acknowledge
    return lambda: setattr(replica_leader.LeaderRole, "_acknowledge", original)


def _elect_outside_isr():
    from actors import coordinator, elections

    original = elections.reconcile

    def reconcile(record, replicas, views, *, unclean_allowed, min_insync=1):
        """The real decision, then the bug: hand leadership to a live replica outside the ISR."""
        decision = original(record, replicas, views, unclean_allowed=unclean_allowed, min_insync=min_insync)
        current = decision.record if decision is not None else record
        outsiders = [n for n in replicas if n not in current.isr and n in views and views[n].live and n != current.leader]
        if not outsiders:
            return decision
        chosen = outsiders[0]
        forced = elections.PartitionRecord(
            leader=chosen, leader_epoch=current.leader_epoch + 1, partition_epoch=current.partition_epoch + 1,
            leader_incarnation=views[chosen].incarnation, isr=[chosen], isr_incarnations={chosen: views[chosen].incarnation})
        return elections.Decision(forced, [("leader-elected", {"leader": chosen, "leader_epoch": forced.leader_epoch,
                                                               "previous_leader": current.leader})])

    coordinator.reconcile = reconcile
    return lambda: setattr(coordinator, "reconcile", original)


def _stale_generation_commit():
    from actors import group_coordinator

    original = group_coordinator.GroupCoordinator._check_commit
    group_coordinator.GroupCoordinator._check_commit = lambda self, request, group: None
    return lambda: setattr(group_coordinator.GroupCoordinator, "_check_commit", original)


def _elect_last_reporter():
    from actors import elections

    original = elections._classify

    def classify(record, views, incarnations):
        standing = {}
        for node in record.isr:
            view = views.get(node)
            known = incarnations.get(node, 0)
            if view is None or not view.live:
                standing[node] = elections.DEAD
            elif known == 0 or known == view.incarnation:
                standing[node] = elections.CURRENT
            else:
                standing[node] = elections.UNCLEAN
        return standing

    elections._classify = classify
    return lambda: setattr(elections, "_classify", original)


def _trust_damaged_replicas():
    from actors import elections

    original = elections.lost_data
    elections.lost_data = lambda node, record, view: False
    return lambda: setattr(elections, "lost_data", original)


_PATCHES = {
    "elect-last-reporter": _elect_last_reporter,
    "trust-damaged-replicas": _trust_damaged_replicas,
    "ack-before-replication": _ack_before_replication,
    "elect-outside-isr": _elect_outside_isr,
    "stale-generation-commit": _stale_generation_commit,
}
