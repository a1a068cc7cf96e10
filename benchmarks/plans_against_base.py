"""Plans of an earlier revision against this tree's, both priced by this tree's simulator (issue 36: "the plans are the
same as today or better in simulated time on every instance").

Usage: .venv/bin/python benchmarks/plans_against_base.py [--base-rev REV | --base-src DIR] [--matrix ROWS.json]
       [--quick | --all] [--profiles a,b] [--clusters c,d] [--batches 256,2048] [--workers 1] [--timeout 200]
       [--out rows.json] [--resume] [--check]

Per instance (a shared profile x a preset x a global batch, planning_matrix.py's matrix): the base's `plan --out`
in its own process (PYTHONPATH: the base's sources), then this tree's `simulate --plan` of that file, which is the
base's plan priced by today's cost model; beside it this tree's own plan's simulated time, from --matrix (a
planning_matrix.py --out of this tree) or from a `plan --json` run here. A plan's time is comparable only under one
cost model: presets and costs changed since the base (issue 34's calibrated presets), so the base's own figure is not
used. The ratio is this tree's time over the base plan's: above 1 means today's plan is slower, which --check
refuses. A base that runs past --timeout seconds (the base planned some deep instances for minutes) or refuses the
instance is listed, not compared.

The base: --base-rev (default 77066f9, main when issue 36 was filed) exported by `git archive` into a temporary
directory, or --base-src, a directory holding its `pipeplan` package. Instances run in a seeded random order, so a
run stopped early (--out is rewritten after every instance) is a representative sample; --resume skips the
instances --out already holds. --quick (the default without --all, --profiles or --clusters): planning_matrix.py's
quick set; --all: every shared profile x every preset x global batch 256 and 2048, the whole matrix.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from io import BytesIO
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from planning_matrix import BATCHES, QUICK_CLUSTERS, QUICK_PROFILES, SRC, plan_command, run_instance

BASE_REV = "77066f9"
ROOT = SRC.parent
Instance = tuple[str, str, int]


@contextmanager
def exported(rev: str) -> Iterator[Path]:
    """The sources of git revision `rev` of this repository (`git archive`), in a temporary directory."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True).stdout
    with tempfile.TemporaryDirectory() as directory:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(directory, filter="data")
        yield Path(directory) / "src"


def _env(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src)}


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def base_plan_time(instance: Instance, base: Path, src: Path, timeout: float) -> dict[str, Any]:
    """The base's plan of `instance` (its own process) priced by `src`'s simulator: base_ms, base_cpu_s, or status."""
    profile, cluster, batch = instance
    with tempfile.TemporaryDirectory() as directory:
        plan = str(Path(directory) / "plan.json")
        command = [*plan_command(profile, cluster, batch), "--out", plan]
        made = run_instance(profile, cluster, batch, timeout, command, base)  # the matrix's measured process
        cpu = made["cpu_s"]
        if (made["error"] or "").startswith("killed after"):
            return {"status": f"base past {timeout:g} s"}
        if made["error"] is not None:
            return {"status": f"base refused: {made['error'][:300]}", "base_cpu_s": cpu}
        command = [sys.executable, "-m", "pipeplan", "simulate", "--plan", plan, "--profile", profile, "--cluster",
                   cluster, "--json"]  # fmt: skip
        priced = subprocess.run(command, env=_env(src), capture_output=True, text=True, cwd=directory)
        if priced.returncode != 0:
            return {"status": f"simulate refused the base's plan: {_last_line(priced.stderr)}", "base_cpu_s": cpu}
        return {"status": "ok", "base_ms": json.loads(priced.stdout)["iteration_time"], "base_cpu_s": cpu}


def compare_one(job: tuple[Instance, str, str, float, float | None]) -> dict[str, Any]:
    """One instance's row: this tree's plan time (given, or planned here) against the base's plan priced here."""
    instance, base, src, timeout, plan_ms = job
    profile, cluster, batch = instance
    row: dict[str, Any] = {"profile": profile, "cluster": cluster, "batch": batch}
    if plan_ms is None:
        plan_ms = run_instance(profile, cluster, batch, timeout, src=Path(src)).get("iteration_time")
    row["plan_ms"] = plan_ms
    started = time.perf_counter()
    row.update(base_plan_time(instance, Path(base), Path(src), timeout))
    row["base_wall_s"] = time.perf_counter() - started
    if row["status"] == "ok" and plan_ms is not None:
        row["ratio"] = plan_ms / row["base_ms"]
    return row


