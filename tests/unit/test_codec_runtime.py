"""The wire codec (transport/codec.py), named timers (transport/timers.py) and the runtime's rules.

Codec: every wire message type round-trips through frames (messages drawn by hypothesis from
the Struct definitions themselves, so a new message type is covered the day it is added), bulk
fields travel in their own frames, and every way a frame can be bad maps to its ErrorCode.
Runtime: one real ROUTER on 127.0.0.1 with a DEALER as the peer shows bad frames answered with
a typed error; a fake clock shows timers firing in deadline order and AfterFlush effects waiting
for their store's flush (one flush per store per wake-up).
"""

from __future__ import annotations

import time

import msgspec
import msgspec.inspect as inspect
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.effects import AfterFlush, Notify, Send, SetTimer
from actors.errors import ErrorCode
from actors.messages import (
    INTERNAL_TYPES, ErrorResponse, FetchRequest, FetchResponse, Message, MetadataRequest, MetadataResponse,
    ProduceRequest, TopicMetadata, all_message_types, wire_message_types,
)
from actors.limits import Limits
from transport.codec import Codec, DecodeFailure
from transport.runtime import Runtime
from transport.timers import Timers

INT64 = st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1)


def strategy(kind: inspect.Type) -> st.SearchStrategy:
    """Values of a msgspec type, built from its description (msgspec.inspect)."""
    match kind:
        case inspect.IntType(ge=low, le=high):  # bounds the decoder enforces (Raft's indices are >= 0)
            return st.integers(min_value=-(2 ** 63) if low is None else low,
                               max_value=2 ** 63 - 1 if high is None else high)
        case inspect.BoolType():
            return st.booleans()
        case inspect.FloatType():
            return st.floats(allow_nan=False)
        case inspect.StrType():
            return st.text(max_size=12)
        case inspect.BytesType():
            return st.binary(max_size=24)
        case inspect.NoneType():
            return st.none()
        case inspect.AnyType():  # on the wire only bulk payload fields are untyped: they are bytes
            return st.binary(max_size=64)
        case inspect.ListType(item_type=item):
            return st.lists(strategy(item), max_size=3)
        case inspect.TupleType(item_types=items):
            return st.tuples(*(strategy(item) for item in items))
        case inspect.DictType(key_type=key, value_type=value):
            return st.dictionaries(strategy(key), strategy(value), max_size=3)
        case inspect.UnionType(types=choices):
            return st.one_of(*(strategy(choice) for choice in choices))
        case inspect.StructType(cls=cls, fields=fields):
            return st.builds(cls, **{field.name: strategy(field.type) for field in fields})
    raise AssertionError(f"no strategy for {kind!r}: teach this test the new field type")


def messages_of(cls: type) -> st.SearchStrategy:
    return strategy(inspect.type_info(cls))


def round_trip(codec: Codec, message: Message) -> Message:
    return codec.decode([bytes(frame) for frame in codec.encode(message)])


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("cls", wire_message_types(), ids=lambda cls: cls.__name__)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_wire_message_type_round_trips_through_the_codec(cls, data):
    codec = Codec()
    message = data.draw(messages_of(cls))

    decoded = round_trip(codec, message)

    assert type(decoded) is cls
    assert decoded == message


def test_bulk_fields_travel_as_their_own_frames_and_the_header_frame_stays_small():
    codec = Codec()
    records = bytes(range(256)) * 1024
    message = FetchResponse(correlation_id=3, topic="orders", partition=1, high_watermark=9, records=records)

    frames = codec.encode(message)

    assert len(frames) == 2
    assert frames[1] is records, "the payload was copied into a new buffer"
    assert len(frames[0]) < 100
    assert round_trip(codec, message).records == records


def test_the_wire_union_is_every_message_except_the_internal_ones():
    assert set(wire_message_types()) == set(all_message_types()) - INTERNAL_TYPES


