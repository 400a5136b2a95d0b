"""An actor's trace: its Trace effects appended as JSON lines (the chaos harness and labs read them).

Tracing never kills an actor: a failed write is counted and the line is lost. The file is rotated
at a byte limit, keeping a bounded number of old ones, so it never grows without bound.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from actors.limits import Limits


class TraceFile:
    """Appends an actor's Trace effects as JSON lines (the chaos harness and labs read them).

    Tracing never kills an actor: a failed write (a full disk, an I/O error) is counted in
    `dropped` and the line is lost; the file is rotated at `bytes_max` (trace.jsonl -> .1 -> .2 ...),
    keeping `kept` old ones, so it never grows without bound. Several actors append to one file;
    whichever sees it past the limit renames it (the others keep writing to the renamed file
    until they notice, within one line).
    """

    def __init__(self, path: str, actor_name: str, *, bytes_max: int = Limits().trace_file_bytes_max,
                 kept: int = Limits().trace_files_kept) -> None:
        self.path = path
        self.actor_name = actor_name
        self.bytes_max = bytes_max
        self.kept = kept
        self.dropped = 0
        self.handle: Any = None
        self._open()

    def _open(self) -> None:
        try:
            self.handle = open(self.path, "a", encoding="utf-8", buffering=1)
        except OSError:
            self.handle = None

    def __call__(self, event: str, details: dict) -> None:
        line = {"time_ns": time.time_ns(), "actor": self.actor_name, "pid": os.getpid(), "event": event, **details}
        try:
            if self.handle is None:
                self._open()
                if self.handle is None:
                    raise OSError("the trace file cannot be opened")
            self.handle.write(json.dumps(line, default=str) + "\n")
            self._rotate_if_needed()
        except (OSError, ValueError):
            self.dropped += 1
            self._close_quietly()

    def _rotate_if_needed(self) -> None:
        if self.handle.tell() < self.bytes_max:
            return
        try:
            if os.path.exists(self.path) and os.path.getsize(self.path) >= self.bytes_max:
                for index in range(self.kept, 0, -1):
                    older = f"{self.path}.{index - 1}" if index > 1 else self.path
                    if os.path.exists(older):
                        os.replace(older, f"{self.path}.{index}")
        finally:
            self._close_quietly()

    def _close_quietly(self) -> None:
        if self.handle is not None:
            try:
                self.handle.close()
            except OSError:
                pass
            self.handle = None
