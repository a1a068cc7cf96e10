"""`exact` on every small instance of the shared profiles: planning time, and the optimum kept (issue 22, point 3).

Usage: .venv/bin/python benchmarks/exact_speed.py [--out rows.json] [--compare before.json] [--timeout 600]
       [--profiles a,b] [--clusters c2,c4] [--random 50] [--batch 256,2048] [--check]

Instances: every shared profile x the small clusters below x each global batch of --batch (256 and 2048, the
planner-quality benchmark's: on v8 every <= 8-device instance of it), microbatch size left open
(as `compare` asks), schedule auto; plus `--random` seeded random instances (planner_instances: 8 layers,
4 devices with random asymmetric links, global batch 16; the planner-quality benchmark's part 2).
Each instance runs in a fresh process under --timeout seconds (wall clock), one at a time.

  c2   2 V100 16 GB, 25 GB/s links (one NVLink pair)
  c3   3 V100 16 GB, 10 GB/s links
  c4   4 V100 16 GB, 10 GB/s links (PipeDream's c4 straight-pipeline setup: the `compare` that took 215-256 s)
  v8   the preset v100-8x1 (8 V100 in one server)

--compare reads a JSON written by --out (e.g. by the code before a change) and prints, per instance, both
times and whether the optimum (iteration time) is the same (rows written before rows named their batch count as
the run's first batch). The last lines count the instances solved and those under the 10 s target of CPU (the
child's process time: wall seconds on a shared machine measure the load), and name every one that was not solved,
was slower, or changed its optimum by more than 1e-9 relative; --check exits 1 when there is one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 10.0
BATCH = 256
BATCHES = "256,2048"
RANDOM_BATCH = 16
SMALL = {
    "c2": (2, 25.0),
    "c3": (3, 10.0),
    "c4": (4, 10.0),
}


def cluster_file(name: str, folder: Path) -> str:
    """A cluster for `name`: a preset, or a description-form file of n V100s in one server."""
    if name == "v8":
        return "v100-8x1"
    devices, rate = SMALL[name]
    path = folder / f"{name}.json"
    cluster = {
        "format": "pipeplan.cluster/1",
        "name": f"{name}-v100-{rate:g}g",
        "nodes": 1,
        "gpus_per_node": devices,
        "device": {"kind": "V100", "memory_gb": 16},
        "intra_node_gb_per_s": rate,
        "inter_node_gb_per_s": rate,
        "latency_us": {"intra": 5, "inter": 5},
    }
    path.write_text(json.dumps(cluster))
    return str(path)


def one(kind: str, a: str, b: str, batch: int = BATCH) -> dict[str, Any]:
    """Plan one instance with exact (in this process); times in ms, planning in s."""
    sys.path.insert(0, str(ROOT / "tests"))
    from pipeplan.core.errors import PipeplanError
    from pipeplan.planner.planners import PLANNERS
    from pipeplan.planner.request import PlanRequest

    if kind == "random":
        from planner_instances import random_cluster, random_profile

        request = PlanRequest(random_profile(int(a), 8), random_cluster(int(a), 4), RANDOM_BATCH)
    else:
        from pipeplan.presets.resolve import load_cluster, load_profile

        request = PlanRequest(load_profile(a), load_cluster(b), batch)
    started, cpu = time.perf_counter(), time.process_time()
    try:
        result = PLANNERS["exact"](request)
    except PipeplanError as exc:
        return {"error": str(exc).splitlines()[0], "s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu}
    plan = result.plan
    stages = [[st.first_layer, st.last_layer, list(st.devices)] for st in plan.stages]
    return {
        "ms": result.iteration_time,
        "s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu,
        "plan": {
            "stages": stages,
            "rp": plan.pipeline_replicas,
            "m": plan.microbatches,
            "b": plan.microbatch_size,
            "schedule": plan.schedule,
            "k": plan.k,
        },
        "extra": {k: v for k, v in result.extra.items() if isinstance(v, int | float)},
    }


def run_child(
    kind: str, a: str, b: str, timeout: float, cpu_limit: int | None = None, max_orders: int | None = None, batch: int = BATCH
) -> dict[str, Any]:
    """`one` in a fresh process, stopped after `timeout` seconds (wall) or `cpu_limit` seconds of its CPU."""
    argv = [sys.executable, __file__, "--batch", str(batch), "--one", kind, a, b]
    started = time.perf_counter()
    if cpu_limit is not None:
        argv[2:2] = ["--cpu-limit", str(cpu_limit)]
    if max_orders is not None:
        argv[2:2] = ["--max-orders", str(max_orders)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s", "s": time.perf_counter() - started, "timeout": True}
    if cpu_limit is not None and done.returncode == -signal.SIGXCPU:
        return {"error": f"passed {cpu_limit} s of CPU", "s": time.perf_counter() - started, "timeout": True}
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", "s": math.nan}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    """Run every instance, print the slowest and the comparison, write the rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help="write every row as JSON here")
    parser.add_argument("--compare", default=None, help="rows of an earlier run (--out) to compare with")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per instance")
    parser.add_argument("--profiles", default=None, help="comma-separated profiles (default: every shared one)")
    parser.add_argument("--clusters", default="c2,c3,c4,v8", help="comma-separated: c2, c3, c4, v8")
    parser.add_argument("--random", type=int, default=50, help="random instances (seeds 0..N-1)")
    parser.add_argument("--cpu-limit", type=int, default=None, help="stop an instance after this many CPU seconds")
    parser.add_argument("--max-orders", type=int, default=None, help="lift exact's refusal to this many device orders")
    parser.add_argument("--check", action="store_true", help="exit 1 on a slow instance or a changed optimum")
    parser.add_argument("--batch", default=BATCHES, help=f"global batches of the preset instances, comma-separated [{BATCHES}]")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    if args.one:
        if args.cpu_limit:
            resource.setrlimit(resource.RLIMIT_CPU, (args.cpu_limit, args.cpu_limit + 1))
        if args.max_orders:
            from pipeplan.planner.exact import planner

            planner.MAX_ORDERS = args.max_orders
        print(json.dumps(one(*args.one, batch=int(args.batch))))
        return 0

    from pipeplan.presets.resolve import list_profiles

    profiles = args.profiles.split(",") if args.profiles else list(list_profiles())
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pipeplan-exact-") as tmp:
        jobs = [("random", str(seed), "", RANDOM_BATCH) for seed in range(args.random)]
        jobs += [("preset", p, c, batch) for batch in batches for c in args.clusters.split(",") for p in profiles]
        for kind, a, c, batch in jobs:
            b = cluster_file(c, Path(tmp)) if kind == "preset" else ""
            row = {
                "kind": kind,
                "profile": a,
                "cluster": c,
                "batch": batch,
                **run_child(kind, a, b, args.timeout, args.cpu_limit, args.max_orders, batch),
            }
            row["load"] = os.getloadavg()[0]
            rows.append(row)
            what = f"{row['ms']:.4f} ms" if "ms" in row else row["error"][:80]
            cpu = row.get("cpu_s", math.nan)
            print(f"  {kind} {a} {c} G={batch}: {row['s']:.2f} s, {cpu:.2f} s CPU, {what}", file=sys.stderr, flush=True)
    print(f"{len(rows)} instances in {time.perf_counter() - started:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, sort_keys=True))
    return report(rows, args.compare, args.check, batches[0])


def key(row: dict[str, Any], batch: int = BATCH) -> tuple[str, str, str, int]:
    """An instance's identity (`batch`: a preset row's that names none, written before rows did)."""
    return row["kind"], row["profile"], row["cluster"], row.get("batch", RANDOM_BATCH if row["kind"] == "random" else batch)


def label(row: dict[str, Any]) -> str:
    """An instance's name in the table."""
    kind, profile, cluster, batch = key(row)
    return f"random {profile}" if kind == "random" else f"{profile} {cluster} G={batch}"


def report(rows: list[dict[str, Any]], compare: str | None, check: bool, batch: int = BATCH) -> int:
    """Print the slowest instances (with the earlier run's times), how many solved under the target, and every
    instance not solved, slower than the target, or with another optimum than the earlier run's."""
    before = {key(r, batch): r for r in json.loads(Path(compare).read_text())} if compare else {}
    print("| instance | before s | after s | before CPU s | after CPU s | before ms | after ms | same optimum |")
    print("|---|---|---|---|---|---|---|---|")
    slowest = sorted(rows, key=lambda r: -r.get("cpu_s", math.inf))
    changed, slow, failed = [], [], []
    for row in rows:
        old = before.get(key(row))
        if "ms" not in row:
            failed.append(f"{key(row)}: {row.get('error', 'no answer')[:100]}")
        elif old is not None and "ms" in old and not math.isclose(old["ms"], row["ms"], rel_tol=1e-9):
            changed.append(f"{key(row)}: {old['ms']!r} -> {row['ms']!r}")
        if "ms" in row and row.get("cpu_s", row["s"]) > TARGET_SECONDS:
            slow.append(f"{key(row)}: {row.get('cpu_s', row['s']):.1f} s of CPU")
    for row in slowest[:15]:
        old = before.get(key(row), {})
        same = "-" if "ms" not in old or "ms" not in row else str(math.isclose(old["ms"], row["ms"], rel_tol=1e-9))
        cell = lambda r, f: f"{r[f]:.3f}" if f in r else r.get("error", "-")[:40]  # noqa: E731
        print(f"| {label(row)} | {old.get('s', math.nan):.2f} | {row['s']:.2f} | "
              f"{old.get('cpu_s', math.nan):.2f} | {row.get('cpu_s', math.nan):.2f} | {cell(old, 'ms')} | "
              f"{cell(row, 'ms')} | {same} |")  # fmt: skip
    both = [r for r in rows if "ms" in r and "ms" in before.get(key(r), {})]
    solved = [r for r in rows if "ms" in r]
    print(f"solved {len(solved)} of {len(rows)}; under {TARGET_SECONDS:.0f} s of CPU: {len(solved) - len(slow)}")
    print(f"optimum compared on {len(both)} instances; differing: {len(changed)}")
    for title, lines in (("not solved", failed), ("slower than the target", slow), ("another optimum", changed)):
        for line in lines:
            print(f"  {title}: {line}")
    return 1 if check and (failed or slow or changed) else 0


if __name__ == "__main__":
    sys.exit(main())
