"""The coordinator's side of node heartbeats: liveness per node, not per replica.

A node agent sends one `NodeHeartbeat` per `replica_heartbeat_interval_ms` for the replicas of
its nodes (Kafka's broker heartbeat). For each replica process it says which incarnation runs
and whether it still answers (its keepalive came within `replica_keepalive_timeout_ms`), and it
carries the reports that changed since the last heartbeat. The coordinator

- takes each carried report as if the replica had sent it (`_take_report`), answering the
  replica directly only when there is something to say (a newer partition state, "deleted");
- counts a listed, answering replica as seen now: the session timeout then runs on the node's
  heartbeats, and an idle replica costs the coordinator nothing of its own;
- marks a listed replica that stopped answering as not live at once (a paused process, one cut off
  from the network): the election does not wait out a session for what the agent already knows;
- pushes the partition state again to a replica whose last report shows older epochs (a push it
  missed), at most once per session timeout;
- ignores a heartbeat numbered at or below the last one taken from the same agent (a delayed
  or duplicated copy: what it says is older than what was taken);
- answers with the assignments only when they changed (`assignments_version`), and asks for every
  report (`full_report_wanted`) when it lacks one, as after its own restart.
"""

from __future__ import annotations

import zlib
from typing import Any

import msgspec

from actors.actor import MS
from actors.effects import Effect, Send, Trace
from actors.errors import ErrorCode
from actors.messages import NodeHeartbeat, NodeHeartbeatResponse, ReplicaAssignment, ReplicaHeartbeatResponse


NODE_AGENT_KEY = "node-agent/"  # + node id -> the agent id that runs it (kept with the metadata)


