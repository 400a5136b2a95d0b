"""The runtime's side toward its peers: sending, one DEALER per peer endpoint, and the socket
monitors that tell the actor when a peer's connection drops.

A mixin of `Runtime` (transport/runtime.py), which owns the ROUTER, the codec, the fault switch,
the ring links, the outbound budget and the loop that calls back into the actor. A message on its
way out passes the ring links (bulk records may go through shared memory instead), the outbound
budget (an answer to a peer with too much unread is replaced by a small BUSY: a FetchResponse
without its records, anything else an ErrorResponse) and the fault switch, in that order.
Sending never blocks: a full queue drops the message and counts it, and an endpoint that is no
address is dropped, not fatal (metadata names endpoints, and metadata is a claim). Peer sockets are bounded by `peer_sockets_max`: the oldest is closed first.
Nothing here decides anything about the protocol.
"""

from __future__ import annotations

import logging

import msgspec
import zmq

from actors.actor import MS
from actors.errors import ErrorCode
from actors.messages import CORRELATION_ID_MAX, ErrorResponse, FetchResponse, Message, PeerDisconnected
from transport.codec import EncodeFailure
from transport.connections import routing_id
from transport.outbound import TRACK_BYTES_MIN
from transport.socket_watch import connect_monitored

log = logging.getLogger("railmq.runtime")


