"""DDP's bucketed all-reduce, predicted against measured: 2-way data parallelism on 2 local processes over an emulated
network, its all-reduce after the backward against in DDP's buckets during it (`train --allreduce-bucket-mb`).

Usage: .venv/bin/python benchmarks/ddp_overlap.py [--work DIR] [--rate 0.5] [--latency-us 100] [--bucket-mb 1]
       [--microbatches 1,4] [--steps 12] [--warmup 2] [--rounds 2] [--json OUT]

The chain a user runs: `pipeplan profile mlp` (6 blocks of 512: 5.4 MB of fp32 gradients) at batch 64, `pipeplan probe
--local 2` for the devices' speeds; the probed cluster's links are then set to `--rate` GB/s and `--latency-us` both
ways with no measured all-reduce (so that the emulated ring is that rate, and the prediction prices the same), and
every run emulates that network (`--bandwidth-trace` of one factor-1 step: the plan's cluster's rates). The plan: one
stage of every layer on both processes, global batch 64 in m microbatches. Each round runs, for each m, the plan
without and with `--allreduce-bucket-mb` (the order flipped every second round), each `train --local 2 --plan
--steps S --warmup-steps W --json`: its predicted step (the plan simulated before the first step, with the same
buckets when given) and measured step (median after the warm-up). A point's figures are the medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PIPEPLAN = [sys.executable, "-c", "from pipeplan.cli import main; main()"]
MODEL = ["mlp", "--opt", "hidden=512", "--opt", "blocks=6"]
BATCH = 64


def run(args: list[str], timeout: float = 900) -> str:
    """Run a pipeplan command; its stdout (raises with its stderr on failure)."""
    done = subprocess.run([*PIPEPLAN, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"pipeplan {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def load() -> str:
    """The 1-minute load average."""
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def setup(work: Path, rate: float, latency_us: float) -> tuple[Path, Path, Path, int]:
    """Profile and probe (once per work folder); the emulated cluster and the flat trace; the layer count."""
    profile, probed = work / "profile.json", work / "cluster-probed.json"
    if not profile.exists():
        run(["profile", *MODEL, "-b", str(BATCH), "-o", str(profile), "-q"])
    if not probed.exists():
        run(["probe", "--local", "2", "--profile", str(profile), "--out", str(probed)])
    cluster = json.loads(probed.read_text())
    cluster.pop("allreduce", None)
    cluster["bandwidth_gb_per_s"] = [[0, rate], [rate, 0]]
    cluster["latency_us"] = [[0, latency_us], [latency_us, 0]]
    cluster["name"] = f"local-2-at-{rate:g}"
    emulated = work / "cluster.json"
    emulated.write_text(json.dumps(cluster, indent=2))
    trace = work / "flat.json"
    trace.write_text(json.dumps([{"t_ms": 0, "link": "all", "factor": 1.0}]))
    layers = len(json.loads(profile.read_text())["layers"])
    return profile, emulated, trace, layers


def plan_file(work: Path, profile: Path, cluster: Path, layers: int, m: int) -> Path:
    """One stage of every layer on processes 0 and 1, global batch BATCH in m microbatches, 1F1B."""
    plan = {"format": "pipeplan.plan/1", "profile": str(profile), "cluster": str(cluster),
            "stages": [{"first_layer": 0, "last_layer": layers - 1, "devices": [0, 1]}], "pipeline_replicas": 1,
            "microbatches": m, "microbatch_size": BATCH // m, "schedule": "1f1b", "k": 1, "chunks": 1, "order": None}  # fmt: skip
    path = work / f"dp-m{m}.json"
    path.write_text(json.dumps(plan))
    return path


def one_run(plan: Path, trace: Path, bucket_mb: float | None, steps: int, warmup: int) -> dict[str, Any]:
    """`train --local 2 --plan` on the emulated network: predicted and measured step, the all-reduce's report."""
    extra = [] if bucket_mb is None else ["--allreduce-bucket-mb", str(bucket_mb)]
    before = load()
    report = json.loads(run(["train", "--local", "2", "--plan", str(plan), *MODEL[1:], "--bandwidth-trace", str(trace),
                             "--steps", str(steps), "--warmup-steps", str(warmup), "--json", "-q", *extra]))  # fmt: skip
    (allreduce,) = report["allreduce"]
    return {"predicted_ms": report["predicted_step_ms"], "measured_ms": report["measured_step_ms"],
            "allreduce_mean_ms": allreduce["mean_ms"], "buckets": allreduce["buckets"], "load": [before, load()]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=None, help="folder for the profile, cluster and plans (default: a temporary one)")
    parser.add_argument("--rate", type=float, default=0.5, help="the emulated link's GB/s")
    parser.add_argument("--latency-us", type=float, default=100.0, help="the emulated link's latency")
    parser.add_argument("--bucket-mb", type=float, default=1.0, help="--allreduce-bucket-mb of the bucketed runs")
    parser.add_argument("--microbatches", default="1,4")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None, help="write every run here")
    args = parser.parse_args(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="ddp-overlap-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work {work}; load {load()} at the start (cpus {os.cpu_count()})", flush=True)
    profile, cluster, trace, layers = setup(work, args.rate, args.latency_us)
    runs: dict[str, list[dict[str, Any]]] = {}
    ms = [int(x) for x in args.microbatches.split(",")]
    for r in range(args.rounds):
        for m in ms:
            plan = plan_file(work, profile, cluster, layers, m)
            modes: list[float | None] = [None, args.bucket_mb]
            for bucket in modes if r % 2 == 0 else modes[::-1]:
                key = f"m={m} {'after backward' if bucket is None else f'buckets {bucket:g} MiB'}"
                got = one_run(plan, trace, bucket, args.steps, args.warmup)
                runs.setdefault(key, []).append(got)
                print(f"round {r + 1} {key}: predicted {got['predicted_ms']:.2f} ms, measured {got['measured_ms']:.2f} ms "
                      f"(ratio {got['measured_ms'] / got['predicted_ms']:.3f}), all-reduce {got['allreduce_mean_ms']:.2f} ms "
                      f"in {got['buckets']} bucket(s), load {got['load'][0]} -> {got['load'][1]}", flush=True)  # fmt: skip
    print(f"\n{'point':<28} {'predicted':>10} {'measured':>10} {'measured/predicted':>19} {'all-reduce':>11}  buckets")
    for key, got in runs.items():
        predicted = statistics.median(g["predicted_ms"] for g in got)
        measured = statistics.median(g["measured_ms"] for g in got)
        allreduce = statistics.median(g["allreduce_mean_ms"] for g in got)
        print(f"{key:<28} {predicted:>8.2f}ms {measured:>8.2f}ms {measured / predicted:>19.3f} {allreduce:>9.2f}ms  "
              f"{got[0]['buckets']}")  # fmt: skip
    print(f"load {load()} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
