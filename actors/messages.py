"""The wire contract: every message any railmq actor or client sends, as msgspec Structs.

All messages form one tagged union (the `type` field carries the class name). On the wire a
message is one ZeroMQ multipart message: frame 0 is the MessagePack encoding of the Struct with
its bulk fields left empty, and each field named in the class's `PAYLOAD_FIELDS` travels as its
own frame, in that order, so a megabyte of record batches is never copied through MessagePack.
`transport/codec.py` does the framing; `docs/protocol.md` documents it for other languages.

Rules this file keeps:
- every request has a `correlation_id`, echoed by its response;
- every response has `error` (an `ErrorCode` value, 0 = none) and `error_message` (a sentence);
- error codes are plain ints on the wire so an unknown future code still decodes;
- fields are added with defaults, never renamed, so older peers keep decoding.

Internal messages (timers, client commands) are in `INTERNAL_TYPES` and are refused if they
arrive from the network.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from actors.wire_bounds import LONG, SETTINGS, SHORT, Names, NodeIds, PartitionKeys, Settings

# Offsets, timestamps and durations travel as int64s (Kafka's); msgpack carries no larger int.
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1  # leader epochs (the batch header's width)
# Correlation ids are non-negative 63-bit integers (0 marks an unsolicited push, -1 "unknown" in
# an ErrorResponse); a peer's id outside that range is never echoed back.
CORRELATION_ID_MAX = INT64_MAX
# A host identity (`<hostname>/<boot id>`, ~100 characters) or a shared-memory ring's name (30):
# short by nature. A fetch with nothing to return is kept whole while it waits at the leader, so
# 1,000 fetches naming a 1 MiB host held 1 GB of a leader; longer is INVALID_REQUEST at decode.
SHORT_TEXT_CHARS_MAX = 255
ShortText = Annotated[str, msgspec.Meta(max_length=SHORT_TEXT_CHARS_MAX)]


class Message(msgspec.Struct, tag_field="type", tag=True, omit_defaults=True, kw_only=True):
    """Base of every wire message. `PAYLOAD_FIELDS` name bytes fields sent as separate frames."""

    PAYLOAD_FIELDS: ClassVar[tuple[str, ...]] = ()


# --------------------------------------------------------------------------- shared records


class TopicConfig(msgspec.Struct, omit_defaults=True, kw_only=True, frozen=True):
    """Per-topic settings, fixed at creation (Kafka's topic configs, units in the names)."""

    min_insync_replicas: int = 1
    retention_ms: int | None = 7 * 24 * 3600 * 1000
    retention_bytes: int | None = None
    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    flush_policy: str = "never"  # "every_batch" | "interval" | "never"
    flush_interval_ms: int = 1000
    unclean_leader_election: bool = False
    batch_bytes_max: int = 8 * 1024 * 1024


class StorageReport(msgspec.Struct, omit_defaults=True, kw_only=True, frozen=True):
    """What a replica knows of its own disk (storage/replica_meta.py), in every heartbeat."""

    state: str = "ok"  # "ok" | "new" (empty directory) | "damaged" | "repairing" (damaged, re-fetching)
    clean_shutdown: bool = False  # this process found the directory closed cleanly by the last one
    damage: list[tuple[int, int]] = []  # offset ranges lost or refused as corrupt; end -1: unknown
    detail: str = ""  # a sentence for `topics describe`
    last_epoch: int = -1  # the leader epoch of the last batch it holds


class ReplicaInfo(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What the coordinator last heard from one replica of a partition."""

    node: int
    endpoint: str = ""
    pid: int = 0
    alive: bool = False
    log_start_offset: int = 0
    log_end_offset: int = 0
    high_watermark: int = 0
    storage: StorageReport = StorageReport()


class PartitionState(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The coordinator's authoritative view of one partition (Kafka's LeaderAndIsr)."""

    topic: str
    topic_id: int = 0
    partition: int
    leader: int = -1  # node id, -1 when offline
    leader_endpoint: str = ""
    leader_epoch: int = 0
    partition_epoch: int = 0  # bumps on every ISR or leader change (KIP-497)
    # The process incarnation that was elected (0: not yet known, a brand-new partition): a later
    # process of the same node that gets this state (a late answer) must not lead in its epoch.
    leader_incarnation: int = 0
    replicas: list[int] = []
    isr: list[int] = []
    # The process incarnation of each ISR member as it joined (aligned with `isr`; 0: not known yet):
    # a leader counts follower fetches of an ISR member only from that process (a replaced process
    # that resumes is answered STALE_BROKER_EPOCH). Empty: none known.
    isr_incarnations: list[int] = []
    config: TopicConfig = TopicConfig()
    # The latest leader epoch that began with an unclean election: a follower may truncate below
    # the high watermark it had seen only when this is newer than the epoch it saw it in.
    last_unclean_epoch: int = -1


class PartitionMetadata(msgspec.Struct, omit_defaults=True, kw_only=True):
    partition: int
    leader: int = -1
    leader_endpoint: str = ""
    leader_epoch: int = 0
    partition_epoch: int = 0
    replicas: list[int] = []
    isr: list[int] = []
    replica_info: list[ReplicaInfo] = []
    error: int = 0
    offline_reason: str = ""  # why the partition has no leader, when it has none
    eligible_leader_replicas: list[int] = []  # KIP-966: out of the ISR, but holding every acknowledged write


class TopicMetadata(msgspec.Struct, omit_defaults=True, kw_only=True):
    name: str
    topic_id: int = 0
    error: int = 0
    error_message: str = ""
    config: TopicConfig = TopicConfig()
    partitions: list[PartitionMetadata] = []


class EpochEndOffset(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Where a leader epoch ends in the leader's log (KIP-101/KIP-279)."""

    epoch: int
    end_offset: int


class ReplicaAssignment(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One replica a node should run (the supervisor reconciles its processes with this list)."""

    topic: str
    topic_id: int = 0
    partition: int
    node: int
    config: TopicConfig = TopicConfig()
    replicas: list[int] = []  # the partition's replica list, recorded in the replica's directory


# --------------------------------------------------------------------------- errors


class ErrorResponse(Message, kw_only=True):
    """The reply to a frame that could not be decoded or a message nobody handles here."""

    correlation_id: int = -1
    error: int
    error_message: str = ""
    # NOT_CONTROLLER: the active controller this voter knows of (0 and "": an election is under way)
    controller_id: int = 0
    controller_endpoint: str = ""


# --------------------------------------------------------------------------- admin and metadata


class CreateTopicRequest(Message, kw_only=True):
    correlation_id: int
    name: str
    partitions: int
    replication_factor: int = 1
    # TopicConfig's settings by name, the others at their defaults. A map, not a TopicConfig: a
    # name the coordinator does not know, or a value of another type, is refused INVALID_CONFIG
    # naming it, where a struct's decoder dropped unknown names without a word.
    config: Settings = {}  # TopicConfig's settings by name; unknown or mistyped: INVALID_CONFIG


class CreateTopicResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    topic: TopicMetadata | None = None


class DeleteTopicRequest(Message, kw_only=True):
    correlation_id: int
    name: str


class DeleteTopicResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""


class AlterTopicConfigRequest(Message, kw_only=True):
    """Change a topic's settings that may change after creation (Kafka's IncrementalAlterConfigs):
    `retention_ms`, `retention_bytes`, `min_insync_replicas`, `unclean_leader_election`. Only the
    keys present change; a null value for a retention setting means "no limit". A request that
    changes nothing is answered with the settings as they are, and nothing is stored or announced."""

    correlation_id: int
    name: str
    changes: Annotated[dict[str, int | bool | None], SETTINGS] = {}


class AlterTopicConfigResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    config: TopicConfig | None = None  # the topic's settings after the change


class CreatePartitionsRequest(Message, kw_only=True):
    correlation_id: int
    name: str
    total_partitions: int


class CreatePartitionsResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""


class MetadataRequest(Message, kw_only=True):
    correlation_id: int
    topics: Names | None = None  # None: every topic


class MetadataResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    topics: list[TopicMetadata] = []
    group_coordinator_endpoint: str = ""
    group_coordinator_incarnation: int = 0  # of the process at that endpoint: a restarted one is new
    nodes: list[int] = []
    cluster_id: str = ""
    controller_id: int = 0  # the active controller that answered (0: a single coordinator)
    controller_endpoints: list[str] = []  # every voter of the quorum, so a client can find the next leader


class InitProducerIdRequest(Message, kw_only=True):
    correlation_id: int


class InitProducerIdResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    producer_id: int = -1
    producer_epoch: int = 0
    # Only this producer's: a batch naming producer_id is taken only with it (actors/client_secrets.py).
    producer_secret: bytes = b""


# --------------------------------------------------------------------------- control plane


class ReplicaHeartbeat(Message, kw_only=True):
    """A replica's proof of life and position, every `replica_heartbeat_interval_ms`."""

    correlation_id: int = 0
    topic: str
    topic_id: int = 0
    partition: int
    node: int
    endpoint: str
    pid: int
    incarnation: int  # random per process start: a new value means the replica restarted
    leader_epoch: int = -1  # the epoch this replica last learned
    partition_epoch: int = -1
    log_start_offset: int = 0
    log_end_offset: int = 0
    high_watermark: int = 0
    storage: StorageReport = StorageReport()
    # A follower: the leader endpoint it fetches from ("" while it knows none). The coordinator
    # sends the state again when that is not the leader's, whatever the epochs say.
    leader_endpoint: str = ""


class ReplicaHeartbeatResponse(Message, kw_only=True):
    correlation_id: int = 0
    error: int = 0
    error_message: str = ""
    state: PartitionState | None = None  # set when the replica's view is stale
    deleted: bool = False  # the topic is gone: the replica should stop


class AlterIsrRequest(Message, kw_only=True):
    """The leader asks the coordinator to change the ISR (KIP-497 AlterPartition)."""

    correlation_id: int
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    isr: NodeIds
    isr_incarnations: NodeIds = []  # the incarnation the leader saw fetching, per isr entry


class AlterIsrResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    state: PartitionState | None = None


class ServiceHeartbeat(Message, kw_only=True):
    """A non-replica actor (the group coordinator) announcing its endpoint."""

    correlation_id: int = 0
    role: str
    endpoint: str
    pid: int
    incarnation: int


class ServiceHeartbeatResponse(Message, kw_only=True):
    correlation_id: int = 0
    error: int = 0
    error_message: str = ""


class NodeAssignmentsRequest(Message, kw_only=True):
    """The supervisor asks which replicas its nodes should run."""

    correlation_id: int
    nodes: NodeIds


class NodeAssignmentsResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    replicas: list[ReplicaAssignment] = []
    # Topic ids the coordinator has recorded as deleted (tombstones): the only data a node agent
    # may delete. A replica merely missing from `replicas` is stopped, never deleted.
    deleted_topic_ids: list[int] = []
    cluster_id: str = ""


class ReplicaLiveness(msgspec.Struct, kw_only=True):
    """A node agent's word on one of its replica processes."""

    topic: str
    partition: int
    node: int
    incarnation: int
    responsive: bool = True  # it reported within `replica_keepalive_timeout_ms`


class NodeHeartbeat(Message, kw_only=True):
    """A node agent's heartbeat for all the replicas of its nodes, every
    `replica_heartbeat_interval_ms` (Kafka's BrokerHeartbeat): which replica processes live and
    answer, the reports that changed since the last one, and which assignments it has. An agent
    numbers its heartbeats upwards (`correlation_id`): the coordinator ignores one numbered at or
    below the last it took from the same agent, a delayed or duplicated copy."""

    correlation_id: int
    nodes: list[int]
    replicas: list[ReplicaLiveness] = []
    reports: list[ReplicaHeartbeat] = []  # changed since the last heartbeat (all of them when asked)
    assignments_version: str = ""  # of the assignments it runs; "" before it has any
    agent_id: str = ""  # the agent process, new at every start (Kafka's incarnation id): one agent runs a node
    leaving: bool = False  # the agent's last word as it stops: its nodes are free at once


class NodeHeartbeatResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    cluster_id: str = ""
    assignments_version: str = ""
    # Set only when `assignments_version` differs from the heartbeat's: the replicas the nodes
    # should run, and the deleted topic ids (as in NodeAssignmentsResponse).
    assignments: list[ReplicaAssignment] | None = None
    deleted_topic_ids: list[int] = []
    full_report_wanted: bool = False  # the coordinator lacks some replica's report (it restarted)


class ControllerStatusRequest(Message, kw_only=True):
    """Any tool -> one controller: how do you stand in the quorum? (`railmq cluster info`)"""

    correlation_id: int


class ControllerStatusResponse(Message, kw_only=True):
    """One voter's view of the quorum (RaftNode.status): its role and term, whom it follows, its
    commit and applied index, and, on the leader, each follower's match index (so its lag)."""

    correlation_id: int
    error: int = 0
    error_message: str = ""
    node: int = 0
    endpoint: str = ""
    pid: int = 0
    role: str = ""
    term: int = 0
    leader: int = 0
    leader_endpoint: str = ""
    commit_index: int = 0
    applied_index: int = 0
    last_index: int = 0
    active: bool = False  # leads and has applied its own term's no-op: it decides
    rejoining: bool = False  # lost its log and is not yet caught up: it neither votes nor campaigns
    followers: dict[int, int] = {}  # leader only: voter -> match index
    voters: dict[int, str] = {}


class ReplicaExited(Message, kw_only=True):
    """The supervisor saw a replica process exit: faster than waiting for the session timeout."""

    correlation_id: int = 0
    topic: str
    partition: int
    node: int
    incarnation: int


# --------------------------------------------------------------------------- data plane


class ProduceRequest(Message, kw_only=True):
    PAYLOAD_FIELDS: ClassVar[tuple[str, ...]] = ("batch",)

    correlation_id: int
    topic: str
    partition: int
    topic_id: int = 0  # the topic id from metadata; 0: unchecked (older clients)
    acks: int = 1  # 0: no reply, 1: leader appended, -1: all in-sync replicas have it
    timeout_ms: int = 30_000
    batch: bytes = b""  # one record batch (storage/batch.py), its own frame (a buffer once received)
    # A batch naming a producer id: the secret InitProducerId handed out with it (actors/client_secrets.py).
    producer_secret: bytes = b""


class ProduceResponse(Message, kw_only=True):
    correlation_id: int
    topic: str = ""
    partition: int = -1
    error: int = 0
    error_message: str = ""
    base_offset: int = -1
    last_offset: int = -1
    leader_epoch: int = -1
    log_start_offset: int = 0


class FetchRequest(Message, kw_only=True):
    correlation_id: int
    topic: str
    partition: int
    topic_id: int = 0  # the topic id from metadata; 0: unchecked (older clients)
    offset: int
    max_bytes: int = 1024 * 1024
    max_wait_ms: int = 500
    min_bytes: int = 1  # wait (up to max_wait_ms) until this many bytes of whole batches are there
    leader_epoch: int = -1  # the epoch the fetcher believes current (KIP-320); -1: unchecked
    replica: int = -1  # the follower's node id; -1 for consumers
    last_fetched_epoch: int = -1  # followers: epoch of the last batch they hold (KIP-595 style)
    incarnation: int = 0  # followers: their process incarnation
    ring: ShortText = ""  # a shared-memory ring the fetcher reads; the answer's records may come through it
    ring_key: int = 0  # the key in that ring's header: proves the fetcher can map it (transport/ring_link.py)
    host: ShortText = ""  # the fetcher's host identity: a ring is only usable on the same host
    repairing: bool = False  # followers: re-fetching data their disk lost (not ready for the ISR)
    # Followers: the high watermark they know. A parked follower fetch is answered as soon as the
    # leader's has moved past it, so followers learn it at once rather than at the wait's end.
    high_watermark: int = -1


class FetchResponse(Message, kw_only=True):
    PAYLOAD_FIELDS: ClassVar[tuple[str, ...]] = ("records",)

    correlation_id: int
    topic: str = ""
    partition: int = -1
    error: int = 0
    error_message: str = ""
    high_watermark: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0
    leader_epoch: int = -1
    diverging_epoch: EpochEndOffset | None = None
    ring_bytes: int = -1  # >= 0: the records (that many bytes) were written to the request's ring
    records: bytes = b""  # concatenated whole batches, its own frame (a buffer once received)


class ListOffsetsRequest(Message, kw_only=True):
    correlation_id: int
    topic: str
    partition: int
    topic_id: int = 0  # the topic id from metadata; 0: unchecked (older clients)
    timestamp_ms: int  # -2: earliest, -1: latest (high watermark), otherwise a time
    leader_epoch: int = -1  # the epoch the caller believes current, checked as a fetch's is; -1: unchecked
    # A long poll, for latest only: the leader answers once its high watermark passes
    # `wait_past_offset`, or when `max_wait_ms` (capped by fetch_wait_max_ms) has passed.
    wait_past_offset: int = -1
    max_wait_ms: int = 0


class ListOffsetsResponse(Message, kw_only=True):
    correlation_id: int
    topic: str = ""  # the partition this answers for, so a client can check the echo
    partition: int = -1
    error: int = 0
    error_message: str = ""
    offset: int = -1
    timestamp_ms: int = -1
    leader_epoch: int = -1
    log_start_offset: int = 0
    high_watermark: int = 0
    log_end_offset: int = 0


# --------------------------------------------------------------------------- consumer groups
# Kafka's classic group protocol: JoinGroup / SyncGroup / Heartbeat / LeaveGroup, with the
# assignment computed by the group's leader member and relayed by the group coordinator, and
# committed offsets fenced by generation (KIP-345 static membership via group_instance_id).


class GroupProtocol(msgspec.Struct, omit_defaults=True, kw_only=True):
    name: str  # assignor name: "range" | "round-robin" | "cooperative-sticky"
    metadata: bytes = b""  # msgpack of actors.assignors.Subscription


class GroupMember(msgspec.Struct, omit_defaults=True, kw_only=True):
    member_id: str
    group_instance_id: str | None = None
    metadata: bytes = b""


class MemberAssignment(msgspec.Struct, omit_defaults=True, kw_only=True):
    member_id: str
    assignment: bytes = b""  # msgpack of actors.consumer_member.Assignment


class ConsumerAssignment(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What a consumer-group leader gives each member (the bytes of MemberAssignment.assignment)."""

    partitions: PartitionKeys = []
    user_data: bytes = b""


class JoinGroupRequest(Message, kw_only=True):
    correlation_id: int
    group_id: str
    member_id: str = ""
    member_secret: bytes = b""  # the secret the member's join answer gave it (actors/client_secrets.py)
    group_instance_id: str | None = None
    client_id: str = ""
    session_timeout_ms: int = 10_000
    rebalance_timeout_ms: int = 300_000
    protocol_type: str = "consumer"
    protocols: Annotated[list[GroupProtocol], SHORT] = []
    reason: str = ""


class JoinGroupResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    generation: int = -1
    protocol_name: str = ""
    leader: str = ""
    member_id: str = ""
    member_secret: bytes = b""  # only this member's: it carries it in every later request
    members: list[GroupMember] = []  # only for the leader


class SyncGroupRequest(Message, kw_only=True):
    correlation_id: int
    group_id: str
    generation: int
    member_id: str
    member_secret: bytes = b""  # the secret the member's join answer gave it (actors/client_secrets.py)
    group_instance_id: str | None = None
    assignments: Annotated[list[MemberAssignment], LONG] = []  # only from the leader


class SyncGroupResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    assignment: bytes = b""


class HeartbeatRequest(Message, kw_only=True):
    correlation_id: int
    group_id: str
    generation: int
    member_id: str
    member_secret: bytes = b""  # the secret the member's join answer gave it (actors/client_secrets.py)
    group_instance_id: str | None = None


class HeartbeatResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""


class LeaveGroupRequest(Message, kw_only=True):
    correlation_id: int
    group_id: str
    member_id: str
    member_secret: bytes = b""  # the secret the member's join answer gave it (actors/client_secrets.py)
    group_instance_id: str | None = None
    reason: str = ""


class LeaveGroupResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""


class OffsetEntry(msgspec.Struct, omit_defaults=True, kw_only=True):
    topic: str
    partition: int
    offset: int  # the next offset to consume (Kafka's convention)
    metadata: str = ""
    commit_timestamp_ms: int = -1
    error: int = 0
    # The leader epoch the offset was read under (KIP-320; -1: unknown). A consumer starting from
    # it fetches with metadata no older than that epoch, never at a deposed leader.
    leader_epoch: int = -1
    # The id of the topic the offset was read from (0: unknown). A topic deleted and made again
    # under the same name has another id: the old offsets mean nothing in it, and a consumer
    # starts there from auto_offset_reset instead.
    topic_id: int = 0


class OffsetCommitRequest(Message, kw_only=True):
    correlation_id: int
    group_id: str
    generation: int = -1  # -1 with member_id "": an admin commit, only for a group with no members
    member_id: str = ""
    member_secret: bytes = b""  # the secret the member's join answer gave it (actors/client_secrets.py)
    group_instance_id: str | None = None
    offsets: Annotated[list[OffsetEntry], LONG] = []


class OffsetCommitResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    offsets: list[OffsetEntry] = []  # per-partition results


class OffsetFetchRequest(Message, kw_only=True):
    correlation_id: int
    group_id: str
    partitions: PartitionKeys | None = None  # None: every partition with a commit


class OffsetFetchResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    offsets: list[OffsetEntry] = []


class GroupSummary(msgspec.Struct, omit_defaults=True, kw_only=True):
    group_id: str
    kind: str = "classic"  # "classic" | "share"
    state: str = "Empty"
    protocol_type: str = "consumer"
    members: int = 0


class ListGroupsRequest(Message, kw_only=True):
    correlation_id: int


class ListGroupsResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    groups: list[GroupSummary] = []


class MemberDescription(msgspec.Struct, omit_defaults=True, kw_only=True):
    member_id: str
    group_instance_id: str | None = None
    client_id: str = ""
    assignment: list[tuple[str, int]] = []
    assignment_omitted: int = 0  # share groups: partitions left out (the answer's byte bound)
    last_heartbeat_ms_ago: int = 0
    session_timeout_ms: int = 0


class DescribeGroupRequest(Message, kw_only=True):
    correlation_id: int
    group_id: str


class DescribeGroupResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    group_id: str = ""
    kind: str = "classic"
    state: str = "Dead"
    protocol_name: str = ""
    generation: int = -1
    leader: str = ""
    members: list[MemberDescription] = []
    offsets: list[OffsetEntry] = []


class OffsetDeleteRequest(Message, kw_only=True):
    """Forget a group's committed offsets for some partitions (Kafka's OffsetDelete): only while
    no member of the group is running."""

    correlation_id: int
    group_id: str
    partitions: PartitionKeys = []


class OffsetDeleteResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    deleted: list[tuple[str, int]] = []  # the partitions that had a commit, now forgotten


class DeleteGroupRequest(Message, kw_only=True):
    correlation_id: int
    group_id: str


class DeleteGroupResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""


# --------------------------------------------------------------------------- share groups
# KIP-932 share groups: every member of a share group reads every partition of its topics. Each
# record a member acquires is locked to it until the group's visibility timeout passes (renewable);
# the member answers each record with accept, release (redeliver now or after a delay) or reject
# (dead-letter it now). The group coordinator keeps the share-partition state (delivery counts,
# locks, the share-partition start offset); record bytes go from the partition leader to the
# member with the ordinary FetchRequest. Offsets in ranges are inclusive at both ends.


class ShareGroupSettings(msgspec.Struct, omit_defaults=True, kw_only=True, frozen=True):
    """A share group's settings: the first member's join fixes them; later members get them back."""

    visibility_timeout_ms: int = 30_000  # how long an acquired record stays locked to its member
    max_delivery_attempts: int = 5  # a record delivered this often and not accepted is dead-lettered
    dead_letter_topic: str = ""  # "" means "<source topic>.dlq"
    auto_offset_reset: str = "earliest"  # where a new share-partition starts: "earliest" | "latest"


class ShareGroupHeartbeatRequest(Message, kw_only=True):
    correlation_id: int
    group_id: str
    member_id: str = ""  # "" to join
    member_secret: bytes = b""  # the secret the member's join answer gave it (actors/client_secrets.py)
    client_id: str = ""
    topics: Names = []
    session_timeout_ms: int = 10_000
    settings: ShareGroupSettings = ShareGroupSettings()  # used by the join that creates the group
    leaving: bool = False  # the member leaves: every lock it holds is released


class ShareGroupHeartbeatResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    member_id: str = ""
    member_secret: bytes = b""  # only this member's: it carries it in every later request
    partitions: PartitionKeys = []  # every partition of the member's topics
    heartbeat_interval_ms: int = 0  # the coordinator's advice: a third of the session timeout
    settings: ShareGroupSettings = ShareGroupSettings()


class AcquiredRecords(msgspec.Struct, omit_defaults=True, kw_only=True):
    first_offset: int
    last_offset: int
    delivery_count: int  # 1 on the first delivery


class ShareAcquireRequest(Message, kw_only=True):
    correlation_id: int
    group_id: str
    member_id: str
    member_secret: bytes = b""  # the secret the member's join answer gave it (actors/client_secrets.py)
    topic: str
    partition: int
    max_records: int = 500
    max_wait_ms: int = 0  # with nothing to acquire, wait up to this long for records (long poll)


class ShareAcquireResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    topic: str = ""
    partition: int = -1
    acquired: list[AcquiredRecords] = []
    lock_deadline_ms: int = 0  # wall-clock time at the coordinator when these locks expire
    # A leader of a topic deleted and made again under the name refuses a fetch naming this id.
    topic_id: int = 0  # the share-partition's topic id: fetch the records naming it; 0: not known


class ShareAcknowledgement(msgspec.Struct, omit_defaults=True, kw_only=True):
    first_offset: int
    last_offset: int
    kind: str = "accept"  # "accept" | "release" | "reject" | "renew"
    delay_ms: int = 0  # release: not redelivered before this much time has passed
    error: str = ""  # release / reject: why; kept as the record's last error (dead-letter header)
    # The delivery being answered (every record of the range was delivered this many times): an
    # answer to a delivery whose lock expired is refused even if the same member holds the record
    # again, since the newer delivery is still on its way to the user. 0: whatever is held now.
    delivery_count: int = 0


class ShareAcknowledgeRequest(Message, kw_only=True):
    correlation_id: int
    group_id: str
    member_id: str
    member_secret: bytes = b""  # the secret the member's join answer gave it (actors/client_secrets.py)
    topic: str
    partition: int
    acknowledgements: Annotated[list[ShareAcknowledgement], LONG] = []
    # An answer to records of a topic deleted and made again under its name settles nothing of
    # the new one, whose records sit at the same offsets.
    topic_id: int = 0  # of the topic the records were fetched from; another is UNKNOWN_TOPIC_ID; 0: unchecked


class ShareAcknowledgementResult(msgspec.Struct, omit_defaults=True, kw_only=True):
    first_offset: int
    last_offset: int
    error: int = 0  # INVALID_RECORD_STATE: the member does not hold these records (nothing changed)
    error_message: str = ""
    lock_deadline_ms: int = 0  # renew: the new deadline


class ShareAcknowledgeResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    topic: str = ""
    partition: int = -1
    results: list[ShareAcknowledgementResult] = []  # one per acknowledgement, in order


class ShareRecordRange(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Consecutive in-flight offsets in the same state."""

    first_offset: int
    last_offset: int
    state: str  # "available" | "acquired" | "accepted" | "dead-lettering" | "archived"
    delivery_count: int = 0
    member_id: str = ""  # the lock holder, for "acquired"
    last_error: str = ""


class SharePartitionDescription(msgspec.Struct, omit_defaults=True, kw_only=True):
    topic: str
    partition: int
    start_offset: int = -1  # the share-partition start offset (SPSO); -1 before the first acquire
    end_offset: int = -1  # the first offset never acquired yet
    high_watermark: int = -1  # as the coordinator last read it
    records: list[ShareRecordRange] = []  # the in-flight window [start_offset, end_offset)
    records_omitted: int = 0  # in-flight offsets at its end left out (the answer's byte bound)


class DescribeSharePartitionsRequest(Message, kw_only=True):
    correlation_id: int
    group_id: str


class DescribeSharePartitionsResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    group_id: str = ""
    settings: ShareGroupSettings = ShareGroupSettings()
    partitions: list[SharePartitionDescription] = []


# --------------------------------------------------------------------------- runtime-level
# Answered by the runtime that drives an actor, not by the actor: counters for operators and
# tests, and the fault switch the chaos harness uses to cut links without root.


class RuntimeStatsRequest(Message, kw_only=True):
    correlation_id: int


class RequestLatency(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One request type's time from arrival to answer (transport/request_timing.py)."""

    counts: list[int] = []  # per bucket of request_timing.BUCKETS_S, not cumulative; the last is above them
    sum_us: int = 0


class RuntimeStatsResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""
    actor: str = ""
    pid: int = 0
    counters: dict[str, int] = {}
    latency: dict[str, RequestLatency] = {}  # request type (Produce, Fetch, ...) -> its histogram


class LinkFault(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Drop or delay traffic with peers whose endpoint or name starts with one of `peers`."""

    peers: Annotated[list[str], SHORT]  # endpoint or actor-name prefixes; "*" matches everyone
    direction: str = "both"  # "in" | "out" | "both"
    drop_probability: float = 1.0
    delay_ms: int = 0


class FaultControlRequest(Message, kw_only=True):
    correlation_id: int
    links: Annotated[list[LinkFault], SHORT] = []  # replaces the runtime's current link faults
    disk_full: bool = False  # storage writes fail with DISK_FULL
    fail_next_fsync: bool = False  # the next fsync fails: the actor must crash


class FaultControlResponse(Message, kw_only=True):
    correlation_id: int
    error: int = 0
    error_message: str = ""


# --------------------------------------------------------------------------- internal


class TimerFired(Message, kw_only=True):
    """A timer an actor set has expired (never accepted from the network)."""

    name: str


class PeerDisconnected(Message, kw_only=True):
    """The connection to a peer endpoint dropped (the peer process died or closed its socket):
    requests in flight to it will never be answered. Never accepted from the network."""

    endpoint: str


class Stop(Message, kw_only=True):
    """The runtime is stopping the actor (graceful shutdown); never accepted from the network."""

    reason: str = ""


class SendBatch(Message, kw_only=True):
    """Producer shell -> producer actor: a sealed batch of records for one partition."""

    batch_id: int
    topic: str
    partition: int
    records: list = []  # RecordTuple list (storage/batch.py)
    first_timestamp_ms: int = 0
    max_timestamp_ms: int = 0
    deadline_ns: int = 0  # delivery timeout: fail the batch if not acknowledged by then


class RefreshMetadata(Message, kw_only=True):
    """Client shell -> client actor: fetch metadata for these topics now."""

    topics: list[str] = []


class ClientCommand(Message, kw_only=True):
    """Consumer shell -> consumer actor: an API call (assign, seek, commit, pause, ...)."""

    command: str
    arguments: dict = {}
    token: int = 0  # the shell's future to complete, 0 if none


INTERNAL_TYPES: frozenset[type] = frozenset({TimerFired, Stop, PeerDisconnected, SendBatch, RefreshMetadata, ClientCommand})


def all_message_types() -> list[type[Message]]:
    """Every concrete message class, in a stable order (for the codec and the docs)."""
    found: list[type[Message]] = []
    import actors.raft_messages  # noqa: F401 - the controller quorum's messages join the union

    pending = list(Message.__subclasses__())
    while pending:
        cls = pending.pop(0)
        if not cls.__dict__.get("ABSTRACT", False):
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda cls: cls.__name__)


def wire_message_types() -> list[type[Message]]:
    return [cls for cls in all_message_types() if cls not in INTERNAL_TYPES]
