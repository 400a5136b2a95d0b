"""What the harness looks at after the faults: convergence, the final read, replica logs, hygiene.

- `wait_converged` waits, within the recovery window, for every partition to have a leader and a
  full ISR, and for the group's committed offsets to reach every high watermark;
- `final_read` reads every partition from its start through a plain (group-less) consumer and
  says which partitions it could not read to their end: the checker must not mistake a read cut
  short for lost messages, so those partitions get no `final-read` line;
- `replica_logs` reads each replica's log files after the cluster stopped, from a copy of the
  directory (opening a log may repair a torn tail: never on the original), and keeps the entries
  below that replica's last reported high watermark — the committed prefix the divergence rule
  compares;
- `leftover_processes` and `leftover_segments` are the hygiene facts: live children of this
  process (multiprocessing's forkserver and resource tracker excepted, zombies are reaped by
  their parent) and /dev/shm segments of this cluster.

Entries are `[offset, key, value]` with keys and values as text, the form histories use.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, NamedTuple

import psutil

from actors.errors import RailmqError
from chaos.workload import as_text
from railmq.admin import Admin
from railmq.consumer import Consumer
from storage.batch import decode_records, iter_batches
from storage.log import LogConfig, PartitionLog
from transport.actor_main import replica_directory
from transport.shm import cluster_prefix, list_segments

Entry = list[Any]  # [offset, key, value]
# The final read and the replica dumps read this much per call.
READ_BYTES_MAX = 4 * 1024 * 1024
FINAL_READ_POLL_MS = 200


class ReplicaState(NamedTuple):
    partition: int
    node: int
    high_watermark: int


# --------------------------------------------------------------------------- convergence


def wait_full_isr(admin: Admin, topic: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            admin.wait_for_leaders(topic, timeout_s=max(0.1, deadline - time.monotonic()), full_isr=True)
            return True
        except RailmqError:
            continue
    return False


def group_caught_up(admin: Admin, topic: str, group: str, partitions: int) -> bool:
    """Whether the group's committed offsets have reached every partition's high watermark."""
    from railmq.group_admin import GroupAdminClient

    with GroupAdminClient(admin.bootstrap, timeout_ms=2000) as groups:
        committed = {entry.partition: entry.offset for entry in groups.describe_group(group).offsets
                     if entry.topic == topic}
    for partition in range(partitions):
        high_watermark = admin.list_offsets(topic, partition, -1).offset
        if high_watermark > 0 and committed.get(partition, 0) < high_watermark:
            return False
    return True


def wait_converged(bootstrap: str, topic: str, group: str, partitions: int,
                   window_s: float) -> dict[str, bool]:
    """Wait up to `window_s` for a full ISR everywhere and a caught-up group; say which held."""
    deadline = time.monotonic() + window_s
    with Admin(bootstrap, timeout_ms=2000) as admin:
        isr_full = wait_full_isr(admin, topic, deadline)
        caught_up = False
        while not caught_up and time.monotonic() < deadline:
            try:
                caught_up = group_caught_up(admin, topic, group, partitions)
            except RailmqError:
                pass
            if not caught_up:
                time.sleep(0.2)
    return {"isr_full": isr_full, "group_caught_up": caught_up}


# --------------------------------------------------------------------------- final read


def final_read(bootstrap: str, topic: str, partitions: int,
               timeout_s: float) -> tuple[dict[int, list[Entry]], list[int]]:
    """Every partition's records from its start to its high watermark, and the partitions that
    could not be read to the end within `timeout_s`."""
    wanted = [(topic, partition) for partition in range(partitions)]
    entries: dict[int, list[Entry]] = {partition: [] for partition in range(partitions)}
    deadline = time.monotonic() + timeout_s
    with Consumer(bootstrap, auto_offset_reset="earliest", client_id="chaos-final-read",
                  request_timeout_ms=int(timeout_s * 1000)) as consumer:
        consumer.assign(wanted)
        ends = {tp.partition: offset for tp, offset in consumer.end_offsets(wanted).items()}
        while time.monotonic() < deadline and any(_short(entries[p], ends[p]) for p in entries):
            for record in consumer.poll(FINAL_READ_POLL_MS):
                if record.offset < ends[record.partition]:
                    entry = [record.offset, as_text(record.key), as_text(record.value)]
                    entries[record.partition].append(entry)
    incomplete = [partition for partition in entries if _short(entries[partition], ends[partition])]
    return entries, incomplete


def _short(entries: list[Entry], end: int) -> bool:
    return end > 0 and (not entries or entries[-1][0] < end - 1)


# --------------------------------------------------------------------------- replica logs


def replica_states(admin: Admin, topic: str) -> tuple[int, list[ReplicaState]]:
    """(topic id, every replica's last reported high watermark), asked before the cluster stops."""
    described = admin.describe_topic(topic)
    states = [ReplicaState(partition.partition, info.node, info.high_watermark)
              for partition in described.partitions for info in partition.replica_info]
    return described.topic_id, states


def read_log_entries(directory: str, limit_offset: int) -> tuple[int, list[Entry]]:
    """(log start offset, entries below `limit_offset`) of the log in `directory`, read from a copy."""
    with tempfile.TemporaryDirectory(prefix="railmq-chaos-replica-") as scratch:
        copy = os.path.join(scratch, "log")
        shutil.copytree(directory, copy)
        log = PartitionLog.open(copy, LogConfig(), now_ms=time.time_ns() // 1_000_000)
        try:
            return log.log_start_offset, _entries(log, limit_offset)
        finally:
            log.close()


def _entries(log: PartitionLog, limit_offset: int) -> list[Entry]:
    entries: list[Entry] = []
    offset = log.log_start_offset
    end = min(limit_offset, log.log_end_offset)
    while offset < end:
        data = log.read(offset, READ_BYTES_MAX)
        if not data:
            break
        for position, header in iter_batches(data):
            if header.is_control:
                continue
            for index, record in enumerate(decode_records(data, header, position)):
                at = header.base_offset + index
                if offset <= at < end:
                    entries.append([at, as_text(record[1]), as_text(record[2])])
            offset = max(offset, header.next_offset)
    return entries


def replica_logs(data_dir: str, topic: str, topic_id: int,
                 states: list[ReplicaState]) -> list[dict[str, Any]]:
    """`replica-log` lines for every replica whose directory exists."""
    lines = []
    for state in sorted(states):
        directory = replica_directory(data_dir, state.node, topic, state.partition, topic_id)
        if not os.path.isdir(directory):
            continue
        log_start, entries = read_log_entries(directory, state.high_watermark)
        lines.append({"type": "replica-log", "topic": topic, "partition": state.partition,
                      "replica": f"n{state.node}", "high_watermark": state.high_watermark,
                      "log_start_offset": log_start, "entries": entries})
    return lines


# --------------------------------------------------------------------------- hygiene


def _multiprocessing_helper(process: psutil.Process) -> bool:
    command = " ".join(process.cmdline())
    return "forkserver" in command or "resource_tracker" in command


def leftover_processes(wait_s: float = 3.0) -> list[dict[str, Any]]:
    """Live descendants of this process, after giving exiting ones `wait_s` to go."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for child in psutil.Process().children(recursive=True):
            try:
                if child.status() == psutil.STATUS_ZOMBIE or _multiprocessing_helper(child):
                    continue
                found.append({"pid": child.pid, "name": child.name()})
            except psutil.NoSuchProcess:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def leftover_segments(cluster_id: str) -> list[str]:
    return list_segments(cluster_prefix(cluster_id))
