"""A share member holds no more fetched bytes than its buffer, as a classic consumer does.

Found in an audit: each acquire's fetch asked the leader for `fetch_partition_bytes_max` (4 MiB)
however few records were acquired, the whole answer (a zero-copy view of the frame it came in)
went to the shell, and nothing counted the shell's chunks in bytes, only locks
(`prefetch_records_max`). A member whose user did not poll, acquiring one record at a time while
other members took the rest, was handed ~2 GB (500 acquires of 4 MiB) from an honest leader; one
record padded to 30 MiB by a process on a leader's port kept all 30 MiB alive. Now the member
counts what the shell holds and what its fetches may bring against `buffer_bytes_max`, acquires
only while there is room for what it acquires, keeps of an answer only the batches that hold its
records (copied out of the frame when they are less than all of it), and the shell reports what
`poll` used up.
"""

from __future__ import annotations

import functools

import zmq

from actors.consumer_client import ConsumerSettings
from actors.effects import Notify
from actors.messages import (
    AcquiredRecords, ClientCommand, FetchRequest, FetchResponse, MetadataRequest, MetadataResponse,
    PartitionMetadata, ShareAcquireRequest, ShareAcquireResponse, ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse, TopicMetadata,
)
from actors.share_member import ShareMember, ShareMemberSettings
from storage.batch import encode_batch, iter_batches
from tests.helpers import bytes_held_from
from tests.unit.actor_harness import Harness
from transport.codec import Codec

GROUPS = "tcp://127.0.0.1:5/groups"
PARTITIONS = 4
VALUE_BYTES = 60_000  # one record per batch: a fetch of 4 MiB brings ~70 of them
LOCKED_UNTIL_MS = 10**12


def leader(partition: int) -> str:
    return f"tcp://127.0.0.1:6/orders/{partition}"


def batch(offset: int, value_bytes: int = VALUE_BYTES) -> bytes:
    records = [(0, b"k", b"v" * value_bytes, None)]
    return bytes(encode_batch(records, 1_000, base_offset=offset, leader_epoch=1))


class Log:
    """Every partition's log: offset n is a batch of one record of VALUE_BYTES."""

    def __init__(self, length: int) -> None:
        self.bytes = b"".join(batch(offset) for offset in range(length))
        self.starts = [start for start, _ in iter_batches(self.bytes, verify=False)] + [len(self.bytes)]

    def answer(self, offset: int, max_bytes: int) -> memoryview:
        """What an honest leader answers: whole batches from `offset`, within `max_bytes` after
        the first (a view of one buffer, so the test itself holds no copies)."""
        first = self.starts[offset]
        end = offset + 1
        while end + 1 < len(self.starts) and self.starts[end + 1] - first <= max_bytes:
            end += 1
        return memoryview(self.bytes)[first:self.starts[end]]


class Stage:
    """One share member of a topic of PARTITIONS partitions; the test is its coordinators and
    leaders, and its user never polls."""

    def __init__(self, **settings) -> None:
        self.harness = Harness(wire=False)
        settings = ShareMemberSettings(group_id="g", **settings)
        self.member = ShareMember(bootstrap="bootstrap", settings=settings)
        self.harness.add("member", self.member)
        subscribe = ClientCommand(command="subscribe", arguments={"topics": ["orders"]}, token=1)
        self.harness.deliver("member", subscribe)
        asked = self.harness.take("bootstrap", MetadataRequest)[-1]
        partitions = [PartitionMetadata(partition=p, leader=1, leader_endpoint=leader(p))
                      for p in range(PARTITIONS)]
        self.harness.deliver("member", MetadataResponse(
            correlation_id=asked.correlation_id, group_coordinator_endpoint=GROUPS,
            topics=[TopicMetadata(name="orders", partitions=partitions)]), "bootstrap")
        beat = self.harness.take(GROUPS, ShareGroupHeartbeatRequest)[-1]
        self.harness.deliver("member", ShareGroupHeartbeatResponse(
            correlation_id=beat.correlation_id, member_id="m1",
            partitions=[("orders", p) for p in range(PARTITIONS)]), GROUPS)
        self.next_offset = [0] * PARTITIONS

    def one_record_per_acquire(self, log: Log, steps_max: int = 5_000) -> int:
        """Answer every acquire with one record (other members take the rest) and every fetch as
        an honest leader, until the member asks for nothing more. Returns how many acquires."""
        acquires = 0
        for _ in range(steps_max):
            requests = self.harness.take(GROUPS, ShareAcquireRequest)
            fetches = [(p, request) for p in range(PARTITIONS)
                       for request in self.harness.take(leader(p), FetchRequest)]
            if not requests and not fetches:
                return acquires
            for request in requests:
                acquires += 1
                offset = self.next_offset[request.partition]
                self.next_offset[request.partition] += 1
                self.harness.deliver("member", ShareAcquireResponse(
                    correlation_id=request.correlation_id, topic="orders", partition=request.partition,
                    lock_deadline_ms=LOCKED_UNTIL_MS,
                    acquired=[AcquiredRecords(first_offset=offset, last_offset=offset, delivery_count=1)]),
                    GROUPS)
            for partition, request in fetches:
                self.harness.deliver("member", FetchResponse(
                    correlation_id=request.correlation_id, topic="orders", partition=partition,
                    high_watermark=len(log.starts) - 1,
                    records=log.answer(request.offset, request.max_bytes)), leader(partition))
        raise AssertionError("the member never stopped asking")

    def handed_bytes(self) -> int:
        return sum(len(notice.payload[3]) for _, notice in self.harness.notified
                   if notice.kind == "share-records")

    def handed_offsets(self) -> int:
        return sum(last - first + 1 for _, notice in self.harness.notified if notice.kind == "share-records"
                   for first, last, _ in notice.payload[4])


