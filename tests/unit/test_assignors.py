"""Consumer-group assignors: Kafka's worked examples, then properties over random groups."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from actors.assignors import (
    ASSIGNORS,
    COOPERATIVE_ASSIGNORS,
    BrokenAssignment,
    InvalidPartitionCount,
    Subscription,
    UnknownAssignor,
    assign,
    check_assignment,
    cooperative_adjust,
    owned_partitions,
)

TOPICS = ["alpha", "beta", "gamma", "delta"]
UNKNOWN_TOPIC = "not-yet-created"


def p(topic: str, *partitions: int) -> list[tuple[str, int]]:
    return [(topic, partition) for partition in partitions]


# -- independent checks (written without the module's helpers) ------------------------------------


def known_topics(subscription: Subscription, partition_counts: dict[str, int]) -> set[str]:
    return {topic for topic in subscription.topics if topic in partition_counts}


def assert_valid(assignment, subscriptions, partition_counts) -> None:
    assert set(assignment) == set(subscriptions)
    owners: dict[tuple[str, int], list[str]] = {}
    for member, partitions in assignment.items():
        assert partitions == sorted(partitions)
        for topic, partition in partitions:
            assert topic in known_topics(subscriptions[member], partition_counts), (member, topic)
            owners.setdefault((topic, partition), []).append(member)
    subscribed = set().union(*(known_topics(s, partition_counts) for s in subscriptions.values()))
    expected = {(topic, n) for topic in subscribed for n in range(partition_counts[topic])}
    assert set(owners) == expected
    assert all(len(members) == 1 for members in owners.values())


def loads(assignment) -> list[int]:
    return [len(partitions) for partitions in assignment.values()]


def owner_of(assignment) -> dict[tuple[str, int], str]:
    return {tp: member for member, partitions in assignment.items() for tp in partitions}


def fewest_moves(held_counts: list[int], partition_total: int) -> int:
    """Partitions that must change owner to reach balance when every member can take every partition.

    Each member can keep up to `quota` of what it holds; `extra` members may keep one more, which
    only helps a member holding more than `quota`. Everything not kept changes owner.
    """
    quota, extra = divmod(partition_total, len(held_counts))
    keepable = sum(min(count, quota) for count in held_counts)
    keepable += min(extra, sum(1 for count in held_counts if count > quota))
    return partition_total - keepable


def moved_count(before: dict[tuple[str, int], str], after: dict[tuple[str, int], str]) -> int:
    return sum(1 for tp, member in after.items() if before.get(tp) != member)


def with_owned(subscriptions, assignment) -> dict[str, Subscription]:
    return {
        member: Subscription(topics=s.topics, owned=assignment.get(member, []))
        for member, s in subscriptions.items()
    }


# -- strategies ------------------------------------------------------------------------------------

member_ids = st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=7, unique=True)
partition_count_maps = st.fixed_dictionaries({topic: st.integers(0, 9) for topic in TOPICS})


@st.composite
def groups(draw, equal_subscriptions: bool = False, claims: str = "random"):
    """(subscriptions, partition_counts). claims: "none", "random" (stale, duplicated, zombie
    claims included) or "exclusive" (each partition held by at most one subscribed member)."""
    partition_counts = draw(partition_count_maps)
    members = draw(member_ids)
    shared = draw(st.lists(st.sampled_from(TOPICS + [UNKNOWN_TOPIC]), min_size=1, unique=True))
    topics_of = {
        member: draw(st.permutations(shared)) if equal_subscriptions
        else draw(st.lists(st.sampled_from(TOPICS + [UNKNOWN_TOPIC]), max_size=5, unique=True))
        for member in members
    }
    every_partition = [(topic, n) for topic in TOPICS for n in range(partition_counts[topic])]
    owned: dict[str, list[tuple[str, int]]] = {member: [] for member in members}
    if claims == "random":
        for member in members:
            stale = [(UNKNOWN_TOPIC, 0), ("alpha", 50)]
            owned[member] = draw(st.lists(st.sampled_from(every_partition + stale), max_size=12))
    elif claims == "exclusive":
        for tp in every_partition:
            holders = [member for member in members if tp[0] in topics_of[member]]
            holder = draw(st.sampled_from([None] + holders))
            if holder is not None:
                owned[holder].append(tp)
    subscriptions = {
        member: Subscription(topics=list(topics_of[member]), owned=owned[member]) for member in members
    }
    return subscriptions, partition_counts


# -- Kafka's worked examples -----------------------------------------------------------------------


def test_range_splits_each_topic_into_contiguous_ranges() -> None:
    # RangeAssignor javadoc: C0, C1 subscribe to t0 and t1, each with 3 partitions.
    group = {"C0": Subscription(["t0", "t1"]), "C1": Subscription(["t0", "t1"])}
    assert assign("range", group, {"t0": 3, "t1": 3}) == {
        "C0": p("t0", 0, 1) + p("t1", 0, 1),
        "C1": p("t0", 2) + p("t1", 2),
    }


def test_round_robin_deals_all_partitions_in_turn() -> None:
    # RoundRobinAssignor javadoc, equal subscriptions.
    group = {"C0": Subscription(["t0", "t1"]), "C1": Subscription(["t0", "t1"])}
    assert assign("round-robin", group, {"t0": 3, "t1": 3}) == {
        "C0": p("t0", 0, 2) + p("t1", 1),
        "C1": p("t0", 1) + p("t1", 0, 2),
    }


def test_round_robin_passes_over_members_not_subscribed() -> None:
    # RoundRobinAssignor javadoc, unequal subscriptions.
    group = {
        "C0": Subscription(["t0"]),
        "C1": Subscription(["t0", "t1"]),
        "C2": Subscription(["t0", "t1", "t2"]),
    }
    assert assign("round-robin", group, {"t0": 1, "t1": 2, "t2": 3}) == {
        "C0": p("t0", 0),
        "C1": p("t1", 0),
        "C2": p("t1", 1) + p("t2", 0, 1, 2),
    }


def test_cooperative_sticky_balances_unequal_subscriptions() -> None:
    # StickyAssignor javadoc: round-robin gives C2 four partitions and C1 one; sticky gives 1, 2, 3.
    group = {
        "C0": Subscription(["t0"]),
        "C1": Subscription(["t0", "t1"]),
        "C2": Subscription(["t0", "t1", "t2"]),
    }
    assert assign("cooperative-sticky", group, {"t0": 1, "t1": 2, "t2": 3}) == {
        "C0": p("t0", 0),
        "C1": p("t1", 0, 1),
        "C2": p("t2", 0, 1, 2),
    }


def test_cooperative_sticky_keeps_partitions_when_a_member_leaves() -> None:
    # StickyAssignor javadoc: three members, four topics of two partitions, then C1 leaves.
    counts = {"t0": 2, "t1": 2, "t2": 2, "t3": 2}
    topics = list(counts)
    before = {
        "C0": Subscription(topics, owned=p("t0", 0) + p("t1", 1) + p("t3", 0)),
        "C2": Subscription(topics, owned=p("t1", 0) + p("t2", 1)),
    }
    assert assign("cooperative-sticky", before, counts) == {
        "C0": p("t0", 0) + p("t1", 1) + p("t2", 0) + p("t3", 0),
        "C2": p("t0", 1) + p("t1", 0) + p("t2", 1) + p("t3", 1),
    }


def test_cooperative_sticky_moves_only_what_a_joining_member_needs() -> None:
    counts = {"orders": 12}
    group = {member: Subscription(["orders"]) for member in ("m1", "m2", "m3")}
    first = assign("cooperative-sticky", group, counts)
    assert loads(first) == [4, 4, 4]
    joined = with_owned(group, first) | {"m4": Subscription(["orders"])}
    second = assign("cooperative-sticky", joined, counts)
    assert loads(second) == [3, 3, 3, 3]
    assert moved_count(owner_of(first), owner_of(second)) == 3
    assert all(set(second[member]) <= set(first[member]) for member in first)


def test_a_partition_claimed_by_two_members_goes_to_one_of_them() -> None:
    # a and c both claim t-1 (one of them is a zombie from an older generation). Treating t-1 as
    # unowned would hand it to b, the least loaded; it stays with a claimant instead, and the
    # claimant holding fewer of its other partitions wins (a and c tie at one: a by id).
    group = {
        "a": Subscription(["t"], owned=p("t", 0, 1)),
        "b": Subscription(["t"]),
        "c": Subscription(["t"], owned=p("t", 1, 2)),
    }
    assignment = assign("cooperative-sticky", group, {"t": 4})
    assert assignment == {"a": p("t", 0, 1), "b": p("t", 3), "c": p("t", 2)}


def test_unequal_subscriptions_keep_every_held_partition_when_a_fair_spread_allows() -> None:
    # Ten partitions over three members: loads 3, 3, 4 are the fairest the subscriptions allow,
    # and they are reachable without moving any of the six held partitions.
    group = {
        "a": Subscription(["x", "y"], owned=p("x", 2) + p("y", 3)),
        "b": Subscription(["x"], owned=p("x", 0, 1)),
        "c": Subscription(["y"], owned=p("y", 1, 2)),
    }
    assert assign("cooperative-sticky", group, {"x": 4, "y": 6}) == {
        "a": p("x", 2) + p("y", 0, 3),
        "b": p("x", 0, 1, 3),
        "c": p("y", 1, 2, 4, 5),
    }


def test_fairness_comes_before_keeping_a_partition() -> None:
    # Keeping x-0 with b would leave a (subscribed to x only) idle while c holds both y
    # partitions; b gives x-0 up so that everyone holds one.
    group = {
        "a": Subscription(["x"]),
        "b": Subscription(["x", "y"], owned=p("x", 0)),
        "c": Subscription(["x", "y"]),
    }
    assert loads(assign("cooperative-sticky", group, {"x": 1, "y": 2})) == [1, 1, 1]


def test_no_member_is_left_idle_when_a_chain_of_moves_can_feed_it() -> None:
    # Dealing x-0 to b and both y partitions to a passes Kafka's one-move balance check (no single
    # partition can move to someone holding two fewer), yet c sits idle. Handing x-0 to c and one
    # y to b, a chain of two moves, gives everyone one.
    group = {"a": Subscription(["y"]), "b": Subscription(["x", "y"]), "c": Subscription(["x"])}
    assert assign("cooperative-sticky", group, {"x": 1, "y": 2}) == {
        "a": p("y", 0),
        "b": p("y", 1),
        "c": p("x", 0),
    }


def test_among_equally_fair_spreads_the_one_keeping_most_wins() -> None:
    # Loads 2, 1, 1 are the fairest. c keeps x-0 only if b takes y-0 and a takes both z
    # partitions; a greedy deal would hand x-0 to b and revoke it from c.
    group = {
        "a": Subscription(["x", "y", "z"]),
        "b": Subscription(["x", "y"]),
        "c": Subscription(["x", "z"], owned=p("x", 0)),
    }
    assert assign("cooperative-sticky", group, {"x": 1, "y": 1, "z": 2}) == {
        "a": p("z", 0, 1),
        "b": p("y", 0),
        "c": p("x", 0),
    }


def test_new_partitions_spread_over_the_group() -> None:
    members = ("m1", "m2", "m3", "m4")
    held = {member: p("clicks", number) for number, member in enumerate(members)}
    grown = {member: Subscription(["clicks", "views"], owned=held[member]) for member in members}
    assignment = assign("cooperative-sticky", grown, {"clicks": 8, "views": 4})
    for member in members:
        assert held[member][0] in assignment[member]
        assert len([tp for tp in assignment[member] if tp[0] == "views"]) == 1
        assert len([tp for tp in assignment[member] if tp[0] == "clicks"]) == 2


def test_claims_on_unsubscribed_or_missing_partitions_are_dropped() -> None:
    group = {"a": Subscription(["t"], owned=p("gone", 0) + p("t", 7)), "b": Subscription(["t", "u"])}
    assignment = assign("cooperative-sticky", group, {"t": 2, "u": 0, "gone": 1})
    assert_valid(assignment, group, {"t": 2, "u": 0, "gone": 1})
    assert sorted(loads(assignment)) == [1, 1]


# -- properties over random groups -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@given(group=groups())
def test_every_partition_has_exactly_one_subscribed_owner(name: str, group) -> None:
    subscriptions, partition_counts = group
    assert_valid(assign(name, subscriptions, partition_counts), subscriptions, partition_counts)


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@given(group=groups(), data=st.data())
def test_same_group_in_any_order_gives_the_same_assignment(name: str, group, data) -> None:
    subscriptions, partition_counts = group
    shuffled = {
        member: Subscription(
            topics=data.draw(st.permutations(subscriptions[member].topics)),
            owned=data.draw(st.permutations(subscriptions[member].owned)),
        )
        for member in data.draw(st.permutations(list(subscriptions)))
    }
    topic_order = data.draw(st.permutations(list(partition_counts)))
    counts_shuffled = {topic: partition_counts[topic] for topic in topic_order}
    assert assign(name, shuffled, counts_shuffled) == assign(name, subscriptions, partition_counts)


@pytest.mark.parametrize("name", ["round-robin", "cooperative-sticky"])
@given(group=groups(equal_subscriptions=True))
def test_equal_subscriptions_are_balanced_within_one(name: str, group) -> None:
    subscriptions, partition_counts = group
    assignment = assign(name, subscriptions, partition_counts)
    assert max(loads(assignment)) - min(loads(assignment)) <= 1


@given(group=groups(claims="none"))
def test_range_gives_each_subscriber_a_contiguous_near_equal_share_of_each_topic(group) -> None:
    subscriptions, partition_counts = group
    assignment = assign("range", subscriptions, partition_counts)
    for topic, count in partition_counts.items():
        members = sorted(m for m, s in subscriptions.items() if topic in s.topics)
        shares = [[n for t, n in assignment[member] if t == topic] for member in members]
        assert [n for share in shares for n in share] == list(range(count if members else 0))
        sizes = [len(share) for share in shares]
        assert sizes == sorted(sizes, reverse=True)
        assert not sizes or max(sizes) - min(sizes) <= 1


@given(group=groups())
def test_cooperative_sticky_leaves_no_partition_that_should_move(group) -> None:
    # Kafka's balance condition for unequal subscriptions: no partition could go to another
    # subscriber of its topic that holds two or more fewer than its owner.
    subscriptions, partition_counts = group
    assignment = assign("cooperative-sticky", subscriptions, partition_counts)
    for owner, partitions in assignment.items():
        for topic, _ in partitions:
            for other, subscription in subscriptions.items():
                if topic in subscription.topics:
                    assert len(partitions) <= len(assignment[other]) + 1, (owner, other, topic)


@given(group=groups(equal_subscriptions=True, claims="exclusive"))
def test_cooperative_sticky_keeps_as_many_partitions_in_place_as_balance_allows(group) -> None:
    subscriptions, partition_counts = group
    before = owner_of(owned_partitions(subscriptions))
    after = owner_of(assign("cooperative-sticky", subscriptions, partition_counts))
    held_counts = [len(owned_partitions(subscriptions)[member]) for member in sorted(subscriptions)]
    assert moved_count(before, after) == fewest_moves(held_counts, len(after))


@given(group=groups(equal_subscriptions=True, claims="none"), joining=st.booleans(), data=st.data())
def test_a_join_or_leave_moves_only_the_minimum(group, joining: bool, data) -> None:
    subscriptions, partition_counts = group
    first = assign("cooperative-sticky", subscriptions, partition_counts)
    settled = with_owned(subscriptions, first)
    if joining:
        newcomer = data.draw(st.text("xyz", min_size=1, max_size=3).filter(lambda m: m not in settled))
        changed = settled | {newcomer: Subscription(topics=next(iter(settled.values())).topics)}
    else:
        assume(len(settled) > 1)
        leaver = data.draw(st.sampled_from(sorted(settled)))
        changed = {member: s for member, s in settled.items() if member != leaver}
    second = assign("cooperative-sticky", changed, partition_counts)
    held_counts = [len(first.get(member, [])) for member in sorted(changed)]
    minimum = fewest_moves(held_counts, len(owner_of(second)))
    assert moved_count(owner_of(first), owner_of(second)) == minimum
    assert max(loads(second)) - min(loads(second)) <= 1


@st.composite
def small_groups(draw):
    """Groups small enough to try every possible assignment: up to 3 members, 7 partitions."""
    partition_counts = {"x": draw(st.integers(0, 3)), "y": draw(st.integers(0, 2))}
    partition_counts["z"] = draw(st.integers(0, 2))
    members = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True))
    topic_lists = st.lists(st.sampled_from(["x", "y", "z"]), unique=True)
    topics_of = {member: draw(topic_lists) for member in members}
    owned: dict[str, list[tuple[str, int]]] = {member: [] for member in members}
    for topic, count in partition_counts.items():
        for n in range(count):
            holder = draw(st.sampled_from([None] + [m for m in members if topic in topics_of[m]]))
            if holder is not None:
                owned[holder].append((topic, n))
    return {m: Subscription(topics=topics_of[m], owned=owned[m]) for m in members}, partition_counts


def fairest_then_stickiest(subscriptions, partition_counts) -> tuple[int, int]:
    """By trying every assignment: the least sum of squared loads, then the most partitions kept."""
    members = sorted(subscriptions)
    partitions = [
        (topic, n) for topic, count in sorted(partition_counts.items()) for n in range(count)
        if any(topic in s.topics for s in subscriptions.values())
    ]
    scores = []
    for owners in itertools.product(members, repeat=len(partitions)):
        if any(tp[0] not in subscriptions[owner].topics for tp, owner in zip(partitions, owners)):
            continue
        squares = sum(owners.count(member) ** 2 for member in members)
        kept = sum(1 for tp, owner in zip(partitions, owners) if tp in subscriptions[owner].owned)
        scores.append((squares, -kept))
    squares, negative_kept = min(scores)
    return squares, -negative_kept


@given(group=small_groups())
@settings(max_examples=60)
def test_cooperative_sticky_is_the_fairest_then_the_stickiest_assignment(group) -> None:
    subscriptions, partition_counts = group
    assignment = assign("cooperative-sticky", subscriptions, partition_counts)
    squares = sum(len(partitions) ** 2 for partitions in assignment.values())
    kept = sum(len(set(assignment[m]) & set(s.owned)) for m, s in subscriptions.items())
    assert (squares, kept) == fairest_then_stickiest(subscriptions, partition_counts)


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@given(group=groups())
def test_rerunning_on_its_own_output_moves_nothing(name: str, group) -> None:
    subscriptions, partition_counts = group
    first = assign(name, subscriptions, partition_counts)
    assert assign(name, with_owned(subscriptions, first), partition_counts) == first


# -- the two-round cooperative protocol (KIP-429) --------------------------------------------------


def test_a_moving_partition_is_revoked_first_and_handed_over_next_round() -> None:
    owned = {"a": p("t", 0, 1, 2), "b": []}
    target = {"a": p("t", 0, 1), "b": p("t", 2)}
    first = cooperative_adjust(target, owned)
    assert first.assignment == {"a": p("t", 0, 1), "b": []}
    assert first.revocations == {"a": p("t", 2), "b": []}
    assert first.withheld == p("t", 2)
    assert first.follow_up_needed
    second = cooperative_adjust(target, first.assignment)
    assert second.assignment == target
    assert second.revocations == {"a": [], "b": []}
    assert not second.follow_up_needed


def test_an_unheld_partition_goes_straight_to_its_target_owner() -> None:
    plan = cooperative_adjust({"a": p("t", 0), "b": p("t", 1)}, {"a": p("t", 0)})
    assert plan.assignment == {"a": p("t", 0), "b": p("t", 1)}
    assert not plan.follow_up_needed


def test_a_double_claimed_partition_stays_with_the_claimant_the_target_names() -> None:
    plan = cooperative_adjust({"a": p("t", 0), "b": []}, {"a": p("t", 0), "b": p("t", 0)})
    assert plan.assignment == {"a": p("t", 0), "b": []}
    assert plan.revocations == {"a": [], "b": p("t", 0)}


def test_a_departed_holder_blocks_handover_until_it_revokes() -> None:
    plan = cooperative_adjust({"a": p("t", 0)}, {"ghost": p("t", 0)})
    assert plan.assignment == {"a": []}
    assert plan.revocations == {"a": [], "ghost": p("t", 0)}


def test_a_target_naming_two_owners_is_a_programmer_error() -> None:
    with pytest.raises(BrokenAssignment):
        cooperative_adjust({"a": p("t", 0), "b": p("t", 0)}, {})


@given(group=groups(claims="exclusive"))
@settings(max_examples=150)
def test_cooperative_rounds_never_share_a_partition_and_converge_in_two(group) -> None:
    subscriptions, partition_counts = group
    owned = owned_partitions(subscriptions)
    target = assign("cooperative-sticky", subscriptions, partition_counts)
    first = cooperative_adjust(target, owned)
    holders = owner_of(owned)
    for member, partitions in first.assignment.items():
        assert set(partitions) <= set(target[member])
        assert all(holders.get(tp, member) == member for tp in partitions)
        assert set(first.revocations[member]) == set(owned[member]) - set(target[member])
    assert sorted(set(owner_of(target)) - set(owner_of(first.assignment))) == first.withheld
    # The follow-up rebalance runs the assignor again on what members now hold: nobody revokes.
    rejoined = with_owned(subscriptions, first.assignment)
    second = cooperative_adjust(assign("cooperative-sticky", rejoined, partition_counts), first.assignment)
    assert not second.follow_up_needed
    assert all(revoked == [] for revoked in second.revocations.values())


# -- registry, errors, wire form -------------------------------------------------------------------


def test_an_unknown_assignor_is_a_typed_error() -> None:
    with pytest.raises(UnknownAssignor) as raised:
        assign("sticky-ish", {"a": Subscription(["t"])}, {"t": 1})
    assert raised.value.name == "sticky-ish"
    assert "cooperative-sticky" in str(raised.value)


def test_a_negative_partition_count_is_a_typed_error() -> None:
    for name in ASSIGNORS:
        with pytest.raises(InvalidPartitionCount):
            assign(name, {"a": Subscription(["t"])}, {"t": -1})


def test_only_cooperative_sticky_is_cooperative() -> None:
    assert COOPERATIVE_ASSIGNORS == {"cooperative-sticky"}
    assert COOPERATIVE_ASSIGNORS <= set(ASSIGNORS)


def test_an_empty_group_gets_an_empty_assignment() -> None:
    for name in ASSIGNORS:
        assert assign(name, {}, {"t": 3}) == {}


@pytest.mark.parametrize(
    "assignment",
    [
        {"a": p("t", 0)},  # a member missing
        {"a": p("t", 0, 1), "b": p("t", 1)},  # two owners
        {"a": p("t", 0), "b": p("u", 0)},  # t-1 has no owner, b is not subscribed to u
        {"a": p("t", 0, 1, 5), "b": []},  # partition out of range
    ],
)
def test_check_assignment_rejects_broken_assignments(assignment) -> None:
    group = {"a": Subscription(["t"]), "b": Subscription(["t"])}
    with pytest.raises(BrokenAssignment):
        check_assignment(assignment, group, {"t": 2, "u": 1})


def test_subscriptions_cross_the_wire_as_messagepack() -> None:
    subscription = Subscription(topics=["t"], owned=[("t", 3)], user_data=b"\x01")
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(subscription), type=Subscription)
    assert decoded == subscription
    assert decoded.owned == [("t", 3)]
    assert Subscription(["t"]).owned == [] and Subscription(["u"]).owned is not Subscription(["u"]).owned
