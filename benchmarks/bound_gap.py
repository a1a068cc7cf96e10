"""How far pipeplan's plans are from a proven lower bound (planner.bound) on every planner-quality instance.

Usage: .venv/bin/python benchmarks/bound_gap.py --rows results.json [--worst 12] [--out gaps.json]

`--rows` is the JSON that benchmarks/planner_quality.py writes with --out (its 416 preset instances: every
shared profile x every built-in cluster x global batch 256 and 2048, with pipeplan's simulated time). For each
instance this script computes two bounds of planner.bound and prints the gap pipeplan's plan leaves over each:

- all plans: `lower_bound(request)`, which holds for every plan the simulator scores (any schedule, interleaved
  or `list` with chunks included);
- one stage per rank: `lower_bound(request, stages=True)`, which holds for every plan whose ranks each run one
  contiguous stage (gpipe, 1f1b, kfkb, zb-h1, `list` without chunks); it is no bound for interleaved plans, so it
  is reported only where pipeplan's own plan has one stage per rank.

Gap = pipeplan's time / bound (>= 1). Prints the geomean per cluster and overall, the worst instances with the
term that binds and the shape (pipeline replicas, microbatch size) where the bound is reached.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

GOAL = 1.05


def geomean(values: list[float]) -> float:
    """Geometric mean (nan for none)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def bound_row(row: dict[str, Any], scaling: str) -> dict[str, Any]:
    """Both bounds of one planner-quality instance, with pipeplan's time and plan."""
    from pipeplan.planner.bound import lower_bound
    from pipeplan.planner.request import PlanRequest
    from pipeplan.presets.resolve import load_cluster, load_profile

    request = PlanRequest(load_profile(row["profile"]), load_cluster(row["cluster"]), row["batch"], batch_scaling=scaling)
    started = time.perf_counter()
    every = lower_bound(request)
    staged = lower_bound(request, stages=True)
    plan = row["pipeplan"].get("plan", "")
    out = {
        "profile": row["profile"],
        "cluster": row["cluster"],
        "batch": row["batch"],
        "pipeplan_ms": row["pipeplan"].get("ms"),
        "plan": plan,
        "bound_ms": every.ms,
        "bound_term": every.term,
        "bound_shape": [every.pipelines, every.microbatch_size],
        "stages_bound_ms": staged.ms,
        "stages_term": staged.term,
        "stages_shape": [staged.pipelines, staged.microbatch_size],
        "one_stage_per_rank": "v=" not in plan,
        "seconds": time.perf_counter() - started,
    }
    return out


def main() -> int:
    """Compute the bounds, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", required=True, help="planner_quality.py --out JSON")
    parser.add_argument("--worst", type=int, default=12, help="worst instances listed")
    parser.add_argument("--out", default=None, help="write the per-instance rows here")
    parser.add_argument("--batch-scaling", default="auto", help="the cost model the rows were planned with")
    parser.add_argument("--workers", type=int, default=1, help="processes")
    args = parser.parse_args()
    rows = json.loads(Path(args.rows).read_text())["presets"]
    rows = [r for r in rows if "ms" in r["pipeplan"]]
    started = time.perf_counter()
    jobs = [(r, args.batch_scaling) for r in rows]
    if args.workers > 1:
        from multiprocessing import Pool

        with Pool(args.workers) as pool:
            gaps = pool.starmap(bound_row, jobs, chunksize=4)
    else:
        gaps = [bound_row(*job) for job in jobs]
    for g in gaps:
        g["gap"] = g["pipeplan_ms"] / g["bound_ms"]
        g["stages_gap"] = g["pipeplan_ms"] / g["stages_bound_ms"] if g["one_stage_per_rank"] else None
    bad = [g for g in gaps if g["gap"] < 1 - 1e-9 or (g["stages_gap"] is not None and g["stages_gap"] < 1 - 1e-9)]
    seconds = [g["seconds"] for g in gaps]
    print(f"{len(gaps)} instances, bounds computed in {time.perf_counter() - started:.0f} s "
          f"(median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s)")  # fmt: skip
    print("| cluster | instances | gap over the all-plan bound: geomean | max | one stage per rank: instances | geomean | max |")
    print("|---|---|---|---|---|---|---|")
    for cluster in dict.fromkeys(g["cluster"] for g in gaps):
        mine = [g for g in gaps if g["cluster"] == cluster]
        staged = [g["stages_gap"] for g in mine if g["stages_gap"] is not None]
        print(f"| {cluster} | {len(mine)} | {geomean([g['gap'] for g in mine]):.3f} | {max(g['gap'] for g in mine):.3f} | "
              f"{len(staged)} | {geomean(staged):.3f} | {max(staged, default=math.nan):.3f} |")  # fmt: skip
    every = [g["gap"] for g in gaps]
    staged = [g["stages_gap"] for g in gaps if g["stages_gap"] is not None]
    print(
        f"all: geomean {geomean(every):.3f} (goal <= {GOAL}), median {statistics.median(every):.3f}, "
        f"max {max(every):.3f}; within 1.05: {sum(x <= 1.05 for x in every)} of {len(every)}"
    )
    print(
        f"one stage per rank ({len(staged)} plans), over the one-stage-per-rank bound: geomean {geomean(staged):.3f}, "
        f"max {max(staged, default=math.nan):.3f}"
    )
    terms: dict[str, int] = {}
    for g in gaps:
        terms[g["bound_term"]] = terms.get(g["bound_term"], 0) + 1
    print(f"binding term of the all-plan bound: {terms}")
    print(f"\nworst {args.worst} (all-plan bound):")
    print("| instance | pipeplan ms | plan | bound ms | term | shape rp x b | gap | stage-bound gap |")
    print("|---|---|---|---|---|---|---|---|")
    for g in sorted(gaps, key=lambda g: -g["gap"])[: args.worst]:
        sg = f"{g['stages_gap']:.3f}" if g["stages_gap"] is not None else "-"
        print(f"| {g['profile']} {g['cluster']} G={g['batch']} | {g['pipeplan_ms']:.2f} | {g['plan']} | {g['bound_ms']:.2f} | "
              f"{g['bound_term']} | {g['bound_shape'][0]} x {g['bound_shape'][1]} | {g['gap']:.3f} | {sg} |")  # fmt: skip
    for g in bad:
        print(f"  BOUND ABOVE A PLAN: {g}")
    if args.out:
        Path(args.out).write_text(json.dumps(gaps, indent=1, sort_keys=True))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
