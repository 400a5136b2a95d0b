"""What reaches a simulated process, and when: messages, timers and dropped connections.

A mixin of `Simulator` (chaos/simulator.py), kept apart because it is the transport's rules, not the
actors': a message is encoded by the real codec, planned by the seeded network
(chaos/sim_network.py), decoded on arrival and checked by the runtime's own authentication rule
(transport/auth.py `refusal`). Whether it carries the cluster's proof is decided as the real tag
decides it — processes of the cluster have the secret, clients do not — but carried beside the
frames rather than computed: the tag's bytes are the codec's and runtime's to test
(tests/unit/test_codec_hostile.py, tests/integration/test_hostile_clients.py), and hashing every
simulated message twice was a twentieth of the simulator's time. As ZeroMQ's routing ids are unique
per socket, a reply reaches only the incarnation that asked; a message to an endpoint nobody listens
on is refused, and the sender hears so once. A paused process handles nothing: whatever arrives for
it waits until the pause ends. A timer fires when the process's own clock reads its deadline. It
never runs an actor itself: each arrival becomes a step (chaos/sim_steps.py).
"""

from __future__ import annotations

from typing import Any

from actors.messages import PeerDisconnected, TimerFired
from chaos.sim_hosts import Host
from chaos.sim_network import MS
from transport.auth import refusal


class Delivery:
    def _send(self, host: Host, to: Any, message: Any) -> None:
        observe = self.watch.sends.get(type(message))
        if observe is not None:
            observe(host, to, message)
        frames = self.codec.encode(message)
        if len(frames) > 1:  # payload frames may be the sender's buffers: the wire copies them
            frames = [bytes(frame) for frame in frames]
        if isinstance(to, str):
            destination = self.by_endpoint.get(to)
            # As ZeroMQ's routing ids are unique per socket, a reply reaches only the process
            # that asked, never a later incarnation of it.
            sender: Any = host.reply_address
            if destination is None or not destination.alive or destination.endpoint != to:
                self._refused(host, to)  # nobody listens there: the connection is refused
                return
            host.peers.add(to)
            target: Any = to
        else:
            routing, _, incarnation = to.rpartition(b"#")
            destination = self.by_routing.get(routing)
            target = int(incarnation) if incarnation.isdigit() else -1
            sender = host.endpoint
        if destination is None:
            return
        queue = self.queue
        arrivals = self.network.plan(host.name, destination.name, queue.now_ns)
        if arrivals:
            payload = (destination.name, target, sender, frames, host.in_cluster)
            for arrival in arrivals:
                queue.push(arrival, "deliver", payload)

    def send_as(self, name: str, to: str, message: Any) -> None:
        self._send(self.hosts[name], to, message)

    def _refused(self, host: Host, endpoint: str) -> None:
        """Like ZeroMQ's EVENT_CONNECT_RETRIED: the sender hears once that nobody listens there."""
        refused = host.state.setdefault("refused", set())
        if (host.incarnation, endpoint) in refused:
            return
        refused.add((host.incarnation, endpoint))
        self.queue.push(self.now_ns + MS, "disconnect", (host.name, host.incarnation, endpoint))

    def _deliver(self, name: str, target: Any, sender: Any, frames: list, authenticated: bool) -> None:
        host = self.hosts[name]
        if not host.alive:
            return
        if isinstance(target, str) and target != host.endpoint:
            return  # sent to an endpoint of an earlier incarnation: nobody listens there
        if isinstance(target, int) and target != host.incarnation:
            return  # a reply to a process that has since died
        if host.paused_until_ns > self.queue.now_ns:
            self.queue.push(host.paused_until_ns, "deliver", (name, target, sender, frames, authenticated))
            return
        message = self.codec.decode(frames)
        refused = refusal(host.actor, message, authenticated)
        if refused is not None:
            self.problems.append(f"{host.name} got an unauthenticated {type(message).__name__} from {sender!r}")
            return
        self._step(host, message, sender)

    def _timer(self, name: str, incarnation: int, timer: str, deadline: int) -> None:
        host = self.hosts[name]
        if not host.alive or host.incarnation != incarnation or host.timers.get(timer) != deadline:
            return
        now_ns = self.queue.now_ns
        if host.clock_ns(now_ns) < deadline:
            return  # the process's clock jumped back: the timer was queued again for later
        if host.paused_until_ns > now_ns:
            self.queue.push(host.paused_until_ns, "timer", (name, incarnation, timer, deadline))
            return
        del host.timers[timer]
        self._step(host, TimerFired(name=timer), b"")

    def requeue_timers(self, host: Host) -> None:
        """After a clock jump: every timer fires when the process's new clock reads its deadline."""
        for timer, deadline in host.timers.items():
            self.queue.push(deadline - host.clock_offset_ns, "timer", (host.name, host.incarnation, timer, deadline))

    def _disconnect(self, name: str, incarnation: int, endpoint: str) -> None:
        host = self.hosts[name]
        if host.alive and host.incarnation == incarnation:
            if host.paused_until_ns > self.now_ns:
                self.queue.push(host.paused_until_ns, "disconnect", (name, incarnation, endpoint))
                return
            self._step(host, PeerDisconnected(endpoint=endpoint), b"")

    def disconnect_peers(self, host: Host, endpoint: str) -> None:
        """Everyone connected to a dead process's endpoint sees the connection drop."""
        for other in self.hosts.values():
            if other.alive and endpoint and endpoint in other.peers:
                other.peers.discard(endpoint)
                self.queue.push(self.now_ns + MS, "disconnect", (other.name, other.incarnation, endpoint))
