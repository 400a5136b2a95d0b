"""docs/protocol.md cannot silently drift from the code.

Given the contract (actors/messages.py, actors/errors.py) and the generator
(docs/tools/protocol_example.py), the document must name every wire message and every error code,
its generated blocks must be what the generator prints today, and its hex dumps must decode, with
the project's own codec, to exactly the messages and the record batch the document shows beside
them. The generator's own pieces (grouping by section comments, block replacement, the
MessagePack walker) are checked on small inputs.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import msgspec
import pytest

from actors.errors import ErrorCode
from actors.messages import wire_message_types
from storage.batch import decode_records, verify_batch
from transport.codec import Codec

ROOT = Path(__file__).resolve().parents[2]
DOC_PATH = ROOT / "docs" / "protocol.md"
TOOL_PATH = ROOT / "docs" / "tools" / "protocol_example.py"
REFRESH_COMMAND = "python docs/tools/protocol_example.py --write docs/protocol.md"

FENCED = re.compile(r"```(?P<kind>\w+)\n(?P<body>.*?)```", re.S)
FRAME_LINE = re.compile(r"^frame (?P<index>\d+) \((?P<size>\d+) bytes\)$")
DUMP_LINE = re.compile(r"^(?P<offset>[0-9a-f]{4})  (?P<hex>(?:[0-9a-f]{2} )*[0-9a-f]{2}) +\|")


def load_tool():
    spec = importlib.util.spec_from_file_location("protocol_example", TOOL_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("protocol_example", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tool():
    return load_tool()


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC_PATH.read_text(encoding="utf-8")


def fenced_after(doc: str, marker: str, kind: str) -> str:
    """The body of the first ``` block of `kind` after `marker`."""
    start = doc.index(marker)
    for match in FENCED.finditer(doc, start):
        if match.group("kind") == kind:
            return match.group("body")
    raise AssertionError(f"no ```{kind} block after {marker}")


def parse_frames(dump: str) -> list[bytes]:
    """Frames from the document's hex dump: `frame N (M bytes)` headers, then 16-byte lines."""
    frames: list[bytearray] = []
    sizes: list[int] = []
    for line in dump.splitlines():
        header = FRAME_LINE.match(line)
        if header:
            assert int(header.group("index")) == len(frames), f"frames out of order at {line!r}"
            frames.append(bytearray())
            sizes.append(int(header.group("size")))
            continue
        row = DUMP_LINE.match(line)
        assert row and frames, f"not a dump line: {line!r}"
        assert int(row.group("offset"), 16) == len(frames[-1]), f"offset gap at {line!r}"
        frames[-1] += bytes.fromhex(row.group("hex"))
    for index, (frame, size) in enumerate(zip(frames, sizes)):
        assert len(frame) == size, f"frame {index} has {len(frame)} bytes, the header says {size}"
    return [bytes(frame) for frame in frames]


def wire_examples(doc: str) -> list[tuple[str, dict, list[bytes]]]:
    """(type name, frame 0 as the doc shows it, the frames) for every wire example in the doc."""
    examples = []
    for match in re.finditer(r"<!-- wire-example: (\w+) -->", doc):
        marker = match.group(0)
        shown = json.loads(fenced_after(doc, marker, "json"))
        frames = parse_frames(fenced_after(doc, marker, "text"))
        examples.append((match.group(1), shown, frames))
    return examples


# ----------------------------------------------------------------------------- coverage


def test_every_wire_message_type_has_its_own_table(doc):
    missing = [cls.__name__ for cls in wire_message_types() if f"#### `{cls.__name__}`" not in doc]
    assert not missing, f"no table for {missing}: run {REFRESH_COMMAND}"


def test_every_error_code_has_a_row_with_its_number(doc):
    missing = [code.name for code in ErrorCode if f"| {int(code)} | `{code.name}` |" not in doc]
    assert not missing, f"no row for {missing}: run {REFRESH_COMMAND}"


def test_every_error_code_says_when_it_happens(tool):
    assert tool.undescribed_error_codes() == [], "describe them in docs/tools/protocol_facts.py ERROR_WHEN"


def test_the_generated_blocks_are_what_the_code_says_today(tool, doc):
    blocks = tool.generated_blocks(doc)
    assert sorted(blocks) == sorted(tool.SECTIONS), "a generated block is missing from docs/protocol.md"
    stale = [name for name, render in tool.SECTIONS.items() if blocks[name] != render()]
    assert not stale, f"stale sections {stale}: run {REFRESH_COMMAND}"


# ----------------------------------------------------------------------------- the byte examples


def test_the_doc_shows_a_metadata_and_a_produce_exchange(doc):
    names = [name for name, _, _ in wire_examples(doc)]
    assert names == ["MetadataRequest", "MetadataResponse", "ProduceRequest", "ProduceResponse"]


