"""The Raft simulation's leader-completeness check (chaos/sim_raft_checks.py) says what Raft §5.4
promises, no more: an entry committed in term T is in the log of every leader of a term after T.
A stale leader of an earlier term may lack it (seed 25603 of the quorum simulation: the leader of
term 3, cut off, lacked the term-2 entries that the leader of term 4 then committed)."""

from __future__ import annotations

from types import SimpleNamespace

from actors.raft.roles import Role
from chaos.sim_raft_checks import DigestStateMachine, SafetyChecker
from storage.memory import MemoryFileSystem
from storage.raft_log import RaftEntry, RaftLog


def node(term: int, role: Role, entry_terms: list[int], commit: int) -> SimpleNamespace:
    log = RaftLog.open("/raft", fs=MemoryFileSystem())
    log.append([RaftEntry(index=index, term=entry_term) for index, entry_term in enumerate(entry_terms, start=1)])
    return SimpleNamespace(role=role, term=term, log=log, commit_index=commit, counters={})


def test_a_stale_leader_may_lack_what_a_later_term_committed_but_a_later_leader_may_not():
    checker = SafetyChecker()
    stale = node(3, Role.LEADER, [1], commit=0)  # led term 3 with the term-1 entry only
    checker.after_step(1, 1, stale, DigestStateMachine(), 0)
    checker.after_step(2, 1, node(4, Role.LEADER, [1, 2, 2, 4], commit=4), DigestStateMachine(), 1)
    checker.after_step(1, 1, stale, DigestStateMachine(), 2)  # still believes it leads term 3
    assert checker.problems == []

    checker.after_step(3, 1, node(5, Role.LEADER, [1, 3], commit=0), DigestStateMachine(), 3)
    assert checker.problems and "leader completeness" in checker.problems[0]
