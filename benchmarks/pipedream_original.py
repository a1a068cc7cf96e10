"""The pipedream baseline against all 214 plans of the original PipeDream planner (tests/data/pipedream_original.json.gz).

Usage: .venv/bin/python benchmarks/pipedream_original.py [--only REGEX] [--check]

Per run: the baseline's predicted time against the original's (relative difference), whether the original's
plan is worth the same under the baseline's terms (co-optimal), whether the optimum is tie-free and, if so,
whether stage node sets and replicas per level are the original's, and the planning time (the original's
runtime is in the saved runs, minutes where this takes seconds). --check exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pipedream_cases import REL, cases, original_value_ms, planned, planning_sets


def main() -> None:
    """Compare every run; print one line each and a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="regular expression on the run's tag")
    parser.add_argument("--check", action="store_true", help="exit 1 on any mismatch")
    args = parser.parse_args()
    total = same_time = co_optimal = unique = same_plan = 0
    seconds = []
    for c in cases():
        if not re.search(args.only, c.tag):
            continue
        started = time.perf_counter()
        mine = planned(c.tag)
        seconds.append(time.perf_counter() - started)
        rel = abs(mine.predicted_ms - c.predicted_ms) / c.predicted_ms
        theirs = original_value_ms(c)
        co = abs(theirs - mine.predicted_ms) <= REL * mine.predicted_ms
        ours, their_sets = planning_sets(c, mine)
        plan_equal = ours == their_sets and tuple(s.replicas_per_level for s in mine.stages) == c.replicas
        total += 1
        same_time += rel <= REL
        co_optimal += co
        unique += mine.unique
        same_plan += mine.unique and plan_equal
        mark = "" if rel <= REL and co and (plan_equal or not mine.unique) else "  MISMATCH"
        print(f"{c.tag:58s} rel {rel:.1e} co-optimal {int(co)} tie-free {int(mine.unique)} same plan {int(plan_equal)} "
              f"states {mine.num_states:5d} {seconds[-1]:6.2f} s{mark}", flush=True)  # fmt: skip
    print(f"\nruns {total}: predicted time equal (<= {REL:g} relative) {same_time}, original's plan co-optimal "
          f"{co_optimal}, tie-free {unique} of which the same stage sets and replicas per level {same_plan}; "
          f"planning {sum(seconds):.1f} s in all, slowest {max(seconds, default=0):.2f} s")  # fmt: skip
    if args.check and not (same_time == co_optimal == total and same_plan == unique):
        sys.exit(1)


if __name__ == "__main__":
    main()
