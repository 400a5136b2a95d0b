"""Consumer-group assignors: which member of a group reads which partition.

This module owns the pure functions the group leader runs at every rebalance: Kafka's `range`,
`round-robin` and `cooperative-sticky` assignors, and the first step of KIP-429's incremental
cooperative protocol (`cooperative_adjust`), which withholds a moving partition from its new owner
until the old owner has revoked it.

It never does I/O, reads a clock or draws random numbers, and never lets the order of a dict or a
set decide anything: members, topics and partitions are sorted before any order-sensitive step,
so the same group gives the same assignment in every process.

Every assignment returned keeps these invariants (checked before returning, see
`check_assignment`): every member id is present, possibly with an empty list; every partition of
every topic that some member subscribes to and `partition_counts` knows has exactly one owner;
nobody holds a partition of a topic it does not subscribe to; each member's list is sorted.
Subscribed topics missing from `partition_counts` (no metadata yet) are skipped, as Kafka does.

Cooperative-sticky with unequal subscriptions needs a min-cost-flow solver; it lives in
actors/sticky_flow.py, which this module calls with the group's topics, subscribers and claims.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping

import msgspec

from actors.sticky_flow import Assignment, TopicPartition, assign_unequal_subscriptions

__all__ = [
    "ASSIGNORS",
    "COOPERATIVE_ASSIGNORS",
    "AssignorError",
    "BrokenAssignment",
    "CooperativePlan",
    "InvalidPartitionCount",
    "Subscription",
    "UnknownAssignor",
    "assign",
    "check_assignment",
    "cooperative_adjust",
    "cooperative_sticky_assign",
    "owned_partitions",
    "range_assign",
    "round_robin_assign",
]


class Subscription(msgspec.Struct):
    """What one member sends when it joins: topics it wants, partitions it holds, opaque extras."""

    topics: list[str]
    owned: list[tuple[str, int]] = []
    user_data: bytes = b""


class AssignorError(Exception):
    """Base of the errors this module raises."""


class UnknownAssignor(AssignorError):
    """The group asked for an assignor this broker does not have."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown assignor {name!r}; known: {', '.join(sorted(ASSIGNORS))}")


class InvalidPartitionCount(AssignorError):
    """A topic was given a negative partition count."""

    def __init__(self, topic: str, partition_count: int) -> None:
        self.topic = topic
        self.partition_count = partition_count
        super().__init__(f"topic {topic!r} has partition count {partition_count}; it must be at least 0")


class BrokenAssignment(AssignorError):
    """An assignment breaks one of the invariants above: a programmer error, never user input."""


class CooperativePlan(msgspec.Struct, frozen=True):
    """One round of KIP-429's incremental cooperative rebalance.

    `assignment`: what each member may hold after this round (the target minus partitions still
    held by someone else). `revocations`: what each member must give up now. `withheld`: partitions
    that reach their target owner only in the follow-up rebalance, after they are revoked.
    """

    assignment: dict[str, list[TopicPartition]]
    revocations: dict[str, list[TopicPartition]]
    withheld: list[TopicPartition]

    @property
    def follow_up_needed(self) -> bool:
        return bool(self.withheld)


# -- shared leaves ---------------------------------------------------------------------------------


def _check_partition_counts(partition_counts: Mapping[str, int]) -> None:
    for topic in sorted(partition_counts):
        if partition_counts[topic] < 0:
            raise InvalidPartitionCount(topic, partition_counts[topic])


def _known_topics(subscription: Subscription, partition_counts: Mapping[str, int]) -> tuple[str, ...]:
    return tuple(sorted({topic for topic in subscription.topics if topic in partition_counts}))


def _topics_by_member(
    subscriptions: Mapping[str, Subscription], partition_counts: Mapping[str, int]
) -> dict[str, tuple[str, ...]]:
    return {
        member: _known_topics(subscriptions[member], partition_counts)
        for member in sorted(subscriptions)
    }


