"""The docs' pictures are current and the docs point at ones that exist.

Given the drawing code in docs/tools, when it draws the pictures again, then every committed SVG
is byte for byte what it draws; every picture the README and the getting-started page show is
one of them; and each SVG stands on its own (a title for screen readers, nothing loaded)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
PICTURES = REPOSITORY / "docs" / "pictures"


def test_the_committed_pictures_are_what_the_drawing_code_draws():
    finished = subprocess.run([sys.executable, "docs/tools/draw_pictures.py", "--check"], cwd=REPOSITORY,
                              capture_output=True, text=True, timeout=60)
    assert finished.returncode == 0, finished.stderr


def test_the_six_subjects_are_drawn_and_stand_on_their_own():
    # labs-*.svg come from `railmq lab run --all --pictures docs/pictures` (docs/labs.md), the rest
    # from docs/tools/draw_pictures.py.
    names = sorted(path.name for path in PICTURES.glob("*.svg") if not path.name.startswith("labs-"))
    assert names == sorted(["replication.svg", "failover.svg", "rebalance.svg", "share-states.svg",
                            "data-path.svg", "reading-the-report.svg"])
    for path in PICTURES.glob("*.svg"):
        text = path.read_text(encoding="utf-8")
        assert "<title" in text and "<desc" in text, path.name
        assert not re.search(r"<(script|image|foreignObject)\b|href=", text), f"{path.name} loads nothing"


def test_the_docs_show_pictures_that_exist():
    for page, folder in ((REPOSITORY / "README.md", REPOSITORY), (REPOSITORY / "docs" / "getting-started.md",
                                                                  REPOSITORY / "docs")):
        shown = re.findall(r"\((?:docs/)?(pictures/[\w-]+\.svg)\)", page.read_text(encoding="utf-8"))
        assert shown, page.name
        for picture in shown:
            assert (folder / picture).exists() or (REPOSITORY / "docs" / picture).exists(), (page.name, picture)
    getting_started = (REPOSITORY / "docs" / "getting-started.md").read_text(encoding="utf-8")
    for section in ("Install", "Start a cluster", "records in, records out", "A consumer group", "Break it"):
        assert section in getting_started
