"""The byte-level parts of docs/protocol.md: fixed example messages, hex dumps, annotated bytes.

Used by docs/tools/protocol_example.py. Everything is a pure function of fixed inputs and the
project's own encoders (transport/codec.py, storage/batch.py), so the output changes only when
the wire format does. `annotate_msgpack` is a small MessagePack walker that names each item of a
frame with its offset: the view an implementer in another language needs.
"""

from __future__ import annotations

import json
import struct
from typing import Any, NamedTuple

import msgspec

from actors import messages
from storage import batch as batch_module
from transport.codec import Codec

HEXDUMP_BYTES_PER_LINE = 16
# The example topic's partition leader stores the example batch here.
STORED_BASE_OFFSET = 41
STORED_LEADER_EPOCH = 3


def example_batch() -> bytearray:
    """One record, key "alice", value "paid 10", one header, from idempotent producer 7."""
    records = [(0, b"alice", b"paid 10", [("source", b"web")])]
    return batch_module.encode_batch(records, 1_700_000_000_000, producer_id=7, producer_epoch=0,
                                     base_sequence=0)


def example_messages() -> list[messages.Message]:
    endpoint = "tcp://127.0.0.1:41007"
    partition = messages.PartitionMetadata(
        partition=0, leader=2, leader_endpoint=endpoint, leader_epoch=STORED_LEADER_EPOCH, partition_epoch=7,
        replicas=[2], isr=[2], replica_info=[messages.ReplicaInfo(
            node=2, endpoint=endpoint, pid=4242, alive=True, log_end_offset=STORED_BASE_OFFSET,
            high_watermark=STORED_BASE_OFFSET)])
    topic = messages.TopicMetadata(name="orders", topic_id=0x1D2C3B4A5968, partitions=[partition])
    return [
        messages.MetadataRequest(correlation_id=1, topics=["orders"]),
        messages.MetadataResponse(correlation_id=1, topics=[topic], nodes=[1, 2, 3],
                                  group_coordinator_endpoint="tcp://127.0.0.1:40102"),
        messages.ProduceRequest(correlation_id=2, topic="orders", partition=0, acks=-1,
                                batch=example_batch()),
        messages.ProduceResponse(correlation_id=2, topic="orders", partition=0,
                                 base_offset=STORED_BASE_OFFSET, last_offset=STORED_BASE_OFFSET,
                                 leader_epoch=STORED_LEADER_EPOCH),
    ]


def hexdump(data: bytes) -> list[str]:
    lines = []
    for start in range(0, len(data), HEXDUMP_BYTES_PER_LINE):
        chunk = data[start: start + HEXDUMP_BYTES_PER_LINE]
        hex_part = " ".join(f"{byte:02x}" for byte in chunk)
        text = "".join(chr(byte) if 32 <= byte < 127 else "." for byte in chunk)
        lines.append(f"{start:04x}  {hex_part:<{HEXDUMP_BYTES_PER_LINE * 3 - 1}}  |{text}|")
    return lines


def render_frames(frames: list[Any]) -> list[str]:
    lines = ["```text"]
    for index, frame in enumerate(frames):
        data = bytes(frame)
        lines.append(f"frame {index} ({len(data)} bytes)")
        lines += hexdump(data)
    return lines + ["```"]


def render_wire_example(message: messages.Message, codec: Codec) -> list[str]:
    frames = codec.encode(message)
    header = msgspec.msgpack.decode(bytes(frames[0]))
    lines = [f"<!-- wire-example: {type(message).__name__} -->", f"#### `{type(message).__name__}`", "",
             "Frame 0 decoded (MessagePack map shown as JSON):", "", "```json",
             json.dumps(header, indent=2), "```", "", "The frames on the wire:", ""]
    return lines + render_frames(frames) + [""]


# A small MessagePack walker, to annotate frames byte by byte for implementers.

class Item(NamedTuple):
    offset: int
    raw: bytes  # the item's head (and body, for str and bin)
    meaning: str
    depth: int


SIZED_HEADS = {0xD9: ("str", 1), 0xDA: ("str", 2), 0xDB: ("str", 4), 0xC4: ("bin", 1), 0xC5: ("bin", 2),
               0xC6: ("bin", 4), 0xDC: ("array", 2), 0xDD: ("array", 4), 0xDE: ("map", 2), 0xDF: ("map", 4)}
SCALARS = {0xC0: ("nil", 0, ""), 0xC2: ("false", 0, ""), 0xC3: ("true", 0, ""),
           0xCC: ("uint 8", 1, ">B"), 0xCD: ("uint 16", 2, ">H"), 0xCE: ("uint 32", 4, ">I"),
           0xCF: ("uint 64", 8, ">Q"), 0xD0: ("int 8", 1, ">b"), 0xD1: ("int 16", 2, ">h"),
           0xD2: ("int 32", 4, ">i"), 0xD3: ("int 64", 8, ">q"), 0xCA: ("float 32", 4, ">f"),
           0xCB: ("float 64", 8, ">d")}


def _head(data: bytes, position: int) -> tuple[str, int, int] | None:
    """(kind, head bytes, length) for a str/bin/array/map head at `position`; None for a scalar."""
    first = data[position]
    if 0xA0 <= first <= 0xBF:
        return "str", 1, first & 0x1F
    if 0x90 <= first <= 0x9F:
        return "array", 1, first & 0x0F
    if 0x80 <= first <= 0x8F:
        return "map", 1, first & 0x0F
    if first not in SIZED_HEADS:
        return None
    kind, width = SIZED_HEADS[first]
    return kind, 1 + width, int.from_bytes(data[position + 1: position + 1 + width], "big")


