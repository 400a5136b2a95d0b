"""Runs a client actor (producer or consumer logic) in a background I/O thread.

The user's thread never touches a socket: it hands work to the engine (`submit`) and reads
results that the actor's `Notify` effects deliver (`on_notify`, called in the engine thread).
The engine owns a ZeroMQ context of its own and drives the actor with the same `Runtime` as a
server actor, minus the ROUTER (clients only connect).

Waking the engine costs a pipe write, so callers that produce many small events (records) wake
it at most once per sleep: `wake()` writes only when the engine is asleep and not yet woken.
`pump` is a hook the owner provides to move work from its own structures (the producer's
accumulator) into the actor just before the engine sleeps; it returns the next deadline at which
it wants to be asked again (a linger timer), or None. `has_work` is asked after the engine has
marked itself asleep: work that raced in between `pump` and the sleep cancels the sleep, so no
wake-up is ever lost.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any, Callable

import zmq

from actors.limits import DEFAULT_LIMITS, Limits
from actors.messages import Message
from transport.runtime import Runtime


class ClientEngine:
    def __init__(self, actor: Any, *, name: str, on_notify: Callable[[str, Any], None],
                 pump: Callable[[int], int | None] | None = None, has_work: Callable[[], bool] | None = None,
                 limits: Limits = DEFAULT_LIMITS, ring_links: Any = None,
                 on_stopped: Callable[[], None] | None = None) -> None:
        self.context = zmq.Context()
        self.runtime = Runtime(actor, identity=name, limits=limits, context=self.context, on_notify=on_notify,
                               ring_links=ring_links)
        if ring_links is not None:
            ring_links.counters = self.runtime.counters
        self.pump = pump
        self.has_work = has_work
        self.on_stopped = on_stopped  # in the engine thread, after the actor stopped: fail what is left
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        self._pipe_lock = threading.Lock()  # the engine thread closes the pipe; other threads write to it
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self.runtime.watch_fd(self._wake_read, self._on_wake)
        self.asleep = False
        self.signaled = False
        self.failure: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"railmq-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, message: Message) -> None:
        self.commands.put(message)
        self.wake(force=True)

    def wake(self, force: bool = False) -> None:
        if (self.asleep or force) and not self.signaled:
            self.signaled = True
            # Under the lock: the engine thread closes the pipe when it ends, which it may do the
            # moment `stop` sets `_stopping` — before this write. Writing to the closed descriptor
            # would fail, or worse, land in whatever file took its number since.
            with self._pipe_lock:
                if self._wake_write < 0:
                    return
                try:
                    os.write(self._wake_write, b"x")
                except BlockingIOError:
                    pass

    def _on_wake(self) -> None:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass
        self.signaled = False

    def _drain_commands(self) -> None:
        runtime = self.runtime
        while True:
            try:
                message = self.commands.get_nowait()
            except queue.Empty:
                return
            runtime.apply(runtime.actor.handle(message, b"", runtime.clock()))

    def _run(self) -> None:
        runtime = self.runtime
        try:
            runtime.apply(runtime.actor.start(runtime.clock()))
            while not self._stopping:
                self._drain_commands()
                deadline = self.pump(runtime.clock()) if self.pump is not None else None
                runtime.step_until(deadline, before_sleep=self._before_sleep, after_sleep=self._after_sleep)
            self._drain_commands()
            runtime.run_stop()
            if self.on_stopped is not None:
                self.on_stopped()
        except BaseException as error:  # surfaced to the user's thread by the owner
            self.failure = error
        finally:
            runtime.close()
            self.context.destroy(linger=0)
            with self._pipe_lock:
                os.close(self._wake_read)
                os.close(self._wake_write)
                self._wake_read = self._wake_write = -1

    def _before_sleep(self) -> bool:
        """Mark asleep, then re-check for work that raced in; False cancels the sleep."""
        self.asleep = True
        return self.commands.empty() and not (self.has_work is not None and self.has_work())

    def _after_sleep(self) -> None:
        self.asleep = False

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping = True
        self.wake(force=True)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def on_io_thread(self) -> bool:
        """True in the engine's own thread (in a callback it runs): waiting there for the engine
        would wait for ever."""
        return threading.current_thread() is self._thread

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def wait_until(predicate: Callable[[], bool], timeout_s: float | None, interval_s: float = 0.001) -> bool:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not predicate():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True
