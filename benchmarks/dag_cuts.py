"""DAG cuts: pipeplan's plans with antichain cuts (layer orders from the down-set DP) against its default-order plans.

Usage: .venv/bin/python benchmarks/dag_cuts.py [--workers 2] [--batches 256,2048] [--clusters a,b] [--models m,n]
       [--out dag.jsonl]   (one JSON row per instance, appended as each finishes)
       .venv/bin/python benchmarks/dag_cuts.py --from dag.jsonl   (the table of saved rows)

For resnet50, gnmt and gnmt_large (the shared PipeDream profiles, built in) on every built-in cluster, plans with
pipeplan's search as before (the profile's default layer order) and with the orders the down-set DP adds
(planner.search.dag_orders), both from one run: the default order is searched first, exactly as before, and its
time and planning seconds are reported as "before". Per instance: iteration ms before and after, the gain, which
order won, and planning seconds before (the default search) and after (default + DP + the other orders).
Check: after <= before on every instance (the default order is always a candidate).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from multiprocessing import Pool
from typing import Any

MODELS = ("pipedream/resnet50", "pipedream/gnmt", "pipedream/gnmt_large")


def run(job: tuple[str, str, int]) -> dict[str, Any]:
    """Plan one instance; times in ms, planning in s."""
    from pipeplan.planner.request import PlanRequest
    from pipeplan.planner.search.selection import plan_pipeplan
    from pipeplan.presets.resolve import load_cluster, load_profile

    model, cluster, batch = job
    row: dict[str, Any] = {"model": model, "cluster": cluster, "batch": batch}
    try:
        result = plan_pipeplan(PlanRequest(load_profile(model), load_cluster(cluster), batch))
    except Exception as exc:  # an instance with no plan is listed, not counted
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return row
    orders = result.extra["layer_orders"]
    row.update(
        before_ms=orders["ms"][0],
        after_ms=result.iteration_time,
        won=orders["won"],
        states=orders["states"],
        orders=orders["orders"],
        before_s=orders["seconds"][0],
        dp_s=orders["seconds"][1],
        after_s=result.planning_seconds,
        stages=len(result.plan.stages),
    )
    return row


def report(rows: list[dict[str, Any]]) -> int:
    """Print the table and the summary of `rows`; the number of instances whose plan got slower."""
    print("| model | cluster | batch | before ms | after ms | gain | order won | states | orders | plan s: before | DP | after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    slower, gains = 0, []
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['cluster']} | {r['batch']} | {r['error']} |||||||||")
            continue
        gain = r["before_ms"] / r["after_ms"]
        gains.append(gain)
        slower += r["after_ms"] > r["before_ms"]
        print(f"| {r['model'].split('/')[-1]} | {r['cluster']} | {r['batch']} | {r['before_ms']:.2f} | {r['after_ms']:.2f} | "
              f"{gain:.4f} | {r['won'] or 'default'} | {r['states']} | {r['orders']} | {r['before_s']:.2f} | "
              f"{r['dp_s']:.2f} | {r['after_s']:.2f} |")  # fmt: skip
    if gains:
        won = sum(g > 1 for g in gains)
        geo = math.exp(sum(map(math.log, gains)) / len(gains))
        before_s = sorted(r["before_s"] for r in rows if "error" not in r)
        after_s = sorted(r["after_s"] for r in rows if "error" not in r)
        ratio = sorted(r["after_s"] / r["before_s"] for r in rows if "error" not in r)
        print(f"\ninstances {len(gains)}, antichain cuts win on {won}, geomean gain {geo:.4f}, max gain {max(gains):.4f}, "
              f"slower than before: {slower}; planning s median {before_s[len(before_s) // 2]:.2f} -> "
              f"{after_s[len(after_s) // 2]:.2f}, max {before_s[-1]:.2f} -> {after_s[-1]:.2f}, after/before median "
              f"{ratio[len(ratio) // 2]:.2f}")  # fmt: skip
    return slower


def main() -> int:
    """Run the grid (or read saved rows with --from), print a table and the summary; exit 1 when a plan got slower."""
    from pipeplan.presets.resolve import list_clusters

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", default="256,2048")
    parser.add_argument("--clusters", default=",".join(list_clusters()))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out")
    parser.add_argument("--from", dest="saved", help="print the table of a --out file instead of planning")
    args = parser.parse_args()
    if args.saved:
        with open(args.saved) as handle:
            return 1 if report([json.loads(line) for line in handle if line.strip()]) else 0
    jobs = [(m, c, int(b)) for m in args.models.split(",") for c in args.clusters.split(",") for b in args.batches.split(",")]
    rows = []
    with Pool(args.workers) as pool:
        for row in pool.imap_unordered(run, jobs, chunksize=1):
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if args.out:
                with open(args.out, "a") as handle:
                    handle.write(json.dumps(row) + "\n")
    order = {job: i for i, job in enumerate(jobs)}
    rows.sort(key=lambda r: order[(r["model"], r["cluster"], r["batch"])])
    return 1 if report(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
