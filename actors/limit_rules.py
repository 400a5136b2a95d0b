"""The rules between the limits of actors/limits.py: what makes a `Limits` unable to work.

`Limits` checks itself with `limit_problems` when it is made, so a limits file (`railmq node
--limits`) or a test's shrunken timeouts that contradict each other are refused by name before
any actor runs on them: a timer of period 0 fires at once for ever, a bound past the frame makes
answers no client decodes, a session shorter than its heartbeats ends between any two of them.
"""

from __future__ import annotations

from actors.limits import (
    DURATION_MS_MAX, FILE_NAME_BYTES_MAX, LONG_LIST_MAX, PARTITIONS_PER_TOPIC_CEILING, SHARE_LOCK_CEILING_MS,
    TOPIC_ID_HEX_DIGITS, Limits,
)

# Every limit is positive but these, where 0 means "none": no grace, no initial rebalance delay,
# nothing kept aside for each share group.
ZERO_MEANS_NONE = frozenset({"coordinator_election_grace_ms", "partition_creation_grace_ms",
                             "group_initial_rebalance_delay_ms",
                             "share_records_in_flight_reserved_per_group"})
# Answers whose size these bound must fit the frame every client decodes.
ANSWER_BOUNDS = ("fetch_bytes_max", "replica_fetch_bytes_max", "offset_bytes_per_group_max",
                 "group_membership_bytes_max", "share_describe_bytes_max",
                 "share_dead_letter_fetch_bytes_max")
# (smaller, larger, strictly): a heartbeat comes within its session, a range's least is at most its
# most. (A bound past a larger one that also holds, a group's past the total, only never binds.)
ORDERED = (
    ("replica_heartbeat_interval_ms", "replica_session_timeout_ms", True),
    ("replica_keepalive_interval_ms", "replica_keepalive_timeout_ms", True),
    ("node_heartbeat_interval_ms", "node_session_timeout_ms", True),
    ("controller_heartbeat_interval_ms", "controller_idle_heartbeat_interval_ms", False),
    ("group_session_timeout_min_ms", "group_session_timeout_max_ms", False),
    ("share_visibility_timeout_min_ms", "share_visibility_timeout_max_ms", False),
    ("frame_bytes_max", "frame_bytes_hard_max", False),
    ("topic_segment_bytes_min", "topic_segment_bytes_max", False),
    ("frame_bytes_hard_max", "client_inbound_bytes_max", False),
    ("frame_bytes_hard_max", "peer_inbound_bytes_max", False),
    ("share_records_in_flight_reserved_per_group", "share_records_in_flight_per_group_max", False),
) + tuple((name, "frame_bytes_max", False) for name in ANSWER_BOUNDS)


def limit_problems(limits: Limits) -> list[str]:
    """What makes `limits` unable to work, each named: a timer of period 0 fires at once for
    ever, a bound past the frame makes answers no client decodes, a session shorter than its
    heartbeats ends between any two of them."""
    problems = []
    for name in Limits.__struct_fields__:
        value = getattr(limits, name)
        if isinstance(value, bool):
            continue
        if value < 0 or (value == 0 and name not in ZERO_MEANS_NONE):
            zero = " or 0" if name in ZERO_MEANS_NONE else ""
            problems.append(f"{name} must be positive{zero}, got {value}")
        if name.endswith("_ms") and value > DURATION_MS_MAX:
            problems.append(f"{name} ({value:,}) must be at most {DURATION_MS_MAX:,} (24.8 days), "
                            f"the longest wait a poll takes")
    for smaller, larger, strictly in ORDERED:
        low, high = getattr(limits, smaller), getattr(limits, larger)
        if low > high or (strictly and low == high):
            relation = "below" if strictly else "at most"
            problems.append(f"{smaller} ({low}) must be {relation} {larger} ({high})")
    heartbeat, election = limits.controller_heartbeat_interval_ms, limits.controller_election_timeout_ms
    if 0 < election <= 2 * heartbeat:
        problems.append(f"controller_election_timeout_ms ({election}) must be more than two controller "
                        f"heartbeat intervals ({heartbeat} ms)")
    for name in ("topics_max", "group_offsets_max", "group_members_max", "share_group_members_max"):
        if getattr(limits, name) > LONG_LIST_MAX:
            problems.append(f"{name} ({getattr(limits, name):,}) must be at most {LONG_LIST_MAX:,}, the most "
                            f"items a request's list may carry")
    share = limits.controller_client_uncommitted_percent
    if share > 100:
        problems.append(f"controller_client_uncommitted_percent ({share}) must be at most 100")
    reserved = limits.share_records_in_flight_reserved_per_group * limits.share_groups_max
    if reserved > limits.share_records_in_flight_total_max:
        problems.append(f"share_records_in_flight_reserved_per_group for each of share_groups_max "
                        f"({reserved:,} records) must fit in share_records_in_flight_total_max "
                        f"({limits.share_records_in_flight_total_max:,})")
    if limits.share_visibility_timeout_max_ms > SHARE_LOCK_CEILING_MS:
        problems.append(f"share_visibility_timeout_max_ms ({limits.share_visibility_timeout_max_ms:,}) must "
                        f"be at most {SHARE_LOCK_CEILING_MS:,}, the longest lock a share member believes")
    if limits.partitions_per_topic_max > PARTITIONS_PER_TOPIC_CEILING:
        problems.append(f"partitions_per_topic_max ({limits.partitions_per_topic_max:,}) must be at most "
                        f"{PARTITIONS_PER_TOPIC_CEILING:,}, the most partitions a client takes in a topic")
    longest, partitions = limits.topic_name_length_max, limits.partitions_per_topic_max
    directory = longest + len(f"-{partitions - 1}-") + TOPIC_ID_HEX_DIGITS
    if directory > FILE_NAME_BYTES_MAX:
        problems.append(f"topic_name_length_max ({longest}) with partitions_per_topic_max ({partitions}) "
                        f"makes replica directory names of {directory} bytes, past the {FILE_NAME_BYTES_MAX} "
                        f"a file name may have")
    return problems
