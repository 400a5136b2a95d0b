"""The deterministic simulator: sweeps, replays, regressions, and proof that it catches bugs.

The default sweep (SWEEP_CONFIG over SWEEP_SEEDS) must pass on railmq as it is, and must catch
every broken variant of chaos/sim_variants.py: each variant's test runs the sweep's seeds in
order until one fails, within the bound VARIANT_SEARCH gives it (just above the first catching
seed, so a weaker simulator fails the test). The searches run in two processes, the two cores CI
has, sharing one pool for every variant the session selected.

Failing seeds found while building railmq are kept as regressions: each once exposed a real bug
(a member stuck on a lost join answer, a dead coordinator endpoint trusted again, a member that
rejoined before its user's thread had answered a revocation, ...)."""

from __future__ import annotations

import multiprocessing

import pytest

from chaos.sim_network import Network, NetworkFaults
from chaos.sim_variants import VARIANTS, broken
from chaos.simulator import SimConfig, simulate

pytestmark = pytest.mark.sim

SWEEP_CONFIG = SimConfig(duration_ms=4000, recovery_ms=4000)
SWEEP_SEEDS = range(1000, 1200)
# Seeds the sweep fails on railmq as it is, each for a bug found and not fixed yet, with a part of
# the problem it reports. The sweep fails on any other failing seed, and on one of these passing
# (fixed: take it out). A variant's search skips them: a catch there would be the known bug's.
KNOWN_FAILURES: dict[int, str] = {
    # None today. Seed 1050 was one: a restarted coordinator told a follower the state before the
    # leader had reported its endpoint, the announcement that followed was lost, and heartbeats
    # with current epochs got no state (fixed: a follower reports where it fetches from;
    # tests/unit/test_coordinator.py, test_a_follower_without_the_leaders_endpoint_...). When quiet
    # quorums and a slower group-coordinator announcement re-drew the sweep's histories, 1078 and
    # 1087 failed: a static member fenced by its own repeated join (fixed in actors/classic_group.py;
    # tests/unit/test_classic_group.py) and the simulator's cluster restart cutting the power of
    # replicas whose flush was in flight in the same instant as another's disk fault (beyond the
    # promise; the others are now stopped as `railmq down` stops them, chaos/sim_disk.py).
}
REGRESSION_SEEDS = [6, 9, 16, 17, 28, 32, 36, 45, 20326, 20559, 20606, 20904, 30364, 30482, 30951, 32101, 61399, 80819, 81475]
# Faults every 150-600 ms for 12 s (the default: 300-1500 ms for 8 s) found eleven more: the high
# watermark moving with an ISR of one below min_insync because a proposed member was counted
# (2220), a consumer unseated by an earlier generation's unanswered request (2423), a static
# member fenced by its own join delivered twice (3192), a consumer with stale metadata reading a
# committed offset at a deposed leader and rewinding the group (3476), a delayed copy of a node
# heartbeat undoing a repaired replica's report so it never rejoined the ISR (4333), a leader
# committing without a member whose lost ISR answer had taken it in (4780), a member back from an
# unclean restart elected while ISR members had not reported to a restarted coordinator (4883), the
# simulator's whole-cluster stop killing a paused replica (2097), its disk faults hitting the
# ISR's only member (2387) or counting on a paused replica that was then dropped from the ISR
# (3685), and the share ledger reading a coordinator's clock jump as an early redelivery (2274).
DENSE_FAULTS = SimConfig(fault_interval_ms=(150, 600), duration_ms=12_000)
DENSE_REGRESSION_SEEDS = [2097, 2220, 2274, 2387, 2423, 3192, 3476, 3685, 4333, 4780, 4883, 5056]
# The same faults over five nodes and six partitions: the simulator killing a replica while
# another of its partition waited to repair its disk (5140).
WIDE_DENSE_FAULTS = SimConfig(nodes=5, partitions=6, fault_interval_ms=(150, 600), duration_ms=12_000)
WIDE_DENSE_REGRESSION_SEEDS = [5140]
# The seed-171 story, in the sweep: with the member rejoining before its user's thread answered a
# revocation (as it did before the fix), a partition reaches its next owner while the member
# still works on it. tests/unit/test_consumer_member.py replays the original consequence step by
# step (the late answer made the shell forget a partition handed back, and drop its records).
REJOIN_STORY_SEED = 1036


def run_seed(seed: int) -> tuple[int, list[str], float, float]:
    result = simulate(seed, SWEEP_CONFIG)
    return seed, result.problems, result.simulated_s, result.wall_s