def verdicts(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(slower, not compared): the instances where this tree's plan is slower than the base's plan under this tree's
    costs, with both times, or where the base planned and this tree found no plan; and those the base did not plan
    (timeout, refusal)."""
    slower, missing = [], []
    for r in rows:
        name = f"{r['profile']} on {r['cluster']} at batch {r['batch']}"
        if r["status"] != "ok":
            missing.append(f"{name}: {r['status']}")
        elif r["plan_ms"] is None:
            slower.append(f"{name}: base's plan {r['base_ms']} ms, this tree found no plan")
        elif r["plan_ms"] > r["base_ms"]:
            slower.append(f"{name}: base's plan {r['base_ms']} ms, this tree's {r['plan_ms']} ms")
    return slower, missing


def instances(args: argparse.Namespace) -> list[Instance]:
    """The instances asked for, in the seeded random order."""
    sys.path.insert(0, str(SRC))
    from pipeplan.presets.resolve import list_clusters, list_profiles

    quick = args.quick or not (args.all or args.profiles or args.clusters)
    profiles = args.profiles.split(",") if args.profiles else list(QUICK_PROFILES if quick else list_profiles())
    clusters = args.clusters.split(",") if args.clusters else list(QUICK_CLUSTERS if quick else list_clusters())
    batches = [int(b) for b in args.batches.split(",")] if args.batches else ([256] if quick else list(BATCHES))
    chosen = [(p, c, b) for c in clusters for p in profiles for b in batches]
    random.Random(36).shuffle(chosen)
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-rev", default=BASE_REV, help=f"the base revision (git archive; default {BASE_REV})")
    parser.add_argument("--base-src", default=None, help="the base's sources (a directory), instead of --base-rev")
    parser.add_argument("--matrix", default=None, help="this tree's plan times: a planning_matrix.py --out")
    parser.add_argument("--quick", action="store_true", help="planning_matrix.py's quick set (default without lists)")
    parser.add_argument("--all", action="store_true", help="the whole matrix: every profile, preset and batch")
    parser.add_argument("--profiles", default=None, help="comma-separated profile names")
    parser.add_argument("--clusters", default=None, help="comma-separated cluster presets")
    parser.add_argument("--batches", default=None, help="comma-separated global batches (default: 256,2048)")
    parser.add_argument("--workers", type=int, default=1, help="instances planned at once")
    parser.add_argument("--timeout", type=float, default=200.0, help="stop a base's planning after this many seconds")
    parser.add_argument("--out", default=None, help="write the rows as JSON (after every instance)")
    parser.add_argument("--resume", action="store_true", help="skip the instances --out already holds")
    parser.add_argument("--check", action="store_true", help="exit 1 when this tree's plan is slower on an instance")
    args = parser.parse_args(argv)
    known: dict[Instance, float | None] = {}
    if args.matrix:
        known = {
            (r["profile"], r["cluster"], r["batch"]): r["iteration_time"]
            for r in json.loads(Path(args.matrix).read_text())["rows"]
        }
    rows: list[dict[str, Any]] = []
    if args.resume and args.out and Path(args.out).exists():
        rows = json.loads(Path(args.out).read_text())["rows"]
    done = {(r["profile"], r["cluster"], r["batch"]) for r in rows}
    todo = [i for i in instances(args) if i not in done]
    with exported(args.base_rev) if args.base_src is None else nullcontext(Path(args.base_src)) as base:
        jobs = [(i, str(base), str(SRC), args.timeout, known.get(i)) for i in todo]
        with Pool(args.workers) as pool:
            for row in pool.imap(compare_one, jobs):
                rows.append(row)
                figure = f"{row['ratio']:.6f}" if "ratio" in row else row["status"]
                print(f"{row['profile']} {row['cluster']} {row['batch']}: {figure}", file=sys.stderr, flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    slower, missing = verdicts(rows)
    compared = [r for r in rows if "ratio" in r]
    same = sum(r["ratio"] == 1.0 for r in compared)
    faster = sum(r["ratio"] < 1.0 for r in compared)
    print(f"{len(compared)} of {len(rows)} instances compared: {same} the same time, {faster} faster, {len(slower)} slower")
    for line in slower:
        print(f"SLOWER: {line}")
    for line in missing:
        print(f"not compared: {line}")
    return 1 if args.check and slower else 0


if __name__ == "__main__":
    sys.exit(main())
