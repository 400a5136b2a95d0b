"""Starting Debian's chromium through playwright, for the console's browser tests, its benchmark
(bench/console.py) and the docs screenshot (docs/tools/console_screenshot.py).

Never `playwright install`: the system browser is used (`RAILMQ_CHROMIUM` names another), with
the flags a headless run in a container needs and without any network of its own."""

from __future__ import annotations

import os
import shutil

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    for candidate in (
        os.environ.get("RAILMQ_CHROMIUM", ""),
        "/usr/bin/chromium",
        shutil.which("chromium") or "",
        shutil.which("chromium-browser") or "",
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return ""


def why_no_browser() -> str:
    """ "" when a browser test can run here, else the reason it cannot."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if not chromium_path():
        return "no chromium here (apt-get install chromium; .ci/run installs it)"
    return ""


def launch(playwright):
    return playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
