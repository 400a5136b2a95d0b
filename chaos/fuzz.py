"""A schema-driven fuzzer for every actor, in one process, through the real codec and `handle()`.

Cases come from the wire contract itself (`actors/messages.py`, read with `msgspec.inspect`):

- valid-shaped messages with boundary values: every field filled from its type, biased towards
  what reaches deep into a handler (this partition's topic and number, the current epochs, offsets
  at and around the log end, known member ids) and towards edges (-1, 0, 2**31, 2**63-1, empty and
  very long strings, empty and odd lists), payload frames that are honest batches, batches with a
  forged header and a valid CRC, or random bytes;
- wrong types: a field's value replaced by one of another type, sent as a raw MessagePack map;
- byte-level mutations of valid frames (flipped, cut, extended), extra and missing frames, and
  frames of random bytes.

Each case goes to one actor — coordinator, partition leader, follower, group coordinator (with
share groups), producer or consumer client — exactly as the runtime would: decode (a
`DecodeFailure` is an answer, not a crash), the authentication rule (half the cases pretend to be
authenticated, so handlers that only cluster processes reach are fuzzed too), `handle`, the
effects (flushes, timers now and then, a `Crash` or `Exit` rebuilds the actor over its storage),
then `invariants()`. Anything `handle` raises is a finding. After a run every log is checked:
each batch in it passes the full producer validation, so nothing a legitimate producer could not
have sent was ever stored.
"""

from __future__ import annotations

import random
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from actors.effects import AfterFlush, Crash, Exit, Send, SetTimer
from actors.messages import TimerFired, wire_message_types
from storage.batch import encode_batch, iter_batches, validate_producer_batch
from transport.auth import refusal
from transport.codec import Codec, DecodeFailure

EDGE_INTS = (0, 1, -1, 2, 7, 100, 2**31 - 1, -(2**31), 2**62, 2**63 - 1, -(2**63), 2**63, 2**64 - 1)
EDGE_STRINGS = ("", "orders", "g", "x" * 300, "../etc", "ü∂\u0000", "orders.dlq", "a/b")
START_NS = 1_800_000_000 * 1_000_000_000


@dataclass
class Finding:
    target: str
    message: str
    error: str
    frames: list[bytes]


@dataclass
class FuzzStats:
    cases: dict[str, int] = field(default_factory=dict)
    decode_failures: int = 0
    refused: int = 0
    handled: int = 0
    findings: list[Finding] = field(default_factory=list)


class Target:
    """One actor under fuzz: how to build it (again, over the same storage after a crash), and
    the values that reach deep into its handlers."""

    def __init__(self, name: str, build: Callable[[], Any], hints: dict[str, tuple]) -> None:
        self.name = name
        self.build = build
        self.hints = hints
        self.actor = build()
        self.timers: dict[str, int] = {}

    def restart(self) -> None:
        self.actor = self.build()
        self.timers = {}


