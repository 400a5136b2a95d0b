"""`railmq size`: every number the design articles give, from their inputs, and how they are printed.

Given the articles' inputs (50,000 msg/s, 1,000 B, 7 days, 3 copies, 5 MB/s per partition,
2,500 msg/s per consumer, 2x headroom), the arithmetic gives exactly their worked example; the
hot partition and the remapped keys come from railmq's murmur2 partitioner and are pinned to
railmq's own figures beside the articles'; the duplicates formula matches the articles' 10,028
within its spread, and the simulated consumer replays exactly what the formula says it must.
"""

from __future__ import annotations

import json
import math

import pytest

from chaos.labs.duplicates_sim import DuplicatesConfig, simulate_duplicates
from railmq import cli
from railmq.partitioner import partition_for_key
from railmq.sizing import (
    ARTICLE, LARGE_SAMPLE_KEYS_MAX, SizingError, SizingInputs, drain, duplicates_sigma, expected_duplicates,
    hot_partition, large_sample_keys, moved_fraction_formula, remap, size, user_keys,
)
from railmq.sizing_text import bytes_text, capacity_lines, percent, render


@pytest.fixture(scope="module")
def report():
    return size(SizingInputs())


def value(report, name: str) -> float:
    return report.quantity(name).value


def test_the_worked_example_table_comes_out_exactly(report):
    assert value(report, "bandwidth") == 50_000_000  # 50 MB/s
    assert value(report, "messages_per_day") == 4_320_000_000
    assert value(report, "bytes_per_day") == pytest.approx(4.32e12, rel=1e-12)
    assert value(report, "retained_one_copy") == pytest.approx(30.24e12, rel=1e-12)
    assert value(report, "retained_all_copies") == pytest.approx(90.72e12, rel=1e-12)
    assert value(report, "partitions_minimum") == 10
    assert value(report, "partitions") == 20
    assert value(report, "consumers") == 20
    assert value(report, "even_share") == 0.05
    assert value(report, "doubled_bandwidth") == 100_000_000
    assert value(report, "doubled_partitions") == 40
    assert value(report, "doubled_consumers") == 40


def test_every_quantity_with_an_article_figure_matches_it_except_the_hash_dependent_ones(report):
    hash_dependent = {"hottest_share", "coolest_share", "hottest_rate", "hottest_behind",
                      "duplicates_per_message_commit"}
    for quantity in report.quantities:
        if quantity.article is None or quantity.name in hash_dependent:
            continue
        assert quantity.value == pytest.approx(quantity.article, rel=1e-3), quantity.name


def test_the_backlog_needs_spare_capacity_and_enough_partitions(report):
    assert value(report, "backlog") == 30_000_000
    assert value(report, "drain_30_consumers") == 20 * 60
    assert drain(30_000_000, 50_000, 20, 20, 2_500).drain_s is None, "20 consumers have no spare capacity"
    capped = drain(30_000_000, 50_000, 30, 20, 2_500)
    assert (capped.busy_consumers, capped.drain_s) == (20, None), "30 consumers on 20 partitions: 10 idle"
    assert drain(30_000_000, 50_000, 30, 30, 2_500).drain_s == 1200


def test_hash_mod_n_moves_two_thirds_of_the_keys_from_20_to_30_partitions(report):
    assert moved_fraction_formula(20, 30) == pytest.approx(2 / 3)
    assert moved_fraction_formula(4, 6) == pytest.approx(2 / 3), "any N -> 1.5 N moves two thirds"
    assert moved_fraction_formula(20, 40) == pytest.approx(0.5)
    assert percent(value(report, "keys_remapped"), 1) == "66.7%"
    measured = report.remap_large_sample
    assert abs(measured.keys_moved / measured.keys - 2 / 3) < 0.01, "murmur2 spreads like a uniform hash"
    assert measured.minimal_moved == pytest.approx(1 / 3)


def test_the_remap_counts_the_keys_the_partitioner_puts_elsewhere():
    names = user_keys(3000)
    moved = sum(partition_for_key(name.encode(), 20) != partition_for_key(name.encode(), 30)
                for name in names)
    assert remap(3000, 20, 30).keys_moved == moved
    assert remap(3000, 7, 7).keys_moved == 0


def test_the_large_sample_is_a_hundred_keys_for_each_asked_for_up_to_a_million():
    """At 100 keys for each of `--keys 100000` the sample was 10 million keys, each hashed twice
    in Python: a minute and a half. A million is as close to the formula (within 0.1%)."""
    assert large_sample_keys(1_000) == 100_000
    assert large_sample_keys(100_000) == LARGE_SAMPLE_KEYS_MAX == 1_000_000


def test_railmqs_murmur2_figures_for_the_hot_partition_are_pinned(report):
    """The articles' 17.26% / 2.75% / 8,631 come from their hash; railmq's are these."""
    hot = report.hot
    assert hot.rank_one_share == pytest.approx(0.13359, abs=1e-5), "user-1 alone is 13.36% of traffic"
    assert sum(hot.shares) == pytest.approx(1.0)
    assert hot.hottest_partition == 8 and hot.hottest_keys[0] == "user-1"
    assert round(value(report, "hottest_share") * 100, 2) == 16.00
    assert round(value(report, "coolest_share") * 100, 2) == 1.64
    assert round(value(report, "hottest_rate")) == 8_001
    assert round(value(report, "hottest_behind")) == 5_501
    remapped = report.remap
    assert (remapped.keys, remapped.keys_moved) == (1_000, 645)
    assert ARTICLE["hottest_share"] == 0.1726 and ARTICLE["hottest_rate"] == 8_631


