"""The clock actors run on (transport/clock.py), and the supervisor's restarts: a step of the
machine's wall clock back must not stall every timer for as long as the step.

Before, actors' timers and the supervisor's restart delays ran on `time.time_ns`: with the clock
set back ten minutes, an election timeout, a session timeout or the restart of a killed replica
came ten minutes late. A test plays the stepping wall clock and checks each stays on time."""

from __future__ import annotations

import os
import time

import pytest

from actors.effects import SetTimer
from transport.actor_main import ActorSpec
from transport.clock import SLEW, SteadyClock
from transport.runtime import Runtime
from transport.supervisor import ManagedActor, Supervisor
from tests.unit.test_codec_runtime import Recorder

MS = 1_000_000
STEP_NS = 600 * 1000 * MS  # ten minutes


class Machine:
    """A wall clock and a monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.wall_ns = 1_700_000_000 * 1000 * MS
        self.monotonic_ns = 5 * 1000 * MS

    def advance(self, nanoseconds: int) -> None:
        self.wall_ns += nanoseconds
        self.monotonic_ns += nanoseconds

    def clock(self) -> SteadyClock:
        return SteadyClock(wall=lambda: self.wall_ns, monotonic=lambda: self.monotonic_ns)


def test_it_reads_the_wall_clock_while_the_wall_clock_runs_normally():
    machine = Machine()
    clock = machine.clock()
    readings = []
    for _ in range(5):
        machine.advance(7 * MS)
        readings.append(clock() - machine.wall_ns)
    assert readings == [0] * 5


def test_a_step_back_never_moves_it_back_and_it_slows_down_to_meet_the_wall_clock():
    machine = Machine()
    clock = machine.clock()
    before = clock()
    machine.wall_ns -= STEP_NS

    readings = []
    for _ in range(40):
        machine.advance(1000 * MS)
        readings.append(clock())

    steps = [later - earlier for earlier, later in zip([before, *readings], readings)]
    assert all(step == int(1000 * MS * (1 - SLEW)) for step in steps), "not a steady slower pace"
    assert readings[-1] - machine.wall_ns == STEP_NS - 40 * int(1000 * MS * SLEW)
    for _ in range(int(STEP_NS / (1000 * MS * SLEW)) + 2):
        machine.advance(1000 * MS)
        clock()
    assert clock() == machine.wall_ns, "it never met the wall clock again"


def test_a_step_forward_is_followed_at_once_as_time_that_passed():
    """A suspended machine resumed, or a clock set right: sessions did expire meanwhile."""
    machine = Machine()
    clock = machine.clock()
    clock()
    machine.wall_ns += STEP_NS
    assert clock() == machine.wall_ns


@pytest.mark.timeout(20)
def test_a_timer_fires_on_time_when_the_wall_clock_steps_back(zmq_context, monkeypatch):
    """The runtime as production builds it (no clock given) and as it was (the wall clock)."""
    shift = {"ns": 0}
    real = time.time_ns
    monkeypatch.setattr("transport.clock.time.time_ns", lambda: real() - shift["ns"])
    wall_stepping = lambda: real() - shift["ns"]  # noqa: E731

    def fired_after_ms(runtime: Runtime) -> float:
        journal: list = []
        runtime.actor = Recorder(journal)
        runtime.apply([SetTimer("beat", runtime.clock() + 50 * MS)])
        started = time.monotonic()
        shift["ns"] = STEP_NS
        try:
            while not journal and time.monotonic() - started < 2:
                runtime.step()
        finally:
            shift["ns"] = 0
            runtime.close()
        return (time.monotonic() - started) * 1000 if journal else float("inf")

    steady = fired_after_ms(Runtime(None, identity="steady", context=zmq_context))
    wall = fired_after_ms(Runtime(None, identity="wall", context=zmq_context, clock=wall_stepping))

    assert steady < 1000, f"the timer fired {steady:.0f} ms after it was set for 50 ms"
    assert wall == float("inf"), "the wall clock's step did not delay its timer: the test shows nothing"


def test_a_killed_actor_is_restarted_after_its_delay_when_the_wall_clock_steps_back(monkeypatch):
    class ExitedProcess:
        def __init__(self) -> None:
            self.sentinel, write_end = os.pipe()
            os.close(write_end)  # readable at once: the process has exited
            self.exitcode, self.pid = -9, 4242

        def join(self, timeout: float | None = None) -> None:
            os.close(self.sentinel)

    supervisor = Supervisor(restart_delay_ms=100)
    managed = ManagedActor(ActorSpec(kind="replica", name="replica/t/0/n1", cluster_id="c", data_dir="/x"))
    managed.wanted, managed.process = True, ExitedProcess()
    supervisor.actors[managed.name] = managed
    spawned: list[str] = []
    monkeypatch.setattr(supervisor, "_spawn", lambda actor: spawned.append(actor.name))
    monkeypatch.setattr(supervisor, "_unlink_segments", lambda actor: None)
    monkeypatch.setattr("transport.shm.unlink_segments", lambda prefix: None)

    assert supervisor.poll() == [managed]
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() - STEP_NS)
    time.sleep(0.2)
    supervisor.poll()

    assert spawned == [managed.name], "the restart waits for the wall clock to come back"
