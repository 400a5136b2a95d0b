"""Leader election and ISR rules (actors/elections.py), one rule per story.

Every story starts from a partition with replicas [1, 2, 3] in preference order and node 1 leading
an ISR of all three, each with a known incarnation; then something happens to the replicas and
`reconcile` (or `check_alter_isr`) says what the coordinator must store.
"""

from __future__ import annotations

import pytest

from actors.elections import PartitionRecord, ReplicaView, check_alter_isr, reconcile
from actors.errors import ErrorCode

REPLICAS = [1, 2, 3]
INCARNATIONS = {1: 11, 2: 22, 3: 33}


def healthy_record(**changes) -> PartitionRecord:
    fields = dict(leader=1, leader_epoch=4, partition_epoch=9, leader_incarnation=11, isr=[1, 2, 3],
                  isr_incarnations=dict(INCARNATIONS))
    fields.update(changes)
    return PartitionRecord(**fields)


def views(dead=(), restarted=(), ends=None, missing=()) -> dict[int, ReplicaView]:
    """Every replica live at its known incarnation with log end 100, except as told."""
    ends = ends or {}
    found = {}
    for node in REPLICAS:
        if node in missing:
            continue
        incarnation = INCARNATIONS[node] + 1000 if node in restarted else INCARNATIONS[node]
        found[node] = ReplicaView(node not in dead, incarnation, ends.get(node, 100))
    return found


def decide(record, replica_views, *, unclean=False, replicas=REPLICAS):
    return reconcile(record, list(replicas), replica_views, unclean_allowed=unclean)


# ---------------------------------------------------------------------------- nothing to do


def test_a_healthy_partition_needs_no_decision():
    assert decide(healthy_record(), views()) is None


# ---------------------------------------------------------------------------- rule 1: who leaves the ISR


def test_a_dead_follower_leaves_the_isr_and_only_the_partition_epoch_bumps():
    decision = decide(healthy_record(), views(dead=[3]))

    assert decision.record.isr == [1, 2]
    assert decision.record.leader == 1
    assert decision.record.leader_epoch == 4
    assert decision.record.partition_epoch == 10
    assert 3 not in decision.record.isr_incarnations
    assert ("isr-changed", {"isr": [1, 2], "previous_isr": [1, 2, 3]}) in decision.events


def test_a_follower_never_heard_from_counts_as_dead():
    decision = decide(healthy_record(), views(missing=[2]))

    assert decision.record.isr == [1, 3]


def test_a_restarted_follower_leaves_the_isr_even_though_it_is_alive():
    decision = decide(healthy_record(), views(restarted=[2]))

    assert decision.record.isr == [1, 3]
    assert decision.record.leader == 1
    assert decision.record.leader_epoch == 4


def test_a_member_whose_incarnation_was_not_yet_seen_adopts_the_first_one_reported():
    record = healthy_record(isr_incarnations={1: 11, 2: 22, 3: 0})

    decision = decide(record, views(restarted=[3]))

    assert decision.record.isr == [1, 2, 3]
    assert decision.record.isr_incarnations[3] == 33 + 1000
    assert decision.record.partition_epoch == 9  # nothing a replica acts on changed


def test_the_last_isr_member_stays_even_when_dead():
    record = healthy_record(isr=[1], isr_incarnations={1: 11})

    decision = decide(record, views(dead=[1]))

    assert decision.record.isr == [1]
    assert decision.record.leader == -1


def test_when_every_member_must_go_the_live_one_with_the_longest_log_survives():
    decision = decide(healthy_record(), views(restarted=[1, 2, 3], ends={1: 50, 2: 90, 3: 70}))

    assert decision.record.isr == [2]
    assert decision.record.isr_incarnations == {2: 22 + 1000}
    assert decision.record.leader == 2


def test_when_every_member_is_dead_the_old_leader_is_kept_as_the_isr():
    decision = decide(healthy_record(leader=2, leader_incarnation=22), views(dead=[1, 2, 3]))

    assert decision.record.isr == [2]
    assert decision.record.leader == -1


# ---------------------------------------------------------------------------- rule 2: who leads


def test_a_dead_leader_is_replaced_by_the_first_live_isr_member_in_replica_order():
    decision = decide(healthy_record(), views(dead=[1]), replicas=[1, 3, 2])

    assert decision.record.leader == 3
    assert decision.record.leader_incarnation == 33
    assert decision.record.isr == [2, 3]


def test_a_restarted_leader_loses_leadership_to_the_next_isr_member():
    decision = decide(healthy_record(), views(restarted=[1]))

    assert decision.record.leader == 2
    assert decision.record.isr == [2, 3]
    assert decision.record.leader_epoch == 5


