"""One step of the simulated cluster: a message handed to a production actor, and the effects
it returns carried out in their written order (actors/effects.py).

A mixin of `Simulator` (chaos/simulator.py), kept apart because it is the one place the
simulator plays the runtime: `Send` goes out through the network (chaos/sim_delivery.py),
timers are queued by the process's own clock, `AfterFlush` holds back what it guards until the
flush completes (chaos/sim_faults.py), `Crash` and `Exit` kill the process, and nothing after
them is applied. After every step it runs the actor's `invariants()`, the Raft safety checker on
a controller, and the promises of chaos/sim_invariants.py; an exception from an actor is a
violation and kills the process, as it would kill the real one. It never decides a fault: a
process killed in the middle of a flush dies here because its disk said so.
"""

from __future__ import annotations

from typing import Any, Callable

from actors.effects import AfterFlush, CancelTimer, Crash, Exit, Notify, Send, SetTimer, Trace
from chaos.sim_hosts import Host
from storage.errors import FsyncFailed, StorageFull


class ActorSteps:
    def _apply(self, host: Host, effects: list) -> None:
        for position, effect in enumerate(effects):
            kind = type(effect)
            if kind is Send:
                self._send(host, effect.to, effect.message)
            elif kind is SetTimer:
                host.timers[effect.name] = effect.deadline_ns
                self.queue.push(effect.deadline_ns - host.clock_offset_ns, "timer",
                                (host.name, host.incarnation, effect.name, effect.deadline_ns))
            elif kind is CancelTimer:
                host.timers.pop(effect.name, None)
            elif kind is AfterFlush:
                if self.faults.after_flush(host, effect, effects[position + 1:]) != "applied":
                    return  # it died in the middle of the flush, or the rest waits for the flush
            elif kind is Trace:
                self._on_trace(host, effect.event, effect.details)
            elif kind is Notify:
                self._on_notify(host, effect.kind, effect.payload)
            elif kind is Crash or kind is Exit:
                self._note(f"{host.name} {kind.__name__.lower()}s: {effect.reason}")
                self.crash(host.name)
                return
            else:
                raise AssertionError(f"unknown effect {effect!r}")
            if not host.alive:
                return

    def flush_now(self, host: Host, store: Any) -> bool:
        """Flush `store` of `host` now; False when the process died in the middle of it."""
        try:
            store.flush()  # durable before anything it guards is revealed
        except FsyncFailed as error:
            self._note(f"{host.name} dies in the middle of a flush: {error}")
            self.crash(host.name)
            return False
        except StorageFull as error:
            self.stopped_by_full_disk(host, error)
            return False
        return True

    def stopped_by_full_disk(self, host: Host, error: StorageFull) -> None:
        """A write the actor cannot do without found the disk full: as transport/actor_main.py
        does, the process stops (exit 73) rather than go on without it, and is started again later.
        Only the process ends: what it wrote stays on its machine's disk."""
        self._note(f"{host.name} stops, its disk full: {error}")
        self.faults.crash(host.name, keep_writes=True)

    def apply_later(self, host: Host, incarnation: int, effects: list) -> None:
        """Effects a flush held back, once it completed (for the incarnation that asked)."""
        if host.alive and host.incarnation == incarnation:
            self._apply(host, effects)

    def _internal(self, host: Host, messages: list) -> None:
        for message in messages:
            if not host.alive:
                return
            self._step(host, message, b"")

    def later(self, name: str, delay_ns: int, action: Callable[[int], list]) -> None:
        """Run a shell's `action(now_ns)` after `delay_ns` (a processing step that takes time) and
        hand its messages to the actor — for this incarnation only, and not while it is paused."""
        host = self.hosts[name]
        incarnation = host.incarnation

        def due() -> None:
            if not host.alive or host.incarnation != incarnation:
                return
            if host.paused_until_ns > self.now_ns:
                self.queue.push(host.paused_until_ns, "call", due)
                return
            self._internal(host, action(self.now_ns))
        self.queue.push(self.now_ns + delay_ns, "call", due)

    def _on_notify(self, host: Host, kind: str, payload: Any) -> None:
        if host.name == "agent":
            if kind == "assignments":
                self._on_assignments(payload)
            return
        shell = self.shells.get(host.name)
        if shell is not None:
            self._internal(host, shell.on_notify(kind, payload, self.now_ns))

    def _on_trace(self, host: Host, event: str, details: dict) -> None:
        if host.kind == "replica":
            self.disk.on_trace(host, event, details)
        if event in ("became-leader", "leader-elected", "isr-changed", "unclean-election", "follower-truncated",
                     "follower-refused-truncation", "leadership-refused", "storage-damage-found", "storage-repaired",
                     "repair-truncated", "generation-started", "member-removed", "share-member-removed"):
            self._note(f"{host.name} {event} {details}")
        self.watch.on_trace(host, event, details)

    def _step(self, host: Host, message: Any, sender: Any) -> None:
        self.steps += 1
        actor = host.actor
        now = self.queue.now_ns + host.clock_offset_ns
        observe = self.watch.receives.get(type(message))
        if observe is not None:
            observe(host, message, sender, now)
        fsyncs = host.faults.fsyncs
        try:
            effects = actor.handle(message, sender, now)
        except FsyncFailed as error:  # killed in the middle of a flush it made itself
            self._note(f"{host.name} dies in the middle of a flush: {error}")
            self.crash(host.name)
            return
        except StorageFull as error:
            self.stopped_by_full_disk(host, error)
            return
        except Exception as error:  # a programmer error: the real process would die of it
            self._actor_failed(host, f"raised {error!r} handling {type(message).__name__}")
            return
        if host.disk_latency_ns and host.faults.fsyncs != fsyncs:
            # A flush the actor made inline (a flush timer, a checkpoint) on a slow disk: the process
            # sits in fsync and handles nothing more until the disk is done (its effects are not
            # held back: what the flush made durable is already on the memory disk).
            host.paused_until_ns = max(host.paused_until_ns, self.now_ns + host.disk_latency_ns)
        self._apply(host, effects)
        if host.alive:
            try:
                host.actor.invariants()
            except AssertionError as error:
                self._actor_failed(host, f"broke an invariant: {error}")
                return
            if host.kind == "controller":
                self._check_quorum(host, now)
            self.watch.after_step(host)

    def _check_quorum(self, host: Host, now_ns: int) -> None:
        """Election safety, log matching, leader completeness, state-machine safety (chaos/sim_raft_checks.py)."""
        checker = self.raft_checker
        before = len(checker.problems)
        checker.after_step(host.node, host.incarnation, host.actor.raft, _Applied(host.state["applied"]), now_ns)
        self.problems.extend(f"quorum: {problem}" for problem in checker.problems[before:])

    def _actor_failed(self, host: Host, what: str) -> None:
        self.problems.append(f"{host.name}#{host.incarnation} {what}")
        self.crash(host.name)


class _Applied:
    """What the Raft checker reads of a state machine: the entries applied since the last step."""

    def __init__(self, applied: list) -> None:
        self.applied = applied
