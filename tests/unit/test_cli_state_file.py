"""A damaged `railmq.json` (railmq/cli_daemon.py): the state file `railmq up` keeps in its data
directory, read by `railmq down` and `railmq up --detach`.

A bad disk or a stray write can leave it undecodable, not JSON, not an object, or with a key
missing or of the wrong type. Every path that reads it either gets on with its job or refuses
with a typed error (`RailmqError`, printed as `error: NAME: sentence`) naming the file and what
to do — never a bare UnicodeDecodeError, AttributeError or KeyError. `railmq down` still stops a
cluster whose state file is damaged: the `railmq up` holding the data directory's lock is the
one to stop. And an `up` that stops never fails on the way out because of that file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pytest

from actors.errors import ErrorCode, RailmqError
from railmq import cli_daemon
from railmq.cli_common import EXIT_FAILED, EXIT_OK

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD = {"pid": 4242, "bootstrap": "tcp://127.0.0.1:7411", "nodes": 3, "data_dir": "/somewhere",
        "started_at_ms": 1}


def _invalid_utf8() -> bytes:
    text = bytearray(json.dumps(GOOD).encode())
    text[1] = 0xFF  # one byte of the first key, as a flipped bit on disk leaves it
    return bytes(text)


def _renamed_key() -> bytes:
    return json.dumps(GOOD).replace('"bootstrap"', '"bootstrbp"').encode()


DAMAGES = {
    "a 0xff byte": _invalid_utf8(),
    "not JSON": b'{"pid": 12',
    "a list, not an object": b"[1]",
    "a key renamed": _renamed_key(),
    "a pid that is text": json.dumps({**GOOD, "pid": "4242"}).encode(),
    "a pid that is true": json.dumps({**GOOD, "pid": True}).encode(),
    "a negative pid": json.dumps({**GOOD, "pid": -1}).encode(),
    "a bootstrap that is a number": json.dumps({**GOOD, "bootstrap": 7411}).encode(),
    "nested past the parser's depth": b"[" * 50_000,
    "far larger than a state file": b" " * (1 << 20) + json.dumps(GOOD).encode(),
}


def _damage(data_dir, content: bytes) -> str:
    path = cli_daemon.state_path(str(data_dir))
    with open(path, "wb") as handle:
        handle.write(content)
    return path


def _assert_names_the_file(error: RailmqError, path: str) -> None:
    assert path in str(error), f"the sentence names the file: {error}"


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_reading_a_damaged_state_file_is_a_typed_error_naming_it(tmp_path, damage):
    path = _damage(tmp_path, DAMAGES[damage])
    with pytest.raises(RailmqError) as raised:
        cli_daemon.read_state(str(tmp_path))
    assert raised.value.code == ErrorCode.STORAGE_ERROR
    _assert_names_the_file(raised.value, path)


def test_a_state_file_with_a_directory_in_its_place_is_a_typed_error_naming_it(tmp_path):
    os.mkdir(cli_daemon.state_path(str(tmp_path)))
    with pytest.raises(RailmqError) as raised:
        cli_daemon.read_state(str(tmp_path))
    _assert_names_the_file(raised.value, cli_daemon.state_path(str(tmp_path)))


@pytest.mark.timeout(30)
def test_a_pipe_in_place_of_the_state_file_or_the_lock_is_refused_without_waiting_for_a_writer(tmp_path):
    """A FIFO as `railmq.json` held `railmq down`, `railmq up --detach` and a stopping `up` in
    their read of it for ever (an open for reading waits for a writer); one as `.lock` held `down`
    the same way where it looked for the lock's holder."""
    os.mkfifo(cli_daemon.state_path(str(tmp_path)))
    with pytest.raises(RailmqError) as raised:
        cli_daemon.read_state(str(tmp_path))
    _assert_names_the_file(raised.value, cli_daemon.state_path(str(tmp_path)))
    cli_daemon.remove_state(str(tmp_path))  # a stopping `up` removes it, as any damaged one
    assert not os.path.exists(cli_daemon.state_path(str(tmp_path)))

    os.mkfifo(tmp_path / cli_daemon.LOCK_NAME)
    with pytest.raises(RailmqError):  # nothing runs from it: said, not waited for
        _down(tmp_path)


def test_a_missing_state_file_is_no_state_and_a_whole_one_is_read_back(tmp_path):
    assert cli_daemon.read_state(str(tmp_path)) is None
    cli_daemon.write_state(str(tmp_path), "tcp://127.0.0.1:7411", 3)
    state = cli_daemon.read_state(str(tmp_path))
    assert (state["pid"], state["bootstrap"], state["nodes"]) == (os.getpid(), "tcp://127.0.0.1:7411", 3)


@pytest.mark.parametrize("damage", ["a 0xff byte", "a list, not an object", "a key renamed"])
def test_an_up_that_stops_removes_a_damaged_state_file_instead_of_failing(tmp_path, damage):
    """Whose it was cannot be told, and left behind it would stand in the way of every later
    `up --detach` and `down`; a newer `up`, if one runs, is found by its lock instead."""
    path = _damage(tmp_path, DAMAGES[damage])
    cli_daemon.remove_state(str(tmp_path))
    assert not os.path.exists(path)


def test_an_up_that_stops_never_fails_on_a_state_file_it_cannot_remove(tmp_path):
    os.mkdir(cli_daemon.state_path(str(tmp_path)))
    cli_daemon.remove_state(str(tmp_path))  # says so, and returns


