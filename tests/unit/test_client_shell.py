"""ClientShell: the command/call plumbing Consumer and ShareConsumer share with their I/O thread.

Given a shell wired to a fake engine (it records submitted commands and may answer them at once,
the way the I/O thread would through `_on_notify`), when the caller sends commands and calls,
then each call gets its own token, returns the answer's value or raises its error, times out
with REQUEST_TIMED_OUT and forgets its slot, and a closed or broken client refuses new work."""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from actors.errors import ErrorCode, RailmqError
from actors.messages import ClientCommand
from railmq.client_shell import ClientShell


class FakeEngine:
    """Records commands; `answer(command)` returns the result notification to deliver, or None."""

    def __init__(self, shell: ClientShell, answer: Callable[[ClientCommand], Any] | None = None) -> None:
        self.shell = shell
        self.answer = answer
        self.commands: list[ClientCommand] = []
        self.failure: BaseException | None = None

    def submit(self, command: ClientCommand) -> None:
        self.commands.append(command)
        payload = self.answer(command) if self.answer is not None else None
        if payload is not None:
            self.shell._on_notify("result", payload)


class RecordingShell(ClientShell):
    _client_noun = "test client"

    def __init__(self, answer: Callable[[ClientCommand], Any] | None = None,
                 request_timeout_ms: int = 200) -> None:
        super().__init__(request_timeout_ms)
        self.notices: list[tuple[str, Any]] = []
        self._engine = FakeEngine(self, answer)  # type: ignore[assignment]

    def _handle_notice(self, kind: str, payload: Any) -> None:
        self.notices.append((kind, payload))

    def close(self) -> None:
        self._closed = True


def test_a_command_goes_to_the_engine_with_its_arguments_and_no_token():
    shell = RecordingShell()
    shell._command("seek", topic="orders", partition=1, offset=42)
    (command,) = shell._engine.commands
    assert command.command == "seek"
    assert command.arguments == {"topic": "orders", "partition": 1, "offset": 42}
    assert command.token == 0


def test_a_call_returns_the_value_answered_for_its_token_and_forgets_the_slot():
    shell = RecordingShell(answer=lambda command: (command.token, ["answer", command.arguments["n"]], None))
    assert shell.call("list-offsets", n=1) == ["answer", 1]
    assert shell.call("list-offsets", n=2) == ["answer", 2]
    assert [command.token for command in shell._engine.commands] == [1, 2]
    assert shell._results == {}


def test_a_call_raises_the_error_answered_for_it():
    refused = RailmqError(ErrorCode.ILLEGAL_GENERATION, "fenced")
    shell = RecordingShell(answer=lambda command: (command.token, None, refused))
    with pytest.raises(RailmqError) as raised:
        shell.call("commit")
    assert raised.value is refused
    assert shell._results == {}


def test_a_call_may_bring_its_own_token():
    shell = RecordingShell(answer=lambda command: (command.token, command.token, None))
    assert shell.call("acknowledge", token=77) == 77
    assert shell._engine.commands[0].token == 77


def test_an_unanswered_call_times_out_and_a_late_answer_is_dropped():
    shell = RecordingShell()
    with pytest.raises(RailmqError) as raised:
        shell.call("committed", timeout=0.05)
    assert raised.value.code == ErrorCode.REQUEST_TIMED_OUT
    assert "committed got no answer in time" in str(raised.value)
    assert shell._results == {}
    shell._on_notify("result", (shell._engine.commands[0].token, "late", None))
    assert shell._results == {} and shell.notices == []


def test_an_answer_from_the_engine_thread_wakes_the_waiting_call():
    shell = RecordingShell(request_timeout_ms=5_000)
    answerer = threading.Timer(0.05, lambda: shell._on_notify("result", (1, "done", None)))
    answerer.start()
    try:
        assert shell.call("close") == "done"
    finally:
        answerer.cancel()


def test_other_notices_go_to_the_subclass_and_results_do_not():
    shell = RecordingShell()
    shell._on_notify("records", ("orders", 0))
    shell._on_notify("result", (9, "nobody asked", None))
    assert shell.notices == [("records", ("orders", 0))]


def test_a_wait_raises_a_reported_error_before_timing_out():
    shell = RecordingShell()
    fatal = RailmqError(ErrorCode.UNKNOWN_MEMBER_ID, "the group forgot this member")
    shell._errors.append(fatal)
    with shell._ready, pytest.raises(RailmqError) as raised:
        shell._wait_until(lambda: False, 1.0, "never")
    assert raised.value is fatal


def test_a_wait_that_ignores_errors_times_out_with_its_message():
    shell = RecordingShell()
    shell._errors.append(RailmqError(ErrorCode.INVALID_REQUEST, "reported"))
    with shell._ready, pytest.raises(RailmqError) as raised:
        shell._wait_until(lambda: False, 0.02, "the position is not known yet", raise_errors=False)
    assert raised.value.code == ErrorCode.REQUEST_TIMED_OUT
    assert "the position is not known yet" in str(raised.value)
    assert len(shell._errors) == 1


def test_a_closed_client_refuses_commands_naming_itself():
    with RecordingShell() as shell:
        pass
    with pytest.raises(RailmqError, match="the test client is closed") as raised:
        shell._command("poll")
    assert raised.value.code == ErrorCode.INVALID_REQUEST
    assert shell._engine.commands == []


def test_a_client_whose_io_thread_failed_refuses_commands():
    shell = RecordingShell()
    shell._engine.failure = OSError("socket gone")
    with pytest.raises(RuntimeError, match="the test client's I/O thread failed") as raised:
        shell._command("poll")
    assert isinstance(raised.value.__cause__, OSError)


def test_a_client_shell_must_say_how_it_handles_notices_and_closes():
    class Incomplete(ClientShell):
        def close(self) -> None:
            pass

    with pytest.raises(TypeError, match="_handle_notice"):
        Incomplete(100)