@pytest.mark.timeout(400)
def test_a_sweep_of_200_seeds_finds_no_violation():
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        outcomes = pool.map(run_seed, SWEEP_SEEDS, chunksize=10)
    failures = {seed: problems for seed, problems, _, _ in outcomes if problems}
    unexpected = {seed: problems for seed, problems in failures.items()
                  if seed not in KNOWN_FAILURES or not any(KNOWN_FAILURES[seed] in problem for problem in problems)}
    assert not unexpected, f"failing seeds (replay with python -m chaos.simulator --seed N): {unexpected}"
    fixed = sorted(set(KNOWN_FAILURES) - set(failures))
    assert not fixed, f"known failures that pass now (take them out of KNOWN_FAILURES): {fixed}"
    simulated = sum(outcome[2] for outcome in outcomes)
    wall = sum(outcome[3] for outcome in outcomes)
    print(f"{len(SWEEP_SEEDS)} seeds: {simulated:.0f} simulated s in {wall:.1f} worker s ({simulated / wall:.0f}x real time)")


# The same cluster with the controller quorum in place of the single coordinator (docs/raft.md §9):
# three controllers, crashed, paused, cut off and split like any process, with the Raft safety
# checker (one leader per term, log matching, leader completeness, state-machine safety) after
# every controller step on top of every other promise.
QUORUM_CONFIG = SimConfig(controllers=3, duration_ms=4000, recovery_ms=4000)
QUORUM_SEEDS = range(2000, 2030)  # longer sweeps: python -m chaos.simulator --seeds N --controllers 3


def run_quorum_seed(seed: int) -> tuple[int, list[str]]:
    return seed, simulate(seed, QUORUM_CONFIG).problems


@pytest.mark.timeout(400)
def test_a_sweep_with_the_controller_quorum_finds_no_violation():
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        outcomes = pool.map(run_quorum_seed, QUORUM_SEEDS, chunksize=5)
    failures = {seed: problems for seed, problems in outcomes if problems}
    assert not failures, f"failing seeds (replay: python -m chaos.simulator --controllers 3 --seed N): {failures}"


def test_the_quorum_simulation_runs_three_controllers_and_checks_them():
    from chaos.simulator import Simulator

    sim = Simulator(2001, QUORUM_CONFIG)
    result = sim.run()
    assert sorted(name for name in sim.hosts if name.startswith("controller/")) == [
        "controller/1", "controller/2", "controller/3"] and "coordinator" not in sim.hosts
    assert sim.raft_checker.leaders, "no controller was ever elected"
    assert sim.raft_checker.committed, "no metadata entry was ever committed"
    assert sim.coordinator() is not None and not result.problems


LOST_VOTER_DISKS = SimConfig(controllers=3, faults=("crash", "pause", "partition", "network", "disk", "clock",
                                                     "slow-disk", "flush-crash", "voter-disk", "voter-disk"))


@pytest.mark.timeout(300)
def test_controllers_that_lose_their_disks_keep_every_promise():
    """The whole cluster with controllers losing their disks (one at a time): every check of the
    run holds (acknowledged writes, metadata, the quorum's safety after every step), and the lost
    voters really come back marked rejoining, refuse votes and are caught up."""
    from chaos.simulator import Simulator

    failures, lost, counters = {}, 0, {}
    for seed in range(3001, 3021):
        sim = Simulator(seed, LOST_VOTER_DISKS)
        result = sim.run()
        if result.problems:
            failures[seed] = result.problems[:2]
        lost += sum(1 for line in result.history if line.get("fault") == "voter-disk")
        for host in sim.hosts.values():
            if host.kind == "controller" and host.alive:
                for name in ("rejoined", "votes_refused_rejoining", "follower_logs_lost"):
                    counters[name] = counters.get(name, 0) + host.actor.raft.counters.get(name, 0)
    assert not failures, (f"failing seeds (replay: python -m chaos.simulator --controllers 3 "
                          f"--faults {','.join(LOST_VOTER_DISKS.faults)} --seed N): {failures}")
    assert lost >= 20, f"only {lost} controller disks lost in 20 seeds"
    assert all(counters.get(name, 0) > 0 for name in ("rejoined", "votes_refused_rejoining", "follower_logs_lost")), (
        counters)


# Controllers whose Raft entries hold 300 bytes: a topic's creation and most metadata steps are
# proposed in parts (docs/raft.md §9), under every fault the quorum sweep has.
PARTS_CONFIG = SimConfig(controllers=3, entry_bytes_max=300, duration_ms=4000, recovery_ms=4000)