def test_an_up_that_stops_leaves_another_processes_state_file_alone(tmp_path):
    path = _damage(tmp_path, json.dumps({**GOOD, "pid": os.getpid() + 1}).encode())
    cli_daemon.remove_state(str(tmp_path))
    assert os.path.exists(path)


def _down(data_dir) -> int:
    return cli_daemon.run_down(argparse.Namespace(data_dir=str(data_dir), timeout=10.0))


@pytest.mark.parametrize("damage", ["a 0xff byte", "a list, not an object", "a key renamed"])
def test_down_with_a_damaged_state_file_and_nothing_running_says_so_and_removes_it(tmp_path, damage):
    path = _damage(tmp_path, DAMAGES[damage])
    with pytest.raises(RailmqError) as raised:
        _down(tmp_path)
    assert raised.value.code == ErrorCode.INVALID_REQUEST
    _assert_names_the_file(raised.value, path)
    assert not os.path.exists(path), "it belongs to no running cluster"


class _FakeUp:
    """A process that looks like `railmq up` to `railmq down` (its command line says `railmq up`)
    and holds the data directory's lock as `railmq up` does (storage/directory.py)."""

    def __init__(self, data_dir) -> None:
        code = ("import sys, time\n"
                "from storage.directory import DirectoryLock\n"
                "DirectoryLock(sys.argv[1]).acquire()\n"
                "print('locked', flush=True)\n"
                "time.sleep(60)\n")
        self.process = subprocess.Popen([sys.executable, "-c", code, str(data_dir), "railmq", "up"],
                                        cwd=REPOSITORY, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "locked"

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process.stdout.close()


@pytest.fixture
def fake_up(tmp_path):
    up = _FakeUp(tmp_path)
    try:
        yield up
    finally:
        up.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("damage", ["a 0xff byte", "a list, not an object", "a key renamed"])
def test_down_stops_the_up_holding_the_data_directory_when_its_state_file_is_damaged(tmp_path, fake_up, damage,
                                                                                       capsys):
    path = _damage(tmp_path, DAMAGES[damage])
    assert _down(tmp_path) == EXIT_OK
    assert fake_up.process.wait(timeout=10) is not None, "stopped"
    output = capsys.readouterr()
    assert f"pid {fake_up.process.pid}" in output.out and path in output.err
    assert not os.path.exists(path)


@pytest.mark.timeout(30)
def test_down_stops_the_up_holding_the_data_directory_when_its_state_file_is_gone(tmp_path, fake_up):
    assert _down(tmp_path) == EXIT_OK
    assert fake_up.process.wait(timeout=10) is not None


@pytest.mark.timeout(30)
def test_detach_refuses_while_the_up_holding_the_data_directory_runs_whatever_its_state_file_says(
        tmp_path, fake_up, capsys):
    _damage(tmp_path, DAMAGES["a 0xff byte"])
    args = argparse.Namespace(data_dir=str(tmp_path), nodes=3, port=0)
    assert cli_daemon.run_detached(args, lambda args: None, lambda args, port: "") == EXIT_FAILED
    error = capsys.readouterr().err
    assert "error: INVALID_CONFIG" in error and f"pid {fake_up.process.pid}" in error and "railmq down" in error
    time.sleep(0.1)
    assert fake_up.process.poll() is None, "left running"


def test_detach_over_a_damaged_state_file_of_no_running_cluster_gets_on_with_its_checks(tmp_path, capsys):
    """Nothing holds the data directory: the file is a leftover the new `up` replaces. (Its port
    is taken here, so it stops at that check rather than start a cluster.)"""
    _damage(tmp_path, DAMAGES["a 0xff byte"])
    args = argparse.Namespace(data_dir=str(tmp_path), nodes=3, port=7411)
    assert cli_daemon.run_detached(args, lambda args: 7411, lambda args, port: f"port {port} is in use") == EXIT_FAILED
    assert "error: INVALID_CONFIG: port 7411 is in use" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_up_detach_refuses_a_pipe_in_place_of_its_log_without_waiting_for_a_reader(tmp_path):
    """A FIFO as `railmq.log` held `railmq up --detach` for ever where it opened its log for the
    background cluster (an open for writing waits for a reader); nothing was started."""
    os.mkfifo(tmp_path / cli_daemon.LOG_FILE)
    args = argparse.Namespace(data_dir=str(tmp_path), nodes=1, port=0, controllers=None)

    with pytest.raises(RailmqError) as raised:
        cli_daemon.run_detached(args, lambda args: None, lambda args, port: "")

    assert cli_daemon.LOG_FILE in str(raised.value)


@pytest.mark.timeout(30)
def test_down_on_a_copy_of_a_running_directory_leaves_the_cluster_that_runs_from_the_original(
        tmp_path, fake_up):
    """`cp -a` of a running cluster's data directory (a backup) carries its `railmq.json`, which
    names the running `railmq up`: `railmq down --data-dir COPY` stopped that cluster and said
    "its data stays in COPY". The lock is the truth: no `up` holds the copy's."""
    original = fake_up.process
    state = {**GOOD, "pid": original.pid, "data_dir": str(tmp_path)}
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / cli_daemon.STATE_FILE).write_text(json.dumps(state))

    with pytest.raises(RailmqError) as raised:
        _down(copy)

    assert raised.value.code == ErrorCode.INVALID_REQUEST and str(copy) in str(raised.value)
    time.sleep(0.1)
    assert original.poll() is None, "the cluster of the original directory runs on"
    assert not (copy / cli_daemon.STATE_FILE).exists(), "the copy's stale state file goes"
