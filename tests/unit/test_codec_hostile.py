"""The codec against frames an attacker would write: every class of malformed frame becomes a
typed `DecodeFailure` (never another exception), and the correlation id it names is one the
codec itself can encode back, or -1."""

from __future__ import annotations

import msgspec
import pytest

from actors.errors import ErrorCode, RailmqError
from actors.messages import (CORRELATION_ID_MAX, SHORT_TEXT_CHARS_MAX, ErrorResponse, FetchRequest, MetadataRequest,
                             ProduceRequest, ReplicaHeartbeatResponse)
from transport.auth import TAG_BYTES, looks_like_tag, new_secret
from transport.codec import PEEK_BYTES_MAX, Codec, DecodeFailure

ENCODE = msgspec.msgpack.encode


def nested(depth: int) -> bytes:
    """`depth` arrays inside each other, as raw MessagePack (fixarray of one element)."""
    return b"\x91" * depth + b"\xc0"


def map_of(**fields: bytes) -> bytes:
    """A MessagePack map whose values are raw MessagePack bytes."""
    out = bytes([0x80 | len(fields)])
    for name, raw in fields.items():
        out += ENCODE(name) + raw
    return out


def decode_failure(frames: list, codec: Codec | None = None) -> DecodeFailure:
    with pytest.raises(DecodeFailure) as caught:
        (codec or Codec()).decode(frames)
    return caught.value


def echoable(failure: DecodeFailure) -> None:
    """The error answer the runtime would send must itself encode and decode."""
    answer = ErrorResponse(correlation_id=failure.correlation_id, error=failure.code, error_message=str(failure))
    assert Codec().decode(Codec().encode(answer)) == answer


@pytest.mark.parametrize("depth", [100, 1_000, 100_000])
def test_a_deeply_nested_correlation_id_is_a_malformed_frame_not_a_crash(depth):
    frame = map_of(type=ENCODE("MetadataRequest"), correlation_id=nested(depth))

    failure = decode_failure([frame])

    assert failure.code in (ErrorCode.MALFORMED_FRAME, ErrorCode.INVALID_REQUEST)
    assert failure.correlation_id == -1
    echoable(failure)


def test_deep_nesting_in_a_field_the_message_does_not_have_is_a_malformed_frame():
    # msgspec recurses also while it skips a field it does not know; so does the peek for a
    # correlation id, which gives up (-1) rather than dig through hostile nesting.
    frame = map_of(type=ENCODE("MetadataRequest"), correlation_id=ENCODE(41), junk=nested(100_000))

    failure = decode_failure([frame])

    assert (failure.code, failure.correlation_id) == (ErrorCode.MALFORMED_FRAME, -1)
    echoable(failure)


def test_moderate_nesting_in_an_unknown_field_is_skipped():
    frame = map_of(type=ENCODE("MetadataRequest"), correlation_id=ENCODE(41), junk=nested(200))

    assert Codec().decode([frame]) == MetadataRequest(correlation_id=41)


def test_deep_nesting_in_a_payload_field_of_the_header_is_refused():
    frame = map_of(type=ENCODE("ProduceRequest"), correlation_id=ENCODE(3), topic=ENCODE("t"),
                   partition=ENCODE(0), batch=nested(50_000))

    failure = decode_failure([frame, b"x"])

    assert (failure.code, failure.correlation_id) == (ErrorCode.MALFORMED_FRAME, -1)
    assert "$.batch" in str(failure)  # too large to peek at, but the error names the field


def test_a_payload_field_in_the_header_must_be_bytes():
    frame = map_of(type=ENCODE("ProduceRequest"), correlation_id=ENCODE(3), topic=ENCODE("t"),
                   partition=ENCODE(0), batch=ENCODE([1, 2]))

    failure = decode_failure([frame, b"x"])

    assert (failure.code, failure.correlation_id) == (ErrorCode.INVALID_REQUEST, 3)


@pytest.mark.parametrize("value", [True, False, -5, 2**64 - 1, 1.5, "7", None],
                         ids=["true", "false", "negative", "uint64-max", "float", "string", "nil"])
def test_a_correlation_id_that_is_not_a_63_bit_int_is_never_echoed(value):
    frame = ENCODE({"type": "MetadataRequest", "correlation_id": value, "topics": 5})

    failure = decode_failure([frame])

    assert failure.correlation_id == -1
    assert failure.code == ErrorCode.INVALID_REQUEST
    echoable(failure)


def test_the_largest_correlation_id_is_accepted_and_echoed():
    message = MetadataRequest(correlation_id=CORRELATION_ID_MAX)

    assert Codec().decode(Codec().encode(message)).correlation_id == CORRELATION_ID_MAX


def test_a_bool_correlation_id_in_a_well_formed_request_is_invalid():
    failure = decode_failure([ENCODE({"type": "MetadataRequest", "correlation_id": True})])

    assert (failure.code, failure.correlation_id) == (ErrorCode.INVALID_REQUEST, -1)


def test_an_oversized_header_is_not_peeked_at():
    frame = map_of(type=ENCODE("MetadataRequest"), correlation_id=ENCODE(9), topics=ENCODE(5),
                   junk=ENCODE(b"x" * (PEEK_BYTES_MAX + 1)))

    failure = decode_failure([frame])

    assert failure.correlation_id == -1


