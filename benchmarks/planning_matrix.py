"""Planning time and memory: every shared profile x every preset cluster x global batch 256 and 2048 (issue 36).

Usage: .venv/bin/python benchmarks/planning_matrix.py [--quick] [--profiles a,b] [--clusters c,d] [--batches 256,2048]
       [--out results.json] [--check] [--compare BASE.json] [--timeout 600] [--time-budget S|none] [--src DIR]

Each instance is one whole `python -m pipeplan plan --profile P --cluster C --global-batch B --json` process, run
one at a time (never in parallel: the times are the point), from byte-compiled sources (`compile_sources`, as an
installed package runs). Per instance: wall seconds, CPU seconds (user + system)
and peak resident memory of that process (os.wait4's rusage of the child), the plan's simulated iteration time
(ms), its planning_seconds, its slowest planning phase and whether plan's time budget (default 50 s) stopped the
search (plan --json's "planning": stopped_early; such a plan is the best found in the budget, marked in the
table). A planner refusal (nothing fits) is a row with its error, timed like the others. With --out the rows are
rewritten after every instance, so a stopped run keeps what it measured.

The host reference (REFERENCE_CODE, a fixed Python and NumPy workload independent of pipeplan) runs as its own
process before the first instance and after each cluster's; --out keeps its times ("reference") and the summary
gives the median instance in units of it, which compares runs made on different hosts or days.

Targets (--check exits 1 when one fails): every instance <= 60 s wall and <= 2 GiB peak memory; the median
instance <= 5 s wall.

--compare BASE.json: the instances of BASE (an earlier --out) whose simulated iteration time changed, with both
times (a plan change must make the time no worse; issue 36's acceptance).

--time-budget none: every instance runs its whole search (on a loaded machine the default budget of wall clock cuts
searches short, so their CPU seconds and plans are not the code's); --src DIR: run another tree's sources (a
before/after pair from one harness).

--quick: 2 profiles x 2 clusters x global batch 256 (a smoke run of the harness, minutes on a loaded machine).
Run the whole matrix only on a quiet machine (416 processes; about an hour at today's speeds):
    PYTHONPATH=src .venv/bin/python benchmarks/planning_matrix.py --out planning_matrix.json --check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proc_timing import Timing, run_once

BATCHES = (256, 2048)
QUICK_PROFILES = ("dapple/bert-48", "pipedream/resnet50")
QUICK_CLUSTERS = ("v100-8x1", "pcie-4x4-10g")
MAX_SECONDS = 60.0
MAX_BYTES = 2 * 2**30
MEDIAN_SECONDS = 5.0
SRC = Path(__file__).resolve().parent.parent / "src"
TIMING_FIELDS = ("planning", "planning_seconds")
"""What plan --json holds besides the plan: how long planning took (left out of plan_sha256)."""


def plan_command(profile: str, cluster: str, batch: int, time_budget: str | None = None) -> list[str]:
    """The `plan --json` process of one instance (`time_budget`: plan's --time-budget, S or none; None: its default)."""
    budget = [] if time_budget is None else ["--time-budget", time_budget]
    return [sys.executable, "-m", "pipeplan", "plan", "--profile", profile, "--cluster", cluster,
            "--global-batch", str(batch), "--json", *budget]  # fmt: skip


def parse_plan_output(stdout: str, returncode: int, stderr: str) -> dict[str, Any]:
    """What a row keeps of a `plan --json` process's output: iteration_time (ms), plan_sha256 (of the JSON without
    TIMING_FIELDS, keys sorted: equal digests are the same plan), planning_seconds, the slowest phase (name,
    seconds) and stopped_early (the time budget cut the search) from a plan; error (stderr's last line) from a
    refusal (exit 2) or a fault."""
    if returncode != 0:
        lines = [line for line in stderr.splitlines() if line.strip()]
        return {"iteration_time": None, "error": lines[-1] if lines else f"exit code {returncode}"}
    obj = json.loads(stdout)
    planning = obj.get("planning", {})
    phases = planning.get("phases", [])
    slowest = max(phases, key=lambda p: p["seconds"], default=None)
    plan = {k: v for k, v in obj.items() if k not in TIMING_FIELDS}
    return {
        "iteration_time": obj["iteration_time"],
        "plan_sha256": hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest(),
        "planning_seconds": obj["planning_seconds"],
        "slowest_phase": None if slowest is None else [slowest["name"], slowest["seconds"]],
        "stopped_early": bool(planning.get("stopped_early", False)),
        "error": None,
    }


def run_instance(profile: str, cluster: str, batch: int, timeout: float, command: list[str] | None = None,
                 src: Path = SRC) -> dict[str, Any]:  # fmt: skip
    """Plan one instance in its own process: wall, CPU (user + system) and peak RSS of that process, and its plan.

    `command` replaces the plan command (tests); `src` is the pipeplan sources it runs (first on PYTHONPATH). A
    process past `timeout` seconds is killed and its row says so."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))}
    row: dict[str, Any] = {"profile": profile, "cluster": cluster, "batch": batch}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command or plan_command(profile, cluster, batch), stdout=out, stderr=err, env=env)
        timed_out = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - started > timeout:
                proc.kill()
                timed_out = True
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    row.update(
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_rss_bytes=usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024),
    )
    if timed_out:
        row.update(iteration_time=None, error=f"killed after {timeout:g} s")
    else:
        row.update(parse_plan_output(stdout, proc.returncode, stderr))
    return row


REFERENCE_CODE = """
import numpy as np
table = {}
for i in range(400_000):
    key = (i % 977, i % 13)
    table[key] = table.get(key, 0) + i
cube = np.arange(64 * 64 * 16, dtype=float).reshape(64, 64, 16) % 97.0
for _ in range(1_500):
    cube[0, 0, 0] = float(np.maximum(cube, cube[::-1]).argmin(axis=1).sum() % 7)
"""
"""The host reference: a fixed workload of the kinds planning does (dicts and tuples in Python, small NumPy arrays),
independent of pipeplan's code. Its CPU seconds, timed beside the instances, say how fast this host ran that day:
instance time / reference time compares runs made on different hosts or days. Between the quiet runs of 2026-11-29
the same plans took from 0.69x to 1.16x the CPU seconds of another run (BENCHMARKS.md, issue 36)."""


def time_reference(after: int, timeout: float = 120.0) -> dict[str, Any]:
    """One run of REFERENCE_CODE as its own process (proc_timing.run_once), after `after` instances: its wall and CPU
    seconds."""
    timing = Timing("host reference", [sys.executable, "-c", REFERENCE_CODE])
    run_once(timing, timeout)
    if timing.timed_out or timing.codes != [0]:
        raise RuntimeError(f"the host reference failed: {'timed out' if timing.timed_out else f'exit {timing.codes}'}")
    return {"after_instances": after, "wall_s": timing.wall_s[0], "cpu_s": timing.cpu_s[0]}


def reference_line(rows: list[dict[str, Any]], reference: list[dict[str, Any]]) -> str:
    """The host reference's median CPU seconds and the median instance in units of it (comparable across hosts)."""
    ref = statistics.median(r["cpu_s"] for r in reference)
    cpu, wall = (statistics.median(r[k] for r in rows) for k in ("cpu_s", "wall_s"))
    spread = f"{min(r['cpu_s'] for r in reference):.3f}-{max(r['cpu_s'] for r in reference):.3f}"
    return (
        f"host reference: median {ref:.3f} CPU s over {len(reference)} runs ({spread}); median instance "
        f"{cpu / ref:.2f} references of CPU, {wall / ref:.2f} of wall"
    )


def check(rows: list[dict[str, Any]]) -> list[str]:
    """The targets each row or the median misses (empty: all met)."""
    failures = []
    for r in rows:
        name = f"{r['profile']} on {r['cluster']} at batch {r['batch']}"
        if r["wall_s"] > MAX_SECONDS or (r.get("error") or "").startswith("killed after"):
            failures.append(f"{name}: {r['wall_s']:.1f} s > {MAX_SECONDS:g} s")
        if r["peak_rss_bytes"] > MAX_BYTES:
            failures.append(f"{name}: {r['peak_rss_bytes'] / 2**30:.2f} GiB > {MAX_BYTES / 2**30:g} GiB")
    if rows:
        median = statistics.median(r["wall_s"] for r in rows)
        if median > MEDIAN_SECONDS:
            failures.append(f"median {median:.2f} s > {MEDIAN_SECONDS:g} s")
    return failures


def compare(rows: list[dict[str, Any]], base: list[dict[str, Any]]) -> list[str]:
    """Instances in both whose simulated iteration time differs (or that plan in one and not the other), and those
    of equal time whose plans differ (where both rows have plan_sha256)."""
    before = {(r["profile"], r["cluster"], r["batch"]): r for r in base}
    changed = []
    for r in rows:
        key = (r["profile"], r["cluster"], r["batch"])
        if key not in before:
            continue
        old, new = before[key].get("iteration_time"), r.get("iteration_time")
        if old != new:
            verdict = "faster" if old is not None and new is not None and new < old else "SLOWER OR LOST"
            changed.append(f"{key[0]} on {key[1]} at batch {key[2]}: {old} ms -> {new} ms ({verdict})")
        elif None not in (digest := before[key].get("plan_sha256"), r.get("plan_sha256")) and digest != r["plan_sha256"]:
            changed.append(f"{key[0]} on {key[1]} at batch {key[2]}: {old} ms, another plan of the same time")
    return changed


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The table of rows, slowest first, and the medians."""
    lines = [f"{'profile':28} {'cluster':18} {'batch':>5} {'wall s':>7} {'cpu s':>7} {'MiB':>6}  slowest phase / error"]
    for r in sorted(rows, key=lambda r: -r["wall_s"]):
        note = r.get("error") or (f"{r['slowest_phase'][0]} {r['slowest_phase'][1]:.1f} s" if r.get("slowest_phase") else "")
        note += " (stopped by the time budget)" if r.get("stopped_early") else ""
        lines.append(
            f"{r['profile']:28} {r['cluster']:18} {r['batch']:>5} {r['wall_s']:7.2f} {r['cpu_s']:7.2f} "
            f"{r['peak_rss_bytes'] / 2**20:6.0f}  {note}"
        )
    if rows:
        lines.append(
            f"{len(rows)} instances: median wall {statistics.median(r['wall_s'] for r in rows):.2f} s, max wall "
            f"{max(r['wall_s'] for r in rows):.2f} s, median CPU {statistics.median(r['cpu_s'] for r in rows):.2f} s, "
            f"max CPU {max(r['cpu_s'] for r in rows):.2f} s, max memory {max(r['peak_rss_bytes'] for r in rows) / 2**30:.2f} GiB"
        )
    return lines


def compile_sources(src: Path) -> None:
    """Byte-compile the sources the instances run (compileall: each module's __pycache__, skipped where it is up to
    date), once before the first instance, so every process loads bytecode as an installed package does. Without it,
    where PYTHONDONTWRITEBYTECODE is set (this machine sets it) every process would compile pipeplan's modules again:
    about 0.3 CPU s of each instance's start."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(src)], check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 profiles x 2 clusters x batch 256")
    parser.add_argument("--profiles", default=None, help="comma-separated profile names (default: all, or --quick's)")
    parser.add_argument("--clusters", default=None, help="comma-separated cluster presets (default: all, or --quick's)")
    parser.add_argument("--batches", default=None, help="comma-separated global batches (default: 256,2048)")
    parser.add_argument("--out", default=None, help="write the rows as JSON (after every instance)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--compare", default=None, help="an earlier --out: list instances whose time changed")
    parser.add_argument("--timeout", type=float, default=600.0, help="kill an instance after this many seconds")
    parser.add_argument("--time-budget", default=None, help="plan's --time-budget (S or none; default: plan's own)")
    parser.add_argument("--src", default=str(SRC), help="the pipeplan sources to run (default: this checkout's src)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(SRC))
    from pipeplan.presets.resolve import list_clusters, list_profiles

    profiles = args.profiles.split(",") if args.profiles else list(QUICK_PROFILES if args.quick else list_profiles())
    clusters = args.clusters.split(",") if args.clusters else list(QUICK_CLUSTERS if args.quick else list_clusters())
    batches = [int(b) for b in args.batches.split(",")] if args.batches else ([256] if args.quick else list(BATCHES))
    compile_sources(Path(args.src))
    rows: list[dict[str, Any]] = []
    reference = [time_reference(0)]  # the host reference: before the first instance and after each cluster's

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps({"rows": rows, "reference": reference}, indent=1) + "\n")

    for cluster in clusters:
        for profile in profiles:
            for batch in batches:
                command = plan_command(profile, cluster, batch, args.time_budget)
                rows.append(run_instance(profile, cluster, batch, args.timeout, command, Path(args.src)))
                print(f"{profile} {cluster} {batch}: {rows[-1]['wall_s']:.2f} s", file=sys.stderr, flush=True)
                save()
        reference.append(time_reference(len(rows)))
        save()
    print("\n".join(summary_lines(rows)))
    if rows:
        print(reference_line(rows, reference))
    status = 0
    if args.compare:
        changed = compare(rows, json.loads(Path(args.compare).read_text())["rows"])
        print(f"{len(changed)} instance(s) with another simulated time or plan than {args.compare}")
        print("\n".join(changed))
    if args.check:
        failures = check(rows)
        print("targets: " + ("PASS" if not failures else "FAIL\n  " + "\n  ".join(failures)))
        status = 1 if failures else 0
    return status


if __name__ == "__main__":
    sys.exit(main())
