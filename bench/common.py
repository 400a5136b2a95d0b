"""Shared plumbing for benchmarks: repeat a measurement, take medians, print and save figures.

Benchmarks print figures and never assert timings: a 2-core machine is noisy, so every figure
is a median over repeats and sits beside a baseline measured in the same run.

While a benchmark runs it says what it is measuring: `parse_args` starts a progress display on
stderr (a rich spinner with the step, the repeat and the time so far on a terminal; one line per
step otherwise), each `phase(label)` names the next step, `median_of(..., label=)` counts its
repeats, and `report` ends the display before it prints the figures. Stdout and the --json file
carry only the figures, as before.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Callable

import os

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

_progress: "BenchProgress | None" = None


class BenchProgress:
    """The running benchmark's current step, on stderr."""

    def __init__(self, name: str) -> None:
        self.console = Console(stderr=True)
        self.live = self.console.is_terminal
        self.steps = 0
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=self.console, transient=True, disable=not self.live)
        self.task = self.progress.add_task(name, total=None)
        self.name = name
        self.progress.start()

    def step(self, label: str) -> None:
        self.steps += 1
        if self.live:
            self.progress.update(self.task, description=f"{self.name}: {label}")
        else:
            print(f"[{self.name}] {label}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        self.progress.stop()


def phase(label: str) -> None:
    """Say what the benchmark measures next (on stderr; figures stay on stdout)."""
    if _progress is not None:
        _progress.step(label)


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument("--repeat", type=int, default=3, help="repeats per measurement (median is reported)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    global _progress
    _progress = BenchProgress("bench." + os.path.basename(sys.argv[0] if sys.argv else "bench").removesuffix(".py"))
    return args


def plain_consume_rate(bootstrap: str, topic: str, partitions: int, count: int, **options) -> float:
    """Records/s of a plain (assigned, group-less) consumer reading `count` records from the start
    of `topic`'s partitions 0..partitions-1, timed from the first poll."""
    from railmq.consumer import Consumer

    settings = {"max_poll_records": 10_000, "fetch_partition_bytes_max": 8 * 1024 * 1024, **options}
    with Consumer(bootstrap, auto_offset_reset="earliest", **settings) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        for p in range(partitions):
            consumer.position((topic, p))
        started, seen = time.perf_counter(), 0
        while seen < count:
            seen += len(consumer.poll(1000))
        return seen / (time.perf_counter() - started)


def median_of(repeat: int, measure: Callable[[], float], label: str = "") -> float:
    """Run `measure` `repeat` times and return the median of what it returns."""
    values = []
    for run in range(max(1, repeat)):
        if label:
            phase(f"{label} (run {run + 1} of {max(1, repeat)})")
        values.append(measure())
    return statistics.median(values)


def percentile(samples: list[float], fraction: float) -> float:
    """Nearest-rank percentile (fraction in [0, 1]) of a non-empty list."""
    ordered = sorted(samples)
    rank = min(len(ordered) - 1, max(0, int(round(fraction * len(ordered) + 0.5)) - 1))
    return ordered[rank]


class Stopwatch:
    def __enter__(self) -> "Stopwatch":
        self.start = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def _shown(value: object) -> str:
    """One decimal for most figures; three significant ones below 10 (idle cores, ratios, seconds)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.1f}" if abs(value) >= 10 or value == 0 else f"{value:.3g}"


def free_page_reporting_order() -> int | None:
    """The order of the free blocks this (virtual) machine reports to its host, or None when it
    reports none. A guest that reports freed memory gets it back from the host on the next touch:
    on the development VM that made writes into new page-cache pages ~10 times slower, which is
    most of what a replicated produce costs there (docs/performance.md)."""
    try:
        with open("/sys/module/page_reporting/parameters/page_reporting_order", encoding="ascii") as handle:
            order = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return order if order <= PAGE_ORDER_MAX else None  # above the largest block: nothing is reported


PAGE_ORDER_MAX = 10  # Linux's largest buddy-allocator block (MAX_ORDER) on x86-64 and arm64


def report(name: str, figures: dict[str, float], args: argparse.Namespace, notes: dict | None = None) -> None:
    """Print figures as an aligned table and, with --json, save them with machine facts."""
    if _progress is not None:
        _progress.stop()
    width = max(len(key) for key in figures)
    print(f"{name}")
    for key, value in figures.items():
        shown = _shown(value)
        print(f"  {key:<{width}}  {shown}")
    reporting = free_page_reporting_order()
    if reporting is not None:
        print(f"  (this machine hands freed memory back to its host (free page reporting, order {reporting}): "
              "a write into a page the page cache takes anew waits for the host first; "
              "docs/performance.md measures what that costs)")
    if args.json:
        document = {
            "benchmark": name,
            "figures": figures,
            "notes": notes or {},
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform(),
                        "free_page_reporting_order": reporting},
            "repeat": args.repeat,
        }
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2)
        print(f"figures written to {args.json}")
