"""Every single-file fault of a cleanly closed replica directory, as a replica's start meets it.

A directory of several segments is written and closed; then, one fault at a time, on a copy: a
file deleted, emptied, cut in half or at a batch boundary, grown with zeros or junk, or one bit of
one byte flipped (every header byte of a segment's first and last batch, every byte of the small
files). Each copy is opened as a replica process opens it (`open_replica_directory`). The promise:

- the open refuses with a typed error the actor turns into a refusal to start (`MetaMismatch`), or
- it says what it lost (damage, or a new directory: the replica is not elected and repairs), or
- it opens with the whole log, each offset readable or refused by its read's checks.

Never a crash (an untyped exception restarts the process for ever), and never an open that looks
clean while offsets it held are gone: that replica could be elected and serve less than was
acknowledged. Found this way: a deleted first segment (silently served from the next file) and
zeros after a sealed segment's last batch or a raised record count there (open refused the whole
directory as overlapping segments, for ever).
"""

from __future__ import annotations

from typing import Callable

from storage.batch import encode_batch, iter_batches
from storage.errors import CorruptLog, StorageError
from storage.log import LogConfig
from storage.memory import MemoryFileSystem
from storage.replica_meta import MetaMismatch, ReplicaHealth, ReplicaMeta, open_replica_directory

DIRECTORY = "/data/node-1/orders-0-abc"
META = ReplicaMeta(cluster_id="c1", topic="orders", topic_id=0xABC, partition=0, node=1, replicas=[1, 2, 3])
CONFIG = LogConfig(segment_bytes=4096)
HEADER_BYTES = 56
STAMPED = range(0, 12)  # base offset and leader epoch, outside the CRC
CHECKED = range(16, HEADER_BYTES)  # the rest of the header, inside it
SMALL_FILES = ("replica.meta", "replica.health", "leader-epoch-checkpoint", "recovery-point-checkpoint")


def golden() -> tuple[MemoryFileSystem, int]:
    fs = MemoryFileSystem()
    opened = open_replica_directory(fs, DIRECTORY, META, CONFIG, now_ms=0)
    opened.health.replace(ReplicaHealth())  # led from its first batch: a healthy replica, not a new one
    for index in range(24):
        records = [(0, f"k{index}-{i}".encode(), b"v" * 150, None) for i in range(3)]
        opened.log.append_producer_batch(bytes(encode_batch(records, 1_000)), 1 + index // 12, 0)
    end = opened.log.log_end_offset
    opened.log.note_high_watermark(end, 2)
    opened.log.close()
    return fs, end


def path(name: str) -> str:
    return f"{DIRECTORY}/{name}"


def batch_positions(data: bytes) -> list[int]:
    return [position for position, _ in iter_batches(data, verify=False)]


def faults(fs: MemoryFileSystem) -> list[tuple[str, Callable[[MemoryFileSystem], None]]]:
    found: list[tuple[str, Callable[[MemoryFileSystem], None]]] = []
    segments = sorted(name for name in fs.list_directory(DIRECTORY) if name.endswith(".log"))
    assert len(segments) >= 4, segments
    for index, name in enumerate(segments):
        data = fs.durable_content(path(name))
        positions = batch_positions(data)

        def rewrite(content: bytes, name: str = name) -> Callable[[MemoryFileSystem], None]:
            return lambda target: target.set_content(path(name), content)

        found += [
            (f"segment {index} lost", lambda target, name=name: target.destroy(path(name))),
            (f"segment {index} emptied", rewrite(b"")),
            (f"segment {index} cut in half", rewrite(data[:len(data) // 2])),
            (f"segment {index} grown with zeros", rewrite(data + bytes(4096))),
            (f"segment {index} grown by a header of zeros", rewrite(data + bytes(HEADER_BYTES))),
            (f"segment {index} grown with junk", rewrite(data + bytes(range(256)) * 2)),
        ]
        found += [(f"segment {index} cut at byte {cut}", rewrite(data[:cut])) for cut in positions[1:]]
        for label, start in (("first", positions[0]), ("last", positions[-1])):
            for at in (*STAMPED, *CHECKED):
                for bit in (0, 7):
                    flipped = bytearray(data)
                    flipped[start + at] ^= 1 << bit
                    found.append((f"segment {index} {label} batch byte {at} bit {bit}", rewrite(bytes(flipped))))
    for name in SMALL_FILES:
        data = fs.durable_content(path(name))

        def small(content: bytes, name: str = name) -> Callable[[MemoryFileSystem], None]:
            return lambda target: target.set_content(path(name), content)

        found += [(f"{name} lost", lambda target, name=name: target.destroy(path(name))),
                  (f"{name} emptied", small(b"")), (f"{name} cut in half", small(data[:len(data) // 2]))]
        for at in range(len(data)):
            flipped = bytearray(data)
            flipped[at] ^= 1
            found.append((f"{name} byte {at} bit 0", small(bytes(flipped))))
    return found


def outcome(fs: MemoryFileSystem, end: int) -> str:
    """refused, damage, whole, or what went wrong."""
    try:
        opened = open_replica_directory(fs, DIRECTORY, META, CONFIG, now_ms=0)
    except MetaMismatch:
        return "refused"
    except Exception as error:  # noqa: BLE001 - what the test is looking for
        return f"CRASH {type(error).__name__}: {error}"
    log = opened.log
    health = opened.health.current
    if health.damage or health.new_directory:
        return "damage"
    if (log.log_start_offset, log.log_end_offset) != (0, end):
        return f"SILENT: opened as healthy holding [{log.log_start_offset}, {log.log_end_offset}) of [0, {end})"
    offset = 0
    while offset < end:
        try:
            data = log.read(offset, 1 << 20)
        except CorruptLog as refused:  # a read's checks refuse it: found at run time, then repaired
            offset = refused.last_offset + 1
            continue
        except StorageError as error:
            return f"CRASH on read {type(error).__name__}: {error}"
        offset = max(header.next_offset for _, header in iter_batches(data, verify=False))
    return "whole"


def test_every_single_file_fault_is_refused_reported_or_read_whole():
    original, end = golden()
    cases = faults(original)
    wrong = []
    seen: dict[str, int] = {}
    for name, fault in cases:
        copy = original.clone()
        fault(copy)
        result = outcome(copy, end)
        seen[result.split(" ")[0].split(":")[0]] = seen.get(result.split(" ")[0].split(":")[0], 0) + 1
        if result not in ("refused", "damage", "whole"):
            wrong.append(f"{name}: {result}")
    assert not wrong, f"{len(wrong)} of {len(cases)} faults:\n" + "\n".join(wrong[:20])
    assert len(cases) > 800 and seen.get("damage", 0) > 100 and seen.get("whole", 0) > 10, seen
