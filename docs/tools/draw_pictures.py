"""Draw the pictures in docs/pictures: the failure modes and mechanisms the docs explain.

    python docs/tools/draw_pictures.py            # write every picture into docs/pictures
    python docs/tools/draw_pictures.py --check    # exit 1 if a committed picture is not current

Each picture is a function of nothing but this code (docs/tools/svg.py draws), so the files are
reproducible and `--check` is exact; tests/cli/test_docs.py runs it. The report picture draws
the real report timeline (chaos/report.py) from a fixed, made-up run and numbers its parts.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # svg.py, beside this file
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from pictures_flow import failover, rebalance  # noqa: E402
from pictures_logs import data_path, replication, share_states  # noqa: E402
from pictures_report import reading_the_report  # noqa: E402

PICTURES: dict[str, Callable[[], str]] = {
    "replication.svg": replication,
    "failover.svg": failover,
    "rebalance.svg": rebalance,
    "share-states.svg": share_states,
    "data-path.svg": data_path,
    "reading-the-report.svg": reading_the_report,
}
FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pictures")


def stale(folder: str = FOLDER) -> list[str]:
    """The pictures whose file is missing or differs from what the code draws."""
    out = []
    for name, draw in PICTURES.items():
        path = os.path.join(folder, name)
        current = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if current != draw():
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed picture is not current")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            print(f"docs/pictures/{name} is not current: run python docs/tools/draw_pictures.py", file=sys.stderr)
        return 1 if names else 0
    os.makedirs(FOLDER, exist_ok=True)
    for name, draw in PICTURES.items():
        with open(os.path.join(FOLDER, name), "w", encoding="utf-8") as handle:
            handle.write(draw())
        print(f"wrote docs/pictures/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
