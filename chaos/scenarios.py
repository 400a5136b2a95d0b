"""Named chaos scenarios: a workload shape plus a seeded fault schedule, as plain data.

A `Scenario` says what cluster and workload to run (`WorkloadShape`) and how to generate its
fault schedule: `scenario.schedule(rng, duration_s)` returns a list of `FaultStep`s, each an
abstract fault ("kill the leader of partition 1 at 4.2 s", "pause the followers of partition 0
and call them `f`") that the nemesis resolves against the live cluster when the step is due.
Nothing here touches a process or a clock, so the deterministic simulator can reuse the same
names and schedules later.

Invariants:
- a schedule is a pure function of the `random.Random` it is given and the duration: the same
  seed gives the same steps (replayable); the runner then keeps drawing target choices from
  that same generator, so one seed drives every random choice of a run;
- steps come in start order and every fault of a step ends (its `duration_s` elapses) before
  `duration_s - SCHEDULE_TAIL_S`, so the run heals from a known state;
- a step whose effect outlives it (a `pause` with a `label` and no duration) is always undone by
  a later step of the same schedule (`resume` with that label).

The safe scenarios keep the README's promise (RF 3, min in-sync 2, acks=all, idempotent
producers): the checker must find nothing. The teaching scenarios (`expect_loss=True`) break a
precondition of that promise on purpose and must lose acknowledged writes; the report names them.
Their producers are not idempotent: after a loss the new leader has never seen the sequence
numbers an idempotent producer continues from, so every later batch would be refused as out of
order until the delivery timeout, and the run would show a stuck partition instead of the loss.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

import msgspec

# No fault starts in the first seconds: the group must have joined and producers warmed up, so
# the first failover is measured against a running workload.
SCHEDULE_FIRST_S = 2.0
# Every fault is over this long before the end of the fault phase.
SCHEDULE_TAIL_S = 1.0
# Pauses and partitions last longer than the session timeout of the chaos limits (1.5 s), so the
# coordinator really declares the target dead and a zombie really exists when it comes back.
PAST_SESSION_S = (2.5, 3.5)

ACTIONS = ("kill", "pause", "resume", "restart", "isolate", "split", "cut", "slow-link", "disk-full",
           "fsync-fail", "crash-member", "wipe", "corrupt", "lose-node")
ROLES = ("leader", "follower", "followers", "replica", "node", "coordinator", "controller", "group-coordinator",
         "member", "producer", "label")


class FaultStep(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One abstract fault. `at_s` is seconds after the workload starts; `duration_s` > 0 means the
    nemesis undoes it (resume, heal) that long after it began; 0 means instantaneous."""

    at_s: float
    action: str
    role: str
    partition: int | None = None
    node: int | None = None
    duration_s: float = 0.0
    label: str = ""  # names the resolved targets (`pause ... label=f`, later `resume role=label label=f`)
    delay_ms: int = 0  # slow-link
    drop_probability: float = 0.0  # slow-link
    side: list[int] = []  # split: the nodes on one side (the coordinators stay with the other)
    one_way: bool = False  # a host split: only what goes from `node` to `side` is dropped

    @property
    def end_s(self) -> float:
        return self.at_s + self.duration_s


class WorkloadShape(msgspec.Struct, frozen=True, kw_only=True):
    """The cluster, topic and clients of a run."""

    nodes: int = 3
    partitions: int = 3
    replication_factor: int = 3
    min_insync_replicas: int = 2
    unclean_leader_election: bool = False
    flush_policy: str = "never"
    acks: int = -1  # -1 = all
    idempotent: bool = True
    producers: int = 2
    # Each producer sends at most this many records per second (a closed loop per key below
    # that): enough for thousands of acknowledged writes in a short run, without starving the
    # cluster's heartbeats on a 2-core machine.
    producer_rate_per_s: int = 250
    keys: int = 12  # shared by all producers; each producer has one send in flight per key
    members: int = 2  # members of the one consumer group
    member_session_timeout_ms: int = 1500
    # A member "processes" each polled batch this long before committing it, which widens the
    # window in which `crash-member` lands between the poll and the commit.
    member_processing_ms: int = 20


ScheduleFunction = Callable[[random.Random, WorkloadShape, float], list[FaultStep]]


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    schedule_function: ScheduleFunction
    shape: WorkloadShape = field(default_factory=WorkloadShape)
    expect_loss: bool = False
    # The nodes run as `railmq node` processes in network namespaces, one per host (chaos/netns.py),
    # and the faults are a host's (chaos/host_nemesis.py). Needs root; elsewhere the run is refused.
    over_hosts: bool = False

    def schedule(self, rng: random.Random, duration_s: float) -> list[FaultStep]:
        steps = self.schedule_function(rng, self.shape, duration_s)
        check_schedule(steps, duration_s)
        return steps


