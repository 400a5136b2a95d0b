"""Where to read from, written as a Kafka, kcat or rpk user writes it.

`parse_start(text)` reads `consume -o/--offset`:

    beginning | start | earliest     the first offset still in the log
    end | latest                     only records produced from now on
    N                                offset N of each partition read (kcat's absolute offset)
    -N                               N records before the end of each partition (kcat's -N)
    +N                               N records after the beginning of each partition (rpk's +N)
    @TIME                            the first record at or after TIME (see `parse_time_ms`)

`parse_time_ms(text, now_ms)` reads a point in time: milliseconds since the epoch, an ISO-8601
date or datetime (`2024-05-01`, `2024-05-01T12:00:00`, with `Z` or an offset; naive means local
time), or `-DURATION` for that long ago (`-10m`, `-1h30m`, `-PT15M`). `parse_duration_ms` reads
`500ms`, `30s`, `10m`, `1h30m`, `2d` and ISO-8601's `PT10M` / `P1DT2H` (Kafka's --by-duration).

`resolve_start(spec, earliest, latest, at_time)` turns a parsed start into one partition's
offset; `check_in_log` refuses an absolute offset outside [earliest, latest] with a sentence
that names the partition's range. All of it is pure: the caller asks the cluster.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

import msgspec

EARLIEST, LATEST = -2, -1  # ListOffsets' special timestamps
TIME_MS_MAX = 2**63 - 1  # a record's timestamp is an int64 (ms since the epoch)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_COMPOUND = re.compile(r"^(?:\d+(?:ms|s|m|h|d))+$")
_PART = re.compile(r"(\d+)(ms|s|m|h|d)")
_ISO_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


class StartSpec(msgspec.Struct, frozen=True):
    kind: str  # "earliest" | "latest" | "offset" | "from-end" | "from-start" | "time"
    value: int = 0  # the offset, the count, or the time in ms since the epoch


def parse_duration_ms(text: str) -> int:
    """A positive duration in ms; ValueError otherwise (a bare number is refused: ms or s?)."""
    raw = text.strip()
    compact = raw.replace(" ", "").lower()
    if _COMPOUND.match(compact):
        total = sum(int(amount) * _UNIT_MS[unit] for amount, unit in _PART.findall(compact))
    else:
        match = _ISO_DURATION.match(raw.upper())
        if match is None or raw.upper() in ("P", "PT"):
            raise ValueError(f"{text!r} is not a duration like 500ms, 30s, 10m, 1h30m, 2d or PT10M")
        days, hours, minutes, seconds = match.groups()
        total = int((int(days or 0) * 86_400 + int(hours or 0) * 3600 + int(minutes or 0) * 60
                     + float(seconds or 0)) * 1000)
    if total <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    if total > TIME_MS_MAX:
        raise ValueError(f"{text!r} is longer than a time a record can carry")
    return total


def parse_time_ms(text: str, now_ms: int) -> int:
    """A point in time in ms since the epoch (see the module docstring for the forms), one a
    record's int64 timestamp can hold: a time outside it was a ValueError traceback at the
    consumer's lookup."""
    moment_ms = _parse_time_ms(text.strip(), now_ms)
    if not 0 <= moment_ms <= TIME_MS_MAX:
        raise ValueError(f"{text!r} is not a time a record can carry: before 1970 or past the year "
                         "292 million")
    return moment_ms


def _parse_time_ms(raw: str, now_ms: int) -> int:
    if raw.startswith("-"):
        return now_ms - parse_duration_ms(raw[1:])
    if raw.isascii() and raw.isdigit():
        return int(raw)
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{raw!r} is not a time: use ms since the epoch, an ISO date or datetime "
                         "like 2024-05-01T12:00:00Z, or -DURATION such as -10m") from None
    try:
        if moment.tzinfo is None:
            moment = moment.astimezone()  # a naive time is the user's local time
        return int(moment.astimezone(timezone.utc).timestamp() * 1000)
    except (OverflowError, ValueError):  # year 1 in a zone east of UTC, or west of it
        raise ValueError(f"{raw!r} is not a time a record can carry: before 1970") from None


def parse_start(text: str, now_ms: int) -> StartSpec:
    raw = text.strip()
    word = raw.lower()
    if word in ("beginning", "start", "earliest", "oldest"):
        return StartSpec("earliest")
    if word in ("end", "latest", "newest"):
        return StartSpec("latest")
    if raw.startswith("@"):
        return StartSpec("time", parse_time_ms(raw[1:], now_ms))
    if re.fullmatch(r"\d+", raw):
        return StartSpec("offset", int(raw))
    if re.fullmatch(r"-\d+", raw):
        return StartSpec("from-end", int(raw[1:]))
    if re.fullmatch(r"\+\d+", raw):
        return StartSpec("from-start", int(raw[1:]))
    raise ValueError(f"{text!r} is not a start offset: use beginning, end, N, -N (before the end), "
                     "+N (after the beginning) or @TIME")


def describe_start(spec: StartSpec) -> str:
    return {"earliest": "the beginning", "latest": "the end", "offset": f"offset {spec.value}",
            "from-end": f"{spec.value} before the end", "from-start": f"{spec.value} after the beginning",
            "time": f"the first record at or after {spec.value} ms"}[spec.kind]


def resolve_start(spec: StartSpec, earliest: int, latest: int, at_time: int | None = None) -> int:
    """The offset a partition whose log holds [earliest, latest) starts at; a time with no record
    at or after it starts at the end. Relative starts stay within the log."""
    if spec.kind == "earliest":
        return earliest
    if spec.kind == "latest":
        return latest
    if spec.kind == "offset":
        return spec.value
    if spec.kind == "from-end":
        return max(earliest, latest - spec.value)
    if spec.kind == "from-start":
        return min(latest, earliest + spec.value)
    if spec.kind == "time":
        return at_time if at_time is not None and at_time >= 0 else latest
    raise ValueError(f"unknown start kind {spec.kind!r}")


def check_in_log(where: str, offset: int, earliest: int, latest: int) -> None:
    """ValueError unless earliest <= offset <= latest (the end itself: wait for the next record)."""
    if earliest <= offset <= latest:
        return
    held = f"offsets {earliest}..{latest - 1}" if latest > earliest else "no records"
    side = "past its end" if offset > latest else "before its first offset (retention removed it)"
    raise ValueError(f"{where} holds {held} (next offset {latest}); offset {offset} is {side}")
