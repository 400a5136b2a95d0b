"""What every `railmq` command shares: exit codes, the cluster flags, error lines, record rendering.

The cluster flags are `-b/--bootstrap` (also spelt `--bootstrap-server`, as Kafka's tools do, and
`--brokers`, as rpk does; default from `RAILMQ_BOOTSTRAP`, else the address `railmq up` listens on
by default) and `--request-timeout-ms` (how long one request may wait for an answer). An address
is `host:port`, `tcp://host:port` or `ipc://path`; `localhost` means 127.0.0.1, where `railmq up`
listens. Whether anything answers there is checked once before a command runs
(railmq/cli_connect.py), so a missing cluster is reported in about a second, not after a timeout.

Record rendering is one pure function per format, so `consume` and a group member print the same
lines: `record_to_json` (one JSON object, bytes as UTF-8 text or base64 with an `*_encoding`
field) and `record_to_line` (a compact human line). A record is whatever its producer wrote, so
neither lets a terminal control through, wherever it is printed: the human line shows each as its
escape (`\\x1b`, and `\\n`: one record, one line), the JSON as a `\\u` escape of the same text
(railmq/terminal_text.py). `--json` and `-f` give the exact bytes to programs.

This module is a leaf (it imports only `railmq.records` and `railmq.terminal_text`), so
`railmq.member_process`, which the chaos harness and tests import, can use it without importing
the command line itself.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import re
import sys
from typing import Any

from railmq.records import ConsumerRecord
from railmq.terminal_text import json_visible, visible

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

DEFAULT_PORT = 7411
DEFAULT_BOOTSTRAP = f"tcp://127.0.0.1:{DEFAULT_PORT}"
BOOTSTRAP_ENVIRONMENT = "RAILMQ_BOOTSTRAP"
REQUEST_TIMEOUT_DEFAULT_MS = 10_000
# The longest wait a flag of the command line takes, about 24.8 days: Kafka's timeouts are Java
# ints too. Far longer ones overflowed the C long a poll or a sleep is given (a traceback).
MILLISECONDS_MAX = 2**31 - 1
# A human line shows at most this many characters of a value; --json shows everything.
LINE_VALUE_CHARS_MAX = 200

_HOST_PORT = re.compile(r"^(?:tcp://)?(?P<host>[A-Za-z0-9.\-]+):(?P<port>\d{1,5})$")


class UsageError(Exception):
    """A bad combination of flags found after parsing: reported like argparse's own errors (exit 2)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


def print_error(name: str, sentence: str) -> None:
    """The sentence is whoever answered's (a port a leader had may be anyone's) or a handler's,
    which may quote a record: its controls are shown as escapes (railmq/terminal_text.py)."""
    shown = visible(sentence, keep="\n\t")
    print(f"error: {name}: {shown}", file=sys.stderr)


# --------------------------------------------------------------------------- argument types


def endpoint(text: str) -> str:
    """`host:port`, `tcp://host:port` or `ipc://path` as the ZeroMQ endpoint clients connect to;
    several, separated by commas, name the voters of a controller quorum (any one is enough: the
    others are learned from its answers)."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) > 1:
        if not all(parts):
            raise argparse.ArgumentTypeError(f"{text!r} has an empty address between its commas")
        return ",".join(endpoint(part) for part in parts)
    text = text.strip()
    if text.startswith("ipc://") and len(text) > len("ipc://"):
        return text
    match = _HOST_PORT.match(text)
    if match is None or not 0 < int(match.group("port")) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an endpoint like 127.0.0.1:{DEFAULT_PORT} or tcp://127.0.0.1:{DEFAULT_PORT}")
    try:
        match.group("host").encode("idna")  # the resolver's own rule: `...` was a UnicodeError traceback
    except UnicodeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} names no host: a label of its name is empty or longer than 63 characters") from None
    host = "127.0.0.1" if match.group("host") == "localhost" else match.group("host")
    return f"tcp://{host}:{int(match.group('port'))}"


def clients_default_bootstrap() -> str:
    """The address a client command uses when given none ($RAILMQ_BOOTSTRAP, else 127.0.0.1:7411)."""
    try:
        return endpoint(os.environ.get(BOOTSTRAP_ENVIRONMENT) or f"127.0.0.1:{DEFAULT_PORT}")
    except argparse.ArgumentTypeError:
        return DEFAULT_BOOTSTRAP


def default_port() -> int:
    """Where `railmq up` listens by default: where clients will look ($RAILMQ_BOOTSTRAP's port when
    it names 127.0.0.1), else 7411."""
    host, _, port = clients_default_bootstrap().removeprefix("tcp://").rpartition(":")
    return int(port) if host == "127.0.0.1" else DEFAULT_PORT


def positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be positive and finite, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text!r}")
    return value


def directory(text: str) -> str:
    """A directory's path, not empty: `--data-dir ""` ran a cluster in the working directory and
    told the user to stop it with `railmq down --data-dir ` (an empty word)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: name a directory ('.' for this one)")
    try:
        text.encode("utf-8")  # every process is handed the path as text in its start specification
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{visible(text)!r} is not UTF-8: rename the directory") from None
    # A file there, or on the way there, made `up` report a damaged state file it could not
    # remove, then `OS_ERROR: File exists`.
    existing = os.path.abspath(text)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise argparse.ArgumentTypeError(f"{text!r}: {existing} is not a directory")
    return text


