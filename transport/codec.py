"""Frames <-> messages. Encoders and decoders are built once per process.

A message on the wire is a list of frames: frame 0 is the MessagePack of the Struct with its
payload fields emptied; then one frame per name in `PAYLOAD_FIELDS`, in order (see
actors/messages.py); then, from a member of the cluster, one authentication tag frame
(transport/auth.py). Decoding never raises anything but `DecodeFailure`, which carries the error
code to answer with and, when the header was readable, the correlation id to answer to.

Everything a frame can be is treated as hostile (STYLE rule 7): a frame reaches an actor only as
a known, typed message with the right number of frames. msgspec's decoders recurse on nested
arrays and maps — also when they skip a field they do not know — and raise `RecursionError` at
Python's recursion limit, so every decode here catches every exception, not only
`msgspec.DecodeError`. When a header does not decode, the codec peeks at it once more for a
correlation id to answer to; that peek reads only frames up to `PEEK_BYTES_MAX`, keeps only a
`type` string and an integer `correlation_id` in [0, 2**63), and catches everything too.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence, Union

import msgspec

from actors.errors import ErrorCode, RailmqError
from actors.messages import CORRELATION_ID_MAX, INTERNAL_TYPES, Message, wire_message_types
from transport.auth import TAG_BYTES, Signer, looks_like_tag

# A header worth peeking at for a correlation id is small: the largest legitimate headers
# (an offset commit for a few thousand partitions) are tens of kilobytes.
PEEK_BYTES_MAX = 256 * 1024
# A cluster process reads a larger frame 0 without this cluster's tag only if it is a request:
# answers, heartbeats and reports come from processes of the cluster, and a forged one of
# millions of tiny items cost ~25 bytes of memory a byte before its receiver could refuse it.
# Requests are bounded field by field instead (actors/wire_bounds.py).
UNTAGGED_BYTES_MAX = 64 * 1024


class DecodeFailure(Exception):
    def __init__(self, code: ErrorCode, message: str, correlation_id: int = -1) -> None:
        super().__init__(message)
        self.code = code
        self.correlation_id = correlation_id


class EncodeFailure(RailmqError):
    """A message msgpack cannot carry (an int past 64 bits, a string UTF-8 cannot hold, a value of
    no wire type): the sender's mistake, refused before anything is sent."""

    def __init__(self, message: Any, error: Exception) -> None:
        self.detail = f"{type(message).__name__} cannot be sent: {error}"
        super().__init__(ErrorCode.INVALID_REQUEST, self.detail)


class _Peek(msgspec.Struct):
    """The two fields worth knowing about a header that failed to decode, left raw so that a
    wrong type in one does not hide the other."""

    type: msgspec.Raw = msgspec.Raw(b"")
    correlation_id: msgspec.Raw = msgspec.Raw(b"")


_peek_decoder = msgspec.msgpack.Decoder(_Peek)
_name_decoder = msgspec.msgpack.Decoder(str)
_int_decoder = msgspec.msgpack.Decoder(int)


def _buffer(frame: Any) -> Any:
    """The bytes-like view of a received frame (zmq.Frame when received with copy=False)."""
    return getattr(frame, "buffer", frame)


def _raw_or_none(decoder: msgspec.msgpack.Decoder, raw: msgspec.Raw) -> Any:
    if not len(raw):
        return None
    try:
        return decoder.decode(raw)
    except Exception:  # noqa: BLE001 - a hostile field: know nothing of it
        return None


def message_decoder() -> msgspec.msgpack.Decoder:
    """The decoder of the tagged union of every wire message. Building it compiles msgspec's type
    information for ~100 Structs: built once per process (per set of message types), and before
    the fork in the forkserver (transport/forkserver_ready.py), so every actor shares it."""
    return _decoder_for(tuple(wire_message_types()))


@functools.lru_cache(maxsize=4)
def _decoder_for(types: tuple[type, ...]) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(Union[types])  # type: ignore[misc]


