"""Hand-written facts for docs/protocol.md that the code cannot state: routes and error meanings.

Used by docs/tools/protocol_example.py. `ROUTES` says who sends a message to whom; `ERROR_WHEN`
says, for every `ErrorCode`, when an actor answers with it and what a client should do. Keep
them true to the code (grep the code for the name before changing a sentence); the generator
marks a code missing here as "not described yet" and tests/unit/test_protocol_doc.py fails on it.
"""

from __future__ import annotations

ROUTES = {
    "ErrorResponse": "any actor → whoever sent an undecodable or unhandled message",
    "ControllerStatusRequest": "operator tool → any controller (every voter answers)",
    "RaftVoteRequest": "candidate controller → every other voter",
    "RaftVoteResponse": "voter → candidate",
    "RaftTimeoutNow": "active controller → the follower it hands leadership to",
    "RaftAppendRequest": "active controller → follower controller (entries or a heartbeat)",
    "RaftAppendResponse": "follower controller → active controller",
    "RaftSnapshotRequest": "active controller → a follower behind its compacted log",
    "CreateTopicRequest": "client → coordinator",
    "DeleteTopicRequest": "client → coordinator",
    "CreatePartitionsRequest": "client → coordinator",
    "AlterTopicConfigRequest": "client → coordinator",
    "MetadataRequest": "client → coordinator",
    "InitProducerIdRequest": "idempotent producer → coordinator",
    "ReplicaHeartbeat": "replica → its node agent (→ coordinator inside a NodeHeartbeat), or → coordinator",
    "ReplicaHeartbeatResponse": "coordinator → replica (also pushed unsolicited, correlation id 0)",
    "AlterIsrRequest": "leader replica → coordinator",
    "ServiceHeartbeat": "group coordinator → coordinator",
    "NodeAssignmentsRequest": "node agent → coordinator",
    "NodeHeartbeat": "node agent → coordinator",
    "ReplicaExited": "node agent → coordinator (no answer)",
    "ProduceRequest": "producer → partition leader",
    "FetchRequest": "consumer or follower → partition leader",
    "ListOffsetsRequest": "client → partition leader",
    "JoinGroupRequest": "member → group coordinator",
    "SyncGroupRequest": "member → group coordinator",
    "HeartbeatRequest": "member → group coordinator",
    "HeartbeatResponse": "group coordinator → member (also pushed unsolicited, correlation id 0)",
    "LeaveGroupRequest": "member → group coordinator",
    "OffsetCommitRequest": "member or admin → group coordinator",
    "OffsetFetchRequest": "client → group coordinator",
    "ListGroupsRequest": "client → group coordinator",
    "DescribeGroupRequest": "client → group coordinator",
    "DeleteGroupRequest": "client → group coordinator",
    "OffsetDeleteRequest": "client → group coordinator",
    "ShareGroupHeartbeatRequest": "share member → group coordinator",
    "ShareAcquireRequest": "share member → group coordinator",
    "ShareAcknowledgeRequest": "share member → group coordinator",
    "DescribeSharePartitionsRequest": "client → group coordinator",
    "RuntimeStatsRequest": "operator tool → any actor's runtime",
    "FaultControlRequest": "chaos harness → any actor's runtime",
}

