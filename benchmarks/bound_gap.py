"""How far pipeplan's plans are from a proven lower bound (planner.bound.shape_bounds) on every planner-quality instance.

Usage: .venv/bin/python benchmarks/bound_gap.py [--rows results.json] [--bounds gaps.jsonl] [--out gaps.jsonl]
                                                [--workers 2] [--worst 12] [--bounds-only]
       .venv/bin/python benchmarks/bound_gap.py --report gaps.jsonl

The instances are planner_quality.py's 416: every shared profile x every built-in cluster x global batch 256 and
2048. Without `--rows` pipeplan plans each one here (small clusters first; each row is appended to --out as it
is done, so a stopped run keeps what it did); with `--rows`, pipeplan's times come from the JSON that
benchmarks/planner_quality.py writes with --out (or this script's own JSONL). `--bounds-only` computes the bounds
of every instance without planning; `--bounds FILE` reuses the bounds of an earlier --out (by profile, cluster,
batch) instead of computing them again. `--report` prints the tables of a finished or partial --out.
For each instance this script computes two bounds and the gap pipeplan's plan leaves:

- all plans: `planner.bound.shape_bounds.lower_bound(request)`, which holds for every plan the simulator scores (any schedule,
  interleaved or `list` with chunks included, any layer order of a DAG profile);
- one stage per rank: `planner.bound.over_orders.stage_bound_over_orders(request)`, which holds for every plan whose
  ranks each run one contiguous stage (gpipe, 1f1b, kfkb, zb-h1, `list` without chunks) in the profile's layer
  order or one of the DAG orders pipeplan's search plans on.

The gap of an instance is pipeplan's time over the bound of its plan's class (the rule): the one-stage-per-rank
bound when pipeplan's plan runs one stage per rank (it is one of those plans), else the all-plan bound. Prints
the geomean per cluster and overall, the worst instances with the term that binds and the shape (pipeline
replicas, microbatch size) where the bound is reached.
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
from unittest import mock

from planner_quality import describe, geomean  # the same short plan text and mean as the rows this reads

GOAL = 1.05


BOUND_KEYS = ("bound_ms", "bound_term", "bound_shape", "stages_bound_ms", "stages_term", "stages_shape", "seconds")


def bound_row(row: dict[str, Any], scaling: str, plan_it: bool, known: dict[str, Any] | None) -> dict[str, Any]:
    """Both bounds of one instance (or `known` ones), with pipeplan's time and plan (planned here when asked)."""
    from pipeplan.planner.bound.over_orders import stage_bound_over_orders
    from pipeplan.planner.bound.shape_bounds import lower_bound
    from pipeplan.planner.planners import PLANNERS
    from pipeplan.planner.request import PlanRequest
    from pipeplan.presets.resolve import load_cluster, load_profile

    request = PlanRequest(load_profile(row["profile"]), load_cluster(row["cluster"]), row["batch"], batch_scaling=scaling)
    if "pipeplan" not in row and plan_it:
        started = time.perf_counter()
        try:
            result = PLANNERS["pipeplan"](request)
            row = {**row, "pipeplan": {"ms": result.iteration_time, "plan": describe(result.plan),
                                       "s": time.perf_counter() - started}}  # fmt: skip
        except Exception as exc:
            return {**row, "error": f"{type(exc).__name__}: {exc}"}
    mine = row.get("pipeplan", {})
    plan = mine.get("plan", "")
    out = {
        "profile": row["profile"],
        "cluster": row["cluster"],
        "batch": row["batch"],
        "pipeplan_ms": mine.get("ms"),
        "plan": plan,
        "one_stage_per_rank": "v=" not in plan,
        "planning_seconds": mine.get("s"),
    }
    if known is not None:
        return {**out, **{key: known[key] for key in BOUND_KEYS}}
    started = time.perf_counter()
    every = lower_bound(request)
    staged = stage_bound_over_orders(request)
    return {
        **out,
        "bound_ms": every.ms,
        "bound_term": every.term,
        "bound_shape": [every.pipelines, every.microbatch_size],
        "stages_bound_ms": staged.ms,
        "stages_term": staged.term,
        "stages_shape": [staged.pipelines, staged.microbatch_size],
        "seconds": time.perf_counter() - started,
    }


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def key(row: dict[str, Any]) -> tuple[str, str, int]:
    """An instance's (profile, cluster, batch)."""
    return row["profile"], row["cluster"], row["batch"]


