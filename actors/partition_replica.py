"""One replica of one partition: leader or follower of its log, in its own process.

The replica learns its role from the coordinator (heartbeat responses and pushes carrying a
`PartitionState`); the state with the higher (leader epoch, partition epoch) wins, older ones are
ignored. Roles:

    unknown --state--> leader | follower      (after start, before the coordinator answers)
    leader  --state with a newer epoch naming another node--> follower
    follower --state naming this node--> leader
    any     --deleted / not a replica any more--> stopped

Leader behaviour is in `replica_leader.py`, follower behaviour in `replica_follower.py`, the
transitions between roles in `replica_roles.py`, fetch serving in `replica_fetch.py` and what the
replica knows of its own disk in `replica_health.py`;
this module owns what they share: the log, the high watermark, heartbeats, retention, flushing,
and the dispatch. Consumers only ever see offsets below the high watermark. Storage errors that
leave the disk state unknown (a failed fsync) end in a `Crash` effect: the process dies and
restarts from what is on disk, never retries the fsync.

Who may say what: partition states, stop notices and ISR answers come only from the coordinator,
follower fetches only from replica processes — both proven by the cluster's authentication tag
(`needs_authentication`, checked by the runtime and the simulator before `handle`). Every
request is checked against this replica's own topic, topic id and partition (`misdirected`).

The committed floor: a replica remembers the highest high watermark it has seen and the leader
epoch it saw it in (persisted with the log's checkpoint). A follower never truncates below it
because a leader says so — a leader that lacks committed data was not elected cleanly — unless
the coordinator has since made an unclean election (`last_unclean_epoch`). `invariants()` checks
that a healthy replica's log never ends below it.
"""

from __future__ import annotations

from typing import Any

from actors.actor import MS
from actors.client_secrets import ProducerSecrets
from actors.controller_endpoints import ControllerEndpoints
from actors.effects import AfterFlush, CancelTimer, Crash, Effect, Send, SetTimer, Trace
from actors.errors import ErrorCode
from actors.limits import DEFAULT_LIMITS, Limits
from actors.messages import (
    AlterIsrResponse, ErrorResponse, FetchRequest, FetchResponse, ListOffsetsRequest, PartitionState,
    PeerDisconnected, ProduceRequest, ProduceResponse, ReplicaHeartbeat, ReplicaHeartbeatResponse, Stop,
    TimerFired, TopicConfig,
)
from actors.producer_state import ProducerStateTable
from actors.replica_fetch import FetchServing
from actors.replica_follower import FollowerRole
from actors.replica_health import ReplicaStorage
from actors.replica_leader import LeaderRole
from actors.replica_reports import ReplicaReporter
from actors.replica_roles import RoleChanges
from storage.errors import FsyncFailed, StorageError

RETENTION_CHECK_INTERVAL_MS = 5000  # retention deletes whole segments: no need to look often
FROM_THE_COORDINATOR = (ReplicaHeartbeatResponse, AlterIsrResponse)