# ---------------------------------------------------------------------------- decode failures


ENCODE = msgspec.msgpack.encode


def failure(codec: Codec, frames: list) -> DecodeFailure:
    with pytest.raises(DecodeFailure) as caught:
        codec.decode(frames)
    return caught.value


@pytest.mark.parametrize("frames, code, correlation_id", [
    ([], ErrorCode.MALFORMED_FRAME, -1),
    ([b"\xc1"], ErrorCode.MALFORMED_FRAME, -1),
    ([ENCODE([1, 2, 3])], ErrorCode.MALFORMED_FRAME, -1),
    ([ENCODE({"type": "NoSuchMessage", "correlation_id": 5})], ErrorCode.UNKNOWN_MESSAGE, 5),
    ([ENCODE({"correlation_id": 6})], ErrorCode.UNKNOWN_MESSAGE, 6),
    ([ENCODE({"type": "FetchRequest", "correlation_id": 7, "topic": 5, "partition": 0, "offset": 0})],
     ErrorCode.INVALID_REQUEST, 7),
    ([ENCODE({"type": "FetchRequest", "correlation_id": 8, "topic": "t"})], ErrorCode.INVALID_REQUEST, 8),
    ([ENCODE({"type": "FetchRequest", "correlation_id": "x", "topic": 1})], ErrorCode.INVALID_REQUEST, -1),
], ids=["no-frames", "not-msgpack", "not-a-map", "unknown-type", "no-type", "wrong-field-type",
        "missing-fields", "bad-correlation-id"])
def test_each_kind_of_bad_frame_maps_to_its_error_code(frames, code, correlation_id):
    found = failure(Codec(), frames)

    assert (found.code, found.correlation_id) == (code, correlation_id)
    assert str(found)


@pytest.mark.parametrize("cls", sorted(INTERNAL_TYPES, key=lambda cls: cls.__name__),
                         ids=lambda cls: cls.__name__)
def test_internal_messages_are_refused_from_the_network(cls):
    header = ENCODE({"type": cls.__name__, "correlation_id": 4})

    found = failure(Codec(), [header])

    assert found.code == ErrorCode.UNKNOWN_MESSAGE
    assert "internal" in str(found)


def test_a_payload_message_with_the_wrong_number_of_frames_is_invalid():
    codec = Codec()
    header, payload = codec.encode(ProduceRequest(correlation_id=12, topic="t", partition=0, batch=b"abc"))

    missing = failure(codec, [header])
    extra = failure(codec, [header, payload, b"more"])

    assert (missing.code, missing.correlation_id) == (ErrorCode.INVALID_REQUEST, 12)
    assert extra.code == ErrorCode.INVALID_REQUEST


def test_a_message_over_the_size_limit_is_refused_and_keeps_its_correlation_id():
    codec = Codec(frame_bytes_max=1_000)
    frames = codec.encode(ProduceRequest(correlation_id=21, topic="t", partition=0, batch=b"x" * 2_000))

    found = failure(codec, frames)

    assert (found.code, found.correlation_id) == (ErrorCode.MESSAGE_TOO_LARGE, 21)


# ---------------------------------------------------------------------------- timers


def test_timers_fire_once_each_in_deadline_order():
    timers = Timers()
    for name, deadline in (("c", 30), ("a", 10), ("b", 20), ("late", 99)):
        timers.set(name, deadline)

    assert timers.next_deadline() == 10
    assert timers.pop_due(25) == ["a", "b"]
    assert timers.pop_due(25) == []
    assert timers.pop_due(50) == ["c"]
    assert len(timers) == 1


def test_setting_a_timer_again_replaces_its_deadline_and_cancel_forgets_it():
    timers = Timers()
    timers.set("retry", 10)
    timers.set("retry", 40)
    timers.set("gone", 5)
    timers.cancel("gone")
    timers.cancel("never-set")

    assert timers.pop_due(20) == []
    assert timers.deadline("retry") == 40
    assert timers.pop_due(40) == ["retry"]


