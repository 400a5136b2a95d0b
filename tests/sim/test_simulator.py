"""The deterministic simulator: sweeps, replays, regressions, and proof that it catches bugs.

Failing seeds found while building railmq are kept here as regressions: each once exposed a real
bug (a member stuck on a lost join answer, a dead coordinator endpoint trusted again, ...)."""

from __future__ import annotations

import multiprocessing

import pytest

from chaos.sim_network import Network, NetworkFaults
from chaos.sim_variants import VARIANTS, broken
from chaos.simulator import SimConfig, simulate

pytestmark = pytest.mark.sim

SWEEP_CONFIG = SimConfig(duration_ms=4000, recovery_ms=4000)
SWEEP_SEEDS = 200
REGRESSION_SEEDS = [6, 9, 16, 17, 28, 32, 36, 45]


def run_seed(seed: int) -> tuple[int, list[str], float, float]:
    result = simulate(seed, SWEEP_CONFIG)
    return seed, result.problems, result.simulated_s, result.wall_s


@pytest.mark.timeout(300)
def test_a_sweep_of_200_seeds_finds_no_violation():
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        outcomes = pool.map(run_seed, range(1000, 1000 + SWEEP_SEEDS), chunksize=10)
    failures = {seed: problems for seed, problems, _, _ in outcomes if problems}
    assert not failures, f"failing seeds (replay with python -m chaos.simulator --seed N): {failures}"
    simulated = sum(outcome[2] for outcome in outcomes)
    wall = sum(outcome[3] for outcome in outcomes)
    print(f"{SWEEP_SEEDS} seeds: {simulated:.0f} simulated s in {wall:.1f} worker s ({simulated / wall:.0f}x real time)")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", REGRESSION_SEEDS)
def test_regression_seeds_pass(seed):
    simulate(seed).raise_for_problems()


@pytest.mark.timeout(60)
def test_a_seed_replays_exactly():
    first, second = simulate(11, SWEEP_CONFIG), simulate(11, SWEEP_CONFIG)
    assert first.history == second.history and first.steps == second.steps


VARIANT_SEARCH = {
    "ack-before-replication": (SimConfig(duration_ms=5000, recovery_ms=4000), 20),
    "elect-outside-isr": (SimConfig(duration_ms=5000, recovery_ms=4000), 20),
    "stale-generation-commit": (SimConfig(duration_ms=6000, recovery_ms=4000, faults=("pause",)), 30),
    "elect-last-reporter": (SimConfig(duration_ms=5000, recovery_ms=4000), 40),
    "trust-damaged-replicas": (SimConfig(duration_ms=5000, recovery_ms=4000), 60),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_broken_variant_is_caught_within_a_bounded_number_of_seeds(variant):
    config, seeds_max = VARIANT_SEARCH[variant]
    with broken(variant):
        for seed in range(1, seeds_max + 1):
            result = simulate(seed, config)
            if not result.ok:
                return
    pytest.fail(f"{variant} went unnoticed for {seeds_max} seeds")


def test_the_network_keeps_each_link_in_order_and_cuts_one_way():
    import random

    network = Network(random.Random(3), NetworkFaults(delay_min_ms=0.1, delay_max_ms=20, slow_probability=0.3))
    arrivals = [network.plan("a", "b", now_ns=i * 1000)[0] for i in range(200)]
    assert arrivals == sorted(arrivals), "one link delivers in send order"
    other = [network.plan("c", "b", now_ns=i * 1000)[0] for i in range(200)]
    assert any(x < y for x, y in zip(other, arrivals)) and any(x > y for x, y in zip(other, arrivals)), \
        "different links reorder relative to each other"
    network.isolate("a", ["a", "b"], direction="out")
    assert network.plan("a", "b", 0) == [] and network.plan("b", "a", 0) != []
    network.heal()
    assert network.plan("a", "b", 0) != []
