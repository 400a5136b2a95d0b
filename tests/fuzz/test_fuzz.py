"""The fuzz tier: 100,000+ schema-driven and mutated cases against every actor kind, in process.

Every case goes through the real codec, the authentication rule and `handle()`; nothing may
raise, every `invariants()` must hold after every case, and afterwards no log may hold a batch a
legitimate producer could not have sent. Findings are kept as regression cases under
tests/fuzz/regressions/ (one JSON file each: target, whether it was authenticated, hex frames)."""

from __future__ import annotations

import json
import pathlib

import pytest

from chaos.fuzz import Fuzzer, logs_hold_only_valid_batches
from chaos.fuzz_targets import all_targets

REGRESSIONS = pathlib.Path(__file__).parent / "regressions"
CASES_PER_SEED = 25_000
SEEDS = (1, 2, 3, 4)  # 100,000 cases in the default run


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", SEEDS)
def test_no_case_crashes_an_actor_or_breaks_an_invariant(seed):
    fuzzer = Fuzzer(all_targets(), seed=seed)

    stats = fuzzer.run(CASES_PER_SEED)

    assert not stats.findings, "\n".join(f"{f.target} <- {f.message}: {f.error} (frames {[x.hex() for x in f.frames]})"
                                         for f in stats.findings[:5])
    assert sum(stats.cases.values()) == CASES_PER_SEED
    assert set(stats.cases) == {target.name for target in fuzzer.targets}
    assert stats.handled > CASES_PER_SEED // 3, "most cases must reach a handler, not stop in the codec"
    logs = [target.actor.log for target in fuzzer.targets if hasattr(target.actor, "log")]
    assert len(logs) == 2
    assert logs_hold_only_valid_batches(logs) == []


def test_the_fuzzer_finds_a_planted_bug(monkeypatch):
    """Proof that the fuzzer reaches handlers deep enough to notice a one-line bug there."""
    import actors.replica_fetch as replica_fetch

    original = replica_fetch.FetchServing._check_fetch

    def planted(self, request, now_ns):
        if request.offset > self.log.log_end_offset + 1000:
            raise KeyError("planted")
        return original(self, request, now_ns)

    monkeypatch.setattr(replica_fetch.FetchServing, "_check_fetch", planted)
    stats = Fuzzer(all_targets(), seed=3).run(6_000)

    assert any("planted" in finding.error for finding in stats.findings)


@pytest.mark.parametrize("case", sorted(REGRESSIONS.glob("*.json")), ids=lambda path: path.stem)
def test_every_recorded_finding_stays_fixed(case):
    recorded = json.loads(case.read_text())
    fuzzer = Fuzzer(all_targets(), seed=0)
    target = next(t for t in fuzzer.targets if t.name == recorded["target"])

    fuzzer.replay(target, [bytes.fromhex(frame) for frame in recorded["frames"]], recorded["authenticated"])

    assert not fuzzer.stats.findings, fuzzer.stats.findings[0].error
