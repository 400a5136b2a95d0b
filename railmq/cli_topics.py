"""`railmq topics create|list|describe|describe-config|add-partitions|delete`: topic administration.

This module parses, calls the admin client and renders; it decides nothing about topics itself
(the coordinator validates names, counts and configs and answers with typed errors). Topic
configs given as `-c key=value` (Kafka's dotted names such as `retention.ms` work too) are
converted to `TopicConfig` field types here, so a misspelt key or a non-number is a usage error
(exit 2) before anything is sent. Topic settings are fixed at creation; partitions can be added.

Defaults fit the cluster: 3 partitions, a replication factor of min(3, nodes), and min in-sync 2
when there are at least 3 replicas (so acks=all survives one replica down), else 1.

`describe` reads the leader's position from the `ReplicaInfo` the coordinator last heard from
each replica, so its high watermark and log end offset can trail the leader's by one heartbeat.
Its table is a list of `Column`s (`DESCRIBE_COLUMNS`) and one cell function per column, so a
column is added in one place; columns that do not fit the terminal are dropped, last first.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from actors.errors import ErrorCode, RailmqError
from actors.limits import NODES_MAX, PARTITIONS_PER_TOPIC_CEILING
from actors.messages import PartitionMetadata, ReplicaInfo, TopicConfig, TopicMetadata
from railmq.admin import Admin
from railmq.cli_common import EXIT_OK, UsageError, add_cluster_arguments, key_value, positive_int
from railmq.cli_tables import Column, print_table
from railmq.terminal_text import cell as escaped_cell

# Config keys settable with -c: every TopicConfig field except the one with its own flag.
CONFIG_KEYS = tuple(name for name in TopicConfig.__struct_fields__ if name != "min_insync_replicas")
_NONE_WORDS = frozenset({"none", "null", ""})
DEFAULT_PARTITIONS = 3
REPLICATION_FACTOR_MAX_DEFAULT = 3  # Kafka's usual production choice


def register(commands: argparse._SubParsersAction) -> None:
    topics = commands.add_parser("topics", help="create, list, describe, grow and delete topics",
                                 description="Topic administration.")
    actions = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    _add_create(actions)
    listing = actions.add_parser("list", help="every topic with its partition and replica counts")
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    add_cluster_arguments(listing)
    listing.set_defaults(handler=run_list)
    describe = actions.add_parser("describe", help="leaders, replicas, ISR and offsets per partition")
    describe.add_argument("name", metavar="NAME", help="the topic")
    describe.add_argument("--json", action="store_true", help="print every replica's details as JSON")
    add_cluster_arguments(describe)
    describe.set_defaults(handler=run_describe)
    settings = actions.add_parser("describe-config", help="every setting of a topic, and which are defaults")
    settings.add_argument("name", metavar="NAME", help="the topic")
    settings.add_argument("--json", action="store_true", help="print the settings as JSON")
    add_cluster_arguments(settings)
    settings.set_defaults(handler=run_describe_config)
    _add_partitions(actions)
    alter = actions.add_parser("alter-config", help="change a topic's retention, min in-sync or unclean election",
                               description="Change settings of a live topic (kafka-configs --alter, rpk topic "
                                           "alter-config). Segment sizes, flush policy and batch size are fixed "
                                           "at creation.")
    alter.add_argument("name", metavar="NAME", help="the topic")
    alter.add_argument("-s", "--set", dest="changes", type=key_value, action="append", required=True,
                       metavar="KEY=VALUE", help="a setting to change, repeatable; keys: retention_ms, "
                                                 "retention_bytes (none: no limit), min_insync_replicas, "
                                                 "unclean_leader_election (true/false); Kafka's dotted names work")
    alter.add_argument("--json", action="store_true", help="print the settings after the change as JSON")
    add_cluster_arguments(alter)
    alter.set_defaults(handler=run_alter_config, parser=alter)
    delete = actions.add_parser("delete", help="delete topics and their data")
    delete.add_argument("names", nargs="+", metavar="NAME", help="the topics")
    delete.add_argument("--if-exists", action="store_true", help="a topic that does not exist is not an error")
    add_cluster_arguments(delete)
    delete.set_defaults(handler=run_delete)


def partition_count(text: str) -> int:
    """Partitions of a topic: no configuration allows more than the ceiling every client checks."""
    return _at_most(positive_int(text), PARTITIONS_PER_TOPIC_CEILING, "partitions a topic may have", text)


def replica_count(text: str) -> int:
    """Copies of a partition: one per node at most."""
    return _at_most(positive_int(text), NODES_MAX, "nodes a cluster may have", text)


def _at_most(value: int, most: int, what: str, text: str) -> int:
    if value > most:  # was "cannot be sent: can't serialize ints" once the cluster was found
        raise argparse.ArgumentTypeError(f"must be at most {most:,}, the most {what}, got {text!r}")
    return value


def _add_create(actions: argparse._SubParsersAction) -> None:
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name", metavar="NAME", help="the topic's name")
    create.add_argument("-p", "--partitions", type=partition_count, default=DEFAULT_PARTITIONS, metavar="N",
                        help="how many partitions (the unit of parallelism and of ordering)")
    create.add_argument("-r", "--replication-factor", "--replicas", dest="replication_factor",
                        type=replica_count, metavar="N",
                        help="copies of each partition (default: min(3, the cluster's nodes))")
    create.add_argument("--min-insync", "--min-insync-replicas", dest="min_insync", type=replica_count,
                        metavar="N",
                        help="replicas that must have a record before acks=all acknowledges it "
                             "(default: 2 with 3 or more replicas, else 1)")
    create.add_argument("-c", "--config", "--topic-config", dest="config", type=key_value, action="append",
                        default=[], metavar="KEY=VALUE",
                        help=f"topic setting, repeatable; keys: {', '.join(CONFIG_KEYS)}")
    create.add_argument("--if-not-exists", action="store_true", help="a topic that exists already is not an error")
    _add_wait(create)
    add_cluster_arguments(create)
    create.set_defaults(handler=run_create, precheck=check_create_usage, parser=create)


def _add_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait-s", type=positive_int, default=None, metavar="S",
                        help="how long to wait for every partition to have a leader (default: 30 s, plus "
                             "0.2 s per replica process to start)")


def wait_bound_s(args: argparse.Namespace, partitions: int, replication: int) -> float:
    """Starting processes takes time on a busy machine: the wait grows with what must start."""
    return float(args.wait_s) if args.wait_s is not None else 30.0 + 0.2 * partitions * replication


def wait_with_progress(admin: Admin, name: str, timeout_s: float) -> None:
    """Wait for every partition's leader, showing how many have one (on a terminal)."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty())
    with progress:
        task = progress.add_task(f"{name}: partitions with a leader", total=None)
        admin.wait_for_leaders(name, timeout_s,
                               on_progress=lambda ready, total: progress.update(task, completed=ready, total=total))


