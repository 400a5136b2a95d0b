"""What the live console costs the cluster, and how fast an event reaches the page.

    python -m bench.console [--quick] [--json PATH] [--phase-s S] [--rate N] [--kills K] [--repeat C]

One 3-node cluster (default limits, traced), one topic (6 partitions, RF 3, min in-sync 2), a
producer at a fixed rate (acks=all, idempotent) and a consumer group reading, all the time, and
`railmq console` in a process of its own with headless chromium. In the same run, C cycles of
three phases `--phase-s` long each, interleaved so the machine's drift falls on all alike:

  - no console: its process stopped (SIGSTOP), the page blank;
  - the console alone: running, the page blank;
  - the console with the page open (the live feed streaming).

Then K times the page's "kill leader" button on a partition, waiting until the page shows
another leader (the failover itself is the cluster's: reported, not the target).

Figures: the cluster's CPU (every actor process, user + system, in % of one core), median per
phase kind, and what the console and the browser add to it; the console's and the browser's own
CPU; the requests per second the console sends (from its /metrics); the latency from an event's
trace line (its `time_ns`) to the page rendering it (p50, p99, max over elections, ISR changes
and replica starts during the kills; target <= 500 ms); the time from a press of "kill leader"
to the new leader on the page.
"""

from __future__ import annotations

import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil

from bench.common import parse_args, percentile, phase, report