def main() -> int:
    """Compute the bounds, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=None, help="planner_quality.py --out JSON, or an --out JSONL of this script")
    parser.add_argument("--bounds", default=None, help="an --out JSONL whose bounds are reused")
    parser.add_argument("--bounds-only", action="store_true", help="compute the bounds of every instance, plan nothing")
    parser.add_argument("--report", default=None, help="print the tables of an --out JSONL")
    parser.add_argument("--exact-seeds", default=None, help="A:B: planner_quality's random instances of these seeds "
                        "against exact's optimum instead")  # fmt: skip
    parser.add_argument("--worst", type=int, default=12, help="worst instances listed")
    parser.add_argument("--out", default=None, help="append the per-instance rows here (JSON lines)")
    parser.add_argument("--batch-scaling", default="auto", help="the cost model the rows were planned with")
    parser.add_argument("--workers", type=int, default=2, help="processes")
    parser.add_argument("--clusters", default=None, help="only these clusters (comma-separated)")
    args = parser.parse_args()
    if args.report:
        return report(read_jsonl(args.report), args.worst)
    if args.exact_seeds:
        first, last = (int(x) for x in args.exact_seeds.split(":"))
        from multiprocessing import Pool

        with Pool(max(1, args.workers)) as pool:
            found = list(pool.imap(exact_row, range(first, last), chunksize=1))
        if args.out:
            Path(args.out).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in found), encoding="utf-8")
        return exact_report(found)
    if args.rows and args.rows.endswith(".jsonl"):  # this script's own rows: pipeplan's plans kept, bounds again
        rows = [{"profile": g["profile"], "cluster": g["cluster"], "batch": g["batch"],
                 "pipeplan": {"ms": g["pipeplan_ms"], "plan": g["plan"], "s": g.get("planning_seconds")}}
                for g in read_jsonl(args.rows) if "error" not in g and g.get("pipeplan_ms") is not None]  # fmt: skip
    elif args.rows:
        rows = [r for r in json.loads(Path(args.rows).read_text())["presets"] if "ms" in r["pipeplan"]]
    else:
        from pipeplan.presets.resolve import list_clusters, list_profiles, load_cluster

        clusters = sorted(list_clusters(), key=lambda c: load_cluster(c).num_devices)
        rows = [{"profile": p, "cluster": c, "batch": b} for c in clusters for p in list_profiles() for b in (256, 2048)]
    if args.clusters:
        rows = [r for r in rows if r["cluster"] in args.clusters.split(",")]
    known = {key(g): g for g in read_jsonl(args.bounds) if "bound_ms" in g} if args.bounds else {}
    started = time.perf_counter()
    jobs = [(r, args.batch_scaling, not args.bounds_only, known.get(key(r))) for r in rows]
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


def _bound_job(job: tuple[dict[str, Any], str, bool, dict[str, Any] | None]) -> dict[str, Any]:
    """bound_row for a pool."""
    return bound_row(*job)


def exact_row(seed: int) -> dict[str, Any]:
    """One of planner_quality.py's random instances (8 layers, 4 devices, batch 16): exact's optimum, pipeplan's
    plan and the bound of pipeplan's plan's class."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from bound_exact import Unpruned
    from pipeplan.planner.bound.over_orders import stage_bound_over_orders
    from pipeplan.planner.bound.shape_bounds import lower_bound
    from pipeplan.planner.exact import plan_exact
    from pipeplan.planner.planners import PLANNERS
    from pipeplan.planner.request import PlanRequest
    from planner_instances import random_cluster, random_profile

    request = PlanRequest(random_profile(seed, 8), random_cluster(seed, 4), 16)
    with mock.patch("pipeplan.planner.exact.ShapeBounds", Unpruned):  # exact's optimum without the bound's pruning
        best = plan_exact(request)
    ours = PLANNERS["pipeplan"](request)
    one = ours.plan.chunks == 1
    bound = stage_bound_over_orders(request) if one else lower_bound(request)
    return {"seed": seed, "exact_ms": best.iteration_time, "pipeplan_ms": ours.iteration_time, "bound_ms": bound.ms,
            "term": bound.term, "plan": describe(ours.plan), "exact_plan": describe(best.plan)}  # fmt: skip


def exact_report(rows: list[dict[str, Any]]) -> int:
    """Print how much of the gap is the bound's (exact over it) and how much pipeplan's (pipeplan over exact)."""
    loose = [r["exact_ms"] / r["bound_ms"] for r in rows]
    short = [r["pipeplan_ms"] / r["exact_ms"] for r in rows]
    print(f"{len(rows)} random instances (8 layers, 4 devices, batch 16): exact / bound geomean {geomean(loose):.3f} "
          f"(max {max(loose):.3f}), pipeplan / exact geomean {geomean(short):.3f} (max {max(short):.3f}), "
          f"pipeplan / bound geomean {geomean([a * b for a, b in zip(loose, short, strict=True)]):.3f}")  # fmt: skip
    for r in sorted(rows, key=lambda r: -r["exact_ms"] / r["bound_ms"])[:5]:
        print(f"  seed {r['seed']}: exact {r['exact_ms']:.2f} ms ({r['exact_plan']}), bound {r['bound_ms']:.2f} ({r['term']}), "
              f"pipeplan {r['pipeplan_ms']:.2f} ({r['plan']})")  # fmt: skip
    bad = [r for r in rows if r["bound_ms"] > r["exact_ms"] * (1 + 1e-9)]
    for r in bad:
        print(f"  BOUND ABOVE EXACT: {r}")
    return 1 if bad else 0