def _members_by_topic(topics_of: Mapping[str, tuple[str, ...]]) -> dict[str, list[str]]:
    """Topic -> the members subscribing to it, both sorted (input members are in sorted order)."""
    members_of: dict[str, list[str]] = {}
    for member in sorted(topics_of):
        for topic in topics_of[member]:
            members_of.setdefault(topic, []).append(member)
    return {topic: members_of[topic] for topic in sorted(members_of)}


def _all_partitions(topics: Iterable[str], partition_counts: Mapping[str, int]) -> list[TopicPartition]:
    return [(topic, partition) for topic in sorted(topics) for partition in range(partition_counts[topic])]


def _sorted_assignment(assignment: Mapping[str, list[TopicPartition]]) -> Assignment:
    return {member: sorted(assignment[member]) for member in sorted(assignment)}


def _deduplicated_claims(claims_by_member: Mapping[str, Iterable[TopicPartition]]) -> Assignment:
    return {
        member: sorted({(topic, partition) for topic, partition in claims_by_member[member]})
        for member in sorted(claims_by_member)
    }


def owned_partitions(subscriptions: Mapping[str, Subscription]) -> Assignment:
    """Member -> the partitions it says it holds, sorted, without duplicates (the `owned` argument
    of `cooperative_adjust`)."""
    return _deduplicated_claims({member: subscriptions[member].owned for member in subscriptions})


def check_assignment(
    assignment: Mapping[str, list[TopicPartition]],
    subscriptions: Mapping[str, Subscription],
    partition_counts: Mapping[str, int],
) -> None:
    """Raise `BrokenAssignment` unless `assignment` keeps the module's invariants."""
    if sorted(assignment) != sorted(subscriptions):
        raise BrokenAssignment(f"members {sorted(assignment)} are not the group {sorted(subscriptions)}")
    topics_of = _topics_by_member(subscriptions, partition_counts)
    owner: dict[TopicPartition, str] = {}
    for member in sorted(assignment):
        for topic, partition in assignment[member]:
            if topic not in topics_of[member] or not 0 <= partition < partition_counts[topic]:
                raise BrokenAssignment(f"{member!r} got ({topic!r}, {partition}) it cannot hold")
            if (topic, partition) in owner:
                first = owner[topic, partition]
                raise BrokenAssignment(f"({topic!r}, {partition}) given to {first!r} and {member!r}")
            owner[topic, partition] = member
    expected = _all_partitions(_members_by_topic(topics_of), partition_counts)
    if len(owner) != len(expected):
        missing = [topic_partition for topic_partition in expected if topic_partition not in owner]
        raise BrokenAssignment(f"partitions without an owner: {missing[:10]}")


# -- range and round-robin (eager assignors: they ignore what members hold) ------------------------


def range_assign(
    subscriptions: Mapping[str, Subscription], partition_counts: Mapping[str, int]
) -> Assignment:
    """Kafka's RangeAssignor: per topic, contiguous ranges over its subscribers sorted by id.

    The first `partition_count % subscribers` members get one partition more than the others.
    """
    _check_partition_counts(partition_counts)
    topics_of = _topics_by_member(subscriptions, partition_counts)
    assignment: Assignment = {member: [] for member in topics_of}
    for topic, members in _members_by_topic(topics_of).items():
        share, extra = divmod(partition_counts[topic], len(members))
        start = 0
        for position, member in enumerate(members):
            length = share + (1 if position < extra else 0)
            assignment[member].extend((topic, partition) for partition in range(start, start + length))
            start += length
    return assignment


