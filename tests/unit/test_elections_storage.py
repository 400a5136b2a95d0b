"""Elections that know what replicas lost (actors/elections.py, rules 1, 2 and 4).

Every story starts like tests/unit/test_elections.py's: replicas [1, 2, 3], node 1 leading an ISR
of all three with known incarnations. Then disks are damaged, or the whole cluster restarts, and
the decision must depend on evidence — who lost data, who holds the most — never on which
replica happened to report first.
"""

from __future__ import annotations

import itertools

import pytest

from actors.elections import PartitionRecord, ReplicaView, check_alter_isr, reconcile
from actors.errors import ErrorCode

REPLICAS = [1, 2, 3]
INCARNATIONS = {1: 11, 2: 22, 3: 33}


def record(**changes) -> PartitionRecord:
    fields = dict(leader=1, leader_epoch=4, partition_epoch=9, leader_incarnation=11, isr=[1, 2, 3],
                  isr_incarnations=dict(INCARNATIONS))
    fields.update(changes)
    return PartitionRecord(**fields)


def view(node: int, *, restarted: bool = False, end: int = 100, **fields) -> ReplicaView:
    incarnation = INCARNATIONS[node] + 1000 if restarted else INCARNATIONS[node]
    return ReplicaView(True, incarnation, end, **fields)


def decide(current: PartitionRecord, views: dict, *, unclean: bool = False):
    return reconcile(current, list(REPLICAS), views, unclean_allowed=unclean)


def presumed(node: int) -> ReplicaView:
    """Not heard from since the coordinator started; presumed alive during its grace."""
    return ReplicaView(True, INCARNATIONS[node], 0, reported=False)


# ---------------------------------------------------------------------------- damaged replicas


def test_a_follower_reporting_damage_leaves_the_isr_at_once():
    decision = decide(record(), {1: view(1), 2: view(2, damaged=True), 3: view(3)})

    assert decision.record.isr == [1, 3]
    assert decision.record.leader == 1


def test_a_leader_reporting_damage_steps_down_for_a_healthy_isr_member():
    decision = decide(record(), {1: view(1, damaged=True), 2: view(2), 3: view(3)})

    assert decision.record.leader == 2
    assert 1 not in decision.record.isr
    assert decision.record.leader_epoch == 5


def test_a_damaged_last_isr_member_stays_in_the_isr_but_the_partition_goes_offline_and_says_why():
    decision = decide(record(isr=[1], isr_incarnations={1: 11}), {1: view(1, damaged=True), 2: view(2), 3: view(3)})

    assert decision.record.isr == [1], "the ISR never becomes empty"
    assert decision.record.leader == -1
    assert "lost or damaged data" in decision.record.offline_reason
    events = dict(decision.events)
    assert "lost or damaged data" in events["partition-offline"]["reason"]


def test_with_unclean_election_a_damaged_last_member_gives_way_to_a_lossless_replica():
    decision = decide(record(isr=[1], isr_incarnations={1: 11}),
                      {1: view(1, damaged=True, end=500), 2: view(2, end=90), 3: view(3, end=80)}, unclean=True)

    assert decision.record.leader == 2
    assert decision.record.isr == [2]
    assert decision.record.last_unclean_epoch == decision.record.leader_epoch


def test_an_empty_directory_where_an_earlier_process_held_data_is_a_loss():
    wiped = ReplicaView(True, 22 + 1000, 0, new_directory=True)

    decision = decide(record(), {1: view(1), 2: wiped, 3: view(3)})

    assert decision.record.isr == [1, 3]


def test_the_first_process_of_a_brand_new_replica_reporting_an_empty_directory_loses_nothing():
    new_partition = record(leader_epoch=0, partition_epoch=0, leader_incarnation=0,
                           isr_incarnations={1: 0, 2: 0, 3: 0})
    views = {node: ReplicaView(True, INCARNATIONS[node], 0, new_directory=True) for node in REPLICAS}

    decision = decide(new_partition, views)

    assert decision.record.isr == [1, 2, 3]
    assert decision.record.isr_incarnations == INCARNATIONS
    again = decide(decision.record, views)
    assert again is None, "the same process still reporting its empty directory is not a new loss"