@pytest.mark.timeout(300)
def test_metadata_steps_proposed_in_parts_keep_every_promise():
    from chaos.simulator import Simulator

    failures, in_parts = {}, 0
    for seed in range(2100, 2120):
        sim = Simulator(seed, PARTS_CONFIG)
        result = sim.run()
        if result.problems:
            failures[seed] = result.problems[:2]
        in_parts += sum(host.actor.state.steps_in_parts for host in sim.hosts.values()
                        if host.kind == "controller" and host.alive)
    assert not failures, (f"failing seeds (replay: python -m chaos.simulator --controllers 3 --entry-bytes-max 300 "
                          f"--seed N): {failures}")
    print(f"{in_parts} steps applied from parts")
    assert in_parts >= 100, f"only {in_parts} steps were applied from parts"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", REGRESSION_SEEDS)
def test_regression_seeds_pass(seed):
    simulate(seed).raise_for_problems()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", DENSE_REGRESSION_SEEDS)
def test_regression_seeds_with_denser_faults_pass(seed):
    simulate(seed, DENSE_FAULTS).raise_for_problems()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", WIDE_DENSE_REGRESSION_SEEDS)
def test_regression_seeds_with_denser_faults_on_five_nodes_pass(seed):
    simulate(seed, WIDE_DENSE_FAULTS).raise_for_problems()


@pytest.mark.timeout(60)
def test_a_seed_replays_exactly():
    first, second = simulate(11, SWEEP_CONFIG), simulate(11, SWEEP_CONFIG)
    assert first.history == second.history and first.steps == second.steps and first.problems == second.problems


@pytest.mark.timeout(60)
def test_a_member_is_never_handed_back_a_partition_it_is_still_revoking():
    simulate(REJOIN_STORY_SEED, SWEEP_CONFIG).raise_for_problems()
    with broken("rejoin-before-revocations-answered"):
        result = simulate(REJOIN_STORY_SEED, SWEEP_CONFIG)
    assert any("both hold partitions" in problem for problem in result.problems), result.problems


# Each variant: the first seed of the sweep that catches it (docs/simulation.md has the table,
# from `python -m chaos.simulator --variant NAME --seed 1000 --seeds 200`), and how many of the
# sweep's seeds it may take: a quarter and five seeds above that first one, so a simulator that
# grew weaker fails here while an unrelated change to the timing of a run does not. The test
# searches from the recorded seed to the bound: a catch there is a catch by the default sweep,
# found in one seed instead of re-running every seed before it.
VARIANT_SEARCH = {
    "ack-before-replication": (1000, 7),
    "elect-outside-isr": (1001, 8),
    "elect-last-reporter": (1001, 8),
    "trust-damaged-replicas": (2035, 50),  # in the dense sweep: see VARIANT_SWEEPS
    "commit-below-min-insync": (1000, 7),
    "retry-answered-at-once": (1005, 13),
    "fetch-before-flush": (1021, 33),
    "restart-keeps-isr-seat": (1053, 73),  # 1032 until clean restarts were checked against watermarks
    "late-exit-notice-kills": (1016, 27),
    "follower-trusts-leader-watermark": (1001, 8),
    "serve-past-high-watermark": (1000, 7),
    "agent-takes-any-report": (1008, 17),  # in the zombie sweep: see VARIANT_SWEEPS
    "follower-forgets-producers": (1025, 38),
    "retry-renumbered": (1005, 13),
    "producer-window-counts-in-flight": (1017, 28),
    "unknown-producer-any-sequence": (2015, 25),  # in the dense sweep: see VARIANT_SWEEPS
    "producer-keeps-numbers-past-a-gap": (1000, 7),  # in the disk-full sweep: see VARIANT_SWEEPS
    "stale-generation-commit": (1036, 52),
    "commit-before-durable": (1028, 42),
    "eager-rejoin-without-revoke": (1000, 7),
    "rejoin-before-revocations-answered": (1036, 52),
    "commit-fetched-position": (1034, 49),
    "cooperative-moves-held-partition": (1052, 72),
    "share-reply-before-durable": (1006, 14),
    "share-answer-after-expiry": (1049, 68),
    "share-count-not-restored": (1006, 14),
    "share-release-delay-ignored": (1000, 7),
    "share-start-passes-locked": (1000, 7),
    "dead-letter-written-twice": (1020, 32),
    "share-accepts-not-restored": (1006, 14),
    "share-one-delivery-too-many": (1000, 7),
}


