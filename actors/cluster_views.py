"""What the coordinator tells about the cluster: metadata answers and node assignments.

A mixin of `Coordinator` (actors/coordinator.py), which owns `topics`, `partitions`, `liveness`,
`nodes`, `tombstones`, `cluster_id`, `_is_live`, `_leader_endpoint` and the service endpoints.
Nothing here decides or stores anything: each answer is read from what the coordinator holds at
the moment it is asked (and the controller holds it back while a decision it read is uncommitted).
"""

from __future__ import annotations

from actors.errors import ErrorCode
from actors.messages import (
    MetadataRequest, MetadataResponse, NodeAssignmentsRequest, NodeAssignmentsResponse, PartitionMetadata,
    ReplicaAssignment, ReplicaInfo, TopicMetadata,
)

# An unknown name is echoed whole once, in `name`, for the client to match; its error text
# quotes only its start, so a long invented name does not come back twice. The same for every
# refusal naming a topic that is none: quoted whole (repr writes a control character in four),
# a name filling a frame came back four times its size.
TOPIC_NAME_QUOTED_MAX = 60


def quoted_topic(name: str) -> str:
    """A topic name as an error text quotes it: its first TOPIC_NAME_QUOTED_MAX characters."""
    return f"{name[:TOPIC_NAME_QUOTED_MAX]!r}{'...' if len(name) > TOPIC_NAME_QUOTED_MAX else ''}"


class ClusterViews:
    def _topic_metadata(self, name: str, now_ns: int) -> TopicMetadata:
        record = self.topics[name]
        partitions = []
        for partition, replicas in enumerate(record.replicas):
            state = self.partitions[(name, partition)]
            info = []
            for node in replicas:
                live = self.liveness.get((name, partition, node))
                info.append(ReplicaInfo(node=node) if live is None else ReplicaInfo(
                    node=node, endpoint=live.endpoint, pid=live.pid, alive=self._is_live(live, now_ns),
                    log_start_offset=live.log_start_offset, log_end_offset=live.log_end_offset,
                    high_watermark=live.high_watermark, storage=live.storage))
            endpoint = self._leader_endpoint(name, partition, state, now_ns)
            partitions.append(PartitionMetadata(
                partition=partition, leader=state.leader, leader_endpoint=endpoint,
                leader_epoch=state.leader_epoch, partition_epoch=state.partition_epoch,
                replicas=list(replicas), isr=list(state.isr), replica_info=info,
                error=ErrorCode.NONE if endpoint else ErrorCode.LEADER_NOT_AVAILABLE,
                offline_reason=state.offline_reason, eligible_leader_replicas=sorted(state.elr),
            ))
        return TopicMetadata(name=name, topic_id=record.topic_id, config=record.config, partitions=partitions)

    def _metadata(self, request: MetadataRequest, now_ns: int) -> MetadataResponse:
        """Every topic, or each topic named, once. Each name was answered with its topic's whole
        metadata, repeats included: 1,000,000 repeats of one name (a 2 MB request) cost the active
        controller 47 s and 3.5 GB, and it was deposed meanwhile. Names are a set (Kafka's too),
        and a request naming more than `topics_max` asks for more than the cluster can hold."""
        most = self.limits.topics_max
        if request.topics is not None and len(request.topics) > most:
            return MetadataResponse(correlation_id=request.correlation_id, error=ErrorCode.INVALID_REQUEST,
                                    error_message=f"a metadata request names at most topics_max ({most}) "
                                                  f"topics, got {len(request.topics)}")
        names = sorted(self.topics) if request.topics is None else list(dict.fromkeys(request.topics))
        topics = [
            self._topic_metadata(name, now_ns) if name in self.topics else TopicMetadata(
                name=name, error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                error_message=f"topic {quoted_topic(name)} does not exist")
            for name in names
        ]
        return MetadataResponse(
            correlation_id=request.correlation_id, topics=topics, nodes=list(self.nodes), cluster_id=self.cluster_id,
            group_coordinator_endpoint=self._service_endpoint("group-coordinator", now_ns),
            group_coordinator_incarnation=self._service_incarnation("group-coordinator", now_ns),
        )

    def _assignments(self, request: NodeAssignmentsRequest) -> NodeAssignmentsResponse:
        wanted = set(request.nodes)
        replicas = [
            ReplicaAssignment(topic=name, topic_id=record.topic_id, partition=partition, node=node, config=record.config,
                              replicas=list(placed))
            for name, record in sorted(self.topics.items())
            for partition, placed in enumerate(record.replicas)
            for node in placed if node in wanted
        ]
        return NodeAssignmentsResponse(correlation_id=request.correlation_id, replicas=replicas,
                                       deleted_topic_ids=sorted(self.tombstones), cluster_id=self.cluster_id)
