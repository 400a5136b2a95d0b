"""How fast the fuzz tier runs: cases per second per actor kind (chaos/fuzz.py).

    python -m bench.fuzz [--cases 60000] [--seed 1] [--json]

Each actor kind is fuzzed alone, so its figure is its own handlers' cost plus the codec's; the
findings line must say 0 (anything else is a bug to fix and to keep under tests/fuzz/regressions).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from chaos.fuzz import Fuzzer
from chaos.fuzz_targets import all_targets


def measure(cases: int, seed: int) -> dict:
    figures: dict = {"kinds": {}, "findings": 0}
    for target in all_targets():
        fuzzer = Fuzzer([target], seed=seed)
        started = time.perf_counter()
        stats = fuzzer.run(cases)
        elapsed = time.perf_counter() - started
        figures["kinds"][target.name] = {
            "cases_per_s": round(cases / elapsed), "handled": stats.handled, "decode_failures": stats.decode_failures,
            "refused_unauthenticated": stats.refused, "findings": len(stats.findings)}
        figures["findings"] += len(stats.findings)
        print(f"  {target.name:<18} {cases / elapsed:>8,.0f} cases/s  handled {stats.handled:>6}  "
              f"decode failures {stats.decode_failures:>6}  refused {stats.refused:>5}  findings {len(stats.findings)}",
              file=sys.stderr)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20_000, help="cases per actor kind (default 20000)")
    parser.add_argument("--seed", type=int, default=1, help="the fuzzer's seed (default 1)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    figures = measure(args.cases, args.seed)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        total = sum(kind["cases_per_s"] for kind in figures["kinds"].values()) / len(figures["kinds"])
        print(f"{len(figures['kinds'])} actor kinds, {args.cases} cases each, mean {total:,.0f} cases/s, "
              f"{figures['findings']} findings")
    return 1 if figures["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