ERROR_WHEN = {
    "NONE": "Success. Every response carries `error`; 0 means the request did what it asked.",
    "UNKNOWN_SERVER_ERROR": "Never sent by the broker today. The Python client uses it for a failure of "
                            "its own (a dead-letter write that failed in `railmq.retry`).",
    "OFFSET_OUT_OF_RANGE": "Fetch: the offset is below the log start or above the log end. Consumers "
                           "reset by their `auto_offset_reset` policy (or report it with policy none); "
                           "followers reset to the leader's log start.",
    "CORRUPT_MESSAGE": "Produce: the batch's header is malformed or its CRC-32 does not match "
                       "(storage/batch.py). Nothing was written. Rebuild the batch; do not resend the "
                       "same bytes.",
    "UNKNOWN_TOPIC_OR_PARTITION": "The topic does not exist (metadata, delete, grow), the partition is "
                                  "not known, or the replica addressed has stopped because its topic was "
                                  "deleted (sent as an `ErrorResponse`). Retriable: a topic being created "
                                  "appears in metadata a moment later.",
    "LEADER_NOT_AVAILABLE": "Metadata: the partition has no live leader right now (`leader_endpoint` is "
                            "empty) — during an election, before a new leader's first heartbeat, or "
                            "while the partition is offline. Ask for metadata again after a backoff.",
    "NOT_LEADER": "Kafka's NOT_LEADER_OR_FOLLOWER (code 6). Produce, fetch or list offsets sent to a replica "
                  "that is not the leader (it names the leader in the sentence), or to a process that serves "
                  "another topic or partition than the request names (a stale endpoint: replicas answer only "
                  "for their own partition), or answered to acks=all requests still waiting when leadership "
                  "moved (their fate is unknown). Refresh metadata and retry.",
    "REQUEST_TIMED_OUT": "acks=all: the batch was appended but the ISR did not reach it within the "
                         "request's `timeout_ms`; it may still become visible. Clients also use it for "
                         "a request that got no answer in time. Retrying can duplicate a record unless "
                         "the producer is idempotent.",
    "OFFSET_METADATA_TOO_LARGE": "Offset commit whose `metadata` string is longer than "
                                 "`offset_metadata_length_max` (Kafka's offset.metadata.max.bytes). Nothing of that "
                                 "commit was stored.",
    "MESSAGE_TOO_LARGE": "A whole multipart message above `frame_bytes_max` (sent as `ErrorResponse`, "
                         "with the correlation id when the header was readable), or a batch above the "
                         "topic's `batch_bytes_max` (sent as `ProduceResponse`). Split the batch.",
    "COORDINATOR_NOT_AVAILABLE": "Never sent by the broker today. Clients report it when metadata names "
                                 "no group coordinator (its endpoint is empty): ask for metadata again.",
    "NOT_CONTROLLER": "A controller of the quorum that is not the active one was asked for metadata or a "
                      "metadata change. `controller_id` and `controller_endpoint` name the active controller "
                      "it knows of (0 and \"\" while an election is under way). Retriable: send again to "
                      "the hint at once, or to the next voter after a short wait.",
    "NOT_COORDINATOR": "Never sent by the broker today (one group coordinator hosts every group). "
                       "Clients use it for requests lost with a dropped coordinator connection.",
    "NOT_ENOUGH_REPLICAS": "acks=all produce refused before appending: the ISR is smaller than the "
                           "topic's `min_insync_replicas`. Nothing was written; retry later.",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND": "acks=all: the batch was appended and replicated, but the ISR "
                                        "fell below `min_insync_replicas` before the answer. The record "
                                        "is in the log; a retry duplicates it unless idempotent.",
    "ILLEGAL_GENERATION": "Group request (sync, heartbeat, commit) with a generation other than the "
                          "current one: a rebalance happened without this member. Drop the partitions "
                          "without committing and rejoin.",
    "INCONSISTENT_GROUP_PROTOCOL": "Join with a protocol type or assignor no other member supports, or a "
                                   "classic join for a share group's id (and the reverse). Fatal for the "
                                   "member.",
    "UNKNOWN_MEMBER_ID": "The member id is not in the group (expired session, coordinator restart, or "
                         "the group does not exist). Rejoin with an empty member id.",
    "INVALID_SESSION_TIMEOUT": "Join or share heartbeat with `session_timeout_ms` outside the "
                               "coordinator's bounds (`group_session_timeout_min_ms`.."
                               "`group_session_timeout_max_ms`). Fatal for the member.",
    "REBALANCE_IN_PROGRESS": "The group is rebalancing: heartbeats and syncs during the join phase, "
                             "commits while the leader's assignment is awaited, and the unsolicited "
                             "rebalance notice. Revoke (eager) and rejoin.",
    "CLUSTER_AUTHORIZATION_FAILED": "A message only processes of the cluster may send (partition states, ISR "
                                    "changes, replica heartbeats and fetches, exit notices, the fault switch) came "
                                    "without this cluster's authentication tag; or the fault switch is off because "
                                    "the cluster was not started for chaos. Nothing changed (docs/security.md).",
    "INVALID_TIMESTAMP": "Produce: the batch's newest record is stamped more than `record_timestamp_future_max_ms` "
                         "(1 hour) past the leader's clock. Not retried: fix the producer's clock or timestamps.",
    "TOPIC_ALREADY_EXISTS": "Create topic: the name is taken. Nothing changed.",
    "INVALID_PARTITIONS": "Create topic or grow: the count is outside 1..`partitions_per_topic_max`, or "
                          "a grow does not add partitions.",
    "INVALID_REPLICATION_FACTOR": "Create topic: the replication factor is outside 1..the node count.",
    "INVALID_CONFIG": "Create topic: a `TopicConfig` value is out of range (e.g. `min_insync_replicas` "
                      "above the replication factor, an unknown `flush_policy`); share heartbeat: "
                      "`ShareGroupSettings` out of range.",
    "INVALID_REQUEST": "The message decoded but a value is wrong: a bad topic or group name, acks other "
                       "than 0/1/-1, a negative wait, a payload message with the wrong number of frames, "
                       "a stale partition epoch in AlterIsr, a share range that is malformed. The "
                       "sentence says which.",
    "OUT_OF_ORDER_SEQUENCE_NUMBER": "Idempotent produce: the batch's base sequence is not the one after "
                                    "the producer's last appended batch (an earlier batch is still being "
                                    "retried), or a new producer epoch does not start at 0.",
    "DUPLICATE_SEQUENCE_NUMBER": "Idempotent produce: a stored batch has this batch's producer id, epoch and "
                                 "sequence numbers but other records (its CRC differs), so this one is not a "
                                 "retry and is not stored. A true retry (the same bytes) is answered with "
                                 "success and the offsets it was first written at "
                                 "(actors/producer_state.py).",
    "INVALID_PRODUCER_EPOCH": "Idempotent produce with an epoch older than the one the leader knows for "
                              "that producer id: a zombie producer. Fatal for that producer id.",
    "STORAGE_ERROR": "Fetch met a range of the log that failed its checks on disk (refused, never "
                     "served). The replica records the damage and tells the coordinator at once; a leader steps "
                     "down for a healthy in-sync replica and repairs as a follower. Retry after refreshing "
                     "metadata.",
    "UNKNOWN_PRODUCER_ID": "Idempotent produce from a producer id the leader has no state for, with a "
                           "first sequence other than 0: a batch that overtook earlier ones the leader "
                           "refused (they go first), or a producer the leader forgot (retention removed its "
                           "batches, or more producers wrote since), which numbers the partition again "
                           "from 0 under its next epoch. The share groups' dead-letter writer takes a new "
                           "producer id.",
    "NON_EMPTY_GROUP": "Admin offset commit (generation -1, no member id) or group deletion while the "
                       "group has members. Stop the members first.",
    "GROUP_ID_NOT_FOUND": "Describe or delete of a group that does not exist; share requests naming a group "
                          "that is not a share group.",
    "FENCED_LEADER_EPOCH": "Fetch or ListOffsets with a `leader_epoch` older than the leader's (the fetcher's metadata "
                           "is stale), or an AlterIsr from a leader that is no longer the leader of that "
                           "epoch (a zombie). Refresh metadata and retry.",
    "UNKNOWN_LEADER_EPOCH": "Fetch or ListOffsets with a `leader_epoch` newer than the replica's own: the fetcher heard "
                            "of an election the replica has not applied yet. Retry after a backoff.",
    "STALE_BROKER_EPOCH": "A follower fetch from a process of an ISR member other than the one the coordinator "
                          "recorded when it joined (a replaced process that resumed after a pause). Nothing it "
                          "says is counted; a legitimately restarted follower is answered so until the state "
                          "naming its new process reaches the leader, and retries after a backoff.",
    "FENCED_INSTANCE_ID": "A static member (`group_instance_id`) was replaced by a newer instance with the "
                          "same id. Fatal for the old instance.",
    "INVALID_RECORD": "Produce: the batch's header and CRC are fine but its payload is not what the header claims "
                      "(a record count, timestamps or offset deltas that do not match the records), or it sets "
                      "attributes only the broker may set (a control batch). Nothing was written.",
    "UNKNOWN_TOPIC_ID": "Produce, fetch or list offsets naming a `topic_id` other than the replica's, or a "
                        "share acknowledgement naming one other than the share-partition's: the topic was "
                        "deleted and created again under the same name. Refresh metadata; answers to the old "
                        "topic's records settle nothing.",
    "DUPLICATE_BROKER_REGISTRATION": "NodeHeartbeat from a second node agent for a node another agent runs and was "
                                     "heard from within the node session (the node started twice). The sentence "
                                     "names the running agent. Nothing was taken and no assignments come back; the "
                                     "agent takes the node over once the other is silent for a session or leaves.",
    "INCONSISTENT_CLUSTER_ID": "A state or directory of another cluster: never sent on the wire today; processes refuse "
                               "to start on such a directory (docs/operations.md, \"Storage faults\").",
    "INVALID_RECORD_STATE": "Share acknowledgement for records the member does not hold (never acquired, "
                            "lock expired, already answered). Nothing in that range changed.",
    "UNKNOWN_MESSAGE": "Frame 0 names a `type` that is unknown or internal, or an actor that does not "
                       "handle that type received it (e.g. a ProduceRequest sent to the coordinator).",
    "MALFORMED_FRAME": "The multipart message is empty, frame 0 is not MessagePack, or not a map. "
                       "Answered with `ErrorResponse` and correlation id -1.",
    "BUSY": "A bounded queue is full: parked fetches, waiting acks=all requests, parked share acquires, "
            "members per group, share groups or share-partitions per coordinator. Back off and retry.",
    "DISK_FULL": "Produce: the leader's disk (or the fault switch's quota) refused the write; nothing was "
                 "written.",
    "LIMIT_REACHED": "A bound of actors/limits.py would be passed (groups, offsets per group, replica processes "
                     "per node, group state bytes...): the sentence names the limit. Nothing changed.",
}