# Variants the default sweep no longer catches, searched in another sweep: (its config, its first
# seed). A damaged replica trusted as a leader was caught by one seed in 200 of the default sweep
# (1044); since a member back from an unclean restart waits for ISR members not yet heard from
# (seed 4883), by none in 600 (1000-1599). Faults every 150-600 ms catch it at 2035 and 2048.
# A node agent taking a zombie's reports (chaos/sim_zombies.py) is caught only where zombies are:
# the fault is left out of the default sweep, whose recorded histories it would change.
ZOMBIE_FAULTS = SimConfig(faults=("zombie",))
# A producer stuck behind a gap in its sequence numbers needs a batch that ends undelivered, which
# a full disk makes (chaos/sim_faults.py `disk-full`, also left out of the default sweep); an
# unknown producer's batch overtaking refused ones was caught by none of 120 default seeds.
DISK_FULL_FAULTS = SimConfig(faults=("disk-full",))
VARIANT_SWEEPS = {"trust-damaged-replicas": (DENSE_FAULTS, 2000),
                  "agent-takes-any-report": (ZOMBIE_FAULTS, 1000),
                  "unknown-producer-any-sequence": (DENSE_FAULTS, 2000),
                  "producer-keeps-numbers-past-a-gap": (DISK_FULL_FAULTS, 1000)}


def test_zombie_followers_lose_no_acknowledged_write():
    """A follower paused, replaced on a new disk, then resumed (chaos/sim_zombies.py): the seeds of
    the zombie sweep that catch a node agent taking its reports pass with the agent as it is."""
    for seed in (1008, 1014, 1020, 1021):
        result = simulate(seed, ZOMBIE_FAULTS)
        result.raise_for_problems()
        made = [line for line in result.history if line["type"] == "fault" and line.get("fault") == "zombie"]
        assert made, f"seed {seed} made no zombie"


def test_full_disks_leave_no_producer_stuck_behind_a_gap_in_its_numbers():
    """A leader's full disk refuses a batch for good (DISK_FULL); the producer's later batches are
    numbered again past the gap it leaves. The seeds of the disk-full sweep that catch a producer
    keeping its numbers pass with the producer as it is: every batch has an outcome after the heal."""
    for seed in (1000, 1001, 1002):
        result = simulate(seed, DISK_FULL_FAULTS)
        result.raise_for_problems()
        refused = [line for line in result.history
                   if line["type"] == "info" and line.get("error") == "DISK_FULL"]
        assert refused, f"seed {seed}: no batch was refused DISK_FULL"


def first_catch(variant: str) -> tuple[str, int | None, list[str]]:
    first, bound = VARIANT_SEARCH[variant]
    config, start = VARIANT_SWEEPS.get(variant, (SWEEP_CONFIG, SWEEP_SEEDS[0]))
    with broken(variant):
        for seed in range(first, start + bound):
            if seed in KNOWN_FAILURES and config is SWEEP_CONFIG:
                continue
            result = simulate(seed, config)
            if not result.ok:
                return variant, seed, result.problems[:3]
    return variant, None, []


@pytest.fixture(scope="module")
def catches(request) -> dict[str, tuple[int | None, list[str]]]:
    """Every selected variant's search, run in two processes, longest first, each in a fresh
    process (no variant's run can leave anything behind for the next)."""
    wanted = sorted({item.callspec.params["variant"] for item in request.session.items
                     if getattr(item, "originalname", "") == "test_a_broken_variant_is_caught_within_a_bounded_number_of_seeds"},
                    key=lambda variant: -VARIANT_SEARCH[variant][1])
    with multiprocessing.get_context("spawn").Pool(2, maxtasksperchild=1) as pool:
        found = pool.map(first_catch, wanted, chunksize=1)
    return {variant: (seed, problems) for variant, seed, problems in found}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_broken_variant_is_caught_within_a_bounded_number_of_seeds(variant, catches):
    seed, problems = catches[variant]
    first, bound = VARIANT_SEARCH[variant]
    start = VARIANT_SWEEPS.get(variant, (SWEEP_CONFIG, SWEEP_SEEDS[0]))[1]
    assert seed is not None, (
        f"{variant} went unnoticed from seed {first} to {start + bound - 1} of the sweep; search the "
        f"whole sweep with python -m chaos.simulator --variant {variant} --seed {start} --seeds 200")
    assert problems


def test_every_variant_is_in_the_table_of_docs_simulation_md():
    from pathlib import Path

    table = (Path(__file__).parents[2] / "docs" / "simulation.md").read_text(encoding="utf-8")
    assert [variant for variant in VARIANTS if f"| `{variant}` |" not in table] == []


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
