"""The controller quorum alone in the deterministic simulation (chaos/sim_raft.py): sweeps of 3
and 5 voters under message loss, delay, reordering, partitions, crashes and late or lost flushes,
with election safety, log matching, leader completeness and state-machine safety checked after
every step and liveness after the heal; exact replay; and proof that three broken rules are caught
within a bounded number of seeds."""

from __future__ import annotations

import time

import pytest

from chaos.sim_raft import RaftSimConfig, simulate_raft
from chaos.sim_raft_variants import RAFT_VARIANTS, broken_raft

pytestmark = pytest.mark.sim

THREE = RaftSimConfig(voters=3)
FIVE = RaftSimConfig(voters=5)


def sweep(config: RaftSimConfig, seeds: range) -> dict:
    started = time.perf_counter()
    failures, figures = {}, {"elections": 0, "committed": 0, "steps": 0, "simulated_s": 0.0, "heal_to_leader_ms": 0.0}
    for seed in seeds:
        result = simulate_raft(seed, config)
        if result.problems:
            failures[seed] = result.problems[:3]
        figures["elections"] += result.elections
        figures["committed"] += result.committed
        figures["steps"] += result.steps
        figures["simulated_s"] += result.simulated_s
        figures["heal_to_leader_ms"] = max(figures["heal_to_leader_ms"], result.leader_after_heal_ms)
    figures["wall_s"] = time.perf_counter() - started
    return {"failures": failures, **figures}


@pytest.mark.timeout(240)
def test_a_sweep_of_200_seeds_of_3_and_5_voters_finds_no_violation():
    outcomes = [sweep(THREE, range(1, 151)), sweep(FIVE, range(1001, 1051))]
    for voters, outcome in zip((3, 5), outcomes):
        assert not outcome["failures"], (f"{voters} voters, failing seeds (replay with python -m chaos.sim_raft "
                                         f"--seed N --voters {voters}): {outcome['failures']}")
        assert outcome["elections"] > 0 and outcome["committed"] > 0
        print(f"{voters} voters: {outcome['elections']} elections, {outcome['committed']} entries committed, "
              f"{outcome['simulated_s']:.0f} simulated s in {outcome['wall_s']:.1f} s; slowest heal to leader "
              f"{outcome['heal_to_leader_ms']:.0f} ms")


# Proposals with gaps long enough for leaders to go quiet (three 30 ms heartbeats of nothing).
QUIET = RaftSimConfig(voters=3, idle_heartbeat_interval_ms=400, disconnect_on_crash=True, propose_interval_ms=(5, 600))


def run_and_count(runs: list[tuple[RaftSimConfig, range]]) -> tuple[dict, dict[str, int], int]:
    """Every seed of each (config, seeds): the failing ones' first problems by (voters, seed),
    every voter's counters summed, and how many disks were lost."""
    from chaos.sim_raft import RaftSimulation

    failures: dict = {}
    totals: dict[str, int] = {}
    wipes = 0
    for config, seeds in runs:
        for seed in seeds:
            simulation = RaftSimulation(seed, config)
            result = simulation.run()
            if result.problems:
                failures[(config.voters, seed)] = result.problems[:3]
            wipes += simulation.wipes
            for voter in simulation.voters.values():
                for name, count in voter.raft.counters.items():
                    totals[name] = totals.get(name, 0) + count
    return failures, totals, wipes


@pytest.mark.timeout(240)
def test_quiet_leaders_and_dropped_connections_keep_every_property():
    """Leaders that slow to a 400 ms heartbeat when quiet (every append naming the interval) and
    followers that campaign at once when a crashed leader's connection drops: the same faults,
    the same checks, and a leader again within the same bound after the heal. Both must really
    happen: quiet periods begin, and dropped connections start campaigns."""
    failures, totals, _ = run_and_count([(QUIET, range(3001, 3101))])

    assert not failures, ("failing seeds (replay with python -m chaos.sim_raft --seed N --idle-heartbeat-ms 400 "
                          f"--disconnect-on-crash): {failures}")
    for counter in ("quiet_periods", "leader_disconnected", "check_quorum_step_downs"):
        assert totals.get(counter, 0) > 0, f"{counter} never happened in 100 seeds: {totals}"


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("config", [THREE, FIVE, RaftSimConfig(voters=3, duration_ms=10_000)],
                         ids=["3-voters", "5-voters", "3-voters-10s"])
def test_a_long_sweep_finds_no_violation(config):
    outcome = sweep(config, range(10_000, 12_000))
    assert not outcome["failures"], outcome["failures"]


WIPES = RaftSimConfig(voters=3, faults=("crash", "wipe", "partition", "network", "disk"))


@pytest.mark.timeout(240)
def test_lost_disks_keep_every_property():
    """Voters lose their disks (one at a time; half of them leaders struck just after a commit)
    and come back marked rejoining: the same checks hold after every step, and a leader is elected
    again after the heal. The rule must really be exercised: disks are lost, wiped voters refuse
    votes and skip campaigns, leaders repair their lost logs, and they become full voters again."""
    failures, totals, wipes = run_and_count([(WIPES, range(1, 201)),
                                             (RaftSimConfig(voters=5, faults=WIPES.faults), range(1001, 1051))])

    assert not failures, f"failing (voters, seed): {failures}"
    assert wipes >= 200, f"only {wipes} disks lost"
    for counter in ("votes_refused_rejoining", "campaigns_skipped_rejoining", "follower_logs_lost", "rejoined"):
        assert totals.get(counter, 0) > 0, f"{counter} never happened: {totals}"


