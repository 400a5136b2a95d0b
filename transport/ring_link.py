"""Fetch payloads through shared-memory rings between actors on the same host.

A fetcher (a follower replica, or a consumer) that can use a ring creates one per leader it
fetches from (it is the reader and the creator, so the ring's name lives under its own actor
prefix and dies with it) and names it in its `FetchRequest` together with its host identity. A
leader on the same host attaches as the ring's writer and, when answering that fetch, writes the
records into the ring and sends the `FetchResponse` over ZeroMQ without them (`ring_bytes` says
how many). The response is the doorbell: it is sent after the bytes are published, and the
fetcher reads the ring record when the response arrives, so nobody spins or waits.

Everything falls back to ZeroMQ on its own: a fetcher on another host, a ring that is full or
gone, a reader that died — the leader then sends the records in the response as usual. Each ring
record starts with the response's correlation id, so a record whose response was lost (a fault
switch, a dead peer) is skipped instead of being taken for the next answer. The bytes the actor
sees are the same either way.

Actors know nothing of this: the runtime calls `outgoing`/`incoming` around the codec, and
`release` once the actor has handled the message (a follower appends the view to its log before
that; a client copies, because its records outlive the step).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import struct
from collections import OrderedDict
from typing import Any

import msgspec

from actors.messages import FetchRequest, FetchResponse, MetadataResponse
from transport.doorbell import NullDoorbell
from transport.ring import PeerGone, RingClosed, RingCorrupt, RingError, RingKeyMismatch, RingReader, RingWriter
from transport.shm import SegmentNotOwned, segment_name

log = logging.getLogger("railmq.ring_link")

CORRELATION = struct.Struct("<q")
RINGS_MAX = 16  # rings one actor reads (leaders it fetches from) or writes (fetchers it serves)


def host_identity() -> str:
    """Same host = same kernel boot: /dev/shm is shared exactly there."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return f"{socket.gethostname()}/{handle.read().strip()}"
    except OSError:
        return f"{socket.gethostname()}/{os.getpid()}"  # no boot id: only this process matches