def _add_partitions(actions: argparse._SubParsersAction) -> None:
    grow = actions.add_parser("add-partitions", help="give a topic more partitions (never fewer)",
                              description="Add partitions to a topic. Keys hash to partitions by count, "
                                          "so a key may land on a new partition afterwards.")
    grow.add_argument("name", metavar="NAME", help="the topic")
    count = grow.add_mutually_exclusive_group(required=True)
    count.add_argument("-n", "--num", type=partition_count, metavar="N",
                       help="add N partitions (rpk's --num)")
    count.add_argument("--total", type=partition_count, metavar="N",
                       help="grow to N partitions in all (kafka-topics --alter --partitions)")
    _add_wait(grow)
    add_cluster_arguments(grow)
    grow.set_defaults(handler=run_add_partitions)


def topic_config(pairs: list[tuple[str, str]], min_insync: int) -> TopicConfig:
    """A TopicConfig from `key=value` strings; ValueError names the bad key or value."""
    values: dict[str, Any] = {"min_insync_replicas": min_insync}
    for given, text in pairs:
        name = given.replace(".", "_").replace("-", "_")
        if name == "min_insync_replicas":
            raise ValueError("min in-sync replicas has its own flag: --min-insync N")
        if name not in CONFIG_KEYS:
            raise ValueError(f"unknown config key {given!r}; known keys: {', '.join(CONFIG_KEYS)}")
        values[name] = None if text.strip().lower() in _NONE_WORDS else text
    try:
        return msgspec.convert(values, TopicConfig, strict=False)
    except msgspec.ValidationError as error:
        raise ValueError(f"bad config value: {error}") from None


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(args.bootstrap, timeout_ms=args.request_timeout_ms)