CHUNKED = RaftSimConfig(voters=3, snapshot_chunk_bytes=8, snapshot_interval_entries=(8, 32), faults=WIPES.faults)


@pytest.mark.timeout(240)
def test_snapshots_sent_in_chunks_keep_every_property():
    """Every snapshot in chunks of 8 bytes, under crashes, lost disks, partitions and a lossy,
    duplicating, reordering network: chunks are lost, repeated and met by newer snapshots, and the
    same checks hold after every step."""
    failures, totals, _ = run_and_count([(CHUNKED, range(1, 151))])

    assert not failures, f"failing seeds: {failures}"
    for counter in ("snapshot_chunks_sent", "snapshots_installed", "snapshot_chunks_out_of_place"):
        assert totals.get(counter, 0) > 0, f"{counter} never happened: {totals}"


BYTE_BOUNDED = RaftSimConfig(voters=3, snapshot_interval_bytes=120, uncommitted_bytes_max=60,
                             commands_per_proposal_max=4, snapshot_chunk_bytes=16, faults=WIPES.faults)


@pytest.mark.timeout(240)
def test_byte_bounds_and_proposals_of_several_entries_keep_every_property():
    """Snapshots due by bytes applied, trailing entries cut by bytes, proposals refused by bytes
    uncommitted, and proposals of up to four entries at once (a step in parts), under the same
    faults as lost disks: the same checks hold after every step."""
    failures, totals, _ = run_and_count([(BYTE_BOUNDED, range(1, 201))])

    assert not failures, f"failing seeds: {failures}"
    for counter in ("snapshots_taken", "snapshots_installed", "proposals_refused_uncommitted_bytes"):
        assert totals.get(counter, 0) > 0, f"{counter} never happened: {totals}"


@pytest.mark.timeout(60)
def test_a_seed_replays_exactly():
    first, second = simulate_raft(17, THREE), simulate_raft(17, THREE)
    assert first.fingerprint == second.fingerprint and first.steps == second.steps
    assert first.committed == second.committed and first.trace == second.trace


@pytest.mark.timeout(60)
def test_the_faults_really_happen():
    """A sweep that passes because nothing went wrong proves nothing: the default faults must
    crash, cut off and elect, and snapshots must be installed."""
    from chaos.sim_raft import RaftSimulation

    totals: dict[str, int] = {}
    notes = []
    for seed in range(1, 21):
        simulation = RaftSimulation(seed, THREE)
        simulation.run()
        notes += simulation.trace
        for voter in simulation.voters.values():
            for name, count in voter.raft.counters.items():
                totals[name] = totals.get(name, 0) + count
    assert any("crashes" in note for note in notes) and any("isolated" in note for note in notes)
    for counter in ("snapshots_installed", "appends_refused", "check_quorum_step_downs", "votes_ignored_in_lease"):
        assert totals.get(counter, 0) > 0, f"{counter} never happened in 20 seeds: {totals}"


# Each variant with the faults that expose it, and how many seeds it may take. The commit rule
# only bites when an append carries an earlier term's entries without the new leader's no-op
# (one entry per append) and an intermediate leader's entry survives elsewhere (leaders cut off
# right after their election, five voters leave room for it).
VARIANT_SEARCH = {
    "vote-twice": (RaftSimConfig(), 20),
    "vote-before-durable": (RaftSimConfig(election_strike_probability=0.5), 30),
    "vote-for-stale-log": (RaftSimConfig(), 25),
    "commit-earlier-term": (RaftSimConfig(voters=5, duration_ms=5000, append_entries_max=(1,),
                                          election_strike_probability=0.5, leader_strikes=("isolate",)), 30),
}
EXPECTED_PROBLEM = {
    "vote-twice": ("two leaders in term", "did not vote for itself"),
    "vote-before-durable": ("granted its vote in term", "two leaders in term"),
    "vote-for-stale-log": ("leader completeness", "could still be elected", "state machine safety"),
    "commit-earlier-term": ("could still be elected", "leader completeness", "state machine safety", "committed"),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("variant", RAFT_VARIANTS)
def test_the_simulation_catches_a_broken_rule_within_a_bounded_number_of_seeds(variant):
    config, seeds_max = VARIANT_SEARCH[variant]
    with broken_raft(variant):
        for seed in range(1, seeds_max + 1):
            result = simulate_raft(seed, config)
            if result.problems:
                break
        else:
            pytest.fail(f"{variant} survived {seeds_max} seeds")
    assert any(text in problem for problem in result.problems for text in EXPECTED_PROBLEM[variant]), result.problems
    print(f"{variant}: caught at seed {seed}: {result.problems[0]}")
    # ... and the same seed and faults pass with the rule restored.
    assert simulate_raft(seed, config).problems == []


def test_an_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="choose from"):
        with broken_raft("nonsense"):
            pass
