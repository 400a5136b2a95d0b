"""`railmq up --detach` and `railmq down`: a local cluster in the background, stopped by name.

A foreground `railmq up` writes `railmq.json` into its data directory once the cluster answers
(its pid, address and node count) and removes it when it stops. `up --detach` starts that same
foreground command as a process of its own session (so the shell's Ctrl-C, job control and
hang-up never reach it), with its output in `<data dir>/railmq.log`, waits until the state file
names that process and the coordinator answers, prints where the cluster is, and returns.
`railmq down` reads the state file of the data directory, checks that the pid is still a railmq
process, sends it SIGTERM (it stops every actor it started) and waits for it to exit.

The state file is a claim, the data directory's lock is the truth: the running `railmq up` holds
`<data dir>/.lock` with its pid inside (storage/directory.py). A state file that is damaged
(undecodable, not a JSON object, a key missing or of the wrong type) or gone does not stop `down`
from finding that process, nor `up --detach` from refusing to start a second cluster. Reading a
damaged one is a `StateFileDamaged` naming the file; it belongs to no one who can vouch for it,
so `down` and a stopping `up` remove it rather than leave it in the way of every later command.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
from typing import Any

import psutil

from actors.errors import ErrorCode, RailmqError
from railmq.cli_common import EXIT_FAILED, EXIT_OK, clients_default_bootstrap, print_error
from storage.directory import LOCK_NAME, lock_holder

STATE_FILE = "railmq.json"
LOG_FILE = "railmq.log"
# Starting 3 nodes takes a few seconds; a loaded machine may take many more.
DETACHED_START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S_DEFAULT = 60.0
LOG_LINES_SHOWN = 15
# What `write_state` writes is about 200 bytes; a file far larger is not one, and is not read whole.
STATE_FILE_BYTES_MAX = 64 * 1024
# The keys the commands read, and their types (`write_state` writes these and a few more).
STATE_KEYS = {"pid": int, "bootstrap": str, "nodes": int}
STATE_KEY_TYPE_NAMES = {int: "a whole number", str: "text"}


class StateFileDamaged(RailmqError):
    """The state file is there but is not what `write_state` writes."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(ErrorCode.STORAGE_ERROR, f"the state file {path} is damaged ({why}): remove it "
                                                  f"(a running `railmq up` is the pid in {LOCK_NAME} next to it)")
        self.path = path
        self.why = why


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
    """Remove the state file if it is this process's (a newer `up` may have replaced it), or if it
    is damaged. Never raises: this runs as `up` stops, after its actors are gone."""
    try:
        state = read_state(data_dir)
    except StateFileDamaged as damaged:
        # Whose it was cannot be told. Left behind, it would stand in the way of every later
        # `up --detach` and `down`; a newer `up`, if one runs, is found by its lock instead.
        print(f"removing the damaged {damaged.path}: {damaged.why}", file=sys.stderr)
        _remove_quietly(damaged.path)
        return
    if state is not None and state["pid"] == os.getpid():
        _remove_quietly(state_path(data_dir))


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        print(f"could not remove {path} ({error}): remove it by hand", file=sys.stderr)


def read_state(data_dir: str) -> dict[str, Any] | None:
    """The state file's document, None if there is none, or StateFileDamaged."""
    path = state_path(data_dir)
    try:
        # O_NONBLOCK: a pipe in its place must not hold the open until some process writes to it.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise StateFileDamaged(path, "it is not a regular file")
            content = handle.read(STATE_FILE_BYTES_MAX + 1)
    except FileNotFoundError:
        return None
    except OSError as error:  # a directory in its place, no permission
        raise StateFileDamaged(path, f"it cannot be read: {error.strerror or error}") from None
    return _checked_state(path, content)