class ScheduleError(ValueError):
    """A generated schedule breaks one of the module's invariants (a programmer error)."""


def check_schedule(steps: list[FaultStep], duration_s: float) -> None:
    """Raise `ScheduleError` unless the steps are ordered, known, end in time and undo their labels."""
    open_labels: set[str] = set()
    previous_s = 0.0
    for step in steps:
        if step.action not in ACTIONS or step.role not in ROLES:
            raise ScheduleError(f"unknown action or role in {step}")
        if step.at_s < previous_s:
            raise ScheduleError(f"steps out of order at {step.at_s} s")
        if step.end_s > duration_s - SCHEDULE_TAIL_S + 1e-9:
            raise ScheduleError(f"{step.action} at {step.at_s} s ends after the fault phase")
        previous_s = step.at_s
        if step.action == "pause" and step.label and step.duration_s == 0:
            open_labels.add(step.label)
        if step.action == "resume":
            open_labels.discard(step.label)
    if open_labels:
        raise ScheduleError(f"paused and never resumed: {sorted(open_labels)}")


# --------------------------------------------------------------------------- schedule building

Episode = Callable[[random.Random, WorkloadShape, float], list[FaultStep]]


def rotation(rng: random.Random, shape: WorkloadShape, duration_s: float, episode: Episode, *,
             gap_s: tuple[float, float] = (2.0, 3.0), quiet_every: int = 3,
             quiet_s: tuple[float, float] = (2.0, 3.0)) -> list[FaultStep]:
    """Episodes one after another, separated by jittered gaps; every `quiet_every` episodes a
    longer quiet period lets the cluster settle completely. Stops at the first episode that would
    not end in time."""
    steps: list[FaultStep] = []
    start_s = SCHEDULE_FIRST_S + rng.uniform(0.0, 0.5)
    episodes = 0
    while True:
        batch = episode(rng, shape, round(start_s, 3))
        end_s = max(step.end_s for step in batch)
        if end_s > duration_s - SCHEDULE_TAIL_S:
            return steps
        steps += batch
        episodes += 1
        start_s = end_s + rng.uniform(*gap_s)
        if episodes % quiet_every == 0:
            start_s += rng.uniform(*quiet_s)


def _partition(rng: random.Random, shape: WorkloadShape) -> int:
    return rng.randrange(shape.partitions)


def _lasting(rng: random.Random, bounds: tuple[float, float]) -> float:
    return round(rng.uniform(*bounds), 3)


def kill_leader(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="kill", role="leader", partition=_partition(rng, shape))]


def kill_follower(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="kill", role="follower", partition=_partition(rng, shape))]


def kill_coordinator(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="kill", role=rng.choice(["coordinator", "group-coordinator"]))]


def kill_controller(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    """kill -9 the active controller (the quorum elects another; the old one restarts and follows)."""
    return [FaultStep(at_s=at_s, action="kill", role="controller")]


def isolate_controller(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    """Cut the active controller off from every other process for longer than an election."""
    return [FaultStep(at_s=at_s, action="isolate", role="controller", duration_s=_lasting(rng, (2.0, 3.0)))]


def kill_group_coordinator(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    """kill -9 the active group-coordination voter while members poll and commit."""
    return [FaultStep(at_s=at_s, action="kill", role="group-coordinator")]


def lose_node(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    """Every process of one node killed and its data directory deleted; it comes back empty."""
    return [FaultStep(at_s=at_s, action="lose-node", role="node", node=rng.randrange(1, shape.nodes + 1))]


def crash_member(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="crash-member", role="member")]


def kill_member(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="kill", role="member")]


def kill_producer(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="kill", role="producer")]


def pause_leader(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="pause", role="leader", partition=_partition(rng, shape),
                      duration_s=_lasting(rng, PAST_SESSION_S))]


def pause_member(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="pause", role="member", duration_s=_lasting(rng, PAST_SESSION_S))]


def isolate_leader(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="isolate", role="leader", partition=_partition(rng, shape),
                      duration_s=_lasting(rng, (2.5, 4.0)))]


def split_nodes(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    minority = [rng.randrange(1, shape.nodes + 1)]
    return [FaultStep(at_s=at_s, action="split", role="node", side=minority,
                      duration_s=_lasting(rng, PAST_SESSION_S))]


def cut_leader_outbound(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="cut", role="leader", partition=_partition(rng, shape),
                      duration_s=_lasting(rng, PAST_SESSION_S))]


