"""The leader-epoch checkpoint of one partition replica: a list of (epoch, start offset).

Entry (epoch, start) says that batches from offset `start` up to the next entry's start were
written by the leader of `epoch`. A follower that comes back after a failover asks the leader
for the end offset of its own latest epoch and truncates to it (Kafka KIP-101; KIP-279 adds the
epoch to the answer so several leader changes in a row converge).

Invariants: epochs strictly increase along the list; start offsets never decrease; every batch
in the log at or past an entry's start (and before the next entry's) carries that entry's epoch,
which is what lets recovery detect a flipped epoch field (the field is outside the batch CRC).
The file is replaced atomically (write temporary, fsync, rename, fsync directory) on change;
it carries its own CRC, and a file that fails it, or whose entries break these invariants, is
reported and rebuilt from the batches.
"""

from __future__ import annotations

import struct
import zlib
from bisect import bisect_right

import msgspec

from storage.fs import FileSystem

EPOCH_CHECKPOINT_NAME = "leader-epoch-checkpoint"
_CRC = struct.Struct("<I")
# What is read of the file at most: ~15 bytes an epoch, so millions of leader changes still fit; a
# device or a sparse file in its place is an OSError naming it (the replica refuses to open).
EPOCH_CHECKPOINT_BYTES_MAX = 64 * 1024 * 1024
_decoder = msgspec.msgpack.Decoder(list[tuple[int, int]])


class EpochCheckpointCorrupt(Exception):
    """The checkpoint file does not check out (only ever raised inside storage)."""


class LeaderEpochCache:
    def __init__(self, fs: FileSystem, path: str, entries: list[tuple[int, int]] | None = None) -> None:
        self._fs = fs
        self._path = path
        self.entries: list[tuple[int, int]] = list(entries or [])
        self._starts = [start for _, start in self.entries]

    @classmethod
    def load(cls, fs: FileSystem, path: str) -> "LeaderEpochCache":
        """Read the checkpoint; raises EpochCheckpointCorrupt when it exists but does not check out."""
        if not fs.exists(path):
            return cls(fs, path)
        data = fs.read_file(path, EPOCH_CHECKPOINT_BYTES_MAX)
        if len(data) < _CRC.size or _CRC.unpack_from(data)[0] != zlib.crc32(data[_CRC.size:]):
            raise EpochCheckpointCorrupt(f"{path}: CRC mismatch or short file ({len(data)} bytes)")
        try:
            entries = _decoder.decode(data[_CRC.size:])
        except msgspec.DecodeError as error:
            raise EpochCheckpointCorrupt(f"{path}: {error}") from None
        entries = [(int(epoch), int(start)) for epoch, start in entries]
        problem = _broken_invariant(entries)
        if problem is not None:  # a CRC is no proof the writer was right: judge the content too
            raise EpochCheckpointCorrupt(f"{path}: {problem}")
        return cls(fs, path, entries)

    def persist(self) -> None:
        payload = msgspec.msgpack.encode(self.entries)
        self._fs.write_file_atomic(self._path, _CRC.pack(zlib.crc32(payload)) + payload)

    def _set(self, entries: list[tuple[int, int]]) -> bool:
        changed = entries != self.entries
        self.entries = entries
        self._starts = [start for _, start in entries]
        return changed

    # -- queries ----------------------------------------------------------------------------
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else -1

    def epoch_at(self, offset: int) -> int | None:
        """The epoch a batch starting at `offset` must carry (None: no entry covers it)."""
        slot = bisect_right(self._starts, offset) - 1
        return self.entries[slot][0] if slot >= 0 else None

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest known epoch <= `epoch`, its end offset), or (-1, -1) when there is none."""
        chosen = -1
        for slot, (known_epoch, _) in enumerate(self.entries):
            if known_epoch <= epoch:
                chosen = slot
        if chosen < 0:
            return -1, -1
        if chosen == len(self.entries) - 1:
            return self.entries[chosen][0], log_end_offset
        return self.entries[chosen][0], self.entries[chosen + 1][1]

    # -- changes (each returns True when the entries changed; the caller persists) -----------
    def check_assign(self, epoch: int, start_offset: int, log_end_offset: int) -> bool:
        """Validate an assignment; True if it adds an entry, False if it is already there."""
        if self.entries:
            latest_epoch, latest_start = self.entries[-1]
            if epoch == latest_epoch and start_offset >= latest_start:
                return False  # Kafka's LeaderEpochFileCache.assign: same epoch again is a no-op
            if epoch <= latest_epoch:
                raise ValueError(f"epoch {epoch} does not follow the latest epoch {latest_epoch}")
            if start_offset < latest_start:
                raise ValueError(f"epoch {epoch} starts at {start_offset}, before epoch {latest_epoch} "
                                 f"(at {latest_start})")
        if epoch < 0:
            raise ValueError(f"leader epochs are >= 0, got {epoch}")
        if start_offset < log_end_offset:
            raise ValueError(f"epoch {epoch} cannot start at {start_offset}, below the log end {log_end_offset}")
        return True

    def assign(self, epoch: int, start_offset: int, log_end_offset: int) -> bool:
        if not self.check_assign(epoch, start_offset, log_end_offset):
            return False
        return self._set(self.entries + [(epoch, start_offset)])

    def truncate_from_end(self, end_offset: int) -> bool:
        """Drop entries that start at or past `end_offset` (after a log truncation)."""
        return self._set([entry for entry in self.entries if entry[1] < end_offset])

    def drop_beyond(self, end_offset: int) -> bool:
        """Drop entries that start past `end_offset` (on open: their batches were lost). An
        entry starting exactly at the end stays: a leader assigns its epoch there before it has
        written anything, and a restart does not change which epoch it led."""
        return self._set([entry for entry in self.entries if entry[1] <= end_offset])

    def truncate_from_start(self, log_start_offset: int) -> bool:
        """Drop entries wholly below the log start; the one that spans it now starts there."""
        kept = [entry for entry in self.entries if entry[1] >= log_start_offset]
        below = [entry for entry in self.entries if entry[1] < log_start_offset]
        if below and (not kept or kept[0][1] > log_start_offset):
            kept.insert(0, (below[-1][0], log_start_offset))
        return self._set(kept)

    def restore(self, entries: list[tuple[int, int]]) -> bool:
        """Put back entries saved before a change that was rolled back."""
        return self._set(list(entries))

    def clear(self) -> bool:
        return self._set([])


def _broken_invariant(entries: list[tuple[int, int]]) -> str | None:
    """Why `entries` cannot have been written by this cache (see the module's invariants), or None.
    Trusting such a file would refuse good batches as carrying the "wrong" epoch."""
    for slot, (epoch, start) in enumerate(entries):
        if epoch < 0 or start < 0:
            return f"entry {slot} is ({epoch}, {start}): epochs and offsets are never negative"
        if slot and not (epoch > entries[slot - 1][0] and start >= entries[slot - 1][1]):
            return (f"entry {slot} ({epoch}, {start}) does not follow {entries[slot - 1]}: epochs strictly "
                    "increase and start offsets never decrease")
    return None