class Fuzzer:
    def __init__(self, targets: list[Target], seed: int = 1) -> None:
        self.targets = targets
        self.rng = random.Random(seed)
        self.codec = Codec()
        self.types = wire_message_types()
        self.schemas = {cls: msgspec.inspect.type_info(cls) for cls in self.types}  # slow to build: once
        self.now_ns = START_NS
        self.stats = FuzzStats()
        self._honest = [bytes(encode_batch([(i, f"k{i}".encode(), b"v" * i, None) for i in range(count)], 1_000))
                        for count in (1, 3, 17)]
        for target in targets:
            self._apply(target, target.actor.start(self.now_ns))

    # ------------------------------------------------------------------ running

    def run(self, cases: int) -> FuzzStats:
        for index in range(cases):
            target = self.targets[index % len(self.targets)]
            self.case(target)
        return self.stats

    def case(self, target: Target) -> None:
        self.now_ns += self.rng.randint(0, 5_000_000)
        frames, authenticated = self.frames_for(target)
        self.stats.cases[target.name] = self.stats.cases.get(target.name, 0) + 1
        try:
            message = self.codec.decode(frames)
        except DecodeFailure:
            self.stats.decode_failures += 1
            return
        if not authenticated and refusal(target.actor, message, False) is not None:
            self.stats.refused += 1
            return
        self.deliver(target, message, frames)

    def replay(self, target: Target, frames: list[bytes], authenticated: bool = True) -> None:
        """One recorded case again (a regression): decoded, checked, handled like any other."""
        try:
            message = self.codec.decode(frames)
        except DecodeFailure:
            return
        if not authenticated and refusal(target.actor, message, False) is not None:
            return
        self.deliver(target, message, frames)

    def deliver(self, target: Target, message: Any, frames: list[bytes]) -> None:
        try:
            self._apply(target, target.actor.handle(message, self._sender(), self.now_ns))
            self._fire_due(target)
            target.actor.invariants()
            self.stats.handled += 1
        except Exception as error:  # noqa: BLE001 - a finding, kept with the frames that caused it
            detail = "".join(traceback.format_exception_only(type(error), error)).strip()
            self.stats.findings.append(Finding(target.name, type(message).__name__, detail[:500], frames))
            target.restart()

    def _sender(self) -> Any:
        return self.rng.choice([b"fuzz-client|1|1", "tcp://127.0.0.1:9/peer"])

    def _apply(self, target: Target, effects: list) -> None:
        for effect in effects:
            kind = type(effect)
            if kind is AfterFlush:
                effect.store.flush()
                self._apply(target, list(effect.effects))
            elif kind is SetTimer:
                target.timers[effect.name] = effect.deadline_ns
            elif kind is Send:
                self.codec.encode(effect.message)  # what the runtime does next: it must not raise
            elif kind in (Crash, Exit):
                target.restart()
                return

    def _fire_due(self, target: Target) -> None:
        if self.rng.random() > 0.2:
            return
        for name, deadline in sorted(target.timers.items(), key=lambda item: item[1]):
            if deadline <= self.now_ns + 2_000_000_000:
                del target.timers[name]
                self.now_ns = max(self.now_ns, deadline)
                self._apply(target, target.actor.handle(TimerFired(name=name), b"", self.now_ns))

    # ------------------------------------------------------------------ cases

    def frames_for(self, target: Target) -> tuple[list[bytes], bool]:
        roll = self.rng.random()
        authenticated = self.rng.random() < 0.5
        if roll < 0.6:
            return self._encode(self.message(target)), authenticated
        if roll < 0.75:
            return [self._wrong_types(target)], authenticated
        if roll < 0.95:
            return self._mutate(self._encode(self.message(target))), authenticated
        return [self.rng.randbytes(self.rng.randint(0, 64)) for _ in range(self.rng.randint(0, 4))], authenticated

    def _encode(self, message: Any) -> list[bytes]:
        return [bytes(frame) for frame in self.codec.encode(message)]

    def message(self, target: Target) -> Any:
        cls = self.rng.choice(self.types)
        info = self.schemas[cls]
        values = {}
        for item in info.fields:
            if item.required or self.rng.random() < 0.7:
                values[item.name] = self.value(item.type, item.name, target, depth=0)
        try:
            return msgspec.convert(values, cls)
        except (msgspec.ValidationError, TypeError):
            return cls(**{f.name: self.value(f.type, f.name, target, 0) for f in info.fields if f.required})

    def value(self, kind: Any, name: str, target: Target, depth: int) -> Any:
        hints = target.hints.get(name)
        if hints and self.rng.random() < 0.6:
            return self.rng.choice(hints)
        if isinstance(kind, msgspec.inspect.IntType):
            return self.rng.choice(EDGE_INTS + (self.rng.randint(-5, 5000),))
        if isinstance(kind, msgspec.inspect.StrType):
            return self.rng.choice(EDGE_STRINGS)
        if isinstance(kind, msgspec.inspect.BoolType):
            return self.rng.random() < 0.5
        if isinstance(kind, msgspec.inspect.FloatType):
            return self.rng.choice((0.0, 1.0, -1.0, 1e308, float("nan")))
        if isinstance(kind, msgspec.inspect.BytesType):
            return self._payload()
        if isinstance(kind, (msgspec.inspect.ListType, msgspec.inspect.VarTupleType)):
            if depth > 2:
                return []
            return [self.value(kind.item_type, name, target, depth + 1) for _ in range(self.rng.choice((0, 1, 2, 5)))]
        if isinstance(kind, msgspec.inspect.TupleType):
            return tuple(self.value(item, name, target, depth + 1) for item in kind.item_types)
        if isinstance(kind, msgspec.inspect.DictType):
            return {self.value(kind.key_type, "key", target, depth + 1): self.value(kind.value_type, name, target, depth + 1)
                    for _ in range(self.rng.choice((0, 1, 3)))} if depth < 2 else {}
        if isinstance(kind, msgspec.inspect.UnionType):
            return self.value(self.rng.choice(kind.types), name, target, depth)
        if isinstance(kind, msgspec.inspect.NoneType):
            return None
        if isinstance(kind, msgspec.inspect.StructType):
            if depth > 2:
                return None
            return {item.name: self.value(item.type, item.name, target, depth + 1)
                    for item in kind.fields if item.required or self.rng.random() < 0.5}
        return None

    def _payload(self) -> bytes:
        roll = self.rng.random()
        honest = self.rng.choice(self._honest)
        if roll < 0.4:
            return honest
        if roll < 0.7:
            return _forged(honest, self.rng)
        if roll < 0.85:
            return b"".join(self.rng.choice(self._honest) for _ in range(self.rng.randint(1, 3)))
        return self.rng.randbytes(self.rng.randint(0, 200))

    def _wrong_types(self, target: Target) -> bytes:
        cls = self.rng.choice(self.types)
        fields = {item.name: self.value(item.type, item.name, target, 0) for item in self.schemas[cls].fields}
        if fields:
            victim = self.rng.choice(sorted(fields))
            fields[victim] = self.rng.choice(([1, 2], {"a": 1}, "str", 3.5, None, True, b"\x00", -1))
        fields["type"] = cls.__name__
        return msgspec.msgpack.encode(fields)

    def _mutate(self, frames: list[bytes]) -> list[bytes]:
        frames = list(frames)
        index = self.rng.randrange(len(frames))
        data = bytearray(frames[index])
        roll = self.rng.random()
        if roll < 0.4 and data:
            for _ in range(self.rng.randint(1, 4)):
                data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
        elif roll < 0.6:
            del data[self.rng.randint(0, len(data)):]
        elif roll < 0.75:
            data += self.rng.randbytes(self.rng.randint(1, 32))
        elif roll < 0.9:
            frames.insert(self.rng.randint(0, len(frames)), self.rng.randbytes(self.rng.randint(0, 40)))
        elif len(frames) > 1:
            frames.pop(index)
            return frames
        frames[index] = bytes(data)
        return frames


