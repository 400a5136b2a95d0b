"""The client engine's thread and the user's thread (transport/client_engine.py)."""

from __future__ import annotations

import os

import pytest

from transport.client_engine import ClientEngine


class Idle:
    name = "idle"

    def start(self, now_ns: int) -> list:
        return []

    def handle(self, message, sender, now_ns: int) -> list:
        return []

    def invariants(self) -> None:
        pass


@pytest.mark.timeout(30)
def test_a_stop_that_wakes_an_engine_already_gone_writes_to_no_descriptor(tmp_path):
    """`stop` sets the flag, then wakes the engine; an engine busy at that moment sees the flag,
    ends and closes its wake pipe first. The wake must then write nowhere: not fail on the closed
    descriptor (it did, with EBADF, out of a consumer's close) and not land in the files that took
    the pipe's descriptor numbers since."""
    engine = ClientEngine(Idle(), name="late-wake", on_notify=lambda kind, payload: None,
                          has_work=lambda: True)  # never sleeps: it sees the flag at once
    engine.start()
    wake = engine.wake
    taken: list[int] = []

    def wake_after_the_engine_ended(force: bool = False) -> None:
        engine._thread.join(10)
        assert not engine.alive
        taken.extend(os.open(tmp_path / f"file-{index}", os.O_CREAT | os.O_RDWR, 0o600) for index in range(2))
        wake(force)

    engine.wake = wake_after_the_engine_ended
    try:
        engine.stop()
    finally:
        for fd in taken:
            os.close(fd)
    assert engine.failure is None
    assert [(tmp_path / f"file-{index}").read_bytes() for index in range(2)] == [b"", b""]
