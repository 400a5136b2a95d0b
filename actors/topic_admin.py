"""Topic administration for the coordinator: create, delete, grow, alter settings.

A mixin of `Coordinator` (actors/coordinator.py), kept apart because it is the one part of the
coordinator a client drives. What it keeps: a topic's name and settings are checked before anything
is stored; a topic fits the process model (`replica_processes_per_node_max` over all topics on
each node); a deletion leaves a tombstone (the only thing that lets a node agent delete data); a
settings change is stored and then announced to every replica with a new partition epoch, so it
reaches them like any other change of the partition's state. Only settings whose meaning allows
it may change after creation (`ALTERABLE`): retention, the in-sync minimum and unclean election.
Segment sizes, flush policy and the batch size are fixed: they are baked into open logs.
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.cluster_views import quoted_topic
from actors.effects import AfterFlush, Effect, Send, Trace
from actors.elections import PartitionRecord
from actors.errors import ErrorCode
from actors.group_offsets import is_topic_name
from actors.messages import (
    AlterTopicConfigRequest, AlterTopicConfigResponse, CreatePartitionsRequest, CreatePartitionsResponse,
    CreateTopicRequest, CreateTopicResponse, DeleteTopicRequest, DeleteTopicResponse, INT64_MAX, TopicConfig,
)

FLUSH_POLICIES = ("every_batch", "interval", "never")
ALTERABLE = ("retention_ms", "retention_bytes", "min_insync_replicas", "unclean_leader_election")


class TopicRecord(msgspec.Struct, kw_only=True):
    name: str
    topic_id: int
    config: TopicConfig
    replicas: list[list[int]]  # per partition, in preference order


class TopicAdmin:
    def _on_create_topic(self, request: CreateTopicRequest, sender: Any, now_ns: int) -> list[Effect]:
        config, problem = topic_config_from(request.config)
        if problem is None:
            problem = self._check_new_topic(request, config)
        if problem is not None:
            code, text = problem
            return [Send(sender, CreateTopicResponse(
                correlation_id=request.correlation_id, error=code, error_message=text))]
        start = self.rng.randrange(len(self.nodes))
        replicas = place_replicas(self.nodes, 0, request.partitions, request.replication_factor, start)
        crowded = self._over_process_limit(replicas)
        if crowded is not None:
            return [Send(sender, CreateTopicResponse(correlation_id=request.correlation_id,
                                                     error=ErrorCode.LIMIT_REACHED, error_message=crowded))]
        record = TopicRecord(name=request.name, topic_id=self.rng.getrandbits(62) + 1,
                             config=config, replicas=replicas)
        self.topics[request.name] = record
        self.partition_born_ns.update(((request.name, number), now_ns) for number in range(len(replicas)))
        self.state.put(f"topic/{request.name}", msgspec.to_builtins(record))
        for partition, placed in enumerate(replicas):
            self._store_partition(request.name, partition, PartitionRecord(leader=placed[0], isr=list(placed)))
        reply = CreateTopicResponse(correlation_id=request.correlation_id,
                                    topic=self._topic_metadata(request.name, now_ns))
        trace = Trace("topic-created", {"topic": request.name, "partitions": request.partitions,
                                        "replication_factor": request.replication_factor})
        return [trace, AfterFlush(self.state, (Send(sender, reply),))]

    def _check_new_topic(self, request: CreateTopicRequest,
                         config: TopicConfig) -> tuple[ErrorCode, str] | None:
        limits = self.limits
        if not is_topic_name(request.name, limits):
            return ErrorCode.INVALID_REQUEST, (
                f"topic name {quoted_topic(request.name)} must be 1-{limits.topic_name_length_max} "
                "characters of letters, digits, '.', '_' or '-'")
        if request.name in self.topics:
            return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {request.name!r} already exists"
        if len(self.topics) >= limits.topics_max:
            return ErrorCode.INVALID_REQUEST, f"the cluster holds its maximum of {limits.topics_max} topics"
        if not 1 <= request.partitions <= limits.partitions_per_topic_max:
            return ErrorCode.INVALID_PARTITIONS, (
                f"partitions must be 1..{limits.partitions_per_topic_max}, got {request.partitions}")
        if not 1 <= request.replication_factor <= len(self.nodes):
            return ErrorCode.INVALID_REPLICATION_FACTOR, (
                f"replication factor {request.replication_factor} needs 1..{len(self.nodes)} nodes")
        if config.batch_bytes_max > limits.fetch_bytes_max:
            return ErrorCode.INVALID_CONFIG, (
                f"batch_bytes_max {config.batch_bytes_max} is above fetch_bytes_max "
                f"({limits.fetch_bytes_max}): a batch is fetched whole, in one answer")
        smallest = {"segment_bytes": limits.topic_segment_bytes_min,
                    "segment_ms": limits.topic_segment_ms_min}
        for name, least in smallest.items():
            if 0 < getattr(config, name) < least:  # a segment per batch: a file and its memory each
                return ErrorCode.INVALID_CONFIG, (
                    f"{name} must be at least {least} (topic_{name}_min), got {getattr(config, name)}")
        if config.segment_bytes > limits.topic_segment_bytes_max:  # retention_bytes could never bind
            return ErrorCode.INVALID_CONFIG, (
                f"segment_bytes must be at most {limits.topic_segment_bytes_max} (topic_segment_bytes_max), "
                f"got {config.segment_bytes}: retention deletes closed segments only")
        return check_topic_config(config, request.replication_factor)

    def _on_delete_topic(self, request: DeleteTopicRequest, sender: Any) -> list[Effect]:
        record = self.topics.pop(request.name, None)
        if record is None:
            return [Send(sender, DeleteTopicResponse(
                correlation_id=request.correlation_id, error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                error_message=f"topic {quoted_topic(request.name)} does not exist"))]
        self.state.delete(f"topic/{request.name}")
        self._record_tombstone(record)
        for partition in range(len(record.replicas)):
            self.partitions.pop((request.name, partition), None)
            self.state.delete(f"partition/{request.name}/{partition}")
        for key in [key for key in self.liveness if key[0] == request.name]:
            del self.liveness[key]
        # Nothing of a deleted topic stays in memory but its tombstone (bounded): a client creating
        # and deleting ever new names grew the creation times by a name each, walked at every heartbeat.
        for partition in range(len(record.replicas)):
            self.partition_born_ns.pop((request.name, partition), None)
        reply = Send(sender, DeleteTopicResponse(correlation_id=request.correlation_id))
        return [Trace("topic-deleted", {"topic": request.name}), AfterFlush(self.state, (reply,))]

    def _over_process_limit(self, placement: list[list[int]]) -> str | None:
        """Why adding `placement` would ask a node for more replica processes than it may run."""
        load = {node: 0 for node in self.nodes}
        for record in self.topics.values():
            for placed in record.replicas:
                for node in placed:
                    load[node] = load.get(node, 0) + 1
        for placed in placement:
            for node in placed:
                load[node] = load.get(node, 0) + 1
        limit = self.limits.replica_processes_per_node_max
        crowded = sorted(node for node, count in load.items() if count > limit)
        if not crowded:
            return None
        return (f"nodes {crowded} would run {max(load.values())} replica processes, above "
                f"replica_processes_per_node_max ({limit}): every replica is a process")

    def _record_tombstone(self, record: TopicRecord) -> None:
        self.tombstones[record.topic_id] = record.name
        self.state.put(f"deleted/{record.topic_id}", {"name": record.name})
        while len(self.tombstones) > self.limits.tombstones_max:
            oldest = next(iter(self.tombstones))
            del self.tombstones[oldest]
            self.state.delete(f"deleted/{oldest}")

    def _on_create_partitions(self, request: CreatePartitionsRequest, sender: Any, now_ns: int) -> list[Effect]:
        record = self.topics.get(request.name)
        current = len(record.replicas) if record else 0
        if record is None:
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            text = f"topic {quoted_topic(request.name)} does not exist"
        elif not current < request.total_partitions <= self.limits.partitions_per_topic_max:
            code, text = ErrorCode.INVALID_PARTITIONS, (
                f"topic {request.name!r} has {current} partitions; the new total must be larger "
                f"and at most {self.limits.partitions_per_topic_max}")
        else:
            code, text = ErrorCode.NONE, ""
        if code != ErrorCode.NONE:
            return [Send(sender, CreatePartitionsResponse(
                correlation_id=request.correlation_id, error=code, error_message=text))]
        added = place_replicas(self.nodes, current, request.total_partitions - current,
                               len(record.replicas[0]), self.rng.randrange(len(self.nodes)))
        crowded = self._over_process_limit(added)
        if crowded is not None:
            return [Send(sender, CreatePartitionsResponse(correlation_id=request.correlation_id,
                                                          error=ErrorCode.LIMIT_REACHED, error_message=crowded))]
        record.replicas.extend(added)
        # Only the partitions added are starting: the others' replicas run and are judged as before.
        self.partition_born_ns.update(((request.name, number), now_ns)
                                      for number in range(current, request.total_partitions))
        self.state.put(f"topic/{request.name}", msgspec.to_builtins(record))
        for offset, placed in enumerate(added):
            self._store_partition(request.name, current + offset, PartitionRecord(leader=placed[0], isr=list(placed)))
        reply = Send(sender, CreatePartitionsResponse(correlation_id=request.correlation_id))
        return [Trace("partitions-created", {"topic": request.name, "total": request.total_partitions}),
                AfterFlush(self.state, (reply,))]

    def _on_alter_topic_config(self, request: AlterTopicConfigRequest, sender: Any, now_ns: int) -> list[Effect]:
        record = self.topics.get(request.name)
        problem = None
        if record is None:
            problem = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                       f"topic {quoted_topic(request.name)} does not exist")
        else:
            unknown = sorted(set(request.changes) - set(TopicConfig.__struct_fields__))
            fixed = sorted(set(request.changes) - set(ALTERABLE))
            if unknown:
                names = ", ".join(repr(name[:60]) for name in unknown)
                problem = ErrorCode.INVALID_CONFIG, (f"no topic setting is called {names}; "
                                                     f"these can change: {', '.join(ALTERABLE)}")
            elif fixed:
                problem = ErrorCode.INVALID_CONFIG, (f"{', '.join(fixed)} cannot change after creation; "
                                                     f"these can: {', '.join(ALTERABLE)}")
        if problem is None:
            try:
                config = msgspec.convert({**msgspec.to_builtins(record.config), **request.changes}, TopicConfig)
            except msgspec.ValidationError as error:
                config, problem = None, (ErrorCode.INVALID_CONFIG, f"bad value: {error}")
            if problem is None:
                problem = check_topic_config(config, len(record.replicas[0]))
        if problem is not None:
            return [Send(sender, AlterTopicConfigResponse(correlation_id=request.correlation_id, error=problem[0],
                                                          error_message=problem[1]))]
        if config == record.config:
            # Nothing to store or announce (Kafka writes no record for it either): a plain answer,
            # which a controller holds behind any proposal still in flight, as it holds every read.
            unchanged = AlterTopicConfigResponse(correlation_id=request.correlation_id, config=config)
            return [Send(sender, unchanged)]
        record.config = config
        self.state.put(f"topic/{request.name}", msgspec.to_builtins(record))
        announcements: list[Effect] = [Trace("topic-config-altered", {"topic": request.name, "changes": request.changes})]
        for partition in range(len(record.replicas)):
            current = self.partitions[(request.name, partition)]
            # The leader and ISR stay as decided: an ISR change asked before this is still taken.
            self._store_partition(request.name, partition, msgspec.structs.replace(
                current, partition_epoch=current.partition_epoch + 1, isr_epoch=current.isr_epoch_floor()))
            announcements += self._announce(request.name, partition, now_ns)
            announcements += self._reconcile(request.name, partition, now_ns)  # unclean election may now apply
        reply = Send(sender, AlterTopicConfigResponse(correlation_id=request.correlation_id, config=config))
        return self._after_persist(announcements, [reply]) if len(announcements) > 1 else \
            [announcements[0], AfterFlush(self.state, (reply,))]


def place_replicas(nodes: list[int], first_partition: int, count: int, replication_factor: int,
                   start: int) -> list[list[int]]:
    """Spread leaders round-robin from a random start; followers are the next nodes in order."""
    total = len(nodes)
    return [
        [nodes[(start + partition + offset) % total] for offset in range(replication_factor)]
        for partition in range(first_partition, first_partition + count)
    ]


def topic_config_from(settings: Any) -> tuple[TopicConfig | None, tuple[ErrorCode, str] | None]:
    """(the TopicConfig of `settings`, by name, the others at their defaults; or why not). Every
    name must be a setting and every value of its type: the decoder of a TopicConfig drops names
    it does not know, so a misspelt `min_insync_replica` made a topic of min in-sync 1 silently."""
    if isinstance(settings, TopicConfig):  # built in this process, not decoded from a frame
        return settings, None
    known = TopicConfig.__struct_fields__
    unknown = sorted(str(name)[:60] for name in settings if name not in known)
    if unknown:
        text = f"no topic setting is called {', '.join(map(repr, unknown))}"
        return None, (ErrorCode.INVALID_CONFIG, f"{text}; the settings are {', '.join(known)}")
    try:
        return msgspec.convert(settings, TopicConfig), None
    except msgspec.ValidationError as error:
        return None, (ErrorCode.INVALID_CONFIG, f"bad topic setting: {str(error)[:200]}")


def check_topic_config(config: TopicConfig, replication_factor: int) -> tuple[ErrorCode, str] | None:
    if not 1 <= config.min_insync_replicas <= replication_factor:
        return ErrorCode.INVALID_CONFIG, (
            f"min_insync_replicas {config.min_insync_replicas} must be 1..{replication_factor}")
    if config.flush_policy not in FLUSH_POLICIES:
        return ErrorCode.INVALID_CONFIG, f"flush_policy must be one of {', '.join(FLUSH_POLICIES)}"
    positive = {"segment_bytes": config.segment_bytes, "segment_ms": config.segment_ms,
                "flush_interval_ms": config.flush_interval_ms, "batch_bytes_max": config.batch_bytes_max}
    for name, value in positive.items():
        if value <= 0:
            return ErrorCode.INVALID_CONFIG, f"{name} must be positive, got {value}"
    for name, value in {"retention_ms": config.retention_ms, "retention_bytes": config.retention_bytes}.items():
        if value is not None and value <= 0:
            return ErrorCode.INVALID_CONFIG, f"{name} must be positive or unset, got {value}"
    # Settings travel as int64s (Kafka's are Longs); MessagePack also carries uint64, which every
    # metadata answer would then hold and a client reading the promised int64 could not read.
    for name in TopicConfig.__struct_fields__:
        value = getattr(config, name)
        if type(value) is int and value > INT64_MAX:
            return ErrorCode.INVALID_CONFIG, f"{name} must be at most {INT64_MAX}, got {value}"
    return None
