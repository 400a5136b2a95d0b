"""Bad input to the command line, found by fuzzing every command's flags: each gets one typed line
and exit 1 or 2, never a traceback, and nothing is read without bound. In-process, without a
cluster: the producer is replaced by one that records what it was given."""

from __future__ import annotations

import io
import os

import pytest

from railmq import cli, cli_data
from railmq.producer_futures import RecordMetadata


class RecordingProducer:
    """Producer's interface as `railmq produce` uses it; acknowledges every send at once."""

    sent: list[tuple[bytes | str | None, bytes | str | None, list | None]] = []

    def __init__(self, *args, **kwargs) -> None:
        self.batch_bytes_max = 1024 * 1024

    def __enter__(self) -> "RecordingProducer":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def send(self, topic, value=None, key=None, headers=None, partition=None):
        RecordingProducer.sent.append((key, value, headers))
        acknowledged = RecordMetadata(topic, 0, len(RecordingProducer.sent) - 1, 0)
        return type("Done", (), {"result": lambda self, timeout=None: acknowledged})()

    def flush(self, timeout=None) -> None:
        pass


@pytest.fixture
def recording(monkeypatch):
    RecordingProducer.sent = []
    monkeypatch.setattr(cli_data, "Producer", RecordingProducer)
    monkeypatch.setattr(cli, "check_cluster", lambda bootstrap: None)
    return RecordingProducer.sent


def _as_bytes(data) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _stdin(monkeypatch, raw: io.RawIOBase | bytes) -> None:
    buffer = io.BufferedReader(raw if isinstance(raw, io.RawIOBase) else io.BytesIO(raw))
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(buffer, encoding="utf-8"))


def test_produce_sends_bytes_that_are_not_utf8_as_given_from_arguments_stdin_and_files(
        recording, monkeypatch, tmp_path, capsys):
    """`railmq produce t $'\\xff'` (and the same in -k, -H, on stdin or in --file) ended in a
    UnicodeEncodeError or UnicodeDecodeError traceback: records are bytes, and those were sent."""
    value, key, header = (os.fsdecode(raw) for raw in (b"\xff\xfe", b"k\x80", b"h\xc3"))
    assert cli.main(["produce", "t", value, "-k", key, "-H", f"trace={header}", "--json"]) == 0
    (sent_key, sent_value, headers), = recording
    assert (_as_bytes(sent_key), _as_bytes(sent_value)) == (b"k\x80", b"\xff\xfe")
    assert headers == [("trace", b"h\xc3")]
    assert '"key_encoding": "base64"' in capsys.readouterr().out

    _stdin(monkeypatch, b"\xff\x00one\nk\x81:two\r\n")
    assert cli.main(["produce", "t", "-K", ":"]) == 0
    sent = [(_as_bytes(k), _as_bytes(v)) for k, v, _ in recording[1:]]
    assert sent == [(None, b"\xff\x00one"), (b"k\x81", b"two")]

    path = tmp_path / "records"
    path.write_bytes(b"\x80three\n")
    assert cli.main(["produce", "t", "--file", str(path)]) == 0
    assert _as_bytes(recording[-1][1]) == b"\x80three"
    assert "Traceback" not in capsys.readouterr().err


def test_a_header_name_that_is_not_utf8_is_a_usage_error(recording, capsys):
    code = cli.main(["produce", "t", "v", "-H", os.fsdecode(b"n\xff=v")])

    err = capsys.readouterr().err
    assert code == 2 and "-H" in err and not recording, err


class EndlessLine(io.RawIOBase):
    """/dev/zero on stdin: one line that never ends; reading 16 MiB of it is reading without bound."""

    read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.read_bytes > 16 * 1024 * 1024:
            raise AssertionError("read 16 MiB of one line: the read has no bound")
        buffer[:] = b"0" * len(buffer)
        self.read_bytes += len(buffer)
        return len(buffer)


@pytest.mark.timeout(30)
def test_a_line_longer_than_any_record_is_refused_after_reading_only_that_much(
        recording, monkeypatch, capsys):
    """`railmq produce t --file /dev/zero` read one endless line: a MemoryError traceback after
    3 GB under an address-space limit, all the memory there is without one."""
    stream = EndlessLine()
    _stdin(monkeypatch, stream)

    code = cli.main(["produce", "t", "--file", "-"])

    err = capsys.readouterr().err
    assert code == 1 and "MESSAGE_TOO_LARGE" in err and "line 1" in err, err
    assert stream.read_bytes < 4 * 1024 * 1024 and not recording


