"""What a leader knows of each follower: how far its log matches, and how to send it more.

A follower is in one of three states (etcd-io/raft's tracker.Progress):

- PROBE: the leader does not know where the follower's log matches its own. It sends one append
  at `next_index - 1` and waits for the answer (or the next heartbeat) before sending another;
  refusals walk `next_index` back, a whole divergent term per round trip (the reject hint).
- REPLICATE: the follower matched; the leader pipelines appends, moving `next_index` past what
  it sent, with at most `inflight_appends_max` unanswered. An append unanswered for a whole
  heartbeat interval is presumed lost: back to PROBE from `match_index + 1`.
- SNAPSHOT: the entries the follower needs are compacted away; a snapshot is on its way. Nothing
  else is sent until it is answered, or presumed lost after an election timeout.

Invariant: match_index < next_index, and match_index only grows within one leadership — except
for a follower that says it lost its log (a wiped disk, docs/raft.md §7): its match goes back.
"""

from __future__ import annotations

from collections import deque
from enum import Enum


class ReplicationState(str, Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Progress:
    __slots__ = ("match_index", "next_index", "state", "inflight", "probe_sent", "recent_active",
                 "snapshot_index", "snapshot_sent_ns", "snapshot_sequence", "match_at_last_heartbeat", "commit_told",
                 "acks_from")

    def __init__(self, next_index: int) -> None:
        self.match_index = 0
        self.next_index = next_index
        self.state = ReplicationState.PROBE
        self.inflight: deque[int] = deque()  # last index of each unanswered append with entries
        self.probe_sent = False
        self.recent_active = False  # heard from since the last check-quorum round
        self.snapshot_index = 0
        self.snapshot_sent_ns = 0
        self.snapshot_sequence = 0  # of the last snapshot chunk sent: only its answer asks for the next
        self.match_at_last_heartbeat = 0
        self.commit_told = 0  # the highest commit index an append let this follower reach
        self.acks_from = 0  # acknowledgements of requests sent before this sequence are void

    def __repr__(self) -> str:
        return (f"Progress({self.state.value}, match={self.match_index}, next={self.next_index}, "
                f"inflight={len(self.inflight)})")

    def matched(self, index: int) -> bool:
        """Record a success up to `index`; True when the match index moved."""
        moved = index > self.match_index
        if moved:
            self.match_index = index
        if index + 1 > self.next_index:
            self.next_index = index + 1
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
        self.probe_sent = False
        if self.state is ReplicationState.PROBE:
            self.become_replicate()
        elif self.state is ReplicationState.SNAPSHOT and index >= self.snapshot_index:
            self.become_replicate()
        return moved

    def forget_match(self, held: int, next_sequence: int) -> None:
        """The follower lost its log: it holds at most `held`, whatever it acknowledged before,
        and only answers to requests from `next_sequence` on can say what it holds now (an
        acknowledgement its lost log sent may still be on its way)."""
        self.acks_from = next_sequence
        self.match_index = min(self.match_index, held)
        self.match_at_last_heartbeat = min(self.match_at_last_heartbeat, held)
        self.commit_told = min(self.commit_told, held)
        self.become_probe()

    def become_probe(self) -> None:
        self.state = ReplicationState.PROBE
        self.next_index = self.match_index + 1
        self.inflight.clear()
        self.probe_sent = False

    def become_replicate(self) -> None:
        self.state = ReplicationState.REPLICATE
        self.next_index = self.match_index + 1
        self.inflight.clear()

    def become_snapshot(self, snapshot_index: int, now_ns: int) -> None:
        self.state = ReplicationState.SNAPSHOT
        self.snapshot_index = snapshot_index
        self.snapshot_sent_ns = now_ns
        self.inflight.clear()

    def told(self, commit_index: int, last_index: int) -> None:
        """An append ending at `last_index` carried `commit_index`: the follower may commit up to
        the smaller of the two."""
        self.commit_told = max(self.commit_told, min(commit_index, last_index))

    def sent(self, last_index: int, inflight_max: int) -> None:
        """An append ending at `last_index` went out."""
        if self.state is ReplicationState.REPLICATE:
            self.next_index = last_index + 1
            self.inflight.append(last_index)
            while len(self.inflight) > inflight_max:  # cannot happen when callers check `paused`
                self.inflight.popleft()
        else:
            self.probe_sent = True

    def paused(self, inflight_max: int) -> bool:
        if self.state is ReplicationState.PROBE:
            return self.probe_sent
        if self.state is ReplicationState.REPLICATE:
            return len(self.inflight) >= inflight_max
        return True


def quorum_index(indices: list[int], quorum: int) -> int:
    """The largest index that at least `quorum` of `indices` reach."""
    return sorted(indices, reverse=True)[quorum - 1]
