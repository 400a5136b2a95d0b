"""The leader role of a partition replica: appends, serves fetches, keeps the ISR and high watermark.

Invariants it keeps (checked by `invariants()`):
- the high watermark never moves backwards while this replica leads in one epoch, and never
  passes the log end offset;
- the high watermark is at most the fetch position of every member of the *maximal* ISR (the
  committed ISR plus any addition still waiting for the coordinator, KIP-497), so an
  acknowledged acks=all write is on every replica the coordinator might elect next;
- an acks=all reply is sent only once the high watermark has passed the batch, and only while
  the ISR is at least `min_insync_replicas` (otherwise NOT_ENOUGH_REPLICAS_AFTER_APPEND);
- the high watermark does not move while the ISR is smaller than `min_insync_replicas` (KIP-966),
  so the eligible leader replicas the coordinator keeps for that case hold everything committed;
- ISR changes are only requests: the ISR used is the one the coordinator confirmed, so a zombie
  leader (paused, then resumed after a new election) cannot shrink the ISR to itself and
  acknowledge alone — its AlterIsr is refused with FENCED_LEADER_EPOCH.

Follower progress: a follower's position is the offset it asks for; it is "caught up" when it
asks for the log end offset, or for the end the leader had at its previous fetch (Kafka's
lastCaughtUpTimeMs). A follower lagging longer than `replica_lag_time_max_ms` leaves the ISR; one
that catches up to the high watermark and to the start of this leader epoch rejoins.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

from actors.actor import MS
from actors.client_secrets import producer_refusal_text
from actors.effects import Effect, Send, SetTimer, Trace
from actors.errors import ErrorCode
from actors.messages import AlterIsrRequest, FetchRequest, ProduceResponse
from storage.batch import parse_header
from storage.errors import BatchTooLarge, CorruptBatch, InvalidBatch, StorageError, StorageFull

if TYPE_CHECKING:
    from actors.partition_replica import PartitionReplica


class FollowerProgress:
    __slots__ = ("offset", "incarnation", "last_fetch_ns", "end_at_last_fetch", "last_caught_up_ns", "repairing")

    def __init__(self, now_ns: int) -> None:
        self.repairing = False
        self.offset = -1
        self.incarnation = 0
        self.last_fetch_ns = now_ns
        self.end_at_last_fetch = 0
        self.last_caught_up_ns = now_ns


class PendingProduce:
    __slots__ = ("sender", "correlation_id", "base_offset", "last_offset", "deadline_ns")

    def __init__(self, sender: Any, correlation_id: int, base_offset: int, last_offset: int, deadline_ns: int) -> None:
        self.sender = sender
        self.correlation_id = correlation_id
        self.base_offset = base_offset
        self.last_offset = last_offset
        self.deadline_ns = deadline_ns


class LeaderRole:
    def __init__(self, replica: "PartitionReplica", now_ns: int) -> None:
        self.replica = replica
        self.epoch = replica.state.leader_epoch
        self.epoch_start_offset = replica.log.log_end_offset
        self.became_leader_ns = now_ns
        self.progress: dict[int, FollowerProgress] = {}
        self.pending_isr: list[int] | None = None
        self.pending_isr_sent_ns = 0
        self.pending_isr_correlation = 0
        # Members proposed in an ISR change whose answer never came, and the partition epoch the
        # proposal was based on: the coordinator may have taken them in, so they stay in the
        # maximal ISR until a state newer than that epoch says (the simulator's seed 4780).
        self.unconfirmed: list[int] = []
        self.unconfirmed_epoch = -1
        self.purgatory: SortedList = SortedList(key=lambda item: (item.last_offset, id(item)))
        self.deadlines: list[tuple[int, int, PendingProduce]] = []

    # ------------------------------------------------------------------ produce

    def on_produce(self, request: Any, sender: Any, now_ns: int) -> list[Effect]:
        replica = self.replica
        config = replica.config
        if request.acks not in (0, 1, -1):
            return replica.produce_error(request, sender, ErrorCode.INVALID_REQUEST, f"acks must be 0, 1 or -1, got {request.acks}")
        if request.acks == -1 and len(replica.state.isr) < config.min_insync_replicas:
            return replica.produce_error(request, sender, ErrorCode.NOT_ENOUGH_REPLICAS, (
                f"the ISR {replica.state.isr} is smaller than min_insync_replicas={config.min_insync_replicas}"))
        if request.acks == -1 and len(self.purgatory) >= replica.limits.purgatory_produce_max:
            return replica.produce_error(request, sender, ErrorCode.BUSY, "too many acks=all requests waiting")
        try:
            header = parse_header(request.batch, batch_bytes_max=config.batch_bytes_max)
        except BatchTooLarge as error:
            return replica.produce_error(request, sender, ErrorCode.MESSAGE_TOO_LARGE, str(error))
        except CorruptBatch as error:
            return replica.produce_error(request, sender, ErrorCode.CORRUPT_MESSAGE, str(error))
        if header.producer_id >= 0 and not replica.producer_secrets.proves(header.producer_id,
                                                                           request.producer_secret):
            return replica.produce_error(request, sender, ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                         producer_refusal_text(header.producer_id))
        ahead_ms = header.max_timestamp_ms - now_ns // MS
        if ahead_ms > replica.limits.record_timestamp_future_max_ms:
            return replica.produce_error(request, sender, ErrorCode.INVALID_TIMESTAMP, (
                f"the batch's newest timestamp {header.max_timestamp_ms} is {ahead_ms} ms in the future; at most "
                f"{replica.limits.record_timestamp_future_max_ms} ms is accepted (record_timestamp_future_max_ms)"))
        verdict = replica.producers.check(header.producer_id, header.producer_epoch,
                                          header.base_sequence, header.record_count, header.crc)
        if verdict.duplicate_of is not None:
            mark = verdict.duplicate_of
            return self._acknowledge(request, sender, mark.base_offset, mark.last_offset, now_ns)
        if verdict.error != ErrorCode.NONE:
            return replica.produce_error(request, sender, verdict.error, verdict.message)
        try:
            result = replica.log.append_producer_batch(request.batch, self.epoch, now_ns // MS)
        except BatchTooLarge as error:
            return replica.produce_error(request, sender, ErrorCode.MESSAGE_TOO_LARGE, str(error))
        except CorruptBatch as error:
            return replica.produce_error(request, sender, ErrorCode.CORRUPT_MESSAGE, str(error))
        except InvalidBatch as error:
            return replica.produce_error(request, sender, ErrorCode.INVALID_RECORD, str(error))
        except StorageFull as error:
            return replica.produce_error(request, sender, ErrorCode.DISK_FULL, str(error))
        except StorageError as error:
            return replica.storage_failure(error)
        replica.producers.record(header.producer_id, header.producer_epoch, header.base_sequence,
                                 header.record_count, header.crc, result.base_offset)
        replica.counters_appended += header.record_count
        effects = self._acknowledge(request, sender, result.base_offset, result.last_offset, now_ns)
        return effects + self.after_log_growth(now_ns)

    def _acknowledge(self, request: Any, sender: Any, base_offset: int, last_offset: int, now_ns: int) -> list[Effect]:
        if request.acks == 0:
            return []
        if request.acks == 1 or self.replica.high_watermark > last_offset:
            return self.replica.durable_reply(sender, self._response(request.correlation_id, base_offset, last_offset))
        pending = PendingProduce(sender, request.correlation_id, base_offset, last_offset,
                                 now_ns + request.timeout_ms * MS)
        self.purgatory.add(pending)
        heapq.heappush(self.deadlines, (pending.deadline_ns, id(pending), pending))
        return [SetTimer("produce-expiry", self.deadlines[0][0])]

    def _response(self, correlation_id: int, base_offset: int, last_offset: int,
                  error: ErrorCode = ErrorCode.NONE, text: str = "") -> ProduceResponse:
        replica = self.replica
        return ProduceResponse(
            correlation_id=correlation_id, topic=replica.topic, partition=replica.partition,
            error=error, error_message=text, base_offset=base_offset, last_offset=last_offset,
            leader_epoch=self.epoch, log_start_offset=replica.log.log_start_offset)

    def complete_purgatory(self) -> list[Effect]:
        """Answer every acks=all request the high watermark has passed; with the ISR below
        `min_insync_replicas`, answer every waiting one now: written, but it cannot commit (the
        high watermark is frozen) until the ISR grows again."""
        replica = self.replica
        effects: list[Effect] = []
        short = len(replica.state.isr) < replica.config.min_insync_replicas
        while self.purgatory and (short or self.purgatory[0].last_offset < replica.high_watermark):
            pending = self.purgatory.pop(0)
            if short:
                response = self._response(pending.correlation_id, pending.base_offset, pending.last_offset,
                                          ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                                          f"written, but the ISR {replica.state.isr} fell below min_insync_replicas")
            else:
                response = self._response(pending.correlation_id, pending.base_offset, pending.last_offset)
            effects += replica.durable_reply(pending.sender, response)
        return effects

    def expire_produces(self, now_ns: int) -> list[Effect]:
        effects: list[Effect] = []
        while self.deadlines and self.deadlines[0][0] <= now_ns:
            _, _, pending = heapq.heappop(self.deadlines)
            if pending not in self.purgatory:
                continue
            self.purgatory.remove(pending)
            effects.append(Send(pending.sender, self._response(
                pending.correlation_id, pending.base_offset, pending.last_offset, ErrorCode.REQUEST_TIMED_OUT,
                "not replicated to the ISR in time; the record may still become visible")))
        while self.deadlines and self.deadlines[0][2] not in self.purgatory:
            heapq.heappop(self.deadlines)
        if self.deadlines:
            effects.append(SetTimer("produce-expiry", self.deadlines[0][0]))
        return effects

    def abandon(self, code: ErrorCode, text: str) -> list[Effect]:
        """Leadership is lost: every waiting acks=all request learns it (its fate is unknown)."""
        effects = [Send(pending.sender, self._response(pending.correlation_id, pending.base_offset,
                                                       pending.last_offset, code, text))
                   for pending in self.purgatory]
        self.purgatory.clear()
        self.deadlines.clear()
        return effects

    # ------------------------------------------------------------------ followers

    def on_follower_fetch(self, request: FetchRequest, now_ns: int) -> None:
        """Record a follower's position (its log matches ours up to `request.offset`)."""
        replica = self.replica
        progress = self.progress.get(request.replica)
        if progress is None:
            progress = self.progress[request.replica] = FollowerProgress(self.became_leader_ns)
        end = replica.log.log_end_offset
        if request.offset >= end:
            progress.last_caught_up_ns = now_ns
        elif request.offset >= progress.end_at_last_fetch and progress.offset >= 0:
            progress.last_caught_up_ns = max(progress.last_caught_up_ns, progress.last_fetch_ns)
        progress.offset = request.offset
        progress.incarnation = request.incarnation
        progress.repairing = request.repairing
        progress.last_fetch_ns = now_ns
        progress.end_at_last_fetch = end

    def maximal_isr(self) -> list[int]:
        """The confirmed ISR, with every member a change in flight or unanswered may have added:
        the high watermark waits for each (Kafka's maximal ISR)."""
        state = self.replica.state
        if self.unconfirmed and state.partition_epoch > self.unconfirmed_epoch:
            self.unconfirmed = []  # a state newer than the proposal: the coordinator's word on it
        isr = list(state.isr)
        for node in [*(self.pending_isr or []), *self.unconfirmed]:
            if node not in isr:
                isr.append(node)
        return isr

    def compute_high_watermark(self) -> int:
        replica = self.replica
        positions = [replica.log.log_end_offset]
        for node in self.maximal_isr():
            if node == replica.node:
                continue
            progress = self.progress.get(node)
            positions.append(progress.offset if progress is not None and progress.offset >= 0 else -1)
        return min(positions)

    def after_log_growth(self, now_ns: int) -> list[Effect]:
        """The log or a follower moved: advance the high watermark and wake whoever waits.

        The high watermark advances only while the ISR has at least `min_insync_replicas`
        members (KIP-966): otherwise a leader alone would commit records that no other replica
        holds, and the replicas the coordinator may elect instead (the ELR) would not have them.
        That ISR is the one the coordinator confirmed, as Kafka's isUnderMinIsr reads it: a
        proposed member only makes the high watermark wait for it too (`maximal_isr`) — counted
        for min_insync, it let a leader alone commit what the coordinator's ELR did not hold
        (the simulator's seed 2220)."""
        replica = self.replica
        candidate = self.compute_high_watermark()
        effects: list[Effect] = []
        if candidate > replica.high_watermark and len(set(replica.state.isr)) >= replica.config.min_insync_replicas:
            replica.advance_high_watermark(candidate, self.epoch)
            effects += self.complete_purgatory()
        return effects + replica.wake_parked_fetches(now_ns)

    # ------------------------------------------------------------------ ISR maintenance

    def note_parked_answered(self, request: FetchRequest, now_ns: int) -> None:
        """A follower's fetch that waited here is answered: if it held the whole log when it came
        (and so ever since), the follower was caught up until this moment."""
        progress = self.progress.get(request.replica)
        if progress is not None and request.offset >= progress.end_at_last_fetch:
            progress.last_caught_up_ns = max(progress.last_caught_up_ns, now_ns)

    def followers_waiting_at_end(self) -> set[int]:
        """Followers whose fetch is parked here at the log end: each holds everything, now."""
        end = self.replica.log.log_end_offset
        return {parked.replica for parked in self.replica.parked
                if parked.replica >= 0 and parked.request.offset >= end}

    def isr_check_deadline(self, now_ns: int) -> int | None:
        """When the ISR could next need a change with no new message: a pending change's answer
        running late, or an in-sync follower that is not waiting at the log end reaching
        `replica_lag_time_max_ms` behind; None while every replica is in the ISR and every
        follower waits at the log end (then a produce or a fetch comes first, and asks again).
        An idle partition so sets no ISR timer at all."""
        replica = self.replica
        limits = replica.limits
        state = replica.state
        interval_ns = limits.isr_check_interval_ms * MS
        if self.pending_isr is not None or len(set(state.isr)) != len(set(state.replicas)):
            return now_ns + interval_ns
        waiting = self.followers_waiting_at_end()
        deadlines = []
        for node in state.isr:
            if node == replica.node or node in waiting:
                continue
            progress = self.progress.get(node)
            last = progress.last_caught_up_ns if progress is not None else self.became_leader_ns
            deadlines.append(last + limits.replica_lag_time_max_ms * MS + 1)
        return max(now_ns + MS, min(deadlines)) if deadlines else None

    def check_isr(self, now_ns: int) -> list[Effect]:
        replica = self.replica
        limits = replica.limits
        for node in self.followers_waiting_at_end():
            progress = self.progress.get(node)
            if progress is not None:
                progress.last_caught_up_ns = now_ns  # a fetch parked at the end is caught up (Kafka's rule)
        if self.pending_isr is not None:
            if now_ns - self.pending_isr_sent_ns < limits.alter_isr_timeout_ms * MS:
                return []
            # Unanswered: ask again below, of the next voter. What it would have added may be in
            # the coordinator's ISR already (the answer alone may be lost).
            state = replica.state
            self.unconfirmed = sorted(node for node in {*self.unconfirmed, *self.pending_isr} if node not in state.isr)
            self.unconfirmed_epoch = state.partition_epoch
            self.pending_isr = None
            self.replica.controllers.rotate()
        lag_ns = limits.replica_lag_time_max_ms * MS
        isr = [node for node in replica.state.isr if node == replica.node or not self._lagging(node, now_ns, lag_ns)]
        for node in replica.state.replicas:
            if node not in isr and self._caught_up(node, now_ns, lag_ns):
                isr.append(node)
        if sorted(isr) == sorted(replica.state.isr) and not self.unconfirmed:
            return []
        # With members unconfirmed, ask even for no change: the answer is a state that says
        # whether the unanswered request was taken (else they would hold the high watermark back
        # for good, the lost request never to be answered).
        ordered = [node for node in replica.state.replicas if node in isr]
        return self._request_isr(ordered, now_ns)

    def expand_isr_if_caught_up(self, node: int, now_ns: int) -> list[Effect]:
        """Kafka's maybeExpandIsr: a follower whose fetch shows it caught up is proposed into the
        ISR on that fetch, not at the next periodic check — every moment it waits for its seat is
        a moment in which one more lost disk takes the partition offline."""
        replica = self.replica
        if self.pending_isr is not None or node in replica.state.isr:
            return []
        if not self._caught_up(node, now_ns, replica.limits.replica_lag_time_max_ms * MS):
            return []
        return self.check_isr(now_ns)

    def _lagging(self, node: int, now_ns: int, lag_ns: int) -> bool:
        progress = self.progress.get(node)
        last = progress.last_caught_up_ns if progress is not None else self.became_leader_ns
        return now_ns - last > lag_ns

    def _caught_up(self, node: int, now_ns: int, lag_ns: int) -> bool:
        progress = self.progress.get(node)
        return (progress is not None and not progress.repairing and progress.offset >= self.replica.high_watermark
                and progress.offset >= self.epoch_start_offset and now_ns - progress.last_caught_up_ns <= lag_ns)

    def _request_isr(self, isr: list[int], now_ns: int) -> list[Effect]:
        replica = self.replica
        self.pending_isr = isr
        self.pending_isr_sent_ns = now_ns
        replica.correlation += 1
        self.pending_isr_correlation = replica.correlation
        incarnations = [replica.incarnation if node == replica.node else
                        (self.progress[node].incarnation if node in self.progress else 0) for node in isr]
        request = AlterIsrRequest(
            correlation_id=replica.correlation, topic=replica.topic, partition=replica.partition,
            leader=replica.node, leader_epoch=self.epoch, partition_epoch=replica.state.partition_epoch,
            isr=isr, isr_incarnations=incarnations)
        trace = Trace("isr-change-requested", {"topic": replica.topic, "partition": replica.partition,
                                               "isr": isr, "previous_isr": list(replica.state.isr)})
        return [trace, Send(replica.coordinator, request)]

    def request_isr_again(self, now_ns: int) -> list[Effect]:
        """The same ISR change, to the controller now believed active (a redirect)."""
        return self._request_isr(list(self.pending_isr or []), now_ns)

    def isr_answered(self, correlation_id: int) -> bool:
        if self.pending_isr is None or correlation_id != self.pending_isr_correlation:
            return False
        self.pending_isr = None
        return True

    def invariants(self) -> None:
        replica = self.replica
        assert replica.high_watermark <= replica.log.log_end_offset, (
            f"high watermark {replica.high_watermark} past log end {replica.log.log_end_offset}")
        for pending in self.purgatory:
            assert pending.last_offset >= replica.high_watermark, "a passed acks=all request is still waiting"
