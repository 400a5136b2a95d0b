"""Tracing never kills an actor, and never fills a disk (transport/actor_main.py's TraceFile)."""

from __future__ import annotations

import errno
import json

from transport.actor_main import TraceFile


class FullDisk:
    """A file whose every write fails as a full disk's does."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def tell(self) -> int:
        return 0

    def close(self) -> None:
        pass


def test_a_trace_line_that_cannot_be_written_is_dropped_and_counted(tmp_path):
    trace = TraceFile(str(tmp_path / "trace.jsonl"), "replica/t/0/n1")
    trace.handle = FullDisk()

    for _ in range(3):
        trace("became-leader", {"leader_epoch": 4})  # must not raise

    assert trace.dropped >= 1
    trace("became-leader", {"leader_epoch": 5})  # the file is opened again and works
    lines = (tmp_path / "trace.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["leader_epoch"] == 5


def test_a_trace_file_that_cannot_be_opened_costs_only_its_lines(tmp_path):
    trace = TraceFile(str(tmp_path / "missing-directory" / "trace.jsonl"), "coordinator")

    trace("leader-elected", {})
    trace("leader-elected", {})

    assert trace.dropped == 2


def test_the_trace_file_rotates_by_size_and_keeps_a_bounded_number(tmp_path):
    path = tmp_path / "trace.jsonl"
    trace = TraceFile(str(path), "coordinator", bytes_max=2_000, kept=2)

    for index in range(400):
        trace("tick", {"index": index, "padding": "x" * 40})

    files = sorted(name.name for name in tmp_path.iterdir())
    assert files == ["trace.jsonl", "trace.jsonl.1", "trace.jsonl.2"]
    assert all(file.stat().st_size < 2_000 + 200 for file in tmp_path.iterdir())
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["index"] == 399
