"""Reading one message from a ZeroMQ socket without trusting how many frames it has.

libzmq bounds each frame of a message (ZMQ_MAXMSGSIZE) and counts its queues in whole messages,
never the frames of one: an empty frame is 2 bytes on the wire, so a 2 MB message can hold a
million. `recv_multipart` made each a Python object (~190 bytes; 200,000 frames: 54 MB at once)
and read them all before returning, seconds of an actor's only thread. No railmq message has more
than `MESSAGE_FRAMES_MAX` frames (actors/limits.py), so `receive` keeps at most that many and
says whether more follow; `discard` then reads the rest a bounded number at a time into one
scratch byte. A partly read message must be read to its end before the socket gives another
(libzmq's fair queue), so the caller comes back to it at its next wake-up.
"""

from __future__ import annotations

from typing import Any

import zmq

_SCRATCH = bytearray(1)  # discarded frames are read into this, cut to its size


def receive(socket: zmq.Socket, frames_max: int) -> tuple[list[Any], bool]:
    """The next message's frames (without copying), at most `frames_max` of them, and whether it
    has more (then `discard` must read them before the socket gives another message). Raises
    zmq.Again when no message waits."""
    frame = socket.recv(zmq.NOBLOCK, copy=False)
    frames = [frame]
    while frame.more:
        if len(frames) >= frames_max:
            return frames, True
        frame = socket.recv(zmq.NOBLOCK, copy=False)
        frames.append(frame)
    return frames, False


def discard(socket: zmq.Socket, frames_max: int) -> tuple[int, bool]:
    """Read and drop at most `frames_max` more frames of the message being read; (how many,
    whether its last frame was read)."""
    read = 0
    while socket.getsockopt(zmq.RCVMORE):
        if read >= frames_max:
            return read, False
        socket.recv_into(_SCRATCH, flags=zmq.NOBLOCK)
        read += 1
    return read, True