def creation_defaults(nodes: int, replication_factor: int | None, min_insync: int | None) -> tuple[int, int]:
    """(replication factor, min in-sync) with the defaults filled in for a cluster of `nodes`."""
    replication = replication_factor or max(1, min(REPLICATION_FACTOR_MAX_DEFAULT, nodes))
    return replication, min_insync or (2 if replication >= 3 else 1)


def check_create_usage(args: argparse.Namespace) -> None:
    try:
        topic_config(args.config, args.min_insync or 1)
    except ValueError as error:
        raise UsageError(args.parser, str(error)) from None


def run_create(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        replication, min_insync = creation_defaults(len(admin.metadata([]).nodes), args.replication_factor,
                                                    args.min_insync)
        try:
            config = topic_config(args.config, min_insync)
        except ValueError as error:
            raise UsageError(args.parser, str(error)) from None
        try:
            admin.create_topic(args.name, partitions=args.partitions, replication_factor=replication,
                               config=config, wait=False)
        except RailmqError as error:
            if error.code != ErrorCode.TOPIC_ALREADY_EXISTS or not args.if_not_exists:
                raise
            print(f"topic {args.name} exists already")
            return EXIT_OK
        wait_with_progress(admin, args.name, wait_bound_s(args, args.partitions, replication))
    print(f"created topic {args.name}: {args.partitions} partition{'s' if args.partitions != 1 else ''}, "
          f"replication factor {replication}, min in-sync {min_insync}")
    return EXIT_OK


def _topic_row(topic: TopicMetadata) -> dict[str, Any]:
    partitions = topic.partitions
    return {
        "topic": topic.name, "partitions": len(partitions),
        "replication_factor": len(partitions[0].replicas) if partitions else 0,
        "min_insync_replicas": topic.config.min_insync_replicas,
        "under_replicated": sum(1 for p in partitions if len(p.isr) < len(p.replicas)),
        "offline": sum(1 for p in partitions if p.leader < 0 or not p.leader_endpoint),
    }


LIST_COLUMNS = [Column("topic"), Column("partitions", "right"), Column("replication", "right"),
                Column("min in-sync", "right"), Column("under-replicated", "right", optional=True),
                Column("offline", "right")]


def run_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        topics = admin.metadata().topics
    rows = [_topic_row(topic) for topic in topics]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    console = Console()
    if not rows:
        console.print("no topics (railmq topics create NAME makes one)")
        return EXIT_OK
    cells = [[escaped_cell(row["topic"]), str(row["partitions"]), str(row["replication_factor"]),
              str(row["min_insync_replicas"]), _warn(row["under_replicated"]), _warn(row["offline"])]
             for row in rows]
    print_table(console, LIST_COLUMNS, cells, title="topics")
    return EXIT_OK


def _warn(count: int) -> str:
    return f"[yellow]{count}[/]" if count else "0"


def run_describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        topic = admin.describe_topic(args.name)
    if args.json:
        print(json.dumps(describe_to_dict(topic), indent=2))
    else:
        config = topic.config
        console = Console()
        print_table(console, DESCRIBE_COLUMNS, [describe_cells(partition) for partition in topic.partitions],
                    title=f"topic {escaped_cell(topic.name)} (min in-sync {config.min_insync_replicas}, "
                          f"flush {escaped_cell(config.flush_policy)})")
        for line in storage_notes(topic):
            console.print(line, highlight=False, soft_wrap=True)
    return EXIT_OK


def storage_notes(topic: TopicMetadata) -> list[str]:
    """One line per partition that is offline (why) and per replica whose storage is not ok, as
    rich markup: the sentences are the answering process's, shown as escapes (`cell`)."""
    lines = []
    for partition in topic.partitions:
        if partition.offline_reason and (partition.leader < 0 or not partition.leader_endpoint):
            why = escaped_cell(partition.offline_reason)
            lines.append(f"partition {partition.partition} offline: {why}")
        for info in partition.replica_info:
            if info.storage.state != "ok":
                state, detail = escaped_cell(info.storage.state), escaped_cell(info.storage.detail)
                lines.append(f"partition {partition.partition} replica {info.node}: {state} ({detail})")
    return lines


def leader_info(partition: PartitionMetadata) -> ReplicaInfo | None:
    return next((info for info in partition.replica_info if info.node == partition.leader), None)


def describe_to_dict(topic: TopicMetadata) -> dict[str, Any]:
    return {
        "topic": topic.name,
        "topic_id": topic.topic_id,
        "config": config_settings(topic.config),
        "partitions": [_partition_to_dict(partition) for partition in topic.partitions],
    }


def config_settings(config: TopicConfig) -> dict[str, Any]:
    """Every setting, defaults included (msgspec would omit the defaults when encoding)."""
    return {name: getattr(config, name) for name in TopicConfig.__struct_fields__}


def _partition_to_dict(partition: PartitionMetadata) -> dict[str, Any]:
    leader = leader_info(partition)
    return {
        "partition": partition.partition,
        "leader": partition.leader,
        "leader_endpoint": partition.leader_endpoint,
        "leader_epoch": partition.leader_epoch,
        "partition_epoch": partition.partition_epoch,
        "isr": list(partition.isr),
        "eligible_leader_replicas": list(partition.eligible_leader_replicas),
        "offline_reason": partition.offline_reason,
        "high_watermark": leader.high_watermark if leader else None,
        "log_end_offset": leader.log_end_offset if leader else None,
        "replicas": [{
            "node": info.node, "pid": info.pid, "endpoint": info.endpoint, "alive": info.alive,
            "in_isr": info.node in partition.isr, "leader": info.node == partition.leader,
            "log_start_offset": info.log_start_offset, "log_end_offset": info.log_end_offset,
            "high_watermark": info.high_watermark,
            "storage": {"state": info.storage.state, "clean_shutdown": info.storage.clean_shutdown,
                        "damage": [list(item) for item in info.storage.damage], "detail": info.storage.detail},
        } for info in partition.replica_info],
    }


def _leader_cell(partition: PartitionMetadata) -> str:
    return str(partition.leader) if partition.leader >= 0 and partition.leader_endpoint else "[red]none[/]"


def _isr_cell(partition: PartitionMetadata) -> str:
    text = ",".join(map(str, partition.isr)) or "-"
    return f"[yellow]{text}[/]" if len(partition.isr) < len(partition.replicas) else text


def _storage_cell(partition: PartitionMetadata) -> str:
    """Every replica whose storage is not ok, as node:state; "ok" when all are."""
    bad = [f"{info.node}:{escaped_cell(info.storage.state)}" for info in partition.replica_info
           if info.storage.state != "ok"]
    return f"[yellow]{','.join(bad)}[/]" if bad else "ok"


def _leader_offset(field: str) -> Callable[[PartitionMetadata], str]:
    def cell(partition: PartitionMetadata) -> str:
        leader = leader_info(partition)
        return str(getattr(leader, field)) if leader else "-"
    return cell


# One (column, cell) pair per column of `topics describe`, in order; add a column here.
DESCRIBE_TABLE: list[tuple[Column, Callable[[PartitionMetadata], str]]] = [
    (Column("partition", "right"), lambda partition: str(partition.partition)),
    (Column("leader", "right"), _leader_cell),
    (Column("epoch", "right"), lambda partition: str(partition.leader_epoch)),
    (Column("replicas"), lambda partition: ",".join(map(str, partition.replicas))),
    (Column("isr"), _isr_cell),
    (Column("storage"), _storage_cell),
    (Column("high watermark", "right"), _leader_offset("high_watermark")),
    (Column("log end", "right", optional=True), _leader_offset("log_end_offset")),
    (Column("log start", "right", optional=True), _leader_offset("log_start_offset")),
]
DESCRIBE_COLUMNS = [column for column, _ in DESCRIBE_TABLE]


def describe_cells(partition: PartitionMetadata) -> list[str]:
    return [cell(partition) for _, cell in DESCRIBE_TABLE]


CONFIG_COLUMNS = [Column("setting"), Column("value", "right"), Column("source")]


def alter_changes(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """`key=value` strings as the typed changes AlterTopicConfigRequest takes; ValueError says which is bad."""
    changes: dict[str, Any] = {}
    for given, text in pairs:
        name = given.replace(".", "_").replace("-", "_")
        if name == "min_insync_replicas" or name == "retention_ms" or name == "retention_bytes":
            if name != "min_insync_replicas" and text.strip().lower() in _NONE_WORDS:
                changes[name] = None
                continue
            try:
                changes[name] = int(text)
            except ValueError:
                raise ValueError(f"{given}={text!r}: a whole number is needed") from None
        elif name == "unclean_leader_election":
            if text.strip().lower() not in ("true", "false"):
                raise ValueError(f"{given}={text!r}: true or false")
            changes[name] = text.strip().lower() == "true"
        else:
            raise ValueError(f"{given!r} cannot change after creation; these can: retention_ms, retention_bytes, "
                             "min_insync_replicas, unclean_leader_election")
    return changes


def run_alter_config(args: argparse.Namespace) -> int:
    try:
        changes = alter_changes(args.changes)
    except ValueError as error:
        raise UsageError(args.parser, str(error)) from None
    with _admin(args) as admin:
        config = admin.alter_topic_config(args.name, changes)
    if args.json:
        print(json.dumps(config_settings(config), indent=2))
    else:
        print(f"topic {args.name}: " + ", ".join(f"{name} = {getattr(config, name)}" for name in changes))
    return EXIT_OK


def run_describe_config(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        topic = admin.describe_topic(args.name)
    settings = config_settings(topic.config)
    defaults = config_settings(TopicConfig())
    if args.json:
        print(json.dumps({"topic": topic.name, "config": settings,
                          "defaults": sorted(name for name in settings if settings[name] == defaults[name])},
                         indent=2))
        return EXIT_OK
    rows = [[name, "none" if value is None else str(value),
             "default" if value == defaults[name] else "set at creation"] for name, value in settings.items()]
    print_table(Console(), CONFIG_COLUMNS, rows, title=f"settings of topic {topic.name} "
                                                        "(retention, min in-sync and unclean election may change)")
    return EXIT_OK


def run_add_partitions(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        current = len(admin.describe_topic(args.name).partitions)
        total = args.total if args.total is not None else current + args.num
        if total <= current:
            raise RailmqError(ErrorCode.INVALID_PARTITIONS,
                              f"{args.name} has {current} partitions already; partitions can only be added")
        admin.create_partitions(args.name, total, wait=False)
        replication = len(admin.describe_topic(args.name).partitions[0].replicas)
        wait_with_progress(admin, args.name, wait_bound_s(args, total - current, replication))
    print(f"topic {args.name} now has {total} partitions (was {current}); keys may map to new partitions")
    return EXIT_OK


def run_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        for name in args.names:
            try:
                admin.delete_topic(name)
            except RailmqError as error:
                if error.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION or not args.if_exists:
                    raise
                print(f"topic {name} does not exist")
                continue
            print(f"deleted topic {name}")
    return EXIT_OK