def _checked_state(path: str, content: bytes) -> dict[str, Any]:
    if len(content) > STATE_FILE_BYTES_MAX:
        raise StateFileDamaged(path, f"larger than {STATE_FILE_BYTES_MAX} bytes")
    try:
        state = json.loads(content.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise StateFileDamaged(path, f"byte {error.start} is not UTF-8") from None
    except (ValueError, RecursionError) as error:
        raise StateFileDamaged(path, f"not JSON: {error}") from None
    if not isinstance(state, dict):
        raise StateFileDamaged(path, f"a JSON {type(state).__name__}, not an object")
    for key, kind in STATE_KEYS.items():
        value = state.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            found = "missing" if key not in state else f"{value!r}, not {STATE_KEY_TYPE_NAMES[kind]}"
            raise StateFileDamaged(path, f"its {key!r} is {found}")
    if state["pid"] <= 0:
        raise StateFileDamaged(path, f"its 'pid' is {state['pid']}, not a process id")
    return state


def read_state_or_damage(data_dir: str) -> tuple[dict[str, Any] | None, StateFileDamaged | None]:
    """The state, or None and why it could not be read (the callers that can do without it)."""
    try:
        return read_state(data_dir), None
    except StateFileDamaged as damaged:
        return None, damaged


def running_up_process(state: dict[str, Any] | None, data_dir: str) -> psutil.Process | None:
    """The `railmq up` process the state names, if it is alive, still railmq (pids are reused) and
    holds `data_dir`'s lock: a state file copied with its directory (`cp -a` of a running one)
    names the original's, and `down` on the copy stopped that cluster."""
    process = up_process(state["pid"]) if state is not None else None
    return process if process is not None and _holds_lock(process, data_dir) else None


def up_process(pid: int) -> psutil.Process | None:
    """The `railmq up` process of that pid, if it is alive and still railmq (pids are reused)."""
    try:
        process = psutil.Process(pid)
        command = " ".join(process.cmdline())
        if process.status() == psutil.STATUS_ZOMBIE or "railmq" not in command or " up" not in command:
            return None
        return process
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def lock_holding_up_process(data_dir: str) -> psutil.Process | None:
    """The `railmq up` process that holds the data directory's lock, found without the state file:
    the pid written in the lock file, if that process is `railmq up` and has the file open (a pid
    left by one killed outright may since belong to another `railmq up`)."""
    pid = lock_holder(data_dir)
    process = up_process(pid) if pid else None
    return process if process is not None and _holds_lock(process, data_dir) else None


def _holds_lock(process: psutil.Process, data_dir: str) -> bool:
    lock_path = os.path.realpath(os.path.join(data_dir, LOCK_NAME))
    try:
        return any(opened.path == lock_path for opened in process.open_files())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def run_detached(args: argparse.Namespace, taken_port: Any, port_in_use_text: Any) -> int:
    data_dir = os.path.abspath(args.data_dir)
    os.makedirs(data_dir, exist_ok=True)
    state, damaged = read_state_or_damage(data_dir)
    running = running_up_process(state, data_dir) or lock_holding_up_process(data_dir)
    if running is not None:
        print_error("INVALID_CONFIG", f"a cluster already runs from {data_dir} (pid {running.pid}); "
                                      "`railmq down` stops it")
        return EXIT_FAILED
    taken = taken_port(args)
    if taken is not None:
        print_error("INVALID_CONFIG", port_in_use_text(args, taken))
        return EXIT_FAILED
    if damaged is not None:  # no `up` holds the directory: a leftover, which the new one replaces
        print(f"removing the damaged {damaged.path} ({damaged.why}): no cluster runs from {data_dir}",
              file=sys.stderr)
        _remove_quietly(damaged.path)
    log_path = os.path.join(data_dir, LOG_FILE)
    command = [sys.executable, "-m", "railmq", "up", "--nodes", str(args.nodes), "--port", str(args.port),
               "--data-dir", data_dir] + (["--rebuild-metadata"] if getattr(args, "rebuild_metadata", False) else [])
    if getattr(args, "reset_group_state", False):
        command.append("--reset-group-state")
    if getattr(args, "controllers", None) is not None:
        command += ["--controllers", str(args.controllers)]
    if getattr(args, "console", False):  # railmq/cli_console.py's flags
        command += ["--console", "--http-port", str(args.http_port), "--refresh-ms", str(args.refresh_ms)]
    with _open_log(log_path) as log:
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


def _open_log(path: str) -> Any:
    """The background cluster's log, opened to append to. Non-blocking, as a pipe in its place
    held `up --detach` for ever (an open for writing waits for a reader); only a regular file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as error:  # ENXIO: a pipe nothing reads
        why = "it is not a regular file" if error.errno == errno.ENXIO else error.strerror or str(error)
        raise RailmqError(ErrorCode.STORAGE_ERROR,
                          f"the log {path} cannot be opened ({why}); remove it") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RailmqError(ErrorCode.STORAGE_ERROR, f"the log {path} cannot be opened (it is not a regular "
                                                   "file); remove it")
    os.set_blocking(fd, True)
    return open(fd, "ab")


def _data_dir_flag(args: argparse.Namespace) -> str:
    return "" if os.path.normpath(args.data_dir) == os.path.normpath("./railmq-data") else f" --data-dir {args.data_dir}"


def _wait_for_start(child: subprocess.Popen, data_dir: str) -> dict[str, Any] | None:
    from railmq.cli_connect import ClusterUnreachable, check_cluster

    deadline = time.monotonic() + DETACHED_START_TIMEOUT_S
    while time.monotonic() < deadline and child.poll() is None:
        state, _ = read_state_or_damage(data_dir)  # damaged: not the child's yet
        if state is not None and state["pid"] == child.pid:
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
    state, damaged = read_state_or_damage(data_dir)
    named = running_up_process(state, data_dir)
    process = named or lock_holding_up_process(data_dir)
    if process is None:
        _no_cluster_runs(data_dir, state, damaged)
    _stop(process, args.timeout)
    left, left_damaged = read_state_or_damage(data_dir)
    if left_damaged is not None or (left is not None and left == state):
        _remove_quietly(state_path(data_dir))  # the stopped one's, or damaged: not a newer `up`'s
    where = f"at {state['bootstrap']} " if named is not None else ""
    print(f"stopped the cluster {where}(pid {process.pid}); its data stays in {data_dir}")
    if damaged is not None:
        print(f"its state file was damaged ({damaged.why}): found it as the process holding "
              f"{os.path.join(data_dir, LOCK_NAME)}, and removed {damaged.path}", file=sys.stderr)
    return EXIT_OK


def _no_cluster_runs(data_dir: str, state: dict[str, Any] | None, damaged: StateFileDamaged | None) -> None:
    """Nothing to stop: a state file left is a dead cluster's (or damaged), and goes."""
    why = f"no live process in {STATE_FILE}"
    if damaged is not None:
        why = f"no `railmq up` holds its {LOCK_NAME}, and its state file {damaged.path} was damaged " \
              f"({damaged.why}): removed it"
    if state is not None or damaged is not None:
        _remove_quietly(state_path(data_dir))
    raise RailmqError(ErrorCode.INVALID_REQUEST, f"no railmq cluster runs from {data_dir} ({why}); "
                                                 "pass --data-dir to name another")


def _stop(process: psutil.Process, timeout_s: float) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except psutil.TimeoutExpired:
        process.kill()  # its actors notice their lifeline close and exit too
        process.wait(timeout=10)
        print(f"the cluster did not stop within {timeout_s:.0f} s and was killed", file=sys.stderr)
