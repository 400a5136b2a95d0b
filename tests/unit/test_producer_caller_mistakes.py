"""A caller's mistakes on a `Producer`: each is a typed error at the call, and the producer goes on.

No cluster: the bootstrap is a port nobody listens on, and where a send needs a partition count
the test hands the producer the metadata notice its I/O thread would deliver. Batches then wait
for a leader that never comes and fail at their delivery deadline, which is when callbacks run.
"""

from __future__ import annotations

import sys
import threading

import pytest

from actors.errors import ErrorCode, RailmqError
from actors.messages import PartitionMetadata, TopicMetadata
from railmq.producer import Producer, SendFuture

NOBODY = "tcp://127.0.0.1:1"


@pytest.fixture
def producer():
    producer = Producer(NOBODY, max_block_ms=300, delivery_timeout_ms=300, linger_ms=0)
    producer._metadata([TopicMetadata(name="t", partitions=[PartitionMetadata(partition=0),
                                                            PartitionMetadata(partition=1)])])
    yield producer
    producer.close(timeout=2)


def still_working(producer: Producer) -> None:
    """The I/O thread is alive and completes a send (here: fails it at its delivery deadline)."""
    assert producer._engine.failure is None and producer._engine.alive
    with pytest.raises(RailmqError) as failed:
        producer.send("t", b"after", partition=0).result(5)
    assert failed.value.code == ErrorCode.REQUEST_TIMED_OUT


@pytest.mark.timeout(30)
@pytest.mark.parametrize("topic", [None, 5, b"t", ["t"]])
def test_a_topic_that_is_not_a_string_is_a_type_error_and_the_producer_goes_on(producer, topic):
    # Before: the name reached the I/O thread's metadata request, whose len(None) killed the thread;
    # this send then timed out, and so did every later one.
    for call in (lambda: producer.send(topic, b"x"), lambda: producer.send(topic, b"x", key=b"k"),
                 lambda: producer.send_batch(topic, [b"x"]), lambda: producer.partitions_for(topic)):
        with pytest.raises(TypeError, match="topic"):
            call()
    still_working(producer)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("partition", [0.5, "1", True])
def test_a_partition_that_is_not_an_int_is_a_type_error(producer, partition):
    for call in (lambda: producer.send("t", b"x", partition=partition),
                 lambda: producer.send_batch("t", [b"x"], partition=partition)):
        with pytest.raises(TypeError, match="partition"):
            call()
    still_working(producer)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("headers", [[(b"name", b"v")], [(1, b"v")], [("a", b"v", b"w")], [b"av"], "ab"])
def test_headers_must_be_pairs_of_a_str_name_and_a_value(producer, headers):
    # Before: a bytes name was sent as its repr ("b'name'") without a word.
    with pytest.raises(TypeError, match="header"):
        producer.send("t", b"x", partition=0, headers=headers)
    still_working(producer)


def on_first_done(producer: Producer, action) -> tuple[list, SendFuture]:
    """Send two batches; when the first completes, run `action` in its callback (the I/O thread).
    Returns, once the callback has begun, what it saw (its error, or "returned": filled in later)
    and the second send's future."""
    seen: list = []
    began = threading.Event()

    def callback(future) -> None:
        began.set()
        try:
            action()
            seen.append("returned")
        except Exception as error:  # noqa: BLE001 - what the callback saw is the test's subject
            seen.append(error)

    producer.send("t", b"first", partition=0).add_done_callback(callback)
    second = producer.send("t", b"second", partition=1)
    assert began.wait(10)
    return seen, second


@pytest.mark.timeout(30)
def test_flush_inside_a_callback_is_refused_not_a_deadlock_of_the_io_thread(producer):
    # Before: flush waited, in the I/O thread, for batches only that thread could complete; the
    # second batch never failed at its deadline and no later send was ever delivered.
    seen, _ = on_first_done(producer, producer.flush)
    third = producer.send("t", b"third", partition=0).exception(5)
    assert isinstance(third, RailmqError) and third.code == ErrorCode.REQUEST_TIMED_OUT, third
    assert isinstance(seen[0], RailmqError) and seen[0].code == ErrorCode.INVALID_REQUEST
    assert "callback" in str(seen[0])
    still_working(producer)


@pytest.mark.timeout(30)
def test_close_inside_a_callback_closes_at_once_and_fails_what_is_left(producer):
    # Kafka's close from a callback is close(0): nothing is waited for, nothing is left pending.
    seen, second = on_first_done(producer, producer.close)
    stopped = threading.Event()
    threading.Thread(target=lambda: (producer._engine._thread.join(5), stopped.set()), daemon=True).start()
    assert stopped.wait(10), "the I/O thread never ended"
    assert seen == ["returned"]
    assert isinstance(second.exception(5), RailmqError)
    with pytest.raises(RailmqError, match="closed"):
        producer.send("t", b"late", partition=0)
    assert producer._engine.failure is None


@pytest.mark.timeout(30)
def test_an_empty_send_batch_is_done_at_once_with_no_records(producer):
    # Before: without keys, "ValueError: max() arg is an empty sequence" (with keys=[]: a future).
    assert producer.send_batch("t", []).result(1) == []
    assert producer.send_batch("t", [], partition=1).result(1) == []
    still_working(producer)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("timestamp_ms", [1.9, "12", True])
def test_a_timestamp_that_is_not_an_int_is_a_type_error(producer, timestamp_ms):
    # Before: 1.9 was sent as 1 and "12" as 12, without a word.
    with pytest.raises(TypeError, match="timestamp"):
        producer.send("t", b"x", partition=0, timestamp_ms=timestamp_ms)
    with pytest.raises(TypeError, match="timestamp"):
        producer.send_batch("t", [b"x"], partition=0, timestamp_ms=timestamp_ms)


@pytest.mark.timeout(30)
def test_a_callback_that_calls_sys_exit_does_not_end_the_io_thread(producer):
    # Before: SystemExit is not an Exception, so it ended the I/O thread; later sends were still
    # taken and their futures never completed (result() without a timeout waited for ever).
    seen, second = on_first_done(producer, lambda: sys.exit(3))
    assert isinstance(second.exception(5), RailmqError)
    still_working(producer)


@pytest.mark.timeout(30)
def test_a_send_on_a_producer_whose_io_thread_failed_is_refused_at_once(producer):
    producer._engine.failure = MemoryError("as if the I/O thread had died of it")
    try:
        with pytest.raises(RuntimeError, match="I/O thread failed"):
            producer.send("t", b"x", partition=0)
        with pytest.raises(RuntimeError, match="I/O thread failed"):
            producer.send_batch("t", [b"x"], partition=0)
    finally:
        producer._engine.failure = None  # for the fixture's close
