"""What the Raft simulation checks, and the state machine it replicates.

`DigestStateMachine` is a small state machine whose whole state is the count of entries applied
and a hash chain over them (plus, for unit tests, the commands themselves): two replicas that
applied different entries at any index end with different digests, and a snapshot carries the
digest, so a restored replica is checked against history as well.

`SafetyChecker` holds what the cluster as a whole has ever done and checks, after every step of
every node (Raft paper, Figure 3):

- Election Safety: at most one leader per term;
- Log Matching: if two logs hold an entry with the same index and term, they are identical up to
  it (checked as: each (index, term) names one entry, and one predecessor term, across all nodes);
- Leader Completeness: a leader's log holds every entry committed before its term (checked when
  it is elected, and whenever a commit index moves, against the current leaders);
- State Machine Safety: no two nodes apply different entries at one index (and a snapshot's
  digest is the digest of the history it claims to cover);
- plus: a node's commit index never moves back within an incarnation, and no node ever counted
  a protocol violation (two leaders in a term, a leader disputing a committed entry).

Two more checks need the simulation's view across crashes: `check_promises` (a restarted voter's
disk still holds the vote it granted and the entries it acknowledged) and `check_commit_survives`
(when a leader commits, no voter lacking the entry could still be elected).
"""

from __future__ import annotations

import hashlib

import msgspec

from actors.raft.roles import Role
from storage.raft_log import RaftEntry

_snapshot_codec = msgspec.msgpack.Decoder(tuple[int, bytes, list[bytes]])


class DigestStateMachine:
    def __init__(self, keep_commands: bool = True) -> None:
        self.applied_index = 0
        self.digest = b""
        self.keep_commands = keep_commands
        self.commands: list[bytes] = []
        self.applied: list[RaftEntry] = []  # this incarnation's deliveries, for the checker

    def apply(self, entry: RaftEntry) -> list:
        assert entry.index == self.applied_index + 1, f"entry {entry.index} applied after {self.applied_index}"
        self.applied_index = entry.index
        self.digest = chain(self.digest, entry)
        if self.keep_commands and entry.kind == 0:
            self.commands.append(entry.data)
        self.applied.append(entry)
        return []

    def snapshot(self) -> bytes:
        return msgspec.msgpack.encode((self.applied_index, self.digest, self.commands))

    def restore(self, data: bytes, index: int) -> None:
        applied_index, digest, commands = _snapshot_codec.decode(data)
        assert applied_index == index, f"snapshot of index {applied_index} restored as {index}"
        self.applied_index, self.digest, self.commands = applied_index, digest, list(commands)
        self.applied.clear()
        self.restored = (index, digest)  # for the checker


def chain(digest: bytes, entry: RaftEntry) -> bytes:
    return hashlib.blake2b(digest + msgspec.msgpack.encode(entry), digest_size=16).digest()


