"""Crash recovery of a partition log directory: what `PartitionLog.open` runs before serving.

Two regions, two rules:
- Below the recovery point (the last checkpointed flush) the bytes were made durable, so a
  failure there is corruption, not a torn write. The region gets a cheap header walk (every
  header validated, offsets contiguous, each batch's epoch equal to what the leader-epoch
  checkpoint says). A failure is logged loudly, recorded in `RecoveryReport.corrupt_ranges` and
  kept on disk as a refused range that reads reject with `CorruptLog`; it is never truncated away.
  A missing segment in that region is refused the same way, and so are missing first segments
  (the checkpoint's log start below the first file's). Payload bit rot there is not visible
  to a header walk; reads verify CRCs and refuse it when they meet it.
- From the recovery point on, every batch's CRC is verified too. The log is cut at the first torn
  or failing byte (and every later segment removed); the report counts the bytes and batches cut.
Segments that overlap are not guessed at: open raises `CorruptLog` and an operator decides.
"""

from __future__ import annotations

import logging
import struct
import time
from typing import NamedTuple

from storage.batch import HEADER_SIZE, BatchHeader, compute_crc
from storage.checkpoint import RecoveryPoint
from storage.config import LogConfig, RecoveryReport
from storage.epochs import LeaderEpochCache
from storage.errors import BatchTooLarge, CorruptBatch, CorruptLog
from storage.fs import FileSystem
from storage.reader import find_intact_batch
from storage.segment import (SCAN_WINDOW_BYTES, WALK_WINDOW_BYTES, RefusedRange, Segment, iter_batches_in_file,
                             parse_segment_file_name, segment_file_name)

logger = logging.getLogger("railmq.storage")

_BAD_BATCH = (CorruptBatch, BatchTooLarge)
_PAYLOAD_LENGTH = struct.Struct("<I")
_PAYLOAD_LENGTH_AT = 20  # storage/batch.py's header layout


class RecoveredLog(NamedTuple):
    segments: list[Segment]
    log_start_offset: int
    log_end_offset: int
    flushed_offset: int
    report: RecoveryReport


