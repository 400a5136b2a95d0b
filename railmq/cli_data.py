"""`railmq produce`: records in from arguments, a file or stdin lines; `consume` is cli_consume.py.

`produce TOPIC [VALUE...]` sends the values given (options may come before or after them), or one
record per line of `--file PATH` or stdin, and prints where each landed. Flags follow kcat and rpk:
`-k KEY`, `-K SEP` (each line is `key SEP value`), `-p P`, `-H name=value`, `-Z` (an empty value is
a tombstone: null). Values, keys and header values are sent as the bytes given: a word or a line
that is not UTF-8 is carried as surrogate escapes (os.fsdecode) and encoded back. Sends go out in
windows of `PRODUCE_WINDOW_RECORDS` so a long pipe never buffers without bound and its
acknowledgements are printed in input order as they arrive.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Iterable, Iterator

from actors.errors import ErrorCode, RailmqError
from railmq import cli_consume
from railmq.cli_common import (
    EXIT_OK, UsageError, add_cluster_arguments, encode_field, key_value, non_negative_int,
)
from railmq.producer import Producer, RecordMetadata

# Records sent before waiting for their acknowledgements: bounds memory on an endless stdin.
PRODUCE_WINDOW_RECORDS = 1000
ACKS = {"0": 0, "1": 1, "all": "all"}

Record = tuple[str | None, str | None]  # (key, value); None is null


def register(commands: argparse._SubParsersAction) -> None:
    _add_produce(commands)
    cli_consume.register(commands)


def _add_produce(commands: argparse._SubParsersAction) -> None:
    produce = commands.add_parser(
        "produce", help="send records (arguments, a file, or one per stdin line)",
        description="Send records to TOPIC: the VALUEs given, else one record per line of --file or stdin. "
                    "Prints the partition and offset of each acknowledged record.")
    produce.add_argument("topic", metavar="TOPIC", help="the topic to send to")
    produce.add_argument("values", nargs="*", metavar="VALUE",
                         help="values to send; none: one record per line of --file or stdin")
    produce.add_argument("-k", "--key", help="the key of every record (same key, same partition, same order)")
    produce.add_argument("-K", "--key-separator", metavar="SEP",
                         help="split each value at the first SEP into key and value (kcat's -K); "
                              "a value without SEP is sent without a key")
    produce.add_argument("-p", "--partition", type=non_negative_int, metavar="P",
                         help="send to this partition (default: by key, or spread when keyless)")
    produce.add_argument("-H", "--header", type=key_value, action="append", default=[], metavar="NAME=VALUE",
                         help="a header on every record, repeatable")
    produce.add_argument("--file", metavar="PATH", help="read one record per line from PATH ('-': stdin)")
    produce.add_argument("-Z", "--tombstone", action="store_true",
                         help="send an empty value as null (a tombstone), as kcat's and rpk's -Z do")
    produce.add_argument("--acks", choices=sorted(ACKS), default="all",
                         help="replicas that must have a record before it is acknowledged: 0, 1 or all")
    output = produce.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="one JSON object per acknowledged record")
    output.add_argument("-q", "--quiet", action="store_true", help="print nothing for acknowledged records")
    add_cluster_arguments(produce)
    produce.set_defaults(handler=run_produce, takes_extra_values=True, precheck=check_produce_usage, parser=produce)


def _lines(stream: IO[str], source: str, record_bytes_max: int) -> Iterator[str]:
    """Each line without its end, read a bounded amount at a time: a line longer than any record
    the producer sends is refused where it starts (`--file /dev/zero` was one endless line, read
    until memory ran out). A character here is at least a byte, so the bound in characters holds."""
    number = 0
    while line := stream.readline(record_bytes_max + 2):  # room for its \r\n
        number += 1
        if len(line) == record_bytes_max + 2 and not line.endswith("\n"):
            raise RailmqError(ErrorCode.MESSAGE_TOO_LARGE,
                              f"line {number} of {source} is longer than {record_bytes_max} bytes, more than "
                              f"a record may hold (batch_bytes_max); stopped there")
        yield line.rstrip("\r\n")


def _values(args: argparse.Namespace, record_bytes_max: int) -> Iterator[str]:
    if args.values:
        yield from args.values
    elif args.file and args.file != "-":
        with open(args.file, encoding="utf-8", errors="surrogateescape") as handle:
            yield from _lines(handle, args.file, record_bytes_max)
    else:
        if hasattr(sys.stdin, "reconfigure"):
            sys.stdin.reconfigure(errors="surrogateescape")
        yield from _lines(sys.stdin, "stdin", record_bytes_max)


def record_bytes(text: str | None) -> bytes | None:
    """The bytes a word of the command line or a line of input was: a record is bytes, and a word
    that is not UTF-8 arrives as surrogate escapes (a strict encode raised UnicodeEncodeError)."""
    return None if text is None else text.encode("utf-8", "surrogateescape")


def split_record(text: str, key: str | None, separator: str | None, tombstone: bool) -> Record:
    """The (key, value) one input line or argument stands for."""
    if separator:
        found_key, found, value = text.partition(separator)
        key, text = (found_key, value) if found else (None, text)
    return key, (None if tombstone and text == "" else text)


def _windows(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    window: list[Record] = []
    for record in records:
        window.append(record)
        if len(window) >= size:
            yield window
            window = []
    if window:
        yield window


def ack_to_dict(topic: str, sent: RecordMetadata, key: str | None) -> dict:
    out = {"topic": topic, "partition": sent.partition, "offset": None if sent.offset < 0 else sent.offset,
           "timestamp": sent.timestamp_ms}
    encode_field(record_bytes(key), "key", out)  # base64 when the key is not UTF-8, as consume prints it
    return out


def check_produce_usage(args: argparse.Namespace) -> None:
    if args.key is not None and args.key_separator:
        raise UsageError(args.parser, "-k/--key gives every record one key, -K/--key-separator reads a key "
                                      "from each value: use one")
    if args.values and args.file:
        raise UsageError(args.parser, "values come from the arguments or from --file, not both")
    for name, _ in args.header:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(args.parser, f"-H/--header names are UTF-8 text (Kafka's header keys are "
                                          f"strings), got {name!r}") from None


def run_produce(args: argparse.Namespace) -> int:
    check_produce_usage(args)
    headers = [(name, record_bytes(value)) for name, value in args.header] or None
    with Producer(args.bootstrap, acks=ACKS[args.acks], max_block_ms=args.request_timeout_ms,
                  request_timeout_ms=args.request_timeout_ms, client_id="railmq-cli") as producer:
        records = (split_record(text, args.key, args.key_separator, args.tombstone)
                   for text in _values(args, producer.batch_bytes_max))
        for window in _windows(records, PRODUCE_WINDOW_RECORDS):
            _send_window(args, producer, window, headers)
    return EXIT_OK


def _send_window(args: argparse.Namespace, producer: Producer, window: list[Record],
                 headers: list[tuple[str, bytes]] | None) -> None:
    try:
        futures = [producer.send(args.topic, record_bytes(value), key=record_bytes(key), headers=headers,
                                 partition=args.partition)
                   for key, value in window]
        producer.flush(args.request_timeout_ms / 1000 * 3)
        acks = [future.result(0) for future in futures]
    except (RailmqError, TimeoutError) as error:
        raise _in_flag_terms(error, args.request_timeout_ms) from None
    if not args.quiet:
        lines = []
        for (key, _), sent in zip(window, acks):
            if args.json:
                lines.append(json.dumps(ack_to_dict(args.topic, sent, key), ensure_ascii=False))
            else:
                lines.append(f"partition {sent.partition} offset {'-' if sent.offset < 0 else sent.offset}")
        sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


def _in_flag_terms(error: Exception, timeout_ms: int) -> Exception:
    """The producer speaks of its own settings (max_block_ms); the user set --request-timeout-ms."""
    if isinstance(error, TimeoutError):
        return RailmqError(ErrorCode.REQUEST_TIMED_OUT, f"records were not acknowledged within "
                                                        f"{timeout_ms * 3} ms; see `railmq topics describe` "
                                                        "for partitions without a leader")
    if isinstance(error, RailmqError) and error.code == ErrorCode.REQUEST_TIMED_OUT:
        sentence = str(error).removeprefix(f"{error.name}: ")
        return RailmqError(error.code, sentence.replace("max_block_ms", f"--request-timeout-ms ({timeout_ms} ms)"))
    return error