def _forged(batch: bytes, rng: random.Random) -> bytes:
    """An honest batch with one header field rewritten and its CRC recomputed (as an attacker can)."""
    from storage.batch import CRC_FIELD, CRC_START, HEADER
    from storage.checksum import crc32

    values = list(HEADER.unpack_from(batch, 0))
    field_index = rng.choice((4, 5, 6, 7, 8, 9, 10, 11))  # attributes .. max timestamp
    values[field_index] = rng.choice((0, 1, -1, 16, 50, 2**31 - 1, values[field_index] + 1))
    try:
        forged = bytearray(HEADER.pack(*values) + batch[HEADER.size:])
    except Exception:  # noqa: BLE001 - a value the struct cannot hold: keep the honest batch
        return batch
    CRC_FIELD.pack_into(forged, 12, crc32(memoryview(forged)[CRC_START:]))
    return bytes(forged)


def logs_hold_only_valid_batches(logs: list[Any]) -> list[str]:
    """Problems: batches in any log that a legitimate producer could not have sent."""
    problems = []
    for log in logs:
        if log.log_end_offset <= log.log_start_offset:
            continue
        try:
            data = log.read(log.log_start_offset, 1 << 30)
        except Exception as error:  # noqa: BLE001
            problems.append(f"a log cannot be read back: {error}")
            continue
        for position, header in iter_batches(data):
            try:
                validate_producer_batch(memoryview(data)[position: position + header.size], header)
            except Exception as error:  # noqa: BLE001
                problems.append(f"offset {header.base_offset}: {error}")
    return problems
