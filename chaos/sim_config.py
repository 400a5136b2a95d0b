"""What a simulated run is given: the shape of the cluster, its workload, the faults it may
suffer, and the shorter limits it runs under (chaos/simulator.py runs it).

It owns the knobs and the names every part of the simulator shares (the topic, the group, the
share group, the dead-letter topic, the virtual clock's start) and nothing else: it runs nothing
and draws no random number. A `SimConfig` is frozen; what a seed chooses from it before anything
runs (flush policy, flush interval, assignor) is its `SeedPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actors.limits import Limits
from chaos.sim_network import NetworkFaults

START_NS = 1_800_000_000 * 1_000_000_000  # a plausible wall clock for record timestamps
# Shorter timeouts than production, so a fault's consequences (and the recovery from them) play
# out within a run: the group coordinator gives up on a share group's request (metadata, a high
# watermark, a dead-letter write) after 1 s rather than 5. A share group re-reads a high
# watermark its acquires wait on every 100 ms rather than 20, and a replica scrubs its log every
# second rather than every 250 ms: a fifth of the ListOffsets traffic and three quarters of the
# scrubbing, which were a tenth of the simulated steps; nothing checked depends on either. A
# follower waiting at the leader's end gives up on its fetch after 1 s + 1 s rather than 5 s + 1 s
# (a fetch the network lost just before the heal would otherwise end the recovery window still
# unanswered). A follower fetches at most 4 KB at a time rather than 8 MB, so one that comes back
# far behind catches up in several rounds, as it does in production with real volumes.
SIM_LIMITS = Limits(replica_session_timeout_ms=1000, replica_lag_time_max_ms=1500,
                    replica_keepalive_interval_ms=300, replica_keepalive_timeout_ms=1000,
                    node_heartbeat_interval_ms=200, node_session_timeout_ms=1000,
                    coordinator_election_grace_ms=500, group_initial_rebalance_delay_ms=50,
                    share_high_watermark_refresh_ms=100, share_request_timeout_ms=1000, scrub_interval_ms=1000,
                    replica_fetch_idle_wait_max_ms=1000, replica_fetch_bytes_max=4096)
FAULT_KINDS = ("crash", "pause", "partition", "network", "disk", "clock", "slow-disk", "flush-crash")
# Chosen only when named (`--faults ...,voter-disk`), so the recorded histories of the default
# faults stay as they are: a controller loses its disk (chaos/sim_disk.py `lose_voter_disk`), a
# zombie follower (chaos/sim_zombies.py), a replica's disk full for a while (chaos/sim_faults.py).
OPTIONAL_FAULT_KINDS = ("voter-disk", "zombie", "disk-full")
ASSIGNORS = ("range", "round-robin", "cooperative-sticky")
TOPIC = "sim"
DEAD_LETTER_TOPIC = "sim.dlq"
GROUP = "sim-group"
SHARE_GROUP = "sim-share"


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 3
    controllers: int = 0  # 0: one coordinator process; n: a quorum of n controllers, one per node
    partitions: int = 3
    replication_factor: int = 3
    min_insync: int = 2
    flush_policy: str = ""  # "": each seed chooses one of `flush_policies`
    flush_policies: tuple[str, ...] = ("every_batch", "interval")
    flush_interval_ms: tuple[int, int] = (100, 400)  # an interval-flushed seed's flush interval
    producers: int = 2
    consumers: int = 3  # classic members of GROUP; the last `static_members` are static (KIP-345)
    static_members: int = 1
    assignors: tuple[str, ...] = ASSIGNORS  # the group's assignor: one per seed
    processing_ms: tuple[int, int] = (0, 200)  # a member processes a polled chunk for this long
    share_members: int = 2
    share_visibility_timeout_ms: int = 1000
    share_max_delivery_attempts: int = 3
    keys: int = 6
    duration_ms: int = 8_000
    recovery_ms: int = 6_000
    produce_interval_ms: int = 100  # each producer: ~10 batches of 4-12 records per simulated second
    records_per_batch: tuple[int, int] = (4, 12)
    commit_interval_ms: int = 250
    faults: tuple[str, ...] = FAULT_KINDS
    fault_interval_ms: tuple[int, int] = (300, 1500)
    restart_delay_ms: int = 300
    exit_notice_lost_probability: float = 0.25  # the node agent died too: nobody reports the exit
    exit_notice_late_probability: float = 0.25  # the notice arrives after the restart
    clock_skew_max_ms: int = 50  # a process's clock is at most this far from the true time
    network: NetworkFaults = field(default_factory=lambda: NetworkFaults())
    limits: Limits = SIM_LIMITS
    node_agents: bool = True  # replicas report through their node's agent (False: to the coordinator)
    trace_events_max: int = 60
    steps_max: int = 0  # end the faulty phase after this many steps (0: by duration only)
    # The controllers' largest Raft entry (0: RaftConfig's 1 MiB). A few hundred bytes makes most
    # metadata steps go in parts (actors/replicated_state.py), sent one append at a time, so a
    # leader may die between them.
    entry_bytes_max: int = 0


@dataclass(frozen=True)
class SeedPlan:
    """What one seed chose before anything ran."""

    flush_policy: str
    flush_interval_ms: int
    assignor: str
