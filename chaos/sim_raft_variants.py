"""Deliberately broken variants of the Raft core, to prove the Raft simulation catches them.

Each patches one rule out of the real code (actors/raft/) for the duration of a `with` block:

- `vote-twice`: a voter forgets that it already voted in this term, so two candidates of one term
  can both win (Raft §5.2's one vote per term);
- `commit-earlier-term`: the leader commits whatever index a majority's logs reach, whatever its
  term (the Figure 8 mistake §5.4.2 forbids);
- `vote-before-durable`: a vote's answer leaves at once instead of behind the flush of the term
  and vote, so a voter that crashes before its disk confirms can vote again in the same term;
- `vote-for-stale-log`: a voter grants its vote whatever the candidate's last entry, so a
  candidate missing a committed entry can win (the election restriction of §5.4.1).

tests/sim/test_raft_sim.py runs seeds with each until the simulation reports a violation; it must
within a bounded number of seeds.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import msgspec

RAFT_VARIANTS = ("vote-twice", "commit-earlier-term", "vote-before-durable", "vote-for-stale-log")


@contextlib.contextmanager
def broken_raft(variant: str) -> Iterator[None]:
    """Patch one rule out of the real code for the duration of the block."""
    from actors.raft.election import ElectionRules
    from actors.raft.replication import LeaderRules

    if variant == "vote-twice":  # a voter forgets it already voted in this term
        target, name = ElectionRules, "_can_vote_for"
        replacement = lambda self, request: True  # noqa: E731
    elif variant == "commit-earlier-term":  # counting replicas commits an entry of any term
        target, name = LeaderRules, "_may_commit"
        replacement = lambda self, index: True  # noqa: E731
    elif variant == "vote-before-durable":  # vote answers leave before the vote is on disk
        target, name = ElectionRules, "_on_vote_request"
        original_vote = ElectionRules._on_vote_request

        def replacement(self, request, now_ns):
            before = len(self._out)
            original_vote(self, request, now_ns)
            self._early.extend(self._out[before:])
            del self._out[before:]
    elif variant == "vote-for-stale-log":  # a vote ignores whether the candidate's log is up to date
        target, name = ElectionRules, "_on_vote_request"
        original_request = ElectionRules._on_vote_request

        def replacement(self, request, now_ns):  # the election restriction of §5.4.1, gone
            newest = msgspec.structs.replace(request, last_log_term=1 << 62, last_log_index=1 << 62)
            original_request(self, newest, now_ns)
    else:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(RAFT_VARIANTS)}")
    original = getattr(target, name)
    setattr(target, name, replacement)
    try:
        yield
    finally:
        setattr(target, name, original)