def test_the_hottest_partition_always_holds_at_least_the_most_popular_key():
    for partitions in (4, 10, 20, 40):
        hot = hot_partition(1_000, partitions)
        assert max(hot.shares) >= hot.rank_one_share
        assert hot.shares[hot.hottest_partition] == max(hot.shares)


def test_the_duplicates_formula_and_the_articles_simulation_agree():
    expected = expected_duplicates(1_000_000, 0.01, 1)
    assert expected == pytest.approx(10_101.01, abs=0.01), "p / (1 - p) per message"
    assert abs(ARTICLE["duplicates_per_message_commit"] - expected) < 3 * duplicates_sigma(1_000_000, 0.01,
                                                                                           1), \
        "the articles' 10,028 is one draw of the same experiment"
    assert expected_duplicates(1_000_000, 0.01, 100) == pytest.approx(731_999, abs=1), \
        "a batch of 100 survives its crashes only 37% of the time: most batches replay"
    assert expected_duplicates(1_000_000, 0.0, 1) == 0


def test_the_simulated_consumer_replays_exactly_one_message_per_crash_when_it_commits_each():
    result = simulate_duplicates(DuplicatesConfig(messages=3_000, crash_probability=0.01, commit_every=1,
                                                  seed=3))
    assert result.crashes > 10 and result.duplicates == result.crashes
    band = 4 * duplicates_sigma(3_000, 0.01, 1)
    assert abs(result.duplicates - expected_duplicates(3_000, 0.01, 1)) < band


def test_the_simulated_consumer_replays_the_uncommitted_part_of_a_batch():
    result = simulate_duplicates(DuplicatesConfig(messages=3_000, crash_probability=0.02, commit_every=10,
                                                  seed=5))
    assert result.duplicates_per_crash > 1 and result.duplicates <= 9 * result.crashes, \
        "a crash replays at most the 9 processed-but-uncommitted messages before it, never one committed"
    band = 4 * duplicates_sigma(3_000, 0.02, 10)
    assert abs(result.duplicates - expected_duplicates(3_000, 0.02, 10)) < band
    again = DuplicatesConfig(messages=500, crash_probability=0.02, commit_every=10, seed=5)
    assert simulate_duplicates(again).processings == simulate_duplicates(again).processings, \
        "one seed, one result"


def test_a_daily_volume_and_peak_factor_give_the_peak():
    inputs = SizingInputs(peak_messages_per_s=None, daily_messages=864_000_000, peak_factor=4)
    assert inputs.peak == 40_000
    assert size(inputs).quantity("peak").formula.startswith("864,000,000 msg/day")


@pytest.mark.parametrize("bad", [dict(message_bytes=0), dict(headroom=0.5), dict(crash_probability=1.0),
                                 dict(peak_messages_per_s=None), dict(drain_consumers=(0,))])
def test_inputs_that_describe_no_workload_are_refused(bad):
    with pytest.raises(SizingError):
        SizingInputs(**bad)


def test_the_text_prints_the_articles_figures_as_they_write_them(report):
    text = "\n".join(capacity_lines(report))
    for figure in ("50 MB/s", "4,320,000,000", "4.32 TB", "30.24 TB", "90.72 TB", "5%", "100 MB/s"):
        assert figure in text
    assert bytes_text(1_500) == "1.5 kB" and percent(0.16, fixed=True) == "16.00%"
    whole = render(report, [])
    assert "17.26%" in whole and "16.00%" in whole and "8,631 msg/s" in whole and "8,001 msg/s" in whole
    assert "Why the figures differ" in whole and "20 min" in whole and "never" in whole


def test_railmq_size_prints_the_worked_example_and_json(capsys):
    assert cli.main(["size", "--simulate-messages", "0"]) == 0
    out = capsys.readouterr().out
    lines: dict[str, str] = {}
    for line in out.splitlines():
        lines.setdefault(line.split("  ")[0], line)  # the first table names each quantity first
    assert "  50 MB/s  " in lines["incoming bandwidth"]
    assert "4,320,000,000" in lines["messages per day"] and "4.32 TB" in lines["data per day, one copy"]
    assert "30.24 TB" in lines["7 days retained, one copy"]
    assert "90.72 TB" in lines["7 days retained, every copy"]
    assert " 10 " in lines["minimum partitions"] and " 20 " in lines["partitions with headroom"]
    assert " 20 " in lines["consumers"] and " 5% " in lines["even share of one partition"]
    assert "100 MB/s" in lines["doubled peak: bandwidth"] and " 40 " in lines["doubled peak: partitions"]
    assert " 40 " in lines["doubled peak: consumers"]
    assert cli.main(["size", "--json", "--simulate-messages", "0", "--peak", "100000"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_name = {quantity["name"]: quantity for quantity in data["quantities"]}
    assert by_name["bandwidth"]["value"] == 100_000_000 and by_name["partitions"]["value"] == 40
    assert data["simulated_duplicates"] == [] and math.isclose(data["remap"]["formula_moved"], 2 / 3)


def test_railmq_size_refuses_conflicting_rates(capsys):
    assert cli.main(["size", "--peak", "5", "--daily-messages", "9"]) == 2
    assert "not both" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        cli.main(["size", "--crash-probability", "1.5"])
    assert refused.value.code == 2


@pytest.mark.parametrize("flag", ["--headroom", "--peak", "--message-bytes", "--retention-days", "--outage-minutes"])
@pytest.mark.parametrize("value", ["inf", "nan", "1e999"])
def test_railmq_size_refuses_a_quantity_that_is_not_a_finite_number(flag, value, capsys):
    """--headroom inf ended in an OverflowError traceback."""
    with pytest.raises(SystemExit) as refused:
        cli.main(["size", "--simulate-messages", "0", flag, value])

    assert refused.value.code == 2 and "positive" in capsys.readouterr().err
