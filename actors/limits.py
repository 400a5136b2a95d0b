"""Every limit and timeout in railmq, with the reason for its value. Units are the last word.

Actors take a `Limits` object (defaults below) so tests and the simulator can shrink timeouts
and queues without monkeypatching. Every queue and buffer in the system is bounded by one of
these; overload becomes a typed error (`BUSY`, `MESSAGE_TOO_LARGE`, a client-side
`BufferFull`), never a growing list.
"""

from __future__ import annotations

import msgspec


# The shape of a cluster, fixed when it forms rather than tuned per cluster. A node id is Kafka's
# int32 `node.id`. A cluster has at most NODES_MAX nodes: every node's registration is a metadata
# write and every node heartbeat names its agent's nodes, so on one machine 32,768 nodes answered
# their first create in 5 s and 65,536 answered none in 336 s; 1,024 is far above what one machine
# (or, across machines, one quorum of voters) runs and far below that cliff.
NODE_ID_MAX = 2**31 - 1
NODES_MAX = 1024
# How many items a request's list or map may carry (actors/wire_bounds.py). A message is decoded
# whole before any rule reads it, and a list of tiny items costs ~25 bytes of memory a byte of
# frame: 10 million two-letter topic names (30 MB) decoded into 706 MB in 0.6 s. The limits that
# size such lists stay within these (`limit_problems`).
LONG_LIST_MAX = 100_000  # topics, partitions, offsets, members, acknowledgements, log entries
SHORT_LIST_MAX = NODES_MAX  # nodes, replicas, voters, peers, assignors
SETTINGS_MAX = 64  # a topic's settings by name (TopicConfig has ten)
# No configuration makes a topic of more partitions (`limit_problems`). Clients do not know the
# cluster's limits, so this is what they check a partition number against: an assignment naming
# partitions past it is in no cluster (a hostile one of a million took a member 495 MB).
PARTITIONS_PER_TOPIC_CEILING = 10_000
# No configuration gives a share lock longer (`limit_problems`), so a share member believes no lock
# deadline further away: a hostile answer's 2**62 held its records as locked for ever.
SHARE_LOCK_CEILING_MS = 24 * 3600 * 1000
# The longest any `*_ms` limit may be, 24.8 days (`limit_problems`): a wait is handed to a poll as a
# C int of ms, and a node heartbeat of 2**60 ms ended the node agent's thread at its first wait
# (`OverflowError` from zmq_poll). The command line's waits take the same bound (railmq/cli_common.py).
DURATION_MS_MAX = 2**31 - 1
# Frames of one message as a socket hands it over: a ROUTER's routing id, the header, a payload
# frame (a batch, records) and the cluster's tag are four. libzmq bounds each frame, not their
# number, and an empty frame is 2 bytes on the wire: a 2 MB message of a million of them took a
# runtime seconds to read and ~190 bytes of memory a frame. Past this, nothing is kept
# (transport/frames.py).
MESSAGE_FRAMES_MAX = 8


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    # --- failure detection (coordinator) -------------------------------------------------
    # Heartbeats come five times per session: one lost heartbeat never looks like a death
    # (Kafka's KRaft brokers: 2 s heartbeats, 9 s sessions; ours are scaled for one machine).
    # A replica without a node agent sends its own at this interval; with one (the real cluster,
    # actors/replica_reports.py) it is the shortest interval between two reports of a changing
    # replica.
    replica_heartbeat_interval_ms: int = 200
    # Kafka's KRaft default is 9 s; a local cluster on loopback can afford a much shorter one,
    # which keeps failover well under the 2 s target even without the supervisor's fast path.
    replica_session_timeout_ms: int = 1000
    # Through a node agent, an unchanged replica reports once per keepalive interval (local and
    # small), and the agent calls it unresponsive (a paused process, one cut off from the network)
    # after the keepalive timeout: three missed keepalives. Failover after a kill -9 never waits
    # for this: the supervisor's exit notice is immediate.
    replica_keepalive_interval_ms: int = 3000
    replica_keepalive_timeout_ms: int = 9000
    # A node agent heartbeats for all its replicas once per interval, and at once for news (a new
    # incarnation, epoch or storage state); the coordinator counts its replicas alive for a node
    # session after the last one. The node's processes exiting are told at once, so this only
    # bounds noticing a node agent (the whole node) gone.
    node_heartbeat_interval_ms: int = 1000
    node_session_timeout_ms: int = 3000
    # After the coordinator (re)starts it waits this long for replicas to register before it
    # elects anyone, so a cluster restart does not elect whichever replica happened to be first.
    coordinator_election_grace_ms: int = 1000
    # Both quorums (controllers, group voters; actors/raft/config.py says why): a follower that
    # hears no leader for a random time in [T, 2T) campaigns. A killed active voter is replaced in
    # ~0.3-0.7 s. Four heartbeats per T, not RaftConfig's six: every heartbeat costs each voter a
    # message (~0.04 cores per quorum at 50 ms, measured idle on this machine), and losing three
    # in a row to load is what it takes to start an election.
    controller_election_timeout_ms: int = 300
    controller_heartbeat_interval_ms: int = 75
    # ...and a quiet quorum's leader (nothing to replicate for three heartbeats) heartbeats this
    # often instead: idle, each quorum costs a message per voter per second. A leader whose
    # process dies is still replaced in well under a second (its followers see the connection
    # drop and campaign at once); one that vanishes without closing its connections (a lost
    # host, a cut link) is missed after up to this much more (docs/raft.md, "quiet leaders").
    controller_idle_heartbeat_interval_ms: int = 1000
    # A voter takes a Raft message naming voter N only from an address N's configured host
    # resolves to: a second process posing as voter N (a cloned machine) could otherwise have
    # its vote counted twice (transport/voter_address.py). Off only where hosts reach each other
    # from other addresses than the configured ones (several interfaces, NAT).
    voter_address_check: bool = True
    # A new partition's replicas are processes still being started (a few hundred ms each on a
    # loaded 2-core machine): nobody is judged absent before this much time has passed.
    partition_creation_grace_ms: int = 5000

    # --- replication (partition replica) -------------------------------------------------
    # A follower that has not caught up to the leader's end for this long leaves the ISR
    # (Kafka's replica.lag.time.max.ms is 30 s; we scale it like the session timeout).
    replica_lag_time_max_ms: int = 1500
    # Followers long-poll: a fetch with no new data waits this long at the leader (Kafka's
    # replica.fetch.wait.max.ms); new data or a newer high watermark answers it at once.
    replica_fetch_wait_max_ms: int = 500
    # ...and a follower in the ISR whose last fetch brought nothing (it is at the log end) waits
    # this long: a fetch parked at the log end counts as caught up, so an idle partition's
    # follower and leader wake once per this wait instead of twice a second. Nothing waits on its
    # end: new data answers it at once, a follower that then does not fetch again leaves the ISR
    # after replica_lag_time_max_ms as always, and a leader change reaches the follower as a state
    # push. At 5 s these wake-ups were half of an idle replica's CPU.
    replica_fetch_idle_wait_max_ms: int = 15_000
    # A follower waiting at the log end learns a newer high watermark this soon (its wait is cut
    # short), unless new data answers it first, as it does under load. Kafka's
    # replica.fetch.wait.max.ms (500 ms) bounds the same delay. Shorter costs a round trip per
    # batch when traffic is spread thin: at 50 ms, 30 partitions at RF 3 took ~1.7x the CPU.
    replica_high_watermark_notice_ms: int = 500
    # A follower re-sends its fetch if no answer came within this (the leader may be gone).
    replica_fetch_timeout_ms: int = 1000
    replica_fetch_bytes_max: int = 8 * 1024 * 1024
    # A follower's shared-memory ring (transport/ring_link.py), made at its first fetch from a
    # leader on this host. Sized to use, not to the largest fetch: a steady follower's answers are
    # a few batches; one that does not fit (catching up) travels over ZeroMQ instead. /dev/shm
    # holds at most this much per follower.
    replica_ring_bytes: int = 2 * 1024 * 1024
    # The leader checks its followers' lag this often (a sixth of replica_lag_time_max_ms, so a
    # lagging follower leaves the ISR at most ~250 ms late), and asks for ISR changes then.
    isr_check_interval_ms: int = 250
    # An unanswered AlterIsr is re-sent after this long.
    alter_isr_timeout_ms: int = 1000

    # --- storage health (partition replica) ------------------------------------------------
    # The scrubber re-reads the log in the background to find bit rot in data nobody fetches (a
    # follower's log is never read otherwise). A pass reads 4 MiB every 250 ms (16 MiB/s per
    # replica: a 100 MB log in ~7 s, a few ms of CPU per tick, the CRC is ISA-L's), and a pass
    # begins every `scrub_pass_interval_ms`: between passes an idle replica does nothing, and a
    # box of 100 replicas of 100 MB re-reads ~17 MB/s on average. Bit rot is found within about
    # one pass interval; chaos and tests shorten it.
    scrub_interval_ms: int = 250
    scrub_bytes_per_tick: int = 4 * 1024 * 1024
    scrub_pass_interval_ms: int = 600_000

    # --- requests ------------------------------------------------------------------------
    # Idempotent producers a partition remembers (actors/producer_state.py): a producer id is a
    # batch header's claim, so a client can invent any number; each costs up to ~1.1 KB with its
    # last five batches, ~11 MB per replica at most. The least recently written is forgotten first
    # (its retries are then new batches).
    producer_ids_per_partition_max: int = 10_000
    # How far past the leader's clock a batch's newest timestamp may be (Kafka 4's
    # message.timestamp.after.max.ms): time retention deletes a segment only once its newest
    # record is older than retention_ms, so one record stamped years ahead would keep every later
    # segment on disk for years. Beyond it: INVALID_TIMESTAMP. An hour covers clock skew.
    record_timestamp_future_max_ms: int = 3_600_000
    # acks=all produce requests waiting for replication, per partition. Beyond it: BUSY.
    purgatory_produce_max: int = 10_000
    # Parked consumer fetches and ListOffsets long polls per partition. Beyond it: BUSY. Each
    # follower has one seat besides (its newer fetch replaces its older).
    purgatory_fetch_max: int = 10_000
    fetch_wait_max_ms: int = 30_000
    # Batch headers a leader walks to judge whether a fetch's `min_bytes` are there (at its
    # arrival, and at every append in one walk for every parked fetch); past this many whole batches
    # the fetch is answered. Counting to any `min_bytes` walked the whole log: `min_bytes=2**62` at
    # offset 0 cost 0.15 s per 100,000 small batches, per fetch and per append while such fetches
    # waited; and a walk for each parked fetch made 10,000 of them cost 2 s per append.
    fetch_ready_batches_max: int = 256
    # The most one fetch answer carries, whatever max_bytes asks (a first batch larger than
    # max_bytes still goes whole: a topic's batch_bytes_max is at most this). The answer must fit
    # the frame its client decodes (frame_bytes_max, 32 MiB): at 64 MiB, a consumer asking 48 MiB
    # (Kafka's fetch.max.bytes is 50 MiB) got answers its codec dropped, and never read on.
    fetch_bytes_max: int = 16 * 1024 * 1024
    # A whole multipart message larger than this is refused with MESSAGE_TOO_LARGE; libzmq drops
    # the connection of anything above `frame_bytes_hard_max` (ZMQ_MAXMSGSIZE) before we see it.
    frame_bytes_max: int = 32 * 1024 * 1024
    frame_bytes_hard_max: int = 64 * 1024 * 1024
    # Messages a runtime handles per poll wake-up before it applies effects and flushes: enough
    # to share one fsync among many produce requests, small enough to keep latency flat.
    runtime_batch_messages_max: int = 256
    # Frames of a message past MESSAGE_FRAMES_MAX a runtime reads (and drops) from one socket per
    # wake-up, ~1 us each: a message of millions is read a few milliseconds at a time, and timers,
    # heartbeats and the other sockets are served in between.
    runtime_batch_frames_max: int = 4096
    # Outbound messages queued per peer socket (ZMQ_SNDHWM). A dead peer costs at most this.
    peer_send_queue_max: int = 1000
    # Answers a ROUTER queues for one connection that does not read (ZMQ_SNDHWM; more are dropped).
    # A legitimate peer has a handful of requests in flight; with the byte budget below, a peer
    # that never reads costs at most this many answers under 4 KiB (transport/outbound.py).
    router_send_queue_max: int = 256
    # Messages a ROUTER queues from one connection before libzmq stops reading it (ZMQ_RCVHWM):
    # legitimate peers have a handful of requests in flight (a producer 5 per partition, a follower
    # 1), and TCP flow control holds back a sender beyond it. With `frame_bytes_hard_max` this bounds
    # what one connection can make an actor hold before it handles anything.
    router_receive_queue_max: int = 64
    # Bytes of large answers (fetched records) handed to ZeroMQ for one peer and not yet written to
    # its socket (transport/outbound.py). Beyond it the peer gets BUSY until it reads: a client that
    # never reads costs this, not SNDHWM x a fetch's size. Eight of the largest follower fetches.
    peer_outbound_bytes_max: int = 64 * 1024 * 1024
    # The same over all peers of one actor: a leader never holds more than this in unsent answers.
    outbound_bytes_max: int = 256 * 1024 * 1024
    # When that is full and a peer within its own budget is refused, the client connection whose
    # answers have waited unread longer than this, holding the most, is closed to make room: four
    # connections that never read no longer keep every client's large answers BUSY. A cluster
    # process's connection is never closed.
    client_unread_answers_close_ms: int = 2000
    # Distinct peers an actor keeps open sockets to.
    peer_sockets_max: int = 1024
    # Connections an actor accepts from processes that are not the cluster's (no valid tag has
    # come on them): clients, or anyone. Past it the one quiet longest is closed
    # (transport/connections.py). Each may hold up to `router_send_queue_max` small answers.
    # Half the process's open-files limit if that is lower.
    client_connections_max: int = 1024
    # Bytes those connections may make an actor hold before it has read them as messages: libzmq
    # allocates a message's whole size from its header and fills it as bytes come, so 20
    # connections each sending 60 MiB of a message they never finished held 1.2 GB of a leader.
    # Counted `client_inbound_check_interval_ms` after bytes came on such a connection, and again
    # while any are held; past it the connections holding the most are closed. Room for eight of
    # the largest messages a client may send (`frame_bytes_max`) at once.
    client_inbound_bytes_max: int = 256 * 1024 * 1024
    client_inbound_check_interval_ms: int = 200
    # The same for the connections of this process's DEALERs (clients' and actors' sockets to their
    # peers; transport/peer_inbound.py): whatever listens on a peer's port sends there, and one
    # message of ever more frames is never whole, so libzmq's count of messages never binds. A
    # client's DEALER held all 320 MiB of one such message. Past it the connection holding the
    # most is closed. A legitimate peer has one message in progress: room for eight of the largest.
    peer_inbound_bytes_max: int = 256 * 1024 * 1024
    # Bytes of answers (metadata, a group's offsets, a decision's answer) a quorum's leader holds
    # behind its uncommitted proposals, to be sent once they commit (actors/controller.py).
    # Counted in nothing, 2,000 metadata requests for 300 topics behind one stuck proposal held
    # 653 MB, and 60 CreateTopic answers of 1,000 partitions 5.1 MB against a 1 MiB budget; past
    # this a read, and a client's decision, is answered BUSY at once and the client asks again.
    controller_held_bytes_max: int = 64 * 1024 * 1024
    # The share of what a quorum's leader may hold uncommitted (RaftConfig's uncommitted_entries_max,
    # 4,096, and uncommitted_bytes_max, 64 MiB) clients' requests that decide (CreateTopic,
    # InitProducerId, ...; in the group quorum, members' writes: commits, joins, the leader's
    # sync, ...) may fill; past it such a request is BUSY at once. A proposal past the whole bound
    # is refused, and the voter then drops its coordinator, refuses every answer it held and
    # rebuilds it from the committed map: a burst of 4,097 InitProducerId did that, and metadata
    # named no partition's leader until the replicas reported again (5,000 commits: every member
    # answered NOT_COORDINATOR). The rest is the cluster's own (heartbeats, ISR changes,
    # elections, expiring sessions and locks).
    controller_client_uncommitted_percent: int = 50

    # --- coordinator ---------------------------------------------------------------------
    topics_max: int = 10_000
    # Topic names a producer wants metadata for, keeps metadata of, and names in one metadata
    # request (actors/producer_metadata.py); the topics it has batches for go first. Every name a
    # user sent to was kept and asked for 20 times a second for ever, and past `topics_max` names
    # the controller refused every request, so the producer never again learned a leader. A
    # producer writes to a handful of topics; a thousand names of at most 255 characters (longer
    # ones can be no topic) are a request of ~260 KB at most, a tenth of the names a controller takes.
    # A producer uses the lower of this and `topics_max`.
    client_metadata_topics_max: int = 1000
    # Deleted topics remembered by id (~40 bytes each), so a node agent deletes only the data of a
    # topic recorded as deleted; the oldest are forgotten past this many (a forgotten tombstone
    # can only leave an old directory on disk, never delete live data).
    tombstones_max: int = 10_000
    # Every replica is its own process (what makes `kill -9` of one replica real): a partition
    # costs a process on each of its replicas' nodes, ~15-30 MB each. 1,000 partitions is more than
    # one machine can run as processes; the per-node bound below is what really applies. At most
    # 10,000 (`PARTITIONS_PER_TOPIC_CEILING`), the most a client takes in a topic.
    partitions_per_topic_max: int = 1000
    # Replica processes one node may be asked to run, over all topics: 250 x ~30 MB is ~7.5 GB per
    # node, what a machine that also runs two more nodes can take. A create that would pass it is
    # refused with LIMIT_REACHED, so no single request asks for tens of thousands of processes.
    replica_processes_per_node_max: int = 250
    # The smallest segments a topic may ask for. A segment costs its replica a file and ~1.2 KB of
    # memory (its index, its place in the log) whatever it holds: with `segment_bytes=1`, or
    # `segment_ms=1` and a batch each millisecond, every batch had its own, and 20,000 batches of
    # 40 bytes took 20,002 files, 81 MB of disk and 25 MB of memory (64 MiB segments: 3 files,
    # 2 MB, 0.4 MB); a million small batches, a million files and ~1.2 GB on every replica. Kafka 4
    # refuses segment.bytes under 1 MB and Kafka 5 segment.ms under a minute (KIP-1030), the same.
    topic_segment_bytes_min: int = 1024 * 1024
    # The largest: retention deletes whole closed segments only, so a topic keeps up to a segment
    # past its `retention_bytes`; with `segment_bytes` 2**62 (and `segment_ms` as large) none ever
    # closed and a topic of `retention_bytes` 1 MiB grew until its disk was full. Kafka's
    # segment.bytes is an int32: this is its largest.
    topic_segment_bytes_max: int = 2**31 - 1
    # The same for time: with a segment rolled at most once a minute, a slow writer makes at most
    # 1,440 segments a day (Kafka 5's least segment.ms).
    topic_segment_ms_min: int = 60_000
    # Kafka allows 249 characters. A replica's directory here is `<topic>-<partition>-<topic id
    # in hex, up to 16 digits>`, and a file name holds at most 255 bytes (NAME_MAX): with 1,000
    # partitions that leaves 234 (checked below against `partitions_per_topic_max`).
    topic_name_length_max: int = 234

    # --- tracing -------------------------------------------------------------------------
    # trace.jsonl is rotated past this size, keeping `trace_files_kept` older files: a busy
    # cluster writes ~1 MB a minute of traces, so four files hold hours, bounded on any disk.
    trace_file_bytes_max: int = 64 * 1024 * 1024
    trace_files_kept: int = 3

    # --- groups (coordinator side) -------------------------------------------------------
    group_session_timeout_min_ms: int = 100
    group_session_timeout_max_ms: int = 300_000
    # How long a rebalance waits for a member to join again (its `rebalance_timeout_ms`, Kafka's
    # max.poll.interval.ms): one of 2**62 ms held its group's rebalances open for as long as it
    # kept heartbeating without joining. An hour is longer than a poll loop should take.
    group_rebalance_timeout_max_ms: int = 3_600_000
    group_members_max: int = 1000
    # Bytes of members (ids, subscription metadata, assignment; actors/group_membership_budget.py):
    # one member, one group and every group of the coordinator (share groups' members, their ids
    # and subscriptions, have a budget of the same size of their own). A stable group is stored
    # as one record, proposed as one entry of the group quorum's Raft log (`entry_bytes_max`,
    # 1 MiB, as Kafka's group metadata must fit one 1 MB record): with the record's own overhead,
    # the largest group these admit fits (tests/unit/test_group_limits.py). Beyond them a join,
    # a leader's assignments or a share member's heartbeat get LIMIT_REACHED.
    group_member_bytes_max: int = 256 * 1024
    # Assignors one member names in a join (a consumer names a handful): choosing the group's
    # protocol compares every name with every member's, and 6,000 names each (three members) made
    # one rebalance 2.8 s of the coordinator's CPU. Beyond it: INVALID_REQUEST.
    group_protocols_max: int = 32
    group_membership_bytes_max: int = 768 * 1024
    groups_membership_bytes_max: int = 64 * 1024 * 1024
    # Classic groups per coordinator (members or commits make one): each costs its membership and
    # offsets in memory and in the state journal; a client inventing group ids stops here.
    groups_max: int = 1000
    # Partitions with a committed offset per group: a group reading every partition of 100
    # topics of 100 partitions fits; commits for invented topics stop here.
    group_offsets_max: int = 10_000
    # Bytes of committed offsets over all groups (topic names and metadata strings are what
    # costs): 64 MiB in memory and the same in the journal, whatever clients commit.
    group_offsets_bytes_max: int = 64 * 1024 * 1024
    # ... and in one group: an OffsetFetch or DescribeGroup for all of them is one answer, which
    # must stay under the 32 MiB a client decodes (frame_bytes_max). 10,000 partitions with 4 KiB
    # of metadata each made a 44 MB answer nobody could read.
    offset_bytes_per_group_max: int = 16 * 1024 * 1024
    # Bytes of offsets one commit request stores (LIMIT_REACHED: commit in smaller requests). Its
    # offsets commit together: one entry of the group quorum's Raft log (at most 1 MiB), or the
    # parts of one step past that (actors/replicated_state.py); this keeps one request's step small.
    group_commit_bytes_max: int = 768 * 1024
    # A new group waits this long for more members before the first rebalance completes
    # (Kafka's group.initial.rebalance.delay.ms is 3 s; short here so tests stay fast).
    group_initial_rebalance_delay_ms: int = 100
    offset_metadata_length_max: int = 4096

    # --- share groups --------------------------------------------------------------------
    # In-flight (acquired or available-for-redelivery) records per share-partition (KIP-932's
    # group.share.partition.max.record.locks is 200; more lets many members share one partition).
    share_records_in_flight_max: int = 2000
    # The same over every share-partition of the coordinator: 10,000 share-partitions of 2,000
    # would be 20 million records (~250 bytes each, and up to 1 KiB of error text). Past it an
    # acquire gets only redeliveries, until records complete.
    share_records_in_flight_total_max: int = 100_000
    # ... and over the share-partitions of one group: a group holding its records (an hour's
    # visibility timeout, 100 attempts) took the whole bound above, and every other group got only
    # redeliveries. Each holds at most this many (~5 MB, with their error text); a group reading
    # five partitions fills their windows.
    share_records_in_flight_per_group_max: int = 10_000
    # ... of which every group may hold this many whatever the others hold. Anyone may make share
    # groups, and ten holding their most took the whole bound: an eleventh got nothing new until
    # their records completed. The coordinator keeps this many aside for each of the
    # `share_groups_max` groups it may have (20,000 of 100,000); the groups share the rest, which
    # eight holding their most fill. 0: nothing kept aside.
    share_records_in_flight_reserved_per_group: int = 20
    share_fetch_records_max: int = 500
    # Share groups and their members per coordinator (KIP-932's group.share.max.groups is 10 and
    # group.share.max.size 200); each group costs its share-partitions' state in memory and on disk.
    share_groups_max: int = 1000
    share_group_members_max: int = 200
    # Distinct topic names share members subscribe to, over every share group. Each metadata
    # request of the coordinator gathers them to ask for them in turn: 100 members naming 10,000
    # invented names each (4 MB, within `groups_membership_bytes_max`) made every such request
    # 0.9 s of the process every group shares, and one goes every 50 ms while a name is wanted.
    # Every topic there may be (`topics_max`) and as many names that are no topic yet; a heartbeat
    # naming more is LIMIT_REACHED.
    share_subscribed_topics_max: int = 20_000
    # Share-partitions (group, topic, partition) per coordinator: each holds up to
    # `share_records_in_flight_max` records in memory.
    share_partitions_max: int = 10_000
    # The visibility timeout a group may ask for (KIP-932's record lock duration is 15 s..1 h,
    # default 30 s; the floor is lower here so tests of expiry run in a fraction of a second). At
    # most 24 h (`SHARE_LOCK_CEILING_MS`), the longest lock a member believes.
    share_visibility_timeout_min_ms: int = 100
    share_visibility_timeout_max_ms: int = 3_600_000
    # KIP-932 caps group.share.delivery.count.limit at 10; a queue user retrying with backoff may
    # want more, and every attempt costs only one counter per record.
    share_delivery_attempts_max: int = 100
    # A release may delay redelivery by at most this: longer waits belong in a delay topic, not in
    # a lock table that holds the share-partition's start offset back meanwhile.
    share_release_delay_max_ms: int = 3_600_000
    # The error text kept per record (the dead-letter header `railmq.dlq.last_error`); longer text
    # is cut, so a chatty stack trace cannot bloat the coordinator's state. A share-partition is
    # stored as one record, one entry of the group quorum's Raft log (at most 1 MiB): with every
    # record in flight released with its own text, 1 KiB each made ~2.1 MB, which the quorum
    # refused; 256 bytes make ~0.6 MB (tests/unit/test_share_partition.py).
    share_error_text_bytes_max: int = 256
    # Bytes of in-flight ranges one DescribeSharePartitions answer holds, and of members'
    # partitions one share group's DescribeGroup lists; past it a partition or a member says how
    # many it leaves out. Each record released with its own text is a range of its
    # own: 100,000 records in flight, held by a member with a 200-character client id, made an
    # answer of 56 MB, past the 32 MiB frame a client decodes.
    share_describe_bytes_max: int = 8 * 1024 * 1024
    # Acknowledgement ranges in one request (a member acknowledges at most what it holds).
    share_acknowledgements_per_request_max: int = 2000
    # Acquires waiting for records (long poll) over the whole coordinator. Beyond it: BUSY.
    share_acquires_parked_max: int = 1000
    share_acquire_wait_max_ms: int = 30_000
    # While acquires wait for new records, the coordinator re-reads the partition's high watermark
    # (a ListOffsets long poll at the leader: answered when it moves) at most this often.
    share_high_watermark_refresh_ms: int = 20
    # A share-partition with records still to take (behind the high watermark it last read) reads
    # its leader's log start again at most this often: retention moves it (checked every 5 s at a
    # replica), and the offsets below it are forgotten, not handed out. Read only once caught up,
    # a group with a backlog never saw it move: it handed out offsets the log no longer held,
    # which members dropped and which came back after each visibility timeout until their
    # attempts ran out. One ListOffsets per partition this often costs little.
    share_log_start_refresh_ms: int = 5000
    # Requests the coordinator sends (metadata, ListOffsets, Fetch, Produce) are given up and
    # retried after this long without an answer.
    share_request_timeout_ms: int = 5000
    # Records in one dead-letter write, dead-letter writes in flight (at most one per dead-letter
    # partition, so the idempotent producer's sequence numbers stay in order) and the bytes one
    # fetch of source records may return.
    share_dead_letter_batch_records_max: int = 100
    share_dead_letter_writes_max: int = 64
    share_dead_letter_fetch_bytes_max: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        from actors.limit_rules import limit_problems  # the rules read this module's names

        problems = limit_problems(self)
        if problems:
            raise ValueError("; ".join(problems))


FILE_NAME_BYTES_MAX = 255  # NAME_MAX of Linux file systems
TOPIC_ID_HEX_DIGITS = 16  # a topic id is below 2**64


DEFAULT_LIMITS = Limits()
