"""Network faults without root: which link faults each actor's fault switch must hold.

The transport runtime of every actor has a fault switch (transport/faults.py) that drops or
delays messages to and from peers whose endpoint or routing id starts with a given prefix. This
module turns a network fault ("isolate this actor", "split the nodes into these two sides",
"this actor can no longer send to those", "this link is slow and lossy") into the `LinkFault`
lists each actor must hold (pure functions), and `FaultBoard` keeps the faults that are active
and pushes each actor's combined list with `Admin.set_faults`.

How a peer is named: outbound messages to a peer's ROUTER go through a DEALER keyed by the
peer's endpoint; replies and inbound messages carry the sender's routing id
`"<actor name>|<pid>|<n>"`. So an actor is matched by `[endpoint, "<name>|"]` (the `|` keeps
`replica/t/1/n1` from matching `replica/t/1/n12`), and "everyone in the cluster" by
`CLUSTER_PEER_PREFIXES`: every endpoint, every actor kind and the workload's clients — but not
the harness's own admin client, whose routing id starts with `admin|`: heal and observation
must still reach an isolated actor, as Jepsen's control connection does.

Invariants: `set_faults` replaces an actor's whole fault state, so the board always sends the
union of every active fault's links for that actor together with its disk flag; after `heal()`
every actor the board can reach holds no fault.
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable, NamedTuple

from actors.errors import RailmqError
from actors.messages import LinkFault

# Every peer a cluster actor talks to, except the harness's admin client ("admin|...").
CLUSTER_PEER_PREFIXES = (
    "tcp://", "ipc://", "replica/", "coordinator|", "group-coordinator|", "node-agent|", "chaos-",
    "producer|", "consumer|", "railmq-",
)

LinkPlan = dict[str, list[LinkFault]]  # actor name -> link faults it must hold


class ActorRef(NamedTuple):
    name: str
    endpoint: str
    node: int  # 0 for the coordinators


def peer_prefixes(actor: ActorRef) -> list[str]:
    """What the actor's peers see of it: its endpoint (where they send) and its sockets' routing
    ids (`name|pid|n`, what it sends with). An endpoint not known yet is left out, never "": an
    empty prefix would match every peer (the fault switch refuses it)."""
    return [prefix for prefix in (actor.endpoint, f"{actor.name}|") if prefix]


def _peers_of(actors: list[ActorRef]) -> list[str]:
    return [prefix for actor in actors for prefix in peer_prefixes(actor)]


def isolation_plan(target: ActorRef, everyone: list[ActorRef]) -> LinkPlan:
    """The target hears and reaches nobody; everyone else drops the target, both ways."""
    plan: LinkPlan = {target.name: [LinkFault(peers=list(CLUSTER_PEER_PREFIXES), direction="both")]}
    for other in everyone:
        if other.name != target.name:
            plan[other.name] = [LinkFault(peers=peer_prefixes(target), direction="both")]
    return plan


def split_plan(side: list[ActorRef], other_side: list[ActorRef]) -> LinkPlan:
    """Two sides that cannot talk to each other; clients still reach both (like Jepsen's
    partitions, which cut between servers only)."""
    plan: LinkPlan = {}
    for actor in side:
        plan[actor.name] = [LinkFault(peers=_peers_of(other_side), direction="both")]
    for actor in other_side:
        plan[actor.name] = [LinkFault(peers=_peers_of(side), direction="both")]
    return plan


def one_way_plan(source: ActorRef, destinations: list[ActorRef]) -> LinkPlan:
    """`source` can no longer send to `destinations` (requests or replies); they still reach it."""
    return {source.name: [LinkFault(peers=_peers_of(destinations), direction="out")]}


def slow_link_plan(source: ActorRef, peers: list[ActorRef], delay_ms: int,
                   drop_probability: float) -> LinkPlan:
    """Messages between `source` and `peers` are delayed and sometimes dropped, both ways."""
    return {source.name: [LinkFault(peers=_peers_of(peers), direction="both", delay_ms=delay_ms,
                                    drop_probability=drop_probability)]}


class FaultBoard:
    """The active network and disk faults, and the pushes that make actors hold them.

    `endpoint_of(name)` gives an actor's current endpoint ("" when it is not running);
    `set_faults(endpoint, links, disk_full, fail_next_fsync)` reaches its runtime. A push to an
    actor that is down fails quietly and is reported in the returned list of sentences: a
    restarted actor starts with a clean switch anyway.
    """

    def __init__(self, endpoint_of: Callable[[str], str],
                 set_faults: Callable[[str, list[LinkFault], bool, bool], None]) -> None:
        self._endpoint_of = endpoint_of
        self._set_faults = set_faults
        self._lock = threading.Lock()
        self._plans: dict[int, LinkPlan] = {}
        self._disk_full: dict[int, str] = {}
        self._ids = itertools.count(1)

    def start_links(self, plan: LinkPlan) -> tuple[int, list[str]]:
        with self._lock:
            fault_id = next(self._ids)
            self._plans[fault_id] = plan
            return fault_id, self._push(sorted(plan))

    def start_disk_full(self, name: str) -> tuple[int, list[str]]:
        with self._lock:
            fault_id = next(self._ids)
            self._disk_full[fault_id] = name
            return fault_id, self._push([name])

    def fail_next_fsync(self, name: str) -> list[str]:
        with self._lock:
            return self._push([name], fail_next_fsync=True)

    def stop(self, fault_id: int) -> list[str]:
        with self._lock:
            plan = self._plans.pop(fault_id, {})
            disk = self._disk_full.pop(fault_id, None)
            names = sorted(set(plan) | ({disk} if disk else set()))
            return self._push(names)

    def heal(self, every_actor: list[str]) -> list[str]:
        """Drop every fault and clear the switch of every named actor."""
        with self._lock:
            self._plans.clear()
            self._disk_full.clear()
            return self._push(sorted(every_actor))

    @property
    def active(self) -> bool:
        return bool(self._plans or self._disk_full)

    def links_for(self, name: str) -> list[LinkFault]:
        return [link for plan in self._plans.values() for link in plan.get(name, [])]

    def _push(self, names: list[str], *, fail_next_fsync: bool = False) -> list[str]:
        problems = []
        disk_full = set(self._disk_full.values())
        for name in names:
            endpoint = self._endpoint_of(name)
            if not endpoint:
                problems.append(f"{name} is not running")
                continue
            try:
                self._set_faults(endpoint, self.links_for(name), name in disk_full, fail_next_fsync)
            except (RailmqError, TimeoutError) as error:
                problems.append(f"{name}: {error}")
        return problems