def test_timers_with_the_same_deadline_fire_in_the_order_they_were_set():
    timers = Timers()
    for name in ("first", "second", "third"):
        timers.set(name, 7)

    assert timers.pop_due(7) == ["first", "second", "third"]


# ---------------------------------------------------------------------------- the runtime


class Recorder:
    """An actor that does what the test scripts and records what it is given."""

    name = "recorder"

    def __init__(self, journal: list, on_start=(), on_message=None) -> None:
        self.journal = journal
        self.on_start = list(on_start)
        self.on_message = on_message or (lambda message, sender: [])

    def start(self, now_ns: int) -> list:
        return self.on_start

    def handle(self, message, sender, now_ns: int) -> list:
        name = getattr(message, "name", None)
        self.journal.append(("handle", type(message).__name__, name, sender, now_ns))
        return self.on_message(message, sender)

    def invariants(self) -> None:
        pass


class Store:
    def __init__(self, journal: list, name: str) -> None:
        self.journal, self.name = journal, name

    def flush(self) -> None:
        self.journal.append(("flush", self.name))


class FakeClock:
    def __init__(self, now_ns: int = 0) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns


def test_the_runtime_fires_due_timers_in_deadline_order_with_the_clocks_time(zmq_context):
    journal: list = []
    clock = FakeClock(1_000)
    actor = Recorder(journal, on_start=[SetTimer("c", 1_300), SetTimer("a", 1_100), SetTimer("b", 1_200),
                                        SetTimer("later", 9_000)])
    runtime = Runtime(actor, identity="t", context=zmq_context, clock=clock)
    try:
        runtime.apply(actor.start(clock()))
        clock.now_ns = 1_250
        runtime.step()
        clock.now_ns = 1_300
        runtime.step()
    finally:
        runtime.close()

    assert [(entry[2], entry[4]) for entry in journal] == [("a", 1_250), ("b", 1_250), ("c", 1_300)]
    assert runtime.timers.deadline("later") == 9_000


def test_after_flush_effects_wait_for_one_flush_per_store_per_wake_up(zmq_context):
    journal: list = []
    clock = FakeClock(0)
    log, state = Store(journal, "log"), Store(journal, "state")
    def script(message, sender):
        tag = message.name
        return [AfterFlush(log, (Notify("reply", f"{tag}-log"),)),
                AfterFlush(state, (Notify("reply", f"{tag}-state"),)),
                Notify("reply", f"{tag}-now")]

    actor = Recorder(journal, on_start=[SetTimer("one", 0), SetTimer("two", 0)], on_message=script)
    runtime = Runtime(actor, identity="t", context=zmq_context, clock=clock,
                      on_notify=lambda kind, payload: journal.append(("notify", payload)))
    try:
        runtime.apply(actor.start(0))
        runtime.step()
    finally:
        runtime.close()

    order = [f"handle-{entry[2]}" if entry[0] == "handle" else entry[1] for entry in journal]
    assert order == ["handle-one", "one-now", "handle-two", "two-now", "log", "state",
                     "one-log", "one-state", "two-log", "two-state"]


@pytest.fixture
def wired(zmq_context):
    """A runtime bound on loopback around a Recorder, and a DEALER connected to it as the peer."""
    journal: list = []
    actor = Recorder(journal, on_message=lambda message, sender: [])
    runtime = Runtime(actor, identity="wired", context=zmq_context)
    endpoint = runtime.bind()
    peer = zmq_context.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.RCVTIMEO, 2_000)
    peer.connect(endpoint)
    try:
        yield runtime, peer, journal
    finally:
        peer.close(linger=0)
        runtime.close()


