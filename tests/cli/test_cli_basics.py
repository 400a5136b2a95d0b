"""The command line's shared rules, without a cluster: no abbreviations, help on every flag,
addresses as Kafka users write them, options in any order, offsets and times as kcat and rpk
write them, record formats, tables that fit 80 columns, the version, and the one-line
explanation of a script that starts a cluster without a main guard."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from rich.console import Console

import railmq
from railmq import cli
from railmq.cli_common import endpoint
from railmq.cli_data import split_record
from railmq.cli_format import compile_format
from railmq.cli_offsets import (
    StartSpec, check_in_log, parse_duration_ms, parse_start, parse_time_ms, resolve_start,
)
from railmq.cli_tables import Column, fit_table
from railmq.records import ConsumerRecord

REPOSITORY = Path(__file__).resolve().parents[2]
NOW_MS = 1_700_000_000_000


def _leaf_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subparsers = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not subparsers:
        yield path, parser
    for action in subparsers:
        for name, child in action.choices.items():
            yield from _leaf_parsers(child, path + (name,))


LEAF_PARSERS = dict(_leaf_parsers(cli.build_parser()))


def test_every_command_refuses_abbreviations():
    assert len(LEAF_PARSERS) > 25
    for path, parser in LEAF_PARSERS.items():
        assert parser.allow_abbrev is False, path


@pytest.mark.parametrize("path", list(LEAF_PARSERS), ids=" ".join)
def test_every_flag_has_help(path):
    for action in LEAF_PARSERS[path]._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            assert action.help and action.help != argparse.SUPPRESS, (path, action.option_strings)


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["topics", "create", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 3)" in text and "min(3, the cluster's nodes)" in text


def test_an_abbreviated_flag_is_refused_with_the_commands_own_usage(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["topics", "create", "orders", "--partition", "3"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --partition" in err and err.startswith("usage: railmq topics create")


def test_the_version_agrees_with_the_package_and_prints_with_both_spellings(capsys):
    declared = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]["version"]
    assert railmq.__version__ == declared
    for flag in ("--version", "-V"):
        with pytest.raises(SystemExit) as exited:
            cli.main([flag])
        assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"railmq {declared}"
    assert cli.main(["version"]) == 0 and capsys.readouterr().out.strip() == f"railmq {declared}"


@pytest.mark.parametrize("given, expected", [
    ("127.0.0.1:7411", "tcp://127.0.0.1:7411"), ("localhost:7411", "tcp://127.0.0.1:7411"),
    ("tcp://localhost:9", "tcp://127.0.0.1:9"), ("tcp://10.1.2.3:7411", "tcp://10.1.2.3:7411"),
    ("broker-1.example:7411", "tcp://broker-1.example:7411"), ("ipc:///tmp/railmq", "ipc:///tmp/railmq"),
    ("h1:1, localhost:2", "tcp://h1:1,tcp://127.0.0.1:2"),  # the voters of a controller quorum
])
def test_addresses_are_taken_as_kafka_users_write_them(given, expected):
    assert endpoint(given) == expected


@pytest.mark.parametrize("given", ["localhost", "a:b", "x:70000", "h1:1,h2", "tcp://:7411", "h1:1,,h2:2", "h1:1,"])
def test_a_malformed_address_is_refused(given):
    with pytest.raises(argparse.ArgumentTypeError, match="is not an endpoint|empty address"):
        endpoint(given)


@pytest.mark.parametrize("flag", ["-b", "--bootstrap", "--bootstrap-server", "--brokers"])
def test_every_spelling_of_the_address_flag_sets_the_bootstrap(flag):
    args = cli.parse(cli.build_parser(), ["topics", "list", flag, "localhost:7000"])
    assert args.bootstrap == "tcp://127.0.0.1:7000"


def test_options_may_come_before_between_or_after_the_values():
    parser = cli.build_parser()
    args = cli.parse(parser, ["produce", "orders", "one", "--key", "alice", "paid 10", "-H", "a=b", "three"])
    assert (args.topic, args.values, args.key, args.header) == ("orders", ["one", "paid 10", "three"], "alice",
                                                                [("a", "b")])
    args = cli.parse(parser, ["produce", "--key", "alice", "orders", "paid 10"])
    assert (args.topic, args.values) == ("orders", ["paid 10"])


def test_after_a_double_dash_every_word_is_a_value_even_one_with_a_dash():
    args = cli.parse(cli.build_parser(), ["produce", "orders", "-k", "a", "--", "--not-a-flag", "-5"])
    assert (args.key, args.values) == ("a", ["--not-a-flag", "-5"])


def test_a_word_left_over_is_an_error_for_a_command_that_takes_no_values(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["topics", "describe", "orders", "extra"])
    assert exited.value.code == 2 and "unrecognized arguments: extra" in capsys.readouterr().err


@pytest.mark.parametrize("text, expected", [
    ("beginning", StartSpec("earliest")), ("start", StartSpec("earliest")), ("end", StartSpec("latest")),
    ("42", StartSpec("offset", 42)), ("-5", StartSpec("from-end", 5)), ("+3", StartSpec("from-start", 3)),
    ("@1700000000000", StartSpec("time", 1_700_000_000_000)),
    ("@-10m", StartSpec("time", NOW_MS - 600_000)),
    ("@2023-11-14T22:13:20Z", StartSpec("time", 1_700_000_000_000)),
])
def test_start_offsets_read_as_kcat_and_rpk_write_them(text, expected):
    assert parse_start(text, NOW_MS) == expected


def test_relative_starts_stay_inside_the_log_and_absolute_ones_are_checked():
    assert resolve_start(StartSpec("from-end", 5), earliest=10, latest=12) == 10
    assert resolve_start(StartSpec("from-end", 1), earliest=0, latest=12) == 11
    assert resolve_start(StartSpec("from-start", 50), earliest=0, latest=12) == 12
    assert resolve_start(StartSpec("time", 0), earliest=0, latest=12, at_time=None) == 12
    check_in_log("t/0", 12, 0, 12)  # the end itself: wait for the next record
    with pytest.raises(ValueError, match=r"t/0 holds offsets 0\.\.11 \(next offset 12\); offset 99 is past its end"):
        check_in_log("t/0", 99, 0, 12)
    with pytest.raises(ValueError, match="before its first offset"):
        check_in_log("t/0", 3, 5, 12)
    with pytest.raises(ValueError, match="not a start offset"):
        parse_start("soon", NOW_MS)


def test_durations_and_times_in_the_forms_people_type():
    assert [parse_duration_ms(text) for text in ("500ms", "30s", "10m", "1h30m", "2d", "PT15M", "P1DT2H")] == [
        500, 30_000, 600_000, 5_400_000, 172_800_000, 900_000, 93_600_000]
    for bad in ("10", "soon", "PT", "0s"):
        with pytest.raises(ValueError):
            parse_duration_ms(bad)
    assert parse_time_ms("1700000000000", NOW_MS) == 1_700_000_000_000
    assert parse_time_ms("-1h", NOW_MS) == NOW_MS - 3_600_000
    with pytest.raises(ValueError, match="is not a time"):
        parse_time_ms("yesterday", NOW_MS)


def test_format_strings_render_every_token_and_refuse_unknown_ones():
    record = ConsumerRecord(timestamp_ms=99, key=b"alice", value=b"paid 10", headers=[("trace", b"x1")],
                            topic="orders", partition=2, offset=7)
    render = compile_format("%t/%p@%o %k=%s (%K,%S) %T [%h] %H %v %V 100%%\\n")
    assert render(record) == "orders/2@7 alice=paid 10 (5,7) 99 [trace=x1] 1 paid 10 7 100%\n"
    tombstone = ConsumerRecord(timestamp_ms=1, key=None, value=None, topic="t", partition=0, offset=0)
    assert compile_format("[%k][%s] %S\\t.")(tombstone) == "[][] -1\t."
    with pytest.raises(ValueError, match="unknown format token %q"):
        compile_format("%q")


def test_produce_splits_keys_at_the_separator_and_sends_empty_values_as_null_with_tombstones():
    assert split_record("alice:paid 10", None, ":", False) == ("alice", "paid 10")
    assert split_record("a:b:c", None, ":", False) == ("a", "b:c")
    assert split_record("no separator", None, ":", False) == (None, "no separator")
    assert split_record("alice:", None, ":", True) == ("alice", None)
    assert split_record("", "k", None, False) == ("k", "")


def test_tables_drop_optional_columns_to_fit_and_say_which():
    columns = [Column("name"), Column("count", "right"), Column("detail", optional=True),
               Column("more", optional=True)]
    rows = [["orders", "3", "x" * 40, "y" * 30]]
    table, dropped = fit_table(columns, rows, width=80)
    assert dropped == ["more"] and [column.header for column in table.columns] == ["name", "count", "detail"]
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    console.print(table)
    assert max(len(line) for line in console.export_text().splitlines()) <= 80
    wide, none_dropped = fit_table(columns, rows, width=200)
    assert none_dropped == [] and len(wide.columns) == 4


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_a_script_without_a_main_guard_runs_because_actors_never_run_the_script_again(tmp_path):
    # multiprocessing's forkserver children import the main script again by default: a script
    # that starts a cluster at import would start one from every actor (transport/forkserver_ready.py).
    script = tmp_path / "unguarded.py"
    script.write_text("from railmq.admin import Admin\nfrom railmq.cluster import LocalCluster\n"
                      "with LocalCluster(nodes=1) as cluster, Admin(cluster.bootstrap) as admin:\n"
                      "    admin.create_topic('t', partitions=2, replication_factor=1)\n"
                      "    print('led', len(admin.wait_for_leaders('t').partitions))\n")
    finished = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                              timeout=60, env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.splitlines() == ["led 2"]


def test_the_node_commands_of_docs_deploy_md_are_valid_command_lines():
    """Every `railmq node ...` in docs/deploy.md (shell lines, the systemd unit, the compose file)
    parses with today's parser: the deployment guide cannot drift from the flags."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    lines = re.findall(r"railmq node [^\n\"]+", text)
    assert len(lines) >= 6, lines
    for line in lines:
        args = cli.parse(cli.build_parser(), shlex.split(line)[1:])
        assert args.handler.__name__ == "run_node" and args.node >= 1, line


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf"])
def test_railmq_down_refuses_a_timeout_that_is_not_a_positive_finite_number(value, capsys):
    with pytest.raises(SystemExit) as refused:
        cli.main(["down", "--timeout", value, "--data-dir", "/nonexistent"])

    assert refused.value.code == 2 and "--timeout" in capsys.readouterr().err


