"""Running labs: one live cluster for all of them, the terminal output, and the summary table.

    results = run_labs([find("hot-key")], quick=False, say=print)

One `LocalCluster` (3 nodes, the chaos harness's short timeouts) serves every lab of a run:
each lab works on topics of its own and deletes them when it ends, kills or pauses only the
processes of its own topics, and its clients are closed before the next lab starts. The
cluster is a context manager, so every process, port, directory and shared-memory segment is
gone when the run ends, however it ends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Callable

from chaos.labs.framework import Lab, LabContext, LabResult, format_number
from chaos.runner import ACTOR_RESTART_DELAY_MS, CHAOS_LIMITS
from railmq.cluster import LocalCluster

# The chaos harness's limits: a replica is judged gone after 1.5 s, a lagging follower leaves
# the ISR after 2 s — short enough for failovers inside a lab, long enough for a loaded machine.
LAB_LIMITS = CHAOS_LIMITS
CLUSTER_NODES = 3


def lab_cluster(data_dir: str | None = None) -> LocalCluster:
    """The labs' cluster: 3 nodes, short timeouts, traced, and with the fault switch on (labs 7
    and 12 cut links with it)."""
    return LocalCluster(CLUSTER_NODES, data_dir=data_dir, limits=LAB_LIMITS,
                        restart_delay_ms=ACTOR_RESTART_DELAY_MS, trace=True, fault_injection=True)


def header_lines(lab: Lab) -> list[str]:
    return [f"lab {lab.number}: {lab.name} — {lab.title}", f"claim ({lab.article}): {lab.claim}"]


def measure_lines(result: LabResult) -> list[str]:
    rows = [["measure", "expected", "band", "measured", "verdict"]]
    for measure in result.measures:
        rows.append([measure.name, format_number(measure.expected), measure.band.text(),
                     format_number(measure.measured), measure.verdict])
    widths = [max(len(row[index]) for row in rows) for index in range(5)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    lines += [f"  {fact}" for fact in result.facts]
    if result.error:
        lines.append(f"the experiment broke: {result.error}")
    lines.append(f"verdict: {result.verdict} ({result.elapsed_s:.1f} s)")
    return lines


def run_lab(cluster: LocalCluster, lab: Lab, *, quick: bool, work_dir: str, seed: int = 1,
            say: Callable[[str], None] = lambda line: None) -> LabResult:
    for line in header_lines(lab):
        say(line)
    context = LabContext(cluster, os.path.join(work_dir, lab.name), quick=quick, seed=seed, say=say)
    result = lab.run(context, quick)
    for line in measure_lines(result):
        say(line)
    say("")
    return result


def run_labs(labs: list[Lab], *, quick: bool = False, seed: int = 1,
             say: Callable[[str], None] = lambda line: None) -> list[LabResult]:
    work_dir = tempfile.mkdtemp(prefix="railmq-labs-")
    results = []
    started = time.monotonic()
    try:
        with lab_cluster() as cluster:
            for lab in labs:
                results.append(run_lab(cluster, lab, quick=quick, work_dir=work_dir, seed=seed, say=say))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    say(f"{sum(result.passed for result in results)} of {len(results)} labs passed in "
        f"{time.monotonic() - started:.0f} s")
    return results


def summary_lines(results: list[LabResult]) -> list[str]:
    """One row per measure of every lab: lab, measure, expected, measured, verdict."""
    rows = [["lab", "measure", "expected", "band", "measured", "verdict"]]
    for result in results:
        for measure in result.measures:
            rows.append([f"{result.lab.number} {result.lab.name}", measure.name,
                         format_number(measure.expected),
                         measure.band.text(), format_number(measure.measured), measure.verdict])
        if result.error:
            rows.append([f"{result.lab.number} {result.lab.name}", "(the experiment broke)", "-", "-", "-",
                         "ERROR"])
    widths = [max(len(row[index]) for row in rows) for index in range(6)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines
