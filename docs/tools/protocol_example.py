"""Generate the parts of docs/protocol.md that must follow the code: tables, limits, byte examples.

    python docs/tools/protocol_example.py                       # print every generated section
    python docs/tools/protocol_example.py --section messages    # one section (see SECTIONS)
    python docs/tools/protocol_example.py --write docs/protocol.md   # refresh the doc in place
    python docs/tools/protocol_example.py --check docs/protocol.md   # exit 1 if the doc is stale

What it owns: turning the wire contract into markdown. Message and record tables come from the
Structs in actors/messages.py (msgspec.inspect.type_info: fields, types, defaults), grouped by the
section comments of that file, with each field's trailing comment as its note, so a block of
messages added there appears here under its own heading. Error codes come from actors/errors.py,
limits from actors/limits.py, the batch layout from storage/batch.py, the partitioner vectors
from railmq/partitioner.py. The byte examples encode fixed messages with the project's own codec.

In docs/protocol.md each generated section sits between `<!-- generated: NAME -->` and
`<!-- end generated: NAME -->`; the prose around them is written by hand. Invariants: the output
is a pure function of the code (no clock, no randomness, no cluster), so `--check` is exact;
`--write` replaces only the text between markers. tests/unit/test_protocol_doc.py runs `--check`'s
comparison, decodes the examples back, and checks that no error code lacks an explanation.

The hand-written facts (who sends what, what each error means) are in protocol_facts.py, the
byte examples in protocol_bytes.py, both beside this file.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import sys
import tokenize
from typing import Any, Callable, NamedTuple

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(TOOLS))
for path in (ROOT, TOOLS):  # the project's packages, and the two helper modules beside this file
    if path not in sys.path:
        sys.path.insert(0, path)

import msgspec  # noqa: E402
import msgspec.inspect as inspect_types  # noqa: E402

from actors import limits as limits_module  # noqa: E402
from actors import messages, raft_messages  # noqa: E402
from actors.errors import RETRIABLE, ErrorCode  # noqa: E402
from protocol_bytes import render_example  # noqa: E402
from protocol_facts import ERROR_WHEN, ROUTES  # noqa: E402
from railmq.partitioner import murmur2, partition_for_key, to_positive  # noqa: E402

BEGIN = "<!-- generated: {name} -->"
END = "<!-- end generated: {name} -->"

# ----------------------------------------------------------------------------- reading the sources


class FieldRow(NamedTuple):
    name: str
    type_text: str
    default_text: str
    note: str


class StructDoc(NamedTuple):
    name: str
    is_message: bool
    rows: list[FieldRow]
    doc: str


class Section(NamedTuple):
    title: str
    intro: str
    structs: list[str]


SECTION_LINE = re.compile(r"^# -{5,} (?P<title>.+)$")


def comments_by_line(source: str) -> dict[int, str]:
    """Line number -> the text of the comment on that line (without '#')."""
    found: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string.lstrip("#").strip()
    return found


def read_sections(source: str) -> list[Section]:
    """The `# ---- title` sections of a module, each with its intro comment and its classes."""
    lines = source.splitlines()
    starts = [(number, match.group("title")) for number, line in enumerate(lines, 1)
              if (match := SECTION_LINE.match(line))]
    classes = [(node.lineno, node.name) for node in ast.parse(source).body if isinstance(node, ast.ClassDef)]
    sections = []
    for index, (start, title) in enumerate(starts):
        end = starts[index + 1][0] if index + 1 < len(starts) else len(lines) + 1
        intro = []
        for line in lines[start:end]:
            if not line.startswith("#"):
                break
            intro.append(line.lstrip("#").strip())
        names = [name for number, name in classes if start < number < end]
        sections.append(Section(title, " ".join(intro), names))
    return sections


def field_comments(source: str) -> dict[tuple[str, str], str]:
    """(class name, field name) -> the comment at the end of the field's line."""
    comments = comments_by_line(source)
    found = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                note = comments.get(statement.lineno)
                if note:
                    found[(node.name, statement.target.id)] = note
    return found


def at_most(count: int | None) -> str:
    """A list's or map's length bound, as the decoder checks it."""
    return "" if count is None else f" (at most {count:,})"


def type_text(kind: Any) -> str:
    """A language-neutral name for a msgspec type: what a MessagePack peer must send."""
    match kind:
        case inspect_types.IntType():
            return "int"
        case inspect_types.FloatType():
            return "float"
        case inspect_types.BoolType():
            return "bool"
        case inspect_types.StrType():
            return "str"
        case inspect_types.BytesType():
            return "bin"
        case inspect_types.NoneType():
            return "nil"
        case inspect_types.AnyType():
            return "any"
        case inspect_types.ListType(item_type=item, max_length=most):
            return f"array of {type_text(item)}{at_most(most)}"
        case inspect_types.TupleType(item_types=items):
            return "[" + ", ".join(type_text(item) for item in items) + "]"
        case inspect_types.DictType(key_type=key, value_type=value, max_length=most):
            return f"map {type_text(key)} → {type_text(value)}{at_most(most)}"
        case inspect_types.StructType(cls=cls):
            return f"`{cls.__name__}`"
        case inspect_types.UnionType(types=members):
            return " or ".join(type_text(member) for member in members)
    return type(kind).__name__


def default_text(field: Any) -> str:
    if field.required:
        return "required"
    if field.default_factory is not msgspec.NODEFAULT:
        return json.dumps(field.default_factory())
    value = field.default
    if value is None:
        return "nil"
    if isinstance(value, msgspec.Struct):
        return "all defaults"
    if isinstance(value, bytes):
        return '""' if not value else value.hex()
    return json.dumps(value)


def struct_doc(cls: type, comments: dict[tuple[str, str], str]) -> StructDoc:
    info = inspect_types.type_info(cls)
    payload = getattr(cls, "PAYLOAD_FIELDS", ())
    rows = []
    for field in info.fields:
        kind = type_text(field.type)
        if field.name in payload:
            kind = f"bin, frame {payload.index(field.name) + 1}"
        note = comments.get((cls.__name__, field.name), "")
        rows.append(FieldRow(field.name, kind, default_text(field), note))
    doc = " ".join((cls.__doc__ or "").split()) if "__doc__" in cls.__dict__ else ""
    return StructDoc(cls.__name__, issubclass(cls, messages.Message), rows, doc)


# ----------------------------------------------------------------------------- messages section

SECTION_HEADINGS = {
    "errors": "Errors",
    "admin and metadata": "Admin and metadata (client ↔ coordinator)",
    "data plane": "Data plane (client ↔ partition leader)",
    "control plane": "Replication and control plane (between actors)",
    "elections": "Controller quorum: elections (controller ↔ controller, Raft)",
    "replication": "Controller quorum: log replication (controller ↔ controller, Raft)",
    "consumer groups": "Consumer groups (client ↔ group coordinator)",
    "share groups": "Share groups (client ↔ group coordinator)",
    "runtime-level": "Runtime-level (any actor's runtime)",
    "shared records": "Shared records (structs embedded in messages)",
    "internal": "Internal (never accepted from the network)",
}
SECTION_ORDER = ["errors", "admin and metadata", "data plane", "control plane", "elections", "replication",
                 "consumer groups",
                 "share groups", "runtime-level", "shared records", "internal"]


def _answer_of(name: str, known: set[str]) -> str:
    if not name.endswith("Response"):
        return ""
    base = name[: -len("Response")]
    for candidate in (base + "Request", base):
        if candidate in known:
            return candidate
    return ""


def _struct_class(name: str) -> type:
    return getattr(messages, name, None) or getattr(raft_messages, name)


def _message_line(doc: StructDoc, known: set[str]) -> str:
    cls = _struct_class(doc.name)
    parts = ["message" if doc.is_message else "record (embedded in messages)"]
    if doc.is_message:
        parts.append(f"`type` = `\"{doc.name}\"`")
    if doc.name in ROUTES:
        parts.append(ROUTES[doc.name])
    request = _answer_of(doc.name, known)
    if request:
        parts.append(f"answers `{request}`")
    payload = getattr(cls, "PAYLOAD_FIELDS", ())
    if payload:
        parts.append("payload frames: " + ", ".join(f"`{name}`" for name in payload))
    if cls in messages.INTERNAL_TYPES:
        parts.append("internal: refused from the network")
    return " · ".join(parts)


def _prose(text: str) -> str:
    """Text from the code, safe as markdown: `<name>` would otherwise vanish as an HTML tag."""
    return text.replace("<", "&lt;")


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return _prose(text).replace("|", "\\|")


def render_struct(doc: StructDoc, known: set[str]) -> list[str]:
    lines = [f"#### `{doc.name}`", "", _message_line(doc, known)]
    if doc.doc:
        lines += ["", _prose(doc.doc)]
    lines += ["", "| field | type | default | notes |", "|---|---|---|---|"]
    for row in doc.rows:
        note, kind = _cell(row.note), _cell(row.type_text)
        lines.append(f"| `{row.name}` | {kind} | `{row.default_text}` | {note} |")
    return lines + [""]


def render_messages() -> str:
    comments: dict[tuple[str, str], str] = {}
    sections: list[Section] = []
    for module in (messages, raft_messages):  # the Raft messages have their own module
        source = read_source(module.__file__)
        comments.update(field_comments(source))
        sections += read_sections(source)
    known = {name for section in sections for name in section.structs}
    ordered = sorted(sections, key=lambda s: SECTION_ORDER.index(s.title) if s.title in SECTION_ORDER
                     else SECTION_ORDER.index("shared records") - 0.5)
    lines: list[str] = []
    for section in ordered:
        lines += [f"### {SECTION_HEADINGS.get(section.title, section.title.capitalize())}", ""]
        if section.intro:
            lines += [_prose(section.intro), ""]
        for name in section.structs:
            lines += render_struct(struct_doc(_struct_class(name), comments), known)
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- errors and limits