def test_railmq_up_refuses_more_nodes_than_a_cluster_may_have(capsys):
    """65,536 nodes on one machine were taken, said "railmq is up", and no create was answered
    in 336 s: every node's registration is a metadata write and every heartbeat names them all."""
    from actors.limits import NODES_MAX

    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), ["up", "--nodes", str(NODES_MAX + 1)])

    err = capsys.readouterr().err
    assert refused.value.code == 2 and "--nodes" in err and f"at most {NODES_MAX}" in err


def test_a_local_cluster_of_more_nodes_than_the_bound_is_refused_before_anything_starts(tmp_path):
    from actors.limits import NODES_MAX
    from railmq.cluster import LocalCluster

    with pytest.raises(ValueError, match=f"at most {NODES_MAX}"):
        LocalCluster(nodes=NODES_MAX + 1, data_dir=str(tmp_path))
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("node", [str(2**31), str(10**23)])
def test_railmq_node_refuses_a_node_id_past_kafkas_int32(node, capsys):
    """A node id of 10**23 was taken and crashed the node with an OverflowError traceback when its
    first process's specification was encoded."""
    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(),
                  ["node", "--node", node, "--voters", f"{node}=127.0.0.1", "--data-dir", "/x"])

    assert refused.value.code == 2 and "--node" in capsys.readouterr().err


