"""`railmq topics create|list|describe|delete`: topic administration over `railmq.admin.Admin`.

This module parses, calls the admin client and renders; it decides nothing about topics itself
(the coordinator validates names, counts and configs and answers with typed errors). Topic
configs given as `--config key=value` are converted to `TopicConfig` field types here so a
misspelt key or a non-number is a usage error (exit 2) before anything is sent.

`describe` reads the leader's position from the `ReplicaInfo` the coordinator last heard from
each replica, so its high watermark and log end offset can trail the leader's by one heartbeat.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from actors.messages import PartitionMetadata, ReplicaInfo, TopicConfig, TopicMetadata
from railmq.admin import Admin
from railmq.cli_common import (
    EXIT_OK, UsageError, add_cluster_arguments, key_value, positive_int,
)

# Config keys settable with --config: every TopicConfig field except the one with its own flag.
CONFIG_KEYS = tuple(name for name in TopicConfig.__struct_fields__ if name != "min_insync_replicas")
_NONE_WORDS = frozenset({"none", "null", ""})


def register(commands: argparse._SubParsersAction) -> None:
    topics = commands.add_parser("topics", help="create, list, describe and delete topics")
    actions = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    _add_create(actions)
    listing = actions.add_parser("list", help="every topic with its partition and replica counts")
    add_cluster_arguments(listing)
    listing.set_defaults(handler=run_list)
    describe = actions.add_parser("describe", help="leaders, replicas, ISR and offsets per partition")
    describe.add_argument("name", metavar="NAME")
    describe.add_argument("--json", action="store_true", help="print every replica's details as JSON")
    add_cluster_arguments(describe)
    describe.set_defaults(handler=run_describe)
    delete = actions.add_parser("delete", help="delete a topic and its data")
    delete.add_argument("name", metavar="NAME")
    add_cluster_arguments(delete)
    delete.set_defaults(handler=run_delete)


def _add_create(actions: argparse._SubParsersAction) -> None:
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--partitions", type=positive_int, default=1, metavar="N")
    create.add_argument("--replication-factor", type=positive_int, default=1, metavar="N")
    create.add_argument("--min-insync", type=positive_int, default=1, metavar="N",
                        help="replicas that must have a record before acks=all acknowledges it")
    create.add_argument("--config", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                        help=f"topic setting, repeatable; keys: {', '.join(CONFIG_KEYS)}")
    add_cluster_arguments(create)
    create.set_defaults(handler=run_create, parser=create)


def topic_config(pairs: list[tuple[str, str]], min_insync: int) -> TopicConfig:
    """A TopicConfig from `key=value` strings; ValueError names the bad key or value."""
    values: dict[str, Any] = {"min_insync_replicas": min_insync}
    for name, text in pairs:
        if name not in CONFIG_KEYS:
            raise ValueError(f"unknown config key {name!r}; known keys: {', '.join(CONFIG_KEYS)}")
        values[name] = None if text.strip().lower() in _NONE_WORDS else text
    try:
        return msgspec.convert(values, TopicConfig, strict=False)
    except msgspec.ValidationError as error:
        raise ValueError(f"bad config value: {error}") from None


def _admin(args: argparse.Namespace) -> Admin:
    return Admin(args.bootstrap, timeout_ms=args.request_timeout_ms)


def run_create(args: argparse.Namespace) -> int:
    try:
        config = topic_config(args.config, args.min_insync)
    except ValueError as error:
        raise UsageError(args.parser, str(error)) from None
    with _admin(args) as admin:
        admin.create_topic(args.name, partitions=args.partitions, replication_factor=args.replication_factor,
                           config=config, timeout_s=args.request_timeout_ms / 1000)
    print(f"created topic {args.name} with {args.partitions} partitions, replication factor "
          f"{args.replication_factor}, min in-sync {args.min_insync}")
    return EXIT_OK


def run_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        topics = admin.metadata().topics
    table = Table(title="topics", title_justify="left")
    for column in ("topic", "partitions", "replication", "min in-sync", "under-replicated", "offline"):
        table.add_column(column, justify="left" if column == "topic" else "right")
    for topic in topics:
        partitions = topic.partitions
        replication = len(partitions[0].replicas) if partitions else 0
        under = sum(1 for p in partitions if len(p.isr) < len(p.replicas))
        offline = sum(1 for p in partitions if p.leader < 0 or not p.leader_endpoint)
        table.add_row(topic.name, str(len(partitions)), str(replication),
                      str(topic.config.min_insync_replicas), _warn(under), _warn(offline))
    Console().print(table if topics else "no topics")
    return EXIT_OK


def _warn(count: int) -> str:
    return f"[yellow]{count}[/]" if count else "0"


def run_describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        topic = admin.describe_topic(args.name)
    if args.json:
        print(json.dumps(describe_to_dict(topic), indent=2))
    else:
        Console().print(_describe_table(topic))
    return EXIT_OK


def leader_info(partition: PartitionMetadata) -> ReplicaInfo | None:
    return next((info for info in partition.replica_info if info.node == partition.leader), None)


def describe_to_dict(topic: TopicMetadata) -> dict[str, Any]:
    return {
        "topic": topic.name,
        "topic_id": topic.topic_id,
        "config": _config_settings(topic.config),
        "partitions": [_partition_to_dict(partition) for partition in topic.partitions],
    }


def _config_settings(config: TopicConfig) -> dict[str, Any]:
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
        "high_watermark": leader.high_watermark if leader else None,
        "log_end_offset": leader.log_end_offset if leader else None,
        "replicas": [{
            "node": info.node, "pid": info.pid, "endpoint": info.endpoint, "alive": info.alive,
            "in_isr": info.node in partition.isr, "leader": info.node == partition.leader,
            "log_start_offset": info.log_start_offset, "log_end_offset": info.log_end_offset,
            "high_watermark": info.high_watermark,
        } for info in partition.replica_info],
    }


def _describe_table(topic: TopicMetadata) -> Table:
    config = topic.config
    table = Table(title=f"topic {topic.name} (min in-sync {config.min_insync_replicas}, "
                        f"flush {config.flush_policy})", title_justify="left")
    for column in ("partition", "leader", "epoch", "replicas", "isr", "high watermark", "log end offset"):
        table.add_column(column, justify="right" if column not in ("replicas", "isr") else "left")
    for partition in topic.partitions:
        leader = leader_info(partition)
        led = partition.leader >= 0 and partition.leader_endpoint
        leader_text = str(partition.leader) if led else "[red]none[/]"
        isr_text = ",".join(map(str, partition.isr))
        if len(partition.isr) < len(partition.replicas):
            isr_text = f"[yellow]{isr_text}[/]"
        table.add_row(str(partition.partition), leader_text, str(partition.leader_epoch),
                      ",".join(map(str, partition.replicas)), isr_text,
                      str(leader.high_watermark) if leader else "-",
                      str(leader.log_end_offset) if leader else "-")
    return table


def run_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_topic(args.name)
    print(f"deleted topic {args.name}")
    return EXIT_OK
