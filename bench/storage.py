"""Storage engine benchmark: partition-log appends, reads and crash recovery beside plain files.

    python -m bench.storage [--json PATH] [--quick] [--repeat N]

Appends are 1 KB records in ~1 MiB batches, with FlushPolicy.NEVER and EVERY_BATCH (fdatasync
per batch). Each sits beside a baseline measured in the same run on the same disk: the same
bytes written with `os.write`, without and with `fdatasync` after each write. Recovery is timed
on a log whose recovery-point checkpoint was removed, so open() must CRC-check every byte (the
crash case); a header-only walk of a flushed log is reported beside it. Everything is written
under a temporary directory that is removed at the end, and every figure is a median of repeats.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import zlib

from bench.common import median_of, parse_args, phase, report
from storage.batch import encode_batch
from storage.checkpoint import RECOVERY_POINT_NAME
from storage.fs import OsFileSystem
from storage.log import FlushPolicy, LogConfig, PartitionLog

MIB = 1024 * 1024
RECORD_BYTES = 1000
RECORDS_PER_BATCH = 1024  # 1 KB records: one batch is just over 1 MiB


def make_batch() -> bytes:
    value = os.urandom(RECORD_BYTES)
    records = [(index, b"key-%d" % index, value, None) for index in range(RECORDS_PER_BATCH)]
    return bytes(encode_batch(records, first_timestamp_ms=1_700_000_000_000))


class Bench:
    def __init__(self, root: str, batch: bytes, batches: int, fsync_batches: int) -> None:
        self.root = root
        self.batch = batch
        self.batches = batches
        self.fsync_batches = fsync_batches
        self.total_mb = len(batch) * batches / MIB
        self.fsync_total_mb = len(batch) * fsync_batches / MIB

    def _fresh(self, name: str) -> str:
        path = os.path.join(self.root, name)
        shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(path + ".bin"):
            os.unlink(path + ".bin")
        return path

    def plain_write(self, fsync: bool) -> float:
        path = self._fresh("plain") + ".bin"
        count = self.fsync_batches if fsync else self.batches
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            started = time.perf_counter()
            for _ in range(count):
                os.write(fd, self.batch)
                if fsync:
                    os.fdatasync(fd)
            seconds = time.perf_counter() - started
        finally:
            os.close(fd)
            os.unlink(path)
        return len(self.batch) * count / MIB / seconds

    def fs_append(self) -> float:
        """The file-system seam alone: OsFileHandle.append of the same bytes."""
        path = self._fresh("seam") + ".bin"
        handle = OsFileSystem().open(path, create=True)
        try:
            started = time.perf_counter()
            for _ in range(self.batches):
                handle.append(self.batch)
            seconds = time.perf_counter() - started
        finally:
            handle.close()
            os.unlink(path)
        return self.total_mb / seconds

    def log_append(self, policy: FlushPolicy, keep: bool = False) -> float:
        directory = self._fresh("log-" + policy.value)
        count = self.fsync_batches if policy is FlushPolicy.EVERY_BATCH else self.batches
        log = PartitionLog.open(directory, LogConfig(flush_policy=policy), now_ms=0)
        try:
            started = time.perf_counter()
            for index in range(count):
                log.append_producer_batch(self.batch, 1, index)
            seconds = time.perf_counter() - started
        finally:
            log.close()
        if not keep:
            shutil.rmtree(directory)
        return len(self.batch) * count / MIB / seconds

    def log_read(self) -> float:
        directory = os.path.join(self.root, "log-never")
        log = PartitionLog.open(directory, LogConfig(), now_ms=0)
        try:
            offset, total = 0, 0
            started = time.perf_counter()
            while offset < log.log_end_offset:
                data = log.read(offset, MIB)
                total += len(data)
                offset += RECORDS_PER_BATCH * (len(data) // len(self.batch))
            seconds = time.perf_counter() - started
        finally:
            log.close()
        return total / MIB / seconds

    def recovery(self, crash: bool) -> float:
        """Open the kept log; with `crash`, first remove its checkpoint so every CRC is checked."""
        directory = os.path.join(self.root, "log-never")
        if crash:
            os.unlink(os.path.join(directory, RECOVERY_POINT_NAME))
        started = time.perf_counter()
        log = PartitionLog.open(directory, LogConfig(), now_ms=0)
        seconds = time.perf_counter() - started
        report_ = log.recovery
        log.close()
        assert report_.truncated_bytes == 0 and not report_.corrupt_ranges, report_
        return self.total_mb / seconds


def crc_speed(batch: bytes) -> float:
    started = time.perf_counter()
    for _ in range(64):
        zlib.crc32(batch)
    return 64 * len(batch) / MIB / (time.perf_counter() - started)


def main() -> None:
    args = parse_args("partition log appends, reads and recovery beside plain-file writes")
    batches, fsync_batches = (32, 8) if args.quick else (256, 48)
    root = tempfile.mkdtemp(prefix="railmq-bench-storage-")
    try:
        bench = Bench(root, make_batch(), batches, fsync_batches)
        # Each repeat measures a baseline and its log figure back to back, so drift in the page
        # cache or the disk hits both alike; the medians are taken over the repeats.
        measures = {
            "plain_write_mb_per_s": lambda: bench.plain_write(False),
            "append_mb_per_s": lambda: bench.log_append(FlushPolicy.NEVER),
            "fs_append_mb_per_s": bench.fs_append,
            "plain_write_fsync_mb_per_s": lambda: bench.plain_write(True),
            "append_fsync_mb_per_s": lambda: bench.log_append(FlushPolicy.EVERY_BATCH),
        }
        samples: dict[str, list[float]] = {name: [] for name in measures}
        for run in range(max(1, args.repeat)):
            for name, measure in measures.items():
                phase(f"{name.replace('_', ' ')} (run {run + 1} of {max(1, args.repeat)})")
                samples[name].append(measure())
        figures = {name: statistics.median(values) for name, values in samples.items()}
        bench.log_append(FlushPolicy.NEVER, keep=True)  # the log that reads and recovery use
        figures["read_mb_per_s"] = median_of(args.repeat, bench.log_read, "reads")
        figures["recovery_flushed_mb_per_s"] = median_of(args.repeat, lambda: bench.recovery(crash=False),
                                                         "recovery of a flushed log")
        figures["recovery_mb_per_s"] = median_of(args.repeat, lambda: bench.recovery(crash=True),
                                                 "recovery after a crash")
        figures["crc32_mb_per_s"] = median_of(args.repeat, lambda: crc_speed(bench.batch), "CRC-32 speed")
        figures["append_ratio_to_plain"] = figures["append_mb_per_s"] / figures["plain_write_mb_per_s"]
        figures["append_fsync_ratio_to_plain"] = figures["append_fsync_mb_per_s"] / figures["plain_write_fsync_mb_per_s"]
        figures["fs_append_ratio_to_plain"] = figures["fs_append_mb_per_s"] / figures["plain_write_mb_per_s"]
        notes = {
            "batch_bytes": len(bench.batch),
            "records_per_batch": RECORDS_PER_BATCH,
            "record_value_bytes": RECORD_BYTES,
            "append_mib": round(bench.total_mb, 1),
            "append_fsync_mib": round(bench.fsync_total_mb, 1),
            "recovery": "recovery_mb_per_s CRC-checks every byte (checkpoint removed, as after a crash "
                        "before any flush); recovery_flushed_mb_per_s is the header walk of a flushed log",
            "append": "each producer append verifies the batch CRC (zlib CRC-32, crc32_mb_per_s) before "
                      "writing; the plain baseline writes without checking",
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report("storage", figures, args, notes)


if __name__ == "__main__":
    main()
