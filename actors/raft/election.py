"""Elections: timeouts, pre-vote, votes, the leader lease, and leadership transfer.

Rules (Raft §5.2 and §5.4.1, with the thesis's §9.6 pre-vote and etcd-io/raft's check-quorum):

- A follower that has heard from no leader for its randomized election timeout campaigns. With
  pre-vote it first asks, without changing any term, whether a majority would vote for it at
  term + 1; only then does it raise its term, vote for itself and ask for real votes. A node that
  cannot win (cut off, or with a stale log) therefore never raises its term and never disrupts.
- A voter grants at most one vote per term, to a candidate whose log is at least as up to date as
  its own (last term, then last index), and the vote is durable before the answer leaves: every
  answer is released only after the raft log's flush (`AfterFlush`, see node.py).
- With check-quorum, a node that heard from a leader within the minimum election timeout (the
  leader itself included) ignores vote and pre-vote requests of a higher term: while a healthy
  leader exists, a rejoining node cannot depose it. A quiet leader's lease lasts as much longer
  as its announced heartbeat interval exceeds the usual one (docs/raft.md §6.1); a dropped
  connection to the leader ends it at once (node.py, `_on_disconnected`). A leadership transfer (`RaftTimeoutNow`) is
  the one exception, since the leader itself asked for it.
"""

from __future__ import annotations

from actors.raft.config import RaftConfig
from actors.raft.progress import Progress
from actors.raft.roles import HEARTBEAT_TIMER, QUORUM_TIMER, Role
from actors.raft_messages import RaftTimeoutNow, RaftVoteRequest, RaftVoteResponse
from storage.raft_log import ENTRY_NOOP, RaftEntry