def test_voters_past_the_id_range_or_the_node_bound_are_refused_naming_why():
    from actors.limits import NODE_ID_MAX, NODES_MAX
    from railmq.node import NodeConfigError, parse_voters

    with pytest.raises(NodeConfigError, match="node id"):
        parse_voters(f"{NODE_ID_MAX + 1}=10.0.0.1")
    with pytest.raises(NodeConfigError, match=f"at most {NODES_MAX}"):
        parse_voters(",".join(f"{node}=10.0.0.{node % 250}" for node in range(1, NODES_MAX + 2)))
    assert parse_voters(f"1=10.0.0.1,{NODE_ID_MAX}=10.0.0.2") == {1: "10.0.0.1", NODE_ID_MAX: "10.0.0.2"}


WAIT_FLAGS = [("topics", "list", "--request-timeout-ms"), ("consume", "t", "--timeout-ms"),
              ("consume", "t", "-g", "g", "--session-timeout-ms"),
              ("consume", "t", "-g", "g", "--retry-backoff-ms"),
              ("groups", "describe", "g", "--sample-ms"), ("cluster", "health", "--timeout-ms")]


@pytest.mark.parametrize("flag", WAIT_FLAGS, ids=lambda flag: " ".join(flag))
@pytest.mark.parametrize("value", [str(2**31), str(2**63 - 1), str(10**23)])
def test_a_wait_longer_than_kafkas_int_timeouts_is_refused_with_the_flags_name(flag, value, capsys):
    """`--request-timeout-ms 9223372036854775807` ended in an OverflowError traceback from the
    poll it was handed, and `groups describe --sample-ms` of the same in one from a sleep."""
    from railmq.cli_common import MILLISECONDS_MAX

    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), [*flag, value])

    assert refused.value.code == 2 and flag[-1] in capsys.readouterr().err
    assert cli.parse(cli.build_parser(), [*flag, str(MILLISECONDS_MAX)]) is not None