def test_a_live_replica_outside_the_isr_is_never_elected_cleanly():
    record = healthy_record(isr=[1, 2], isr_incarnations={1: 11, 2: 22})

    decision = decide(record, views(dead=[1, 2], ends={3: 500}))

    assert decision.record.leader == -1
    assert 3 not in decision.record.isr


def test_a_restarted_last_member_leads_again_as_a_new_incarnation_with_a_new_epoch():
    record = healthy_record(isr=[1], isr_incarnations={1: 11})

    decision = decide(record, views(restarted=[1]))

    assert decision.record.leader == 1
    assert decision.record.leader_incarnation == 11 + 1000
    assert decision.record.leader_epoch == 5
    assert decision.record.partition_epoch == 10


# ---------------------------------------------------------------------------- rule 3: offline or unclean


def test_with_nobody_eligible_the_partition_goes_offline_and_says_so():
    record = healthy_record(isr=[1], isr_incarnations={1: 11})

    decision = decide(record, views(dead=[1]))

    assert decision.record.leader == -1
    assert decision.record.leader_epoch == 5
    events = dict(decision.events)
    assert events["partition-offline"]["previous_leader"] == 1
    assert "unclean-election" not in events


# ---------------------------------------------------------------------------- eligible leader replicas (KIP-966)


def elr_record() -> PartitionRecord:
    """Node 1 leads alone: nodes 2 and 3 left the ISR while it was below min_insync_replicas
    (2), so both hold every acknowledged write and wait in the ELR with their incarnations."""
    return healthy_record(isr=[1], isr_incarnations={1: 11}, elr={2: 22, 3: 33})


def test_an_elr_member_at_the_incarnation_it_left_with_leads_when_the_isr_cannot():
    decision = reconcile(elr_record(), REPLICAS, views(dead=[1]), unclean_allowed=False, min_insync=2)

    assert decision.record.leader == 2 and decision.record.leader_incarnation == 22


def test_an_elr_member_that_restarted_cleanly_still_may_lead():
    found = views(dead=[1, 2], restarted=[3])
    found[3] = found[3]._replace(clean=True)

    decision = reconcile(elr_record(), REPLICAS, found, unclean_allowed=False, min_insync=2)

    assert decision.record.leader == 3 and decision.record.leader_incarnation == 33 + 1000


def test_an_elr_member_that_restarted_uncleanly_leaves_the_elr_and_never_leads():
    """The simulator's seed 1415: the coordinator, cut off from the replicas for 2.5 s, shrank an
    ISR to its leader; a follower left for the ELR, then crashed in a flush and came back without
    its unflushed tail (304 of 323 committed offsets) and reported first. Elected because it had
    lost nothing it had flushed, it made the leader and the other follower (which held all 323)
    truncate: 25 acknowledged writes gone. An unclean restart may have lost what it held
    unflushed, so it leaves the ELR (KIP-966) and the partition waits for a replica that holds
    everything."""
    found = views(dead=[1, 2], restarted=[3], ends={3: 304})

    decision = reconcile(elr_record(), REPLICAS, found, unclean_allowed=False, min_insync=2)

    assert decision.record.leader == -1, "an uncleanly restarted ELR member was elected"
    assert 3 not in decision.record.elr and decision.record.elr == {2: 22}
    assert decision.record.isr == [1]


def test_an_isr_member_that_restarts_uncleanly_does_not_join_the_elr():
    record = healthy_record(isr=[1, 3], isr_incarnations={1: 11, 3: 33})

    decision = reconcile(record, REPLICAS, views(restarted=[3]), unclean_allowed=False, min_insync=2)

    assert decision.record.isr == [1] and decision.record.elr == {}


def test_an_unclean_election_picks_the_live_replica_with_the_longest_log_and_says_so():
    record = healthy_record(isr=[1], isr_incarnations={1: 11})

    decision = decide(record, views(dead=[1], ends={2: 40, 3: 80}), unclean=True)

    assert decision.record.leader == 3
    assert decision.record.isr == [3]
    assert decision.record.isr_incarnations == {3: 33}
    assert decision.record.leader_incarnation == 33
    events = dict(decision.events)
    assert events["unclean-election"] == {"leader": 3, "isr_before": [1]}
    assert events["leader-elected"]["leader_epoch"] == 5


def test_an_unclean_tie_goes_to_the_earlier_replica_in_preference_order():
    record = healthy_record(isr=[1], isr_incarnations={1: 11})

    decision = decide(record, views(dead=[1], ends={2: 80, 3: 80}), unclean=True, replicas=[1, 3, 2])

    assert decision.record.leader == 3


def test_unclean_election_is_not_used_while_a_clean_choice_exists():
    decision = decide(healthy_record(), views(dead=[1], ends={2: 10, 3: 90}), unclean=True)

    assert decision.record.leader == 2
    assert "unclean-election" not in dict(decision.events)


