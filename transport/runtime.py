"""The thin shell that drives one actor with real sockets, a real clock and real disks.

One ROUTER socket (bound on 127.0.0.1) receives everything addressed to the actor; one DEALER per
peer endpoint carries what the actor sends, and the replies to it. The loop is the zguide's:
poll with a timeout equal to the next timer deadline (never infinite), drain what is readable,
decode -> handle -> apply effects, then flush any store that effects are waiting on and apply
those (group commit: one fsync covers every request handled in the same wake-up). The way out —
sending, the DEALERs and their connection monitors — is the `RuntimePeers` mixin
(transport/runtime_peers.py).

The ROUTER's connections are watched too (its own monitor socket): those no cluster process made
are bounded in number and in the bytes they hold before they are messages (transport/connections.py).

What it never does: decide anything about the protocol. Bad frames are counted and answered with
an `ErrorResponse`; a broken invariant in the actor (an exception from `handle`) is a programmer
error and stops the process loudly, so the supervisor restarts it from its durable state.

Clock: actors get wall-clock nanoseconds, because retention and timestamps compare against record
times written by producers, and timers use the same clock; it is a `SteadyClock`
(transport/clock.py), which never steps back when the machine's clock does, so a clock set back
does not stall every timer for as long.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any, Callable

import zmq

from actors.effects import AfterFlush, CancelTimer, Crash, Exit, Notify, Send, SetTimer, Trace
from actors.errors import ErrorCode
from actors.limits import DEFAULT_LIMITS, MESSAGE_FRAMES_MAX, Limits
from actors.messages import (
    ErrorResponse, FaultControlRequest, FaultControlResponse, FetchRequest, FetchResponse, RuntimeStatsRequest,
    RuntimeStatsResponse, Stop, TimerFired,
)
from transport.auth import refusal
from transport.clock import SteadyClock
from transport.codec import Codec, DecodeFailure
from transport.connections import RouterGuard, client_connections_bound
from transport.outbound import OutboundBudget
from transport.peer_inbound import PeerInbound
from transport.faults import FaultSwitch
from transport.frames import receive
from transport.request_timing import RequestTiming
from transport.runtime_frames import OverlongMessages
from transport.runtime_peers import RuntimePeers
from transport.socket_watch import SocketWatch
from transport.timers import Timers

log = logging.getLogger("railmq.runtime")

# With no timer due, a loop wakes at least this often. A client engine's owner may ask it to
# stop from another thread without a wake-up, so clients keep 1 s; an actor process is woken by
# a descriptor for everything that can stop it (its SIGTERM pipe, its lifeline), so it passes
# ACTOR_POLL_TIMEOUT_MAX_MS: a wake-up costs ~0.2 ms of CPU here, and 90 idle replicas woken
# once a second were ~0.02 of a core doing nothing.
POLL_TIMEOUT_MAX_MS = 1000
ACTOR_POLL_TIMEOUT_MAX_MS = 60_000


class ActorCrashed(Exception):
    """The actor asked to stop as if killed (`Crash` effect)."""


class Runtime(RuntimePeers, OverlongMessages):
    def __init__(
        self,
        actor: Any,
        *,
        identity: str,
        limits: Limits = DEFAULT_LIMITS,
        context: zmq.Context | None = None,
        clock: Callable[[], int] | None = None,
        rng: random.Random | None = None,
        on_notify: Callable[[str, Any], None] | None = None,
        on_trace: Callable[[str, dict], None] | None = None,
        storage_faults: Any = None,
        ring_links: Any = None,
        secret: bytes | None = None,
        faults_enabled: bool = False,
        poll_timeout_max_ms: int = POLL_TIMEOUT_MAX_MS,
    ) -> None:
        self.actor = actor
        self.poll_timeout_max_ms = poll_timeout_max_ms
        self.identity = identity
        self.limits = limits
        self.context = context or zmq.Context.instance()
        self.clock = clock or SteadyClock()
        self.codec = Codec(limits.frame_bytes_max, secret=secret)
        # The fault switch obeys only the chaos harness of the cluster that started this actor
        # (an authenticated FaultControlRequest), and only when the cluster was started for chaos.
        self.faults_enabled = faults_enabled
        self.outbound = OutboundBudget(limits.peer_outbound_bytes_max, limits.outbound_bytes_max)
        self.faults = FaultSwitch(rng or random.Random())
        self.timers = Timers()
        self.on_notify = on_notify
        self.on_trace = on_trace
        self.storage_faults = storage_faults
        self.counters: dict[str, int] = {}
        self.trace_file: Any = None  # transport/trace_file.py's TraceFile, for its dropped-line count
        self.ring_links = ring_links  # transport/ring_link.py: fetch payloads through shared memory
        # (message, its first frame) -> whether the connection it came on may send it; a quorum's
        # voters check that Raft messages come from their voter's host (transport/voter_address.py).
        self.peer_check: Callable[[Any, Any], bool] | None = None
        self.endpoint = ""
        self._router: zmq.Socket | None = None
        self.guard: RouterGuard | None = None  # the bounds on the ROUTER's connections
        self._dealers: dict[str, zmq.Socket] = {}
        self._socket_peer: dict[zmq.Socket, str] = {}
        self._monitors: dict[str, zmq.Socket] = {}
        self._unreachable: set[str] = set()
        self._monitor_peer: dict[zmq.Socket, str] = {}
        self._watch = SocketWatch()
        self._watched_fds: dict[int, Callable[[], None]] = {}
        # Sockets part way through a message of too many frames (transport/frames.py).
        # socket -> (descriptor, from the ROUTER) of the connection whose message is being dropped.
        self._discarding: dict[zmq.Socket, tuple[int, bool]] = {}
        # The bound on what the DEALERs' connections hold before it is read (transport/peer_inbound.py).
        self.peer_inbound = PeerInbound(
            inbound_bytes_max=limits.peer_inbound_bytes_max,
            check_interval_ms=limits.client_inbound_check_interval_ms, clock=self.clock, count=self.count,
            watch=lambda fd: self._watch_connection(fd, self.peer_inbound.data_arrived),
            unwatch=lambda fd: self._unwatch_connection(fd, self.peer_inbound.data_arrived))
        self.timing = RequestTiming()  # each request type's time from arrival to answer
        self._pending_flush: list[AfterFlush] = []
        self._stopping = False
        self._stopped = False

    # ------------------------------------------------------------------ setup

    def bind(self, port: int = 0, host: str = "127.0.0.1", advertise: str = "") -> str:
        """Bind the ROUTER on `host` (port 0: any free port) and return the endpoint others use:
        `tcp://<advertise or host>:<port>` (a node behind another address names the one its peers reach)."""
        router = self.context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        router.setsockopt(zmq.MAXMSGSIZE, self.limits.frame_bytes_hard_max)
        router.setsockopt(zmq.SNDHWM, self.limits.router_send_queue_max)
        router.setsockopt(zmq.RCVHWM, self.limits.router_receive_queue_max)
        try:
            if port:
                router.bind(f"tcp://{host}:{port}")
            else:
                port = router.bind_to_random_port(f"tcp://{host}")
        except zmq.ZMQError:
            router.close(linger=0)  # the caller may try again
            raise
        self._router = router
        self._watch.add_socket(router)
        self.guard = RouterGuard(
            router, untrusted_max=client_connections_bound(self.limits.client_connections_max),
            inbound_bytes_max=self.limits.client_inbound_bytes_max,
            check_interval_ms=self.limits.client_inbound_check_interval_ms, clock=self.clock, count=self.count,
            watch=lambda fd: self._watch_connection(fd, self.guard.data_arrived),
            unwatch=lambda fd: self._unwatch_connection(fd, self.guard.data_arrived))
        self._watch.add_socket(self.guard.monitor)
        self.endpoint = f"tcp://{advertise or host}:{port}"
        return self.endpoint

    def _watch_connection(self, fd: int, on_data: Callable[[], None]) -> None:
        """Call `on_data` once per arrival of data on a connection libzmq reads (edge-triggered)."""
        self._watched_fds[fd] = on_data
        self._watch.add_edge_fd(fd)

    def _unwatch_connection(self, fd: int, on_data: Callable[[], None]) -> None:
        if self._watched_fds.get(fd) == on_data:  # its number may be another watch's by now
            del self._watched_fds[fd]
            self._watch.remove_fd(fd)

    def watch_fd(self, fd: int, on_readable: Callable[[], None]) -> None:
        """Call `on_readable` (in the loop) whenever `fd` is readable: lifelines, wake-up pipes."""
        self._watched_fds[fd] = on_readable
        self._watch.add_fd(fd)

    def request_stop(self) -> None:
        self._stopping = True

    def count(self, name: str, amount: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """Run until `request_stop`; then give the actor its `Stop` and close everything."""
        try:
            self.apply(self.actor.start(self.clock()))
            self._flush_pending()
            while not self._stopping:
                self.step()
            self.run_stop()
        finally:
            self.close()

    def run_stop(self) -> None:
        self.apply(self.actor.handle(Stop(reason="stop requested"), b"", self.clock()))
        self._flush_pending()

    def step(self) -> None:
        """One wake-up: poll, drain, fire timers, flush."""
        self.step_until(None)

    def step_until(self, extra_deadline_ns: int | None, before_sleep: Callable[[], bool] | None = None,
                   after_sleep: Callable[[], None] | None = None) -> None:
        """`step` with an extra deadline from the owner and hooks around the poll (client engines)."""
        timeout_ms = self._poll_timeout_ms(extra_deadline_ns)
        if timeout_ms > 0 and before_sleep is not None and not before_sleep():
            timeout_ms = 0
        ready, fds = self._watch.wait(timeout_ms)
        self.counters["wakeups"] = self.counters.get("wakeups", 0) + 1
        if after_sleep is not None:
            after_sleep()
        for fd in fds:
            on_readable = self._watched_fds.get(fd)
            if on_readable is not None:
                on_readable()
        for socket in ready:
            if socket.closed:
                continue
            if socket is self._router:
                self._drain(socket, from_router=True)
            elif self.guard is not None and socket is self.guard.monitor:
                self.guard.on_events()
            elif socket in self._monitor_peer:
                self._on_monitor_event(socket)
            else:
                self._drain(socket, from_router=False)
        self._fire_due()
        self._flush_pending()
        if self.guard is not None:
            self.guard.check_if_due()
        self.peer_inbound.check_if_due()

    def _poll_timeout_ms(self, extra_deadline_ns: int | None = None) -> int:
        deadline = self.timers.next_deadline()
        for other in (self.faults.next_release_ns(), extra_deadline_ns, self.guard and self.guard.check_at_ns,
                      self.peer_inbound.check_at_ns):
            if other is not None and (deadline is None or other < deadline):
                deadline = other
        if self._pending_flush:
            return 0
        if deadline is None:
            return self.poll_timeout_max_ms
        remaining_ms = (deadline - self.clock()) / 1e6
        return int(max(0, min(self.poll_timeout_max_ms, remaining_ms + 0.999)))

    def _drain(self, socket: zmq.Socket, *, from_router: bool) -> None:
        frames_left = [self.limits.runtime_batch_frames_max]
        if socket in self._discarding and not self._discard(socket, frames_left):
            return
        for _ in range(self.limits.runtime_batch_messages_max):
            try:
                frames, more = receive(socket, MESSAGE_FRAMES_MAX)
            except zmq.Again:
                return
            if more:
                self._over_frames_max(socket, frames, from_router)
                if not self._discard(socket, frames_left):
                    return  # the rest at the next wake-up: timers and other sockets first
                continue
            fd = -1
            if from_router:
                fd = self.guard.arrived(frames)
                sender: str | bytes = frames[0].bytes
                peer_name = sender.decode("utf-8", "replace")
                frames = frames[1:]
            else:
                self.peer_inbound.arrived(frames)
                sender = peer_name = self._socket_peer[socket]
            self.count("messages_in")
            delay = self.faults.inbound(peer_name)
            if delay is None:
                self.count("dropped_in_by_fault")
                continue
            if delay > 0:
                self.faults.hold(self.clock() + delay, ("in", sender, frames))
                continue
            self._deliver(sender, frames, fd)

    def _deliver(self, sender: str | bytes, frames: list, fd: int = -1) -> None:
        try:
            message = self.codec.decode(frames)
        except DecodeFailure as failure:
            self.count(f"decode_error_{failure.code.name.lower()}")
            if isinstance(sender, bytes):
                self.send(sender, ErrorResponse(
                    correlation_id=failure.correlation_id, error=failure.code, error_message=str(failure)))
            return
        authenticated = self.codec.last_authenticated
        if authenticated and fd >= 0:
            self.guard.trust(fd)
        if isinstance(sender, bytes):
            self.timing.arrived(sender, message)
        if isinstance(message, RuntimeStatsRequest):
            self.send(sender, self._stats(message.correlation_id))
            return
        if isinstance(message, FaultControlRequest):
            self.send(sender, self._on_fault_control(message, authenticated))
            return
        if isinstance(sender, bytes) and type(message) is FetchRequest and not self.room_for(
                sender, min(message.max_bytes, self.limits.fetch_bytes_max)):
            # Not even read: the answers this peer already has are waiting to be read.
            self.send(sender, self._withheld(sender, FetchResponse(
                correlation_id=message.correlation_id, topic=message.topic, partition=message.partition)))
            return
        refused = refusal(self.actor, message, authenticated)
        if refused is not None:
            self.count("rejected_unauthenticated")
            if isinstance(sender, bytes):
                self.send(sender, refused)
            return
        if self.peer_check is not None and isinstance(sender, bytes) and not self.peer_check(message, frames[0]):
            self.count("rejected_wrong_address")  # no answer: the sender is not who it says
            return
        links = self.ring_links
        if links is None:
            self.apply(self.actor.handle(message, sender, self.clock()))
            return
        message = links.incoming(sender, message)
        try:
            self.apply(self.actor.handle(message, sender, self.clock()))
        finally:
            links.release()  # the actor has copied what it keeps (a follower's log append)

    def _fire_due(self) -> None:
        now = self.clock()
        for direction, target, payload in self.faults.release_due(now):
            if direction == "in":
                self._deliver(target, payload)
            else:
                self._transmit(target, payload)
        for name in self.timers.pop_due(now):
            self.apply(self.actor.handle(TimerFired(name=name), b"", self.clock()))

    # ------------------------------------------------------------------ effects

    def apply(self, effects: list) -> None:
        for effect in effects:
            kind = type(effect)
            if kind is Send:
                self.send(effect.to, effect.message)
            elif kind is SetTimer:
                self.timers.set(effect.name, effect.deadline_ns)
            elif kind is CancelTimer:
                self.timers.cancel(effect.name)
            elif kind is AfterFlush:
                self._pending_flush.append(effect)
            elif kind is Trace:
                self._trace(effect)
            elif kind is Notify:
                if self.on_notify is None:
                    raise AssertionError(f"{self.identity}: Notify effect with no client attached")
                self.on_notify(effect.kind, effect.payload)
            elif kind is Exit:
                log.info("%s stops: %s", self.identity, effect.reason)
                self.request_stop()
            elif kind is Crash:
                log.error("%s crashes on purpose: %s", self.identity, effect.reason)
                raise ActorCrashed(effect.reason)
            else:
                raise AssertionError(f"{self.identity}: unknown effect {effect!r}")

    def _flush_pending(self) -> None:
        while self._pending_flush:
            pending, self._pending_flush = self._pending_flush, []
            flushed: set[int] = set()
            for effect in pending:
                if id(effect.store) not in flushed:
                    effect.store.flush()
                    flushed.add(id(effect.store))
                    self.count("flushes")
            for effect in pending:
                self.apply(list(effect.effects))

    def _trace(self, effect: Trace) -> None:
        if self.on_trace is not None:
            self.on_trace(effect.event, effect.details)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s %s", self.identity, effect.event, effect.details)

    # ------------------------------------------------------------------ runtime-level messages

    def _stats(self, correlation_id: int) -> RuntimeStatsResponse:
        counters = dict(self.counters)
        counters["timers"] = len(self.timers)
        counters["outbound_unread_bytes"] = self.outbound.total_bytes
        if self.trace_file is not None:
            counters["trace_lines_dropped"] = self.trace_file.dropped
        counters["peer_sockets"] = len(self._dealers)
        counters["peer_inbound_held_bytes"] = self.peer_inbound.table.held_bytes
        if self.guard is not None:
            table = self.guard.table
            counters["connections"] = len(table)
            counters["client_connections"] = table.untrusted
            counters["client_connections_max"] = table.untrusted_max
            counters["client_inbound_held_bytes"] = table.held_bytes
        counters["requests_forgotten_unanswered"] = self.timing.forgotten
        return RuntimeStatsResponse(correlation_id=correlation_id, actor=self.identity, pid=os.getpid(),
                                    counters=counters, latency=self.timing.snapshot())

    def _on_fault_control(self, request: FaultControlRequest, authenticated: bool) -> FaultControlResponse:
        if not self.faults_enabled:
            self.count("rejected_fault_control")
            return FaultControlResponse(
                correlation_id=request.correlation_id, error=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                error_message="the fault switch is off: this cluster was not started for chaos experiments")
        if not authenticated:
            self.count("rejected_fault_control")
            return FaultControlResponse(
                correlation_id=request.correlation_id, error=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                error_message="the fault switch obeys only the chaos harness of this cluster (no valid tag)")
        try:
            self.faults.configure(request.links)
        except ValueError as error:
            self.count("rejected_fault_control")
            return FaultControlResponse(correlation_id=request.correlation_id, error=ErrorCode.INVALID_REQUEST,
                                        error_message=str(error))
        if self.storage_faults is not None:
            self.storage_faults(disk_full=request.disk_full, fail_next_fsync=request.fail_next_fsync)
        self.count("fault_controls")
        return FaultControlResponse(correlation_id=request.correlation_id)

    def close(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.ring_links is not None:
            self.ring_links.close()
        for endpoint in list(self._dealers):
            self._close_dealer(endpoint)
        if self.guard is not None:
            self._watch.remove(self.guard.monitor)
            self.guard.close()
            self.guard = None
        if self._router is not None:
            self._watch.remove(self._router)
            self._router.close(linger=0)
            self._router = None
        self._watch.close()