def undescribed_error_codes() -> list[str]:
    return [code.name for code in ErrorCode if code.name not in ERROR_WHEN]


def render_errors() -> str:
    lines = ["| code | name | retriable | when it happens, and what to do |", "|---:|---|---|---|"]
    for code in sorted(ErrorCode, key=lambda code: (code < 0, code if code >= 0 else -code)):
        retriable = "yes" if code in RETRIABLE else "no"
        text = ERROR_WHEN.get(code.name, "**not described yet** — see actors/errors.py")
        lines.append(f"| {int(code)} | `{code.name}` | {retriable} | {text} |")
    return "\n".join(lines) + "\n"


def limit_notes(source: str) -> dict[str, str]:
    """Field name -> the comment block right above it in actors/limits.py, or its trailing comment."""
    comments = comments_by_line(source)
    notes = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            block, number = [], node.lineno - 1
            while number in comments and not comments[number].startswith("---"):
                block.insert(0, comments[number])
                number -= 1
            trailing = comments.get(node.lineno, "")
            notes[node.target.id] = " ".join(block + ([trailing] if trailing else []))
    return notes


def render_limits() -> str:
    notes = limit_notes(read_source(limits_module.__file__))
    defaults = limits_module.DEFAULT_LIMITS
    lines = ["| limit | default | why |", "|---|---:|---|"]
    for field in inspect_types.type_info(limits_module.Limits).fields:
        value = getattr(defaults, field.name)
        shown = str(value).lower() if isinstance(value, bool) else f"{value:,}"
        lines.append(f"| `{field.name}` | {shown} | {_cell(notes.get(field.name, ''))} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- byte examples


# ----------------------------------------------------------------------------- partitioner vectors

PARTITIONER_KEYS = [b"21", b"foobar", b"a-little-bit-long-string", b"a-little-bit-longer-string",
                    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", b"abc", b"", b"alice", b"bob"]


def render_partitioner() -> str:
    lines = ["| key (UTF-8) | murmur2 (signed 32-bit) | toPositive | partition of 3 | partition of 10 |",
             "|---|---:|---:|---:|---:|"]
    for key in PARTITIONER_KEYS:
        hashed = murmur2(key)
        lines.append(f"| `{json.dumps(key.decode())}` | {hashed} | {to_positive(hashed)} | "
                     f"{partition_for_key(key, 3)} | {partition_for_key(key, 10)} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the doc file

SECTIONS: dict[str, Callable[[], str]] = {
    "messages": render_messages,
    "errors": render_errors,
    "limits": render_limits,
    "example": render_example,
    "partitioner": render_partitioner,
}


def read_source(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def block_pattern(name: str) -> re.Pattern:
    begin, end = re.escape(BEGIN.format(name=name)), re.escape(END.format(name=name))
    return re.compile(begin + r"\n(.*?)" + end, re.S)


def generated_blocks(document: str) -> dict[str, str]:
    """Section name -> the text between its markers in `document` (missing sections are absent)."""
    found = {}
    for name in SECTIONS:
        match = block_pattern(name).search(document)
        if match:
            found[name] = match.group(1)
    return found


def refresh(document: str) -> str:
    """`document` with every generated block replaced by what the code says now."""
    for name, render in SECTIONS.items():
        pattern = block_pattern(name)
        if not pattern.search(document):
            raise SystemExit(f"no {BEGIN.format(name=name)} block in the document")
        block = f"{BEGIN.format(name=name)}\n{render()}{END.format(name=name)}"
        document = pattern.sub(lambda _: block, document)
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate docs/protocol.md's tables and byte examples.")
    parser.add_argument("--section", choices=sorted(SECTIONS), help="print only this section")
    parser.add_argument("--write", metavar="DOC", help="replace the generated blocks of DOC in place")
    parser.add_argument("--check", metavar="DOC", help="exit 1 if DOC's generated blocks are stale")
    args = parser.parse_args(argv)
    if args.write or args.check:
        path = args.write or args.check
        current = read_source(path)
        fresh = refresh(current)
        if args.check:
            now = generated_blocks(fresh)
            stale = [name for name, text in generated_blocks(current).items() if now[name] != text]
            print(f"stale sections: {', '.join(stale)}" if stale else "up to date")
            return 1 if stale else 0
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(fresh)
        return 0
    names = [args.section] if args.section else list(SECTIONS)
    for name in names:
        print(f"{BEGIN.format(name=name)}\n{SECTIONS[name]()}{END.format(name=name)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
