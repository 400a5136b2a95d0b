"""What a Raft simulation (chaos/sim_raft.py) is given and what it returns: the knobs of the quorum,
its faults and its per-seed choices (`RaftSimConfig`), and the result of one seed.

It runs nothing and draws no random number, as chaos/sim_config.py for the whole cluster's
simulator. Every default keeps the recorded histories: a knob added later is off (0, False) unless
named, and draws from the seed's generator only when on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RaftSimConfig:
    voters: int = 3
    duration_ms: int = 3_000
    recovery_ms: int = 3_000
    liveness_bound_ms: int = 2_000  # after the heal, a leader within this (about 6 election timeouts)
    election_timeout_ms: int = 150
    heartbeat_interval_ms: int = 30
    propose_interval_ms: tuple[int, int] = (5, 40)
    fault_interval_ms: tuple[int, int] = (100, 600)
    faults: tuple[str, ...] = ("crash", "partition", "network", "disk")  # and "wipe" (not by default)
    restart_delay_ms: tuple[int, int] = (20, 800)
    heal_after_ms: tuple[int, int] = (100, 1200)
    drop_probability: float = 0.02
    duplicate_probability: float = 0.01
    delay_ms: tuple[float, float] = (0.1, 2.0)
    flush_delay_ms: tuple[float, float] = (0.1, 5.0)
    slow_flush_probability: float = 0.05
    slow_flush_ms: float = 50.0
    # Per-seed choices, so a sweep covers the batching, pipelining and compaction paths.
    append_entries_max: tuple[int, ...] = (1, 4, 256)
    inflight_appends_max: tuple[int, ...] = (1, 4, 16)
    snapshot_interval_entries: tuple[int, ...] = (8, 32, 100_000)
    snapshot_trailing_entries: tuple[int, ...] = (0, 4)
    # Quiet leaders (RaftConfig.idle_heartbeat_interval_ms; 0: off, the recorded sweeps) and the
    # transport's converse: when a voter crashes, every voter whose link to it is up sees the
    # connection drop (PeerDisconnected) a moment later, as ZeroMQ reports a dead process's
    # closed sockets. Neither draws from the seed's generator unless on, so histories are kept.
    idle_heartbeat_interval_ms: int = 0
    disconnect_on_crash: bool = False
    # Snapshots in chunks of this many bytes (0: RaftConfig's default, larger than any snapshot
    # here). The simulated state machine's snapshot is a few dozen bytes: a handful of bytes per
    # chunk sends each in several. Drawn from nothing, so histories are kept.
    snapshot_chunk_bytes: int = 0
    # The byte bounds (0: RaftConfig's, far above anything here). A few dozen bytes makes snapshots
    # come by bytes applied (trailing entries kept for half as many bytes) and proposals refused
    # BUSY by bytes uncommitted. Above 1, a proposal appends 1..n commands at once (propose_many,
    # a step in parts), drawn from the seed's generator. The defaults keep the recorded histories.
    snapshot_interval_bytes: int = 0
    uncommitted_bytes_max: int = 0
    commands_per_proposal_max: int = 1
    election_strike_probability: float = 0.25
    leader_strikes: tuple[str, ...] = ("crash-now", "isolate")  # what befalls a struck new leader
    steps_max: int = 200_000



@dataclass
class RaftSimResult:
    seed: int
    problems: list[str]
    steps: int
    simulated_s: float
    wall_s: float
    elections: int
    committed: int
    leader_after_heal_ms: float
    fingerprint: str
    trace: list[str]

    def raise_for_problems(self) -> None:
        if self.problems:
            lines = [f"raft simulation seed {self.seed} failed:"] + [f"  - {p}" for p in self.problems]
            raise AssertionError("\n".join(lines + ["last events:"] + [f"  {t}" for t in self.trace]))
