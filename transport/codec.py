"""Frames <-> messages. Encoders and decoders are built once per process.

A message on the wire is a list of frames: frame 0 is the MessagePack of the Struct with its
payload fields emptied; then one frame per name in `PAYLOAD_FIELDS`, in order (see
actors/messages.py). Decoding never raises anything but `DecodeFailure`, which carries the error
code to answer with and, when the header was readable, the correlation id to answer to.
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import msgspec

from actors.errors import ErrorCode
from actors.messages import INTERNAL_TYPES, Message, wire_message_types


class DecodeFailure(Exception):
    def __init__(self, code: ErrorCode, message: str, correlation_id: int = -1) -> None:
        super().__init__(message)
        self.code = code
        self.correlation_id = correlation_id


def _buffer(frame: Any) -> Any:
    """The bytes-like view of a received frame (zmq.Frame when received with copy=False)."""
    return getattr(frame, "buffer", frame)


class Codec:
    def __init__(self, frame_bytes_max: int = 32 * 1024 * 1024) -> None:
        types = wire_message_types()
        self._decoder = msgspec.msgpack.Decoder(Union[tuple(types)])  # type: ignore[misc]
        self._loose_decoder = msgspec.msgpack.Decoder()
        self._encoder = msgspec.msgpack.Encoder()
        self._known_names = {cls.__name__ for cls in types}
        self._internal_names = {cls.__name__ for cls in INTERNAL_TYPES}
        self._empty_payloads = {
            cls: {name: b"" for name in cls.PAYLOAD_FIELDS} for cls in types if cls.PAYLOAD_FIELDS
        }
        self.frame_bytes_max = frame_bytes_max

    def encode(self, message: Message) -> list[Any]:
        """Frames for one message; payload frames are the caller's buffers, not copies."""
        empties = self._empty_payloads.get(type(message))
        if empties is None:
            return [self._encoder.encode(message)]
        payloads = [getattr(message, name) for name in type(message).PAYLOAD_FIELDS]
        header = msgspec.structs.replace(message, **empties)
        return [self._encoder.encode(header), *payloads]

    def decode(self, frames: Sequence[Any]) -> Message:
        if not frames:
            raise DecodeFailure(ErrorCode.MALFORMED_FRAME, "empty message: no frames")
        header = _buffer(frames[0])
        total = len(header) if len(frames) == 1 else sum(len(_buffer(frame)) for frame in frames)
        if total > self.frame_bytes_max:
            raise DecodeFailure(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"message of {total} bytes exceeds the limit of {self.frame_bytes_max}",
                self._correlation_id_of(frames[0]),
            )
        try:
            message = self._decoder.decode(header)
        except msgspec.DecodeError as error:
            raise self._explain(header, error) from None
        expected = type(message).PAYLOAD_FIELDS
        if len(frames) != 1 + len(expected):
            raise DecodeFailure(
                ErrorCode.INVALID_REQUEST,
                f"{type(message).__name__} takes {1 + len(expected)} frames, got {len(frames)}",
                getattr(message, "correlation_id", -1),
            )
        for name, frame in zip(expected, frames[1:]):
            setattr(message, name, _buffer(frame))
        return message

    def _correlation_id_of(self, frame: Any) -> int:
        try:
            loose = self._loose_decoder.decode(_buffer(frame))
        except msgspec.DecodeError:
            return -1
        if isinstance(loose, dict) and isinstance(loose.get("correlation_id"), int):
            return loose["correlation_id"]
        return -1

    def _explain(self, header: Any, error: Exception) -> DecodeFailure:
        """Turn a decode error into the most specific typed failure we can name."""
        try:
            loose = self._loose_decoder.decode(header)
        except msgspec.DecodeError:
            return DecodeFailure(ErrorCode.MALFORMED_FRAME, f"frame 0 is not MessagePack: {error}")
        if not isinstance(loose, dict):
            return DecodeFailure(ErrorCode.MALFORMED_FRAME, "frame 0 must be a MessagePack map")
        correlation_id = loose.get("correlation_id", -1)
        if not isinstance(correlation_id, int):
            correlation_id = -1
        kind = loose.get("type")
        if kind in self._internal_names:
            return DecodeFailure(ErrorCode.UNKNOWN_MESSAGE, f"{kind} is internal and not accepted from the network", correlation_id)
        if kind not in self._known_names:
            return DecodeFailure(ErrorCode.UNKNOWN_MESSAGE, f"unknown message type {kind!r}", correlation_id)
        return DecodeFailure(ErrorCode.INVALID_REQUEST, f"{kind} is invalid: {error}", correlation_id)
