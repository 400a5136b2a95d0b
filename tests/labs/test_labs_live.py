"""Every lab on a live cluster: each measured value must land in the band the arithmetic set.

The short versions run in the default tier, all fifteen on one module-scoped 3-node cluster
(each lab works on topics of its own and deletes them when it ends); the full versions, the
ones `railmq lab run` runs, are under `-m slow`. A failure names every measure that missed its
band, with what was expected and what was measured.
"""

from __future__ import annotations

import pytest

from chaos.labs.catalog import LABS
from chaos.labs.framework import LabContext, LabResult
from chaos.labs.runner import lab_cluster, measure_lines
from tests.conftest import railmq_children

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The labs' own 3-node cluster (fault switch on), shared by every lab of the module."""
    started = lab_cluster(data_dir=str(tmp_path_factory.mktemp("labs")))
    with started:
        yield started
    leftovers = railmq_children()
    for process in leftovers:
        process.kill()
    assert not leftovers, f"processes left behind: {leftovers}"


def explain(result: LabResult) -> str:
    size = "quick" if result.quick else "full"
    return "\n".join([f"lab {result.lab.name} ({size}):"] + measure_lines(result))


def run(cluster, lab, tmp_path, quick: bool) -> LabResult:
    result = lab.run(LabContext(cluster, str(tmp_path), quick=quick), quick=quick)
    assert not result.error, explain(result)
    assert result.measures, f"lab {lab.name} measured nothing"
    assert result.passed, explain(result)
    assert result.plots, f"lab {lab.name} drew nothing"
    return result


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lab", LABS, ids=[lab.name for lab in LABS])
def test_the_short_lab_lands_in_its_bands(cluster, lab, tmp_path):
    run(cluster, lab, tmp_path, quick=True)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("lab", LABS, ids=[lab.name for lab in LABS])
def test_the_full_lab_lands_in_its_bands(cluster, lab, tmp_path):
    run(cluster, lab, tmp_path, quick=False)
