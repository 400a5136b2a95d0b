"""Shared helpers for storage tests: small batches, logs on memory and on real files."""

from __future__ import annotations

import pytest

from storage.fs import OsFileSystem
from storage.log import LogConfig, PartitionLog
from storage.memory import MemoryFileSystem


@pytest.fixture
def memory_fs() -> MemoryFileSystem:
    return MemoryFileSystem()


@pytest.fixture
def small_config() -> LogConfig:
    return LogConfig(segment_bytes=1024, index_interval_bytes=128, retention_ms=None)


@pytest.fixture
def os_log(tmp_path, small_config):
    """A log on real files in a temporary directory, closed after the test."""
    log = PartitionLog.open(str(tmp_path / "partition"), small_config, fs=OsFileSystem(), now_ms=0)
    try:
        yield log
    finally:
        try:
            log.close()
        except Exception:
            pass
