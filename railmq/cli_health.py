"""`railmq cluster info` and `railmq cluster health`: the cluster at a glance (rpk's names).

`info` says what the cluster is: its id, the coordinator and group coordinator addresses, its
nodes, and how many topics, partitions and replica processes it has. `health` says whether it is
well: partitions without a leader (offline), partitions whose in-sync set is smaller than their
replica set (under-replicated), and replica processes the coordinator has not heard from. With
`--exit-when-healthy` it waits until the cluster is healthy (exit 0) or `--timeout-ms` ends
(exit 1), which is what a script that just started a cluster wants.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rich.console import Console

import railmq
from actors.messages import MetadataResponse
from railmq.admin import Admin
from railmq.cli_common import EXIT_FAILED, EXIT_OK, add_cluster_arguments, positive_int, print_error
from railmq.cli_tables import Column, print_table

HEALTH_WAIT_DEFAULT_MS = 30_000
HEALTH_RECHECK_S = 0.25
# A health line lists this many partitions at most, then counts the rest.
PARTITIONS_LISTED_MAX = 10


def register(commands: argparse._SubParsersAction) -> None:
    cluster = commands.add_parser("cluster", help="the cluster at a glance: info and health",
                                  description="What the cluster is, and whether it is well.")
    actions = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    info = actions.add_parser("info", help="cluster id, coordinators, nodes, topic and partition counts")
    info.add_argument("--json", action="store_true", help="print the facts as JSON")
    add_cluster_arguments(info)
    info.set_defaults(handler=run_info)
    health = actions.add_parser("health", help="offline and under-replicated partitions, silent replicas")
    health.add_argument("--json", action="store_true", help="print the verdict as JSON")
    health.add_argument("--exit-when-healthy", action="store_true",
                        help="wait until the cluster is healthy (exit 0) or --timeout-ms ends (exit 1)")
    health.add_argument("--timeout-ms", type=positive_int, default=HEALTH_WAIT_DEFAULT_MS, metavar="MS",
                        help="how long --exit-when-healthy waits")
    add_cluster_arguments(health)
    health.set_defaults(handler=run_health)


def cluster_facts(metadata: MetadataResponse, bootstrap: str) -> dict[str, Any]:
    partitions = [partition for topic in metadata.topics for partition in topic.partitions]
    replicas = [info for partition in partitions for info in partition.replica_info]
    return {
        "cluster_id": metadata.cluster_id, "coordinator": bootstrap,
        "group_coordinator": metadata.group_coordinator_endpoint or None, "nodes": list(metadata.nodes),
        "topics": len(metadata.topics), "partitions": len(partitions), "replicas": len(replicas),
        "replicas_alive": sum(1 for info in replicas if info.alive), "client_version": railmq.__version__,
    }


def health_report(metadata: MetadataResponse) -> dict[str, Any]:
    offline, under, silent = [], [], []
    for topic in metadata.topics:
        for partition in topic.partitions:
            name = f"{topic.name}/{partition.partition}"
            if partition.leader < 0 or not partition.leader_endpoint:
                offline.append(name)
            if len(partition.isr) < len(partition.replicas):
                under.append(name)
            silent += [f"{name} on node {info.node}" for info in partition.replica_info if not info.alive]
    return {"healthy": not (offline or under or silent) and bool(metadata.group_coordinator_endpoint),
            "group_coordinator_known": bool(metadata.group_coordinator_endpoint),
            "offline_partitions": offline, "under_replicated_partitions": under, "silent_replicas": silent}


def _metadata(args: argparse.Namespace) -> MetadataResponse:
    with Admin(args.bootstrap, timeout_ms=args.request_timeout_ms) as admin:
        return admin.metadata()


INFO_COLUMNS = [Column("fact"), Column("value")]


def run_info(args: argparse.Namespace) -> int:
    facts = cluster_facts(_metadata(args), args.bootstrap)
    if args.json:
        print(json.dumps(facts, indent=2))
        return EXIT_OK
    rows = [["cluster id", facts["cluster_id"] or "-"], ["coordinator", facts["coordinator"]],
            ["group coordinator", facts["group_coordinator"] or "[yellow]not known yet[/]"],
            ["nodes", ", ".join(map(str, facts["nodes"])) or "-"], ["topics", str(facts["topics"])],
            ["partitions", str(facts["partitions"])],
            ["replica processes", f"{facts['replicas_alive']} of {facts['replicas']} alive"],
            ["client version", facts["client_version"]]]
    print_table(Console(), INFO_COLUMNS, rows, title="railmq cluster")
    return EXIT_OK


def run_health(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout_ms / 1000
    report = health_report(_metadata(args))
    while args.exit_when_healthy and not report["healthy"] and time.monotonic() < deadline:
        time.sleep(HEALTH_RECHECK_S)
        report = health_report(_metadata(args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render_health(report, Console())
    if args.exit_when_healthy and not report["healthy"]:
        print_error("UNHEALTHY", f"the cluster was not healthy within {args.timeout_ms} ms")
        return EXIT_FAILED
    return EXIT_OK


def _listed(names: list[str]) -> str:
    extra = len(names) - PARTITIONS_LISTED_MAX
    return ", ".join(names[:PARTITIONS_LISTED_MAX]) + (f" and {extra} more" if extra > 0 else "")


def render_health(report: dict[str, Any], console: Console) -> None:
    console.print("healthy: " + ("[bold green]yes[/]" if report["healthy"] else "[bold red]no[/]"), highlight=False)
    if not report["group_coordinator_known"]:
        console.print("group coordinator: [yellow]not announced yet[/]")
    for key, words in (("offline_partitions", "offline partitions (no leader)"),
                       ("under_replicated_partitions", "under-replicated partitions (ISR smaller than replicas)"),
                       ("silent_replicas", "replicas the coordinator does not hear from")):
        names = report[key]
        console.print(f"{words}: {len(names)}" + (f" — {_listed(names)}" if names else ""), highlight=False)
