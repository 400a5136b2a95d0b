"""The README's examples, run as written: a new user's first hour must not start with a failure.

Given a fresh directory holding nothing but the virtualenv the README's install line makes, when
its tour runs line by line in bash, then every command succeeds, the group member bills the good
records and dead-letters the poison one, the chaos run is valid, and `railmq down` leaves no
process behind. Given the README's Python example, when it runs as a script, then it prints the
record it consumed. The cluster listens where $RAILMQ_BOOTSTRAP points (a free port), so the
tour runs unchanged beside anything else on the machine.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from tests.cli.conftest import free_port

pytestmark = pytest.mark.integration
REPOSITORY = Path(__file__).resolve().parents[2]
README = (REPOSITORY / "README.md").read_text(encoding="utf-8")


def code_block(language: str, after_heading: str) -> str:
    section = README.split(after_heading, 1)[1]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"no {language} block after {after_heading!r}"
    return match.group(1)


def environment(port: int) -> dict[str, str]:
    return {**os.environ, "RAILMQ_BOOTSTRAP": f"127.0.0.1:{port}", "PYTHONPATH": str(REPOSITORY),
            "COLUMNS": "100", "PYTHONUNBUFFERED": "1"}


def stop_what_is_left(directory: Path) -> list[psutil.Process]:
    """Whatever the tour left running from `directory`, stopped; returns what was found."""
    left = []
    for process in psutil.process_iter(["pid", "cwd", "cmdline"]):
        try:
            if process.info["cwd"] == str(directory) and process.pid != os.getpid():
                left.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for process in left:
        try:
            process.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=30)
    return left


@pytest.mark.timeout(90)
def test_the_python_example_prints_the_record_it_consumed(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(code_block("python", "From Python:"))
    finished = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=80, env=environment(free_port()))
    assert finished.returncode == 0, finished.stderr
    lines = finished.stdout.splitlines()
    assert re.fullmatch(r"RecordMetadata\(topic='orders', partition=\d, offset=0, timestamp_ms=\d+\)", lines[0])
    assert re.fullmatch(r"\d 0 b'alice' b'paid 10'", lines[1]), finished.stdout


@pytest.mark.timeout(300)
def test_the_tour_runs_as_written_in_a_fresh_directory():
    tour = code_block("bash", "## A short tour")
    with tempfile.TemporaryDirectory(prefix="railmq-tour-") as name:
        directory = Path(name)
        (directory / ".venv").symlink_to(sys.prefix)  # what the install line made
        try:
            finished = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", tour], cwd=directory,
                                      capture_output=True, text=True, timeout=280, env=environment(free_port()))
        finally:
            left = stop_what_is_left(directory)
        output = finished.stdout + finished.stderr
        assert finished.returncode == 0, output[-4000:]
        assert left == [], f"the tour left processes running: {left}"
        assert "created topic orders: 3 partitions, replication factor 3, min in-sync 2" in output
        assert re.search(r"orders/\d@\d key=alice paid 10", output) and "key=carol poison" in output
        assert "billed alice paid 10" in output and "billed bob paid 20" in output
        assert "billed carol" not in output
        assert re.search(r"dead-lettered orders/\d@\d to orders\.dlq/\d@0 after 3 attempts", output)
        assert "group billing: left after handling 3 records" in output
        assert "dead letters in orders.dlq" in output and "ValueError" in output
        assert "VALID: no safety violation" in output and (directory / "report" / "report.html").exists()
        assert "10 seeds, 0 failed" in output
        assert "stopped the cluster" in output and not (directory / "railmq-data" / "railmq.json").exists()
