"""Labs from the page: start one of chaos/labs' experiments on the console's own cluster and watch it.

Only a console that started its cluster (`railmq up --console`) runs labs: a lab kills and
pauses processes of its topics through the `LocalCluster`. One lab runs at a time, in a thread;
its progress lines go to the page as they are said, its topics appear in the topology while it
runs (and are deleted when it ends), the page charts the cluster's rates live, and at the end the
lab's measures (expected, band, measured, verdict) and its plots (chaos/labs/plots.py's SVG)
are shown.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from typing import Any

from chaos.console.events import TimelineEntry

LINES_MAX = 500
LAB_JOIN_TIMEOUT_S = 5.0


class LabRunner:
    def __init__(self, cluster: Any, collector: Any) -> None:
        self.cluster = cluster
        self.collector = collector
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._state: dict[str, Any] = {"running": False, "lab": None, "lines": [], "result": None}
        self._work_dir = tempfile.mkdtemp(prefix="railmq-console-labs-")

    def catalog(self) -> list[dict[str, Any]]:
        from chaos.labs.catalog import LABS

        return [
            {
                "number": lab.number,
                "name": lab.name,
                "title": lab.title,
                "claim": lab.claim,
                "article": lab.article,
            }
            for lab in LABS
        ]

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {**self._state, "lines": list(self._state["lines"])}

    def start(self, name: str, *, quick: bool = True) -> dict[str, Any]:
        from chaos.labs.catalog import UnknownLab, find

        try:
            lab = find(name)
        except UnknownLab as unknown:
            raise ValueError(str(unknown)) from None
        with self._lock:
            if self._state["running"]:
                raise ValueError(f"lab {self._state['lab']} is still running")
            self._state = {
                "running": True,
                "lab": lab.name,
                "quick": quick,
                "lines": [],
                "result": None,
                "started_ns": time.time_ns(),
            }
        self._note(f"lab {lab.number} ({lab.name}) started{' (quick)' if quick else ''}: {lab.title}")
        self._thread = threading.Thread(target=self._run, args=(lab, quick), name="console-lab", daemon=True)
        self._thread.start()
        return {"started": lab.name}

    def _say(self, line: str) -> None:
        with self._lock:
            lines = self._state["lines"]
            lines.append(line)
            del lines[:-LINES_MAX]

    def _note(self, text: str, severity: str = "info") -> None:
        entry = TimelineEntry(
            time_ns=time.time_ns(),
            event="console-lab",
            category="fault",
            severity=severity,
            text=text,
            actor="console",
        )
        self.collector.post(entry)

    def _run(self, lab: Any, quick: bool) -> None:
        from chaos.labs.plots import plot_svg
        from chaos.labs.runner import run_lab

        try:
            result = run_lab(self.cluster, lab, quick=quick, work_dir=self._work_dir, say=self._say)
            summary = {
                "verdict": result.verdict,
                "error": result.error,
                "elapsed_s": round(result.elapsed_s, 2),
                "facts": list(result.facts),
                "measures": [
                    {
                        "name": measure.name,
                        "expected": measure.expected,
                        "band": measure.band.text(),
                        "measured": measure.measured,
                        "unit": measure.unit,
                        "verdict": measure.verdict,
                    }
                    for measure in result.measures
                ],
                "plots": [plot_svg(plot) for plot in result.plots],
            }
        except Exception as error:  # noqa: BLE001 - a broken lab is shown on the page, not raised in a thread
            summary = {
                "verdict": "ERROR",
                "error": f"{type(error).__name__}: {error}",
                "measures": [],
                "plots": [],
                "facts": [],
            }
        with self._lock:
            self._state.update(running=False, result=summary)
        self._note(
            f"lab {lab.name} finished: {summary['verdict']}",
            "info" if summary["verdict"] == "PASS" else "warning",
        )

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.join(LAB_JOIN_TIMEOUT_S)
        shutil.rmtree(self._work_dir, ignore_errors=True)
