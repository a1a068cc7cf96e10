"""The dapple baseline's DP and HPGO's ranking against all 112 plans of the original DAPPLE planner (HPGO 0.9.2).

Usage: .venv/bin/python benchmarks/dapple_original.py [--only REGEX] [--check]

Per run (tests/data/dapple_original.json.gz): the port's best speed-up over HPGO's candidate set against the
wheel's (relative difference); the wheel's own plan priced by the port's terms (it must give the wheel's number:
the terms are the same); whether the port picked the same stage node sets and GPUs per replica; where the
speed-ups differ, whether both plans have the same DP value (a tie the wheel breaks in its hash order); and the
planning time. --check exits 1 when a run differs without such a tie or the wheel's plan is priced otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from dapple_cases import REL, best, cases, original_block, original_sets, original_speedup, stage_sets


def main() -> None:
    """Compare every run; print one line each and a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="regular expression on the run's tag")
    parser.add_argument("--check", action="store_true", help="exit 1 on a difference not explained by a DP tie")
    args = parser.parse_args()
    total = equal = priced = same = ties = 0
    worst_tie = 0.0
    seconds = []
    bad = []
    for c in cases():
        if not re.search(args.only, c.tag):
            continue
        started = time.perf_counter()
        mine = best(c.tag)
        seconds.append(time.perf_counter() - started)
        rel = abs(mine.speedup - c.speedup) / c.speedup
        theirs = original_speedup(c)
        price_ok = abs(theirs - c.speedup) <= REL * c.speedup
        plan_equal = stage_sets(c, mine.stages) == original_sets(c) and tuple(s.units for s in mine.stages) == c.units
        tie = rel > REL and abs(mine.block_s - original_block(c)) <= 1e-12 * original_block(c)
        total += 1
        equal += rel <= REL
        priced += price_ok
        same += plan_equal
        ties += tie
        worst_tie = max(worst_tie, rel if tie else 0.0)
        mark = "" if price_ok and (rel <= REL or tie) else "  MISMATCH"
        bad += [c.tag] if mark else []
        print(f"{c.tag:58s} rel {rel:.1e} priced {int(price_ok)} same plan {int(plan_equal)} tie {int(tie)} "
              f"{mine.label:20s} {seconds[-1]:6.2f} s{mark}", flush=True)  # fmt: skip
    print(f"\nruns {total}: speed-up equal (<= {REL:g} relative) {equal}; the wheel's plan priced at its own number "
          f"{priced}; same stage sets and GPUs per replica {same}; DP ties the wheel broke otherwise {ties} (speed-up "
          f"apart by at most {worst_tie:.1e}); planning {sum(seconds):.1f} s in all, "
          f"slowest {max(seconds, default=0):.2f} s")  # fmt: skip
    if args.check and bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
