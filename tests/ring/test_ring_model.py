"""The ring against a plain queue model: random sizes and splits, wrap-around, full, empty.

The model knows only the documented rule for space (a record occupies its payload plus a
24-byte header, rounded up to 8 bytes) and FIFO order. Besides the answers of every call, it
checks after every step that each record handed out and not yet released still shows exactly
its bytes: a writer that overwrote unreleased bytes would be caught here.
"""

from __future__ import annotations

import os
import uuid
from collections import deque

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from transport.ring import RecordTooLarge, RingReader, RingWriter
from transport.shm import cluster_prefix, segment_name, unlink_segments

CLUSTER_ID = f"ring-model-{os.getpid()}"


def model_footprint(payload_bytes: int) -> int:
    return (24 + payload_bytes + 7) // 8 * 8


class RingAgainstQueue(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.name = segment_name(CLUSTER_ID, uuid.uuid4().hex, "ring")
        self.writer: RingWriter | None = None
        self.reader: RingReader | None = None
        self.unread: deque[bytes] = deque()
        self.held: list[tuple[memoryview, bytes]] = []  # read, not released

    @initialize(capacity_bytes=st.sampled_from([64, 72, 128, 200, 256, 1000, 4096]))
    def create(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.writer = RingWriter.create(self.name, capacity_bytes)
        self.reader = RingReader.attach(self.name)

    def used_by_model(self) -> int:
        records = [*self.unread, *(expected for _, expected in self.held)]
        return sum(model_footprint(len(record)) for record in records)

    @rule(data=st.data())
    def write(self, data) -> None:
        payload = data.draw(st.binary(max_size=self.capacity_bytes + 8))
        cuts = sorted(data.draw(st.lists(st.integers(0, len(payload)), max_size=3)))
        edges = [0, *cuts, len(payload)]
        buffers = [payload[start:end] for start, end in zip(edges, edges[1:])]
        footprint = model_footprint(len(payload))
        if footprint > self.capacity_bytes:
            with pytest.raises(RecordTooLarge):
                self.writer.try_write(*buffers)
        elif footprint > self.capacity_bytes - self.used_by_model():
            assert self.writer.try_write(*buffers) is False
        else:
            assert self.writer.try_write(*buffers) is True
            self.unread.append(payload)

    @rule()
    def read(self) -> None:
        record = self.reader.try_read()
        if not self.unread:
            assert record is None
            return
        expected = self.unread.popleft()
        assert bytes(record) == expected
        self.held.append((record, expected))

    @rule()
    def release(self) -> None:
        self.reader.release()
        self.held.clear()

    @precondition(lambda self: self.reader is not None)
    @rule()
    def restart_reader(self) -> None:
        """A new reader starts at the first unreleased record: held records come again."""
        self.reader.close()
        self.reader = RingReader.attach(self.name)
        self.unread.extendleft(expected for _, expected in reversed(self.held))
        self.held.clear()

    @invariant()
    def space_matches_the_model(self) -> None:
        if self.writer is not None:
            assert self.writer.used_bytes == self.used_by_model()
            assert self.writer.free_bytes == self.capacity_bytes - self.used_by_model()

    @invariant()
    def records_read_but_not_released_are_untouched(self) -> None:
        for view, expected in self.held:
            assert bytes(view) == expected

    def teardown(self) -> None:
        try:
            for end in (self.reader, self.writer):
                if end is not None:
                    end.close()
        finally:
            unlink_segments(cluster_prefix(CLUSTER_ID))


RingAgainstQueue.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestRingAgainstQueue = RingAgainstQueue.TestCase
