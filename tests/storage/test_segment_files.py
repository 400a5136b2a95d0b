"""A log keeps a bounded number of segment files open (storage/segment_files.py).

A segment used to keep its file open: a topic with a tiny segment_bytes starts a segment per
batch, and under a limit of 256 descriptors the 250th append failed with EMFILE, an untyped error
that stopped the replica; a restart could not open the segments either."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap

from storage.batch import encode_batch
from storage.config import LogConfig
from storage.log import PartitionLog
from storage.memory import MemoryFileSystem


def batch(index: int) -> bytes:
    return bytes(encode_batch([(0, b"k", f"value-{index}".encode(), None)], 1_000 + index))


def test_a_log_of_a_segment_per_batch_under_a_small_descriptor_limit_appends_reopens_and_reads_everything(tmp_path):
    """In a child process limited to 128 descriptors: 1,000 segments, then the log reopened, every
    record read back."""
    script = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
        sys.path.insert(0, {os.getcwd()!r})
        from storage.batch import decode_records, encode_batch, iter_batches
        from storage.config import LogConfig
        from storage.fs import OsFileSystem
        from storage.log import PartitionLog
        config = LogConfig(segment_bytes=1)
        log = PartitionLog.open({str(tmp_path)!r}, config, fs=OsFileSystem(), now_ms=0)
        for index in range(1000):
            log.append_producer_batch(bytes(encode_batch([(0, b"k", f"value-{{index}}".encode(), None)], 1000)), 0, index)
        log.flush()
        log.close()
        log = PartitionLog.open({str(tmp_path)!r}, config, fs=OsFileSystem(), now_ms=0)
        values = []
        offset = 0
        while offset < log.log_end_offset:
            data = log.read(offset, 1 << 20)
            for position, header in iter_batches(data):
                values += [record[2].decode() for record in decode_records(data, header, position)]
                offset = header.next_offset
        print(len(values), values[0], values[-1], log.log_end_offset)
    """)
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)

    assert finished.returncode == 0, finished.stderr[-2000:]
    assert finished.stdout.split() == ["1000", "value-0", "value-999", "1000"]
    assert len([name for name in os.listdir(tmp_path) if name.endswith(".log")]) == 1000


def test_files_closed_while_unused_lose_nothing_a_sync_made_durable():
    fs = MemoryFileSystem()
    config = LogConfig(segment_bytes=1, open_segments_max=4)
    log = PartitionLog.open("/log", config, fs=fs, now_ms=0)
    for index in range(40):
        log.append_producer_batch(batch(index), 0, index)
    log.flush()

    reopened = log._files.reopened
    assert log._files.open_count <= 4
    assert log.read(3, 1 << 20), "an old segment is read by opening its file again"
    assert log._files.reopened > reopened and log._files.open_count <= 4
    fs.crash()
    after_crash = PartitionLog.open("/log", config, fs=fs, now_ms=0)
    assert after_crash.log_end_offset == 40 and after_crash.recovery.segments == 40