class NodeLiveness:
    """Mixed into the coordinator (actors/coordinator.py), which owns `liveness`, `topics`,
    `_take_report`, `_reconcile`, `_is_live` and `_partition_state`."""

    def _load_node_agents(self) -> None:
        """The agent recorded for each node, as if heard at the coordinator's start: after a
        failover, a second agent that reaches the new coordinator first is still the second."""
        for key, value in self.state.items(NODE_AGENT_KEY):
            suffix = key[len(NODE_AGENT_KEY):]
            if suffix.isdigit() and int(suffix) in self.nodes and isinstance(value, str):
                self.node_owners[int(suffix)] = (value, -1)  # -1: heard at the start (see _refuse_heartbeat)

    def _on_node_heartbeat(self, beat: NodeHeartbeat, sender: Any, now_ns: int) -> list[Effect]:
        refusal = self._refuse_heartbeat(beat, now_ns)
        if refusal is not None:
            code, text = refusal
            return [Send(sender, NodeHeartbeatResponse(correlation_id=beat.correlation_id, error=code,
                                                       error_message=text, cluster_id=self.cluster_id))]
        if self._stale_heartbeat(beat):
            return []  # its agent has moved on: the answer would be discarded, and its claims are old
        decided: list[Effect] = []  # decisions: revealed only once the state file is durable
        if beat.leaving:
            for node in beat.nodes:
                if self.node_owners.pop(node, None) is not None:
                    self.state.delete(f"{NODE_AGENT_KEY}{node}")
                    decided.append(Trace("node-agent-left", {"node": node, "agent": beat.agent_id}))
            return self._after_persist(decided, [Send(sender, NodeHeartbeatResponse(
                correlation_id=beat.correlation_id, cluster_id=self.cluster_id))])
        for node in beat.nodes:
            known = self.node_owners.get(node)
            if known is None or known[0] != beat.agent_id:
                # Recorded with the metadata, so the next active controller knows it too: a
                # second agent racing the first to it after a failover is still the second.
                self.state.put(f"{NODE_AGENT_KEY}{node}", beat.agent_id)
                decided.append(Trace("node-agent-registered", {"node": node, "agent": beat.agent_id,
                                                               "replaces": known[0] if known else ""}))
            self.node_owners[node] = (beat.agent_id, now_ns)
        replies: list[Effect] = []
        reported = set()
        for report in beat.reports:
            reported.add((report.topic, report.partition, report.node))
            changes, reply = self._take_report(report, now_ns, via_node=True)
            decided += changes
            if reply is None:
                continue  # a process already heard to exit (its last report, read late): the dead stay dead
            if report.endpoint and (reply.state is not None or reply.deleted or reply.error):
                replies.append(Send(report.endpoint, reply))
        full_wanted = False
        changed: set[tuple[str, int]] = set()
        for item in beat.replicas:
            key = (item.topic, item.partition, item.node)
            live = self.liveness.get(key)
            if live is None or live.incarnation != item.incarnation:
                full_wanted |= key not in reported and item.topic in self.topics
                continue
            was_live = self._is_live(live, now_ns)
            live.responsive, live.via_node = item.responsive, True
            if item.responsive:
                live.last_seen_ns = now_ns
            if self._is_live(live, now_ns) != was_live:
                changed.add((item.topic, item.partition))
            elif item.responsive and key not in reported:
                replies += self._push_if_stale(item.topic, item.partition, item.node, live, now_ns)
        for topic, partition in sorted(changed):
            if topic in self.topics:
                decided += self._reconcile(topic, partition, now_ns)
        replies.append(Send(sender, self._node_heartbeat_response(beat, full_wanted)))
        return self._after_persist(decided, replies)

    def _stale_heartbeat(self, beat: NodeHeartbeat) -> bool:
        """An agent numbers its heartbeats upwards (each is a fresh request): one numbered at or
        below the last taken from the same agent is a delayed or duplicated copy, and what it says
        is older than what was taken (the simulator's seed 4333: a copy reporting a repaired
        replica's empty directory undid its "ok", and the replica never got its ISR seat back).
        One entry per node, so the map is bounded by the cluster's nodes."""
        for node in beat.nodes:
            known = self.node_beats.get(node)
            if known is not None and known[0] == beat.agent_id and beat.correlation_id <= known[1]:
                return True
        for node in beat.nodes:
            self.node_beats[node] = (beat.agent_id, beat.correlation_id)
        return False

    def _refuse_heartbeat(self, beat: NodeHeartbeat, now_ns: int) -> tuple[ErrorCode, str] | None:
        """Why this heartbeat must not be taken, if it must not: it names a node the cluster lacks,
        speaks for a replica of a node it does not name (a header is a claim: the payload must
        agree with it), or comes from a second agent for a node another agent runs and was heard
        from within the node session (one node started twice: a cloned machine, a second
        `railmq node --node N`). That agent gets no assignments, so it starts no replicas, and it
        cannot call the node's replicas dead; it takes the node over once the other falls silent
        for a session or says it is leaving."""
        unknown = sorted(set(beat.nodes) - set(self.nodes))
        if unknown:
            return ErrorCode.INVALID_REQUEST, f"nodes {unknown} are not nodes of this cluster {self.nodes}"
        named = set(beat.nodes)
        strays = sorted(({item.node for item in beat.replicas} | {report.node for report in beat.reports}) - named)
        if strays:
            return ErrorCode.INVALID_REQUEST, (f"the heartbeat for nodes {sorted(named)} speaks for replicas of "
                                               + ", ".join(f"node {node}" for node in strays))
        session_ns = self.limits.node_session_timeout_ms * MS
        for node in beat.nodes:
            owner = self.node_owners.get(node)
            if owner is not None and owner[1] < 0:  # recorded, not heard yet: as if heard at the start
                owner = self.node_owners[node] = (owner[0], self.started_ns)
            if owner is not None and owner[0] != beat.agent_id and now_ns - owner[1] < session_ns:
                return ErrorCode.DUPLICATE_BROKER_REGISTRATION, (
                    f"node {node} is run by node agent {owner[0]!r}, heard {(now_ns - owner[1]) // MS} ms ago; "
                    f"a node runs one agent at a time (this one is {beat.agent_id!r}): stop the other, "
                    f"or this one takes the node over {self.limits.node_session_timeout_ms} ms after it falls silent")
        return None

    def _push_if_stale(self, topic: str, partition: int, node: int, live: Any, now_ns: int) -> list[Effect]:
        if (topic, partition) not in self.partitions or not live.endpoint:
            return []
        if not self._stale(topic, partition, node, live, now_ns):
            return []
        if now_ns - live.state_pushed_ns < self.limits.node_session_timeout_ms * MS:
            return []
        live.state_pushed_ns = now_ns
        return [Send(live.endpoint, ReplicaHeartbeatResponse(state=self._partition_state(topic, partition, now_ns)))]

    def _node_heartbeat_response(self, beat: NodeHeartbeat, full_wanted: bool) -> NodeHeartbeatResponse:
        # Built again only when a topic, its size or its config, or the tombstones changed; one
        # entry per set of nodes asked for (each node's agent asks for its own, in turn).
        nodes = tuple(beat.nodes)
        key = (len(self.tombstones), next(reversed(self.tombstones), None),
               tuple((name, record.topic_id, len(record.replicas), record.config)
                     for name, record in self.topics.items()))
        caches = self.__dict__.setdefault("_assignments_cache", {})
        cached = caches.get(nodes)
        if cached is None or cached[0] != key:
            if len(caches) >= ASSIGNMENT_CACHE_ENTRIES_MAX and nodes not in caches:
                caches.clear()  # agents asking for ever new sets of nodes: start over, bounded
            assignments = self._node_assignments(beat.nodes)
            cached = caches[nodes] = (key, assignments, _version_of(assignments, self.tombstones))
        _, assignments, version = cached
        changed = version != beat.assignments_version
        return NodeHeartbeatResponse(
            correlation_id=beat.correlation_id, cluster_id=self.cluster_id, assignments_version=version,
            assignments=assignments if changed else None,
            deleted_topic_ids=sorted(self.tombstones) if changed else [], full_report_wanted=full_wanted)

    def _node_assignments(self, nodes: list[int]) -> list[ReplicaAssignment]:
        wanted = set(nodes)
        return [
            ReplicaAssignment(topic=name, topic_id=record.topic_id, partition=partition, node=node,
                              config=record.config, replicas=list(placed))
            for name, record in sorted(self.topics.items())
            for partition, placed in enumerate(record.replicas)
            for node in placed if node in wanted
        ]


_encoder = msgspec.msgpack.Encoder()
# Cached assignment answers, one per set of nodes a heartbeat named: a cluster's agents name one
# node each, so a few entries; a hostile sender naming new sets cannot grow it past this.
ASSIGNMENT_CACHE_ENTRIES_MAX = 64


def _version_of(assignments: list[ReplicaAssignment], tombstones: dict[int, str]) -> str:
    """A fingerprint of what a node agent must act on: its assignments and the tombstones."""
    crc = zlib.crc32(_encoder.encode(assignments))
    crc = zlib.crc32(_encoder.encode(sorted(tombstones)), crc)
    return f"{len(assignments)}-{crc:08x}"