def round_robin_assign(
    subscriptions: Mapping[str, Subscription], partition_counts: Mapping[str, int]
) -> Assignment:
    """Kafka's RoundRobinAssignor: all partitions sorted, dealt in turn to members sorted by id,
    passing over a member that does not subscribe to the partition's topic."""
    _check_partition_counts(partition_counts)
    topics_of = _topics_by_member(subscriptions, partition_counts)
    members = list(topics_of)
    assignment: Assignment = {member: [] for member in members}
    turn = 0
    for topic, partition in _all_partitions(_members_by_topic(topics_of), partition_counts):
        while topic not in topics_of[members[turn]]:  # some member subscribes, so this ends
            turn = (turn + 1) % len(members)
        assignment[members[turn]].append((topic, partition))
        turn = (turn + 1) % len(members)
    return assignment


# -- cooperative-sticky ----------------------------------------------------------------------------


def cooperative_sticky_assign(
    subscriptions: Mapping[str, Subscription], partition_counts: Mapping[str, int]
) -> Assignment:
    """Kafka's CooperativeStickyAssignor (KIP-54 stickiness, KIP-429 protocol): as balanced as
    round-robin, and every partition stays with the member holding it whenever balance allows.

    Exactly: among the assignments with the smallest sum of squared member loads (with equal
    subscriptions: everyone holds `quota` or `quota + 1`), the one that keeps the most held
    partitions in place. Returns the target; `cooperative_adjust` turns it into this round's
    assignment and revocations. Re-running on its own output moves nothing, so the follow-up
    rebalance after revocations revokes nothing more.
    """
    _check_partition_counts(partition_counts)
    topics_of = _topics_by_member(subscriptions, partition_counts)
    held = _resolve_claims(subscriptions, topics_of, partition_counts)
    if len(set(topics_of.values())) <= 1:
        partitions = _all_partitions(next(iter(topics_of.values()), ()), partition_counts)
        return _assign_equal_subscriptions(partitions, held)
    return assign_unequal_subscriptions(_members_by_topic(topics_of), partition_counts, held)


def _resolve_claims(
    subscriptions: Mapping[str, Subscription],
    topics_of: Mapping[str, tuple[str, ...]],
    partition_counts: Mapping[str, int],
) -> dict[str, list[TopicPartition]]:
    """Member -> the claimed partitions it may keep a claim on, each partition claimed at most once.

    Claims on partitions that do not exist or on topics the member no longer subscribes to are
    dropped. A partition claimed by two members (one is a zombie from an older generation) stays
    with one of them: the one holding fewer partitions, then the smaller member id.
    """
    claimants: dict[TopicPartition, list[str]] = {}
    for member, claims in owned_partitions(subscriptions).items():
        for topic, partition in claims:  # sorted members, sorted claims: claimant lists are sorted
            if topic in topics_of[member] and 0 <= partition < partition_counts[topic]:
                claimants.setdefault((topic, partition), []).append(member)
    held: dict[str, list[TopicPartition]] = {member: [] for member in topics_of}
    contested = []
    for topic_partition in sorted(claimants):
        members = claimants[topic_partition]
        if len(members) == 1:
            held[members[0]].append(topic_partition)
        else:
            contested.append(topic_partition)
    for topic_partition in contested:
        keeper = min(claimants[topic_partition], key=lambda member: (len(held[member]), member))
        held[keeper].append(topic_partition)
    return {member: sorted(claims) for member, claims in held.items()}


def _assign_equal_subscriptions(
    partitions: list[TopicPartition], held: Mapping[str, list[TopicPartition]]
) -> Assignment:
    """Every member can take every partition: each gets `quota` or `quota + 1`.

    The one-larger quotas go to the members holding the most, which keeps the largest possible
    number of partitions in place: each member keeps up to `quota`, and a member holding more
    keeps one extra while extra slots remain. The rest is dealt to the least-loaded member first,
    so new partitions of a topic spread over the group.
    """
    members = sorted(held)
    if not members:
        return {}
    quota, extra = divmod(len(partitions), len(members))
    by_holding = sorted(members, key=lambda member: (-len(held[member]), member))
    capacity = {member: quota + (1 if rank < extra else 0) for rank, member in enumerate(by_holding)}
    assignment = {member: held[member][: capacity[member]] for member in members}
    kept = {topic_partition for member in members for topic_partition in assignment[member]}
    _deal_to_least_loaded([tp for tp in partitions if tp not in kept], assignment, capacity)
    return _sorted_assignment(assignment)