class Codec:
    def __init__(self, frame_bytes_max: int = 32 * 1024 * 1024, *, secret: bytes | None = None) -> None:
        types = wire_message_types()
        self._decoder = message_decoder()
        self._encoder = msgspec.msgpack.Encoder()
        self._known_names = {cls.__name__ for cls in types}
        self._internal_names = {cls.__name__ for cls in INTERNAL_TYPES}
        self._request_names = {name for name in self._known_names if name.endswith("Request")}
        self._empty_payloads = {
            cls: {name: b"" for name in cls.PAYLOAD_FIELDS} for cls in types if cls.PAYLOAD_FIELDS
        }
        self.frame_bytes_max = frame_bytes_max
        self.signer = Signer(secret) if secret else None
        # Set by `decode`: whether the message just decoded carried a valid tag of this cluster.
        self.last_authenticated = False

    def encode(self, message: Message) -> list[Any]:
        """Frames for one message; payload frames are the caller's buffers, not copies. A codec
        holding the cluster secret appends the authentication tag frame."""
        empties = self._empty_payloads.get(type(message))
        try:
            if empties is None:
                frames = [self._encoder.encode(message)]
            else:
                payloads = [getattr(message, name) for name in type(message).PAYLOAD_FIELDS]
                header = msgspec.structs.replace(message, **empties)
                frames = [self._encoder.encode(header), *payloads]
        except (OverflowError, TypeError, ValueError, msgspec.EncodeError) as error:  # ValueError: UnicodeEncodeError
            raise EncodeFailure(message, error) from None
        if self.signer is not None:
            frames.append(self.signer.tag(frames))
        return frames

    def decode(self, frames: Sequence[Any]) -> Message:
        self.last_authenticated = False
        count = len(frames)
        if not count:
            raise DecodeFailure(ErrorCode.MALFORMED_FRAME, "empty message: no frames")
        header = frames[0]
        if type(header) is not bytes:
            header = _buffer(header)
        total = len(header) if count == 1 else sum(len(_buffer(frame)) for frame in frames)
        if total > self.frame_bytes_max:
            raise DecodeFailure(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"message of {total} bytes exceeds the limit of {self.frame_bytes_max}",
                self._peek(header)[2],
            )
        tagged = None  # whether this cluster's tag is on the frames, once known
        if self.signer is not None and len(header) > UNTAGGED_BYTES_MAX:
            tagged = len(frames) > 1 and looks_like_tag(frames[-1]) and self.signer.verify(frames)
            if not tagged:
                self._refuse_unless_request(header)
        try:
            message = self._decoder.decode(header)
        except Exception as error:  # noqa: BLE001 - DecodeError, ValidationError, RecursionError, ...
            raise self._explain(header, error) from None
        expected = type(message).PAYLOAD_FIELDS
        if count == 1 and not expected:  # most messages: one frame, no payload, no tag
            return message
        if count == 2 + len(expected) and looks_like_tag(frames[-1]):
            self.last_authenticated = self.signer is not None and (
                tagged if tagged is not None else self.signer.verify(frames))
            count -= 1
        elif count != 1 + len(expected):
            raise DecodeFailure(
                ErrorCode.INVALID_REQUEST,
                f"{type(message).__name__} takes {1 + len(expected)} frames (plus an optional "
                f"{TAG_BYTES}-byte authentication tag), got {len(frames)}",
                getattr(message, "correlation_id", -1),
            )
        for name, frame in zip(expected, frames[1:count]):
            setattr(message, name, _buffer(frame))
        return message

    def _refuse_unless_request(self, header: Any) -> None:
        """Refuse a large header without this cluster's tag unless it is a request, reading only
        its type (msgspec skips the other fields without building them)."""
        try:
            kind = _raw_or_none(_name_decoder, _peek_decoder.decode(header).type)
        except Exception:  # noqa: BLE001 - not even a map of fields
            kind = None
        if kind not in self._request_names:
            raise DecodeFailure(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, (
                f"{_printable(kind)} of {len(header)} bytes is read only from a process of this cluster (it "
                f"carries no valid authentication tag); nothing was changed"))

    def _peek(self, header: Any) -> tuple[bool, Any, int]:
        """(a map of fields?, type name or None, correlation id or -1) of a header that may be
        anything."""
        if len(header) > PEEK_BYTES_MAX:
            return False, None, -1
        try:
            peek = _peek_decoder.decode(header)
        except Exception:  # noqa: BLE001 - not even a map of fields: know nothing of it
            return False, None, -1
        name = _raw_or_none(_name_decoder, peek.type)
        correlation_id = _raw_or_none(_int_decoder, peek.correlation_id)
        if not isinstance(correlation_id, int) or not 0 <= correlation_id <= CORRELATION_ID_MAX:
            correlation_id = -1
        return True, name, correlation_id

    def _explain(self, header: Any, error: Exception) -> DecodeFailure:
        """Turn a decode error into the most specific typed failure we can name."""
        is_map, kind, correlation_id = self._peek(header)
        if isinstance(error, RecursionError):
            return DecodeFailure(ErrorCode.MALFORMED_FRAME, "frame 0 nests arrays or maps too deeply", correlation_id)
        if not isinstance(error, msgspec.DecodeError):
            return DecodeFailure(ErrorCode.MALFORMED_FRAME,
                                 f"frame 0 could not be decoded ({type(error).__name__})", correlation_id)
        if not is_map:
            if isinstance(error, msgspec.ValidationError) and _is_map(header):  # too large to peek at; a field is wrong
                return DecodeFailure(ErrorCode.MALFORMED_FRAME, f"frame 0 of {len(header)} bytes (too large to peek "
                                                                f"at its type) does not decode: {error}")
            return DecodeFailure(ErrorCode.MALFORMED_FRAME, f"frame 0 is not a MessagePack map of fields: {error}")
        if kind in self._internal_names:
            return DecodeFailure(ErrorCode.UNKNOWN_MESSAGE, f"{kind} is internal and not accepted from the network",
                                 correlation_id)
        if kind not in self._known_names:
            return DecodeFailure(ErrorCode.UNKNOWN_MESSAGE, f"unknown message type {_printable(kind)}", correlation_id)
        return DecodeFailure(ErrorCode.INVALID_REQUEST, f"{kind} is invalid: {error}", correlation_id)


def _is_map(header: Any) -> bool:
    """Whether a MessagePack value starts as a map (fixmap, map 16, map 32)."""
    first = header[0] if len(header) else 0
    return 0x80 <= first <= 0x8F or first in (0xDE, 0xDF)


def _printable(kind: Any) -> str:
    text = repr(kind)
    return text if len(text) <= 80 else text[:77] + "..."