def milliseconds(text: str) -> int:
    """A positive wait in ms, at most `MILLISECONDS_MAX`."""
    return _at_most_milliseconds_max(positive_int(text), text)


def milliseconds_or_zero(text: str) -> int:
    """A wait in ms that may be 0 (none), at most `MILLISECONDS_MAX`."""
    return _at_most_milliseconds_max(non_negative_int(text), text)


def seconds(text: str) -> float:
    """A positive wait in seconds, at most `MILLISECONDS_MAX` ms: `down --timeout 1e308` ended in
    an OverflowError from the wait (a poll takes a C int of ms)."""
    value = positive_float(text)
    if value * 1000 > MILLISECONDS_MAX:
        raise argparse.ArgumentTypeError(
            f"must be at most {MILLISECONDS_MAX // 1000} s (24.8 days), got {text!r}")
    return value


def _at_most_milliseconds_max(value: int, text: str) -> int:
    if value > MILLISECONDS_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {MILLISECONDS_MAX} ms (24.8 days), got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def key_value(text: str) -> tuple[str, str]:
    name, separator, value = text.partition("=")
    if not separator or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not of the form key=value")
    return name, value


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument(
        "-b", "--bootstrap", "--bootstrap-server", "--brokers", dest="bootstrap", type=endpoint,
        default=os.environ.get(BOOTSTRAP_ENVIRONMENT) or DEFAULT_BOOTSTRAP, metavar="HOST:PORT",
        help=f"the cluster's controller address, or several separated by commas (default: "
             f"${BOOTSTRAP_ENVIRONMENT}, else 127.0.0.1:{DEFAULT_PORT}, where `railmq up` listens)")
    # argparse passes a string default through `type` too, so a bad RAILMQ_BOOTSTRAP exits 2.
    cluster.add_argument(
        "--request-timeout-ms", type=milliseconds, default=REQUEST_TIMEOUT_DEFAULT_MS, metavar="MS",
        help=f"how long one request waits for an answer (default {REQUEST_TIMEOUT_DEFAULT_MS})")
    parser.set_defaults(needs_cluster=True)


# --------------------------------------------------------------------------- records


def encode_field(data: bytes | None, field: str, into: dict[str, Any]) -> None:
    """`into[field]` is `data` as UTF-8 text, or as base64 with `into[field + '_encoding']`."""
    if data is None:
        into[field] = None
        return
    try:
        into[field] = data.decode("utf-8")
    except UnicodeDecodeError:
        into[field] = base64.b64encode(data).decode("ascii")
        into[f"{field}_encoding"] = "base64"


def record_to_dict(record: ConsumerRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
    encode_field(record.key, "key", out)
    encode_field(record.value, "value", out)
    headers = []
    for name, data in record.headers or []:
        header: dict[str, Any] = {"key": name}
        encode_field(data, "value", header)
        headers.append(header)
    out["headers"] = headers
    out["timestamp"] = record.timestamp_ms
    return out


def record_to_json(record: ConsumerRecord) -> str:
    return json_visible(json.dumps(record_to_dict(record), ensure_ascii=False))


def _shown(data: bytes | None) -> str:
    if data is None:
        return "null"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(data)} bytes>"
    return visible(text if len(text) <= LINE_VALUE_CHARS_MAX else text[:LINE_VALUE_CHARS_MAX] + "…")


def record_to_line(record: ConsumerRecord) -> str:
    key = "" if record.key is None else f" key={_shown(record.key)}"
    headers = "".join(f" {visible(name)}={_shown(data)}" for name, data in record.headers or [])
    header_text = f" [{headers.strip()}]" if headers else ""
    return f"{record.topic}/{record.partition}@{record.offset}{key}{header_text} {_shown(record.value)}"


def render_record(record: ConsumerRecord, as_json: bool) -> str:
    return record_to_json(record) if as_json else record_to_line(record)
