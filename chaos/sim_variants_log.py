"""Broken variants of replication, elections and producer state (see chaos/sim_variants.py).

Each function patches one rule out of the production code and returns what puts it back. Where
the rule sits inside a longer method, the patch wraps the method and changes only that rule's
input or output, so the variant follows the code as it evolves.
"""

from __future__ import annotations

from typing import Any

from chaos.sim_variants import Restore, restore_all, swap


def _ack_before_replication() -> Restore:
    from actors import replica_leader

    original = replica_leader.LeaderRole._acknowledge

    def acknowledge(self, request, sender, base_offset, last_offset, now_ns):
        if request.acks == -1:
            return self.replica.durable_reply(sender, self._response(request.correlation_id, base_offset, last_offset))
        return original(self, request, sender, base_offset, last_offset, now_ns)

    return swap(replica_leader.LeaderRole, "_acknowledge", acknowledge)


def _commit_below_min_insync() -> Restore:
    """`min_insync_replicas` read as 1 where the high watermark moves and waiting acks=all
    requests are answered (the refusal of new requests still reads it right)."""
    import msgspec

    from actors import replica_leader

    def with_minimum_one(method: Any) -> Any:
        def patched(self, *args):
            replica = self.replica
            real = replica.config
            replica.config = msgspec.structs.replace(real, min_insync_replicas=1)
            try:
                return method(self, *args)
            finally:
                replica.config = real
        return patched

    cls = replica_leader.LeaderRole
    return restore_all(swap(cls, "after_log_growth", with_minimum_one(cls.after_log_growth)),
                       swap(cls, "complete_purgatory", with_minimum_one(cls.complete_purgatory)))


def _retry_answered_at_once() -> Restore:
    """A batch the producer-state table recognises as a retry is answered at once."""
    from actors import replica_leader
    from storage.batch import parse_header

    original = replica_leader.LeaderRole.on_produce

    def on_produce(self, request, sender, now_ns):
        replica = self.replica
        if request.acks == -1 and len(replica.state.isr) >= replica.config.min_insync_replicas:
            try:
                header = parse_header(request.batch, batch_bytes_max=replica.config.batch_bytes_max)
            except Exception:
                return original(self, request, sender, now_ns)
            verdict = replica.producers.check(header.producer_id, header.producer_epoch, header.base_sequence,
                                              header.record_count, header.crc)
            if verdict.duplicate_of is not None:
                mark = verdict.duplicate_of
                return replica.durable_reply(sender, self._response(request.correlation_id, mark.base_offset,
                                                                    mark.last_offset))
        return original(self, request, sender, now_ns)

    return swap(replica_leader.LeaderRole, "on_produce", on_produce)


def _fetch_before_flush() -> Restore:
    """The next fetch (which tells the leader what the follower holds) goes out before the flush."""
    from actors import replica_follower
    from actors.effects import AfterFlush

    original = replica_follower.FollowerRole._append

    def append(self, response, now_ns):
        effects = []
        for effect in original(self, response, now_ns):
            if type(effect) is AfterFlush:
                effects += list(effect.effects) + [AfterFlush(effect.store, ())]
            else:
                effects.append(effect)
        return effects

    return swap(replica_follower.FollowerRole, "_append", append)


def _serve_past_high_watermark() -> Restore:
    """A leader answers consumers (and share groups) as if its log end were the high watermark:
    they read records no quorum holds yet, which a failover may then cut."""
    from actors import replica_fetch

    original = replica_fetch.FetchServing._read

    def read(self, request):
        if getattr(request, "replica", 0) >= 0:
            return original(self, request)
        committed = self.high_watermark
        self.high_watermark = self.log.log_end_offset
        try:
            return original(self, request)
        finally:
            self.high_watermark = committed

    return swap(replica_fetch.FetchServing, "_read", read)


def _follower_forgets_producers() -> Restore:
    from actors import replica_follower

    original = replica_follower.FollowerRole._append

    def append(self, response, now_ns):
        producers = self.replica.producers
        producers.record = lambda *arguments, **keywords: None
        try:
            return original(self, response, now_ns)
        finally:
            del producers.record

    return swap(replica_follower.FollowerRole, "_append", append)


def _follower_trusts_leader_watermark() -> Restore:
    """A follower takes the leader's high watermark as its own, not bounded by its log end."""
    from actors import replica_follower

    original = replica_follower.FollowerRole._append

    def append(self, response, now_ns):
        effects = original(self, response, now_ns)
        replica = self.replica
        if response.high_watermark > replica.high_watermark:
            replica.advance_high_watermark(response.high_watermark, self.epoch)
        return effects

    return swap(replica_follower.FollowerRole, "_append", append)


def _retry_renumbered() -> Restore:
    """A retried batch is encoded again (fresh timestamps), taking the next sequence numbers, so
    the leader cannot recognise it as the batch it may already have appended."""
    from actors import producer_client

    cls = producer_client.ProducerClient
    send, retry = cls._send, cls._retry_or_fail
    records: dict[int, list] = {}

    def keep_records(self, pending, endpoint, now_ns):
        if pending.encoded is None:
            records[id(pending)] = list(pending.batch.records)
        return send(self, pending, endpoint, now_ns)

    def renumber(self, pending, code, text, now_ns):
        effects = retry(self, pending, code, text, now_ns)
        if id(pending) in records and pending.correlation_id not in self.in_flight:
            pending.batch.records = records[id(pending)]
            pending.encoded, pending.sequence = None, -1
        return effects

    return restore_all(swap(cls, "_send", keep_records), swap(cls, "_retry_or_fail", renumber))


