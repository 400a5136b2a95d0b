"""What a lab is, what it measures, and how its verdict is reached.

A `Lab` states one claim of the design articles (quoting which article makes it), runs an
experiment on a live cluster through a `LabContext`, and returns a `LabResult`: a list of
`Measure`s — each an expected value from the arithmetic, a tolerance `Band` around it, and the
measured value — plus sentences naming what happened and `Plot`s for the report. A lab passes
when every measure lands in its band. Bands are decided before the run, from the arithmetic
and its statistical spread, never from what was measured.

Labs come in two sizes: `quick` (seconds, for the default test tier) and full (what `railmq lab
run` does by default). Both run the same code with different parameters.

The context owns the cluster the labs share (chaos/labs/runner.py starts it) and everything a
lab creates on it: topics are deleted after each lab, so one cluster serves every lab.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from railmq.admin import Admin


@dataclass(frozen=True)
class Band:
    low: float
    high: float

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"a band's low end {self.low} is above its high end {self.high}")

    def holds(self, value: float | None) -> bool:
        return value is not None and not math.isnan(value) and self.low - 1e-9 <= value <= self.high + 1e-9

    @classmethod
    def exactly(cls, value: float) -> "Band":
        return cls(value, value)

    @classmethod
    def around(cls, value: float, spread: float) -> "Band":
        return cls(value - spread, value + spread)

    @classmethod
    def relative(cls, value: float, fraction: float) -> "Band":
        return cls(value * (1 - fraction), value * (1 + fraction))

    def text(self, unit: str = "") -> str:
        if self.low == self.high:
            return f"exactly {format_number(self.low)}{unit}"
        if math.isinf(self.high):
            return f"at least {format_number(self.low)}{unit}"
        return f"{format_number(self.low)} .. {format_number(self.high)}{unit}"


def format_number(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.3g}" if abs(value) < 10 else f"{value:,.1f}"
    return f"{int(value):,}"


@dataclass
class Measure:
    name: str
    expected: float
    band: Band
    measured: float | None
    unit: str = ""
    how: str = ""  # where the expected value comes from, in words

    @property
    def passed(self) -> bool:
        return self.band.holds(self.measured)

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]
    color: str = ""
    dashed: bool = False
    step: bool = False  # drawn as a staircase (a count that jumps), not as straight segments


@dataclass
class Plot:
    """A chart: `line` (x-y series) or `bar` (one bar per point, x = the category index)."""

    title: str
    x_label: str
    y_label: str
    series: list[Series]
    kind: str = "line"
    categories: list[str] = field(default_factory=list)  # bar labels
    marks: list[tuple[float, str]] = field(default_factory=list)  # vertical lines at x, labelled
    svg: str = ""  # a ready-made picture (e.g. the chaos report's timeline) instead of series


@dataclass
class LabResult:
    lab: "Lab"
    quick: bool
    measures: list[Measure] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    elapsed_s: float = 0.0
    error: str = ""  # the experiment itself broke (not a failed measure)

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.measures) and all(measure.passed for measure in self.measures)

    @property
    def verdict(self) -> str:
        return "ERROR" if self.error else ("PASS" if self.passed else "FAIL")

    def measure(self, name: str) -> Measure:
        for measure in self.measures:
            if measure.name == name:
                return measure
        raise KeyError(f"lab {self.lab.name} has no measure {name!r}")


@dataclass(frozen=True)
class Lab:
    number: int
    name: str
    title: str
    article: str  # which article makes the claim
    claim: str  # two or three sentences, quoting the article
    experiment: Callable[["LabContext", LabResult], None]
    look_at: str = ""  # what to look at in the output (docs/labs.md)

    def run(self, context: "LabContext", quick: bool = False) -> LabResult:
        result = LabResult(self, quick)
        started = time.monotonic()
        try:
            self.experiment(context, result)
        except Exception as error:  # noqa: BLE001 - a broken experiment is reported, not raised
            result.error = f"{type(error).__name__}: {error}"
        finally:
            context.cleanup()
            result.elapsed_s = time.monotonic() - started
        return result


ARTICLE_GUIDE = "the interview guide (seeds/000)"
ARTICLE_QUESTIONS = "the question guide (seeds/004)"


class LabContext:
    """One lab's view of the shared cluster: names, topics, a scratch directory, progress lines."""

    def __init__(self, cluster: Any, work_dir: str, *, quick: bool = False, seed: int = 1,
                 say: Callable[[str], None] | None = None) -> None:
        self.cluster = cluster
        self.bootstrap = cluster.bootstrap
        self.work_dir = work_dir
        self.quick = quick
        self.seed = seed
        self._say = say
        self._topics: list[str] = []
        self._closers: list[Callable[[], None]] = []
        os.makedirs(work_dir, exist_ok=True)

    def say(self, line: str) -> None:
        if self._say is not None:
            self._say(line)

    def name(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:6]}"

    def path(self, name: str) -> str:
        return os.path.join(self.work_dir, name)

    def topic(self, prefix: str, partitions: int = 1, replication_factor: int = 1, *, full_isr: bool = False,
              **config: Any) -> str:
        """Create a topic of the lab's own (deleted when the lab ends) and wait for its leaders."""
        name = self.name(prefix)
        with Admin(self.bootstrap) as admin:
            admin.create_topic(name, partitions=partitions, replication_factor=replication_factor,
                               config=config or None)
            self._topics.append(name)
            if full_isr:
                admin.wait_for_leaders(name, timeout_s=30, full_isr=True)
        return name

    def fault_admin(self) -> Admin:
        """An admin client the actors' fault switches obey: it carries the cluster's secret (the
        cluster must have been started with `fault_injection=True`, as chaos/labs/runner.py does)."""
        return Admin(self.bootstrap, secret=getattr(self.cluster, "secret", b"") or None)

    def adopt_topic(self, name: str) -> None:
        """A topic the lab's clients created (a dead-letter topic): deleted with the others."""
        if name not in self._topics:
            self._topics.append(name)

    def on_cleanup(self, close: Callable[[], None]) -> None:
        self._closers.append(close)

    def cleanup(self) -> None:
        for close in reversed(self._closers):
            try:
                close()
            except Exception:  # noqa: BLE001 - cleanup goes on; the cluster stop reaps the rest
                pass
        self._closers.clear()
        with Admin(self.bootstrap, timeout_ms=5000) as admin:
            for topic in self._topics:
                try:
                    admin.delete_topic(topic)
                except Exception:  # noqa: BLE001 - a topic that is already gone is fine
                    pass
        self._topics.clear()