def test_a_damaged_replica_cannot_rejoin_the_isr_until_it_has_repaired():
    views = {1: view(1), 2: view(2), 3: view(3, damaged=True)}

    outcome = check_alter_isr(record(isr=[1, 2], isr_incarnations={1: 11, 2: 22}), REPLICAS, 1, 4, 9, [1, 2, 3],
                              [11, 22, 33], views)

    assert isinstance(outcome, tuple) and outcome[0] == ErrorCode.INVALID_REQUEST
    assert "repaired" in outcome[1]


# ---------------------------------------------------------------------------- clean restarts


def test_a_member_that_restarted_from_a_clean_shutdown_stays_in_the_isr():
    decision = decide(record(), {1: view(1), 2: view(2, restarted=True, clean=True), 3: view(3)})

    assert decision.record.isr == [1, 2, 3]
    assert decision.record.isr_incarnations[2] == 22 + 1000
    # The leader fences the earlier process by the recorded one (tests/unit/test_replica_zombies.py):
    # the state naming the new process must be newer than any naming the old.
    assert (decision.record.leader_epoch, decision.record.partition_epoch) == (4, 10)


def test_a_member_that_restarted_uncleanly_still_leaves_the_isr():
    decision = decide(record(), {1: view(1), 2: view(2, restarted=True), 3: view(3)})

    assert decision.record.isr == [1, 3]


def test_a_leader_restarted_cleanly_keeps_the_isr_but_leadership_gets_a_new_epoch():
    decision = decide(record(), {1: view(1, restarted=True, clean=True, end=100, last_epoch=4),
                                 2: view(2, end=100, last_epoch=4), 3: view(3, end=100, last_epoch=4)})

    assert decision.record.leader == 2, "a current member in replica order leads"
    assert decision.record.isr == [1, 2, 3]
    assert decision.record.leader_epoch == 5


# ---------------------------------------------------------------------------- a whole-cluster restart


def full_restart(ends: dict[int, int], epochs: dict[int, int] | None = None, damaged=(), clean=True,
                 high_watermarks: dict[int, int] | None = None) -> dict[int, ReplicaView]:
    epochs = epochs or {node: 4 for node in REPLICAS}
    high_watermarks = high_watermarks or {}
    return {node: view(node, restarted=True, clean=clean, end=ends[node], last_epoch=epochs[node],
                       damaged=node in damaged, high_watermark=high_watermarks.get(node, 0))
            for node in REPLICAS}


@pytest.mark.parametrize("order", list(itertools.permutations(REPLICAS)), ids=lambda order: "".join(map(str, order)))
def test_after_a_full_restart_the_choice_does_not_depend_on_who_reports_first(order):
    """Node 1 lost its tail; nodes 2 and 3 kept everything. Replicas report one at a time, in
    every order: the damaged one never leads, and the healthy one with the longest log does."""
    final = full_restart({1: 60, 2: 100, 3: 98}, damaged=[1], clean=False)
    current = record()
    reported: dict[int, ReplicaView] = {node: presumed(node) for node in REPLICAS}
    for node in order:
        reported[node] = final[node]
        decision = decide(current, dict(reported))
        if decision is not None:
            current = decision.record
            assert current.leader != 1, f"the damaged replica led after {order[:order.index(node) + 1]} reported"
    assert current.leader == 2
    assert 1 not in current.isr


def test_while_isr_members_have_not_reported_nobody_is_elected_and_the_record_says_why():
    views = {1: view(1, restarted=True, end=100), 2: presumed(2), 3: presumed(3)}

    decision = decide(record(), views)

    assert decision.record.leader == -1
    assert decision.record.isr == [1, 2, 3], "nobody is dropped before the others had their say"
    assert "waiting for ISR members [2, 3]" in decision.record.offline_reason