class PartitionReplica(RoleChanges, FetchServing):
    def __init__(self, *, topic: str, topic_id: int, partition: int, node: int, endpoint: str,
                 coordinator: str, log: Any, config: TopicConfig, incarnation: int, pid: int = 0,
                 limits: Limits = DEFAULT_LIMITS, health: Any = None, findings: list[str] = (),
                 report_to: str = "", client_key: bytes = b"") -> None:
        self.name = f"replica/{topic}/{partition}/n{node}"
        self.topic, self.topic_id, self.partition, self.node = topic, topic_id, partition, node
        self.endpoint = endpoint
        self.controllers = ControllerEndpoints(coordinator)
        self.log = log
        self.config = config
        self.incarnation, self.pid = incarnation, pid
        self.limits = limits
        self.role = "unknown"
        self.refused_epoch = -1  # the leader epoch it last refused to lead, being damaged
        self.state: PartitionState | None = None
        self.leader: LeaderRole | None = None
        self.follower: FollowerRole | None = None
        self.correlation = 0
        self.parked: list = []
        self.producers = ProducerStateTable(self.limits.producer_ids_per_partition_max)
        self.producer_secrets = ProducerSecrets(client_key)  # a batch naming a producer id proves it
        self.counters_appended = 0
        self.deferred: list[Effect] = []  # effects found while building an answer (damage a read met)
        self.armed: set[str] = set()  # timers that are set and will fire (see _arm_timers)
        self.isr_check_at = 0  # the deadline of the "isr-check" timer while armed
        self.storage = ReplicaStorage(self, health, findings)
        self.reports = ReplicaReporter(self, report_to)
        # The committed floor (see the module docstring), restored from the log's checkpoint.
        restored = getattr(log, "high_watermark", 0) if self.storage.healthy else 0
        self.high_watermark = min(restored, log.log_end_offset)
        self.committed_offset = self.high_watermark
        self.committed_epoch = getattr(log, "high_watermark_epoch", -1) if self.high_watermark else -1
        self._rebuild_producer_state()

    def _rebuild_producer_state(self) -> None:
        for header in self.log.iter_headers(self.log.log_start_offset):
            self.producers.record(header.producer_id, header.producer_epoch, header.base_sequence,
                                  header.record_count, header.crc, header.base_offset)

    # ------------------------------------------------------------------ lifecycle

    def start(self, now_ns: int) -> list[Effect]:
        return [
            Trace("replica-started", {"topic": self.topic, "partition": self.partition, "node": self.node,
                                      "log_end_offset": self.log.log_end_offset, "high_watermark": self.high_watermark,
                                      "clean_shutdown": self.storage.clean_shutdown, "storage": self.storage.state(),
                                      "findings": self.storage.findings,
                                      "recovery": str(getattr(self.log, "recovery", ""))}),
            *self.reports.start(now_ns),
            SetTimer("scrub", now_ns + self.limits.scrub_interval_ms * MS),
        ]

    def needs_authentication(self, message: Any) -> bool:
        """Partition states, stop notices, ISR answers and fetch answers come from inside the
        cluster; so does a follower's fetch (it moves the high watermark)."""
        if isinstance(message, (ReplicaHeartbeatResponse, AlterIsrResponse, FetchResponse)):
            return True
        return isinstance(message, FetchRequest) and message.replica >= 0

    def invariants(self) -> None:
        assert 0 <= self.high_watermark <= self.log.log_end_offset or self.log.log_end_offset == 0, (
            f"{self.name}: high watermark {self.high_watermark} outside [0, {self.log.log_end_offset}]")
        assert (self.role == "leader") == (self.leader is not None), f"{self.name}: role {self.role} without its state"
        assert (self.role == "follower") == (self.follower is not None), f"{self.name}: role {self.role} without its state"
        if self.storage.healthy and self.role in ("leader", "follower"):
            assert self.log.log_end_offset >= self.committed_offset, (
                f"{self.name}: the log ends at {self.log.log_end_offset}, below the committed offset "
                f"{self.committed_offset} it saw in epoch {self.committed_epoch} (truncated on a leader's word?)")
        if self.leader is not None:
            self.leader.invariants()
        followers = [parked.replica for parked in self.parked if parked.replica >= 0]
        assert len(self.parked) - len(followers) <= self.limits.purgatory_fetch_max
        assert len(followers) == len(set(followers)), f"{self.name}: a follower holds two purgatory seats"

    # ------------------------------------------------------------------ dispatch

    def handle(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        effects = self._dispatch(message, sender, now_ns)
        if self.deferred:
            effects += self.deferred
            self.deferred = []
        return effects + self._arm_timers(now_ns) + self.reports.after_handling(now_ns)

    def _arm_timers(self, now_ns: int) -> list[Effect]:
        """Timers run only while there is work: a flush while data is unflushed, retention while
        a closed segment exists, the ISR check while the ISR could change. An idle replica with
        its followers parked at the log end so wakes for nothing (each fired timer is disarmed
        and set again here only if still needed)."""
        effects: list[Effect] = []
        if self.role not in ("leader", "follower"):
            return effects
        log = self.log
        if "flush" not in self.armed and self.config.flush_policy == "interval" \
                and log.log_end_offset > log.flushed_offset:
            self.armed.add("flush")
            effects.append(SetTimer("flush", now_ns + self.config.flush_interval_ms * MS))
        if "retention" not in self.armed and log.retention_applies:
            self.armed.add("retention")
            effects.append(SetTimer("retention", now_ns + RETENTION_CHECK_INTERVAL_MS * MS))
        deadline = self.leader.isr_check_deadline(now_ns) if self.leader is not None else None
        if deadline is None:
            if "isr-check" in self.armed:
                self.armed.discard("isr-check")
                effects.append(CancelTimer("isr-check"))
        elif "isr-check" not in self.armed or deadline < self.isr_check_at:
            self.armed.add("isr-check")
            self.isr_check_at = deadline
            effects.append(SetTimer("isr-check", deadline))
        return effects

    def _dispatch(self, message: Any, sender: Any, now_ns: int) -> list[Effect]:
        if self.role == "stopped" and not isinstance(message, Stop):
            return self._refuse(message, sender, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "this replica has stopped")
        match message:
            case ProduceRequest():
                return self._on_produce(message, sender, now_ns)
            case FetchRequest():
                return self._on_fetch(message, sender, now_ns)
            case FetchResponse():
                return self.follower.on_fetch_response(message, now_ns) if self.follower else []
            case ListOffsetsRequest():
                return self._on_list_offsets(message, sender, now_ns)
            case ReplicaHeartbeatResponse():
                return self._on_heartbeat_response(message, now_ns)
            case AlterIsrResponse():
                return self._on_alter_isr_response(message, now_ns)
            case TimerFired():
                return self._on_timer(message.name, now_ns)
            case ErrorResponse():
                if self.controllers.take(message):
                    return self._ask_controller_again(message.correlation_id, now_ns)
                return [Trace("peer-error", {"error": message.error, "message": message.error_message})]
            case PeerDisconnected():
                if message.endpoint == self.coordinator:
                    self.controllers.rotate()  # that controller is gone: ask the next voter
                if self.follower is not None and message.endpoint == self.follower.leader_endpoint:
                    return self.follower.retry_later(now_ns)
                return []
            case Stop():
                return self._on_stop()
            case _:
                return self._refuse(message, sender, ErrorCode.UNKNOWN_MESSAGE,
                                    f"a partition replica does not handle {type(message).__name__}")

    def _refuse(self, message: Any, sender: Any, code: ErrorCode, text: str) -> list[Effect]:
        if isinstance(sender, bytes) and hasattr(message, "correlation_id"):
            return [Send(sender, ErrorResponse(correlation_id=message.correlation_id, error=code, error_message=text))]
        return []

    def _on_timer(self, name: str, now_ns: int) -> list[Effect]:
        self.armed.discard(name)
        if name == "isr-check":
            self.isr_check_at = 0
        match name:
            case "heartbeat":
                return self.reports.send(now_ns)
            case "report":
                return self.reports.on_change_timer(now_ns)
            case "isr-check":
                return self.leader.check_isr(now_ns) if self.leader else []
            case "produce-expiry":
                return self.leader.expire_produces(now_ns) if self.leader else []
            case "fetch-expiry":
                return self._expire_parked(now_ns)
            case "follower-fetch-timeout":
                return self.follower.on_timeout(now_ns) if self.follower else []
            case "follower-retry":
                return self.follower.on_retry(now_ns) if self.follower else []
            case "flush":
                return self._on_flush_timer(now_ns)
            case "retention":
                return self._on_retention(now_ns)
            case "scrub":
                return self.storage.scrub(now_ns)
        raise AssertionError(f"{self.name}: unknown timer {name!r}")

    # ------------------------------------------------------------------ coordinator

    @property
    def coordinator(self) -> str:
        """Where ISR changes are asked for: the active controller, as far as known."""
        return self.controllers.current

    def _ask_controller_again(self, correlation_id: int, now_ns: int) -> list[Effect]:
        """A voter that does not lead refused our ISR change: ask the one it named."""
        leader = self.leader
        if leader is None or leader.pending_isr is None or correlation_id != leader.pending_isr_correlation:
            return []
        return leader.request_isr_again(now_ns)

    def report_message(self) -> ReplicaHeartbeat:
        """How this replica stands (see actors/replica_reports.py for when it is sent)."""
        state = self.state
        return ReplicaHeartbeat(
            topic=self.topic, topic_id=self.topic_id, partition=self.partition, node=self.node,
            endpoint=self.endpoint, pid=self.pid, incarnation=self.incarnation,
            leader_epoch=state.leader_epoch if state else -1, partition_epoch=state.partition_epoch if state else -1,
            log_start_offset=self.log.log_start_offset, log_end_offset=self.log.log_end_offset,
            high_watermark=self.committed_offset, storage=self.storage.report(),
            leader_endpoint=self.follower.leader_endpoint if self.follower is not None else "")

    def heartbeat_now(self) -> list[Effect]:
        """Storage news travels at once, not at the next report."""
        return self.reports.send_now()

    def last_batch_epoch(self) -> int:
        """The epoch of the last batch this replica holds (Kafka's lastFetchedEpoch): an epoch in
        which this replica led but wrote nothing has an entry starting at the log end, and it
        is not the epoch of any batch."""
        return self.batch_epoch_below(self.log.log_end_offset)

    def batch_epoch_below(self, offset: int) -> int:
        """The epoch of the last batch below `offset` (a fetch from below damage asks with it)."""
        epochs = [epoch for epoch, start in self.log.epoch_entries() if start < offset]
        return max(epochs) if epochs else -1

    def advance_high_watermark(self, value: int, epoch: int) -> None:
        self.high_watermark = value
        if value > self.committed_offset:
            self.committed_offset, self.committed_epoch = value, epoch

    def may_truncate_below_committed(self) -> bool:
        """An unclean election after the epoch this replica learned its committed offset in."""
        return self.state is not None and self.state.last_unclean_epoch > self.committed_epoch

    def lost_own_data(self, log_end: int) -> None:
        """The log shrank for a reason the replica accepts (its own damage, an unclean election):
        what it had seen committed is no longer what it holds."""
        self.high_watermark = min(self.high_watermark, log_end)
        self.committed_offset = min(self.committed_offset, log_end)

    def _on_heartbeat_response(self, response: ReplicaHeartbeatResponse, now_ns: int) -> list[Effect]:
        if response.deleted:
            return self._stop_for_good("the topic was deleted or this replica was removed")
        if response.state is None:
            return []
        return self.apply_state(response.state, now_ns)

    # ------------------------------------------------------------------ produce

    def _on_produce(self, request: ProduceRequest, sender: Any, now_ns: int) -> list[Effect]:
        misdirected = self.misdirected(request)
        if misdirected is not None:
            return self.produce_error(request, sender, *misdirected)
        if self.leader is None:
            return self.produce_error(request, sender, ErrorCode.NOT_LEADER, self._not_leader_text())
        return self.leader.on_produce(request, sender, now_ns)

    def produce_error(self, request: ProduceRequest, sender: Any, code: ErrorCode, text: str) -> list[Effect]:
        if request.acks == 0:
            return [Trace("produce-refused", {"error": code.name, "message": text})]
        return [Send(sender, ProduceResponse(correlation_id=request.correlation_id, topic=request.topic,
                                             partition=request.partition, error=code, error_message=text))]

    def durable_reply(self, sender: Any, response: Any) -> list[Effect]:
        """Replies that promise the data is written wait for the flush when the topic asks for it."""
        if self.config.flush_policy == "every_batch":
            return [AfterFlush(self.log, (Send(sender, response),))]
        return [Send(sender, response)]

    def storage_failure(self, error: StorageError) -> list[Effect]:
        return [Trace("storage-failure", {"error": repr(error)}), Crash(f"storage failure: {error}")]

    def _not_leader_text(self) -> str:
        if self.state is None:
            return f"node {self.node} does not know the leader of {self.topic}/{self.partition} yet"
        return f"node {self.node} is not the leader of {self.topic}/{self.partition}; node {self.state.leader} is"

    # ------------------------------------------------------------------ housekeeping

    def _on_flush_timer(self, now_ns: int) -> list[Effect]:
        try:
            self.log.flush()
        except FsyncFailed as error:
            return self.storage_failure(error)
        return []

    def _on_retention(self, now_ns: int) -> list[Effect]:
        deleted = self.log.apply_retention(now_ns // MS, upper_bound_offset=self.high_watermark)
        effects: list[Effect] = []
        if deleted:
            effects.append(Trace("retention", {"topic": self.topic, "partition": self.partition,
                                               "segments_deleted": deleted, "log_start_offset": self.log.log_start_offset}))
        return effects

    def _on_stop(self) -> list[Effect]:
        effects = self._leave_role(ErrorCode.NOT_LEADER, "the replica is shutting down")
        self.role = "stopped"
        self.log.note_high_watermark(self.committed_offset, self.committed_epoch)
        self.log.close()
        return effects
