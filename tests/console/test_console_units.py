"""The console's pure parts, without a cluster: following a trace file across rotations, trace
events as timeline sentences, rates, the journal's intervals, fault plans and refusals, the
metrics' names, and `railmq top`'s rendering."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from actors.messages import (
    DescribeGroupResponse,
    MetadataResponse,
    OffsetEntry,
    PartitionMetadata,
    ReplicaInfo,
    StorageReport,
    TopicConfig,
    TopicMetadata,
)
from chaos.console.counters import EventCounters
from chaos.console.events import fault_entry, to_entry
from chaos.console.faults import (
    ActorProcess,
    FaultController,
    FaultRefused,
    node_isolation_plan,
    process_name_of,
)
from chaos.console.journal import Journal, PartitionSample, first_passage
from chaos.console.latency import LatencyHistogram
from chaos.console.snapshot import RateMeter, Snapshot, topology, totals
from chaos.console.traces import TraceTail, coverage, partition_needles, scan
from chaos.links import ActorRef


def _line(time_ns: int, event: str, **details) -> str:
    return (
        json.dumps({"time_ns": time_ns, "actor": "coordinator", "pid": 1, "event": event, **details}) + "\n"
    )


# --------------------------------------------------------------------------- traces


def test_a_tail_returns_whole_lines_only_and_counts_torn_ones(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(_line(1, "topic-created", topic="t"))
    tail = TraceTail(str(path), from_start=True)
    assert [event["event"] for event in tail.poll()] == ["topic-created"]
    with open(path, "a") as handle:
        handle.write('{"time_ns": 2, "event": "half')  # a writer half-way through a line
    assert tail.poll() == []
    with open(path, "a") as handle:
        handle.write('-way"}\n{not json}\n' + _line(3, "leader-elected", topic="t", partition=0, leader=2))
    events = tail.poll()
    assert [event["time_ns"] for event in events] == [2, 3]
    assert tail.torn_lines == 1
    tail.close()


def test_a_tail_reads_the_rest_of_a_rotated_file_then_the_new_one(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(_line(1, "a"))
    tail = TraceTail(str(path), from_start=True)
    assert len(tail.poll()) == 1
    with open(path, "a") as handle:
        handle.write(_line(2, "b"))
    os.replace(path, f"{path}.1")  # TraceFile's rotation: rename, then the next writer creates a new file
    with open(f"{path}.1", "a") as handle:
        handle.write(_line(3, "c"))  # another actor's last line into the renamed file
    path.write_text(_line(4, "d"))
    seen = [event["time_ns"] for event in tail.poll()]
    with open(f"{path}.1", "a") as handle:
        handle.write(_line(5, "e"))  # a straggler after the switch is still read, once
    seen += [event["time_ns"] for event in tail.poll()]
    assert sorted(seen) == [2, 3, 4, 5]
    tail.close()


def test_a_tail_on_a_big_file_starts_near_its_end(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(_line(index, "x") for index in range(2000)))
    tail = TraceTail(str(path), start_bytes_max=1000)
    events = tail.poll()
    assert 0 < len(events) < 30 and events[-1]["time_ns"] == 1999
    assert tail.started_at_offset > 0
    tail.close()


def test_coverage_and_scan_read_rotated_files_oldest_first(tmp_path):
    path = str(tmp_path / "trace.jsonl")
    with open(f"{path}.2", "w") as handle:
        handle.write(_line(10, "became-leader", topic="t", partition=0, leader_epoch=0))
    with open(f"{path}.1", "w") as handle:
        handle.write(_line(20, "became-leader", topic="t", partition=1, leader_epoch=0))
    with open(path, "w") as handle:
        handle.write(_line(30, "leader-elected", topic="t", partition=0, leader=2))
    assert coverage(path).earliest_ns == 10
    found = list(scan(path, lambda event: event.get("partition") == 0, needles=partition_needles("t", 0)))
    assert [event["time_ns"] for event in found] == [10, 30]


# --------------------------------------------------------------------------- timeline sentences


def test_trace_events_become_sentences_with_categories():
    elected = to_entry(
        {
            "time_ns": 5,
            "event": "leader-elected",
            "topic": "t",
            "partition": 0,
            "leader": 2,
            "leader_epoch": 4,
            "previous_leader": 1,
        }
    )
    assert (elected.category, elected.severity, elected.text) == (
        "election",
        "warning",
        "t/0: leader n1 → n2 (epoch 4)",
    )
    shrink = to_entry(
        {
            "time_ns": 6,
            "event": "isr-changed",
            "topic": "t",
            "partition": 0,
            "isr": [2, 3],
            "previous_isr": [1, 2, 3],
        }
    )
    assert shrink.category == "isr" and "shrank [n1, n2, n3] → [n2, n3]" in shrink.text
    offline = to_entry(
        {
            "time_ns": 7,
            "event": "partition-offline",
            "topic": "t",
            "partition": 0,
            "leader": -1,
            "reason": "waiting for ISR members [1]",
        }
    )
    assert offline.severity == "critical" and "OFFLINE" in offline.text
    assert to_entry({"time_ns": 8, "event": "follower-fetch-timeout"}) is None
    assert (
        to_entry({"time_ns": 9, "event": "replica-storage", "state": "ok"}) is None
    )  # healthy reports are noise
    press = fault_entry(10, "kill", "replica/t/0/n1", "SIGKILL to replica/t/0/n1 (pid 4)")
    assert press.category == "fault" and press.text.startswith("kill replica/t/0/n1")


def test_event_counters_tell_shrinks_from_expansions():
    counters = EventCounters()
    for isr, previous in (([1, 2], [1, 2, 3]), ([1, 2, 3], [1, 2]), ([1], [1, 2])):
        counters.count_event(
            {"event": "isr-changed", "topic": "t", "partition": 0, "isr": isr, "previous_isr": previous}
        )
    counters.count_event({"event": "leader-elected", "topic": "t", "partition": 0})
    assert counters.isr_shrinks == {("t", 0): 2} and counters.isr_expands == {("t", 0): 1}
    assert counters.elections == {("t", 0): 1}


# --------------------------------------------------------------------------- rates, journal


def test_a_rate_meter_measures_over_its_window_and_restarts_after_a_fall():
    meter = RateMeter(window_s=5.0)
    for second in range(4):
        meter.observe("p", second * 1_000_000_000, second * 100)
    assert meter.rate("p") == pytest.approx(100.0)
    meter.observe("p", 4_000_000_000, 50)  # truncated below the last value: no negative rate
    assert meter.rate("p") is None
    meter.observe("p", 5_000_000_000, 80)
    assert meter.rate("p") == pytest.approx(30.0)


def test_first_passage_is_an_interval_or_says_the_console_was_not_watching():
    samples = [(10, 3), (20, 5), (30, 9)]
    passage = first_passage(samples, 4)
    assert (passage.passed, passage.after_ns, passage.by_ns, passage.before_watching) == (True, 10, 20, False)
    assert first_passage(samples, 1).before_watching
    assert not first_passage(samples, 9).passed


def test_the_journal_keeps_changes_only_and_answers_per_replica():
    journal = Journal(samples_max=8)
    for time_ns, ends in ((1, ((1, 5), (2, 3))), (2, ((1, 5), (2, 3))), (3, ((1, 8), (2, 8)))):
        journal.record_partition("t", 0, PartitionSample(time_ns, 1, 0, min(end for _, end in ends), ends))
    assert len(journal.samples("t", 0)) == 2
    follower = journal.replica_passage("t", 0, 2, 4)
    assert (follower.after_ns, follower.by_ns) == (1, 3)
    journal.record_commit("g", "t", 0, 5, 2)
    journal.record_commit("g", "t", 0, 6, 7)
    assert journal.commit_passage("g", "t", 0, 5).by_ns == 6 and journal.groups_of("t", 0) == ["g"]


# --------------------------------------------------------------------------- topology, metrics


def _metadata(isr: list[int], leader: int = 1, storage: str = "ok") -> MetadataResponse:
    infos = [
        ReplicaInfo(
            node=node,
            endpoint=f"tcp://127.0.0.1:{9000 + node}",
            pid=100 + node,
            alive=node in isr,
            log_end_offset=50 if node in isr else 40,
            high_watermark=50,
            storage=StorageReport(state=storage if node == 3 else "ok"),
        )
        for node in (1, 2, 3)
    ]
    partition = PartitionMetadata(
        partition=0,
        leader=leader,
        leader_endpoint="tcp://127.0.0.1:9001" if leader > 0 else "",
        leader_epoch=2,
        replicas=[1, 2, 3],
        isr=isr,
        replica_info=infos,
    )
    return MetadataResponse(
        correlation_id=0,
        topics=[
            TopicMetadata(name="orders", config=TopicConfig(min_insync_replicas=2), partitions=[partition])
        ],
        nodes=[1, 2, 3],
    )


def test_topology_flags_under_replicated_and_under_min_isr_partitions():
    topics, partitions, nodes = topology(_metadata([1]), RateMeter(), 1, paused={"replica/orders/0/n2"})
    view = partitions[0]
    assert view.under_replicated and view.under_min_isr and not view.offline
    assert [replica.behind_leader for replica in view.replicas] == [0, 10, 10]
    assert view.replicas[1].paused and topics[0].replication_factor == 3
    assert [node.replicas_alive for node in nodes] == [1, 0, 0]
    assert totals(partitions)["under_min_isr_partitions"] == 1


class _FakeCollector:
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.counters = EventCounters()
        self.latency = LatencyHistogram()

        class _Slow:
            stats: dict = {}

        self.slow = _Slow()


def test_metrics_use_kafka_names_and_split_by_node():
    pytest.importorskip("prometheus_client")
    from chaos.console.metrics import ClusterMetrics

    topics, partitions, nodes = topology(_metadata([1, 2], storage="damaged"), RateMeter(), 1)
    collector = _FakeCollector(Snapshot(time_ns=1, topics=topics, partitions=partitions, nodes=nodes))
    collector.counters.count_event(
        {"event": "isr-changed", "topic": "orders", "partition": 0, "isr": [1, 2], "previous_isr": [1, 2, 3]}
    )
    collector.latency.observe("Metadata", 0.002)
    text = ClusterMetrics(collector).exposition()[0].decode()
    for line in (
        'railmq_under_replicated_partitions 1.0',
        'railmq_offline_partitions_count 0.0',
        'railmq_isr_shrinks_total{partition="0",topic="orders"} 1.0',
        'railmq_log_log_end_offset{partition="0",topic="orders"} 50.0',
        'railmq_replica_storage_state{node="3",partition="0",state="damaged",topic="orders"} 1.0',
        'railmq_console_request_latency_seconds_count{outcome="ok",request="Metadata"} 1.0',
    ):
        assert line in text, line
    node_two = ClusterMetrics(collector).exposition(2)[0].decode()
    assert "railmq_under_replicated_partitions 0.0" in node_two  # node 2 leads nothing
    assert 'node="3"' not in node_two and 'node="2"' in node_two


def test_a_group_id_cannot_add_a_line_to_the_metrics():
    """A group id is any text a client chose (not '/'): label values are escaped as the
    exposition format says (backslash, quote, newline), so one naming a metric stays a label."""
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from chaos.console.metrics import ClusterMetrics
    from railmq.lag import GroupLag, MemberLag, PartitionLag

    hostile = 'g"} 1\nrailmq_offline_partitions_count 99\n# \\'
    owed = PartitionLag(topic="orders", partition=0, committed_offset=1, lag_messages=2)
    group = GroupLag(group_id=hostile, members=[MemberLag(member_id="m")], partitions=[owed])
    collector = _FakeCollector(Snapshot(time_ns=1, groups=[group]))
    collector.counters.count_event({"event": "rebalance-started", "group": hostile, "reason": "join"})
    text = ClusterMetrics(collector).exposition()[0].decode()
    samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    assert [sample.value for sample in samples if sample.name == "railmq_offline_partitions_count"] == [0.0]
    grouped = {sample.name: sample.labels["group"] for sample in samples if "group" in sample.labels}
    assert grouped["railmq_consumergroup_members"] == grouped["railmq_consumergroup_lag"] == hostile
    assert grouped["railmq_consumergroup_rebalances_total"] == hostile


def test_the_page_never_parses_cluster_text_as_html():
    """Names in the page are a client's (group, member and client ids, reasons): a script run
    from one would own the console's origin and its kill and isolate buttons. console.js builds
    every element with DOM calls and text nodes; its one innerHTML is a lab's plot, which
    chaos/labs/plots.py escapes. A new HTML sink fails here until it is argued for."""
    import pathlib

    script = (pathlib.Path(__file__).parents[2] / "chaos" / "console" / "static" / "console.js").read_text()
    sinks = re.findall(r".*(?:innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function).*",
                       script)
    assert [line.strip() for line in sinks] == [
        "holder.innerHTML = svg;  // drawn and escaped by chaos/labs/plots.py on the server"]
    assert "document.createTextNode(String(child))" in script  # h(): children are text


# --------------------------------------------------------------------------- faults


def test_isolating_a_node_cuts_each_of_its_replicas_off_from_everyone():
    everyone = [
        ActorRef("coordinator", "tcp://c", 0),
        ActorRef("replica/t/0/n1", "tcp://a", 1),
        ActorRef("replica/t/1/n1", "tcp://b", 1),
        ActorRef("replica/t/0/n2", "tcp://d", 2),
    ]
    plan = node_isolation_plan(everyone[1:3], everyone)
    assert plan["replica/t/0/n1"][0].peers[0] == "tcp://"  # hears and reaches nobody
    dropped = {peer for link in plan["coordinator"] for peer in link.peers}
    assert {"tcp://a", "tcp://b", "replica/t/0/n1|", "replica/t/1/n1|"} <= dropped


def test_a_stale_pid_is_never_signalled(monkeypatch):
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append((pid, signum)))
    me = ActorProcess(
        "replica/t/0/n1", os.getpid(), "tcp://127.0.0.1:1", 1
    )  # this test's pid: not that actor
    controller = FaultController("tcp://127.0.0.1:1", lambda: [me])
    try:
        outcome = controller.perform("kill", "replica", "replica/t/0/n1")
        assert not outcome.ok and "stale" in outcome.sentence and sent == []
        assert not controller.perform("isolate", "replica", "replica/t/0/n1").ok  # no secret
        assert "--data-dir" in controller.perform("isolate", "replica", "replica/t/0/n1").sentence
        assert not controller.perform("resume", "replica", "replica/t/0/n1").ok  # never paused here
        assert not controller.perform("explode", "replica", "x").ok
        assert not controller.perform("kill", "node", "7").ok
    finally:
        controller.close()
    assert process_name_of("replica/orders/0/n1") == "r/orders/0/n1"
    assert signal.SIGKILL not in [signum for _, signum in sent]


def test_read_secret_refuses_a_missing_or_short_file(tmp_path):
    from chaos.console.faults import read_secret

    with pytest.raises(FaultRefused, match="cannot be read"):
        read_secret(str(tmp_path))
    (tmp_path / "cluster.secret").write_bytes(b"short")
    with pytest.raises(FaultRefused, match="shorter"):
        read_secret(str(tmp_path))


# --------------------------------------------------------------------------- top


def test_top_puts_unhealthy_partitions_first_and_names_their_flags():
    from rich.console import Console

    from chaos.console.top import render

    _, partitions, _ = topology(_metadata([1, 2, 3]), RateMeter(), 1)
    _, sick, _ = topology(_metadata([1], leader=-1, storage="damaged"), RateMeter(), 1)
    sick[0].topic = "payments"
    snapshot = Snapshot(time_ns=1, cluster_id="c1", partitions=partitions + sick, offline_partitions=1)
    console = Console(record=True, width=160)
    console.print(render(snapshot, [fault_entry(1_000_000_000, "kill", "coordinator", "SIGKILL")]))
    text = console.export_text()
    assert text.index("payments/0") < text.index("orders/0")
    assert "OFFLINE" in text and "n3:damaged" in text and "kill coordinator" in text


def test_top_shows_names_a_client_chose_as_escapes_never_as_markup_or_terminal_controls():
    """A group id, member id or protocol name is any text a client chose. `railmq top` gave the
    group id to its table as rich markup (`[/]` ended top with a MarkupError) and printed it and
    the timeline's member ids raw: an ESC[2J from a client cleared the operator's screen."""
    import io
    import re

    from rich.console import Console

    from chaos.console.top import render
    from railmq.lag import GroupLag, PartitionLag

    hostile = ["[/][link=https://evil.example/]x", "\x1b[2J\x1b]52;c;ZXZpbA==\x07", "a\rb\x9b2J\u202eexe"]
    groups = [GroupLag(group_id=name, state="Stable", partitions=[PartitionLag(topic="orders", partition=0)])
              for name in hostile]
    entries = [to_entry({"time_ns": 5, "event": "member-removed", "group": name, "member": name,
                         "reason": name}) for name in hostile]
    snapshot = Snapshot(time_ns=1, cluster_id="c1", groups=groups, group_rates={})
    out = io.StringIO()
    Console(file=out, width=300, color_system=None, force_terminal=False).print(render(snapshot, entries))
    printed = out.getvalue()
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", printed), printed
    assert "[/][link=https://evil.example/]x" in printed
    assert "\\x1b[2J\\x1b]52;c;ZXZpbA==\\x07" in printed and "a\\rb\\x9b2J\\u202eexe" in printed
    assert "member a\\rb\\x9b2J\\u202eexe removed" in printed


def test_the_appending_leader_had_a_record_no_later_than_any_follower_was_seen_with_it():
    from chaos.console.explain import _no_later_than_copies
    from chaos.console.journal import Passage

    passages = {1: Passage(passed=True, after_ns=30, by_ns=40),  # the leader's own, staler report
                2: Passage(passed=True, after_ns=10, by_ns=20), 3: Passage(passed=False)}
    leader = _no_later_than_copies(passages, 1)
    assert leader.by_ns == 20 and leader.after_ns is None  # its "not yet" at 30 contradicts n2's copy at 20
    assert _no_later_than_copies({1: Passage(passed=True, after_ns=5, by_ns=8), 2: passages[2]}, 1).by_ns == 8


def test_lag_seconds_of_a_commit_below_the_log_start_follow_the_oldest_record_left():
    """A committed offset below the log start has no record: its lag in seconds is the age of the
    oldest record left (`timestamp_at` reads from the log start). The console cached that answer
    under the committed offset as if it never changed, so while retention moved on, the group's
    lag in seconds kept the age of a record long deleted, growing without end."""
    from chaos.console.poller import SlowPoller

    class OldestLeft:
        _topics: dict = {}
        timestamp_ms = 1_000

        def timestamp_at(self, topic: str, partition: int, offset: int) -> int:
            return self.timestamp_ms

    poller = SlowPoller.__new__(SlowPoller)
    poller.client, poller.latency, poller._timestamps = OldestLeft(), LatencyHistogram(), {}
    description = DescribeGroupResponse(correlation_id=0, group_id="g",
                                        offsets=[OffsetEntry(topic="t", partition=0, offset=3)])
    info = ReplicaInfo(node=1, log_start_offset=50, high_watermark=100)
    metadata = MetadataResponse(correlation_id=0, topics=[TopicMetadata(
        name="t", partitions=[PartitionMetadata(partition=0, leader=1, replica_info=[info])])])

    assert poller._lag_timestamps([description], metadata) == {("t", 0, 3): 1_000}
    poller.client.timestamp_ms = 9_000  # retention moved on: the oldest record left is newer
    assert poller._lag_timestamps([description], metadata) == {("t", 0, 3): 9_000}


@pytest.mark.timeout(30)
def test_read_secret_refuses_a_file_no_secret_fits_or_a_pipe_without_reading_it_whole(tmp_path):
    """The console read `<data dir>/cluster.secret` whole and blocking: a symlink to /dev/zero in
    its place was read until memory ran out, a 2 MiB file was taken as the key, and a FIFO held
    the collector's start for ever (storage reads it bounded, regular files only)."""
    from chaos.console.faults import read_secret

    (tmp_path / "cluster.secret").write_bytes(b"k" * (2 << 20))
    with pytest.raises(FaultRefused, match="cannot be read"):
        read_secret(str(tmp_path))
    (tmp_path / "cluster.secret").unlink()
    os.mkfifo(tmp_path / "cluster.secret")
    with pytest.raises(FaultRefused, match="cannot be read"):
        read_secret(str(tmp_path))