@pytest.mark.parametrize("frames", [
    [ENCODE({"type": 5, "correlation_id": 1})],
    [ENCODE({"type": ["x"] * 10, "correlation_id": 1})],
    [ENCODE({b"type": "MetadataRequest", "correlation_id": 1})],
    [ENCODE({"type": "MetadataRequest", "correlation_id": 1, "topics": [[[["x"]]]]})],
    [ENCODE({"type": "x" * 100_000, "correlation_id": 1})],
    [b"\xdf\xff\xff\xff\xff"],  # a map claiming 4 billion entries
    [b"\xdd\xff\xff\xff\xff"],  # an array claiming 4 billion entries
    [b"\xc7\x05\x01abc"],  # a truncated ext
    [b"\x81\xa4type"],  # a map whose value is missing
], ids=["int-type", "list-type", "binary-key", "nested-wrong-type", "huge-type-name", "huge-map", "huge-array",
        "truncated-ext", "truncated-map"])
def test_structurally_hostile_headers_are_typed_failures(frames):
    failure = decode_failure(frames)

    assert failure.code in (ErrorCode.MALFORMED_FRAME, ErrorCode.UNKNOWN_MESSAGE, ErrorCode.INVALID_REQUEST)
    assert len(str(failure)) < 2000, "the error sentence must stay short whatever the input"
    echoable(failure)


@pytest.mark.parametrize("count", [1, 3, 4, 10])
def test_a_payload_message_with_the_wrong_number_of_frames_is_invalid(count):
    header = Codec().encode(ProduceRequest(correlation_id=4, topic="t", partition=0, batch=b"b"))[0]

    failure = decode_failure([header] + [b"x"] * (count - 1))

    assert (failure.code, failure.correlation_id) == (ErrorCode.INVALID_REQUEST, 4)


def test_extra_frames_on_a_message_without_payload_are_invalid():
    header = Codec().encode(MetadataRequest(correlation_id=2))[0]

    failure = decode_failure([header, b"surplus"])

    assert (failure.code, failure.correlation_id) == (ErrorCode.INVALID_REQUEST, 2)


# ---------------------------------------------------------------------------- the authentication tag


def test_a_cluster_codec_tags_what_it_sends_and_recognises_its_own_tag():
    secret = new_secret()
    sender, receiver = Codec(secret=secret), Codec(secret=secret)
    frames = sender.encode(FetchRequest(correlation_id=1, topic="t", partition=0, offset=0, replica=2))

    assert looks_like_tag(frames[-1]) and len(frames[-1]) == TAG_BYTES
    receiver.decode(frames)
    assert receiver.last_authenticated


def test_a_client_codec_sends_no_tag_and_its_messages_are_not_authenticated():
    receiver = Codec(secret=new_secret())
    frames = Codec().encode(FetchRequest(correlation_id=1, topic="t", partition=0, offset=0, replica=2))

    assert len(frames) == 1
    receiver.decode(frames)
    assert not receiver.last_authenticated


def test_another_clusters_tag_does_not_authenticate():
    frames = Codec(secret=new_secret()).encode(ReplicaHeartbeatResponse(deleted=True))
    receiver = Codec(secret=new_secret())

    receiver.decode(frames)

    assert not receiver.last_authenticated


def test_a_tag_over_other_content_does_not_authenticate():
    secret = new_secret()
    codec = Codec(secret=secret)
    honest = codec.encode(ReplicaHeartbeatResponse(deleted=False))
    forged = Codec().encode(ReplicaHeartbeatResponse(deleted=True)) + [honest[-1]]

    codec.decode(forged)

    assert not codec.last_authenticated


def test_the_tag_covers_payload_lengths():
    secret = new_secret()
    codec = Codec(secret=secret)
    header, payload, tag = codec.encode(ProduceRequest(correlation_id=1, topic="t", partition=0, batch=b"abc"))

    codec.decode([header, b"abcd", tag])

    assert not codec.last_authenticated


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**23, "\ud800"])
def test_a_message_with_a_value_msgpack_cannot_hold_is_a_typed_error_not_an_overflow(value):
    """`railmq topics create --config retention_ms=99999999999999999999999` ended in an
    OverflowError traceback from inside the codec (and a lone surrogate in a string, in a
    UnicodeEncodeError)."""
    request = (FetchRequest(correlation_id=1, topic=value, partition=0, offset=0) if isinstance(value, str)
               else FetchRequest(correlation_id=1, topic="t", partition=0, offset=value))

    with pytest.raises(RailmqError) as refused:
        Codec().encode(request)

    assert refused.value.code == ErrorCode.INVALID_REQUEST and "FetchRequest" in str(refused.value)


@pytest.mark.parametrize("field", ["host", "ring"])
def test_a_fetch_with_a_host_or_ring_name_no_host_or_ring_has_is_refused_before_it_can_be_parked(field):
    """A fetch with nothing to return waits at the leader (the purgatory, 10,000 of them), kept
    whole: 1,000 fetches each naming a 1 MiB host held 1 GB of a leader."""
    frames = Codec().encode(FetchRequest(correlation_id=5, topic="t", partition=0, offset=0, **{field: "h" * (1 << 20)}))

    with pytest.raises(DecodeFailure) as refused:
        Codec().decode(frames)
    # A header this large is not peeked at for its type and correlation id (PEEK_BYTES_MAX).
    assert refused.value.code == ErrorCode.MALFORMED_FRAME and f"$.{field}" in str(refused.value)
    assert Codec().decode(Codec().encode(FetchRequest(correlation_id=6, topic="t", partition=0, offset=0,
                                                  **{field: "h" * SHORT_TEXT_CHARS_MAX}))).correlation_id == 6
