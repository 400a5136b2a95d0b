"""Fixtures for the ring tests: unique segment names that are always cleaned up, and spawned
processes that are always killed and reaped, even when a test fails."""

from __future__ import annotations

import multiprocessing
import os
import uuid

import pytest

from transport.shm import actor_prefix, list_segments, segment_name, unlink_segments


class SegmentNames:
    """Names for one test, all under one actor prefix so the test can sweep them."""

    def __init__(self) -> None:
        self.cluster_id = f"test-{os.getpid()}-{uuid.uuid4().hex}"
        self.actor_id = "ring-tests"
        self.prefix = actor_prefix(self.cluster_id, self.actor_id)

    def name(self, purpose: str = "ring") -> str:
        return segment_name(self.cluster_id, self.actor_id, purpose)

    def existing(self) -> list[str]:
        return list_segments(self.prefix)


@pytest.fixture
def segments():
    names = SegmentNames()
    try:
        yield names
    finally:
        unlink_segments(names.prefix)


@pytest.fixture
def ring_name(segments: SegmentNames) -> str:
    return segments.name()


class Processes:
    """Starts children with the spawn context and reaps every one of them afterwards."""

    def __init__(self) -> None:
        self.context = multiprocessing.get_context("spawn")
        self.started: list[multiprocessing.process.BaseProcess] = []

    def start(self, target, *args):
        process = self.context.Process(target=target, args=args, daemon=True)
        process.start()
        self.started.append(process)
        return process

    def pipe(self):
        return self.context.Pipe()

    def reap(self) -> None:
        for process in self.started:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)


@pytest.fixture
def processes():
    spawned = Processes()
    try:
        yield spawned
    finally:
        spawned.reap()
