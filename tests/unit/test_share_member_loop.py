"""The share member loop (railmq/share_member_process.py) keeps working when an answer cannot be
given: a record whose lock this member lost (the group coordinator failed over, a session ended)
is delivered again to whoever holds it next — the loop must not die of it."""

from __future__ import annotations

import io
import threading

import pytest

from actors.errors import ErrorCode, RailmqError
from railmq.share_member_process import ShareMemberLoop, ShareMemberOptions


class Record:
    def __init__(self, offset: int) -> None:
        self.topic, self.partition, self.offset, self.delivery_count = "t", 0, offset, 1


class LostLocks:
    """A consumer that no longer holds the records it delivered (as after a membership loss)."""

    def __init__(self) -> None:
        self.answered: list[tuple[int, str]] = []
        self.committed = 0

    def acknowledge(self, record, kind="accept", delay_ms=0, error=""):
        if record.offset % 2:
            raise RailmqError(ErrorCode.INVALID_RECORD_STATE, "was not delivered to this member")
        self.answered.append((record.offset, kind))

    def commit(self):
        self.committed += 1
        return {}


def loop(handler) -> tuple[ShareMemberLoop, LostLocks]:
    options = ShareMemberOptions(bootstrap="tcp://x:1", group_id="g", topics=["t"], handler=None)
    member = ShareMemberLoop(options, handler, threading.Event(), io.StringIO())
    member.consumer = LostLocks()
    return member, member.consumer


def test_an_answer_for_a_lost_lock_is_a_warning_and_the_batch_goes_on(capsys):
    member, consumer = loop(lambda record: None)
    member._handle_batch([Record(offset) for offset in range(4)])
    assert consumer.answered == [(0, "accept"), (2, "accept")] and consumer.committed == 1
    assert "t/0@1 is no longer held by this member" in capsys.readouterr().err


def test_a_release_after_a_failed_handler_for_a_lost_lock_is_a_warning_too(capsys):
    def fails(record):
        raise ValueError("poison")

    member, consumer = loop(fails)
    member._handle_batch([Record(1), Record(2)])
    assert consumer.answered == [(2, "release")]
    assert "no longer held" in capsys.readouterr().err


def test_any_other_refusal_still_ends_the_loop():
    member, consumer = loop(lambda record: None)

    def refuses(record, kind="accept", delay_ms=0, error=""):
        raise RailmqError(ErrorCode.INVALID_REQUEST, "bad")

    consumer.acknowledge = refuses
    with pytest.raises(RailmqError):
        member._handle_batch([Record(0)])