def exchange(runtime: Runtime, peer, frames: list, journal: list) -> None:
    """Send frames from the peer and let the runtime wake until it has answered or handed them on.

    One wake-up is not enough: the runtime may first wake for the peer's connection (its monitor
    socket) and only then for the frames."""
    peer.send_multipart(frames)
    deadline = time.monotonic() + 5.0
    while not journal and not peer.poll(0) and time.monotonic() < deadline:
        runtime.step()


@pytest.mark.parametrize("frames, code", [
    ([b"\xc1"], ErrorCode.MALFORMED_FRAME),
    ([ENCODE({"type": "Unheard", "correlation_id": 31})], ErrorCode.UNKNOWN_MESSAGE),
    ([ENCODE({"type": "TimerFired", "correlation_id": 32, "name": "x"})], ErrorCode.UNKNOWN_MESSAGE),
    ([ENCODE({"type": "FetchRequest", "correlation_id": 33})], ErrorCode.INVALID_REQUEST),
], ids=["not-msgpack", "unknown-type", "internal-type", "invalid-fields"])
def test_the_runtime_answers_a_bad_frame_with_a_typed_error_and_never_bothers_the_actor(wired, frames, code):
    runtime, peer, journal = wired

    exchange(runtime, peer, frames, journal)
    reply = Codec().decode(peer.recv_multipart())

    assert isinstance(reply, ErrorResponse)
    assert reply.error == code
    assert journal == []
    assert runtime.counters[f"decode_error_{code.name.lower()}"] == 1


def test_the_runtime_hands_a_good_frame_to_the_actor_with_the_peers_return_address(wired):
    runtime, peer, journal = wired
    request = FetchRequest(correlation_id=40, topic="orders", partition=0, offset=3)

    exchange(runtime, peer, Codec().encode(request), journal)

    [(kind, name, _, sender, _)] = journal
    assert (kind, name) == ("handle", "FetchRequest")
    assert isinstance(sender, bytes) and sender


def test_an_actor_process_profiled_through_the_environment_leaves_a_pstats_file(tmp_path, monkeypatch):
    import pstats

    from transport import actor_main

    class FakeRuntime:
        def run(self) -> None:
            sorted(range(1000))

    monkeypatch.setenv(actor_main.PROFILE_ENV, str(tmp_path))
    actor_main._run_profiled(FakeRuntime(), "replica/t/0")
    [path] = tmp_path.iterdir()
    assert path.name.startswith("replica_t_0.") and path.suffix == ".prof"
    assert any(name == "run" for (_, _, name) in pstats.Stats(str(path)).stats)


def test_answers_of_any_kind_to_a_peer_that_never_reads_are_bounded_in_bytes(zmq_context):
    """Metadata answers of ~8 KiB each, to a peer that never reads: once its unread bytes reach the
    peer's budget, each further answer is a small BUSY naming its request, not the answer; once the
    peer has read, it is answered in full again."""
    big = MetadataResponse(correlation_id=0, topics=[TopicMetadata(name=f"topic-{index:04d}-{'x' * 60}")
                                                     for index in range(110)])
    assert len(Codec().encode(big)[0]) > 8_000
    actor = Recorder([], on_message=lambda message, sender: [
        Send(sender, msgspec.structs.replace(big, correlation_id=message.correlation_id))])
    limits = Limits(peer_outbound_bytes_max=256 * 1024, outbound_bytes_max=1024 * 1024)
    runtime = Runtime(actor, identity="answers", context=zmq_context, limits=limits)
    peer = zmq_context.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.RCVHWM, 1)
    peer.setsockopt(zmq.RCVBUF, 4096)
    peer.setsockopt(zmq.RCVTIMEO, 2_000)

    def wake(times: int) -> None:
        for _ in range(times):
            runtime.step_until(time.time_ns() + 1_000_000)

    try:
        peer.connect(runtime.bind())
        requests = 2_000  # ~16 MB of answers: far more than the kernel's socket buffers take
        for index in range(requests):
            peer.send_multipart(Codec().encode(MetadataRequest(correlation_id=index + 1)))
            if index % 10 == 9:
                wake(3)
        wake(100)
        unread = runtime.outbound.total_bytes
        withheld = runtime.counters.get("answers_withheld_unread_backlog", 0)
        answers = []
        while peer.poll(500):
            answers.append(Codec().decode(peer.recv_multipart()))
            wake(1)
        peer.send_multipart(Codec().encode(MetadataRequest(correlation_id=requests + 1)))
        wake(20)
        after_reading = Codec().decode(peer.recv_multipart())
    finally:
        peer.close(linger=0)
        runtime.close()

    assert unread <= limits.peer_outbound_bytes_max
    assert withheld > requests // 2, f"only {withheld} of {requests} answers were withheld"
    assert isinstance(answers[0], MetadataResponse) and answers[0].correlation_id == 1
    busy = [answer for answer in answers if isinstance(answer, ErrorResponse)]
    assert busy and all(answer.error == ErrorCode.BUSY and "unread" in answer.error_message for answer in busy)
    assert {answer.correlation_id for answer in busy} <= set(range(2, requests + 1))
    assert isinstance(after_reading, MetadataResponse) and after_reading.correlation_id == requests + 1


