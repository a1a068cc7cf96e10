"""Planner fuzzing: seeded random requests (real profiles and their slices, random clusters, batches, restrictions).

Usage: .venv/bin/python benchmarks/planner_fuzz.py [--seeds 0:200] [--large] [--workers 2] [--check]

Each seed builds `planner.instances.fuzz_request(seed, large)` and runs pipeplan, dapple, pipedream
and balanced on it; `planner.audit` checks every answer: no crash (only PipeplanError may end a
planner), plans fit and simulate to the time they report, --schedule/--microbatch-size are kept,
and pipeplan finds a plan whenever a baseline does and is never slower than one. Prints each broken
invariant with its seed, then a summary. --large uses clusters of 36-256 devices (slower).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the test tooling: planner_instances, planner_audit

PLANNERS = ("pipeplan", "dapple", "pipedream", "balanced")


def run(job: tuple[int, bool]) -> dict[str, Any]:
    """Audit one seeded request."""
    from pipeplan.planner.planners import PLANNERS as REGISTRY
    from planner_audit import audit
    from planner_instances import fuzz_request

    seed, large = job
    request = fuzz_request(seed, large)
    planners = REGISTRY
    result = audit(request, {name: planners[name] for name in PLANNERS})
    describe = (
        f"{request.profile.name} ({request.profile.num_layers} layers) on {request.cluster.num_devices} devices, "
        f"G={request.global_batch} b={request.microbatch_size} schedule={request.schedule}"
    )
    return {"seed": seed, "request": describe, "times": result.times, "seconds": result.seconds, "problems": result.problems}


def main() -> int:
    """Run the seeds, print problems and a summary; with --check exit 1 on any problem."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:200", help="seed range A:B (default 0:200)")
    parser.add_argument("--large", action="store_true", help="clusters of 36-256 devices")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--check", action="store_true", help="exit 1 when an invariant is broken")
    args = parser.parse_args()
    first, last = (int(x) for x in args.seeds.split(":"))
    started = time.perf_counter()
    with Pool(args.workers) as pool:
        rows = sorted(pool.imap_unordered(run, [(s, args.large) for s in range(first, last)]), key=lambda r: r["seed"])
    broken = [r for r in rows if r["problems"]]
    for r in broken:
        for problem in r["problems"]:
            print(f"seed {r['seed']} ({r['request']}): {problem}")
    answered = sum(isinstance(r["times"]["pipeplan"], float) for r in rows)
    ratios = [
        min(t for name, t in r["times"].items() if name != "pipeplan" and isinstance(t, float)) / r["times"]["pipeplan"]
        for r in rows
        if isinstance(r["times"]["pipeplan"], float)
        and r["times"]["pipeplan"] > 0
        and any(isinstance(t, float) for name, t in r["times"].items() if name != "pipeplan")
    ]
    seconds = [r["seconds"]["pipeplan"] for r in rows]
    print(f"{len(rows)} requests (seeds {first}:{last}{', large clusters' if args.large else ''}): pipeplan answered {answered} "
          f"and refused {len(rows) - answered} with a PipeplanError; {len(broken)} with a broken invariant")  # fmt: skip
    if ratios:
        print(f"best baseline / pipeplan: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
    print(f"pipeplan planning s: median {statistics.median(seconds):.2f}, max {max(seconds):.2f}; "
          f"wall {time.perf_counter() - started:.0f} s with {args.workers} workers")  # fmt: skip
    return 1 if args.check and broken else 0


if __name__ == "__main__":
    sys.exit(main())
