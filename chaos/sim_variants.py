"""Deliberately broken variants of the production actors, to prove the simulator catches bugs.

Each variant takes one rule out of the real code for the duration of a `with broken(name):`
block — the plausible one-line bug an engineer could write — by patching the class or function
inside the simulated process (the actor sources are never edited). Each was written from the
rule it breaks, not from the check that finds it; `tests/sim/test_simulator.py` runs seeds of the
default sweep with each until the simulator reports a violation, which it must do within a
bounded number of seeds.

Replication, elections, producer state (chaos/sim_variants_log.py):

- `ack-before-replication` (leader): acks=all answered as soon as the leader appended;
- `commit-below-min-insync` (leader): the leader reads min_insync_replicas as 1 when it moves the
  high watermark and answers waiting acks=all requests (KIP-966's freeze forgotten);
- `retry-answered-at-once` (leader): a recognised idempotent retry is answered at once, as if the
  first try had been acknowledged, though it may still wait for the in-sync replicas;
- `fetch-before-flush` (follower): with flush_policy=every_batch the next fetch goes out before the
  appended batches are flushed, so the leader counts bytes the follower may lose;
- `follower-forgets-producers` (producer state): replicated batches are not recorded in the
  follower's producer-state table, so a new leader does not recognise retries;
- `elect-outside-isr` (coordinator): a live replica outside the ISR is made leader;
- `elect-last-reporter` (coordinator): ISR members judged by incarnation alone, as before storage
  reports; `trust-damaged-replicas` (coordinator): a replica reporting damage stays eligible;
- `restart-keeps-isr-seat` (coordinator): a replica that restarted without a clean shutdown keeps
  its ISR seat, as if clean (its unflushed tail may be gone);
- `late-exit-notice-kills` (coordinator): an exit notice is applied to whatever incarnation is
  live, so a late notice marks the restarted process dead for good;
- `follower-trusts-leader-watermark` (follower): the follower's high watermark is the leader's,
  not bounded by its own log end;
- `agent-takes-any-report` (node agent): a report about a replica of the node is taken from any
  process, so a zombie's (chaos/sim_zombies.py) tells the coordinator its lost disk is on record;
- `retry-renumbered` (producer): a retried batch is encoded again with the next sequence numbers,
  so the leader cannot recognise a retry of a batch it already appended;
- `producer-window-counts-in-flight` (producer): a new batch goes out whenever fewer than 5 are in
  flight, however old the partition's oldest unsettled one, so the leader may forget it before
  its retry;
- `unknown-producer-any-sequence` (leader): an unknown producer's first batch is taken at any
  sequence, so it may overtake earlier batches the leader refused, which are then never appended;
- `producer-keeps-numbers-past-a-gap` (producer): a batch that ended undelivered leaves no gap on
  record, so the batches after it keep numbers the leader never takes.

Groups, members, assignors, share groups (chaos/sim_variants_groups.py):

- `stale-generation-commit` (group coordinator): commits accepted without the member and
  generation check; `commit-before-durable` (group coordinator): a commit is answered before the
  state holding it is flushed; `share-reply-before-durable` (group coordinator): share-group answers
  (acquired records, accepted acknowledgements, dead-letter writes) go out before the state is flushed;
- `eager-rejoin-without-revoke` (consumer member): an eager member rejoins without revoking;
- `rejoin-before-revocations-answered` (consumer member): a member rejoins without waiting for the
  shell to answer its revocations (the seed-171 bug, as the member had it);
- `commit-fetched-position` (consumer member): on a cooperative revocation the member commits the
  revoked partitions' fetch positions itself, covering records fetched but not processed;
- `cooperative-moves-held-partition` (assignor): KIP-429's adjustment withholds a moving partition
  only when its holder keeps it, so a partition reaches its new owner before the old one revoked it;
- `share-answer-after-expiry` (share partition): an acknowledgement is checked against the locks as
  the last tick left them, so an answer after the lock's deadline is applied;
- `share-count-not-restored` (share partition): a restarted coordinator restores records without
  their delivery counts;
- `share-release-delay-ignored` (share partition): released records are redelivered before their delay;
- `share-start-passes-locked` (share partition): the start offset moves past locked records too;
- `share-accepts-not-restored` (share partition): a restarted coordinator restores accepted
  records as available;
- `share-one-delivery-too-many` (share partition): the delivery limit is compared with `>`, so a
  record is delivered once more than `max_delivery_attempts`;
- `dead-letter-written-twice` (share dead letters): records of a stored write are queued again.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

Restore = Callable[[], None]


def swap(owner: Any, name: str, value: Any) -> Restore:
    """Replace `owner.name` by `value`; the returned function puts the original back."""
    had_own = isinstance(owner, type) and name in owner.__dict__
    original = owner.__dict__[name] if had_own else getattr(owner, name)
    setattr(owner, name, value)

    def restore() -> None:
        if isinstance(owner, type) and not had_own:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    return restore


def restore_all(*restores: Restore) -> Restore:
    def restore() -> None:
        for undo in reversed(restores):
            undo()
    return restore


def unwrap_flushes(effects: list) -> list:
    """The effects with every AfterFlush replaced by what it guards: nothing waits for the disk."""
    from actors.effects import AfterFlush

    out: list = []
    for effect in effects:
        if type(effect) is AfterFlush:
            out += unwrap_flushes(list(effect.effects))
        else:
            out.append(effect)
    return out


def _patches() -> dict[str, Callable[[], Restore]]:
    from chaos import sim_variants_groups, sim_variants_log

    return {**sim_variants_log.PATCHES, **sim_variants_groups.PATCHES}


VARIANTS = (
    # replication and elections
    "ack-before-replication", "elect-outside-isr", "elect-last-reporter", "trust-damaged-replicas",
    "commit-below-min-insync", "retry-answered-at-once", "fetch-before-flush", "restart-keeps-isr-seat",
    "late-exit-notice-kills", "follower-trusts-leader-watermark", "agent-takes-any-report",
    "serve-past-high-watermark",
    # producer state
    "follower-forgets-producers", "retry-renumbered", "producer-window-counts-in-flight",
    "unknown-producer-any-sequence", "producer-keeps-numbers-past-a-gap",
    # groups, members, assignors
    "stale-generation-commit", "commit-before-durable", "eager-rejoin-without-revoke",
    "rejoin-before-revocations-answered", "commit-fetched-position", "cooperative-moves-held-partition",
    # share groups
    "share-reply-before-durable", "share-answer-after-expiry", "share-count-not-restored",
    "share-release-delay-ignored", "share-start-passes-locked", "dead-letter-written-twice",
    "share-accepts-not-restored", "share-one-delivery-too-many",
)


@contextlib.contextmanager
def broken(variant: str) -> Iterator[None]:
    patches = _patches()
    if variant not in VARIANTS or variant not in patches:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    restore = patches[variant]()
    try:
        yield
    finally:
        restore()
