"""A lab started from the console's page runs on the console's own cluster, streams its lines,
lands on the timeline and ends with its verdict and plots (slow: a quick lab takes ~20 s)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.helpers import wait_for

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_a_quick_lab_runs_from_the_page():
    from chaos.console.server import Console
    from chaos.labs.runner import lab_cluster

    with lab_cluster() as cluster, Console(cluster.bootstrap, cluster=cluster) as console:
        listing = json.loads(urllib.request.urlopen(console.url + "/api/labs", timeout=10).read())
        assert listing["available"] and any(lab["name"] == "hot-key" for lab in listing["labs"])
        request = urllib.request.Request(console.url + "/api/labs", method="POST",
                                         data=json.dumps({"name": "hot-key", "quick": True}).encode(),
                                         headers={"Content-Type": "application/json"})
        assert json.loads(urllib.request.urlopen(request, timeout=10).read()) == {"started": "hot-key"}

        def finished():
            run = json.loads(urllib.request.urlopen(console.url + "/api/labs/run", timeout=10).read())
            return run if not run["running"] else None

        run = wait_for(finished, 240, "the lab to finish", interval_s=1.0)
        assert run["result"]["verdict"] == "PASS", run["result"]
        assert run["result"]["plots"] and run["lines"][0].startswith("lab 3: hot-key")
        notes = [entry.text for entry in console.collector.timeline() if entry.event == "console-lab"]
        assert notes[0].startswith("lab 3 (hot-key) started") and notes[-1] == "lab hot-key finished: PASS"
