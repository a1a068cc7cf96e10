"""Plan quality: pipeplan against DAPPLE, PipeDream and balanced on every built-in profile and cluster, and against exact.

Usage: .venv/bin/python benchmarks/planner_quality.py [--quick] [--workers 2] [--out results.json] [--check]
       [--batch-scaling auto|linear] [--skip-random] [--planners dapple,... --merge results.json]
       [--union a.json,b.json]

Part 1, presets: every shared profile x every built-in cluster x global batch 256 and 2048. Each
planner (pipeplan, dapple, pipedream, balanced) plans the instance; every plan is scored by the same
simulator. Per cluster: pipeplan's speed-up over the best baseline (geomean, min, max) and median
planning times. A planner that finds no plan (e.g. nothing fits) is listed, not counted.

Part 2, exact gap: 50 seeded random instances (planner.instances: 8 layers with random costs and
sizes, 4 devices with random asymmetric bandwidth and latency matrices, global batch 16); pipeplan's
time over exact's.

Part 3, planning time: dapple/bert-48 on h100-8x128 (1024 GPUs), global batch 2048, planned by
pipeplan alone in this process after the pool is done (median of 3 runs, wall clock).

Targets (PASS/FAIL each; --check exits 1 when one fails):
  T1 pipeplan is never slower than any baseline on any preset instance (relative tolerance 1e-9);
  T2 geomean speed-up >= 1.15 over the best baseline on v100-8x1, v100-8x2-25g, pcie-4x4-10g, hetero-a100-v100;
  T3 pipeplan within 2% of exact on >= 95% of the random instances;
  T4 dapple/bert-48 on h100-8x128, global batch 2048, planned in <= 10 s.

--quick: 6 profiles x the 4 non-uniform clusters x global batch 256, 12 random instances (T2 and T3
are then judged on that subset).

--union A.json,B.json: report the rows of --out files written apart (e.g. by --clusters runs; a stopped run's
OUT.partial.jsonl too) as one table,
planning nothing (random instances and part 3 from the first file that has them); with --out, the joined file.

--planners NAME,... --merge FILE: re-run only the named planners on the instances of an earlier --out FILE
(narrowed by --profiles/--clusters when given) and merge their rows into it (random instances and part 3 are
kept from FILE); with --out the merged table is written. Planners not named keep their earlier results: when
a baseline changes, pipeplan (which seeds from the baselines) keeps its old plan until it is re-run too.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the test tooling: planner_instances, planner_audit

PLANNERS = ("pipeplan", "dapple", "pipedream", "balanced")
BASELINES = ("dapple", "pipedream", "balanced")
NON_UNIFORM = ("v100-8x1", "v100-8x2-25g", "pcie-4x4-10g", "hetero-a100-v100")
BATCHES = (256, 2048)
QUICK_PROFILES = (
    "dapple/bert-48", "dapple/gnmt-16", "dapple/vgg-19", "pipedream/resnet50", "pipedream/alexnet", "dapple/xlnet-36",
)  # fmt: skip
TOLERANCE = 1e-9
TARGET_GEOMEAN = 1.15
TARGET_EXACT_GAP = 0.02
TARGET_EXACT_SHARE = 0.95
TARGET_SECONDS = 10.0
RANDOM_LAYERS, RANDOM_DEVICES, RANDOM_BATCH = 8, 4, 16


def run_planners(job: tuple[str, str, int, str, tuple[str, ...]]) -> dict[str, Any]:
    """Plan one preset instance with each named planner as `compare` runs them (the baselines first, each once;
    pipeplan seeded from their rows); times in ms, planning in s, errors as text."""
    from pipeplan.planner.compare import PlannerFailure, compare
    from pipeplan.planner.request import PlanRequest
    from pipeplan.presets.resolve import load_cluster, load_profile

    profile_name, cluster_name, batch, scaling, names = job
    request = PlanRequest(load_profile(profile_name), load_cluster(cluster_name), batch, batch_scaling=scaling)
    row: dict[str, Any] = {"profile": profile_name, "cluster": cluster_name, "batch": batch}
    started = time.perf_counter()
    try:
        results = compare(request, list(names))
    except Exception as exc:  # a fault, not a planner's refusal (compare keeps those): every planner's cell says it
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return {**row, **{name: {"error": error, "s": time.perf_counter() - started} for name in names}}
    for result in results:
        if isinstance(result, PlannerFailure):
            row[result.planner] = {"error": result.error, "s": result.planning_seconds}
            continue
        cell = row[result.planner] = {"ms": result.iteration_time, "s": result.planning_seconds, "plan": describe(result.plan)}
        if result.planner == "pipeplan" and result.plan.schedule == "list":
            cell.update(same_plan_times(result.plan, request))
    return row


def same_plan_times(plan: Any, request: Any) -> dict[str, float]:
    """A `list` plan's stages, devices and microbatches under 1F1B, and under the best generated schedule that fits
    (gpipe, 1f1b, kfkb, interleaved-1f1b, zb-h1): where the list schedule beats them."""
    import dataclasses

    from pipeplan.core.errors import PlanError
    from pipeplan.planner.search.schedule_choice import schedule_variants
    from pipeplan.sim.cost.memory import check_fits
    from pipeplan.sim.plan_sim import simulate_plan

    def ms(variant: Any) -> float:
        result = simulate_plan(variant, request.model, record=False)
        try:
            check_fits(variant, request.model, result)
        except PlanError:
            return math.inf
        return result.iteration_time

    plain = dataclasses.replace(plan, schedule="1f1b", k=1, order=None)
    generated = min(ms(v) for v in schedule_variants(plain, request.model))
    return {"same_plan_1f1b_ms": ms(plain), "same_plan_generated_ms": generated}


def run_random(seed: int) -> dict[str, Any]:
    """One random instance: exact and pipeplan (and the baselines, for context)."""
    from pipeplan.planner.planners import PLANNERS as REGISTRY
    from pipeplan.planner.request import PlanRequest
    from planner_instances import random_cluster, random_profile

    planners = REGISTRY
    request = PlanRequest(random_profile(seed, RANDOM_LAYERS), random_cluster(seed, RANDOM_DEVICES), RANDOM_BATCH)
    row: dict[str, Any] = {"seed": seed}
    for name in ("exact", *PLANNERS):
        try:
            result = planners[name](request)
            row[name] = {"ms": result.iteration_time, "s": result.planning_seconds, "plan": describe(result.plan)}
        except Exception as exc:
            row[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return row


def describe(plan: Any) -> str:
    """A short text form of a plan: schedule, ranks x pipelines, microbatches x size, devices per stage."""
    schedule = plan.schedule + (f" k={plan.k}" if plan.schedule == "kfkb" else "")
    schedule += f" v={plan.chunks}" if plan.chunks > 1 else ""
    widths = ",".join(str(plan.replicas_of(s)) for s in range(plan.num_ranks))
    return f"{schedule} {plan.num_ranks}x{plan.pipeline_replicas} m={plan.microbatches}x{plan.microbatch_size} r=[{widths}]"


def geomean(values: list[float]) -> float:
    """Geometric mean (nan for none)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def best_baseline(row: dict[str, Any]) -> tuple[str, float] | None:
    """(name, ms) of the fastest baseline that found a plan."""
    found = [(row[b]["ms"], b) for b in BASELINES if "ms" in row[b]]
    return (min(found)[1], min(found)[0]) if found else None


