"""How fast the deterministic simulator runs a 3-node, 3-partition cluster under load.

    python -m bench.sim [--json PATH] [--seeds N] [--quick]

Each seed simulates the default run (chaos/simulator.py SimConfig: 3 nodes, a topic of 3
partitions with replication factor 3 and its dead-letter topic, 2 idempotent acks=all producers,
a 3-member consumer group (one static member; the assignor chosen per seed) whose processing
takes simulated time, 2 share-group members, faults every 0.3-1.5 s for 8 s, then a 6 s
recovery window and the checks), in this one process. Figures: simulated seconds per wall-clock second (the median seed and the sweep as a
whole), seeds per minute, simulated steps (messages and timers handled) per wall-clock second,
and the same with faults off, as a baseline of the fault machinery's cost, and with the replicas
reporting straight to the coordinator instead of through their node agents (`direct_reports`:
the simulator before it ran node agents), as a baseline of what the agents cost or save.
"""

from __future__ import annotations

import statistics
import time

from bench.common import parse_args, phase, report


def sweep(seeds: int, faults: bool, node_agents: bool = True) -> dict[str, float]:
    from chaos.simulator import SimConfig, simulate

    config = SimConfig(node_agents=node_agents) if faults else SimConfig(faults=(), node_agents=node_agents)
    simulate(10_000, config)  # imports and first-run costs out of the way
    ratios, steps, simulated, wall = [], 0, 0.0, 0.0
    started = time.perf_counter()
    for seed in range(1, seeds + 1):
        phase(f"seed {seed} of {seeds}, faults {'on' if faults else 'off'}, "
              f"node agents {'on' if node_agents else 'off'}")
        result = simulate(seed, config)
        result.raise_for_problems()
        ratios.append(result.simulated_s / result.wall_s)
        steps += result.steps
        simulated += result.simulated_s
        wall += result.wall_s
    elapsed = time.perf_counter() - started
    return {"x_real_time_median": statistics.median(ratios), "x_real_time_sweep": simulated / wall,
            "seeds_per_minute": seeds / elapsed * 60, "steps_per_s": steps / wall}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: p.add_argument("--seeds", type=int, default=0))
    seeds = args.seeds or (10 if args.quick else 50)
    with_faults = sweep(seeds, faults=True)
    without = sweep(seeds, faults=False)
    direct = sweep(seeds, faults=True, node_agents=False)
    figures = {f"sim_{name}": value for name, value in with_faults.items()}
    figures.update({f"sim_no_faults_{name}": value for name, value in without.items()})
    figures.update({f"sim_direct_reports_{name}": value for name, value in direct.items()})
    figures["sim_ratio_to_direct_reports"] = with_faults["x_real_time_median"] / direct["x_real_time_median"]
    report("bench.sim", figures, args, {"seeds": seeds, "processes": 1})


if __name__ == "__main__":
    main()
