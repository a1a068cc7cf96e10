"""Startup: how long a user waits for the commands that should answer at once (whole process, fresh each run).

Usage: .venv/bin/python benchmarks/startup.py [--runs 5] [--check]

Targets (issue "Fast and unbreakable where a user touches it"):
  S1 `pipeplan --help` <= 0.3 s (commands import heavy dependencies only when they run);
  S2 `pipeplan simulate 1f1b -p 64 -m 1024 --json` <= 1 s (validation linear in the actions, no matplotlib for JSON).
Medians over --runs rounds, the commands timed in turn; --check exits 1 when a target fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proc_timing import PIPEPLAN, Timing, load_line, run_in_turn

CASES = [
    ("S1", "pipeplan --help", 0.3),
    ("S2", "pipeplan simulate 1f1b -p 64 -m 1024 --json", 1.0),
    ("", "pipeplan schedule zb-h1 -p 8 -m 32 --json", None),
    ("", "pipeplan show cluster h100-8x128 --json", None),
]
"""(target name, the command as a user types it, target wall seconds); run as this interpreter's pipeplan."""


def main() -> None:
    """Time every case in turn; print a table and the targets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="counted rounds (each command once per round)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    args = parser.parse_args()
    timings = [Timing(label, [*PIPEPLAN, *label.split()[1:]]) for _, label, _ in CASES]
    print(f"before: {load_line()}")
    run_in_turn(timings, args.runs, warmup=1, timeout_s=120)
    print(f"after:  {load_line()}")
    print("| command | wall s (median) | min | max | peak MiB | target |")
    print("|---|---|---|---|---|---|")
    failed = []
    for (name, _, target), timing in zip(CASES, timings, strict=True):
        verdict = "-"
        if target is not None:
            ok = timing.meets(seconds=target)
            verdict = f"{name} <= {target:g} s {'PASS' if ok else 'FAIL'}"
            if not ok:
                failed.append(name)
        print(f"| `{timing.label}` | {timing.cells(3)} | {verdict} |")
    if args.check and failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