def class_gap(g: dict[str, Any]) -> float:
    """pipeplan's time over the bound of its plan's class (module docstring: the rule)."""
    return g["pipeplan_ms"] / (g["stages_bound_ms"] if g["one_stage_per_rank"] else g["bound_ms"])


def report(gaps: list[dict[str, Any]], worst: int) -> int:
    """Print the gap tables; 1 when a bound lies above a plan (a bug)."""
    failed = [g for g in gaps if "error" in g]
    seconds = [g["seconds"] for g in gaps if "seconds" in g]
    if seconds:
        print(f"bounds of {len(seconds)} instances: {statistics.median(seconds):.2f} s median, {max(seconds):.2f} s max, "
              f"{sum(seconds):.0f} s in all")  # fmt: skip
    gaps = [g for g in gaps if "error" not in g and g.get("pipeplan_ms") is not None]
    if not gaps:
        return 0
    for g in gaps:
        g["gap"] = g["pipeplan_ms"] / g["bound_ms"]
        g["stages_gap"] = g["pipeplan_ms"] / g["stages_bound_ms"] if g["one_stage_per_rank"] else None
        g["class_gap"] = class_gap(g)
    bad = [g for g in gaps if g["gap"] < 1 - 1e-9 or (g["stages_gap"] is not None and g["stages_gap"] < 1 - 1e-9)]
    print(f"{len(gaps)} instances ({len(failed)} without a pipeplan plan)")
    print("| cluster | instances | gap over its class's bound: geomean | max | all-plan bound: geomean | max | "
          "one-stage plans | their gap: geomean | max |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for cluster in dict.fromkeys(g["cluster"] for g in gaps):
        mine = [g for g in gaps if g["cluster"] == cluster]
        staged = [g["stages_gap"] for g in mine if g["stages_gap"] is not None]
        print(f"| {cluster} | {len(mine)} | {geomean([g['class_gap'] for g in mine]):.3f} | "
              f"{max(g['class_gap'] for g in mine):.3f} | {geomean([g['gap'] for g in mine]):.3f} | "
              f"{max(g['gap'] for g in mine):.3f} | {len(staged)} | {geomean(staged):.3f} | "
              f"{max(staged, default=math.nan):.3f} |")  # fmt: skip
    ours = [g["class_gap"] for g in gaps]
    every = [g["gap"] for g in gaps]
    staged = [g["stages_gap"] for g in gaps if g["stages_gap"] is not None]
    chunked = [g["gap"] for g in gaps if g["stages_gap"] is None]
    print(
        f"all {len(gaps)}: geomean gap over the class's bound {geomean(ours):.3f} (goal <= {GOAL}), median "
        f"{statistics.median(ours):.3f}, max {max(ours):.3f}; within 1.05: {sum(x <= 1.05 for x in ours)} of {len(ours)}"
    )
    print(f"over the all-plan bound: geomean {geomean(every):.3f}, max {max(every):.3f}")
    print(f"one stage per rank ({len(staged)} plans): geomean {geomean(staged):.3f}, max {max(staged, default=math.nan):.3f}; "
          f"chunked ({len(chunked)} plans, all-plan bound): geomean {geomean(chunked):.3f}, "
          f"max {max(chunked, default=math.nan):.3f}")  # fmt: skip
    terms: dict[str, int] = {}
    for g in gaps:
        term = g["stages_term"] if g["one_stage_per_rank"] else g["bound_term"]
        terms[term] = terms.get(term, 0) + 1
    print(f"binding term of the class's bound: {terms}")
    print(f"\nworst {worst} (gap over the class's bound):")
    print("| instance | pipeplan ms | plan | class bound ms | term | shape rp x b | gap | all-plan gap |")
    print("|---|---|---|---|---|---|---|---|")
    for g in sorted(gaps, key=lambda g: -g["class_gap"])[:worst]:
        one = g["one_stage_per_rank"]
        bound, term = (g["stages_bound_ms"], g["stages_term"]) if one else (g["bound_ms"], g["bound_term"])
        shape = g["stages_shape"] if one else g["bound_shape"]
        print(f"| {g['profile']} {g['cluster']} G={g['batch']} | {g['pipeplan_ms']:.2f} | {g['plan']} | {bound:.2f} | "
              f"{term} | {shape[0]} x {shape[1]} | {g['class_gap']:.3f} | {g['gap']:.3f} |")  # fmt: skip
    for g in bad:
        print(f"  BOUND ABOVE A PLAN: {g}")
    for g in failed:
        print(f"  no pipeplan plan: {g['profile']} {g['cluster']} G={g['batch']}: {g['error']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