def _deal_to_least_loaded(
    partitions: list[TopicPartition], assignment: Assignment, capacity: Mapping[str, int]
) -> None:
    """Give each partition, in order, to the member with the fewest, below its capacity."""
    open_members = [(len(assignment[member]), member) for member in sorted(assignment)]
    open_members = [(load, member) for load, member in open_members if load < capacity[member]]
    heapq.heapify(open_members)
    for topic_partition in partitions:
        load, member = heapq.heappop(open_members)  # capacities sum to the partition count
        assignment[member].append(topic_partition)
        if load + 1 < capacity[member]:
            heapq.heappush(open_members, (load + 1, member))


# -- the incremental cooperative protocol (KIP-429) ------------------------------------------------


def cooperative_adjust(
    target: Mapping[str, list[TopicPartition]], owned: Mapping[str, list[TopicPartition]]
) -> CooperativePlan:
    """First round of a cooperative rebalance towards `target`, given what members hold now.

    A member keeps holding what the target leaves it, and receives a partition only if no other
    member holds it; a partition still held by someone else is withheld until that member has
    revoked it and rejoined (the follow-up rebalance). Each member revokes what it holds outside
    its target. A partition held by several members (a zombie among them) stays with the one the
    target names, if it holds it, while the others revoke.
    """
    _check_single_owner(target)
    held = _deduplicated_claims(owned)
    holders: dict[TopicPartition, list[str]] = {}
    for member, claims in held.items():
        for topic_partition in claims:
            holders.setdefault(topic_partition, []).append(member)
    assignment: Assignment = {}
    withheld: list[TopicPartition] = []
    for member, targeted in _deduplicated_claims(target).items():
        assignment[member] = []
        for topic_partition in targeted:
            current_holders = holders.get(topic_partition, [])
            if current_holders and member not in current_holders:
                withheld.append(topic_partition)
            else:
                assignment[member].append(topic_partition)
    revocations = {}
    for member in sorted(set(target) | set(owned)):
        keeping = set(assignment.get(member, []))
        revocations[member] = [tp for tp in held.get(member, []) if tp not in keeping]
    return CooperativePlan(assignment=assignment, revocations=revocations, withheld=sorted(withheld))


def _check_single_owner(target: Mapping[str, list[TopicPartition]]) -> None:
    owner: dict[TopicPartition, str] = {}
    for member in sorted(target):
        for topic, partition in target[member]:
            if (topic, partition) in owner:
                first = owner[topic, partition]
                raise BrokenAssignment(f"target lists ({topic!r}, {partition}) for {first!r} and {member!r}")
            owner[topic, partition] = member


# -- registry --------------------------------------------------------------------------------------

AssignorFunction = Callable[[Mapping[str, Subscription], Mapping[str, int]], Assignment]

ASSIGNORS: dict[str, AssignorFunction] = {
    "range": range_assign,
    "round-robin": round_robin_assign,
    "cooperative-sticky": cooperative_sticky_assign,
}
# Assignors whose members keep their partitions through a rebalance (KIP-429); with the others a
# member revokes everything before it rejoins (the eager protocol).
COOPERATIVE_ASSIGNORS = frozenset({"cooperative-sticky"})


def assign(name: str, subscriptions: dict[str, Subscription], partition_counts: dict[str, int]) -> Assignment:
    """Run the assignor called `name`; raises `UnknownAssignor` for a name not in `ASSIGNORS`."""
    assignor = ASSIGNORS.get(name)
    if assignor is None:
        raise UnknownAssignor(name)
    assignment = _sorted_assignment(assignor(subscriptions, partition_counts))
    check_assignment(assignment, subscriptions, partition_counts)
    return assignment
