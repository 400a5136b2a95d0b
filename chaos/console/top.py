"""`railmq top`: the console's live numbers in the terminal, redrawn every second (rich `Live`).

Four blocks, most urgent first: the cluster line (offline, under-replicated, under min ISR,
produce and commit rates), the partitions (leader, epoch, ISR, high watermark, log end, rate,
flags; the unhealthy ones first), the groups (lag in messages and seconds, commit rate, hot
flags) and the newest timeline entries. The same `Collector` feeds the browser console, so
the numbers agree with it. `render(snapshot, entries)` is pure and tested on its own.

Group ids, and the member ids and protocol names in timeline entries, are text a client chose:
they go in as `Text` (never markup) through `visible` (no terminal control), as every command's
client text does (railmq/terminal_text.py).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from railmq.terminal_text import visible

PARTITION_ROWS_MAX = 30
GROUP_ROWS_MAX = 20
TIMELINE_ROWS = 8
SEVERITY_STYLE = {"info": "", "warning": "yellow", "critical": "bold red"}


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _flags(partition: Any) -> Text:
    text = Text()
    if partition.offline:
        text.append("OFFLINE ", style="bold red")
    if partition.under_min_isr:
        text.append("under-min-ISR ", style="red")
    elif partition.under_replicated:
        text.append("under-replicated ", style="yellow")
    if partition.hot:
        text.append("hot ", style="magenta")
    damaged = [
        f"n{replica.node}:{replica.storage_state}"
        for replica in partition.replicas
        if replica.storage_state not in ("ok", "new")
    ]
    if damaged:
        text.append(" ".join(damaged), style="red")
    return text


def _urgency(partition: Any) -> tuple:
    return (
        not partition.offline,
        not partition.under_min_isr,
        not partition.under_replicated,
        partition.topic,
        partition.partition,
    )


def headline(snapshot: Any) -> Text:
    commits = sum(snapshot.group_rates.values()) if snapshot.group_rates else None
    text = Text(f"railmq top · cluster {visible(snapshot.cluster_id or '?')} at {snapshot.bootstrap} · ")
    text.append(f"{len(snapshot.partitions)} partitions  ")
    for count, words in (
        (snapshot.offline_partitions, "offline"),
        (snapshot.under_replicated_partitions, "under-replicated"),
        (snapshot.under_min_isr_partitions, "under min ISR"),
    ):
        text.append(f"{count} {words}  ", style="bold red" if count else "green")
    text.append(f"produced {_rate(snapshot.produce_rate_per_s)}/s  committed {_rate(commits)}/s")
    if not snapshot.reachable:
        text.append("  COORDINATOR NOT ANSWERING", style="bold red")
    return text


def partition_table(snapshot: Any) -> Table:
    table = Table(title="partitions", title_justify="left", expand=True, pad_edge=False)
    for column, justify in (
        ("topic/p", "left"),
        ("leader", "left"),
        ("epoch", "right"),
        ("ISR", "left"),
        ("high wm", "right"),
        ("log end", "right"),
        ("msg/s", "right"),
        ("behind", "left"),
        ("flags", "left"),
    ):
        table.add_column(column, justify=justify, no_wrap=column != "flags")
    rows = sorted(snapshot.partitions, key=_urgency)
    for partition in rows[:PARTITION_ROWS_MAX]:
        behind = " ".join(
            f"n{replica.node}:{replica.behind_leader}"
            for replica in partition.replicas
            if replica.behind_leader or not replica.alive
        )
        table.add_row(
            f"{partition.topic}/{partition.partition}",
            f"n{partition.leader}" if partition.leader >= 0 else "none",
            str(partition.leader_epoch),
            ",".join(map(str, partition.isr)),
            f"{partition.high_watermark:,}",
            f"{partition.log_end_offset:,}",
            _rate(partition.produce_rate_per_s),
            behind or "-",
            _flags(partition),
        )
    if len(rows) > PARTITION_ROWS_MAX:
        table.caption = f"and {len(rows) - PARTITION_ROWS_MAX} more partitions (healthy ones last)"
    return table


def group_table(snapshot: Any) -> Table:
    table = Table(title="groups", title_justify="left", expand=True, pad_edge=False)
    for column, justify in (
        ("group", "left"),
        ("state", "left"),
        ("topic/p", "left"),
        ("committed", "right"),
        ("lag", "right"),
        ("lag s", "right"),
        ("commits/s", "right"),
        ("hot", "left"),
    ):
        table.add_column(column, justify=justify, no_wrap=True)
    shown = 0
    for group in snapshot.groups:
        for row in sorted(group.partitions, key=lambda item: -(item.lag_messages or 0)):
            if shown >= GROUP_ROWS_MAX:
                break
            shown += 1
            rate = snapshot.group_rates.get(f"{group.group_id}|{row.topic}|{row.partition}")
            table.add_row(
                Text(visible(group.group_id)),
                group.state,
                f"{row.topic}/{row.partition}",
                "-" if row.committed_offset is None else f"{row.committed_offset:,}",
                "-" if row.lag_messages is None else f"{row.lag_messages:,}",
                "-" if row.lag_seconds is None else f"{row.lag_seconds:.1f}",
                _rate(rate),
                Text(",".join(row.hot_reasons), style="magenta") if row.hot else "",
            )
    return table


def timeline_block(entries: list[Any]) -> Table:
    table = Table(title="timeline", title_justify="left", expand=True, show_header=False, pad_edge=False)
    table.add_column("when", no_wrap=True)
    table.add_column("what")
    for entry in entries[-TIMELINE_ROWS:][::-1]:
        when = (
            time.strftime("%H:%M:%S", time.localtime(entry.time_ns / 1e9))
            + f".{entry.time_ns // 1_000_000 % 1000:03d}"
        )
        table.add_row(
            when,
            Text(f"{entry.category:<9} {visible(entry.text)}", style=SEVERITY_STYLE.get(entry.severity, "")),
        )
    return table


def render(snapshot: Any, entries: list[Any]) -> Group:
    parts: list[Any] = [headline(snapshot)]
    parts += [Text(visible(problem), style="yellow") for problem in snapshot.problems]
    parts += [partition_table(snapshot), group_table(snapshot), timeline_block(entries)]
    return Group(*parts)


def run_top(
    collector: Any, *, interval_s: float = 1.0, iterations: int | None = None, console: Console | None = None
) -> None:
    """Redraw every `interval_s` until Ctrl-C (or `iterations` redraws)."""
    console = console or Console()
    done = 0
    with Live(
        render(collector.snapshot, collector.timeline()),
        console=console,
        auto_refresh=False,
        screen=False,
        transient=False,
    ) as live:
        while iterations is None or done < iterations:
            time.sleep(interval_s)
            live.update(render(collector.snapshot, collector.timeline()), refresh=True)
            done += 1
