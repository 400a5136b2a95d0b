"""The labs' machinery without a cluster: bands and verdicts, the catalog, plots, pages, the CLI.

Given a lab whose experiment raises, its result says ERROR (never PASS) and its cleanup still ran;
given labels an attacker chose, every page and picture escapes them and references nothing
outside itself; given `railmq lab` with no lab or an unknown one, it is a usage error.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ElementTree

import pytest

from chaos.labs.catalog import BY_NAME, COURSE, LABS, UnknownLab, find
from chaos.labs.crash_worker import WorkerRun, read_worker_log
from chaos.labs.framework import Band, Lab, LabContext, LabResult, Measure, Plot, Series
from chaos.labs.plots import bar_svg, line_svg, nice_ticks, plot_svg
from chaos.labs.report import index_page, lab_page, write_pictures, write_report
from chaos.labs.runner import measure_lines, summary_lines
from chaos.labs.tools import slope
from railmq import cli

HOSTILE = '<script>alert("x")</script> & "quotes"'


def test_bands_hold_what_they_say():
    assert Band.exactly(3).holds(3) and not Band.exactly(3).holds(3.5)
    assert Band.relative(100, 0.2).holds(80) and not Band.relative(100, 0.2).holds(79)
    assert Band(1, math.inf).holds(10**9) and Band(1, math.inf).text() == "at least 1"
    assert not Band(0, 1).holds(None) and not Band(0, 1).holds(float("nan"))
    with pytest.raises(ValueError):
        Band(2, 1)


def test_a_result_passes_only_when_every_measure_lands_and_something_was_measured():
    lab = LABS[0]
    assert not LabResult(lab, quick=True).passed, "measuring nothing is not a pass"
    good = Measure("m", 1, Band.exactly(1), 1)
    bad = Measure("n", 1, Band.exactly(1), 2)
    assert LabResult(lab, True, measures=[good]).passed
    failed = LabResult(lab, True, measures=[good, bad])
    assert not failed.passed and failed.verdict == "FAIL" and bad.verdict == "FAIL"
    assert LabResult(lab, True, measures=[good], error="boom").verdict == "ERROR"


class FakeCluster:
    bootstrap = "tcp://127.0.0.1:1"


def test_a_broken_experiment_is_an_error_and_its_cleanup_still_runs(tmp_path, monkeypatch):
    cleaned = []

    def experiment(context: LabContext, result: LabResult) -> None:
        context.on_cleanup(lambda: cleaned.append("closed"))
        result.measures.append(Measure("m", 1, Band.exactly(1), 1))
        raise RuntimeError("the cluster went away")

    monkeypatch.setattr(LabContext, "cleanup", lambda self: [close() for close in self._closers])
    lab = Lab(99, "broken", "a lab that breaks", "nowhere", "\"nothing\"", experiment)
    result = lab.run(LabContext(FakeCluster(), str(tmp_path)), quick=True)
    assert result.verdict == "ERROR" and "went away" in result.error and cleaned == ["closed"]
    assert "the experiment broke" in "\n".join(measure_lines(result))


def test_the_catalog_has_the_fifteen_labs_each_quoting_an_article():
    assert [lab.number for lab in LABS] == list(range(1, 16))
    assert len(BY_NAME) == 15 and sorted(COURSE) == sorted(BY_NAME), "the course teaches every lab once"
    for lab in LABS:
        assert lab.claim.count('"') >= 2, f"{lab.name} quotes its article"
        assert "seeds/00" in lab.article and lab.look_at
    assert find("7") is find("acks-and-failover")
    with pytest.raises(UnknownLab, match="railmq lab list"):
        find("no-such-lab")


def test_slope_fits_a_line():
    fitted, r_squared = slope([(t, 3 * t + 1) for t in range(10)])
    assert fitted == pytest.approx(3) and r_squared == pytest.approx(1)
    assert slope([(1, 1)]) == (0.0, 0.0)


def test_the_worker_log_counts_duplicates_losses_and_crashes(tmp_path):
    path = tmp_path / "worker.log"
    path.write_text("P 0\nC 1\nP 1\nX 1\nP 1\nC 2\nP 3\nC 4\n")
    run = WorkerRun()
    read_worker_log(str(path), run)
    assert (run.duplicates, run.crashes, run.crashes_uncommitted, run.lost(4)) == (1, 1, [1], [2])


def _plots() -> list[Plot]:
    return [Plot(HOSTILE, "seconds", HOSTILE, series=[Series(HOSTILE, [(0, 0), (1, 5), (2, 7)], step=True),
                                                      Series("b", [(0, 1), (2, 2)], dashed=True)],
                 marks=[(1.0, HOSTILE)]),
            Plot("bars", "", "count", kind="bar", categories=[HOSTILE, "two"],
                 series=[Series("c", [(0, 3), (1, 4)])])]


@pytest.mark.parametrize("standalone", [False, True])
def test_plots_are_well_formed_escaped_and_self_contained(standalone):
    for plot in _plots():
        svg = plot_svg(plot, standalone=standalone)
        parsed = svg if standalone else svg.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1)
        tree = ElementTree.fromstring(parsed)
        assert tree.tag.endswith("svg")
        assert "<script" not in svg and "&lt;script&gt;" in svg
        assert ("http://" in svg) == standalone, "only a standalone file names the SVG namespace"
        if standalone:  # a picture on its own says what it shows, as docs/pictures' others do
            assert tree.find("{http://www.w3.org/2000/svg}title") is not None, plot.title
            assert tree.find("{http://www.w3.org/2000/svg}desc") is not None, plot.title
    assert "no samples" in line_svg(Plot("empty", "", "", series=[]))
    assert bar_svg(Plot("b", "", "", kind="bar", series=[Series("s", [])])).endswith("</svg>")
    assert nice_ticks(7)[-1] >= 7 and nice_ticks(0) == [0.0, 1.0]


def test_a_picture_drawn_elsewhere_is_described_when_it_stands_alone():
    drawn = Plot(HOSTILE, "", "", series=[], svg='<svg viewBox="0 0 10 10"><text>drawn elsewhere</text></svg>')
    assert plot_svg(drawn) == drawn.svg  # embedded in a page as it is
    tree = ElementTree.fromstring(plot_svg(drawn, standalone=True))
    assert tree.find("{http://www.w3.org/2000/svg}title").text == HOSTILE
    assert tree.find("{http://www.w3.org/2000/svg}desc") is not None
    namespaced = Plot("timeline", "", "", series=[], svg='<svg xmlns="http://www.w3.org/2000/svg"><rect><title>a tooltip</title></rect></svg>')
    tree = ElementTree.fromstring(plot_svg(namespaced, standalone=True))
    assert tree.find("{http://www.w3.org/2000/svg}title").text == "timeline"


def test_pages_and_pictures_are_written_escaped(tmp_path):
    lab = LABS[0]
    results = [LabResult(lab, True, measures=[Measure(HOSTILE, 1, Band.exactly(1), 1, how=HOSTILE)],
                         facts=[HOSTILE], plots=_plots(), elapsed_s=1.5),
               LabResult(LABS[1], False, error=HOSTILE)]
    index = write_report(str(tmp_path / "report"), results)
    for page in (open(index).read(), lab_page(results[0]), index_page(results)):
        assert "<script" not in page and "http" not in page and "&lt;script&gt;" in page
    assert (tmp_path / "report" / f"lab-{lab.name}.html").exists()
    written = write_pictures(str(tmp_path / "pictures"), results)
    assert [path.rsplit("/", 1)[1] for path in written] == [f"labs-{lab.name}.svg", f"labs-{lab.name}-2.svg"]
    table = "\n".join(summary_lines(results))
    assert "ERROR" in table and "PASS" in table


def test_railmq_lab_list_and_its_usage_errors(capsys):
    assert cli.main(["lab", "list"]) == 0
    out = capsys.readouterr().out
    assert all(lab.name in out for lab in LABS)
    assert cli.main(["lab", "run"]) == 2
    assert "--all" in capsys.readouterr().err
    assert cli.main(["lab", "run", "no-such-lab"]) == 2
    assert "railmq lab list" in capsys.readouterr().err
    assert cli.main(["lab", "run", "--all", "hot-key"]) == 2
