"""What the console saw, over time: per partition its leader, epoch, high watermark and each
replica's log end; per group and partition the committed offset. The explain view asks it "when
did each of these first pass offset X?".

Only changes are kept (a sample equal to the previous one is not stored), up to
`SAMPLES_PER_PARTITION_MAX` per partition, oldest dropped first, so a quiet partition remembers
hours and a busy one at least minutes. An answer is always an interval: the offset was passed
after the last sample that had not passed it and by the first that had. Its width is the
resolution of the facts — replicas report their offsets in heartbeats (every 200 ms) and the
console polls metadata every refresh — and is given with every answer. When the first sample the
journal still holds had already passed the offset, the answer says so instead of inventing a time.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import msgspec

SAMPLES_PER_PARTITION_MAX = 4096
COMMIT_SAMPLES_MAX = 1024


class PartitionSample(NamedTuple):
    time_ns: int
    leader: int
    leader_epoch: int
    high_watermark: int
    log_ends: tuple[tuple[int, int], ...]  # (node, log end offset), sorted by node


class Passage(msgspec.Struct, kw_only=True):
    """When a position first passed an offset, as far as the console saw."""

    passed: bool  # passed by the newest sample
    after_ns: int | None = None  # the last sample that had not passed it (None: not seen before)
    by_ns: int | None = None  # the first sample that had
    before_watching: bool = False  # it had already passed when the journal's oldest sample was taken
    watched_since_ns: int | None = None


def first_passage(samples: list[tuple[int, int]], offset: int) -> Passage:
    """`samples`: (time, position) oldest first; a position passes `offset` when it exceeds it."""
    if not samples:
        return Passage(passed=False)
    oldest = samples[0][0]
    after = None
    for time_ns, position in samples:
        if position > offset:
            return Passage(
                passed=True,
                after_ns=after,
                by_ns=time_ns,
                before_watching=after is None,
                watched_since_ns=oldest,
            )
        after = time_ns
    return Passage(passed=False, after_ns=after, watched_since_ns=oldest)


class Journal:
    def __init__(
        self, samples_max: int = SAMPLES_PER_PARTITION_MAX, commits_max: int = COMMIT_SAMPLES_MAX
    ) -> None:
        self.samples_max = samples_max
        self.commits_max = commits_max
        self._partitions: dict[tuple[str, int], deque[PartitionSample]] = {}
        self._commits: dict[tuple[str, str, int], deque[tuple[int, int]]] = {}

    def record_partition(self, topic: str, partition: int, sample: PartitionSample) -> None:
        history = self._partitions.setdefault((topic, partition), deque(maxlen=self.samples_max))
        if history and history[-1][1:] == sample[1:]:
            return
        history.append(sample)

    def record_commit(self, group: str, topic: str, partition: int, time_ns: int, offset: int) -> None:
        history = self._commits.setdefault((group, topic, partition), deque(maxlen=self.commits_max))
        if history and history[-1][1] == offset:
            return
        history.append((time_ns, offset))

    def samples(self, topic: str, partition: int) -> list[PartitionSample]:
        return list(self._partitions.get((topic, partition), ()))

    def groups_of(self, topic: str, partition: int) -> list[str]:
        return sorted(group for group, name, number in self._commits if (name, number) == (topic, partition))

    def commit_passage(self, group: str, topic: str, partition: int, offset: int) -> Passage:
        """Committed offsets are the next offset to read: a commit past X is one above X."""
        return first_passage(list(self._commits.get((group, topic, partition), ())), offset)

    def high_watermark_passage(self, topic: str, partition: int, offset: int) -> Passage:
        return first_passage(
            [(sample.time_ns, sample.high_watermark) for sample in self.samples(topic, partition)], offset
        )

    def replica_passage(self, topic: str, partition: int, node: int, offset: int) -> Passage:
        positions = [
            (sample.time_ns, dict(sample.log_ends)[node])
            for sample in self.samples(topic, partition)
            if node in dict(sample.log_ends)
        ]
        return first_passage(positions, offset)

    def forget(self, keep: set[tuple[str, int]]) -> None:
        """Drop partitions that no longer exist (a deleted topic). Called from the fast thread
        while the slow one records commits: `list(dict)` copies the keys without letting another
        thread in, where iterating the dict itself could meet a change of size."""
        for key in list(self._partitions):
            if key not in keep:
                self._partitions.pop(key, None)
        for key in list(self._commits):
            if key[1:] not in keep:
                self._commits.pop(key, None)

    def forget_groups(self, keep: set[str]) -> None:
        """Drop the commits of groups that no longer exist: groups made and deleted under ever-new
        names kept theirs for good."""
        for key in list(self._commits):
            if key[0] not in keep:
                self._commits.pop(key, None)