class _Recovery:
    """One pass over a directory; holds the walk's running state."""

    def __init__(self, fs: FileSystem, directory: str, config: LogConfig, point: RecoveryPoint | None,
                 epochs: LeaderEpochCache, epochs_trusted: bool, now_ms: int) -> None:
        self.fs = fs
        self.directory = directory
        self.config = config
        self.point = point
        self.recovery_offset = point.recovery_offset if point is not None else -1
        self.epochs = epochs
        self.epochs_trusted = epochs_trusted
        self.now_ms = now_ms
        self.report = RecoveryReport()
        self.segments: list[Segment] = []
        self.expected_offset = 0
        self.force_index = False

    # -- the pass ---------------------------------------------------------------------------
    def run(self) -> RecoveredLog:
        started = time.perf_counter()
        self.segments = self._open_segments()
        if self.segments:
            self.expected_offset = self.segments[0].base_offset
        try:
            index = 0
            while index < len(self.segments):
                if not self._enter(index) or not self._walk_segment(index):
                    break
                index += 1
        except BaseException:
            for segment in self.segments:
                segment.handle.close()
            raise
        log_start, log_end = self._finish()
        self.report.seconds = time.perf_counter() - started
        self.report.segments = len(self.segments)
        flushed = max(log_start, min(self.recovery_offset, log_end))
        return RecoveredLog(self.segments, log_start, log_end, flushed, self.report)

    def _open_segments(self) -> list[Segment]:
        bases: list[int] = []
        for name in self.fs.list_directory(self.directory):
            if name.endswith(".tmp"):
                self.fs.remove(f"{self.directory}/{name}")  # a replacement that never got renamed
                continue
            base = parse_segment_file_name(name)
            if base is not None:
                bases.append(base)
            elif name.endswith(".log"):
                self._problem(f"ignoring {name}: not a segment file name")
        segments = []
        for base in sorted(bases):
            handle = self.fs.open(f"{self.directory}/{segment_file_name(base)}")
            segments.append(Segment(base, handle, index_interval_bytes=self.config.index_interval_bytes,
                                    created_ms=self.now_ms, batch_bytes_max=self.config.batch_bytes_max))
        return segments

    def _enter(self, index: int) -> bool:
        """Check that segment `index` starts where the previous one ended; False stops the pass."""
        segment = self.segments[index]
        if index == 0 or segment.base_offset == self.expected_offset:
            return True
        if segment.base_offset < self.expected_offset:
            if self._refuse_overreaching_batch(index):
                return True
            raise CorruptLog(f"{self.directory}: segment {segment.base_offset} overlaps the previous one, which "
                             f"ends at {self.expected_offset}; refusing to guess which is right",
                             segment.base_offset, self.expected_offset - 1)
        if self.point is not None and segment.base_offset <= self.point.segment_base_offset:
            previous = self.segments[index - 1]  # the gap lies below the recovery point
            self._refuse(previous, RefusedRange(self.expected_offset, segment.base_offset - 1,
                                                previous.size_bytes, previous.size_bytes),
                         f"offsets {self.expected_offset}..{segment.base_offset - 1} are missing (no segment holds them)")
            self.expected_offset = segment.base_offset
            return True
        previous = self.segments[index - 1]
        self._cut(index - 1, previous.size_bytes,
                  f"segment {segment.base_offset} does not follow the log end {self.expected_offset}")
        return False

    def _refuse_overreaching_batch(self, index: int) -> bool:
        """Segment `index` begins inside the previous one's last batch. A header walk does not check
        CRCs, so a damaged record count there reads as an overlap: if that batch fails its CRC, it
        is the damage (refused up to where the next segment begins), not the next segment."""
        segment, previous = self.segments[index], self.segments[index - 1]
        found = previous.find_batch(segment.base_offset)
        if found is None:
            return False
        position, header = found
        data = previous.handle.read_at(position, header.size)
        if header.base_offset >= segment.base_offset or (
                len(data) == header.size and compute_crc(data, 0, header) == header.crc):
            return False  # an intact batch: two segments really claim the same offsets
        refused = RefusedRange(header.base_offset, segment.base_offset - 1, position, previous.size_bytes)
        self._refuse(previous, refused,
                     f"its last batch fails its CRC and claims offsets up to {header.next_offset - 1}, "
                     f"past the next segment's first ({segment.base_offset})")
        previous.next_offset = self.expected_offset = segment.base_offset
        return True

    def _walk_segment(self, index: int) -> bool:
        """Walk one segment in its phases; False when the log was cut here (the pass stops)."""
        segment = self.segments[index]
        flushed_end = self._flushed_end(segment)
        position = 0
        while position < segment.size_bytes:
            verify = position >= flushed_end
            position, error = self._walk(segment, position, flushed_end)
            if error is None:
                continue  # reached the end, or the recovery point: go on verifying
            if verify:
                self._cut(index, position, error)
                return False
            position = self._refuse_flushed(index, position, error)
        return True

    def _flushed_end(self, segment: Segment) -> int:
        """Byte position below which `segment` was covered by the checkpointed flush.

        Decided by position, not by offsets: a corrupted record count must not make flushed
        bytes look like an unflushed tail that may be cut."""
        point = self.point
        if point is None or segment.base_offset > point.segment_base_offset:
            return 0
        if segment.base_offset < point.segment_base_offset:
            return segment.size_bytes
        return min(point.position, segment.size_bytes)

    def _walk(self, segment: Segment, position: int, flushed_end: int) -> tuple[int, str | None]:
        """Walk batches from `position`: headers only below `flushed_end`, CRCs too from there.
        Returns (where it stopped, why or None); a header walk stops at `flushed_end`."""
        verify = position >= flushed_end
        window = SCAN_WINDOW_BYTES if verify else WALK_WINDOW_BYTES
        batches = iter_batches_in_file(segment.handle, position, segment.size_bytes, verify=verify,
                                       batch_bytes_max=self.config.batch_bytes_max, window_bytes=window)
        previous: tuple[int, BatchHeader] | None = None
        try:
            for batch_position, header in batches:
                position = batch_position
                if not verify and position >= flushed_end:
                    return position, None  # the recovery point: from here on, CRCs are checked
                problem = self._check_header(header)
                if problem is None and not verify and position + header.size > flushed_end:
                    problem = f"batch at byte {position} runs past the recovery point at byte {flushed_end}"
                if problem is None and not verify and header.next_offset > self.recovery_offset:
                    # A flushed batch ends below the recovery offset: one claiming more has a
                    # damaged record count (the header walk checks no CRC), and taken, the log
                    # would end at offsets it never held.
                    problem = (f"batch at offset {header.base_offset} claims offsets up to "
                               f"{header.next_offset - 1}, past the recovery point at offset {self.recovery_offset}")
                if problem is not None:
                    return self._blame(segment, position, previous, verify), problem
                segment.record(position, header, force_index=self.force_index)
                self.force_index = False
                self.expected_offset = header.next_offset
                self.report.scanned_bytes += header.size if verify else HEADER_SIZE
                previous = (position, header)
                position += header.size
        except _BAD_BATCH as error:
            if not verify and position >= flushed_end:
                return position, None  # the failing batch is past the recovery point: verify it
            return self._blame(segment, position, previous, verify), str(error)
        return position, None

    def _blame(self, segment: Segment, position: int, previous: tuple[int, BatchHeader] | None,
               verify: bool) -> int:
        """Where the damage starts. In the flushed region a bad record count or length in one
        batch shows up as a bad next batch, so a previous batch that fails its CRC is blamed."""
        if verify or previous is None:
            return position
        previous_position, header = previous
        data = segment.handle.read_at(previous_position, header.size)
        if len(data) == header.size and compute_crc(data, 0, header) == header.crc:
            return position
        self.expected_offset = header.base_offset
        return previous_position

    def _check_header(self, header) -> str | None:
        if header.base_offset != self.expected_offset:
            return f"batch base offset {header.base_offset} where {self.expected_offset} was expected"
        if self.epochs_trusted:
            expected_epoch = self.epochs.epoch_at(header.base_offset)
            if expected_epoch is not None and header.leader_epoch != expected_epoch:
                return (f"batch at offset {header.base_offset} has leader epoch {header.leader_epoch}, the "
                        f"epoch checkpoint says {expected_epoch}")
        elif header.leader_epoch > self.epochs.latest_epoch():
            self.epochs.assign(header.leader_epoch, header.base_offset, header.base_offset)
        elif header.leader_epoch < self.epochs.latest_epoch():
            return f"leader epoch goes back from {self.epochs.latest_epoch()} to {header.leader_epoch}"
        return None

    # -- outcomes ---------------------------------------------------------------------------
    def _refuse_flushed(self, index: int, position: int, error: str) -> int:
        """Refuse from the failing batch to the end of what is known; return where to go on."""
        segment = self.segments[index]
        first = self.expected_offset
        if index + 1 < len(self.segments) and first == self.segments[index + 1].base_offset:
            return self._cut_offsetless_tail(segment, position, error)
        point = self.point
        if point is not None and point.segment_base_offset == segment.base_offset and \
                position < point.position <= segment.size_bytes and first < point.recovery_offset:
            last, end, resume = point.recovery_offset - 1, point.position, point.position
        elif index + 1 < len(self.segments):
            last, end, resume = self.segments[index + 1].base_offset - 1, segment.size_bytes, segment.size_bytes
        else:
            last, end, resume = max(self.recovery_offset, first + 1) - 1, segment.size_bytes, segment.size_bytes
        intact = find_intact_batch(segment, position, end, first, last)
        if intact is not None:  # a damaged length claimed the batches after it: walk on from the first
            end = resume = intact[0]
            last = intact[1].base_offset - 1
        self._refuse(segment, RefusedRange(first, max(first, last), position, end), error)
        self.expected_offset = segment.next_offset = max(first, last) + 1
        self.force_index = True
        return resume

    def _cut_offsetless_tail(self, segment: Segment, position: int, error: str) -> int:
        """Bytes after the last batch of a sealed segment whose batches end where the next segment
        begins hold no offsets (a file grown without its data, as `truncate -s` or a file system
        that extended it leaves): they are cut, as nothing of the log is in them."""
        self._problem(f"bytes {position}..{segment.size_bytes} of segment {segment.base_offset} hold no offsets "
                      f"(its batches end at {self.expected_offset}, where the next segment begins): cut ({error})")
        segment.handle.truncate(position)
        segment.handle.sync()
        return position

    def _refuse(self, segment: Segment, refused: RefusedRange, reason: str) -> None:
        segment.refuse(refused)
        self.report.corrupt_ranges.append((refused.first_offset, refused.last_offset))
        self._problem(f"CORRUPTION in the flushed region of segment {segment.base_offset}: offsets "
                      f"{refused.first_offset}..{refused.last_offset} (bytes {refused.start_position}.."
                      f"{refused.end_position}) are refused: {reason}")

    def _cut(self, index: int, position: int, reason: str) -> None:
        """Truncate segment `index` at `position` and remove every later segment."""
        segment = self.segments[index]
        cut_bytes = segment.size_bytes - position
        cut_batches = _count_batches(segment, position)
        for later in self.segments[index + 1:]:
            cut_bytes += later.size_bytes
            cut_batches += _count_batches(later, 0)
            later.handle.close()
            self.fs.remove(later.handle.path)
        del self.segments[index + 1:]
        if cut_bytes:
            segment.handle.truncate(position)
            segment.handle.sync()
            logger.warning("%s: cut %d bytes (%d batches) of unflushed tail at offset %d: %s", self.directory,
                           cut_bytes, cut_batches, self.expected_offset, reason)
        segment.next_offset = self.expected_offset
        self.report.truncated_bytes += cut_bytes
        self.report.truncated_batches += cut_batches

    def _finish(self) -> tuple[int, int]:
        point = self.point
        if not self.segments:
            start = point.log_start_offset if point is not None else 0
            self.expected_offset = start
        else:
            start = self.segments[0].base_offset
        log_end = self.expected_offset
        if self.recovery_offset > log_end:
            self.report.corrupt_ranges.append((log_end, self.recovery_offset - 1))
            self._problem(f"CORRUPTION: offsets {log_end}..{self.recovery_offset - 1} were flushed but are no "
                          f"longer on disk; the log now ends at {log_end}")
        if point is not None and self.segments and point.log_start_offset < start:
            # The checkpoint's log start is where the log began; retention and DeleteRecords store
            # a higher one before they remove a file. Files that now begin above it were lost.
            self.report.corrupt_ranges.append((point.log_start_offset, start - 1))
            self._problem(f"CORRUPTION: offsets {point.log_start_offset}..{start - 1} are missing (no segment "
                          f"holds them): the log starts at {point.log_start_offset}, its first segment at {start}")
        if point is not None:
            start = max(start, min(point.log_start_offset, log_end))
        for segment in self.segments:
            segment.synced_bytes = segment.size_bytes if segment.next_offset <= self.recovery_offset else 0
        return start, log_end

    def _problem(self, sentence: str) -> None:
        self.report.problems.append(sentence)
        logger.error("%s: %s", self.directory, sentence)


def _count_batches(segment: Segment, position: int) -> int:
    """How many batches (the last possibly torn) sit from `position` on, stepping by each
    header's length field alone: the count of what was cut, not a validation."""
    count = 0
    end = segment.size_bytes
    while position < end:
        count += 1
        raw = segment.handle.read_at(position, HEADER_SIZE)
        if len(raw) < HEADER_SIZE:
            break
        position += HEADER_SIZE + _PAYLOAD_LENGTH.unpack_from(raw, _PAYLOAD_LENGTH_AT)[0]
    return count


def recover(fs: FileSystem, directory: str, config: LogConfig, point: RecoveryPoint | None,
            epochs: LeaderEpochCache, *, epochs_trusted: bool, now_ms: int) -> RecoveredLog:
    """Open every segment in `directory`, validate and repair as described above."""
    return _Recovery(fs, directory, config, point, epochs, epochs_trusted, now_ms).run()

