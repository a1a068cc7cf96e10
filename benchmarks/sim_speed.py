"""Simulator speed: 1f1b with p=64, m=1024 (131,072 compute actions plus transfers), with and without the timeline.

Usage: .venv/bin/python benchmarks/sim_speed.py [--repeats N] [--check]

Each timing is a fresh process-free cold run: the schedule's compiled form is
dropped before every repeat, so compile time counts. Prints the median of the
repeats; with --check exits 1 when a target fails (>= 500,000 actions/s, peak
RSS < 500 MB).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

from pipeplan.schedules import make_schedule
from pipeplan.sim import engine, simulate, uniform_costs

STAGES = 64
MICROBATCHES = 1024
TARGET_ACTIONS_PER_S = 500_000
TARGET_RSS_MB = 500.0


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_runs(record: bool, repeats: int, warm: bool) -> tuple[float, int, float]:
    """Median seconds of `repeats` simulations, the action count, and the iteration time."""
    schedule = make_schedule("1f1b", STAGES, MICROBATCHES)
    costs = uniform_costs(schedule, fwd=1.0, bwd=2.0, comm=0.25, act_bytes=1e6)
    actions = sum(len(r) for r in schedule.ranks)
    seconds = []
    result = None
    for _ in range(repeats):
        if not warm:
            engine._PROGRAMS.clear()
        else:
            engine.program_for(schedule)
        start = time.perf_counter()
        result = simulate(schedule, costs, record=record)
        seconds.append(time.perf_counter() - start)
        if record:
            assert len(result.compute) == actions and len(result.transfers) == 2 * (STAGES - 1) * MICROBATCHES
    assert result is not None
    return statistics.median(seconds), actions, result.iteration_time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    args = parser.parse_args()
    rows = []
    failed = False
    print(f"1f1b p={STAGES} m={MICROBATCHES}, comm 0.25 ms, median of {args.repeats}")
    print(f"{'mode':<28}{'seconds':>10}{'actions/s':>14}{'iteration ms':>15}")
    for record, warm in ((False, False), (True, False), (False, True)):
        seconds, actions, iteration = time_runs(record, args.repeats, warm)
        rate = actions / seconds
        mode = f"record={record}" + (" (compiled reused)" if warm else "")
        rows.append((mode, seconds, rate))
        print(f"{mode:<28}{seconds:>10.3f}{rate:>14,.0f}{iteration:>15.2f}")
        if not warm and rate < TARGET_ACTIONS_PER_S:
            failed = True
    rss = peak_rss_mb()
    print(f"peak RSS {rss:.0f} MB (target < {TARGET_RSS_MB:.0f} MB); target {TARGET_ACTIONS_PER_S:,} actions/s")
    failed = failed or rss >= TARGET_RSS_MB
    if failed:
        print("TARGET FAILED")
    return 1 if failed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