class RingLinks:
    def __init__(self, *, actor_id: str, cluster_id: str = "", capacity_bytes: int = 16 * 1024 * 1024,
                 zero_copy: bool, counters: dict[str, int], secret: bytes = b"") -> None:
        self.actor_id = actor_id
        self.cluster_id = cluster_id
        self.secret = secret  # a cluster process's: keys its rings' names (transport/shm.py actor_prefix)
        self.capacity_bytes = capacity_bytes
        self.zero_copy = zero_copy
        self.counters = counters
        self.host = host_identity()
        self.token = secrets.token_hex(4)  # a restarted process never reuses its rings' names
        self.readers: OrderedDict[str, RingReader] = OrderedDict()  # leader endpoint -> ring we read
        self.writers: OrderedDict[str, RingWriter] = OrderedDict()  # ring name -> ring we write
        self.promised: dict[tuple[bytes, int], str] = {}  # (fetcher, correlation id) -> ring name
        self.read_this_step = False
        self.doorbell = NullDoorbell()

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    # ------------------------------------------------------------------ fetcher side

    def outgoing(self, to: Any, message: Any) -> Any:
        """A fetch leaving for `to`: offer a ring when we can read one."""
        if not isinstance(message, FetchRequest) or not isinstance(to, str) or not self.cluster_id:
            return message
        reader = self._reader_for(to)
        if reader is None:
            return message
        # An answer the ring cannot hold would go over ZeroMQ: ask for no more than it holds (the
        # leader still sends a first batch larger than that whole, over ZeroMQ).
        max_bytes = min(message.max_bytes, reader.record_bytes_max - CORRELATION.size)
        return msgspec.structs.replace(message, ring=reader.name, ring_key=reader.key, host=self.host,
                                       max_bytes=max_bytes)

    def _reader_for(self, endpoint: str) -> RingReader | None:
        reader = self.readers.get(endpoint)
        if reader is not None:
            self.readers.move_to_end(endpoint)
            return reader
        name = segment_name(self.cluster_id, self.actor_id, f"{self.token}:{endpoint}", self.secret)
        try:
            reader = RingReader.create(name, self.capacity_bytes, payload_crc=False, replace=True,
                                       doorbell=self.doorbell)
        except (OSError, RingError, ValueError) as error:
            log.warning("%s: no ring for %s (%s); fetching over ZeroMQ", self.actor_id, endpoint, error)
            self.count("ring_create_failures")
            return None
        self.readers[endpoint] = reader
        while len(self.readers) > RINGS_MAX:
            self._drop_reader(next(iter(self.readers)))
        return reader

    def incoming(self, sender: Any, message: Any) -> Any:
        """A message arriving from `sender`: fill in records that came through a ring, note
        rings that fetchers offer us."""
        if isinstance(message, MetadataResponse) and message.cluster_id and not self.cluster_id:
            self.cluster_id = message.cluster_id
        if isinstance(message, FetchRequest):
            if message.ring and isinstance(sender, bytes):
                self._note_offer(sender, message)
            return message
        if not isinstance(message, FetchResponse) or message.ring_bytes < 0 or not isinstance(sender, str):
            return message
        records = self._take(sender, message)
        return msgspec.structs.replace(message, records=records, ring_bytes=-1)

    def _take(self, endpoint: str, response: FetchResponse) -> Any:
        reader = self.readers.get(endpoint)
        if reader is None:
            self.count("ring_misses")
            return b""
        try:
            while True:
                view = reader.try_read()
                if view is None:
                    self.count("ring_misses")  # the record is gone: the fetcher simply asks again
                    return b""
                correlation, = CORRELATION.unpack_from(view)
                if correlation == response.correlation_id:
                    break
                self.count("ring_records_skipped")  # its response was lost on the way
            payload = view[CORRELATION.size:]
            if len(payload) != response.ring_bytes:
                raise RingCorrupt(f"ring record of {len(payload)} bytes, response says {response.ring_bytes}")
            self.read_this_step = True
            self.count("ring_reads")
            return payload if self.zero_copy else bytes(payload)
        except (RingError, struct.error) as error:
            log.warning("%s: ring from %s failed (%s); back to ZeroMQ", self.actor_id, endpoint, error)
            self.count("ring_failures")
            self._drop_reader(endpoint)
            return b""

    def release(self) -> None:
        """The actor is done with this step's ring views: hand their bytes back to the writers."""
        if not self.read_this_step:
            return
        self.read_this_step = False
        for reader in self.readers.values():
            reader.release()

    def forget(self, endpoint: str) -> None:
        """The leader at `endpoint` is gone: unlink the ring we read from it."""
        if endpoint in self.readers:
            self._drop_reader(endpoint)

    def _drop_reader(self, endpoint: str) -> None:
        reader = self.readers.pop(endpoint)
        try:
            reader.close()
        except (BufferError, RingError):
            pass
        reader.unlink()

    # ------------------------------------------------------------------ leader side

    def _note_offer(self, fetcher: bytes, request: FetchRequest) -> None:
        """A fetch offers its ring. The name is a claim any client can make (/dev/shm lists the
        names, even to users who cannot map the segments): the offer must carry the key written
        in the ring, which only a process that can map it knows, or the leader would write one
        client's answers into another's ring and hold its writer end. And the segment must be
        ours alone (transport/shm.py): a ring another user made, with a key it knows, it could
        read or truncate under the leader's mapping (SIGBUS at the next write). A fetcher
        running as another user gets its answers over ZeroMQ."""
        if request.host != self.host:
            self.count("ring_offers_other_host")
            return
        writer = self.writers.get(request.ring)
        if writer is not None and writer.key != request.ring_key:
            self.count("ring_offers_refused")
            return
        if writer is None:
            try:
                self.writers[request.ring] = RingWriter.attach(request.ring, doorbell=self.doorbell,
                                                               key=request.ring_key)
            except (RingKeyMismatch, SegmentNotOwned):
                self.count("ring_offers_refused")
                return
            except (OSError, RingError, ValueError) as error:
                log.info("%s: cannot write ring %s (%s)", self.actor_id, request.ring, error)
                self.count("ring_attach_failures")
                return
            while len(self.writers) > RINGS_MAX:
                self._drop_writer(next(iter(self.writers)))
        self.writers.move_to_end(request.ring)
        if len(self.promised) > RINGS_MAX * 4:
            self.promised.clear()  # answers that never went out: their fetchers moved on
        self.promised[(fetcher, request.correlation_id)] = request.ring

    def divert(self, to: Any, message: Any) -> Any:
        """A fetch response leaving: put its records in the fetcher's ring when one was offered."""
        if not isinstance(message, FetchResponse) or not isinstance(to, bytes):
            return message
        ring = self.promised.pop((to, message.correlation_id), None)
        if ring is None or not len(message.records):
            return message
        writer = self.writers.get(ring)
        if writer is None:
            return message
        if CORRELATION.size + len(message.records) > writer.record_bytes_max:
            self.count("ring_oversize")  # one batch larger than the ring: ZeroMQ carries it, the ring stays
            return message
        try:
            written = writer.try_write(CORRELATION.pack(message.correlation_id), message.records)
        except (PeerGone, RingClosed, RingError) as error:
            log.info("%s: ring %s unusable (%s); answering over ZeroMQ", self.actor_id, ring, error)
            self._drop_writer(ring)
            written = False
        if not written:
            self.count("ring_fallbacks")  # full (the reader is slow) or gone: ZeroMQ carries it
            return message
        self.count("ring_writes")
        return msgspec.structs.replace(message, records=b"", ring_bytes=len(message.records))

    def _drop_writer(self, ring: str) -> None:
        """Let go of a ring a fetcher made. One whose reader died (a consumer killed with kill -9)
        is unlinked too: nobody else would while the cluster runs, and a consumer crashing again
        and again filled /dev/shm, which is memory, a ring (up to 8 MiB) at a time. A live
        reader's ring is its creator's to unlink."""
        writer = self.writers.pop(ring, None)
        if writer is None:
            return
        reader_gone = writer.peer_gone()
        try:
            writer.close()
        except (BufferError, RingError):
            pass
        if reader_gone and writer.unlink():  # unlink_segment leaves another user's file alone
            self.count("rings_of_dead_readers_unlinked")

    def close(self) -> None:
        for ring in list(self.writers):
            self._drop_writer(ring)
        for endpoint in list(self.readers):
            self._drop_reader(endpoint)
