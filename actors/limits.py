"""Every limit and timeout in railmq, with the reason for its value. Units are the last word.

Actors take a `Limits` object (defaults below) so tests and the simulator can shrink timeouts
and queues without monkeypatching. Every queue and buffer in the system is bounded by one of
these; overload becomes a typed error (`BUSY`, `MESSAGE_TOO_LARGE`, a client-side
`BufferFull`), never a growing list.
"""

from __future__ import annotations

import msgspec


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    # --- failure detection (coordinator) -------------------------------------------------
    # Replicas heartbeat ten times per session: one lost heartbeat never looks like a death.
    replica_heartbeat_interval_ms: int = 100
    # Kafka's KRaft default is 9 s; a local cluster on loopback can afford a much shorter one,
    # which keeps failover well under the 2 s target even without the supervisor's fast path.
    replica_session_timeout_ms: int = 1000
    # After the coordinator (re)starts it waits this long for replicas to register before it
    # elects anyone, so a cluster restart does not elect whichever replica happened to be first.
    coordinator_election_grace_ms: int = 1000

    # --- replication (partition replica) -------------------------------------------------
    # A follower that has not caught up to the leader's end for this long leaves the ISR
    # (Kafka's replica.lag.time.max.ms is 30 s; we scale it like the session timeout).
    replica_lag_time_max_ms: int = 1500
    # Followers long-poll: a fetch with no new data waits this long at the leader.
    replica_fetch_wait_max_ms: int = 200
    # A follower re-sends its fetch if no answer came within this (the leader may be gone).
    replica_fetch_timeout_ms: int = 1000
    replica_fetch_bytes_max: int = 8 * 1024 * 1024
    # The leader asks the coordinator to change the ISR at most this often per partition.
    isr_check_interval_ms: int = 100
    # An unanswered AlterIsr is re-sent after this long.
    alter_isr_timeout_ms: int = 1000

    # --- requests ------------------------------------------------------------------------
    # acks=all produce requests waiting for replication, per partition. Beyond it: BUSY.
    purgatory_produce_max: int = 10_000
    # Parked long-poll fetches per partition (consumers + followers). Beyond it: BUSY.
    purgatory_fetch_max: int = 10_000
    fetch_wait_max_ms: int = 30_000
    fetch_bytes_max: int = 64 * 1024 * 1024
    # A whole multipart message larger than this is refused with MESSAGE_TOO_LARGE; libzmq drops
    # the connection of anything above `frame_bytes_hard_max` (ZMQ_MAXMSGSIZE) before we see it.
    frame_bytes_max: int = 32 * 1024 * 1024
    frame_bytes_hard_max: int = 64 * 1024 * 1024
    # Messages a runtime handles per poll wake-up before it applies effects and flushes: enough
    # to share one fsync among many produce requests, small enough to keep latency flat.
    runtime_batch_messages_max: int = 256
    # Outbound messages queued per peer socket (ZMQ_SNDHWM). A dead peer costs at most this.
    peer_send_queue_max: int = 1000
    # Distinct peers an actor keeps open sockets to.
    peer_sockets_max: int = 1024

    # --- coordinator ---------------------------------------------------------------------
    topics_max: int = 10_000
    partitions_per_topic_max: int = 10_000
    topic_name_length_max: int = 249  # Kafka's limit

    # --- groups (coordinator side) -------------------------------------------------------
    group_session_timeout_min_ms: int = 100
    group_session_timeout_max_ms: int = 300_000
    group_members_max: int = 1000
    # A new group waits this long for more members before the first rebalance completes
    # (Kafka's group.initial.rebalance.delay.ms is 3 s; short here so tests stay fast).
    group_initial_rebalance_delay_ms: int = 100
    offset_metadata_length_max: int = 4096

    # --- share groups --------------------------------------------------------------------
    # In-flight (acquired or available-for-redelivery) records per share-partition (KIP-932's
    # group.share.partition.max.record.locks is 200; more lets many members share one partition).
    share_records_in_flight_max: int = 2000
    share_fetch_records_max: int = 500


DEFAULT_LIMITS = Limits()
