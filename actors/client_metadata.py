"""What a client takes from a metadata answer: topics whose partitions are exactly 0..n-1.

Clients look a partition's leader up by number (`topic.partitions[p]` leads partition `p`) and
the producer hashes keys modulo the partition count, so metadata that lists partitions out of
order, twice, with gaps, not at all or more than a cluster can hold would send records to the
wrong leader or divide by zero. A metadata answer is a claim: partitions listed out of order are
put in order, and a topic whose partitions are not 0..n-1 (1 <= n <= `PARTITIONS_PER_TOPIC_CEILING`)
is taken as not available yet (LEADER_NOT_AVAILABLE, so it is asked about again), never used. A
leader named at an endpoint no cluster process has (`named_endpoint`: a local socket, a source
address, a 10 KB name) is taken as no leader: nothing is sent there.

A client keeps at most `topics_max` topics, the most a cluster holds, so answers naming ever
new topics cannot grow its map without bound; the topics it uses are always kept. The same goes
for what else a client keeps from answers: endpoints it saw gone (`distrust`, bounded) and a
server's error sentences (`clipped`).
"""

from __future__ import annotations

from typing import Container

import msgspec

from actors.controller_endpoints import named_endpoint
from actors.errors import ErrorCode
from actors.limits import DEFAULT_LIMITS, PARTITIONS_PER_TOPIC_CEILING
from actors.messages import TopicMetadata


def checked_topic(topic: TopicMetadata) -> TopicMetadata:
    """The topic with its partitions in order, or, when they are not 0..n-1, the topic as an
    error that says why (its partitions dropped). A client does not know the cluster's limits: n is
    checked against the ceiling no configuration passes (checked against the default limits, every
    topic of a cluster configured for more partitions had no leader for good)."""
    most = PARTITIONS_PER_TOPIC_CEILING
    if topic.error != ErrorCode.NONE:
        return topic
    topic = _usable_leaders(topic)
    numbers = [entry.partition for entry in topic.partitions]
    if numbers == list(range(len(numbers))) and 1 <= len(numbers) <= most:
        return topic
    ordered = sorted(topic.partitions, key=lambda entry: entry.partition)
    count = len(ordered)
    if [entry.partition for entry in ordered] == list(range(count)) and 1 <= count <= most:
        return msgspec.structs.replace(topic, partitions=ordered)
    shown = sorted(set(numbers))[:8]
    return msgspec.structs.replace(topic, error=ErrorCode.LEADER_NOT_AVAILABLE, partitions=[], error_message=(
        f"the metadata of {topic.name!r} lists {count} partitions ({shown}...), not partitions 0..n-1 "
        f"with 1 <= n <= {most}"))


def _usable_leaders(topic: TopicMetadata) -> TopicMetadata:
    """The topic, its partitions led at an endpoint no cluster process has taken as leaderless."""
    usable = {endpoint: not endpoint or named_endpoint(endpoint)
              for endpoint in {entry.leader_endpoint for entry in topic.partitions}}
    if all(usable.values()):
        return topic
    return msgspec.structs.replace(topic, partitions=[
        entry if usable[entry.leader_endpoint] else msgspec.structs.replace(
            entry, leader=-1, leader_endpoint="", offline_reason="its leader was named at no usable endpoint")
        for entry in topic.partitions])


def remember_topic(topics: dict[str, TopicMetadata], topic: TopicMetadata, in_use: Container[str],
                   most: int = DEFAULT_LIMITS.topics_max) -> bool:
    """Store a checked topic unless the map holds `most` others; a topic in use always goes in
    (in place of the oldest one not in use). Returns whether it was stored."""
    if topic.name not in topics and len(topics) >= most:
        if topic.name not in in_use:
            return False
        unused = next((name for name in topics if name not in in_use), None)
        if unused is not None:
            del topics[unused]
    topics[topic.name] = topic
    return True


# Endpoints a client remembers seeing gone: as many as it may keep sockets to. Each entry is
# distrusted for a few seconds only, so past this bound the expired ones go, then the oldest.
UNREACHABLE_ENDPOINTS_MAX = DEFAULT_LIMITS.peer_sockets_max


def distrust(unreachable: dict[str, int], endpoint: str, until_ns: int, now_ns: int) -> None:
    """Remember that metadata naming `endpoint` is not trusted before `until_ns`, in a bounded map
    (metadata naming ever new endpoints that are all gone cannot grow it)."""
    unreachable.pop(endpoint, None)  # re-inserted: the map stays in order of when each was seen gone
    unreachable[endpoint] = until_ns
    if len(unreachable) <= UNREACHABLE_ENDPOINTS_MAX:
        return
    for expired in [name for name, until in unreachable.items() if until <= now_ns]:
        del unreachable[expired]
    while len(unreachable) > UNREACHABLE_ENDPOINTS_MAX:
        del unreachable[next(iter(unreachable))]


# A server's sentence (an error message) is kept, and handed to the user, to this many
# characters: an answer may carry megabytes of it, and a client keeps some for a while.
SERVER_TEXT_CHARS_MAX = 1024


def clipped(text: str) -> str:
    if len(text) <= SERVER_TEXT_CHARS_MAX:
        return text
    return f"{text[:SERVER_TEXT_CHARS_MAX]}... ({len(text) - SERVER_TEXT_CHARS_MAX} more characters)"