class ElectionRules:
    """Mixed into RaftNode; uses its state (term, role, log, ...) and its helpers."""

    config: RaftConfig

    # ------------------------------------------------------------------ campaigning

    def _campaign(self, now_ns: int, *, transfer: bool = False) -> None:
        if self.config.pre_vote and not transfer:
            self._become_pre_candidate(now_ns)
        else:
            self._become_candidate(now_ns, transfer=transfer)

    def _become_pre_candidate(self, now_ns: int) -> None:
        self._set_role(Role.PRE_CANDIDATE, leader_id=0)
        self.votes = {self.id: True}
        self._reset_election_deadline(now_ns)
        if self._won(self.votes):
            self._become_candidate(now_ns)
            return
        self._ask_for_votes(self.term + 1, pre_vote=True, transfer=False)

    def _become_candidate(self, now_ns: int, *, transfer: bool = False) -> None:
        self._set_term(self.term + 1, vote=self.id)
        self._set_role(Role.CANDIDATE, leader_id=0)
        self.votes = {self.id: True}
        self._reset_election_deadline(now_ns)
        if self._won(self.votes):
            self._become_leader(now_ns)
            return
        self._ask_for_votes(self.term, pre_vote=False, transfer=transfer)

    def _ask_for_votes(self, term: int, *, pre_vote: bool, transfer: bool) -> None:
        last_index, last_term = self.log.last_index, self.log.last_term
        for peer in self.config.peers:
            self._send(peer, RaftVoteRequest(source=self.id, destination=peer, term=term, last_log_index=last_index,
                                             last_log_term=last_term, pre_vote=pre_vote, transfer=transfer))

    def _become_leader(self, now_ns: int) -> None:
        self._set_role(Role.LEADER, leader_id=self.id)
        self.votes = {}
        self.transfer_target = 0
        self.idle, self._quiet_rounds = False, 0
        next_index = self.log.last_index + 1
        self.progress = {peer: Progress(next_index) for peer in self.config.peers}
        self._cancel_election_timer()
        self._set_timer(HEARTBEAT_TIMER, now_ns + self._heartbeat_ns)
        self._set_timer(QUORUM_TIMER, now_ns + self._election_timeout_ns)
        # Raft §8: a new leader commits an entry of its own term at once; only through it do the
        # entries of earlier terms it holds become committed (§5.4.2).
        self.log.append([RaftEntry(index=next_index, term=self.term, kind=ENTRY_NOOP)])
        self._broadcast_append(now_ns)
        self._maybe_commit(now_ns)

    def _won(self, votes: dict[int, bool]) -> bool:
        return sum(1 for granted in votes.values() if granted) >= self.config.quorum

    def _lost(self, votes: dict[int, bool]) -> bool:
        refusals = sum(1 for granted in votes.values() if not granted)
        return refusals > len(self.config.voters) - self.config.quorum

    # ------------------------------------------------------------------ the lease

    def _in_lease(self, now_ns: int) -> bool:
        """Whether a leader is known to be alive, so a higher-term vote request must be ignored."""
        if not self.config.check_quorum:
            return False
        if self.role is Role.LEADER:
            return True
        return self.leader_id != 0 and now_ns - self.last_leader_contact_ns < self._election_timeout_ns + self._lease_extra_ns

    # ------------------------------------------------------------------ voting

    def _on_vote_request(self, request: RaftVoteRequest, now_ns: int) -> None:
        up_to_date = (request.last_log_term, request.last_log_index) >= (self.log.last_term, self.log.last_index)
        if self.rejoining:
            # Its lost log might have held entries the candidate lacks: a vote now could elect a
            # leader without a committed entry (docs/raft.md §7, "a wiped voter").
            self._count("votes_refused_rejoining")
        elif self._can_vote_for(request) and up_to_date:
            if not request.pre_vote:
                self._set_term(self.term, vote=request.source)
                self._reset_election_deadline(now_ns)
            self._send(request.source, RaftVoteResponse(source=self.id, destination=request.source,
                                                        term=request.term, granted=True, pre_vote=request.pre_vote))
            return
        self._count("votes_refused")
        self._send(request.source, RaftVoteResponse(source=self.id, destination=request.source, term=self.term,
                                                    granted=False, pre_vote=request.pre_vote))

    def _can_vote_for(self, request: RaftVoteRequest) -> bool:
        """One vote per term (§5.2); a pre-vote for a later term binds nothing."""
        if self.voted_for == request.source:
            return True
        if self.voted_for == 0 and self.leader_id == 0:
            return True
        return request.pre_vote and request.term > self.term

    def _on_vote_response(self, response: RaftVoteResponse, now_ns: int) -> None:
        if self.role is Role.PRE_CANDIDATE and response.pre_vote:
            expected_term = self.term + 1 if response.granted else self.term
        elif self.role is Role.CANDIDATE and not response.pre_vote:
            expected_term = self.term
        else:
            self._count("stale_vote_responses")
            return
        if response.term != expected_term:
            self._count("stale_vote_responses")
            return
        self.votes.setdefault(response.source, response.granted)
        if self._won(self.votes):
            if self.role is Role.PRE_CANDIDATE:
                self._become_candidate(now_ns)
            else:
                self._become_leader(now_ns)
        elif self._lost(self.votes):
            self._become_follower(self.term, 0, now_ns)

    # ------------------------------------------------------------------ leadership transfer

    def transfer_leadership(self, target: int, now_ns: int) -> list:
        """Hand leadership to `target` (thesis §3.10): bring it up to date, then tell it to
        campaign at once. Proposals are refused (BUSY) until it is done or an election timeout
        passes. Returns effects; on a non-leader it does nothing."""
        if target not in self.config.voters or target == self.id:
            raise ValueError(f"cannot transfer leadership to {target}: voters are {sorted(self.config.voters)}")
        if self.role is Role.LEADER:
            self._wake(now_ns)
            self.transfer_target = target
            self.transfer_deadline_ns = now_ns + self._election_timeout_ns
            self._continue_transfer(target, now_ns)
        return self._release()

    def _continue_transfer(self, peer: int, now_ns: int) -> None:
        if self.transfer_target != peer:
            return
        if self.progress[peer].match_index == self.log.last_index:
            self._send(peer, RaftTimeoutNow(source=self.id, destination=peer, term=self.term))
        else:
            self._send_append(peer, now_ns)

    def _on_timeout_now(self, message: RaftTimeoutNow, now_ns: int) -> None:
        if self.role is Role.FOLLOWER and message.source == self.leader_id:
            self._campaign(now_ns, transfer=True)
        else:
            self._count("stale_timeout_now")
