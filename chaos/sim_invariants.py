"""The promises the simulator checks while a run goes on, each from what the actors really did.

Each check watches one kind of event — a message an actor sends or receives, a trace, a boot, the
state after a step — so a run pays only for what it watches (`sends` and `receives` are looked up
by message type). A broken promise is a problem of the run, named with what was seen:

- one leader per partition and epoch, and one incarnation: a `became-leader` trace and every
  partition state the coordinator sends name (leader, incarnation) for an epoch; a later epoch
  naming another one is a reused epoch (a new incarnation of the same leader must bump it);
- a leader's high watermark never moves back within its epoch;
- an ISR member holds every committed offset: whenever the coordinator announces a partition's
  state, each ISR member running at the incarnation the coordinator recorded (with healthy
  storage) has a log reaching the highest high watermark any leader of the partition had;
- no follower had to refuse a leader's truncation (that leader lacked committed offsets);
- an acknowledged acks=all write is on at least `min_insync_replicas` replicas when the leader
  acknowledges it, each of which really holds it (every producer of the simulation, and the
  dead-letter writer, use acks=all);
- a restarted group coordinator holds every commit it acknowledged, at an offset no lower;
- one owner per partition per generation: two members of a group in the same generation never
  both hold a partition (assigned, or revoked and not answered yet by the user's thread).

Share groups' promises are in chaos/sim_share.py, which this module hands the share messages.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Any

from actors.errors import ErrorCode
from actors.messages import (
    AlterIsrResponse, OffsetCommitRequest, OffsetCommitResponse, ProduceResponse, ReplicaHeartbeatResponse,
    ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareAcquireRequest, ShareAcquireResponse,
)

if TYPE_CHECKING:
    from chaos.sim_hosts import Host
    from chaos.simulator import Simulator


def remember(asked: dict[Any, list], key: Any, value: Any) -> None:
    """Note a request the actor received, under (sender, correlation id). The network duplicates
    messages, and the actor answers each copy: every copy is kept, for its own answer."""
    asked.setdefault(key, []).append(value)


def recall(asked: dict[Any, list], key: Any) -> Any:
    """The request an answer under `key` answers (the oldest copy not answered yet), or None."""
    copies = asked.get(key)
    if not copies:
        return None
    value = copies.pop(0)
    if not copies:
        del asked[key]
    return value


def epoch_at(log: Any, offset: int) -> int:
    """The leader epoch of the batch holding `offset` in `log` (-1 if none)."""
    entries = log.epoch_entries()
    index = bisect_right([start for _, start in entries], offset) - 1
    return entries[index][0] if index >= 0 else -1


class Invariants:
    def __init__(self, sim: "Simulator") -> None:
        self.sim = sim
        self.leaders: dict[tuple[str, int, int], tuple[int, int]] = {}  # (topic, partition, epoch) -> (node, incarnation)
        self.announced: dict[tuple[str, int, int], tuple[int, int]] = {}  # the coordinator's states, likewise
        self.high_watermarks: dict[tuple[str, int, int], int] = {}
        self.committed: dict[tuple[str, int], int] = {}  # (topic, partition) -> highest high watermark
        self.commit_groups: dict[tuple[Any, int], list[str]] = {}  # (sender, correlation) -> groups of commits asked
        self.acknowledged: dict[tuple[str, str, int], int] = {}  # (group, topic, partition) -> highest acked offset
        self.holdings: dict[str, tuple[int, frozenset]] = {}  # consumer host -> (generation, partitions held)
        self.sends = {
            ProduceResponse: self._on_produce_response,
            OffsetCommitResponse: self._on_commit_response,
            ReplicaHeartbeatResponse: self._on_partition_state,
            AlterIsrResponse: self._on_partition_state,
            ShareAcquireResponse: lambda host, to, message: self.sim.share.on_acquired(host, to, message),
            ShareAcknowledgeResponse: lambda host, to, message: self.sim.share.on_acknowledged(host, to, message),
        }
        self.receives = {
            OffsetCommitRequest: self._on_commit_request,
            ShareAcquireRequest: lambda host, message, sender, now: self.sim.share.on_acquire(host, message, sender, now),
            ShareAcknowledgeRequest: lambda host, message, sender, now: self.sim.share.on_acknowledge(
                host, message, sender, now),
        }

    def problem(self, text: str) -> None:
        self.sim.problems.append(text)

    # ------------------------------------------------------------------ leaders and epochs

    def on_trace(self, host: "Host", event: str, details: dict) -> None:
        if event == "became-leader":
            key = (details["topic"], details["partition"], details["leader_epoch"])
            who = (details["node"], host.actor.incarnation)
            previous = self.leaders.setdefault(key, who)
            if previous[0] != who[0]:
                self.problem(f"two leaders for {key[0]}/{key[1]} in epoch {key[2]}: nodes {previous[0]} and {who[0]}")
            elif previous != who:
                self.problem(f"{key[0]}/{key[1]}: leader epoch {key[2]} reused by incarnation {who[1]} of node "
                             f"{who[0]} (incarnation {previous[1]} led in it)")
        elif event == "follower-refused-truncation":
            # The follower defended its log: the leader it was told to follow lacks offsets the
            # follower had seen committed. Only a broken election does that (no unclean election runs here).
            self.problem(f"{host.name}: leader of epoch {details['leader_epoch']} lacks committed offsets "
                         f"(it ends at {details['leader_end_offset']}; {details['committed_offset']} were "
                         f"committed in epoch {details['committed_epoch']})")
        elif event == "share-member-removed" and host.kind == "group-coordinator":
            self.sim.share.on_member_removed(details["group"], details["member"])

    def _on_partition_state(self, host: "Host", to: Any, message: Any) -> None:
        state = message.state
        if host.kind not in ("coordinator", "controller") or state is None or state.leader < 0 \
                or state.leader_incarnation == 0:
            return
        key = (state.topic, state.partition, state.leader_epoch)
        who = (state.leader, state.leader_incarnation)
        previous = self.announced.setdefault(key, who)
        if previous != who:
            self.problem(f"the coordinator reused leader epoch {key[2]} of {key[0]}/{key[1]}: node {previous[0]} "
                         f"incarnation {previous[1]}, then node {who[0]} incarnation {who[1]}")
        self._check_isr_holds_committed(host, state.topic, state.partition)

    def _check_isr_holds_committed(self, host: "Host", topic: str, partition: int) -> None:
        committed = self.committed.get((topic, partition), 0)
        coordinator = host.actor if host.kind == "coordinator" else host.actor.coordinator
        record = coordinator.partitions.get((topic, partition)) if coordinator is not None else None
        if record is None or not committed:
            return
        for node in record.isr:
            replica = self.sim.hosts.get(f"replica/{topic}/{partition}/n{node}")
            incarnation = record.isr_incarnations.get(node, 0)
            if replica is None or not replica.alive or incarnation == 0 or replica.actor.incarnation != incarnation \
                    or not replica.actor.storage.healthy:
                continue  # the coordinator cannot know of a restart or damage it was not told of yet
            if replica.actor.log.log_end_offset < committed:
                self.problem(f"the coordinator keeps node {node} (incarnation {incarnation}) in the ISR of "
                             f"{topic}/{partition}, but its log ends at {replica.actor.log.log_end_offset}, below "
                             f"the committed offset {committed}")

    def after_step(self, host: "Host") -> None:
        kind = host.kind
        if kind == "replica":
            if host.actor.leader is not None:
                self._check_high_watermark(host)
        elif kind == "consumer":
            self._check_owners(host)

    def _check_high_watermark(self, host: "Host") -> None:
        actor = host.actor
        key = (actor.topic, actor.partition, actor.leader.epoch)
        previous = self.high_watermarks.get(key, -1)
        if actor.high_watermark < previous:
            self.problem(f"{host.name}: high watermark moved back from {previous} to "
                         f"{actor.high_watermark} in epoch {key[2]}")
        self.high_watermarks[key] = max(previous, actor.high_watermark)
        committed = (actor.topic, actor.partition)
        if actor.high_watermark > self.committed.get(committed, 0):
            self.committed[committed] = actor.high_watermark

    # ------------------------------------------------------------------ acks=all

    def _on_produce_response(self, host: "Host", to: Any, response: ProduceResponse) -> None:
        """When the leader acknowledges a batch, at least min_insync_replicas members of its
        (maximal) ISR hold it: in their log if they run, or on their disk if they crashed (a
        crashed member counts, with interval flushing, if the leader saw it fetch past the batch:
        its unflushed tail is gone, which the leader cannot know, and railmq promises no more
        there). A member the leader counted by its fetch position must really hold the batch. A
        retry of a batch already below the high watermark is answered from the producer-state
        table: the batch met the rule when the high watermark passed it (the followers may be
        down now, after a restart of the whole partition)."""
        replica = host.actor
        role = replica.leader if host.kind == "replica" else None
        if role is None or response.error != ErrorCode.NONE:
            return
        last = response.last_offset
        where = f"{response.topic}/{response.partition} offsets {response.base_offset}..{last}"
        if last >= replica.log.log_end_offset:
            self.problem(f"{host.name} acknowledged {where}, past its log end {replica.log.log_end_offset}")
            return
        if last < replica.high_watermark and last < self.committed.get((response.topic, response.partition), 0):
            return  # a retry of a committed batch (before a restart, say): it was on the ISR when committed
        epoch = epoch_at(replica.log, last)
        holders = []
        for node in role.maximal_isr():
            if node == replica.node:
                holders.append(node)
                continue
            progress = role.progress.get(node)
            seen = progress.incarnation if progress is not None and progress.offset > last else None
            if self._holds(response.topic, response.partition, node, seen, last, epoch, replica.config.flush_policy,
                           host.name, where):
                holders.append(node)
        needed = replica.config.min_insync_replicas
        if len(holders) < needed:
            self.problem(f"{host.name} acknowledged an acks=all write ({where}) held by replicas {sorted(holders)} "
                         f"only; min_insync_replicas is {needed}")

    def _holds(self, topic: str, partition: int, node: int, seen: int | None, last: int, epoch: int,
               flush_policy: str, leader: str, where: str) -> bool:
        """Whether ISR member `node` holds offset `last` of `epoch`; `seen` is the incarnation the
        leader saw fetching past it (None: it saw no such fetch)."""
        other = self.sim.hosts.get(f"replica/{topic}/{partition}/n{node}")
        if other is None:
            return False
        if other.alive and (seen is None or other.actor.incarnation == seen):
            log = other.actor.log
            held = log.log_end_offset > last and epoch_at(log, last) == epoch
            if seen is not None and not held:
                self.problem(f"{leader} acknowledged {where} counting node {node}, whose log holds "
                             f"{log.log_end_offset} offsets (epoch {epoch_at(log, last)} at {last})")
            return held
        if seen is None:
            return False
        left_behind_at = other.state.get("zombies", {}).get(seen)
        if left_behind_at is not None:
            # An earlier process of the node, left behind when the node replaced it on a new disk
            # (chaos/sim_zombies.py): what it held then is as a wiped replica's (below), what it
            # fetched since is on no disk the node has.
            return last < left_behind_at
        durable = other.state.get("durable_end", {}).get(seen)
        if flush_policy == "every_batch" and durable is not None and durable <= last:
            self.problem(f"{leader} acknowledged {where} counting node {node}, which crashed with only "
                         f"{durable} offsets flushed")
            return False
        return True

    # ------------------------------------------------------------------ committed offsets

    def _on_commit_request(self, host: "Host", request: OffsetCommitRequest, sender: Any, now_ns: int) -> None:
        if host.kind == "group-coordinator":
            remember(self.commit_groups, (sender, request.correlation_id), request.group_id)

    def _on_commit_response(self, host: "Host", to: Any, response: OffsetCommitResponse) -> None:
        if host.kind != "group-coordinator":
            return
        group = recall(self.commit_groups, (to, response.correlation_id))
        if group is None or response.error != ErrorCode.NONE:
            return
        for entry in response.offsets:
            if entry.error == ErrorCode.NONE:
                key = (group, entry.topic, entry.partition)
                self.acknowledged[key] = max(self.acknowledged.get(key, -1), entry.offset)

    def on_boot(self, host: "Host") -> None:
        if host.kind != "group-coordinator":
            return
        offsets = host.actor.offsets
        for (group, topic, partition), acknowledged in sorted(self.acknowledged.items()):
            restored = offsets.get(group, {}).get((topic, partition))
            if restored is None or restored.offset < acknowledged:
                have = "nothing" if restored is None else f"offset {restored.offset}"
                self.problem(f"group coordinator #{host.incarnation} restarted with {have} for {group} "
                             f"{topic}/{partition}; it had acknowledged a commit of offset {acknowledged}")
        self.sim.share.on_coordinator_boot(host)

    def before_crash(self, host: "Host") -> None:
        """What a replica's disk keeps: its log up to the last flush."""
        if host.kind == "replica":
            try:
                flushed = host.actor.log.flushed_offset
            except Exception:  # a log closed by a failed fsync: what it flushed before is unknown here
                flushed = None
            if flushed is not None:
                host.state.setdefault("durable_end", {})[host.actor.incarnation] = flushed

    def on_crash(self, host: "Host") -> None:
        if host.kind == "group-coordinator":
            self.commit_groups.clear()
            self.sim.share.on_coordinator_crash()
        elif host.kind == "consumer":
            self.holdings.pop(host.name, None)

    # ------------------------------------------------------------------ one owner per generation

    def _check_owners(self, host: "Host") -> None:
        shell = self.sim.shells[host.name]
        generation = host.actor.member.generation
        signature = (generation, frozenset(shell.holdings()) if generation >= 0 else frozenset())
        if self.holdings.get(host.name) == signature:
            return
        self.holdings[host.name] = signature
        if generation < 0:
            return
        for other, (other_generation, held) in sorted(self.holdings.items()):
            if other != host.name and other_generation == generation and held & signature[1]:
                both = sorted(p for _, p in held & signature[1])
                self.problem(f"{host.name} and {other} both hold partitions {both} in generation {generation}")
