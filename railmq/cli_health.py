"""`railmq cluster info` and `railmq cluster health`: the cluster at a glance (rpk's names).

`info` says what the cluster is: its id, the coordinator and group coordinator addresses, its
nodes, and how many topics, partitions and replica processes it has, then the controller quorum:
each voter's node, endpoint and process id, which one leads and in which term, and each voter's
commit index and how far it lags the leader's log. `health` says whether it is
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
from actors.messages import ControllerStatusResponse, MetadataResponse
from railmq.admin import Admin
from railmq.cli_common import EXIT_FAILED, EXIT_OK, add_cluster_arguments, milliseconds, print_error
from railmq.cli_tables import Column, print_table
from railmq.terminal_text import cell

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
    health.add_argument("--timeout-ms", type=milliseconds, default=HEALTH_WAIT_DEFAULT_MS, metavar="MS",
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


def quorum_facts(status: list[ControllerStatusResponse]) -> dict[str, Any] | None:
    """The quorum as every voter tells it (None with a single coordinator)."""
    if not status:
        return None
    leaders = [entry for entry in status if entry.role == "leader"]
    leader = max(leaders, key=lambda entry: entry.term) if leaders else None
    voters = []
    for entry in sorted(status, key=lambda entry: (entry.node or 1 << 30, entry.endpoint)):
        reachable = entry.role != "unreachable"
        match = leader.followers.get(entry.node) if leader is not None and entry.node != leader.node else None
        lag = None
        if leader is not None and reachable:
            lag = leader.last_index - (entry.last_index if match is None else match)
        voters.append({"node": entry.node or None, "endpoint": entry.endpoint, "pid": entry.pid or None,
                       "role": entry.role, "active": entry.active, "rejoining": entry.rejoining,
                       "term": entry.term if reachable else None,
                       "commit_index": entry.commit_index if reachable else None,
                       "applied_index": entry.applied_index if reachable else None, "lag_entries": lag})
    return {"leader": leader.node if leader is not None else None,
            "term": leader.term if leader is not None else max((entry.term for entry in status), default=0),
            "active": any(entry.active for entry in status), "voters": voters}


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
QUORUM_COLUMNS = [Column("node"), Column("endpoint"), Column("pid"), Column("role"), Column("term"),
                  Column("commit"), Column("lag")]


def run_info(args: argparse.Namespace) -> int:
    with Admin(args.bootstrap, timeout_ms=args.request_timeout_ms) as admin:
        facts = cluster_facts(admin.metadata(), args.bootstrap)
        facts["quorum"] = quorum_facts(admin.quorum_status(timeout_s=min(2.0, args.request_timeout_ms / 1000)))
    if args.json:
        print(json.dumps(facts, indent=2))
        return EXIT_OK
    role = "controllers" if "," in facts["coordinator"] else "coordinator"
    # The id, endpoints and roles are whoever answered's (a port a controller had may be anyone's):
    # each through `cell`, so no control or markup of theirs reaches the terminal.
    rows = [["cluster id", cell(facts["cluster_id"] or "-")], [role, facts["coordinator"]],
            ["group coordinator", cell(facts["group_coordinator"]) if facts["group_coordinator"]
             else "[yellow]not known yet[/]"],
            ["nodes", ", ".join(map(str, facts["nodes"])) or "-"], ["topics", str(facts["topics"])],
            ["partitions", str(facts["partitions"])],
            ["replica processes", f"{facts['replicas_alive']} of {facts['replicas']} alive"],
            ["client version", facts["client_version"]]]
    console = Console()
    print_table(console, INFO_COLUMNS, rows, title="railmq cluster")
    quorum = facts["quorum"]
    if quorum is None:
        console.print("controller: a single coordinator (no quorum)")
        return EXIT_OK
    voters = [[str(v["node"] or "-"), cell(v["endpoint"]), str(v["pid"] or "-"),
               cell(v["role"]) + (" (active)" if v["active"] else "")
               + (" (rejoining)" if v["rejoining"] else ""),
               "-" if v["term"] is None else str(v["term"]),
               "-" if v["commit_index"] is None else str(v["commit_index"]),
               "-" if v["lag_entries"] is None else str(v["lag_entries"])] for v in quorum["voters"]]
    leader = f"controller {quorum['leader']} leads term {quorum['term']}" if quorum["leader"] else "no leader"
    print_table(console, QUORUM_COLUMNS, voters, title=f"controller quorum: {leader}")
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
    return ", ".join(map(cell, names[:PARTITIONS_LISTED_MAX])) + (f" and {extra} more" if extra > 0 else "")


def render_health(report: dict[str, Any], console: Console) -> None:
    console.print("healthy: " + ("[bold green]yes[/]" if report["healthy"] else "[bold red]no[/]"), highlight=False)
    if not report["group_coordinator_known"]:
        console.print("group coordinator: [yellow]not announced yet[/]")
    for key, words in (("offline_partitions", "offline partitions (no leader)"),
                       ("under_replicated_partitions", "under-replicated partitions (ISR smaller than replicas)"),
                       ("silent_replicas", "replicas the coordinator does not hear from")):
        names = report[key]
        console.print(f"{words}: {len(names)}" + (f" — {_listed(names)}" if names else ""), highlight=False)
