"""Scale: planning large models and large clusters, whole process (time and peak memory of a fresh `pipeplan`).

Usage: .venv/bin/python benchmarks/scale.py [--runs 3] [--large] [--huge] [--cases C6,C7,C8] [--check]

Cases (targets from the issue "Fast and unbreakable where a user touches it"):
  C1 `plan --profile pipedream/nasnetalarge --cluster h100-8x128 --global-batch 1024` (1251 layers)  <= 10 s
  C2 `compare` on the same problem                                                                 <= 20 s
  C3 `plan --profile dapple/bert-48` on 128 nodes x 8 H100 (description form), global batch 16384  (reported)
  with --large:
  C4 the same on 1024 nodes x 8 H100 (8,192 devices)                                              <= 60 s, <= 1 GiB
  C5 the same on 2048 nodes x 8 H100 (16,384 devices)                                              (reported)
  C6 `compare` (every planner: pipeplan, dapple, pipedream, balanced, exact) on C4's problem        <= 20 s
  with --huge (issue 22, "Beyond the peers"):
  C7 `plan --profile dapple/bert-48` on 8,192 nodes x 8 H100 (65,536 devices), global batch 16384 <= 60 s, <= 2 GiB
  C8 the same on 12,500 nodes x 8 H100 (100,000 devices), `--time-budget none` (issue 36)        <= 60 s, <= 2 GiB
A case that runs past --timeout seconds is reported as timed out. --check exits 1 when a target fails. --cases
keeps only the cases named. The table gives CPU seconds (user + sys) beside wall: on a shared machine load
stretches the wall clock, not the CPU time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proc_timing import PIPEPLAN, time_cases

NASNET = ["--profile", "pipedream/nasnetalarge", "--cluster", "h100-8x128", "--global-batch", "1024"]


def h100_nodes(nodes: int, folder: Path) -> str:
    """A description-form cluster file of `nodes` DGX-H100-like nodes (8 GPUs, NVLink inside, 400 Gb/s per GPU)."""
    path = folder / f"h100-8x{nodes}.json"
    cluster = {
        "format": "pipeplan.cluster/1",
        "name": f"h100-8x{nodes}-described",
        "nodes": nodes,
        "gpus_per_node": 8,
        "device": {"kind": "H100", "memory_gb": 80},
        "intra_node_gb_per_s": 450,
        "inter_node_gb_per_s": 50,
        "nic_gb_per_s": 400,
        "latency_us": {"intra": 3, "inter": 10},
    }
    path.write_text(json.dumps(cluster))
    return str(path)


NEEDS = " (C4-C6 need --large, C7 and C8 --huge)"
"""What a case left out needs, for the error naming it."""


def main() -> None:
    """Time every case in turn; print a table with targets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="counted rounds")
    parser.add_argument("--large", action="store_true", help="add 8,192 and 16,384 devices (15-60 s each)")
    parser.add_argument("--huge", action="store_true", help="add 65,536 and 100,000 devices (C7, C8)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a run is stopped")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--cases", default=None, help="comma-separated case names to run (default: all selected)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pipeplan-scale-") as tmp:
        folder = Path(tmp)
        bert = ["--profile", "dapple/bert-48", "--global-batch", "16384"]
        cases: list[tuple[str, str, list[str], float | None, float | None]] = [
            ("C1", "plan nasnetalarge on h100-8x128", [*PIPEPLAN, "plan", *NASNET], 10.0, None),
            ("C2", "compare nasnetalarge on h100-8x128", [*PIPEPLAN, "compare", *NASNET], 20.0, None),
            ("C3", "plan bert-48 on 1,024 H100 (described)",
             [*PIPEPLAN, "plan", *bert, "--cluster", h100_nodes(128, folder)], None, None),
        ]  # fmt: skip
        if args.large:
            cases += [
                ("C4", "plan bert-48 on 8,192 H100 (described)",
                 [*PIPEPLAN, "plan", *bert, "--cluster", h100_nodes(1024, folder)], 60.0, 1024.0),
                ("C5", "plan bert-48 on 16,384 H100 (described)",
                 [*PIPEPLAN, "plan", *bert, "--cluster", h100_nodes(2048, folder)], None, None),
                ("C6", "compare bert-48 on 8,192 H100 (described), every baseline",
                 [*PIPEPLAN, "compare", *bert, "--cluster", h100_nodes(1024, folder)], 20.0, None),
            ]  # fmt: skip
        if args.huge:
            cases += [
                ("C7", "plan bert-48 on 65,536 H100 (described)",
                 [*PIPEPLAN, "plan", *bert, "--cluster", h100_nodes(8192, folder)], 60.0, 2048.0),
                # the whole search (no time budget): what 100,000 devices cost, not the best plan found in 50 s
                ("C8", "plan bert-48 on 100,000 H100 (described), no time budget",
                 [*PIPEPLAN, "plan", *bert, "--cluster", h100_nodes(12500, folder), "--time-budget", "none"], 60.0,
                 2048.0),
            ]  # fmt: skip
        cases, timings = time_cases(cases, args.cases, args.runs, args.timeout, parser.error, NEEDS)
    print("| case | what | wall s (median) | min | max | peak MiB | CPU s (median) | target |")
    print("|---|---|---|---|---|---|---|---|")
    failed = []
    for (name, label, _, seconds, mib), timing in zip(cases, timings, strict=True):
        if timing.timed_out and not timing.wall_s:
            print(f"| {name} | {label} | > {args.timeout:g} (stopped) | - | - | - | - | {'FAIL' if seconds else '-'} |")
            failed += [name] if seconds else []
            continue
        ok = timing.meets(seconds, mib)
        target = " and ".join(t for t in (f"<= {seconds:g} s" if seconds else "", f"<= {mib:g} MiB" if mib else "") if t)
        verdict = f"{target} {'PASS' if ok else 'FAIL'}" if target else ("-" if ok else f"exit {timing.codes}")
        if not ok:  # a target missed, or a run that did not exit 0
            failed.append(name)
        print(f"| {name} | {label} | {timing.cells(2)} | {timing.median_cpu():.2f} | {verdict} |")
    if args.check and failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