def _scalar(data: bytes, position: int, depth: int) -> Item:
    first = data[position]
    if first <= 0x7F or first >= 0xE0:
        value = first if first <= 0x7F else first - 0x100
        return Item(position, data[position: position + 1], f"int {value}", depth)
    name, size, layout = SCALARS[first]
    value = f" {struct.unpack(layout, data[position + 1: position + 1 + size])[0]}" if layout else ""
    return Item(position, data[position: position + 1 + size], name + value, depth)


def _shown(kind: str, body: bytes) -> str:
    try:
        text = json.dumps(body.decode("utf-8"), ensure_ascii=False)
    except UnicodeDecodeError:
        text = ""
    return f"str {text}" if kind == "str" else f"bin ({len(body)} bytes) {text}".rstrip()


def annotate_msgpack(data: bytes, position: int = 0, depth: int = 0) -> tuple[list[Item], int]:
    """The items of the one MessagePack value at `position`, depth first, and where it ends."""
    head = _head(data, position)
    if head is None:
        item = _scalar(data, position, depth)
        return [item], position + len(item.raw)
    kind, head_size, length = head
    if kind in ("str", "bin"):
        end = position + head_size + length
        meaning = _shown(kind, data[position + head_size: end])
        return [Item(position, data[position: end], meaning, depth)], end
    items = [Item(position, data[position: position + head_size], f"{kind} of {length}", depth)]
    cursor = position + head_size
    for _ in range(length * (2 if kind == "map" else 1)):
        children, cursor = annotate_msgpack(data, cursor, depth + 1)
        items += children
    return items, cursor


def render_annotation(data: bytes, position: int = 0) -> list[str]:
    lines = ["```text"]
    items, _ = annotate_msgpack(data, position)
    for item in items:
        shown = " ".join(f"{byte:02x}" for byte in item.raw[:10]) + (" …" if len(item.raw) > 10 else "")
        lines.append(f"{item.offset:04x}  {shown:<32}{'  ' * item.depth}{item.meaning}")
    return lines + ["```"]


def batch_layout() -> list[tuple[int, int, str, str]]:
    """(offset, size, field, struct code) for each header field, from storage/batch.py's HEADER."""
    codes = batch_module.HEADER.format.lstrip("<>=!")
    layout, offset = [], 0
    for code, name in zip(codes, batch_module.BatchHeader._fields):
        size = struct.calcsize("<" + code)
        layout.append((offset, size, name, code))
        offset += size
    return layout


INTEGER_NAMES = {"q": "int64", "i": "int32", "I": "uint32", "h": "int16", "B": "uint8"}


def render_batch_breakdown(batch: bytes) -> list[str]:
    header = batch_module.parse_header(batch)
    lines = ["| bytes | field | type | hex (little-endian) | value |", "|---|---|---|---|---|"]
    for offset, size, name, code in batch_layout():
        raw = batch[offset: offset + size]
        value = getattr(header, name)
        shown = f"0x{value:08x}" if name == "crc" else f"{value}"
        span = f"{offset}" if size == 1 else f"{offset}–{offset + size - 1}"
        lines.append(f"| {span} | `{name}` | {INTEGER_NAMES[code]} | `{raw.hex(' ')}` | {shown} |")
    payload_end = batch_module.HEADER_SIZE + header.payload_length
    lines.append(f"| {batch_module.HEADER_SIZE}–{payload_end - 1} | payload | MessagePack | see below | "
                 f"{header.record_count} record(s) |")
    return lines


def render_batch_example() -> list[str]:
    batch = bytes(example_batch())
    header = batch_module.verify_batch(batch)
    records = batch_module.decode_records(batch, header)
    decoded = [[delta, _text(key), _text(value), [[name, _text(data)] for name, data in headers or []]]
               for delta, key, value, headers in records]
    stamped = batch_module.stamp(batch, STORED_BASE_OFFSET, STORED_LEADER_EPOCH)
    lines = ["<!-- batch-example -->", "The batch's records, decoded (bin values shown as UTF-8 text):", "",
             "```json", json.dumps({
                 "base_offset": header.base_offset, "leader_epoch": header.leader_epoch,
                 "producer_id": header.producer_id, "producer_epoch": header.producer_epoch,
                 "base_sequence": header.base_sequence, "first_timestamp_ms": header.first_timestamp_ms,
                 "records": decoded}),
             "```", "", "The header, field by field:", ""]
    lines += render_batch_breakdown(batch)
    lines += ["", f"The payload, item by item (offsets in hexadecimal from the batch's first byte; "
              f"0x{batch_module.HEADER_SIZE:x} is byte {batch_module.HEADER_SIZE}):", ""]
    lines += render_annotation(batch, batch_module.HEADER_SIZE)
    lines += ["", f"The same batch as the leader stores it at offset {STORED_BASE_OFFSET} in leader epoch "
              f"{STORED_LEADER_EPOCH}: only bytes 0–11 change, and the CRC (bytes 12–15) still matches "
              "because it covers bytes 16 onwards:", ""]
    lines += ["```text", *hexdump(stamped[:16]), "```"]
    return lines


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8")


def render_example() -> str:
    codec = Codec()
    examples = example_messages()
    lines = ["Frame 0 of the `MetadataRequest`, item by item (offsets in hexadecimal):", ""]
    lines += render_annotation(bytes(codec.encode(examples[0])[0])) + [""]
    for message in examples:
        lines += render_wire_example(message, codec)
    lines += render_batch_example()
    return "\n".join(lines).rstrip() + "\n"

