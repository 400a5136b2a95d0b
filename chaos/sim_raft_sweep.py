"""The command line of the Raft simulation: one seed, or a sweep of seeds, optionally with one
broken rule of chaos/sim_raft_variants.py.

    python -m chaos.sim_raft --seed 7 [--voters 5] [--variant vote-twice] [--sweep 200]

It prints one line per seed (outcome, steps, elections, commits, the time to a leader after the
heal) and, for a single failing seed, its problems and last events, so the failure replays from
the seed alone; the exit status is 1 when any seed failed. It decides nothing about the
simulation itself: that is chaos/sim_raft.py.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import replace

from chaos.sim_raft import RaftSimConfig, simulate_raft
from chaos.sim_raft_variants import RAFT_VARIANTS, broken_raft
from railmq.cli_common import non_negative_int, positive_int


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Simulate a Raft controller quorum under faults.")
    parser.add_argument("--seed", type=non_negative_int, default=1)
    parser.add_argument("--sweep", type=non_negative_int, default=0, help="run this many seeds from --seed on")
    parser.add_argument("--voters", type=positive_int, default=3)
    parser.add_argument("--variant", choices=RAFT_VARIANTS)
    parser.add_argument("--idle-heartbeat-ms", type=non_negative_int, default=0,
                        help="quiet leaders heartbeat this often (default 0: never slower)")
    parser.add_argument("--disconnect-on-crash", action="store_true",
                        help="a crashed voter's peers see its connection drop")
    parser.add_argument("--lost-disks", action="store_true",
                        help="add the wipe fault: voters lose their disks and come back rejoining")
    parser.add_argument("--snapshot-chunk-bytes", type=non_negative_int, default=0,
                        help="send snapshots in chunks of this many bytes (default 0: one chunk)")
    parser.add_argument("--snapshot-interval-bytes", type=non_negative_int, default=0,
                        help="snapshot after this many bytes of entries (default 0: RaftConfig's 20 MiB)")
    parser.add_argument("--uncommitted-bytes-max", type=non_negative_int, default=0,
                        help="refuse proposals past this many uncommitted bytes (default 0: RaftConfig's 64 MiB)")
    parser.add_argument("--commands-per-proposal", type=positive_int, default=1,
                        help="propose up to this many commands at once, as a step in parts (default 1)")
    args = parser.parse_args(argv)
    config = RaftSimConfig(voters=args.voters, idle_heartbeat_interval_ms=args.idle_heartbeat_ms,
                           disconnect_on_crash=args.disconnect_on_crash, snapshot_chunk_bytes=args.snapshot_chunk_bytes,
                           snapshot_interval_bytes=args.snapshot_interval_bytes,
                           uncommitted_bytes_max=args.uncommitted_bytes_max,
                           commands_per_proposal_max=args.commands_per_proposal)
    if args.lost_disks:
        config = replace(config, faults=config.faults + ("wipe",))
    if args.idle_heartbeat_ms:  # gaps between proposals, or no leader is ever quiet
        config = replace(config, propose_interval_ms=(5, 600))
    seeds = range(args.seed, args.seed + max(1, args.sweep))
    failed = 0
    with broken_raft(args.variant) if args.variant else contextlib.nullcontext():
        for seed in seeds:
            result = simulate_raft(seed, config)
            print(f"seed {seed}: {'FAIL' if result.problems else 'ok'} steps={result.steps} "
                  f"elections={result.elections} committed={result.committed} "
                  f"leader_after_heal={result.leader_after_heal_ms:.0f} ms wall={result.wall_s:.2f} s")
            if result.problems:
                failed += 1
                if len(seeds) == 1:
                    print("\n".join(result.problems + result.trace))
    return 1 if failed else 0