TOPIC = "bench-console"
PARTITIONS = 6
TRACE_EVENTS = ("leader-elected", "isr-changed", "replica-started", "became-leader")


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def _tree(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [root.pid] + [child.pid for child in root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def measure_cpu(groups: dict[str, callable], seconds: float) -> dict[str, float]:
    """% of one core used by each group of processes over `seconds` (pids listed at the start)."""
    pids = {name: list_pids() for name, list_pids in groups.items()}
    before = {name: _cpu_seconds(found) for name, found in pids.items()}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    return {name: (_cpu_seconds(pids[name]) - before[name]) / elapsed * 100 for name in groups}


class Load:
    """A paced producer and a committing group member, in threads of this process."""

    def __init__(self, bootstrap: str, rate: int) -> None:
        self.bootstrap, self.rate = bootstrap, rate
        self.stop = threading.Event()
        self.sent = 0
        self.threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _produce(self) -> None:
        from railmq.producer import Producer

        with Producer(self.bootstrap, acks="all", idempotent=True, linger_ms=5) as producer:
            started = time.monotonic()
            while not self.stop.is_set():
                due = int((time.monotonic() - started) * self.rate)
                while self.sent < due:
                    producer.send(TOPIC, b"x" * 100, key=str(self.sent % 64).encode())
                    self.sent += 1
                time.sleep(0.01)
            producer.flush(30)

    def _consume(self) -> None:
        from railmq.consumer import Consumer

        with Consumer(
            self.bootstrap, group_id="bench-console-readers", auto_offset_reset="earliest"
        ) as consumer:
            consumer.subscribe([TOPIC])
            while not self.stop.is_set():
                consumer.poll(200)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


def start_console(bootstrap: str, data_dir: str) -> tuple[subprocess.Popen, str]:
    command = [
        sys.executable,
        "-m",
        "railmq",
        "console",
        "--bootstrap",
        bootstrap,
        "--http-port",
        "0",
        "--data-dir",
        data_dir,
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    match = re.search(r"(http://127\.0\.0\.1:\d+)/", process.stdout.readline())
    if match is None:
        process.kill()
        raise RuntimeError("the console did not print its address")
    return process, match.group(1)


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def kill_leaders(page, kills: int) -> list[float]:
    """Press "kill leader" on partitions in turn; ms from each press to another leader on the page."""
    samples = []
    for index in range(kills):
        partition = index % PARTITIONS
        selector = f"[data-testid=partition][data-topic='{TOPIC}'][data-partition='{partition}']"
        page.wait_for_function(
            "s => { const r = document.querySelector(s); return r && r.dataset.leader !== '-1'; }",
            arg=selector,
            timeout=60_000,
        )
        old = page.get_attribute(selector, "data-leader")
        pressed = time.monotonic()
        page.click(f"{selector} [data-testid=kill-leader]")
        page.wait_for_function(
            "([s, old]) => { const r = document.querySelector(s);"
            " return r && r.dataset.leader !== old && r.dataset.leader !== '-1'; }",
            arg=[selector, old],
            timeout=60_000,
        )
        samples.append((time.monotonic() - pressed) * 1000)
        time.sleep(3.0)  # the killed replica restarts and rejoins before the next press
    return samples


def event_latencies(page, since_ms: float) -> list[float]:
    rendered = page.evaluate(
        "(since) => window.railmqConsole.renderedEvents.filter((e) => e.time_ns / 1e6 >= since)", since_ms
    )
    return [
        event["rendered_ms"] - event["time_ns"] / 1e6 for event in rendered if event["event"] in TRACE_EVENTS
    ]


def console_requests(url: str) -> dict[str, float]:
    """The console's own requests so far, per request type (its /metrics histogram counts)."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for match in re.finditer(
        r'^railmq_console_request_latency_seconds_count\{outcome="[a-z]+",request="(\w+)"\} (\S+)$',
        text,
        re.MULTILINE,
    ):
        counts[match.group(1)] = counts.get(match.group(1), 0.0) + float(match.group(2))
    return counts


def cpu_phases(
    cluster, console: subprocess.Popen, page, url: str, cycles: int, phase_s: float
) -> dict[str, list]:
    """Interleaved, so the machine's drift falls on every kind alike: no console (its process
    stopped with SIGSTOP, the page blank), the console alone (page blank), the console with the
    page open. Returns per kind the list of {group: % of a core}."""
    def actors() -> list[int]:
        return [actor["pid"] for actor in cluster.actors() if actor["pid"]]

    def browser() -> list[int]:
        return [child.pid for child in psutil.Process().children(recursive=True) if "chrom" in child.name()]

    results: dict[str, list] = {"none": [], "console": [], "browser": []}
    for cycle in range(cycles):
        for kind in ("none", "console", "browser"):
            phase(f"cluster CPU, {kind} (cycle {cycle + 1} of {cycles}, {phase_s:.0f} s)")
            if kind == "none":
                page.goto("about:blank")
                console.send_signal(signal.SIGSTOP)
            elif kind == "console":
                console.send_signal(signal.SIGCONT)
            else:
                page.goto(url + "/")
                page.wait_for_selector("[data-testid=partition]", timeout=30_000)
            time.sleep(1.0)  # let the change settle
            results[kind].append(
                measure_cpu(
                    {"cluster": actors, "console": lambda: [console.pid], "browser": browser}, phase_s
                )
            )
    console.send_signal(signal.SIGCONT)
    return results


def request_cost_us(cluster, seconds: float) -> float:
    """The cluster CPU one console-like request costs: a tight loop of the console's round
    (metadata, then counters from every actor) against the same span without it. The signal is
    large (thousands of requests a second), so the machine's noise hardly moves it."""
    from railmq.admin import Admin

    actors = lambda: [actor["pid"] for actor in cluster.actors() if actor["pid"]]  # noqa: E731
    idle = measure_cpu({"cluster": actors}, seconds)["cluster"]
    endpoints = [actor["endpoint"] for actor in cluster.actors() if actor["endpoint"]]
    sent = 0
    stop = threading.Event()

    def loop() -> None:
        nonlocal sent
        with Admin(cluster.bootstrap, timeout_ms=2000) as admin:
            while not stop.is_set():
                admin.metadata()
                for endpoint in endpoints:
                    admin.runtime_stats(endpoint)
                sent += 1 + len(endpoints)

    worker = threading.Thread(target=loop, daemon=True)
    started = time.monotonic()
    worker.start()
    busy = measure_cpu({"cluster": actors}, seconds)["cluster"]
    stop.set()
    worker.join(10)
    rate = sent / (time.monotonic() - started)
    return max(0.0, busy - idle) / 100 / rate * 1e6


def main() -> None:
    args = parse_args(
        __doc__.splitlines()[0],
        lambda parser: (
            parser.add_argument(
                "--phase-s", type=float, default=0.0, help="seconds per CPU phase (default 10; quick 5)"
            ),
            parser.add_argument(
                "--rate",
                type=int,
                default=500,
                help="records produced per second (default 500: the machine keeps headroom)",
            ),
            parser.add_argument(
                "--kills", type=int, default=0, help="leader kills from the page (default 8; quick 3)"
            ),
        ),
    )
    from playwright.sync_api import sync_playwright

    from chaos.console.browser import launch, why_no_browser
    from railmq.admin import Admin
    from railmq.cluster import LocalCluster

    missing = why_no_browser()
    if missing:
        raise SystemExit(f"bench.console needs a browser: {missing}")
    phase_s = args.phase_s or (5.0 if args.quick else 10.0)
    kills = args.kills or (3 if args.quick else 8)
    cycles = 1 if args.quick else max(1, args.repeat)
    data_dir = tempfile.mkdtemp(prefix="railmq-bench-console-")
    try:
        phase("starting a 3-node cluster")
        with LocalCluster(nodes=3, data_dir=data_dir) as cluster:
            with Admin(cluster.bootstrap) as admin:
                admin.create_topic(
                    TOPIC, partitions=PARTITIONS, replication_factor=3, config={"min_insync_replicas": 2}
                )
                admin.wait_for_leaders(TOPIC, full_isr=True)
            load = Load(cluster.bootstrap, args.rate)
            console, url = start_console(cluster.bootstrap, data_dir)
            try:
                with sync_playwright() as playwright:
                    browser = launch(playwright)
                    try:
                        page = browser.new_page(viewport={"width": 1400, "height": 1000})
                        time.sleep(2.0)  # past the first batches and the group's first rebalance
                        requests_before, started = console_requests(url), time.monotonic()
                        cpu = cpu_phases(cluster, console, page, url, cycles, phase_s)
                        requests_after, elapsed = console_requests(url), time.monotonic() - started
                        phase("the cluster's CPU per console-like request")
                        console.send_signal(signal.SIGSTOP)
                        cost_us = request_cost_us(cluster, phase_s)
                        console.send_signal(signal.SIGCONT)
                        phase(f"{kills} leader kills from the page")
                        since_ms = time.time() * 1000
                        press_to_leader = kill_leaders(page, kills)
                        latencies = event_latencies(page, since_ms)
                    finally:
                        browser.close()
            finally:
                stop_process(console)
                load.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    median = lambda kind, group: statistics.median(sample[group] for sample in cpu[kind])  # noqa: E731
    running_s = elapsed * 2 / 3  # the console was stopped for a third of the phases
    console_rate = (
        sum(requests_after.get(kind, 0) - requests_before.get(kind, 0) for kind in requests_after) / running_s
    )
    figures = {
        "cluster_cpu_no_console_pct": round(median("none", "cluster"), 1),
        "cluster_cpu_console_pct": round(median("console", "cluster"), 1),
        "cluster_cpu_console_and_browser_pct": round(median("browser", "cluster"), 1),
        "cluster_cpu_added_by_console_pct": round(
            median("console", "cluster") - median("none", "cluster"), 1
        ),
        "cluster_cpu_added_by_console_and_browser_pct": round(
            median("browser", "cluster") - median("none", "cluster"), 1
        ),
        "console_process_cpu_pct": round(median("console", "console"), 1),
        "console_process_cpu_with_browser_pct": round(median("browser", "console"), 1),
        "browser_cpu_pct": round(median("browser", "browser"), 1),
        "console_requests_per_s": round(console_rate, 1),
        "cluster_cpu_us_per_console_request": round(cost_us, 1),
        "cluster_cpu_from_console_requests_pct": round(console_rate * cost_us / 1e6 * 100, 2),
        "event_to_page_ms_p50": round(percentile(latencies, 0.50), 1) if latencies else -1.0,
        "event_to_page_ms_p99": round(percentile(latencies, 0.99), 1) if latencies else -1.0,
        "event_to_page_ms_max": round(max(latencies), 1) if latencies else -1.0,
        "event_to_page_samples": len(latencies),
        "kill_press_to_new_leader_on_page_ms_p50": round(percentile(press_to_leader, 0.50), 1),
        "kill_press_to_new_leader_on_page_ms_max": round(max(press_to_leader), 1),
        "produce_rate_per_s": args.rate,
    }
    per_type = {
        kind: round((requests_after.get(kind, 0) - requests_before.get(kind, 0)) / running_s, 2)
        for kind in sorted(requests_after)
    }
    report(
        "console",
        figures,
        args,
        notes={
            "phase_s": phase_s,
            "cycles": cycles,
            "kills": kills,
            "console_requests_per_s_by_type": per_type,
            "cpu_samples": cpu,
        },
    )


if __name__ == "__main__":
    main()