@pytest.mark.parametrize("flags", [["--peak", "1e-300"], ["--daily-messages", "1e-300"],
                                   ["--peak", "10", "--partition-mb-per-s", str(2**63)],
                                   ["--peak", "10", "--commit-batch", str(2**63)],
                                   ["--peak", "10", "--commit-batch", "2000", "--crash-probability", "0.5"],
                                   ["--peak", "10", "--commit-batch", "40", "--crash-probability", "0.5",
                                    "--simulate-messages", "100"]])
def test_size_answers_inputs_its_arithmetic_or_simulation_cannot_carry_with_a_usage_error(flags, capsys):
    """A bandwidth under a billionth of a partition's made 0 partitions (ZeroDivisionError);
    a commit batch of 2000 at a 50% crash chance overflowed a float (OverflowError); one of 40 left
    the simulated consumer unable to commit (SimulationStuck): tracebacks, all three."""
    code = cli.main(["size", "--simulate-messages", "0", *flags])

    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err, err
    assert code == 0 or "railmq size: error:" in err, err


def test_size_gives_the_smallest_bandwidth_one_partition():
    from railmq.sizing import SizingInputs, size

    report = size(SizingInputs(peak_messages_per_s=1e-300))
    assert next(q.value for q in report.quantities if q.name == "partitions_minimum") == 1


@pytest.mark.parametrize("flags", [["--retries", str(2**63)], ["--retries", "101"],
                                   ["--retries", "3", "--retry-backoff-ms", "20000"]])
def test_a_retry_policy_the_member_cannot_keep_is_a_usage_error(flags, monkeypatch, capsys):
    """`consume -g g --retries 2**63` (or a first backoff past the 10 s cap) ended in the retry
    policy's ValueError traceback once the cluster was found."""
    monkeypatch.setattr(cli, "check_cluster", lambda bootstrap: None)

    code = cli.main(["consume", "t", "-g", "g", *flags])

    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.startswith("usage: railmq consume"), err


@pytest.mark.parametrize("flag", [("top", "--interval-ms"), ("console", "--refresh-ms"), ("up", "--refresh-ms")],
                         ids=" ".join)
def test_the_consoles_periods_take_at_most_the_longest_wait_of_every_ms_flag(flag, capsys):
    """`railmq top --interval-ms 2**63` ended in an OverflowError traceback from its sleep; the
    `*-ms` flags of the other commands were already bounded at 2**31 - 1."""
    from railmq.cli_common import MILLISECONDS_MAX

    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), [*flag, str(2**63)])

    assert refused.value.code == 2 and flag[-1] in capsys.readouterr().err
    assert cli.parse(cli.build_parser(), [*flag, str(MILLISECONDS_MAX)]) is not None


def test_up_refuses_a_first_port_whose_cluster_would_run_past_the_last_tcp_port(tmp_path, capsys):
    """`railmq up --port 65535`: its three controllers and three group voters take 65535-65540, and
    the check that they are free ended in `OverflowError: bind(): port must be 0-65535.`"""
    data = tmp_path / "data"

    code = cli.main(["up", "--port", "65535", "--data-dir", str(data)])

    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.startswith("usage: railmq up"), err
    assert "--port" in err and "65540" in err
    assert not data.exists(), "nothing was made"


@pytest.mark.parametrize("address", ["...:7411", ".a:7411", "a..b:7411", f"{'a' * 64}.local:7411"])
def test_a_bootstrap_whose_host_is_no_host_name_is_a_usage_error(address, capsys):
    """`railmq topics list -b ...:7411` (an empty label, or one past 63 characters) ended in a
    `UnicodeError: encoding with 'idna' codec failed` traceback from the reachability check."""
    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), ["topics", "list", "-b", address])

    err = capsys.readouterr().err
    assert refused.value.code == 2 and "--bootstrap" in err and "Traceback" not in err, err


