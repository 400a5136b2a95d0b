"""A fetch refused with an error no retry will cure (a request the leader calls invalid, a code
this version does not know) is told to the user — once per streak, through `poll` — and asked
again slowly; before, the consumer retried it every 100 ms for ever and the user saw nothing
but an empty poll. Errors a retry does cure (a moved leader, a fenced epoch, a damaged leader's
storage) stay silent, as in Kafka's consumer."""

from __future__ import annotations

import pytest

from actors.consumer_client import RETRY_BACKOFF_MS
from actors.errors import ErrorCode
from actors.messages import FetchRequest
from tests.unit.actor_harness import notices
from tests.unit.test_consumer_client import Stage


def refused_for_a_second(stage: Stage, first: FetchRequest, code: int) -> tuple[list, int]:
    told, fetches, request = [], 0, first
    for _ in range(100):
        if request is not None:
            fetches += 1
            told += notices(stage.answer_fetch(request, error=code), "partition-error")
        stage.harness.advance(10)
        if stage.harness.received("bootstrap"):
            stage.metadata()
        sent = stage.sent(FetchRequest)
        request = sent[-1] if sent else None
    return told, fetches


@pytest.mark.parametrize("code", [ErrorCode.INVALID_REQUEST, 4242])
def test_an_error_no_retry_cures_is_told_once_and_asked_again_slowly(code):
    stage = Stage()
    told, fetches = refused_for_a_second(stage, stage.assigned_at(3), code)
    assert len(told) == 1 and told[0][:2] == ("orders", 0) and told[0][2].code == code, told
    assert fetches <= 1000 // (10 * RETRY_BACKOFF_MS) + 1, f"{fetches} fetches in a second"


@pytest.mark.parametrize("code", [ErrorCode.NOT_LEADER, ErrorCode.STORAGE_ERROR, ErrorCode.FENCED_LEADER_EPOCH])
def test_an_error_a_retry_cures_stays_silent_and_is_retried_after_the_backoff(code):
    stage = Stage()
    told, fetches = refused_for_a_second(stage, stage.assigned_at(3), code)
    assert told == [] and fetches >= 1000 // (10 * RETRY_BACKOFF_MS) + 2


def test_after_a_good_answer_the_next_streak_is_told_again():
    stage = Stage()
    first = stage.assigned_at(3)
    assert notices(stage.answer_fetch(first, error=ErrorCode.INVALID_REQUEST), "partition-error")
    stage.harness.advance(10 * RETRY_BACKOFF_MS + 10)
    stage.metadata()
    stage.harness.advance(10)
    second = stage.sent(FetchRequest)[-1]
    stage.answer_fetch(second)  # an empty, good answer ends the streak
    third = stage.sent(FetchRequest)[-1]
    assert notices(stage.answer_fetch(third, error=ErrorCode.INVALID_REQUEST), "partition-error")