@pytest.mark.parametrize("text", ["@9223372036854775808", "@99999999999999999999999", "@-99999999999999999m",
                                  "@-9223372036854775807m", "@1969-12-31", "@0001-01-01T00:00:00+14:00",
                                  "@²"])
def test_a_start_time_no_record_can_carry_is_refused_before_anything_is_asked(text, capsys):
    """`consume -o @9223372036854775808` (or -N minutes reaching before 1970) was taken, and the
    consumer's lookup raised a ValueError traceback; a date in year 1 east of UTC, an OverflowError."""
    code = cli.main(["consume", "t", "-o", text, "-b", "127.0.0.1:1", "--request-timeout-ms", "100"])

    err = capsys.readouterr().err
    assert code == 2 and "a time" in err and "Traceback" not in err, err


@pytest.mark.parametrize("flags", [["--peak", str(2**63 - 1)], ["--peak", "1e308"], ["--keys", str(10**12)],
                                   ["--message-bytes", "1e308", "--retention-days", "1e308"],
                                   ["--partitions-to", str(10**12)]])
def test_size_refuses_inputs_past_what_it_can_count_instead_of_running_out_of_memory(flags, capsys):
    """`railmq size --peak 9223372036854775807` asked for a list of 3.7 * 10**15 partitions
    (MemoryError); --peak 1e308 overflowed a float (OverflowError)."""
    code = cli.main(["size", "--simulate-messages", "0", *flags])

    err = capsys.readouterr().err
    assert code == 2 and ("at most" in err or "past any number" in err), err


@pytest.mark.parametrize("argv", [["up", "--data-dir", ""], ["down", "--data-dir", " "],
                                  ["node", "--node", "1", "--voters", "1=127.0.0.1", "--data-dir", ""]])
def test_an_empty_data_directory_is_refused_not_taken_for_the_working_one(argv, capsys):
    """`railmq up --detach --data-dir ""` started a cluster in the working directory and said
    to stop it with `railmq down --data-dir ` (an empty word)."""
    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), argv)

    assert refused.value.code == 2 and "--data-dir" in capsys.readouterr().err


def test_an_unknown_simulator_variant_is_a_usage_error(capsys):
    """`railmq sim --variant bogus` ended in a ValueError traceback from inside the sweep."""
    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), ["sim", "--variant", "bogus"])

    err = capsys.readouterr().err
    assert refused.value.code == 2 and "--variant" in err and "ack-before-replication" in err, err


@pytest.mark.parametrize("value", ["1", "200"])
def test_a_raft_entry_smaller_than_the_simulated_clusters_records_is_a_usage_error(value, capsys):
    """`railmq sim --controllers 3 --entry-bytes-max 200` ran and reported seed 1 FAILED, "no
    coordinator is running after the recovery window": a partition's record of ~210 bytes goes
    whole into one entry, so none committed, and the run looked like a bug found."""
    with pytest.raises(SystemExit) as refused:
        cli.parse(cli.build_parser(), ["sim", "--controllers", "3", "--entry-bytes-max", value])

    err = capsys.readouterr().err
    assert refused.value.code == 2 and "--entry-bytes-max" in err and "256" in err, err
    for taken in ("0", "256", "300"):
        parsed = cli.parse(cli.build_parser(), ["sim", "--entry-bytes-max", taken])
        assert parsed.entry_bytes_max == int(taken)


@pytest.mark.timeout(30)
def test_railmq_node_whose_identity_source_lacks_the_clusters_files_says_so_in_one_line(tmp_path, capsys):
    """`railmq node --identity-from DIR` with no cluster.meta in DIR ended in a NodeConfigError
    traceback from the node's start; the same check made before the start printed one line."""
    code = cli.main(["node", "--node", "1", "--voters", "1=127.0.0.1", "--port", "1",
                     "--data-dir", str(tmp_path / "data"), "--identity-from", str(tmp_path)])

    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and "has no cluster.meta" in err, err
    assert not os.path.exists(tmp_path / "data" / "cluster.meta")