@pytest.mark.parametrize("command", [["up"], ["down"], ["node", "--node", "1", "--voters", "1=127.0.0.1"]],
                         ids=lambda command: command[0])
@pytest.mark.parametrize("below", ["", "data"], ids=["the-file", "below-the-file"])
def test_a_data_dir_that_is_a_file_is_a_usage_error(command, below, tmp_path, capsys):
    """`railmq up --data-dir FILE` said it was removing a damaged `FILE/railmq.json`, that it could
    not, then `OS_ERROR: [Errno 17] File exists`; `down` claimed to have removed it."""
    path = tmp_path / "file"
    path.write_text("not a directory\n")
    given = path / below if below else path

    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), [*command, "--data-dir", str(given)])

    err = capsys.readouterr().err
    assert refused.value.code == 2 and "--data-dir" in err and "not a directory" in err, err
    assert path.read_text() == "not a directory\n"


def test_sim_refuses_a_sweep_of_more_seeds_than_it_could_ever_run(capsys):
    """`railmq sim --seeds 99999999999999999999` ended in `OverflowError: Python int too large to
    convert to C ssize_t` (the sweep's length)."""
    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), ["sim", "--seeds", str(10**20)])

    err = capsys.readouterr().err
    assert refused.value.code == 2 and "--seeds" in err, err


@pytest.mark.timeout(60)
def test_up_refuses_a_cluster_secret_other_users_can_read_in_one_line(tmp_path, capsys):
    """A data directory whose `cluster.secret` had mode 0644 started as any other: every local
    user who could read the file was a member of the cluster."""
    from storage.directory import CLUSTER_SECRET_NAME, ClusterIdentity

    data = tmp_path / "data"
    ClusterIdentity.load_or_create(str(data))
    (data / CLUSTER_SECRET_NAME).chmod(0o644)

    code = cli.main(["up", "--nodes", "1", "--port", "0", "--data-dir", str(data)])

    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: CLUSTER_SECRET_EXPOSED: ") and "chmod 600" in err, err
    assert len(err.splitlines()) == 1 and not (data / "node-1").exists()


def test_down_waits_at_most_the_longest_wait_of_every_ms_flag(capsys):
    """`railmq down --timeout 1e308` sent the cluster SIGTERM, then ended in `OverflowError: cannot
    convert float infinity to integer` from the wait for it to stop."""
    from railmq.cli_common import MILLISECONDS_MAX

    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), ["down", "--timeout", "1e308"])

    assert refused.value.code == 2 and "--timeout" in capsys.readouterr().err
    assert cli.parse(cli.build_parser(), ["down", "--timeout", str(MILLISECONDS_MAX // 1000)]).timeout > 0


@pytest.mark.parametrize("flag", ["--duration", "--recovery-window"])
def test_a_chaos_run_takes_at_most_the_longest_wait_of_every_ms_flag(flag, capsys):
    """`railmq chaos run leader-kill --duration 1e308` said "starting" and built its fault schedule
    for ever (a kill every few seconds until the duration ends), growing without bound."""
    from railmq.cli_common import MILLISECONDS_MAX

    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), ["chaos", "run", "leader-kill", flag, "1e308"])

    assert refused.value.code == 2 and flag in capsys.readouterr().err
    assert cli.parse(cli.build_parser(), ["chaos", "run", "leader-kill", flag, str(MILLISECONDS_MAX // 1000)])


def test_sim_simulates_at_most_the_longest_wait_of_every_ms_flag(capsys):
    """`railmq sim --duration-ms 99999999999999999999999` simulated on for good (it was still in its
    first seed 30 s later; at ~25x real time, 10**23 ms is ~10**11 years)."""
    from railmq.cli_common import MILLISECONDS_MAX

    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), ["sim", "--duration-ms", str(10**23)])

    assert refused.value.code == 2 and "--duration-ms" in capsys.readouterr().err
    assert cli.parse(cli.build_parser(), ["sim", "--duration-ms", str(MILLISECONDS_MAX)]).duration_ms > 0


@pytest.mark.parametrize("flag", ["--report", "--pictures"])
def test_a_lab_report_directory_that_is_a_file_is_refused_before_the_labs_run(flag, tmp_path, capsys):
    """`railmq lab run --all --report FILE` ran every lab (minutes), then ended with `OS_ERROR:
    [Errno 17] File exists: 'FILE'`, the results printed but the report never written."""
    path = tmp_path / "file"
    path.write_text("")

    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), ["lab", "run", "--all", flag, str(path)])

    err = capsys.readouterr().err
    assert refused.value.code == 2 and flag in err and "not a directory" in err, err


