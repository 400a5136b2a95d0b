"""What a runtime does with a message of more frames than any railmq message (transport/frames.py).

A mixin of `Runtime` (transport/runtime.py), which owns `count`, `guard` (its ROUTER's client
connections), `peer_inbound` (its DEALERs' connections) and `_discarding` (the sockets part way
through such a message). Nobody of the cluster sends one, so the connection it came on is closed
(a cluster process's is never closed: its message is only dropped), and the rest of it is read
and dropped within a wake-up's budget of frames, the remainder at the next wake-up.
"""

from __future__ import annotations

import zmq

from transport.frames import discard


class OverlongMessages:
    @property
    def reading_overlong(self) -> bool:
        """Whether a message of too many frames is still being read and dropped."""
        return bool(self._discarding)

    def _over_frames_max(self, socket: zmq.Socket, frames: list, from_router: bool) -> None:
        """A message of more frames than any railmq message: nobody of the cluster sends one, so
        its connection is closed once the message is read to its end (closed in the middle, libzmq
        took the next message, another client's, for the rest of it, and it was dropped)."""
        self.count("messages_over_frames_max")
        self._discarding[socket] = (frames[0].get(zmq.SRCFD), from_router)

    def _close_sender(self, fd: int, from_router: bool) -> None:
        """Close the connection an overlong message came on (a cluster process's is never closed)."""
        if not from_router:
            closed = self.peer_inbound.close_connection(fd)
        elif self.guard is None:
            closed = False
        else:
            closed = self.guard.close_client(fd)
            if not closed and not self.guard.table.trusted(fd):
                self.guard.on_events()  # its connection's report may still be queued
                closed = self.guard.close_client(fd)
        if closed:
            self.count("connections_closed_over_frames_max")

    def _discard(self, socket: zmq.Socket, frames_left: list[int]) -> bool:
        """Drop frames of the message of too many frames being read from `socket`, within this
        wake-up's budget (`frames_left`, one number); whether its last frame was read."""
        read, done = discard(socket, frames_left[0])
        frames_left[0] -= read
        self.count("message_frames_discarded", read)
        if done:
            self._close_sender(*self._discarding.pop(socket))
        return done