def test_unclean_election_with_nobody_alive_stays_offline():
    record = healthy_record(isr=[1], isr_incarnations={1: 11})

    decision = decide(record, views(dead=[1, 2, 3]), unclean=True)

    assert decision.record.leader == -1
    assert decision.record.isr == [1]


# ---------------------------------------------------------------------------- rule 4: epochs


def test_a_new_partition_adopts_its_first_leaders_incarnation_without_a_new_epoch():
    record = PartitionRecord(leader=1, isr=[1, 2, 3], isr_incarnations={})

    decision = decide(record, views())

    assert decision.record.leader == 1
    assert decision.record.leader_incarnation == 11
    assert decision.record.isr_incarnations == INCARNATIONS
    assert (decision.record.leader_epoch, decision.record.partition_epoch) == (0, 0)
    assert decision.events == []


def test_a_new_partition_whose_first_leader_never_appears_elects_the_next_with_epoch_one():
    record = PartitionRecord(leader=1, isr=[1, 2, 3], isr_incarnations={})

    decision = decide(record, views(missing=[1]))

    assert decision.record.leader == 2
    assert decision.record.leader_epoch == 1
    assert decision.record.partition_epoch == 1


def test_a_leader_change_bumps_both_epochs_once():
    decision = decide(healthy_record(), views(dead=[1]))

    assert (decision.record.leader_epoch, decision.record.partition_epoch) == (5, 10)


def test_a_partition_that_comes_back_online_bumps_the_leader_epoch_again():
    offline = decide(healthy_record(isr=[1], isr_incarnations={1: 11}), views(dead=[1])).record

    back = decide(offline, views()).record

    assert back.leader == 1
    assert back.leader_epoch == offline.leader_epoch + 1
    assert back.partition_epoch == offline.partition_epoch + 1


def test_the_result_is_stable_once_applied():
    decision = decide(healthy_record(), views(dead=[1], restarted=[3]))

    assert decide(decision.record, views(dead=[1], restarted=[3])) is None


# ---------------------------------------------------------------------------- check_alter_isr


def alter(record=None, *, leader=1, leader_epoch=4, partition_epoch=9, isr=(1, 2), incarnations=None,
          replica_views=None):
    record = record or healthy_record()
    return check_alter_isr(record, list(REPLICAS), leader, leader_epoch, partition_epoch, list(isr),
                           list(incarnations or []), replica_views if replica_views is not None else views())


def test_a_current_leader_may_shrink_the_isr_and_the_partition_epoch_bumps():
    result = alter(isr=[1, 2])

    assert isinstance(result, PartitionRecord)
    assert result.isr == [1, 2]
    assert result.isr_incarnations == {1: 11, 2: 22}
    assert (result.leader, result.leader_epoch, result.partition_epoch) == (1, 4, 10)


def test_a_live_caught_up_replica_may_join_with_its_current_incarnation():
    record = healthy_record(isr=[1, 2], isr_incarnations={1: 11, 2: 22})

    result = alter(record, isr=[1, 2, 3], incarnations=[11, 22, 33])

    assert result.isr == [1, 2, 3]
    assert result.isr_incarnations[3] == 33


@pytest.mark.parametrize("leader, leader_epoch", [(1, 3), (2, 4), (1, 5)])
def test_a_request_from_anyone_but_the_current_leader_in_its_epoch_is_fenced(leader, leader_epoch):
    code, text = alter(leader=leader, leader_epoch=leader_epoch)

    assert code == ErrorCode.FENCED_LEADER_EPOCH
    assert "not the current leader" in text


def test_a_stale_partition_epoch_is_refused():
    code, text = alter(partition_epoch=8)

    assert code == ErrorCode.INVALID_REQUEST
    assert "stale partition epoch" in text


@pytest.mark.parametrize("isr", [[2, 3], [1, 1, 2], [1, 4]])
def test_an_isr_must_be_distinct_replicas_that_include_the_leader(isr):
    code, _ = alter(isr=isr)

    assert code == ErrorCode.INVALID_REQUEST


def test_a_dead_replica_cannot_join_the_isr():
    record = healthy_record(isr=[1, 2], isr_incarnations={1: 11, 2: 22})

    code, text = alter(record, isr=[1, 2, 3], replica_views=views(dead=[3]))

    assert code == ErrorCode.INVALID_REQUEST
    assert "not alive" in text


def test_a_joiner_that_restarted_since_the_leader_saw_it_cannot_join():
    record = healthy_record(isr=[1, 2], isr_incarnations={1: 11, 2: 22})

    code, text = alter(record, isr=[1, 2, 3], incarnations=[11, 22, 33], replica_views=views(restarted=[3]))

    assert code == ErrorCode.INVALID_REQUEST
    assert "restarted" in text