def summarize(rows: list[dict[str, Any]], clusters: list[str]) -> tuple[list[str], dict[str, list[float]], list[str]]:
    """Markdown table lines per cluster, speed-ups per cluster, and the T1 violations."""
    lines = [
        "| cluster | instances | geomean | min | max | pipeplan s (median / max) | dapple s | pipedream s | balanced s "
        "| no plan |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    speedups: dict[str, list[float]] = {}
    violations = []
    for cluster in clusters:
        mine = [r for r in rows if r["cluster"] == cluster]
        ups = []
        missing = []
        for r in mine:
            base = best_baseline(r)
            tag = f"{r['profile']} G={r['batch']}"
            if "ms" not in r["pipeplan"]:
                missing.append(f"{tag} pipeplan")
                if base is not None:
                    violations.append(f"{tag} on {cluster}: pipeplan found no plan ({r['pipeplan']['error']}), "
                                      f"{base[0]} did ({base[1]:.1f} ms)")  # fmt: skip
                continue
            for b in BASELINES:
                if "ms" not in r[b]:
                    missing.append(f"{tag} {b}")
                elif r["pipeplan"]["ms"] > r[b]["ms"] * (1 + TOLERANCE):
                    violations.append(
                        f"{tag} on {cluster}: pipeplan {r['pipeplan']['ms']:.2f} ms ({r['pipeplan']['plan']}) > "
                        f"{b} {r[b]['ms']:.2f} ms ({r[b]['plan']})"
                    )
            if base is not None:
                ups.append(base[1] / r["pipeplan"]["ms"])
        speedups[cluster] = ups
        times = {p: [r[p]["s"] for r in mine] for p in PLANNERS}
        lines.append(
            f"| {cluster} | {len(mine)} | {geomean(ups):.3f} | {min(ups, default=math.nan):.3f} | "
            f"{max(ups, default=math.nan):.3f} | {statistics.median(times['pipeplan']):.2f} / {max(times['pipeplan']):.2f} | "
            + " | ".join(f"{statistics.median(times[p]):.2f}" for p in BASELINES)
            + f" | {len(missing)} |"
        )
    return lines, speedups, violations


def report(
    rows: list[dict[str, Any]], randoms: list[dict[str, Any]], walls: list[float], pool_seconds: float | None, workers: int
) -> bool:
    """Print parts 1-3 and PASS/FAIL per target; whether every target passed."""
    clusters = list(dict.fromkeys(r["cluster"] for r in rows))
    profiles = list(dict.fromkeys(r["profile"] for r in rows))
    batches = sorted({r["batch"] for r in rows})
    lines, speedups, violations = summarize(rows, clusters)
    print(f"Part 1: {len(rows)} preset instances ({len(profiles)} profiles x {len(clusters)} clusters x batch "
          f"{'/'.join(map(str, batches))}); pipeplan speed-up over the best baseline")  # fmt: skip
    print("\n".join(lines))
    non_uniform = [u for c in NON_UNIFORM if c in speedups for u in speedups[c]]
    everything = [u for ups in speedups.values() for u in ups]
    print(f"all presets: geomean {geomean(everything):.3f}, min {min(everything):.3f}, max {max(everything):.3f}")
    if non_uniform:
        print(f"non-uniform presets ({', '.join(NON_UNIFORM)}): geomean {geomean(non_uniform):.3f}")
    listed = [r["pipeplan"] for r in rows if "same_plan_1f1b_ms" in r["pipeplan"]]
    if listed:
        over_1f1b = [x["same_plan_1f1b_ms"] / x["ms"] for x in listed]
        over_generated = [x["same_plan_generated_ms"] / x["ms"] for x in listed]
        print(f"pipeplan chose the list schedule on {len(listed)} of {len(rows)} instances; on the same stages, devices")
        print(f"and microbatches it is {geomean(over_1f1b):.3f}x faster than 1F1B in geomean (max {max(over_1f1b):.3f}x) and")
        print(f"{geomean(over_generated):.3f}x than the best generated schedule that fits (max {max(over_generated):.3f}x)")
    failures = [(r, p) for r in rows for p in PLANNERS if "error" in r[p]]
    for r, p in failures:
        print(f"  no plan: {p} for {r['profile']} on {r['cluster']} G={r['batch']}: {r[p]['error']}")

    gaps = []
    print(f"\nPart 2: {len(randoms)} random instances ({RANDOM_LAYERS} layers, {RANDOM_DEVICES} devices, batch {RANDOM_BATCH})")
    print("| seed | exact ms | exact s | pipeplan ms | gap | best baseline ms | exact plan | pipeplan plan |")
    print("|---|---|---|---|---|---|---|---|")
    for r in randoms:
        if "ms" not in r["exact"] or "ms" not in r["pipeplan"]:
            print(f"| {r['seed']} | {r['exact'].get('error', '')} | | {r['pipeplan'].get('error', '')} | | | | |")
            gaps.append(math.inf)
            continue
        gap = r["pipeplan"]["ms"] / r["exact"]["ms"] - 1
        gaps.append(gap)
        base = best_baseline(r)
        print(f"| {r['seed']} | {r['exact']['ms']:.2f} | {r['exact']['s']:.2f} | {r['pipeplan']['ms']:.2f} | {gap:+.2%} | "
              f"{base[1] if base else math.nan:.2f} | {r['exact']['plan']} | {r['pipeplan']['plan']} |")  # fmt: skip
    within = sum(g <= TARGET_EXACT_GAP for g in gaps) / len(gaps) if gaps else math.nan
    finite = [g for g in gaps if math.isfinite(g)]
    if finite:
        print(f"within 2% of exact: {within:.0%}; gap median {statistics.median(finite):+.2%}, max {max(finite):+.2%}; "
              f"exact planning max {max(r['exact'].get('s', 0) for r in randoms):.2f} s")  # fmt: skip

    seconds = statistics.median(walls)
    print(f"\nPart 3: dapple/bert-48 on h100-8x128, batch 2048: pipeplan plans in {seconds:.2f} s "
          f"(median of 3: {', '.join(f'{w:.2f}' for w in walls)})")  # fmt: skip
    if pool_seconds is not None:
        print(f"pool wall time {pool_seconds:.0f} s with {workers} workers")

    targets = [("T1 pipeplan never slower than a baseline", not violations, f"{len(violations)} violations")]
    if non_uniform:  # a subset without the non-uniform presets or the random instances does not judge T2/T3
        speedup = geomean(non_uniform)
        targets.append(("T2 geomean >= 1.15 on non-uniform presets", speedup >= TARGET_GEOMEAN, f"{speedup:.3f}"))
    if gaps:
        targets.append(("T3 within 2% of exact on >= 95%", within >= TARGET_EXACT_SHARE, f"{within:.0%}"))
    targets.append(("T4 bert-48 on 1024 GPUs in <= 10 s", seconds <= TARGET_SECONDS, f"{seconds:.2f} s"))
    print()
    for v in violations:
        print(f"  T1 violation: {v}")
    for name, ok, value in targets:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {value}")
    return all(ok for _, ok, _ in targets)


def read_table(path: str, flag: str) -> dict[str, Any] | None:
    """An --out JSON (or a run's OUT.partial.jsonl rows), or None after printing why it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            if path.endswith(".jsonl"):  # the rows a run wrote as it went
                rows = [json.loads(line) for line in handle if line.strip()]
                return {"presets": rows, "random": [], "bert48_h100_8x128_seconds": []}
            return json.load(handle)
    except (OSError, ValueError) as error:
        print(f"error: {flag} {path!r}: {error}", file=sys.stderr)
        return None


def write_table(path: str, rows: list[dict[str, Any]], randoms: list[dict[str, Any]], walls: list[float]) -> None:
    """The --out JSON: every preset row, the random instances, part 3's wall times."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"presets": rows, "random": randoms, "bert48_h100_8x128_seconds": walls}, handle, indent=1, sort_keys=True)


def union(paths: list[str], out: str | None, check: bool) -> int:
    """Report the rows of several --out files as one table (no planning): e.g. per-cluster runs done apart."""
    rows: list[dict[str, Any]] = []
    randoms: list[dict[str, Any]] = []
    walls: list[float] = []
    for path in paths:
        table = read_table(path, "--union")
        if table is None:
            return 2
        rows += table["presets"]
        randoms = randoms or table["random"]  # the first file that has them
        walls = walls or table["bert48_h100_8x128_seconds"]
    seen = [(r["profile"], r["cluster"], r["batch"]) for r in rows]
    twice = sorted({key for key in seen if seen.count(key) > 1})
    if twice:
        print(f"error: --union: instance {twice[0]} is in more than one file", file=sys.stderr)
        return 2
    passed = report(rows, randoms, walls, None, 0)
    if out:
        write_table(out, rows, randoms, walls)
    return 1 if check and not passed else 0


def main() -> int:
    """Run the benchmark, print the tables and PASS/FAIL per target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small subset (see the module docstring)")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--out", default=None, help="write every row as JSON here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--clusters", default=None, help="comma-separated cluster presets (default: all, or --quick's)")
    parser.add_argument("--profiles", default=None, help="comma-separated profile names (default: all, or --quick's)")
    parser.add_argument("--skip-random", action="store_true", help="skip part 2 (exact gap)")
    parser.add_argument("--batch-scaling", default="auto", help="the cost model's scaling: auto (default) or linear, ...")
    parser.add_argument("--planners", default=",".join(PLANNERS), help="comma-separated planners to run (with --merge)")
    parser.add_argument("--merge", default=None, help="an earlier --out JSON: re-run --planners on its instances")
    parser.add_argument("--union", default=None, help="comma-separated --out JSONs of disjoint instances: report them as one")
    args = parser.parse_args()
    names = tuple(args.planners.split(","))
    if any(n not in PLANNERS for n in names) or not names:
        print(f"error: --planners must name some of {', '.join(PLANNERS)}, got {args.planners!r}", file=sys.stderr)
        return 2
    if names != PLANNERS and args.merge is None:
        print("error: --planners needs --merge FILE (the table the other planners' results come from)", file=sys.stderr)
        return 2
    if args.union is not None:
        return union(args.union.split(","), args.out, args.check)
    earlier = None
    if args.merge is not None:
        earlier = read_table(args.merge, "--merge")
        if earlier is None:
            return 2

    from pipeplan.presets.resolve import list_clusters, list_profiles

    profiles = list(QUICK_PROFILES) if args.quick else list(list_profiles())
    clusters = list(NON_UNIFORM) if args.quick else list(list_clusters())
    batches = (256,) if args.quick else BATCHES
    clusters = args.clusters.split(",") if args.clusters else clusters
    profiles = args.profiles.split(",") if args.profiles else profiles
    seeds = range(0) if args.skip_random else range(12) if args.quick else range(50)
    jobs = [(p, c, b, args.batch_scaling, names) for c in clusters for p in profiles for b in batches]
    if earlier is not None:
        wanted = [r for r in earlier["presets"] if not args.clusters or r["cluster"] in clusters]
        keep = [r for r in wanted if not args.profiles or r["profile"] in profiles]
        clusters = list(dict.fromkeys(r["cluster"] for r in keep))
        profiles = list(dict.fromkeys(r["profile"] for r in keep))
        batches = tuple(sorted({r["batch"] for r in keep}))
        jobs = [(r["profile"], r["cluster"], r["batch"], args.batch_scaling, names) for r in keep]
        seeds = range(0)
    # the 1024-GPU instances are the slowest: start them first so the pool's tail stays short
    jobs.sort(key=lambda j: (j[1] != "h100-8x128", j[1] != "h100-8x4"))
    started = time.perf_counter()
    with Pool(args.workers) as pool:
        rows = []
        partial = Path(f"{args.out}.partial.jsonl") if args.out else None  # each row as it is done (a stopped run keeps them)
        for i, row in enumerate(pool.imap_unordered(run_planners, jobs, chunksize=1)):
            rows.append(row)
            if partial is not None:
                with partial.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(row, sort_keys=True) + "\n")
            if (i + 1) % 25 == 0:
                print(f"  {i + 1}/{len(jobs)} preset instances ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        randoms = sorted(pool.map(run_random, seeds, chunksize=1), key=lambda r: r["seed"])
    pool_seconds = time.perf_counter() - started
    if earlier is not None:
        fresh = {(r["profile"], r["cluster"], r["batch"]): r for r in rows}
        rows = [{**r, **fresh[(r["profile"], r["cluster"], r["batch"])]} for r in keep]
        randoms = earlier["random"]
    rows.sort(key=lambda r: (clusters.index(r["cluster"]), profiles.index(r["profile"]), r["batch"]))

    from pipeplan.planner.planners import PLANNERS as REGISTRY
    from pipeplan.planner.request import PlanRequest
    from pipeplan.presets.resolve import load_cluster, load_profile

    request = PlanRequest(load_profile("dapple/bert-48"), load_cluster("h100-8x128"), 2048, batch_scaling=args.batch_scaling)
    walls = [] if earlier is None or "pipeplan" in names else list(earlier["bert48_h100_8x128_seconds"])
    for _ in range(3 - len(walls)):
        t0 = time.perf_counter()
        REGISTRY["pipeplan"](request)
        walls.append(time.perf_counter() - t0)
    passed = report(rows, randoms, walls, pool_seconds, args.workers)
    if args.out:
        write_table(args.out, rows, randoms, walls)
    return 1 if args.check and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
