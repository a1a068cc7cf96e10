"""Simulator speed: 1f1b with p=64, m=1024 (131,072 compute actions, 129,024 transfers), with and without the timeline.

Usage: .venv/bin/python benchmarks/sim_speed.py [--repeats N] [--check]

Each timed call starts cold (the schedule's compiled form is dropped, so
compiling counts) and includes the generation-0 garbage collection that the
call's allocations leave behind. Prints medians over the repeats of wall time
and of process CPU time, and the fastest wall time (the machine may be shared:
CPU time and the fastest run are less disturbed by other processes). Targets: >= 500,000 actions/s (wall, cold, both modes)
and peak RSS < 500 MB; with --check the script exits 1 when one fails.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import sys
import time

from pipeplan.schedules import make_schedule
from pipeplan.sim import simulate, uniform_costs
from pipeplan.sim.engine.program import forget_programs, program_for

STAGES = 64
MICROBATCHES = 1024
TARGET_ACTIONS_PER_S = 500_000
TARGET_RSS_MB = 500.0


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_runs(record: bool, repeats: int, cold: bool) -> tuple[float, float, float, int, float]:
    """Median wall, fastest wall and median CPU seconds of `repeats` simulations, the action count, the iteration time."""
    schedule = make_schedule("1f1b", STAGES, MICROBATCHES)
    costs = uniform_costs(schedule, fwd=1.0, bwd=2.0, comm=0.25, act_bytes=1e6)
    actions = sum(len(r) for r in schedule.ranks)
    walls, cpus = [], []
    iteration = 0.0
    for _ in range(repeats):
        forget_programs()
        if not cold:
            program_for(schedule)
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        result = simulate(schedule, costs, record=record)
        gc.collect(0)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        iteration = result.iteration_time
        if record:
            assert len(result.compute) == actions and len(result.transfers) == 2 * (STAGES - 1) * MICROBATCHES
        del result
    return statistics.median(walls), min(walls), statistics.median(cpus), actions, iteration


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    args = parser.parse_args()
    failed = False
    print(f"1f1b p={STAGES} m={MICROBATCHES}, f=1 b=2 comm=0.25 ms; median of {args.repeats} runs")
    print(f"{'mode':<40}{'wall s':>8}{'actions/s':>12}{'best/s':>12}{'cpu s':>8}{'actions/cpu-s':>15}{'iteration ms':>14}")
    for record, cold in ((False, True), (True, True), (False, False), (True, False)):
        wall, best, cpu, actions, iteration = time_runs(record, args.repeats, cold)
        mode = f"record={record}, " + ("cold (compile counted)" if cold else "compiled form reused")
        rates = f"{actions / wall:>12,.0f}{actions / best:>12,.0f}{cpu:>8.3f}{actions / cpu:>15,.0f}"
        print(f"{mode:<40}{wall:>8.3f}{rates}{iteration:>14.2f}")
        if cold and actions / wall < TARGET_ACTIONS_PER_S:
            failed = True
    rss = peak_rss_mb()
    print(f"peak RSS {rss:.0f} MB (target < {TARGET_RSS_MB:.0f} MB); target >= {TARGET_ACTIONS_PER_S:,} actions/s wall, cold")
    failed = failed or rss >= TARGET_RSS_MB
    print("TARGET FAILED" if failed else "targets met")
    return 1 if failed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