def test_after_an_unclean_full_restart_the_highest_epoch_then_the_longest_log_leads_alone():
    views = full_restart({1: 120, 2: 100, 3: 140}, epochs={1: 5, 2: 5, 3: 4}, clean=False)

    decision = decide(record(), views)

    assert decision.record.leader == 1, "epoch 5 beats a longer log of epoch 4"
    assert decision.record.isr == [1]


def test_a_replica_whose_log_ends_below_the_known_high_watermark_is_not_chosen_while_one_holds_it():
    views = full_restart({1: 80, 2: 100, 3: 90}, epochs={1: 6, 2: 5, 3: 5}, clean=False,
                         high_watermarks={2: 95})

    decision = decide(record(), views)

    assert decision.record.leader == 2, "node 1's later epoch does not outweigh a log missing committed offsets"


def test_after_a_clean_full_restart_every_member_stays_and_the_best_leads():
    views = full_restart({1: 100, 2: 100, 3: 100}, epochs={1: 4, 2: 4, 3: 4})

    decision = decide(record(), views)

    assert decision.record.isr == [1, 2, 3]
    assert decision.record.leader == 1


def test_a_clean_restart_from_an_older_copy_of_the_directory_does_not_keep_a_member_in_the_isr():
    """Node 1's directory was put back from an older copy, taken after an earlier clean shutdown:
    its checkpoints agree with its shorter log, so nothing in it looks damaged. But nodes 2 and 3
    saw offset 100 committed, which every ISR member must hold; kept in the ISR, node 1 would lead
    (first in replica order) once node 2 dies, and the followers would cut what it lacks."""
    views = full_restart({1: 50, 2: 100, 3: 100}, epochs={1: 3, 2: 4, 3: 4},
                         high_watermarks={1: 40, 2: 100, 3: 100})

    decision = decide(record(), views)

    assert 1 not in decision.record.isr and decision.record.leader in (2, 3)
    leader = decision.record.leader
    after = decide(decision.record, {**views, leader: views[leader]._replace(live=False)})
    assert after is None or after.record.leader != 1, "a replica lacking committed offsets was elected"


def test_a_clean_restart_behind_what_an_isr_member_saw_committed_counts_unless_an_unclean_election_reset_it():
    """After an unclean election the surviving checkpoints may name offsets nobody holds any more:
    there the shorter log is the history, and the member stays."""
    views = full_restart({1: 100, 2: 100, 3: 80}, high_watermarks={1: 100, 2: 100, 3: 80})
    assert 3 not in decide(record(), views).record.isr
    decision = decide(record(last_unclean_epoch=2), views)
    assert decision.record.isr == [1, 2, 3]


def test_after_a_full_restart_where_everyone_lost_data_the_partition_stays_offline():
    views = full_restart({1: 10, 2: 20, 3: 30}, damaged=[1, 2, 3], clean=False)

    decision = decide(record(), views)

    assert decision.record.leader == -1
    assert len(decision.record.isr) == 1
    assert "lost or damaged data" in decision.record.offline_reason


# ---------------------------------------------------------------------------- a rebuilt state


def test_a_rebuilt_state_waits_for_every_replica_and_elects_on_evidence():
    rebuilt = PartitionRecord(leader=-1, leader_epoch=8, partition_epoch=8, isr=[1, 2, 3],
                              isr_incarnations={1: 0, 2: 0, 3: 0}, unknown_history=True)
    first = {1: ReplicaView(True, 11, 40, last_epoch=7), 2: presumed(2), 3: presumed(3)}

    assert decide(rebuilt, first) is None or decide(rebuilt, first).record.leader == -1

    everyone = {1: ReplicaView(True, 11, 40, last_epoch=7), 2: ReplicaView(True, 22, 90, last_epoch=7),
                3: ReplicaView(True, 33, 90, last_epoch=6)}
    decision = decide(rebuilt, everyone)
    assert decision.record.leader == 2
    assert decision.record.leader_epoch == 9
    assert not decision.record.unknown_history
