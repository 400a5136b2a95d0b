"""`railmq up --detach` and `railmq down`: a local cluster in the background, stopped by name.

A foreground `railmq up` writes `railmq.json` into its data directory once the cluster answers
(its pid, address and node count) and removes it when it stops. `up --detach` starts that same
foreground command as a process of its own session (so the shell's Ctrl-C, job control and
hang-up never reach it), with its output in `<data dir>/railmq.log`, waits until the state file
names that process and the coordinator answers, prints where the cluster is, and returns.
`railmq down` reads the state file of the data directory, checks that the pid is still a railmq
process, sends it SIGTERM (it stops every actor it started) and waits for it to exit.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil

from actors.errors import ErrorCode, RailmqError
from railmq.cli_common import EXIT_FAILED, EXIT_OK, clients_default_bootstrap, print_error

STATE_FILE = "railmq.json"
LOG_FILE = "railmq.log"
# Starting 3 nodes takes a few seconds; a loaded machine may take many more.
DETACHED_START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S_DEFAULT = 60.0
LOG_LINES_SHOWN = 15


def state_path(data_dir: str) -> str:
    return os.path.join(data_dir, STATE_FILE)


def write_state(data_dir: str, bootstrap: str, nodes: int) -> None:
    document = {"pid": os.getpid(), "bootstrap": bootstrap, "nodes": nodes,
                "data_dir": os.path.abspath(data_dir), "started_at_ms": time.time_ns() // 1_000_000}
    temporary = state_path(data_dir) + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(document, handle)
    os.replace(temporary, state_path(data_dir))


def remove_state(data_dir: str) -> None:
    """Remove the state file if it is this process's (a newer `up` may have replaced it)."""
    state = read_state(data_dir)
    if state is not None and state.get("pid") == os.getpid():
        try:
            os.unlink(state_path(data_dir))
        except FileNotFoundError:
            pass


def read_state(data_dir: str) -> dict[str, Any] | None:
    try:
        with open(state_path(data_dir), encoding="utf-8") as handle:
            return json.load(handle)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def running_up_process(state: dict[str, Any] | None) -> psutil.Process | None:
    """The `railmq up` process the state names, if it is alive and still railmq (pids are reused)."""
    if not state or not isinstance(state.get("pid"), int):
        return None
    try:
        process = psutil.Process(state["pid"])
        command = " ".join(process.cmdline())
        if process.status() == psutil.STATUS_ZOMBIE or "railmq" not in command or " up" not in command:
            return None
        return process
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def run_detached(args: argparse.Namespace, taken_port: Any, port_in_use_text: Any) -> int:
    data_dir = os.path.abspath(args.data_dir)
    os.makedirs(data_dir, exist_ok=True)
    running = running_up_process(read_state(data_dir))
    if running is not None:
        print_error("INVALID_CONFIG", f"a cluster already runs from {data_dir} (pid {running.pid}); "
                                      "`railmq down` stops it")
        return EXIT_FAILED
    taken = taken_port(args)
    if taken is not None:
        print_error("INVALID_CONFIG", port_in_use_text(args, taken))
        return EXIT_FAILED
    log_path = os.path.join(data_dir, LOG_FILE)
    command = [sys.executable, "-m", "railmq", "up", "--nodes", str(args.nodes), "--port", str(args.port),
               "--data-dir", data_dir] + (["--rebuild-metadata"] if getattr(args, "rebuild_metadata", False) else [])
    if getattr(args, "reset_group_state", False):
        command.append("--reset-group-state")
    if getattr(args, "controllers", None) is not None:
        command += ["--controllers", str(args.controllers)]
    if getattr(args, "console", False):  # railmq/cli_console.py's flags
        command += ["--console", "--http-port", str(args.http_port), "--refresh-ms", str(args.refresh_ms)]
    with open(log_path, "ab") as log:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, close_fds=True)
    state = _wait_for_start(child, data_dir)
    if state is None:
        _give_up(child, log_path)
        return EXIT_FAILED
    flag = "" if state["bootstrap"] == clients_default_bootstrap() else f" --bootstrap {state['bootstrap']}"
    print(f"railmq is up: {state['nodes']} nodes at {state['bootstrap']} (pid {child.pid})")
    print(f"data and log in {data_dir}; stop it with: railmq down{_data_dir_flag(args)}")
    if getattr(args, "console", False):
        print(f"console at http://127.0.0.1:{args.http_port}/ once it is up (its address is in {log_path})")
    if flag:
        print(f"clients need{flag} (or export RAILMQ_BOOTSTRAP={state['bootstrap']})")
    return EXIT_OK


def _data_dir_flag(args: argparse.Namespace) -> str:
    return "" if os.path.normpath(args.data_dir) == os.path.normpath("./railmq-data") else f" --data-dir {args.data_dir}"


def _wait_for_start(child: subprocess.Popen, data_dir: str) -> dict[str, Any] | None:
    from railmq.cli_connect import ClusterUnreachable, check_cluster

    deadline = time.monotonic() + DETACHED_START_TIMEOUT_S
    while time.monotonic() < deadline and child.poll() is None:
        state = read_state(data_dir)
        if state is not None and state.get("pid") == child.pid:
            try:
                check_cluster(state["bootstrap"])
                return state
            except (ClusterUnreachable, RailmqError):
                pass
        time.sleep(0.1)
    return None


def _give_up(child: subprocess.Popen, log_path: str) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=STOP_TIMEOUT_S_DEFAULT)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        why = f"it did not answer within {DETACHED_START_TIMEOUT_S:.0f} s"
    else:
        why = f"it exited with code {child.returncode}"
    with open(log_path, encoding="utf-8", errors="replace") as log:
        tail = log.read().splitlines()[-LOG_LINES_SHOWN:]
    print_error("CLUSTER_START_FAILED", f"the background cluster did not start: {why}; the end of {log_path}:")
    for line in tail:
        print(f"  {line}", file=sys.stderr)


def run_down(args: argparse.Namespace) -> int:
    data_dir = os.path.abspath(args.data_dir)
    state = read_state(data_dir)
    process = running_up_process(state)
    if process is None:
        if state is not None:
            os.unlink(state_path(data_dir))  # the cluster died without cleaning up: nothing to stop
        raise RailmqError(ErrorCode.INVALID_REQUEST, f"no railmq cluster runs from {data_dir} "
                                                     f"(no live process in {STATE_FILE}); pass --data-dir to name another")
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=args.timeout)
    except psutil.TimeoutExpired:
        process.kill()  # its actors notice their lifeline close and exit too
        process.wait(timeout=10)
        print(f"the cluster did not stop within {args.timeout:.0f} s and was killed", file=sys.stderr)
    if os.path.exists(state_path(data_dir)) and read_state(data_dir) == state:
        os.unlink(state_path(data_dir))
    print(f"stopped the cluster at {state['bootstrap']} (pid {process.pid}); its data stays in {data_dir}")
    return EXIT_OK
