"""Fixtures for running the real `railmq` command as a subprocess.

`railmq(...)` runs one command to completion (`python -m railmq`, or the installed script with
`script=True`) from the repository root, so `--handler tests.cli.handlers:...` imports.
`background(...)` starts a long-running command (`up`, a group member) in a session of its own
and, whatever the test did, kills that session's processes at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT_S = 60


def installed_script() -> str:
    found = shutil.which("railmq", path=os.path.join(sys.prefix, "bin")) or shutil.which("railmq")
    if found is None:
        pytest.fail("the railmq console script is not installed (pip install -e .)")
    return found


def command_line(args: tuple, script: bool) -> list[str]:
    head = [installed_script()] if script else [sys.executable, "-m", "railmq"]
    return head + [str(arg) for arg in args]


@pytest.fixture
def railmq():
    def run(*args, input: str | None = None, env: dict | None = None, script: bool = False,
            timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run(command_line(args, script), input=input, capture_output=True, text=True,
                              cwd=REPOSITORY, env={**os.environ, **(env or {})}, timeout=timeout)
    return run


@pytest.fixture
def background():
    started: list[subprocess.Popen] = []

    def start(*args, env: dict | None = None, script: bool = False) -> subprocess.Popen:
        process = subprocess.Popen(command_line(args, script), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, cwd=REPOSITORY, env={**os.environ, **(env or {})},
                                   start_new_session=True)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            process.communicate(timeout=10)


CLUSTER_PORTS = 6  # `railmq up --port P` takes P..P+5: three controllers, then three group voters


def free_port(span: int = CLUSTER_PORTS) -> int:
    """A port P with P..P+span-1 all free now, below the kernel's ephemeral range.

    A cluster listens on consecutive ports from the one it is given; a port the kernel handed out
    (from 32768 up) can be followed by one an outgoing connection holds, so the search stays
    below it.
    """
    import random

    for _ in range(200):
        base = random.randrange(20_000, 32_768 - span)
        if all(_binds(port) for port in range(base, base + span)):
            return base
    raise RuntimeError(f"no {span} consecutive free ports in 20000-32767")


def _binds(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def port_listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def handler_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