def test_a_chaos_report_directory_that_is_a_file_is_refused_before_the_run(tmp_path, capsys):
    """`railmq chaos run leader-kill --report FILE` ended at its start with `OS_ERROR: Not a
    directory: 'FILE/workers'`; it is a usage error naming the flag now, as lab run's is."""
    path = tmp_path / "file"
    path.write_text("")

    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), ["chaos", "run", "leader-kill", "--report", str(path)])

    err = capsys.readouterr().err
    assert refused.value.code == 2 and "--report" in err and "not a directory" in err, err


def test_up_announces_a_data_dir_whose_name_looks_like_markup_as_written():
    """`railmq up --data-dir 'runs/[/]x'` started the cluster, then its announcement ended in
    `MarkupError: closing tag '[/]' ... has nothing to close` (the cluster was stopped)."""
    from rich.console import Console

    from railmq import cli_cluster

    class Started:
        bootstrap, node_ids, data_dir = "tcp://127.0.0.1:7411", [1], "runs/[/]x[bold]"

        def actors(self):
            return [{"kind": "group-coordinator", "endpoint": "tcp://127.0.0.1:7412"}]

    console = Console(file=io.StringIO(), width=200, color_system=None)
    cli_cluster._announce(console, Started())

    assert "runs/[/]x[bold]" in console.file.getvalue()


@pytest.mark.parametrize("command", [["up"], ["node", "--node", "1", "--voters", "1=127.0.0.1"]],
                         ids=lambda command: command[0])
def test_a_data_dir_whose_path_is_not_utf8_is_a_usage_error(command, tmp_path, capsys):
    """`railmq up --data-dir $'/tmp/x\\xff'` made the directory, then ended in `UnicodeEncodeError:
    'utf-8' codec can't encode character '\\udcff'` where the first actor's start specification
    (which carries the path as text) was encoded; `up --detach` showed that traceback from its log."""
    given = os.path.join(str(tmp_path), os.fsdecode(b"data\xff"))

    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), [*command, "--data-dir", given])

    err = capsys.readouterr().err
    assert refused.value.code == 2 and "--data-dir" in err and "UTF-8" in err, err
    assert not os.path.lexists(given)


@pytest.mark.parametrize("flags", [["--by-duration", "P99999999999D"], ["--to-timestamp", str(10**23)]],
                         ids=["by-duration", "to-timestamp"])
def test_reset_offsets_to_a_time_no_record_can_carry_is_a_usage_error(flags, capsys):
    """`groups reset-offsets g --topic t --by-duration P99999999999D` asked the leader for
    "timestamp -8639998203451851892" (INVALID_REQUEST), and `--to-timestamp 10**23` failed with
    "ListOffsetsRequest cannot be sent", once the cluster was found; `--to-datetime 0001-01-01`
    was already a usage error ("before 1970")."""
    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), ["groups", "reset-offsets", "g", "--topic", "t", *flags])

    err = capsys.readouterr().err
    assert refused.value.code == 2 and flags[0] in err, err


@pytest.mark.parametrize("flags", [["create", "t", "-p"], ["create", "t", "-r"],
                                   ["create", "t", "--min-insync"], ["add-partitions", "t", "-n"],
                                   ["add-partitions", "t", "--total"]],
                         ids=lambda flags: flags[-1])
def test_topic_counts_no_cluster_could_hold_are_usage_errors(flags, capsys):
    """`topics create t -p 99999999999999999999999` (or -r, --min-insync, add-partitions -n or
    --total) ended, once the cluster was found, in "INVALID_REQUEST: CreateTopicRequest cannot be
    sent: can't serialize ints < -2**63 or > 2**64 - 1"."""
    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), ["topics", *flags, str(10**23)])

    err = capsys.readouterr().err
    assert refused.value.code == 2 and flags[-1] in err and "at most" in err, err