def _elect_outside_isr() -> Restore:
    from actors import coordinator, elections

    original = elections.reconcile

    def reconcile(record, replicas, views, *, unclean_allowed, min_insync=1):
        """The real decision, then the bug: hand leadership to a live replica outside the ISR."""
        decision = original(record, replicas, views, unclean_allowed=unclean_allowed, min_insync=min_insync)
        current = decision.record if decision is not None else record
        outsiders = [n for n in replicas if n not in current.isr and n in views and views[n].live and n != current.leader]
        if not outsiders:
            return decision
        chosen = outsiders[0]
        forced = elections.PartitionRecord(
            leader=chosen, leader_epoch=current.leader_epoch + 1, partition_epoch=current.partition_epoch + 1,
            leader_incarnation=views[chosen].incarnation, isr=[chosen], isr_incarnations={chosen: views[chosen].incarnation})
        return elections.Decision(forced, [("leader-elected", {"leader": chosen, "leader_epoch": forced.leader_epoch,
                                                               "previous_leader": current.leader})])

    return swap(coordinator, "reconcile", reconcile)


def _elect_last_reporter() -> Restore:
    from actors import elections

    def classify(record, views, incarnations):
        standing = {}
        for node in record.isr:
            view = views.get(node)
            known = incarnations.get(node, 0)
            if view is None or not view.live:
                standing[node] = elections.DEAD
            elif known == 0 or known == view.incarnation:
                standing[node] = elections.CURRENT
            else:
                standing[node] = elections.UNCLEAN
        return standing

    return swap(elections, "_classify", classify)


def _trust_damaged_replicas() -> Restore:
    from actors import elections

    return swap(elections, "lost_data", lambda node, record, view: False)


def _restart_keeps_isr_seat() -> Restore:
    """Every restart with undamaged storage counts as a clean shutdown (KIP-966's rule misread)."""
    from actors import elections

    original = elections._classify

    def classify(record, views, incarnations):
        views = {node: (view._replace(clean=True) if view.reported and not view.damaged and not view.new_directory
                        else view) for node, view in views.items()}
        return original(record, views, incarnations)

    return swap(elections, "_classify", classify)


def _late_exit_notice_kills() -> Restore:
    """An exit notice is applied to whichever incarnation of the replica is live now."""
    import msgspec

    from actors import coordinator

    original = coordinator.Coordinator._on_replica_exited

    def on_exited(self, notice, now_ns):
        live = self.liveness.get((notice.topic, notice.partition, notice.node))
        if live is not None:
            notice = msgspec.structs.replace(notice, incarnation=live.incarnation)
        return original(self, notice, now_ns)

    return swap(coordinator.Coordinator, "_on_replica_exited", on_exited)


def _agent_takes_any_report() -> Restore:
    """The node agent takes a report about a replica of its node from whichever process sends it,
    as it did before it checked the incarnation: a zombie's too (chaos/sim_zombies.py)."""
    from chaos.sim_agents import SimNodeAgent

    return swap(SimNodeAgent, "_from_running_process", lambda self, report: True)


def _producer_window_counts_in_flight() -> Restore:
    """A new batch goes out whenever fewer than max_in_flight are in flight, however long ago the
    partition's oldest unsettled batch was sent: the leader may forget it before its retry."""
    from actors import producer_sequences

    return swap(producer_sequences.PartitionSequences, "may_send_new", lambda self, key, window: True)


def _unknown_producer_any_sequence() -> Restore:
    """The leader takes an unknown producer's first batch at any sequence, as a new producer's:
    a batch may overtake earlier ones it refused, which can then never be appended."""
    from actors import producer_state

    check = producer_state.ProducerStateTable.check

    def any_first(self, producer_id, producer_epoch, base_sequence, record_count, crc):
        if producer_id >= 0 and producer_id not in self._producers:
            return producer_state.APPEND
        return check(self, producer_id, producer_epoch, base_sequence, record_count, crc)

    return swap(producer_state.ProducerStateTable, "check", any_first)


def _producer_keeps_numbers_past_a_gap() -> Restore:
    """A batch that ended undelivered leaves no gap on record: the batches after it keep their
    numbers, which the leader never takes (it takes sequences in order), until their timeout."""
    from actors import producer_sequences

    return swap(producer_sequences.PartitionSequences, "ended_undelivered",
                lambda self, key, sequence, epoch: None)


PATCHES = {
    "ack-before-replication": _ack_before_replication,
    "commit-below-min-insync": _commit_below_min_insync,
    "retry-answered-at-once": _retry_answered_at_once,
    "fetch-before-flush": _fetch_before_flush,
    "serve-past-high-watermark": _serve_past_high_watermark,
    "follower-forgets-producers": _follower_forgets_producers,
    "elect-outside-isr": _elect_outside_isr,
    "elect-last-reporter": _elect_last_reporter,
    "trust-damaged-replicas": _trust_damaged_replicas,
    "restart-keeps-isr-seat": _restart_keeps_isr_seat,
    "late-exit-notice-kills": _late_exit_notice_kills,
    "follower-trusts-leader-watermark": _follower_trusts_leader_watermark,
    "retry-renumbered": _retry_renumbered,
    "agent-takes-any-report": _agent_takes_any_report,
    "producer-window-counts-in-flight": _producer_window_counts_in_flight,
    "unknown-producer-any-sequence": _unknown_producer_any_sequence,
    "producer-keeps-numbers-past-a-gap": _producer_keeps_numbers_past_a_gap,
}
