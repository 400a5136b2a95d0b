"""The coordinator: the cluster's metadata authority (Kafka's controller), kept off the data path.

It owns topics (create, delete, grow, describe), replica placement across nodes, the directory of
which replica leads each partition and at which endpoint, replica liveness (heartbeats and a
session timeout, plus the supervisor's faster "process exited" notice), leader election, and the
ISR as stored truth. Everything it decides is written to its durable state and flushed before
anyone hears of it (`AfterFlush`), so a restarted coordinator remembers every topic, epoch and
ISR. Liveness is soft state: after a restart it waits `coordinator_election_grace_ms` for
replicas to report before it judges anyone dead.

It never touches a record: producers and consumers talk to partition leaders directly.
Election rules live in `actors/elections.py`; this module wires them to messages and storage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from actors.actor import MS
from actors.client_secrets import ProducerSecrets
from actors.effects import AfterFlush, Effect, Send, SetTimer, Trace
from actors.elections import PartitionRecord, ReplicaView, check_alter_isr, reconcile
from actors.errors import ErrorCode
from actors.limits import DEFAULT_LIMITS, Limits
from actors.messages import (
    AlterIsrRequest, AlterIsrResponse, AlterTopicConfigRequest, CreatePartitionsRequest,
    CreateTopicRequest, DeleteTopicRequest,
    ErrorResponse, InitProducerIdRequest, InitProducerIdResponse, MetadataRequest,
    NodeAssignmentsRequest, NodeHeartbeat,
    PartitionState, ReplicaExited, ReplicaHeartbeat, ReplicaHeartbeatResponse,
    ServiceHeartbeat, ServiceHeartbeatResponse, Stop, StorageReport, TimerFired,
)
from actors.cluster_views import ClusterViews
from actors.node_liveness import NodeLiveness
from actors.topic_admin import TopicAdmin, TopicRecord, check_topic_config, place_replicas  # noqa: F401 (re-exported)



class Liveness(msgspec.Struct, kw_only=True):
    endpoint: str
    pid: int
    incarnation: int
    last_seen_ns: int
    exited: bool = False
    responsive: bool = True  # its node agent says it answers (see actors/node_liveness.py)
    # Judged by the node session (node_session_timeout_ms), not the replica one: kept alive by its
    # node agent's heartbeats, or a node-level service (the group coordinator) that announces
    # itself once per node heartbeat interval.
    via_node: bool = False
    log_start_offset: int = 0
    log_end_offset: int = 0
    high_watermark: int = 0
    storage: StorageReport = StorageReport()
    leader_epoch: int = -1  # the epochs of the partition state it last reported
    partition_epoch: int = -1
    leader_endpoint: str = ""  # a follower: where it last said it fetches from
    state_pushed_ns: int = 0

AUTHENTICATED = (ReplicaHeartbeat, AlterIsrRequest, ReplicaExited, ServiceHeartbeat, NodeHeartbeat)


if TYPE_CHECKING:
    import random

PartitionKey = tuple[str, int]
LIVENESS_CHECK_MAX_MS = 10_000  # the longest the coordinator goes without judging liveness again


class Coordinator(TopicAdmin, NodeLiveness, ClusterViews):
    def __init__(self, *, state: Any, nodes: list[int], rng: "random.Random",
                 limits: Limits = DEFAULT_LIMITS, name: str = "coordinator", cluster_id: str = "",
                 client_key: bytes = b"") -> None:
        self.name = name
        self.producer_secrets = ProducerSecrets(client_key)  # handed out with each producer id
        self.cluster_id = cluster_id
        self.state = state
        self.nodes = sorted(nodes)
        self.rng = rng
        self.limits = limits
        self.topics: dict[str, TopicRecord] = {}
        self.partitions: dict[PartitionKey, PartitionRecord] = {}
        self.liveness: dict[tuple[str, int, int], Liveness] = {}
        # node -> (the node agent running it, when it was last heard): one agent per node
        # (actors/node_liveness.py); at most one entry per node of the cluster. The agent ids are
        # kept in the state too; after a restart or failover each counts as heard at the start.
        self.node_owners: dict[int, tuple[str, int]] = {}
        self.node_beats: dict[int, tuple[str, int]] = {}  # node -> (agent id, last heartbeat number taken)
        self.services: dict[str, Liveness] = {}
        self.started_ns = 0
        self.leaderless_check_ns = 0  # while a partition has no leader: when liveness is judged next
        # Partitions whose replicas are still being started, and when they were made: nobody is
        # judged absent for `partition_creation_grace_ms` after. Per partition, not per topic:
        # growing a topic started the grace again for partitions running long since. Forgotten
        # once the grace has passed or the topic is deleted.
        self.partition_born_ns: dict[PartitionKey, int] = {}
        self.tombstones: dict[int, str] = {}  # deleted topic id -> its name, oldest first
        self._load()

    # ------------------------------------------------------------------ lifecycle

    def _load(self) -> None:
        stored_id = self.state.get("cluster/id")
        if stored_id is None:
            if self.cluster_id:
                self.state.put("cluster/id", self.cluster_id)
        elif self.cluster_id and stored_id != self.cluster_id:
            raise ValueError(f"the coordinator's state belongs to cluster {stored_id!r}, not {self.cluster_id!r}")
        else:
            self.cluster_id = stored_id
        for key, value in self.state.items("deleted/"):
            self.tombstones[int(key.rsplit("/", 1)[1])] = value.get("name", "") if isinstance(value, dict) else ""
        for _, value in self.state.items("topic/"):
            record = msgspec.convert(value, TopicRecord)
            self.topics[record.name] = record
        for key, value in self.state.items("partition/"):
            _, topic, partition = key.rsplit("/", 2)
            self.partitions[(topic, int(partition))] = msgspec.convert(value, PartitionRecord, strict=False)
        self._load_node_agents()

    def start(self, now_ns: int) -> list[Effect]:
        self.started_ns = now_ns
        return [self._liveness_timer(now_ns)]

    def needs_authentication(self, message: Any) -> bool:
        """Liveness, ISR changes and exit notices come only from processes of this cluster."""
        return isinstance(message, AUTHENTICATED)

    def invariants(self) -> None:
        for (topic, partition), record in self.partitions.items():
            assert topic in self.topics, f"partition {topic}/{partition} of unknown topic"
            assert record.isr, f"{topic}/{partition}: the ISR is never empty"
            replicas = self.topics[topic].replicas[partition]
            assert set(record.isr) <= set(replicas), f"{topic}/{partition}: ISR outside replicas"
            assert record.leader == -1 or record.leader in record.isr, (
                f"{topic}/{partition}: leader {record.leader} outside ISR {record.isr}")

    # ------------------------------------------------------------------ dispatch

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        match message:
            case ReplicaHeartbeat():
                return self._on_replica_heartbeat(message, sender, now_ns) + [self._liveness_timer(now_ns)]
            case NodeHeartbeat():
                return self._on_node_heartbeat(message, sender, now_ns) + [self._liveness_timer(now_ns)]
            case AlterIsrRequest():
                return self._on_alter_isr(message, sender, now_ns)
            case MetadataRequest():
                return [Send(sender, self._metadata(message, now_ns))]
            case TimerFired(name="liveness"):
                return self._on_liveness_tick(now_ns)
            case ReplicaExited():
                return self._on_replica_exited(message, now_ns)
            case ServiceHeartbeat():
                return self._on_service_heartbeat(message, sender, now_ns)
            case NodeAssignmentsRequest():
                return [Send(sender, self._assignments(message))]
            case CreateTopicRequest():
                return self._on_create_topic(message, sender, now_ns)
            case DeleteTopicRequest():
                return self._on_delete_topic(message, sender)
            case CreatePartitionsRequest():
                return self._on_create_partitions(message, sender, now_ns)
            case AlterTopicConfigRequest():
                return self._on_alter_topic_config(message, sender, now_ns)
            case InitProducerIdRequest():
                return self._on_init_producer_id(message, sender)
            case Stop():
                self.state.flush()
                return []
            case _:
                return [Send(sender, ErrorResponse(
                    correlation_id=getattr(message, "correlation_id", -1), error=ErrorCode.UNKNOWN_MESSAGE,
                    error_message=f"the coordinator does not handle {type(message).__name__}"))]

    # ------------------------------------------------------------------ liveness

    def _on_replica_heartbeat(self, beat: ReplicaHeartbeat, sender: Any, now_ns: int) -> list[Effect]:
        effects, reply = self._take_report(beat, now_ns)
        if reply is None:
            return effects
        return self._after_persist(effects, [Send(sender, reply)])

    def _take_report(self, beat: ReplicaHeartbeat, now_ns: int, *,
                     via_node: bool = False) -> tuple[list[Effect], ReplicaHeartbeatResponse | None]:
        """A replica's report, sent by itself or carried by its node agent: (decisions to persist
        before anyone hears of them, the answer for the replica or None)."""
        topic = self.topics.get(beat.topic)
        if topic is None or topic.topic_id != beat.topic_id or not 0 <= beat.partition < len(topic.replicas) \
                or beat.node not in topic.replicas[beat.partition]:
            return [], self._not_a_replica(beat)
        key = (beat.topic, beat.partition, beat.node)
        previous = self.liveness.get(key)
        if previous is not None and previous.exited and previous.incarnation == beat.incarnation:
            return [], None  # sent before the process died, delivered after: the dead stay dead
        self.liveness[key] = Liveness(
            endpoint=beat.endpoint, pid=beat.pid, incarnation=beat.incarnation, last_seen_ns=now_ns,
            log_start_offset=beat.log_start_offset, log_end_offset=beat.log_end_offset,
            high_watermark=beat.high_watermark, storage=beat.storage,
            leader_epoch=beat.leader_epoch, partition_epoch=beat.partition_epoch,
            leader_endpoint=beat.leader_endpoint,
            state_pushed_ns=previous.state_pushed_ns if previous is not None else 0,
            via_node=via_node,
        )
        effects: list[Effect] = []
        news = previous is None or previous.incarnation != beat.incarnation or previous.exited
        moved = previous is None or previous.endpoint != beat.endpoint
        storage_news = previous is not None and previous.storage.state != beat.storage.state
        if news or moved or storage_news:
            if storage_news:
                effects.append(Trace("replica-storage", {"topic": beat.topic, "partition": beat.partition,
                                                         "node": beat.node, "state": beat.storage.state,
                                                         "detail": beat.storage.detail}))
            effects += self._reconcile(beat.topic, beat.partition, now_ns)
        record = self.partitions[(beat.topic, beat.partition)]
        if moved and record.leader == beat.node and not any(isinstance(e, Send) for e in effects):
            effects += self._announce(beat.topic, beat.partition, now_ns)  # followers learn where to fetch
        stale = self._stale(beat.topic, beat.partition, beat.node, self.liveness[key], now_ns)
        state = self._partition_state(beat.topic, beat.partition, now_ns) if stale or news else None
        if state is not None:
            self.liveness[key].state_pushed_ns = now_ns
        return effects, ReplicaHeartbeatResponse(correlation_id=beat.correlation_id, state=state)

    def _stale(self, topic: str, partition: int, node: int, live: Liveness, now_ns: int) -> bool:
        """Does this replica lack the partition state it should act on? Older epochs, or a follower
        without the leader's endpoint: a state pushed before the leader reported had none, and
        the announcement that followed may have been lost, while the epochs are the same."""
        record = self.partitions[(topic, partition)]
        if (live.leader_epoch, live.partition_epoch) != (record.leader_epoch, record.partition_epoch):
            return True
        if record.leader < 0 or record.leader == node:
            return False
        endpoint = self._leader_endpoint(topic, partition, record, now_ns)
        return bool(endpoint) and live.leader_endpoint != endpoint

    def _not_a_replica(self, beat: ReplicaHeartbeat) -> ReplicaHeartbeatResponse:
        """A replica of a topic id the coordinator recorded as deleted stops for good; one it only
        does not know (a mistake, a state from another cluster) is told so and keeps its data."""
        if beat.topic_id in self.tombstones:
            return ReplicaHeartbeatResponse(correlation_id=beat.correlation_id, deleted=True)
        topic = self.topics.get(beat.topic)
        if topic is not None and topic.topic_id == beat.topic_id:
            # The topic is known and its placement has no such replica: it must not run (its data is
            # deleted only for a tombstone, by the node agent).
            return ReplicaHeartbeatResponse(correlation_id=beat.correlation_id, deleted=True)
        return ReplicaHeartbeatResponse(
            correlation_id=beat.correlation_id, error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            error_message=(f"the coordinator knows no replica {beat.topic}/{beat.partition} on node {beat.node} "
                           f"with topic id {beat.topic_id:x}, and has no record of deleting it"))

    def _on_replica_exited(self, notice: ReplicaExited, now_ns: int) -> list[Effect]:
        live = self.liveness.get((notice.topic, notice.partition, notice.node))
        if live is None or live.incarnation != notice.incarnation or notice.topic not in self.topics:
            return []
        live.exited = True
        return self._after_persist(self._reconcile(notice.topic, notice.partition, now_ns), [])

    def _on_liveness_tick(self, now_ns: int) -> list[Effect]:
        changed: list[Effect] = []
        for topic, partition in sorted(self.partitions):
            changed += self._reconcile(topic, partition, now_ns)
        return [self._liveness_timer(now_ns)] + self._after_persist(changed, [])

    def _liveness_timer(self, now_ns: int) -> SetTimer:
        """The next moment a judgement can change with no message arriving: a live replica's
        session running out or a grace period ending — or the next heartbeat interval while a
        partition has no leader. Set again after every heartbeat, so a healthy cluster never
        wakes the coordinator for nothing (the timer keeps moving ahead of it). The leaderless
        check is a fixed deadline, not "an interval from now": heartbeats arrive more often than
        the interval, and would otherwise postpone it forever."""
        interval_ns = self.limits.replica_heartbeat_interval_ms * MS
        if any(record.leader < 0 for record in self.partitions.values()):
            if self.leaderless_check_ns <= now_ns:
                self.leaderless_check_ns = now_ns + interval_ns
            return SetTimer("liveness", self.leaderless_check_ns)
        deadline = now_ns + LIVENESS_CHECK_MAX_MS * MS
        graces = [self.started_ns + self.limits.coordinator_election_grace_ms * MS]
        creation_grace_ns = self.limits.partition_creation_grace_ms * MS
        over = [key for key, born in self.partition_born_ns.items() if born + creation_grace_ns <= now_ns]
        for key in over:  # its grace has passed: judged like any other partition from now on
            del self.partition_born_ns[key]
        graces += [born + creation_grace_ns for born in self.partition_born_ns.values()]
        for grace_ns in graces:
            if grace_ns > now_ns:
                deadline = min(deadline, grace_ns)
        for live in self.liveness.values():
            if not live.exited and live.responsive:
                expiry = live.last_seen_ns + self._session_ms(live) * MS + 1
                if expiry > now_ns:
                    deadline = min(deadline, expiry)
        return SetTimer("liveness", max(deadline, now_ns + MS))

    def _is_live(self, live: Liveness | None, now_ns: int) -> bool:
        return (live is not None and not live.exited and live.responsive
                and now_ns - live.last_seen_ns <= self._session_ms(live) * MS)

    def _session_ms(self, live: Liveness) -> int:
        limits = self.limits
        return limits.node_session_timeout_ms if live.via_node else limits.replica_session_timeout_ms

    def _views(self, topic: str, partition: int, now_ns: int) -> dict[int, ReplicaView]:
        """What we know of each replica. During the grace period (after this coordinator starts,
        or after the partition is created) a replica we have not heard from yet is presumed alive
        with the incarnation on record: nobody is judged before they had a chance to report."""
        views = {}
        record = self.partitions[(topic, partition)]
        presume = not self._settled(topic, partition, now_ns)
        for node in self.topics[topic].replicas[partition]:
            live = self.liveness.get((topic, partition, node))
            if live is not None:
                storage = live.storage
                views[node] = ReplicaView(
                    self._is_live(live, now_ns), live.incarnation, live.log_end_offset,
                    clean=storage.clean_shutdown, damaged=storage.state in ("damaged", "repairing"),
                    new_directory=storage.state == "new", last_epoch=storage.last_epoch,
                    high_watermark=live.high_watermark)
            else:
                # Not heard from since this coordinator started: presumed alive during the grace,
                # then absent — never counted as dead, which takes evidence (a report, then silence).
                recorded = record.leader_incarnation if node == record.leader else record.isr_incarnations.get(node, 0)
                views[node] = ReplicaView(presume, recorded, 0, reported=False)
        return views

    def _settled(self, topic: str, partition: int, now_ns: int) -> bool:
        grace_ns = self.limits.coordinator_election_grace_ms * MS
        born = self.partition_born_ns.get((topic, partition), 0)
        return now_ns - self.started_ns >= grace_ns and now_ns - born >= self.limits.partition_creation_grace_ms * MS

    def _reconcile(self, topic: str, partition: int, now_ns: int) -> list[Effect]:
        """Run the election rules; persist and announce any change. Returns effects to apply
        after the state is flushed (the caller wraps them with `_after_persist`)."""
        record = self.partitions[(topic, partition)]
        decision = reconcile(
            record, self.topics[topic].replicas[partition], self._views(topic, partition, now_ns),
            unclean_allowed=self.topics[topic].config.unclean_leader_election,
            min_insync=self.topics[topic].config.min_insync_replicas,
        )
        if decision is None:
            return []
        self._store_partition(topic, partition, decision.record)
        effects: list[Effect] = [
            Trace(event, {"topic": topic, "partition": partition, **details}) for event, details in decision.events
        ]
        return effects + self._announce(topic, partition, now_ns)

    def _announce(self, topic: str, partition: int, now_ns: int) -> list[Effect]:
        """Push the new partition state to every live replica (they also pull it by heartbeat)."""
        state = self._partition_state(topic, partition, now_ns)
        effects: list[Effect] = []
        for node in self.topics[topic].replicas[partition]:
            live = self.liveness.get((topic, partition, node))
            if self._is_live(live, now_ns):
                effects.append(Send(live.endpoint, ReplicaHeartbeatResponse(state=state)))
        return effects

    def _after_persist(self, announcements: list[Effect], replies: list[Effect]) -> list[Effect]:
        """Everything that reveals a decision waits for the state file to be durable."""
        if not announcements:
            return replies
        traces = [effect for effect in announcements if isinstance(effect, Trace)]
        sends = [effect for effect in announcements if not isinstance(effect, Trace)]
        return traces + [AfterFlush(self.state, tuple(sends + replies))]

    # ------------------------------------------------------------------ ISR changes

    def _on_alter_isr(self, request: AlterIsrRequest, sender: Any, now_ns: int) -> list[Effect]:
        key = (request.topic, request.partition)
        record = self.partitions.get(key)
        if record is None:
            return [Send(sender, AlterIsrResponse(
                correlation_id=request.correlation_id, error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                error_message=f"no partition {request.topic}/{request.partition}"))]
        outcome = check_alter_isr(
            record, self.topics[request.topic].replicas[request.partition], request.leader,
            request.leader_epoch, request.partition_epoch, request.isr, request.isr_incarnations,
            self._views(request.topic, request.partition, now_ns),
            min_insync=self.topics[request.topic].config.min_insync_replicas,
        )
        if isinstance(outcome, tuple):
            code, text = outcome
            return [Send(sender, AlterIsrResponse(
                correlation_id=request.correlation_id, error=code, error_message=text,
                state=self._partition_state(request.topic, request.partition, now_ns)))]
        self._store_partition(request.topic, request.partition, outcome)
        trace = Trace("isr-changed", {"topic": request.topic, "partition": request.partition,
                                      "isr": list(outcome.isr), "previous_isr": list(record.isr), "by": "leader"})
        state = self._partition_state(request.topic, request.partition, now_ns)
        reply = Send(sender, AlterIsrResponse(correlation_id=request.correlation_id, state=state))
        return [trace, AfterFlush(self.state, (reply,))]

    # ------------------------------------------------------------------ services

    def _on_service_heartbeat(self, beat: ServiceHeartbeat, sender: Any, now_ns: int) -> list[Effect]:
        self.services[beat.role] = Liveness(
            endpoint=beat.endpoint, pid=beat.pid, incarnation=beat.incarnation, last_seen_ns=now_ns, via_node=True)
        return [Send(sender, ServiceHeartbeatResponse(correlation_id=beat.correlation_id))]

    def _service_endpoint(self, role: str, now_ns: int) -> str:
        live = self.services.get(role)
        return live.endpoint if self._is_live(live, now_ns) else ""

    def _service_incarnation(self, role: str, now_ns: int) -> int:
        live = self.services.get(role)
        return live.incarnation if self._is_live(live, now_ns) else 0

    def _on_init_producer_id(self, request: InitProducerIdRequest, sender: Any) -> list[Effect]:
        producer_id = int(self.state.get("producer-id/next", 1))
        self.state.put("producer-id/next", producer_id + 1)
        reply = InitProducerIdResponse(correlation_id=request.correlation_id, producer_id=producer_id,
                                       producer_secret=self.producer_secrets.of(producer_id))
        return [AfterFlush(self.state, (Send(sender, reply),))]

    def _store_partition(self, topic: str, partition: int, record: PartitionRecord) -> None:
        self.partitions[(topic, partition)] = record
        self.state.put(f"partition/{topic}/{partition}", msgspec.to_builtins(record))

    # ------------------------------------------------------------------ views

    def _partition_state(self, topic: str, partition: int, now_ns: int) -> PartitionState:
        record = self.partitions[(topic, partition)]
        topic_record = self.topics[topic]
        return PartitionState(
            topic=topic, topic_id=topic_record.topic_id, partition=partition, leader=record.leader,
            leader_endpoint=self._leader_endpoint(topic, partition, record, now_ns),
            leader_epoch=record.leader_epoch, partition_epoch=record.partition_epoch,
            leader_incarnation=record.leader_incarnation,
            replicas=list(topic_record.replicas[partition]), isr=list(record.isr),
            isr_incarnations=[record.isr_incarnations.get(node, 0) for node in record.isr],
            config=topic_record.config,
            last_unclean_epoch=record.last_unclean_epoch,
        )

    def _leader_endpoint(self, topic: str, partition: int, record: PartitionRecord, now_ns: int) -> str:
        if record.leader < 0:
            return ""
        live = self.liveness.get((topic, partition, record.leader))
        return live.endpoint if self._is_live(live, now_ns) else ""
