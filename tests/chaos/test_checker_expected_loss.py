"""Teaching runs (expect_loss): a consumer rewinding on a partition that lost acknowledged
writes is reported, not judged; the same rewind elsewhere is still a violation. And failover is
measured to the first acknowledgement of a send made after the fault."""

from __future__ import annotations

from tests.chaos.test_checker import MS, History


def lossy_history(**config) -> History:
    history = History(**config)
    history.send("v0", 0).send("v1", 1)  # both acknowledged on partition 0
    history.commit(2).commit(1)  # the consumer rewound after the truncation and committed lower
    history.event("heal")
    history.final_read((0, "k", "v0"))  # v1 was lost (an unclean election truncated it)
    return history


def test_a_rewind_on_a_partition_that_lost_data_is_excused_when_loss_is_expected():
    result = lossy_history(expect_loss=True).check()
    assert result.lost == 1 and result.commit_regressions == 1
    assert result.valid, result.violations


def test_the_same_rewind_is_a_violation_when_loss_is_not_expected():
    result = lossy_history().check()
    assert not result.valid
    assert any("went backwards" in sentence for sentence in result.violations)


def test_a_rewind_on_a_partition_without_loss_is_judged_even_when_loss_is_expected():
    history = History(expect_loss=True)
    history.send("v0", 0).send("w0", 0, partition=1)
    history.commit(1, partition=1).commit(0, partition=1)
    history.event("heal").final_read((0, "k", "v0")).final_read((0, "k", "w0"), partition=1)
    result = history.check()
    assert not result.valid and any("went backwards" in s for s in result.violations)


def test_failover_counts_from_the_fault_to_an_acknowledged_send_made_after_it():
    history = History()
    history.invoke("in-flight", at_ns=1 * MS)
    history.event("fault", at_ns=2 * MS, nemesis="kill", target="leader", topic="t", partition=0, phase="start")
    history.complete("in-flight", offset=0, at_ns=3 * MS)  # answered on its way: not recovery
    history.invoke("after", at_ns=4 * MS)
    history.complete("after", offset=1, at_ns=50 * MS)
    result = history.check()
    assert result.failover_samples[0].failover_ms == 48.0
