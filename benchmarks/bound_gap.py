"""How far pipeplan's plans are from a proven lower bound (planner.bound) on every planner-quality instance.

Usage: .venv/bin/python benchmarks/bound_gap.py [--rows results.json] [--out gaps.jsonl] [--workers 2] [--worst 12]
       .venv/bin/python benchmarks/bound_gap.py --report gaps.jsonl

The instances are planner_quality.py's 416: every shared profile x every built-in cluster x global batch 256 and
2048. Without `--rows` pipeplan plans each one here (small clusters first; each row is appended to --out as it
is done, so a stopped run keeps what it did); with `--rows`, pipeplan's times come from the JSON that
benchmarks/planner_quality.py writes with --out. `--report` prints the tables of a finished or partial --out.
For each instance this script computes two bounds of planner.bound and prints the gap pipeplan's plan leaves:

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


def describe(plan: Any) -> str:
    """planner_quality.py's short text form of a plan."""
    schedule = plan.schedule + (f" k={plan.k}" if plan.schedule == "kfkb" else "")
    schedule += f" v={plan.chunks}" if plan.chunks > 1 else ""
    widths = ",".join(str(plan.replicas_of(s)) for s in range(plan.num_ranks))
    return f"{schedule} {plan.num_ranks}x{plan.pipeline_replicas} m={plan.microbatches}x{plan.microbatch_size} r=[{widths}]"


def bound_row(row: dict[str, Any], scaling: str) -> dict[str, Any]:
    """Both bounds of one planner-quality instance, with pipeplan's time and plan (planned here when not given)."""
    from pipeplan.planner.bound import lower_bound
    from pipeplan.planner.bound_orders import stage_bound_over_orders
    from pipeplan.planner.registry import PLANNERS
    from pipeplan.planner.request import PlanRequest
    from pipeplan.presets.resolve import load_cluster, load_profile

    request = PlanRequest(load_profile(row["profile"]), load_cluster(row["cluster"]), row["batch"], batch_scaling=scaling)
    if "pipeplan" not in row:
        started = time.perf_counter()
        try:
            result = PLANNERS["pipeplan"](request)
            row = {**row, "pipeplan": {"ms": result.iteration_time, "plan": describe(result.plan),
                                       "s": time.perf_counter() - started}}  # fmt: skip
        except Exception as exc:
            return {**row, "error": f"{type(exc).__name__}: {exc}"}
    started = time.perf_counter()
    every = lower_bound(request)
    plan = row["pipeplan"].get("plan", "")
    staged = stage_bound_over_orders(request)
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
        "planning_seconds": row["pipeplan"].get("s"),
    }
    return out


def main() -> int:
    """Compute the bounds, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=None, help="planner_quality.py --out JSON, or an --out JSONL of this script")
    parser.add_argument("--report", default=None, help="print the tables of an --out JSONL")
    parser.add_argument("--worst", type=int, default=12, help="worst instances listed")
    parser.add_argument("--out", default=None, help="append the per-instance rows here (JSON lines)")
    parser.add_argument("--batch-scaling", default="auto", help="the cost model the rows were planned with")
    parser.add_argument("--workers", type=int, default=2, help="processes")
    args = parser.parse_args()
    if args.report:
        lines = Path(args.report).read_text().splitlines()
        return report([json.loads(line) for line in lines if line.strip()], args.worst)
    if args.rows and args.rows.endswith(".jsonl"):  # this script's own rows: pipeplan's plans kept, bounds again
        lines = [json.loads(line) for line in Path(args.rows).read_text().splitlines() if line.strip()]
        rows = [{"profile": g["profile"], "cluster": g["cluster"], "batch": g["batch"],
                 "pipeplan": {"ms": g["pipeplan_ms"], "plan": g["plan"], "s": g.get("planning_seconds")}}
                for g in lines if "error" not in g]  # fmt: skip
    elif args.rows:
        rows = [r for r in json.loads(Path(args.rows).read_text())["presets"] if "ms" in r["pipeplan"]]
    else:
        from pipeplan.presets.resolve import list_clusters, list_profiles, load_cluster

        clusters = sorted(list_clusters(), key=lambda c: load_cluster(c).num_devices)
        rows = [{"profile": p, "cluster": c, "batch": b} for c in clusters for p in list_profiles() for b in (256, 2048)]
    started = time.perf_counter()
    jobs = [(r, args.batch_scaling) for r in rows]
    gaps = []
    out = open(args.out, "a", encoding="utf-8") if args.out else None  # noqa: SIM115 - appended row by row
    from multiprocessing import Pool

    with Pool(max(1, args.workers)) as pool:
        for i, g in enumerate(pool.imap(_bound_job, jobs, chunksize=1)):
            gaps.append(g)
            if out is not None:
                out.write(json.dumps(g, sort_keys=True) + "\n")
                out.flush()
            if (i + 1) % 25 == 0:
                print(f"  {i + 1}/{len(jobs)} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    if out is not None:
        out.close()
    return report(gaps, args.worst)


def _bound_job(job: tuple[dict[str, Any], str]) -> dict[str, Any]:
    """bound_row for a pool."""
    return bound_row(*job)


def report(gaps: list[dict[str, Any]], worst: int) -> int:
    """Print the gap tables; 1 when a bound lies above a plan (a bug)."""
    failed = [g for g in gaps if "error" in g]
    gaps = [g for g in gaps if "error" not in g]
    for g in gaps:
        g["gap"] = g["pipeplan_ms"] / g["bound_ms"]
        g["stages_gap"] = g["pipeplan_ms"] / g["stages_bound_ms"] if g["one_stage_per_rank"] else None
    bad = [g for g in gaps if g["gap"] < 1 - 1e-9 or (g["stages_gap"] is not None and g["stages_gap"] < 1 - 1e-9)]
    seconds = [g["seconds"] for g in gaps]
    print(f"{len(gaps)} instances ({len(failed)} without a pipeplan plan); bounds computed in "
          f"{statistics.median(seconds):.2f} s median, {max(seconds):.2f} s max")  # fmt: skip
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
    print(f"\nworst {worst} (all-plan bound):")
    print("| instance | pipeplan ms | plan | bound ms | term | shape rp x b | gap | stage-bound gap |")
    print("|---|---|---|---|---|---|---|---|")
    for g in sorted(gaps, key=lambda g: -g["gap"])[:worst]:
        sg = f"{g['stages_gap']:.3f}" if g["stages_gap"] is not None else "-"
        print(f"| {g['profile']} {g['cluster']} G={g['batch']} | {g['pipeplan_ms']:.2f} | {g['plan']} | {g['bound_ms']:.2f} | "
              f"{g['bound_term']} | {g['bound_shape'][0]} x {g['bound_shape'][1]} | {g['gap']:.3f} | {sg} |")  # fmt: skip
    for g in bad:
        print(f"  BOUND ABOVE A PLAN: {g}")
    for g in failed:
        print(f"  no pipeplan plan: {g['profile']} {g['cluster']} G={g['batch']}: {g['error']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