class SafetyChecker:
    def __init__(self) -> None:
        self.leaders: dict[int, int] = {}  # term -> the node that led it
        self.entries: dict[tuple[int, int], bytes] = {}  # (index, term) -> data
        self.previous_terms: dict[tuple[int, int], int] = {}  # (index, term) -> the term before it
        self.committed: dict[int, RaftEntry] = {}  # index -> the entry committed (or applied) there
        # index -> the term in which it was first seen committed: the committing leader's, as its
        # own step is checked first (a follower learns of a commit from that leader, in its term).
        self.commit_terms: dict[int, int] = {}
        self.digests: dict[int, bytes] = {0: b""}  # index -> the digest of the history up to it
        self.commit_seen: dict[tuple[int, int], int] = {}  # (node, incarnation) -> its commit index
        self.completeness_checked: dict[tuple[int, int], int] = {}  # (node, term) -> index checked up to
        self.counter_names: dict[tuple[int, int], int] = {}  # (node, incarnation) -> counters seen
        self.problems: list[str] = []

    def fail(self, text: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(text)

    def after_step(self, node_id: int, incarnation: int, node, machine: DigestStateMachine, now_ns: int) -> None:
        if node.role is Role.LEADER:
            other = self.leaders.setdefault(node.term, node_id)
            if other != node_id:
                self.fail(f"two leaders in term {node.term}: {other} and {node_id} (at {now_ns / 1e9:.3f} s)")
        self._check_log_matching(node_id, node.log)
        self._check_applied(node_id, machine, node.term)
        key = (node_id, incarnation)
        seen = self.commit_seen.get(key, 0)
        if node.commit_index < seen:
            self.fail(f"node {node_id}'s commit index moved back from {seen} to {node.commit_index}")
        elif node.commit_index > seen:
            self.commit_seen[key] = node.commit_index
            self._record_committed(node_id, node, seen)
        if node.role is Role.LEADER:
            self._check_leader_completeness(node_id, node)
        if len(node.counters) != self.counter_names.get(key, 0):  # a new counter: maybe a violation
            self.counter_names[key] = len(node.counters)
            violations = {name: count for name, count in node.counters.items() if name.startswith("protocol_violation")}
            if violations:
                self.fail(f"node {node_id} counted {violations}")

    def _check_log_matching(self, node_id: int, log) -> None:
        start = max(log.written_from, log.first_index)
        log.written_from = 1 << 62
        for index in range(start, log.last_index + 1):
            entry = log.entry(index)
            key = (index, entry.term)
            data = self.entries.setdefault(key, entry.data)
            previous = log.term_at(index - 1)
            if previous is not None:
                previous = self.previous_terms.setdefault(key, previous)
            if data != entry.data or (previous is not None and previous != log.term_at(index - 1)):
                self.fail(f"log matching: node {node_id} holds {entry} after term {log.term_at(index - 1)}; "
                          f"another log held {data!r} after term {previous} there")
                return

    def _record_committed(self, node_id: int, node, previous_commit: int) -> None:
        log = node.log
        for index in range(max(previous_commit + 1, log.first_index), node.commit_index + 1):
            entry = log.entry(index)
            known = self.committed.setdefault(index, entry)
            self.commit_terms.setdefault(index, node.term)
            if known != entry:
                self.fail(f"node {node_id} committed {entry} where {known} was committed")
                return

    def _check_leader_completeness(self, node_id: int, node) -> None:
        """Every entry committed in an earlier term is in this leader's log (checked once per
        index per leadership: at election for what was committed before, later for the rest).
        Committed in an earlier term, not of one: an entry of term 2 that the leader of term 4
        commits need not be in the log of a stale leader of term 3 (Raft §5.4's property)."""
        log = node.log
        key = (node_id, node.term)
        newest = max(self.committed, default=0)
        checked = self.completeness_checked.get(key, 0)
        for index in range(max(checked + 1, log.first_index), newest + 1):
            committed = self.committed.get(index)
            if committed is None or self.commit_terms[index] >= node.term:
                continue
            if index > log.last_index or log.entry(index) != committed:
                self.fail(f"leader completeness: node {node_id} leads term {node.term} without committed {committed}")
                break
        self.completeness_checked[key] = newest

    def _check_applied(self, node_id: int, machine: DigestStateMachine, term: int) -> None:
        restored = getattr(machine, "restored", None)
        if restored is not None:
            del machine.restored
            index, digest = restored
            if self.digests.setdefault(index, digest) != digest:
                self.fail(f"node {node_id} restored a snapshot at {index} whose digest is not the history's")
        if not machine.applied:
            return
        digest = self.digests.get(machine.applied[0].index - 1)
        for entry in machine.applied:
            committed = self.committed.setdefault(entry.index, entry)
            self.commit_terms.setdefault(entry.index, term)
            if committed != entry:
                self.fail(f"state machine safety: node {node_id} applied {entry} where {committed} was applied")
                break
        if digest is not None:
            for entry in machine.applied:
                digest = chain(digest, entry)
                known = self.digests.setdefault(entry.index, digest)
                if known != digest:
                    self.fail(f"state machine safety: node {node_id}'s history differs at {entry.index}")
                    break
        machine.applied.clear()


# ---------------------------------------------------------------------------- across crashes


def check_promises(checker: SafetyChecker, voter, log) -> None:
    """What a voter said before it crashed, its disk must still say: the vote it last granted,
    and every entry up to the last match index it acknowledged (Raft's persistence rule: the
    durable state is updated before responding). `voter` has `node_id`, `promised_vote`
    ((term, candidate) of the last vote it granted) and `promised_match`."""
    term, vote, _ = log.hard_state
    promised_term, candidate = voter.promised_vote
    if term < promised_term or (term == promised_term and vote != candidate):
        checker.fail(f"controller-{voter.node_id} granted its vote in term {promised_term} to {candidate}, but "
                     f"restarted with term {term} and vote {vote}")
    if log.last_index < voter.promised_match:
        checker.fail(f"controller-{voter.node_id} acknowledged entries up to {voter.promised_match}, but restarted "
                     f"with its log ending at {log.last_index}")


def check_commit_survives(checker: SafetyChecker, voters: dict, node: int, leader) -> None:
    """No voter lacking a just-committed entry could still be elected: if a majority would find
    its log at least as up to date as theirs, the entry could be lost (Figure 8). Votes are judged
    on logs alone, each elector's the durable one it would have after a crash (`durable_up`), so
    this can only over-report; correct Raft never trips it (the entry of the leader's term that
    commits sits on a majority whose logs are more up to date than any log lacking it). A voter
    marked rejoining (its disk was lost) refuses every vote and never campaigns, so it elects
    nobody and is elected by nobody."""
    index = leader.commit_index
    term = leader.log.term_at(index)
    for rival, voter in voters.items():
        if rival == node or not _lacks(voter, index, term) or marked_rejoining(voter):
            continue  # (a voter marked rejoining does not campaign either)
        up = (voter.raft.log.last_term, voter.raft.log.last_index) if voter.raft is not None else voter.durable_up
        electors = [other for other, elector in voters.items()
                    if other == rival or (elector.durable_up <= up and not marked_rejoining(elector))]
        if len(electors) >= len(voters) // 2 + 1:
            checker.fail(f"controller-{node} committed index {index} (term {term}) in term {leader.term}, but "
                         f"controller-{rival}, which lacks it, could still be elected by {electors}")
            return


def marked_rejoining(voter) -> bool:
    """Marked rejoining: running, as it stands now; down, as its disk will bring it back."""
    if voter.raft is not None:
        return voter.raft.rejoining
    return voter.wiped or voter.durable_rejoining


def _lacks(voter, index: int, term: int) -> bool:
    if voter.raft is None:
        return voter.durable_up[1] < index  # its disk ends before the index (else: unknown, say no)
    log = voter.raft.log
    if log.snapshot is not None and index <= log.snapshot.index:
        return False
    return log.term_at(index) != term