@functools.cache
def log() -> Log:
    return Log(600)


def test_a_member_whose_user_does_not_poll_holds_no_more_fetched_bytes_than_a_classic_consumers_buffer():
    stage = Stage()
    buffer_bytes_max = ConsumerSettings().buffer_bytes_max  # 64 MiB

    acquires = stage.one_record_per_acquire(log())

    handed = stage.handed_bytes()
    assert handed <= buffer_bytes_max + len(batch(0)), (
        f"{handed:,} bytes handed to a shell that never polled, for {acquires} acquires of one record")
    # Nothing was acquired that the member could not hold: every acquired record came with its bytes.
    assert stage.handed_offsets() == acquires == sum(len(held) for held in stage.member.held.values())
    assert all(not reader.to_fetch and not reader.acquiring for reader in stage.member.readers.values())


def test_a_member_with_a_full_buffer_acquires_again_once_poll_used_some_up():
    stage = Stage(prefetch_records_max=2_000)  # locks are not what stops it here: bytes are
    buffer_bytes_max = ConsumerSettings().buffer_bytes_max

    acquires = stage.one_record_per_acquire(log())

    handed = stage.handed_bytes()
    assert buffer_bytes_max - 4 * 1024 * 1024 <= handed <= buffer_bytes_max + len(batch(0)), (
        f"{handed:,} bytes handed for {acquires} acquires of one record")
    assert stage.handed_offsets() == acquires < 2_000
    assert all(not reader.to_fetch and not reader.acquiring for reader in stage.member.readers.values())

    stage.harness.deliver("member", ClientCommand(command="consumed", arguments={"bytes": handed}))
    assert stage.harness.take(GROUPS, ShareAcquireRequest), "room again, and no acquire"
    assert stage.member.buffered_bytes == 0


def test_a_record_padded_to_megabytes_by_whoever_answers_on_a_leaders_port_is_not_held_whole():
    stage = Stage()
    [request] = [r for r in stage.harness.take(GROUPS, ShareAcquireRequest) if r.partition == 0]
    stage.harness.deliver("member", ShareAcquireResponse(
        correlation_id=request.correlation_id, topic="orders", partition=0, lock_deadline_ms=LOCKED_UNTIL_MS,
        acquired=[AcquiredRecords(first_offset=0, last_offset=0, delivery_count=1)]), GROUPS)
    [fetch] = stage.harness.take(leader(0), FetchRequest)
    codec = Codec()
    handed = []
    with bytes_held_from(__file__, at_most=1024 * 1024) as held:
        # The record acquired, then 30 MiB of others' records (a batch holds at most 16 MiB).
        padded = batch(0, 100) + batch(1, 15 * 1024 * 1024) + batch(2, 15 * 1024 * 1024)
        header, payload = codec.encode(FetchResponse(correlation_id=fetch.correlation_id, topic="orders",
                                                     partition=0, high_watermark=3, records=padded))
        arrived = codec.decode([header, zmq.Frame(payload, copy=False)])  # as the runtime reads it
        del padded, payload
        effects = stage.member.handle(arrived, leader(0), stage.harness.now_ns)
        del arrived
        handed = [effect.payload for effect in effects
                  if isinstance(effect, Notify) and effect.kind == "share-records"]
        del effects
    assert len(handed) == 1 and handed[0][4] == [[0, 0, 1]]
    assert held[0] < 1024 * 1024, f"{held[0]:,} bytes held for one acquired record of {len(batch(0, 100))} bytes"