class RuntimePeers:
    """Mixed into `Runtime` (transport/runtime.py), which owns `context`, `identity`, `limits`,
    `codec`, `faults`, `outbound`, `timing`, `ring_links`, `clock`, `count`, `apply`, `actor`,
    `_router`, `_watch` and the maps of dealers and monitors."""

    # ------------------------------------------------------------------ sending

    def send(self, to: str | bytes, message: Message) -> None:
        if self.timing.waiting and isinstance(to, bytes):
            self.timing.answered(to, message)
        if self.ring_links is not None:
            message = self.ring_links.divert(to, self.ring_links.outgoing(to, message))
        try:
            frames = self.codec.encode(message)
        except EncodeFailure as failure:
            self.count("messages_unencodable")
            log.error("%s: %s", self.identity, failure)
            frames = self._unencodable(message, failure)
            if not isinstance(to, bytes):
                # A request of ours: unsent, and answered at the next wake-up as if its peer had
                # refused it, so the actor's own error path fails it instead of waiting it out.
                self.faults.hold(self.clock(), ("in", to, frames))
                return
        if isinstance(to, bytes):
            size = sum(map(len, frames))
            if size >= TRACK_BYTES_MIN and not self.room_for(to, size):
                frames = self.codec.encode(self._withheld(to, message))
        peer_name = to.decode("utf-8", "replace") if isinstance(to, bytes) else to
        delay = self.faults.outbound(peer_name)
        if delay is None:
            self.count("dropped_out_by_fault")
            return
        if delay > 0:
            self.faults.hold(self.clock() + delay, ("out", to, frames))
            return
        self._transmit(to, frames)

    def _unencodable(self, message: Message, failure: EncodeFailure) -> list:
        """The refusal of a message msgpack cannot carry (an int past 64 bits): a bug or a caller's
        mistake, never a reason to stop the actor (its restart would meet the same request again).
        Whoever waits for its answer gets a typed error now instead of waiting out a timeout."""
        correlation_id = getattr(message, "correlation_id", -1)
        if type(correlation_id) is not int or not 0 <= correlation_id <= CORRELATION_ID_MAX:
            correlation_id = -1
        return self.codec.encode(ErrorResponse(
            correlation_id=correlation_id,
            error=ErrorCode.INVALID_REQUEST, error_message=failure.detail))

    def room_for(self, to: bytes, size: int) -> bool:
        """Whether an answer of `size` bytes to `to` keeps the outbound budgets. When only the
        actor's own is past, the client connections whose answers have waited unread longest
        (past `client_unread_answers_close_ms`), holding the most first, are closed to make room:
        clients that never read cannot keep every other client's large answers BUSY."""
        outbound = self.outbound
        if outbound.allows(to, size):
            return True
        if self.guard is None or not outbound.within_peer_budget(to, size):
            return False
        waited = outbound.unread_longest(self.clock() - self.limits.client_unread_answers_close_ms * MS,
                                         besides=to)
        if not waited:
            return False
        clients = self.guard.table.clients_by_routing_id()
        for peer in waited:
            fd = clients.get(peer)
            if fd is None:
                continue  # a cluster process's connection: never closed here
            if not self.guard.close_client(fd):
                continue  # already gone: libzmq frees its queue, and its trackers say so
            self.count("connections_closed_unread_answers")
            outbound.forget(peer)  # its queue goes with its connection
            if outbound.allows(to, size):
                return True
        return False

    def _withheld(self, to: bytes, message: Message) -> Message:
        """The peer has not read what it was sent: it gets a small BUSY now instead of the answer
        (a fetch's records come on a later fetch; any other request is asked again)."""
        self.count("answers_withheld_unread_backlog")
        outbound = self.outbound
        if outbound.within_peer_budget(to, TRACK_BYTES_MIN):
            text = (f"{outbound.total_bytes} bytes of answers to all connections are still unread, "
                    "the most this actor holds; ask again soon")
        else:
            text = (f"{outbound.outstanding(to)} bytes of earlier answers to this connection are "
                    "still unread; read them, then ask again")
        if type(message) is FetchResponse:
            return msgspec.structs.replace(message, error=ErrorCode.BUSY, records=b"", error_message=text)
        correlation_id = getattr(message, "correlation_id", -1)
        return ErrorResponse(correlation_id=correlation_id if type(correlation_id) is int else -1,
                             error=ErrorCode.BUSY, error_message=text)

    def _transmit(self, to: str | bytes, frames: list) -> None:
        if isinstance(to, bytes):
            socket = self._router
            if socket is None:
                self.count("dropped_out_no_router")
                return
            frames = [to, *frames]
        else:
            socket = self._dealer(to)
            if socket is None:
                self.count("dropped_out_bad_endpoint")
                return
        tracker = None
        if isinstance(to, bytes):
            size = sum(map(len, frames)) - len(to)
            if size >= TRACK_BYTES_MIN:
                # Tracked on its own frame (a multipart send's tracker follows only its last frame):
                # the whole message leaves libzmq's queue with it.
                largest = max(range(1, len(frames)), key=lambda index: len(frames[index]))
                frames = list(frames)
                frames[largest] = zmq.Frame(frames[largest], copy=False, track=True)
                tracker = frames[largest].tracker
        try:
            socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
            if tracker is not None:
                self.outbound.track(to, tracker, size, self.clock())
            self.count("messages_out")
        except zmq.Again:
            self.count("dropped_out_queue_full")
        self._watch.touched(socket)

    def _dealer(self, endpoint: str) -> zmq.Socket | None:
        """The socket to a peer, connected on first use; None for an endpoint that is no address
        (metadata names endpoints, and metadata is a claim: a bad one is dropped, not fatal)."""
        socket = self._dealers.get(endpoint)
        if socket is not None:
            return socket
        if len(self._dealers) >= self.limits.peer_sockets_max:
            self._close_dealer(next(iter(self._dealers)))
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, self.limits.peer_send_queue_max)
        socket.setsockopt(zmq.RCVHWM, self.limits.peer_send_queue_max)
        socket.setsockopt(zmq.RECONNECT_IVL, 50)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        socket.setsockopt(zmq.MAXMSGSIZE, self.limits.frame_bytes_hard_max)
        # Unique per socket (two clients may share an identity, and a socket to a peer may be
        # reopened: a reused routing id would hand the peer's replies to the wrong socket) and
        # unguessable (transport/connections.py).
        socket.setsockopt(zmq.ROUTING_ID, routing_id(self.identity))
        try:
            monitor = connect_monitored(socket, endpoint,
                                        zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CONNECTED)
        except zmq.ZMQError:
            return None
        self._dealers[endpoint] = socket
        self._socket_peer[socket] = endpoint
        self._monitors[endpoint] = monitor
        self._monitor_peer[monitor] = endpoint
        self._watch.add_socket(socket)
        self._watch.add_socket(monitor)
        return socket

    def _on_monitor_event(self, monitor: zmq.Socket) -> None:
        """A DEALER lost its connection: tell the actor, so it fails over without waiting for a
        request timeout (the zguide's "any inbound message is proof of life" has a converse: a
        dropped TCP connection is proof of death of that process, not of the node)."""
        endpoint = self._monitor_peer[monitor]
        disconnected = False
        while True:
            try:
                frames = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event = int.from_bytes(frames[0][:2], "little") if len(frames[0]) >= 2 else 0
            fd = int.from_bytes(frames[0][2:6], "little") if len(frames[0]) >= 6 else -1
            if event == zmq.EVENT_CONNECTED:
                self._unreachable.discard(endpoint)
                self.peer_inbound.connected(endpoint, fd)  # its bytes are counted from now on
                continue
            if event == zmq.EVENT_DISCONNECTED:
                self.peer_inbound.gone(endpoint, fd)
            if event == zmq.EVENT_DISCONNECTED or (
                    event == zmq.EVENT_CONNECT_RETRIED and endpoint not in self._unreachable):
                # A refused connection means nobody listens there: a dead process (or one not
                # started yet). Said once per outage, until a connection succeeds again.
                self._unreachable.add(endpoint)
                disconnected = True
        if disconnected:
            self.count("peer_disconnects")
            if self.ring_links is not None:
                self.ring_links.forget(endpoint)
            self.apply(self.actor.handle(PeerDisconnected(endpoint=endpoint), b"", self.clock()))

    def _close_dealer(self, endpoint: str) -> None:
        socket = self._dealers.pop(endpoint)
        self._discarding.pop(socket, None)
        self.peer_inbound.closed(endpoint)
        self._watch.remove(socket)
        del self._socket_peer[socket]
        self._unreachable.discard(endpoint)
        monitor = self._monitors.pop(endpoint, None)
        if monitor is not None:
            self._watch.remove(monitor)
            del self._monitor_peer[monitor]
            socket.disable_monitor()
            monitor.close(linger=0)
        socket.close(linger=0)

    def forget_peer(self, endpoint: str) -> None:
        """Drop the socket to a peer (its queued messages go with it)."""
        if endpoint in self._dealers:
            self._close_dealer(endpoint)
