"""Reading and writing history files: strict parsing with line numbers, typed lines, and a writer
that is safe from many threads and flushes on its own."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

import chaos.history as history_module
from chaos.history import (
    CommitLine,
    HistoryError,
    FinalReadLine,
    HistoryWriter,
    HistoryWriterClosed,
    MalformedHistory,
    SendLine,
    UnreadableHistory,
    iter_history,
    iter_typed_history,
    load_history,
    typed_line,
)


class FakeClock:
    def __init__(self, start_ns: int = 5_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns


def test_written_lines_read_back_in_order(tmp_path):
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        writer.write({"type": "config", "time_ns": 0, "seed": 7})
        writer.write(SendLine(type="invoke", f="send", time_ns=1, process="p", topic="t", key="k", value="v"))
        writer.write_many([{"type": "heal", "time_ns": 2}, {"type": "hygiene", "time_ns": 3}])
        assert writer.lines_written == 4
    lines = load_history(path)
    assert [line["type"] for line in lines] == ["config", "invoke", "heal", "hygiene"]
    assert lines[1] == {
        "type": "invoke", "time_ns": 1, "f": "send", "process": "p", "topic": "t", "key": "k", "value": "v"
    }


def test_record_stamps_time_since_the_writer_started_from_the_injected_clock(tmp_path):
    clock = FakeClock()
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path, clock_ns=clock) as writer:
        clock.now_ns += 250
        assert writer.record({"type": "heal"}) == 250
        clock.now_ns += 1_000
        assert writer.elapsed_ns() == 1_250
        writer.record({"type": "hygiene", "leftover_processes": []})
    assert [line["time_ns"] for line in load_history(path)] == [250, 1_250]


def test_a_line_is_encoded_when_written_so_later_changes_do_not_leak(tmp_path):
    path = tmp_path / "history.jsonl"
    line = {"type": "heal", "time_ns": 1}
    with HistoryWriter(path) as writer:
        writer.write(line)
        line["time_ns"] = 99
    assert load_history(path)[0]["time_ns"] == 1


def test_many_threads_write_whole_lines_in_each_thread_s_order(tmp_path):
    path = tmp_path / "history.jsonl"
    threads_count, lines_per_thread = 4, 2_000
    with HistoryWriter(path, buffer_bytes_max=4_096) as writer:
        def produce(thread: int) -> None:
            for index in range(lines_per_thread):
                writer.record({"type": "ok", "f": "send", "process": f"p{thread}", "index": index})

        threads = [threading.Thread(target=produce, args=(thread,)) for thread in range(threads_count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    lines = load_history(path)  # would raise on a torn or interleaved line
    assert len(lines) == threads_count * lines_per_thread
    for thread in range(threads_count):
        indexes = [line["index"] for line in lines if line["process"] == f"p{thread}"]
        assert indexes == list(range(lines_per_thread))
    stamps = [line["time_ns"] for line in lines]
    assert stamps == sorted(stamps)


def test_buffered_lines_reach_the_file_on_the_timer_without_a_flush_call(tmp_path):
    path = tmp_path / "history.jsonl"
    writer = HistoryWriter(path, flush_interval_ms=20)
    try:
        writer.write({"type": "heal", "time_ns": 1})
        deadline = time.monotonic() + 5.0
        while path.read_bytes() == b"" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert path.read_bytes() == b'{"type":"heal","time_ns":1}\n'
    finally:
        writer.close()


def test_lines_stay_buffered_until_the_timer_or_the_size_limit(tmp_path):
    path = tmp_path / "history.jsonl"
    writer = HistoryWriter(path, flush_interval_ms=60_000, buffer_bytes_max=100)
    try:
        writer.write({"type": "heal", "time_ns": 1})
        assert path.read_bytes() == b""  # small, and the timer is a minute away
        writer.write({"type": "hygiene", "time_ns": 2, "leftover_processes": ["x" * 100]})
        assert len(path.read_bytes().splitlines()) == 2  # over the size limit: written by the caller
        writer.write({"type": "heal", "time_ns": 3})
        writer.flush()
        assert len(path.read_bytes().splitlines()) == 3
    finally:
        writer.close()


def test_a_closed_writer_refuses_lines_and_closing_twice_is_harmless(tmp_path):
    writer = HistoryWriter(tmp_path / "history.jsonl")
    writer.close()
    writer.close()
    with pytest.raises(HistoryWriterClosed):
        writer.write({"type": "heal", "time_ns": 1})


def test_the_writer_appends_to_an_existing_history(tmp_path):
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        writer.write({"type": "heal", "time_ns": 1})
    with HistoryWriter(path) as writer:
        writer.write({"type": "heal", "time_ns": 2})
    assert [line["time_ns"] for line in load_history(path)] == [1, 2]


@pytest.mark.parametrize(
    ("second_line", "complaint"),
    [
        ('{"type": "ok", "f": ', "not valid JSON"),
        ("", "blank line"),
        ("[1, 2]", "Expected `object`"),
        ('{"time_ns": 3}', "`type`"),
        ('{"type": "heal"}', "`time_ns`"),
        ('{"type": "heal", "time_ns": true}', "got `bool` - at `$.time_ns`"),
        ('{"type": "heal", "time_ns": "3"}', "got `str` - at `$.time_ns`"),
    ],
)
def test_a_malformed_line_names_its_line_number(tmp_path, second_line, complaint):
    path = tmp_path / "history.jsonl"
    path.write_text('{"type": "heal", "time_ns": 1}\n' + second_line + '\n{"type": "heal", "time_ns": 5}\n')
    for read in (load_history, lambda p: list(iter_typed_history(p))):
        with pytest.raises(MalformedHistory) as raised:
            read(path)
        assert raised.value.line_number == 2
        assert complaint in str(raised.value) and str(raised.value).startswith("line 2: ")


def test_a_field_of_the_wrong_type_is_named(tmp_path):
    path = tmp_path / "history.jsonl"
    line = {"type": "ok", "f": "send", "time_ns": 1, "process": "p", "topic": "t", "value": "v",
            "offset": "7"}
    path.write_text(json.dumps(line) + "\n")
    expected = r"line 1: ok send line: Expected `int \| null`, got `str` - at `\$.offset`"
    with pytest.raises(MalformedHistory, match=expected):
        list(iter_typed_history(path))
    with pytest.raises(MalformedHistory, match=r"\$.offset"):
        typed_line(load_history(path)[0], 1)


def test_typed_reading_skips_unknown_kinds_but_keeps_line_numbers(tmp_path):
    path = tmp_path / "history.jsonl"
    lines = [
        {"type": "invoke", "f": "subscribe", "time_ns": 1},
        {"type": "weather", "time_ns": 2},
        {"type": "ok", "f": "commit", "time_ns": 3, "process": "p", "group": "g", "topic": "t",
         "offsets": {"2": 413}},
        {"type": "final-read", "time_ns": 4, "topic": "t", "partition": 0, "entries": [[0, None, "v"]]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    typed = list(iter_typed_history(path))
    assert [number for number, _ in typed] == [3, 4]
    commit, final_read = typed[0][1], typed[1][1]
    assert isinstance(commit, CommitLine) and commit.offsets == {2: 413}  # partition keys become ints
    assert isinstance(final_read, FinalReadLine) and final_read.entries == [(0, None, "v")]
    assert typed_line(lines[2], 3) == commit
    assert typed_line(lines[0], 1) is None


def test_an_operation_line_needs_its_f(tmp_path):
    with pytest.raises(MalformedHistory, match="without a string field 'f'"):
        typed_line({"type": "ok", "time_ns": 1}, 9)


def test_a_missing_file_is_unreadable_at_once(tmp_path):
    with pytest.raises(UnreadableHistory, match="cannot open"):
        iter_history(tmp_path / "absent.jsonl")
    with pytest.raises(UnreadableHistory):
        iter_typed_history(Path(tmp_path / "absent.jsonl"))


def test_a_line_past_the_bound_is_refused_by_number_after_reading_only_that_much(tmp_path, monkeypatch):
    """An endless stream (a pipe of one line that never ends) is no history: its line is read at
    most HISTORY_LINE_BYTES_MAX at a time and refused by number, not read until memory runs out."""
    monkeypatch.setattr(history_module, "HISTORY_LINE_BYTES_MAX", 64)
    path = tmp_path / "history.jsonl"
    path.write_bytes(b'{"type":"heal","time_ns":1}\n' + b"x" * 1000)
    with pytest.raises(MalformedHistory, match="line 2: longer than 64 bytes"):
        list(iter_history(path))
    with pytest.raises(MalformedHistory, match="line 2: longer than 64 bytes"):
        list(iter_typed_history(path))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full to make writes fail")
def test_a_failed_background_flush_is_raised_to_the_next_writer_call_and_at_close():
    writer = HistoryWriter("/dev/full", flush_interval_ms=10)
    writer.write({"type": "heal", "time_ns": 1})
    deadline = time.monotonic() + 5.0
    with pytest.raises(HistoryError, match="flush failed"):
        while time.monotonic() < deadline:
            writer.write({"type": "heal", "time_ns": 2})
            time.sleep(0.01)
    with pytest.raises(HistoryError, match="flush failed"):
        writer.close()
