"""The follower role of a partition replica: a long-polling fetch loop from the leader.

One fetch is in flight at a time, carrying the follower's log end offset, the epoch of its last
batch and the leader epoch it believes current. The leader answers with whole batches (offsets
kept), its high watermark, or a diverging epoch when the follower's tail does not match its log.

Truncation is by leader epoch (KIP-101/KIP-279), never by high watermark alone: told that epoch
E ends at offset O in the leader's log, the follower truncates to min(O, where E ends in its own
log) and asks again with its new last epoch, until the logs agree. It never truncates below the
offset it has seen committed (PartitionReplica's committed floor) on a leader's word: a leader
that lacks committed records was not elected cleanly, so unless the coordinator announced an
unclean election since, the follower refuses, says so, and keeps its log. A fetch that the follower
makes next tells the leader what the follower holds, so with `flush_policy=every_batch` the next
fetch waits for the flush: the leader never counts bytes a follower could still lose.

For the same reason a follower whose scrubber finds damage inside its log does not cut the log at
once: its last fetch, on the way, says it holds everything. Its next fetch asks from below the
damage (with the epoch of the batch before it), and the log is cut there when that fetch is
answered — by then the leader holds the lower position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors.actor import MS
from actors.effects import AfterFlush, CancelTimer, Effect, Send, SetTimer, Trace
from actors.errors import ErrorCode
from actors.messages import FetchRequest, FetchResponse
from storage.batch import iter_batches
from storage.errors import CorruptBatch, CorruptLog, OutOfOrderBatch, StorageError, StorageFull

if TYPE_CHECKING:
    from actors.partition_replica import PartitionReplica

RETRY_BACKOFF_MS = 50
DISK_FULL_BACKOFF_MS = 1000
REFUSED_TRUNCATION_BACKOFF_MS = 1000  # until the coordinator sends a new state


class FollowerRole:
    def __init__(self, replica: "PartitionReplica") -> None:
        self.replica = replica
        self.leader_endpoint = replica.state.leader_endpoint
        self.epoch = replica.state.leader_epoch
        self.fetch_correlation = 0
        self.fetch_sent_ns = 0
        self.at_leader_end = False  # the last answer brought nothing: this follower holds everything
        # Damage found while following: the next fetch asks from below it, and the log is cut
        # there only when that fetch is answered. The leader may have counted this replica's last
        # position for an acks=all write; once it has the lower one, it counts that instead.
        self.cut_at: int | None = None
        self.fetch_cuts_at: int | None = None  # the cut the fetch in flight asked from

    def begin(self, now_ns: int) -> list[Effect]:
        return self.send_fetch(now_ns)

    def send_fetch(self, now_ns: int) -> list[Effect]:
        replica = self.replica
        if not self.leader_endpoint:
            self.fetch_correlation = 0
            return [SetTimer("follower-retry", now_ns + RETRY_BACKOFF_MS * MS)]
        replica.correlation += 1
        self.fetch_correlation = replica.correlation
        self.fetch_sent_ns = now_ns
        limits = replica.limits
        idle = self.at_leader_end and replica.node in replica.state.isr and replica.storage.healthy
        wait_ms = limits.replica_fetch_idle_wait_max_ms if idle else limits.replica_fetch_wait_max_ms
        # A cut asked for and not answered yet (a timeout, a retry) is asked for again.
        self.fetch_cuts_at = self.cut_at if self.cut_at is not None else self.fetch_cuts_at
        self.cut_at = None
        offset = replica.log.log_end_offset if self.fetch_cuts_at is None else self.fetch_cuts_at
        request = FetchRequest(
            correlation_id=self.fetch_correlation, topic=replica.topic, partition=replica.partition,
            topic_id=replica.topic_id, offset=offset, max_bytes=limits.replica_fetch_bytes_max,
            max_wait_ms=wait_ms, leader_epoch=self.epoch, replica=replica.node,
            last_fetched_epoch=replica.batch_epoch_below(offset), incarnation=replica.incarnation,
            repairing=not replica.storage.healthy, high_watermark=replica.high_watermark)
        deadline = now_ns + (limits.replica_fetch_timeout_ms + wait_ms) * MS
        return [Send(self.leader_endpoint, request), SetTimer("follower-fetch-timeout", deadline)]

    def fetch_from_cut(self, now_ns: int) -> list[Effect]:
        """Damage was found inside the log: ask again at once, from below it."""
        self.cut_at = self.replica.storage.cut_offset()
        return self.retry_later(now_ns, 0)

    def retry_later(self, now_ns: int, backoff_ms: int = RETRY_BACKOFF_MS) -> list[Effect]:
        self.fetch_correlation = 0
        return [CancelTimer("follower-fetch-timeout"), SetTimer("follower-retry", now_ns + backoff_ms * MS)]

    def on_fetch_response(self, response: FetchResponse, now_ns: int) -> list[Effect]:
        if response.correlation_id != self.fetch_correlation:
            return []  # an answer to a fetch we gave up on
        self.fetch_correlation = 0
        effects: list[Effect] = [CancelTimer("follower-fetch-timeout")]
        if self.fetch_cuts_at is not None:
            # The leader has this replica's position from below the damage now: the log may lose
            # what follows it. The answer was read from there, so it fits the cut log.
            cut, self.fetch_cuts_at = self.fetch_cuts_at, None
            target = self.replica.storage.cut_offset()
            if target is not None and target < cut:
                self.cut_at = target  # damage further down, found meanwhile: ask from there first
                return effects + self.send_fetch(now_ns)
            if target is not None:
                effects += self.replica.storage.cut_to(cut)
                self.replica.producers.truncate(self.replica.log.log_end_offset)
            elif cut < self.replica.log.log_end_offset:
                return effects + self.send_fetch(now_ns)  # nothing to cut any more: the answer does not fit
        code = response.error
        if code == ErrorCode.NONE and response.diverging_epoch is not None:
            truncated = self._truncate_to_leader(response, now_ns)
            if truncated and truncated[0].event == "follower-refused-truncation":
                return effects + truncated + self.retry_later(now_ns, REFUSED_TRUNCATION_BACKOFF_MS)
            return effects + truncated + self.send_fetch(now_ns)
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            return effects + self._reset_past_leader_start(response, now_ns)
        if code != ErrorCode.NONE:
            # NOT_LEADER, FENCED/UNKNOWN_LEADER_EPOCH, ...: the coordinator will tell us more.
            return effects + self.retry_later(now_ns)
        return effects + self._append(response, now_ns)

    def _append(self, response: FetchResponse, now_ns: int) -> list[Effect]:
        replica = self.replica
        records = response.records
        if len(records):
            try:
                replica.log.append_replicated_batches(records, now_ns // MS)
            except StorageFull as error:
                return [Trace("follower-disk-full", {"error": str(error)})] + self.retry_later(now_ns, DISK_FULL_BACKOFF_MS)
            except (OutOfOrderBatch, CorruptBatch) as error:
                return [Trace("follower-rejected-batches", {"error": str(error)})] + self.retry_later(now_ns)
            except StorageError as error:
                return replica.storage_failure(error)
            for _, header in iter_batches(records, verify=False):
                replica.producers.record(header.producer_id, header.producer_epoch, header.base_sequence,
                                         header.record_count, header.crc, header.base_offset)
        replica.advance_high_watermark(
            max(replica.high_watermark, min(response.high_watermark, replica.log.log_end_offset)), self.epoch)
        effects = replica.storage.after_fetch(response.log_end_offset)
        self.at_leader_end = not len(records) and replica.log.log_end_offset >= response.log_end_offset
        next_fetch = self.send_fetch(now_ns)
        if len(records) and replica.config.flush_policy == "every_batch":
            return effects + [AfterFlush(replica.log, tuple(next_fetch))]
        return effects + next_fetch

    def _truncate_to_leader(self, response: FetchResponse, now_ns: int) -> list[Effect]:
        replica = self.replica
        log = replica.log
        diverging = response.diverging_epoch
        before = log.log_end_offset
        if diverging.epoch < 0:
            target = log.log_start_offset
        else:
            _, own_end = log.end_offset_for_epoch(diverging.epoch)
            target = min(diverging.end_offset, own_end if own_end >= 0 else log.log_start_offset)
        target = max(target, log.log_start_offset)
        if target < replica.committed_offset and replica.storage.healthy and not replica.may_truncate_below_committed():
            return [Trace("follower-refused-truncation", {
                "topic": replica.topic, "partition": replica.partition, "node": replica.node,
                "leader_end_offset": diverging.end_offset, "target": target,
                "committed_offset": replica.committed_offset, "committed_epoch": replica.committed_epoch,
                "leader_epoch": self.epoch})]
        effects: list[Effect] = []
        if target <= before:
            try:
                log.truncate_to(target)  # also drops epoch entries from the target on, data or not
            except CorruptLog as error:
                # A header damaged since the open lies on the way to the cut: what follows it is
                # no copy to keep, and is fetched again as damage is (recorded, so the follower is
                # not taken as whole until it holds it again).
                effects += replica.storage.record_corruption(error)
                effects += replica.storage.cut_to(error.first_offset)
            replica.producers.truncate(log.log_end_offset)
        replica.lost_own_data(log.log_end_offset)
        return effects + [Trace("follower-truncated", {
            "topic": replica.topic, "partition": replica.partition, "from": before,
            "to": log.log_end_offset, "leader_epoch": diverging.epoch, "leader_end_offset": diverging.end_offset})]

    def _reset_past_leader_start(self, response: FetchResponse, now_ns: int) -> list[Effect]:
        replica = self.replica
        log = replica.log
        if response.log_start_offset > log.log_end_offset:
            before = log.log_end_offset
            log.reset_to(response.log_start_offset)
            replica.producers.truncate(0)
            replica.advance_high_watermark(log.log_end_offset, self.epoch)
            return [Trace("follower-reset", {"topic": replica.topic, "partition": replica.partition,
                                             "from": before, "to": response.log_start_offset})] + self.send_fetch(now_ns)
        return self.retry_later(now_ns)

    def on_timeout(self, now_ns: int) -> list[Effect]:
        self.at_leader_end = False  # the answer was lost: poll briskly until one comes back
        return [Trace("follower-fetch-timeout", {"leader": self.leader_endpoint})] + self.send_fetch(now_ns)

    def on_retry(self, now_ns: int) -> list[Effect]:
        if self.fetch_correlation:
            return []
        return self.send_fetch(now_ns)

    def nudge(self, now_ns: int) -> list[Effect]:
        """News about the partition (a new ISR or config in the same epoch): a fetch outstanding
        for longer than `replica_fetch_timeout_ms` may have been lost (a healed partition drops
        nothing later, but whatever it dropped is gone), so send a new one instead of waiting out
        the long poll. An answer to the old one is then ignored."""
        if not self.fetch_correlation or now_ns - self.fetch_sent_ns < self.replica.limits.replica_fetch_timeout_ms * MS:
            return []
        return [Trace("follower-fetch-renewed", {"leader": self.leader_endpoint})] + self.send_fetch(now_ns)

    def leader_moved(self, endpoint: str, now_ns: int) -> list[Effect]:
        """Same epoch, new endpoint (the leader restarted its socket): fetch from there."""
        self.leader_endpoint = endpoint
        return self.send_fetch(now_ns)

    def describe(self) -> dict[str, Any]:
        return {"leader_endpoint": self.leader_endpoint, "epoch": self.epoch}
