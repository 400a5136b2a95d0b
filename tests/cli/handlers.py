"""Record handlers that CLI tests hand to `railmq consume --group --handler tests.cli.handlers:NAME`.

Each handled record is appended as one JSON line to the file named by `RAILMQ_TEST_HANDLER_LOG`,
so a test can compare what the member processed with what the group committed. A record whose
value is `poison` makes the handler raise before it is logged (it was not processed).
"""

from __future__ import annotations

import json
import os

POISON = b"poison"
LOG_ENVIRONMENT = "RAILMQ_TEST_HANDLER_LOG"


def _log(entries: list[dict]) -> None:
    with open(os.environ[LOG_ENVIRONMENT], "a", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(entry) + "\n" for entry in entries))


def _entry(record) -> dict:
    return {"topic": record.topic, "partition": record.partition, "offset": record.offset,
            "value": record.value.decode()}


def record(record) -> None:
    if record.value == POISON:
        raise ValueError(f"poison at offset {record.offset}")
    _log([_entry(record)])


def batch(records) -> None:
    if any(item.value == POISON for item in records):
        raise ValueError("a poison record in the batch")
    _log([_entry(item) for item in records])