def test_each_hex_example_decodes_to_the_message_shown_beside_it(doc):
    codec = Codec()
    for name, shown, frames in wire_examples(doc):
        message = codec.decode(frames)
        assert type(message).__name__ == name
        assert msgspec.msgpack.decode(frames[0]) == shown, f"{name}: frame 0 is not the JSON beside it"
        assert [bytes(frame) for frame in codec.encode(message)] == frames, f"{name}: re-encoding differs"


def test_each_response_answers_the_request_before_it(doc):
    codec = Codec()
    decoded = [codec.decode(frames) for _, _, frames in wire_examples(doc)]
    for request, response in zip(decoded[::2], decoded[1::2]):
        assert type(response).__name__ == type(request).__name__.replace("Request", "Response")
        assert response.correlation_id == request.correlation_id > 0
        assert response.error == 0


def test_the_produce_example_carries_the_batch_the_doc_takes_apart(doc):
    frames = next(frames for name, _, frames in wire_examples(doc) if name == "ProduceRequest")
    batch = frames[1]
    header = verify_batch(batch)  # header checks and CRC-32
    shown = json.loads(fenced_after(doc, "<!-- batch-example -->", "json"))
    for field in ("base_offset", "leader_epoch", "producer_id", "producer_epoch", "base_sequence",
                  "first_timestamp_ms"):
        assert getattr(header, field) == shown[field], field
    records = [[delta, key.decode(), value.decode(), [[name, data.decode()] for name, data in headers or []]]
               for delta, key, value, headers in decode_records(batch, header)]
    assert records == shown["records"]


# ----------------------------------------------------------------------------- the generator


SOURCE_WITH_TWO_SECTIONS = '''
import msgspec


# ----------------------------------------------------------------------- first block
# Says what the first block is for,
# over two lines.


class Alpha(msgspec.Struct):
    size: int = 0  # bytes, at most a few


# ----------------------------------------------------------------------- brand new block


class Beta(msgspec.Struct):
    name: str


class Gamma(msgspec.Struct):
    pass
'''


def test_classes_are_grouped_by_the_section_comment_above_them_with_its_intro(tool):
    sections = tool.read_sections(SOURCE_WITH_TWO_SECTIONS)
    assert [(s.title, s.structs) for s in sections] == [("first block", ["Alpha"]),
                                                         ("brand new block", ["Beta", "Gamma"])]
    assert sections[0].intro == "Says what the first block is for, over two lines."
    assert sections[1].intro == ""


def test_a_fields_trailing_comment_becomes_its_note(tool):
    assert tool.field_comments(SOURCE_WITH_TWO_SECTIONS) == {("Alpha", "size"): "bytes, at most a few"}


def test_refresh_replaces_only_the_text_between_markers(tool):
    names = list(tool.SECTIONS)
    document = "intro\n" + "".join(
        f"{tool.BEGIN.format(name=name)}\nold {name}\n{tool.END.format(name=name)}\nprose {name}\n"
        for name in names)
    fresh = tool.refresh(document)
    assert fresh.startswith("intro\n")
    for name in names:
        assert f"old {name}" not in fresh and f"prose {name}" in fresh
    assert tool.refresh(fresh) == fresh


def test_refresh_refuses_a_document_without_a_block(tool):
    with pytest.raises(SystemExit):
        tool.refresh("no markers here\n")


def test_the_msgpack_walker_accounts_for_every_byte(tool):
    walker = sys.modules["protocol_bytes"]
    value = {"type": "X", "n": [0, 127, -1, -32, 255, -129, 70000, 2**40, None, True, 1.5],
             "b": b"\x00\xff" * 40, "s": "é" * 20, "m": {"k": [[1, 2], []]}}
    data = msgspec.msgpack.encode(value)
    items, end = walker.annotate_msgpack(data)
    assert end == len(data)
    covered = sorted((item.offset, item.offset + len(item.raw)) for item in items)
    assert covered[0][0] == 0
    assert all(left[1] == right[0] for left, right in zip(covered, covered[1:])), "gaps or overlaps"
    assert [item.meaning for item in items] == [
        "map of 5", 'str "type"', 'str "X"', 'str "n"', "array of 11", "int 0", "int 127", "int -1",
        "int -32", "uint 8 255", "int 16 -129", "uint 32 70000", "uint 64 1099511627776", "nil", "true",
        "float 64 1.5",
        'str "b"', "bin (80 bytes)", 'str "s"', 'str "' + "é" * 20 + '"', 'str "m"', "map of 1", 'str "k"',
        "array of 2", "array of 2", "int 1", "int 2", "array of 0"]
