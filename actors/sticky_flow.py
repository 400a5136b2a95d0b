"""The min-cost-flow solver behind cooperative-sticky when members subscribe to different topics.

actors/assignors.py hands this module the group's subscriptions (topic -> subscribers) and the
partitions each member may keep; it returns the assignment that is as fair as the subscriptions
allow (the smallest sum of squared member loads) and, among the fairest, keeps the most
partitions where they are (KIP-54's stickiness). It works on counts first, (topic, member) ->
how many of the topic's partitions the member gets: a greedy start, single moves from heavy to
light subscribers, then negative-cycle cancelling on the residual graph until no cycle is left,
which makes the result exact. Only then do counts become partitions.

Pure functions: no I/O, no clock, no randomness. Every order-sensitive step walks sorted members
and topics (or dicts built from them), so one group gives one assignment in every process.
Every partition of every topic in `members_of` ends with exactly one of its subscribers.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["Assignment", "TopicPartition", "assign_unequal_subscriptions"]

TopicPartition = tuple[str, int]
Assignment = dict[str, list[TopicPartition]]


def assign_unequal_subscriptions(
    members_of: Mapping[str, list[str]],
    partition_counts: Mapping[str, int],
    held: Mapping[str, list[TopicPartition]],
) -> Assignment:
    """Members subscribe to different topics, so balance is no longer a simple quota.

    `members_of`: topic -> its subscribers, topics and subscribers sorted; `partition_counts`
    covers every topic in it; `held`: every member of the group -> the partitions it may keep (at
    most one claim per partition, on topics it subscribes to). Returns every member of `held`
    with its partitions, sorted.

    The assignment is exact, not a heuristic: it minimises the sum of squared member loads (the
    fairest spread the subscriptions allow; it also meets Kafka's `isBalanced` condition, since
    moving a partition to a subscriber holding two fewer would lower that sum) and, among the
    fairest, keeps the most partitions where they are. It is solved as a min-cost flow on counts
    (topic -> member -> sink; a move costs 1, the k-th partition of a member costs BIG * (2k - 1))
    by cancelling negative cycles from a greedy start; then counts become partitions.
    """
    held_counts: dict[tuple[str, str], int] = {}
    for member in sorted(held):
        for topic, _ in held[member]:
            held_counts[topic, member] = held_counts.get((topic, member), 0) + 1
    placed = _place_unheld(members_of, partition_counts, held_counts)
    _balance_counts(placed, members_of)
    while (cycle := _negative_cycle(_residual_arcs(placed, held_counts, members_of))) is not None:
        for change, topic, member in cycle:
            placed[topic, member] = placed.get((topic, member), 0) + change
    return _partitions_from_counts(placed, held, members_of, partition_counts)


def _place_unheld(
    members_of: Mapping[str, list[str]],
    partition_counts: Mapping[str, int],
    held_counts: Mapping[tuple[str, str], int],
) -> dict[tuple[str, str], int]:
    """(topic, member) -> partition count: what is held stays, the rest goes to the least loaded
    subscriber, topics with the fewest subscribers first. A good start makes few cycles to cancel."""
    placed = dict(held_counts)
    load: dict[str, int] = {}
    for (_, member), count in sorted(held_counts.items()):
        load[member] = load.get(member, 0) + count
    for topic in sorted(members_of, key=lambda topic: (len(members_of[topic]), topic)):
        subscribers = members_of[topic]
        unheld = partition_counts[topic] - sum(held_counts.get((topic, member), 0) for member in subscribers)
        for _ in range(unheld):
            receiver = min(subscribers, key=lambda member: (load.get(member, 0), member))
            placed[topic, receiver] = placed.get((topic, receiver), 0) + 1
            load[receiver] = load.get(receiver, 0) + 1
    return placed


def _balance_counts(placed: dict[tuple[str, str], int], members_of: Mapping[str, list[str]]) -> None:
    """Move single partitions from heavy to light subscribers while some topic has a subscriber
    holding two or more fewer than another that holds one of its partitions (largest gap first).
    Each move lowers the sum of squared loads, so this ends; it leaves few cycles to cancel."""
    load = dict.fromkeys((member for subscribers in members_of.values() for member in subscribers), 0)
    for (_, member), count in placed.items():
        load[member] += count
    while True:
        widest: tuple[int, str, str, str] | None = None
        for topic, subscribers in members_of.items():
            givers = [member for member in subscribers if placed.get((topic, member), 0) > 0]
            if not givers:
                continue
            giver = min(givers, key=lambda member: (-load[member], member))
            receiver = min(subscribers, key=lambda member: (load[member], member))
            gap = load[giver] - load[receiver]
            if gap >= 2 and (widest is None or gap > widest[0]):
                widest = (gap, topic, giver, receiver)
        if widest is None:
            return
        _, topic, giver, receiver = widest
        placed[topic, giver] -= 1
        placed[topic, receiver] = placed.get((topic, receiver), 0) + 1
        load[giver] -= 1
        load[receiver] += 1


Arc = tuple[int, int, int, tuple[int, str, str]]  # tail node, head node, cost, (change, topic, member)


def _residual_arcs(
    placed: Mapping[tuple[str, str], int],
    held_counts: Mapping[tuple[str, str], int],
    members_of: Mapping[str, list[str]],
) -> tuple[int, list[Arc]]:
    """Node count and arcs of the residual graph. Nodes: 0 is the sink, then topics, then members.

    topic -> member gives the member one more partition of the topic (cost 1 unless it goes back to
    a member that held it), member -> topic takes one away (cost -1 if it had been moved there),
    member -> sink and sink -> member raise and lower the member's load at the marginal squared
    cost. A sum of squared loads only changes in steps of 2, and BIG is more than the partition
    count, so no number of kept partitions can pay for a less fair spread.
    """
    members = sorted({member for subscribers in members_of.values() for member in subscribers})
    node_of = {member: 1 + len(members_of) + rank for rank, member in enumerate(members)}
    big = 1 + sum(placed.values())
    load = dict.fromkeys(members, 0)
    arcs: list[Arc] = []
    for topic_node, (topic, subscribers) in enumerate(members_of.items(), start=1):
        for member in subscribers:
            count, held = placed.get((topic, member), 0), held_counts.get((topic, member), 0)
            load[member] += count
            arcs.append((topic_node, node_of[member], 0 if count < held else 1, (1, topic, member)))
            if count > 0:
                arcs.append((node_of[member], topic_node, -1 if count > held else 0, (-1, topic, member)))
    for member in members:
        arcs.append((node_of[member], 0, big * (2 * load[member] + 1), (0, "", member)))
        if load[member] > 0:
            arcs.append((0, node_of[member], -big * (2 * load[member] - 1), (0, "", member)))
    return 1 + len(members_of) + len(members), arcs


def _negative_cycle(graph: tuple[int, list[Arc]]) -> list[tuple[int, str, str]] | None:
    """The changes along one negative-cost cycle (Bellman-Ford from a virtual source), or None."""
    node_count, arcs = graph
    distance = [0] * node_count
    via: list[Arc | None] = [None] * node_count
    for _ in range(node_count):
        last_improved = -1
        for arc in arcs:
            tail, head, cost, _ = arc
            if distance[tail] + cost < distance[head]:
                distance[head] = distance[tail] + cost
                via[head] = arc
                last_improved = head
        if last_improved < 0:
            return None
    node = last_improved
    for _ in range(node_count):  # walk back far enough to stand on the cycle itself
        node = via[node][0]
    cycle, current = [], node
    while True:
        arc = via[current]
        cycle.append(arc[3])
        current = arc[0]
        if current == node:
            return [change for change in cycle if change[0] != 0]


def _partitions_from_counts(
    placed: Mapping[tuple[str, str], int],
    held: Mapping[str, list[TopicPartition]],
    members_of: Mapping[str, list[str]],
    partition_counts: Mapping[str, int],
) -> Assignment:
    """Turn counts into partitions: each member keeps its held partitions first (lowest first),
    then takes the lowest partitions of the topic nobody kept."""
    assignment: Assignment = {member: [] for member in sorted(held)}
    held_by_topic: dict[tuple[str, str], list[TopicPartition]] = {}
    for member in sorted(held):
        for topic_partition in held[member]:
            held_by_topic.setdefault((topic_partition[0], member), []).append(topic_partition)
    for topic, subscribers in members_of.items():
        kept: set[TopicPartition] = set()
        for member in subscribers:
            keeping = held_by_topic.get((topic, member), [])[: placed.get((topic, member), 0)]
            assignment[member].extend(keeping)
            kept.update(keeping)
        free = iter([(topic, n) for n in range(partition_counts[topic]) if (topic, n) not in kept])
        for member in subscribers:
            wanted = placed.get((topic, member), 0) - len(held_by_topic.get((topic, member), []))
            assignment[member].extend(next(free) for _ in range(max(0, wanted)))
    return {member: sorted(partitions) for member, partitions in assignment.items()}