def test_an_answer_that_cannot_be_encoded_becomes_a_typed_error_and_the_actor_goes_on(zmq_context):
    """An int past 64 bits in an answer raised OverflowError out of the codec and stopped the actor
    (its supervisor restarts it, to meet the same request again); the asker waited out its timeout."""
    journal: list = []
    actor = Recorder(journal, on_message=lambda message, sender: [
        Send(sender, FetchResponse(correlation_id=message.correlation_id, high_watermark=2**64 + message.offset))])
    runtime = Runtime(actor, identity="unencodable", context=zmq_context)
    peer = zmq_context.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.RCVTIMEO, 2_000)
    peer.connect(runtime.bind())
    try:
        for correlation_id in (50, 51):
            journal.clear()
            exchange(runtime, peer, Codec().encode(FetchRequest(correlation_id=correlation_id, topic="orders",
                                                                partition=0, offset=3)), journal)
            deadline = time.monotonic() + 5.0
            while not peer.poll(0) and time.monotonic() < deadline:
                runtime.step()
            reply = Codec().decode(peer.recv_multipart())
            assert isinstance(reply, ErrorResponse) and reply.correlation_id == correlation_id
            assert reply.error == ErrorCode.INVALID_REQUEST and "FetchResponse" in reply.error_message
    finally:
        peer.close(linger=0)
        runtime.close()
    assert runtime.counters["messages_unencodable"] == 2


def test_a_request_that_cannot_be_encoded_is_refused_back_to_its_sender_at_the_next_wake_up(zmq_context):
    """A client's request with an offset past int64 (a seek to 10**30) was dropped, and the client
    waited for an answer that never came; now its actor gets INVALID_REQUEST as from the peer."""
    journal: list = []
    answers: list = []
    clock = FakeClock(1_000)
    peer = "tcp://127.0.0.1:1/nobody"
    actor = Recorder(journal, on_start=[Send(peer, FetchRequest(correlation_id=60, topic="t", partition=0,
                                                                offset=10**30))],
                     on_message=lambda message, sender: answers.append(message) or [])
    runtime = Runtime(actor, identity="asker", context=zmq_context, clock=clock)
    try:
        runtime.apply(actor.start(clock()))
        runtime.step()
    finally:
        runtime.close()

    [(kind, name, _, sender, _)] = journal
    assert (kind, name, sender) == ("handle", "ErrorResponse", peer)
    assert (answers[0].correlation_id, answers[0].error) == (60, ErrorCode.INVALID_REQUEST)
    assert answers[0].error_message.startswith("FetchRequest cannot be sent")  # said once, not "INVALID_REQUEST: "
    assert runtime.counters["messages_unencodable"] == 1