def slow_leader_links(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="slow-link", role="leader", partition=_partition(rng, shape),
                      duration_s=_lasting(rng, (2.0, 3.0)), delay_ms=rng.choice([20, 50, 100]),
                      drop_probability=rng.choice([0.0, 0.05, 0.2]))]


def fill_disk(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="disk-full", role="replica", partition=_partition(rng, shape),
                      duration_s=_lasting(rng, (1.5, 2.5)))]


def lose_disk(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    """One replica's disk fails: its directory is wiped as it is killed, or a byte of a batch it
    flushed rots in place. A replica of another partition each time; the damaged one must repair
    before the partition is hit again, which the gaps between episodes leave time for."""
    if rng.random() < 0.5:
        return [FaultStep(at_s=at_s, action="wipe", role=rng.choice(["leader", "follower"]),
                          partition=_partition(rng, shape))]
    return [FaultStep(at_s=at_s, action="corrupt", role=rng.choice(["leader", "follower"]),
                      partition=_partition(rng, shape))]


def restart_node(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    return [FaultStep(at_s=at_s, action="restart", role="node", node=rng.randrange(1, shape.nodes + 1))]


# --------------------------------------------------------------------------- scenario schedules


def _single(episode: Episode, **rotation_options: object) -> ScheduleFunction:
    def schedule(rng: random.Random, shape: WorkloadShape, duration_s: float) -> list[FaultStep]:
        return rotation(rng, shape, duration_s, episode, **rotation_options)  # type: ignore[arg-type]
    return schedule


def rolling_restart_schedule(rng: random.Random, shape: WorkloadShape, duration_s: float) -> list[FaultStep]:
    """Each node's replicas restart gracefully in turn (shuffled order), then both coordinators;
    the rotation starts over while time remains. Gaps leave time to rejoin the ISR."""
    order: list[tuple[str, int | None]] = [("node", node) for node in range(1, shape.nodes + 1)]
    rng.shuffle(order)
    order += [("coordinator", None), ("group-coordinator", None)]
    position = [0]

    def next_restart(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
        role, node = order[position[0] % len(order)]
        position[0] += 1
        return [FaultStep(at_s=at_s, action="restart", role=role, node=node)]

    return rotation(rng, shape, duration_s, next_restart, gap_s=(2.5, 3.0), quiet_every=len(order))


def host_faults_schedule(rng: random.Random, shape: WorkloadShape, duration_s: float) -> list[FaultStep]:
    """Across hosts, in turn: a host cut off (its link down past the session timeout), every
    process of a host killed and started again a moment later, a host cut off from one other
    host only (both ways, or one way, past the session timeout: a partial partition), delay and
    loss on a host's link; random hosts each time. The order is fixed so even a short run
    partitions and kills."""
    position = [0]

    def next_fault(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
        action = ("isolate", "kill", "split", "slow-link")[position[0] % 4]
        position[0] += 1
        node = rng.randrange(1, shape.nodes + 1)
        if action == "isolate":
            return [FaultStep(at_s=at_s, action=action, role="node", node=node,
                              duration_s=_lasting(rng, PAST_SESSION_S))]
        if action == "split":
            other = rng.choice([peer for peer in range(1, shape.nodes + 1) if peer != node])
            return [FaultStep(at_s=at_s, action=action, role="node", node=node, side=[other],
                              one_way=rng.random() < 0.5, duration_s=_lasting(rng, PAST_SESSION_S))]
        if action == "kill":  # down this long, then `railmq node` starts again
            return [FaultStep(at_s=at_s, action=action, role="node", node=node, duration_s=_lasting(rng, (1.0, 2.0)))]
        return [FaultStep(at_s=at_s, action=action, role="node", node=node, duration_s=_lasting(rng, (2.0, 3.0)),
                          delay_ms=30, drop_probability=0.05)]

    return rotation(rng, shape, duration_s, next_fault, gap_s=(1.5, 2.0), quiet_every=3)


MIXED_EPISODES: tuple[Episode, ...] = (
    kill_leader, kill_follower, kill_coordinator, crash_member, kill_member, kill_producer, pause_leader,
    pause_member, isolate_leader, split_nodes, cut_leader_outbound, slow_leader_links, fill_disk,
    restart_node,
)


def mixed_schedule(rng: random.Random, shape: WorkloadShape, duration_s: float) -> list[FaultStep]:
    def any_episode(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
        return rng.choice(MIXED_EPISODES)(rng, shape, at_s)
    return rotation(rng, shape, duration_s, any_episode)


def acks1_leader_kill_episode(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    """Followers stop fetching for well under the lag time (so they stay in the ISR), the leader
    acknowledges acks=1 writes alone, then dies: a follower without those writes is elected."""
    partition = _partition(rng, shape)
    kill_at_s = round(at_s + rng.uniform(0.6, 0.9), 3)
    return [
        FaultStep(at_s=at_s, action="pause", role="followers", partition=partition, label="lagging"),
        FaultStep(at_s=kill_at_s, action="kill", role="leader", partition=partition),
        FaultStep(at_s=round(kill_at_s + 0.2, 3), action="resume", role="label", label="lagging"),
    ]


def unclean_election_episode(rng: random.Random, shape: WorkloadShape, at_s: float) -> list[FaultStep]:
    """The follower falls out of the ISR (paused past the lag time), the leader acknowledges
    writes alone (min in-sync 1), then stops; the stale follower comes back and, with unclean
    election on, is elected: the old leader's acknowledged tail is truncated when it returns."""
    partition = _partition(rng, shape)
    leader_pause_s = round(at_s + rng.uniform(3.5, 4.0), 3)
    return [
        FaultStep(at_s=at_s, action="pause", role="followers", partition=partition, label="stale"),
        FaultStep(at_s=leader_pause_s, action="pause", role="leader", partition=partition,
                  label="old-leader"),
        FaultStep(at_s=round(leader_pause_s + 0.2, 3), action="resume", role="label", label="stale"),
        FaultStep(at_s=round(leader_pause_s + 3.5, 3), action="resume", role="label", label="old-leader"),
    ]


_SAFE = [
    Scenario("leader-kill", "kill -9 the leader of a random partition", _single(kill_leader)),
    Scenario("follower-kill", "kill -9 a follower of a random partition", _single(kill_follower)),
    Scenario("coordinator-kill", "kill -9 the metadata coordinator or the group coordinator",
             _single(kill_coordinator)),
    Scenario("consumer-crash-before-commit",
             "kill -9 a group member after it polled and before it committed",
             _single(crash_member, gap_s=(1.5, 2.5))),
    Scenario("zombie-leader-pause", "SIGSTOP a leader past the session timeout, then SIGCONT it",
             _single(pause_leader, gap_s=(1.5, 2.5))),
    Scenario("isolate-leader", "cut a leader off from every peer and client, then heal",
             _single(isolate_leader, gap_s=(1.5, 2.5))),
    Scenario("rolling-restart", "restart every node's replicas in turn, then the coordinators",
             rolling_restart_schedule),
    Scenario("disk-loss", "wipe one replica's data directory as it is killed, or flip a byte of a batch it flushed",
             _single(lose_disk, gap_s=(3.0, 4.0))),
    Scenario("controller-kill", "kill -9 the active controller, again and again", _single(kill_controller)),
    Scenario("controller-isolate", "cut the active controller off from every other process, then heal",
             _single(isolate_controller, gap_s=(1.5, 2.5))),
    Scenario("group-coordinator-kill", "kill -9 the active group-coordination voter while members commit",
             _single(kill_group_coordinator)),
    Scenario("node-loss", "kill every process of one node and delete its data directory; it returns empty",
             _single(lose_node, gap_s=(4.0, 5.0))),
    Scenario("mixed", "a random rotation of every nemesis, with quiet periods", mixed_schedule),
    Scenario("multi-host", "three hosts (network namespaces): a host cut off, a host's processes killed, "
             "two hosts cut from each other, a lossy link", host_faults_schedule, over_hosts=True),
]
_TEACHING = [
    Scenario("acks1-leader-kill", "acks=1: the leader dies with writes its followers never fetched",
             _single(acks1_leader_kill_episode, gap_s=(2.0, 3.0)),
             shape=WorkloadShape(acks=1, idempotent=False), expect_loss=True),
    Scenario("unclean-election", "RF 2, min in-sync 1, unclean election on: a stale follower is elected",
             _single(unclean_election_episode, gap_s=(1.5, 2.5)),
             shape=WorkloadShape(replication_factor=2, min_insync_replicas=1, unclean_leader_election=True,
                                 idempotent=False),
             expect_loss=True),
]
SCENARIOS: dict[str, Scenario] = {scenario.name: scenario for scenario in _SAFE + _TEACHING}


class UnknownScenario(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no scenario named {name!r}; known: {', '.join(SCENARIOS)}")
        self.name = name

    def __str__(self) -> str:
        return str(self.args[0])


def get_scenario(name: str) -> Scenario:
    scenario = SCENARIOS.get(name)
    if scenario is None:
        raise UnknownScenario(name)
    return scenario


def safe_scenarios() -> list[Scenario]:
    return [scenario for scenario in SCENARIOS.values() if not scenario.expect_loss]


def teaching_scenarios() -> list[Scenario]:
    return [scenario for scenario in SCENARIOS.values() if scenario.expect_loss]