def test_the_last_isr_member_back_uncleanly_waits_for_an_elr_member_not_heard_from():
    """The simulator's seed 30951: the ISR had shrunk to its leader (node 3 there), whose follower
    left for the ELR holding every committed offset; the leader crashed, came back without its
    unflushed tail (307 of 317 committed offsets) and was elected again while the ELR member was
    paused. An unclean restart may have lost what was acknowledged, as for an ELR member: the
    partition waits for the ELR member, and it leads once it reports."""
    record = healthy_record(isr=[1], isr_incarnations={1: 11}, elr={2: 22})

    waiting = reconcile(record, REPLICAS, views(dead=[2, 3], restarted=[1], ends={1: 307}),
                        unclean_allowed=False, min_insync=2)

    assert waiting.record.leader == -1, "the uncleanly restarted member was elected over the ELR"
    assert "eligible leader replicas [2]" in waiting.record.offline_reason
    assert waiting.record.elr == {2: 22}

    back = reconcile(waiting.record, REPLICAS, views(dead=[3], restarted=[1], ends={1: 307, 2: 317}),
                     unclean_allowed=False, min_insync=2)

    assert back.record.leader == 2 and back.record.leader_incarnation == 22


def test_the_last_isr_member_back_uncleanly_leads_when_no_elr_member_is_left():
    record = healthy_record(isr=[1], isr_incarnations={1: 11})

    decision = reconcile(record, REPLICAS, views(dead=[2, 3], restarted=[1]), unclean_allowed=False, min_insync=2)

    assert decision.record.leader == 1 and decision.record.leader_incarnation == 11 + 1000


def test_isr_members_dying_in_the_same_decision_are_waited_for_as_elr_members():
    """The simulator's seed 81475: the coordinator heard nodes 2 and 3 of a full ISR go dead (their
    node sessions ended in a split) in the same decision in which it first saw node 1 back from an
    unclean restart, holding 57 of 62 committed offsets, and elected node 1. What stays of the ISR
    is below min_insync, so the dead members leave for the ELR holding everything: they are waited
    for as ELR members already standing are, and one leads when it is heard from."""
    record = healthy_record()

    waiting = reconcile(record, REPLICAS, views(dead=[2, 3], restarted=[1], ends={1: 57, 2: 62, 3: 62}),
                        unclean_allowed=False, min_insync=2)

    assert waiting.record.leader == -1, "the uncleanly restarted member was elected over the dying members"
    assert "eligible leader replicas [2, 3]" in waiting.record.offline_reason
    assert waiting.record.elr == {2: 22, 3: 33}

    back = reconcile(waiting.record, REPLICAS, views(dead=[3], restarted=[1], ends={1: 57, 2: 62}),
                     unclean_allowed=False, min_insync=2)

    assert back.record.leader == 2 and back.record.leader_incarnation == 22


def test_with_min_insync_one_dying_members_leave_no_elr_to_wait_for():
    """With min_insync 1 there is no ELR (an ISR of one acknowledges acks=all writes): the member
    back uncleanly is the best there is, as before."""
    decision = reconcile(healthy_record(), REPLICAS, views(dead=[2, 3], restarted=[1]),
                         unclean_allowed=False, min_insync=1)

    assert decision.record.leader == 1 and decision.record.elr == {}


def test_a_member_back_uncleanly_is_not_elected_while_members_not_heard_since_a_restart_may_hold_more():
    """The simulator's seed 4883 (faults every 150-600 ms): node 2 led, crashed and came back
    uncleanly with 109 of 119 committed offsets; the coordinator decided for nodes 3 and 1 and
    crashed before the decision was durable. The next coordinator read the old record (node 2
    leading an ISR of all three), heard nothing from nodes 3 and 1 within its grace (a split kept
    them away), and elected node 2. Members not heard from since the coordinator started are not
    known to be dead and may hold everything: the partition waits for them, and one leads when it
    reports."""
    record = healthy_record(leader=2, leader_incarnation=22)
    absent = {node: ReplicaView(False, INCARNATIONS[node], 0, reported=False) for node in (1, 3)}
    back = {2: ReplicaView(True, 22 + 1000, 109)}

    waiting = reconcile(record, REPLICAS, {**absent, **back}, unclean_allowed=False, min_insync=2)

    assert waiting.record.leader == -1, "the uncleanly restarted member was elected over members not heard from"
    assert "[1, 3]" in waiting.record.offline_reason
    assert sorted(waiting.record.isr) == [1, 3]

    heard = reconcile(waiting.record, REPLICAS, {**back, 1: ReplicaView(True, 11, 119), 3: ReplicaView(True, 33, 119)},
                      unclean_allowed=False, min_insync=2)

    assert heard.record.leader in (1, 3) and 2 not in heard.record.isr
