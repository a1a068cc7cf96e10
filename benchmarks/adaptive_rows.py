"""A subset of benchmarks/adaptive.py's rows, fast: every policy but the controller is run once and cached, then the
controller (and the perturbed controller) of the working tree's sources is run against the cache.

Usage: PYTHONPATH=src .venv/bin/python benchmarks/adaptive_rows.py --cache DIR [--profiles dapple/bert-48,...]
       [--clusters pcie-4x4-10g] [--traces idle,...,drift] [--workers 2] [--out rows.json]

Defaults: the three profiles on pcie-4x4-10g, every trace (adaptive.TRACES and the held-out ones), 36 rows. A cached
row (DIR/<profile>_<cluster>_<trace>.pkl: the oracle, the best fixed k, fixed 1F1B and every fixed k's total, span
rate and peak) depends only on the plan, the trace and the simulator: delete DIR when those change. Printed per row:
vs oracle (whole run and over a replayed log's span), vs the best fixed k (its k), peak vs the best fixed k's,
switches, the perturbed controller vs the oracle, the perturbed run's expected-state decisions, k used: the figures
of adaptive.py's table for that row, without its decision timings.
"""

from __future__ import annotations

import argparse
import json
import pickle
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from adaptive import ITERATIONS, PROFILES, TRACES, log_span_ms, work_rate
from adaptive_gap import build_row, row_job


def cached(job: tuple[str, str, str, str]) -> dict[str, Any]:
    """The row's policies other than the controller, from DIR or run now (adapt.fixed_baselines.compare_policies)."""
    from pipeplan.adapt.controller import ControllerConfig
    from pipeplan.adapt.fixed_baselines import compare_policies

    profile, cluster, trace_name, directory = job
    path = Path(directory) / f"{profile.replace('/', '_')}_{cluster}_{trace_name}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())  # this script's own cache
    pipeline, trace = build_row(profile, cluster, trace_name)
    span = log_span_ms(trace_name, trace)
    comparison = compare_policies(pipeline, trace, ITERATIONS, ControllerConfig())
    policies = comparison.policies
    fixed = {k: (run.total_ms, work_rate(run, span), max(run.peak_bytes)) for k, run in comparison.fixed.items()}
    row = {"oracle": policies["oracle"], "best": policies["best_static"], "fixed": fixed, "span": span}
    path.write_bytes(pickle.dumps(row))
    return row


def run_row(job: tuple[str, str, str, str]) -> dict[str, Any]:
    """The controller and the perturbed controller on one row, against its cached policies."""
    from adaptive_traces import noisy, perturbed
    from pipeplan.adapt.controller import AdaptiveController, ControllerConfig
    from pipeplan.adapt.runs import run_controller

    profile, cluster, trace_name, _ = job
    ref = cached(job)
    pipeline, trace = build_row(profile, cluster, trace_name)
    seed = row_job(profile, cluster)[0]
    span, oracle, best = ref["span"], ref["oracle"], ref["best"]
    run = run_controller(AdaptiveController(pipeline, ControllerConfig()), trace, ITERATIONS).run
    wrong = run_controller(
        AdaptiveController(perturbed(pipeline, seed), ControllerConfig()), trace, ITERATIONS, truth=pipeline, distort=noisy(seed)
    )
    return {
        "profile": profile,
        "cluster": cluster,
        "trace": trace_name,
        "vs_oracle": oracle.total_ms / run.total_ms,
        "vs_oracle_span": work_rate(run, span) / work_rate(oracle, span),
        "vs_best_static": best.total_ms / run.total_ms,
        "best_static_k": best.k[0],
        "peak_vs_best_static": max(run.peak_bytes) / max(best.peak_bytes),
        "switches": run.switches,
        "k_used": sorted(set(run.k)),
        "perturbed_vs_oracle": oracle.total_ms / wrong.run.total_ms,
        "perturbed_expected": sum("expected states" in d.reason for d in wrong.decisions),
    }


def main() -> None:
    """Run the rows (caching what the controller does not change) and print them."""
    from adaptive_traces import HELD_OUT

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", required=True, help="directory of the cached policies (created)")
    parser.add_argument("--profiles", default=",".join(p for p, _ in PROFILES))
    parser.add_argument("--clusters", default="pcie-4x4-10g")
    parser.add_argument("--traces", default=",".join((*TRACES, *HELD_OUT)))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    jobs = [
        (p, c, t, args.cache) for p in args.profiles.split(",") for c in args.clusters.split(",") for t in args.traces.split(",")
    ]
    with Pool(args.workers) as pool:
        rows = pool.map(run_row, jobs, chunksize=1)
    print(
        "| profile | cluster | trace | vs oracle (span) | vs best k (k) | peak vs best k | switches "
        "| perturbed vs oracle | k used |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['profile']} | {r['cluster']} | {r['trace']} | {r['vs_oracle']:.3f} ({r['vs_oracle_span']:.3f}) | "
            f"{r['vs_best_static']:.3f} ({r['best_static_k']}) | {r['peak_vs_best_static']:.2f} | {r['switches']} | "
            f"{r['perturbed_vs_oracle']:.3f} ({r['perturbed_expected']} expected) | {','.join(map(str, r['k_used']))} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
