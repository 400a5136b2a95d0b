"""Whether a voter of `railmq node` that starts with an empty log joins a quorum that formed
without it (docs/raft.md §7): then its log is a lost one, and it starts `rejoining` (it neither
votes nor campaigns until a leader has caught it up).

Another machine's data directory cannot be looked at, as `railmq up` looks at its own nodes'
(railmq/cluster.py), so the other voters are asked (`ControllerStatusRequest`). Only answers
decide. One voter with a term or an entry says the quorum formed. Voters with empty logs say it
never did once, with this one, they are a majority: a new cluster forms with a majority of its
voters, the others join later (docs/deploy.md). Silence decides nothing: a node whose disk was
replaced, started while the others were down, had heard nobody within a second a voter and voted
as a new voter; with a voter that lacked the last entry it had helped commit, it elected that
voter and lost the entry. Still open: a wiped voter that hears only from voters that never held
any entry (down since before the quorum's first one) takes the quorum for a new one; waiting for
every voter instead would keep a new cluster from forming until its last voter starts.

While it waits it answers for itself, on its own voter address, that its log is empty: the voters
of a new cluster started together each wait for the others' answers, and none waits for a voter
that is itself waiting.
"""

from __future__ import annotations

import logging
import threading
import time

import zmq

from actors.limits import MESSAGE_FRAMES_MAX
from actors.messages import ControllerStatusRequest, ControllerStatusResponse
from transport.codec import Codec, DecodeFailure
from transport.frames import discard, receive
from transport.rpc import RequestTimeout, RpcClient

STATUS_TIMEOUT_MS = 1_000  # per voter and round
ROUND_PAUSE_S = 0.5
SAY_WAITING_EVERY_S = 10.0
ANSWER_BYTES_MAX = 64 * 1024  # a status request is a few dozen bytes
DISCARD_SLICE_FRAMES = 4096

log = logging.getLogger("railmq.node")


class QuorumUndecided(RuntimeError):
    """The check was stopped before enough voters answered."""


class VoterAddressTaken(RuntimeError):
    """Another process listens on this voter's address."""


def empty_answers_needed(voters: int) -> int:
    """Other voters with empty logs that, with this one, are a majority."""
    return voters // 2


def judge(answers: dict[int, ControllerStatusResponse], voters: int) -> bool | None:
    """True: the quorum formed; False: it never did; None: not known yet."""
    if any(answer.term > 0 or answer.commit_index > 0 or answer.last_index > 0 for answer in answers.values()):
        return True
    if len(answers) >= empty_answers_needed(voters):
        return False
    return None


class FormedCheck:
    def __init__(self, own_endpoint: str, others: dict[int, str], voters: int) -> None:
        self.own_endpoint = own_endpoint  # where this voter will listen: bound meanwhile to answer
        self.others = dict(others)
        self.voters = voters

    def run(self, stop: threading.Event | None = None) -> bool:
        """Ask until the answers decide (`QuorumUndecided` if `stop` is set first)."""
        if self.voters <= 1:
            return False
        answers: dict[int, ControllerStatusResponse] = {}
        said_at = time.monotonic()
        context = zmq.Context()
        rpc = RpcClient(identity="formed-check", context=context)
        answering = EmptyLogAnswers(context, self.own_endpoint)
        try:
            while True:
                for node, endpoint in self.others.items():
                    if node not in answers:
                        answer = _ask(rpc, endpoint)
                        if answer is not None:
                            answers[node] = answer
                verdict = judge(answers, self.voters)
                if verdict is not None:
                    return verdict
                if time.monotonic() - said_at >= SAY_WAITING_EVERY_S:
                    said_at = time.monotonic()
                    silent = sorted(set(self.others) - set(answers))
                    log.warning("waiting for voters %s to say whether the quorum formed (this voter's log is "
                                "empty: lost, or a new cluster's)", silent)
                if (stop.wait(ROUND_PAUSE_S) if stop is not None else time.sleep(ROUND_PAUSE_S)):
                    raise QuorumUndecided(f"stopped before voters {sorted(set(self.others) - set(answers))} "
                                          "answered")
        finally:
            rpc.close()
            answering.close()
            context.destroy(linger=0)  # the voter binds the same address next


def _ask(rpc: RpcClient, endpoint: str) -> ControllerStatusResponse | None:
    try:
        answer = rpc.request(endpoint, ControllerStatusRequest(correlation_id=0), STATUS_TIMEOUT_MS, fail_fast=True)
    except RequestTimeout:
        return None
    return answer if isinstance(answer, ControllerStatusResponse) and not answer.error else None


class EmptyLogAnswers:
    """This voter's address while it decides, in a thread of its own so that it answers while the
    check waits for answers: every status request is answered "empty log"."""

    def __init__(self, context: zmq.Context, endpoint: str) -> None:
        self.codec = Codec(ANSWER_BYTES_MAX)
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, ANSWER_BYTES_MAX)
        try:
            self.socket.bind(endpoint)
        except zmq.ZMQError as error:
            self.socket.close(linger=0)
            raise VoterAddressTaken(f"{endpoint}: {error.strerror}") from None
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="formed-check-answers", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while not self.closing.is_set():
                if self.socket.poll(100, zmq.POLLIN):
                    self._answer()
        finally:
            self.socket.close(linger=0)

    def _answer(self) -> None:
        (routing, *frames), more = receive(self.socket, MESSAGE_FRAMES_MAX)
        if more:  # no status request has that many frames: dropped, a slice at a time
            while not discard(self.socket, DISCARD_SLICE_FRAMES)[1]:
                pass
            return
        try:
            request = self.codec.decode(frames)
        except DecodeFailure:
            return
        if isinstance(request, ControllerStatusRequest):
            answer = ControllerStatusResponse(correlation_id=request.correlation_id, role="deciding")
            self.socket.send_multipart([routing, *self.codec.encode(answer)])

    def close(self) -> None:
        self.closing.set()
        self.thread.join()
