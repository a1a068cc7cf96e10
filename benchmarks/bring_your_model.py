"""Bring your model: predicted against measured step time of the chosen plan for unmodified Hugging Face models.

Usage: .venv/bin/python benchmarks/bring_your_model.py [--cases gpt2,vit] [--rounds 3] [--steps 12]
       [--replication any|pipelines|none] [--check]

Issue 32's acceptance: "predicted vs measured within 15 % on a quiet machine for the chosen plan of two of these
models (bf16 and fp32)". The chain a user runs, for each case, on 2 local processes (gloo, one thread each), the
models given as `stock_models:FACTORY` (benchmarks/stock_models.py: a factory that returns the transformers model
as it comes; pipeplan captures it with torch.export and takes its sample data and loss from its config):

  1. `pipeplan profile stock_models:F -b B --precision P -o profile.json` (every layer at 1, 2, 4, ..., B);
  2. `pipeplan probe --local 2 --profile profile.json --module stock_models:F -o cluster.json` (the two processes as
     a 2-CPU cluster: speeds, links, all-reduce, message costs);
  3. `pipeplan plan --profile profile.json --cluster cluster.json --global-batch G --replication R -o plan.json`
     (the plan the planner chooses: stages, replicas, microbatches, schedule; R `any` by default, where on two CPUs
     it may well choose data parallelism, one stage on both; `none` keeps it a pipeline of two stages);
  4. `pipeplan train --local 2 --plan plan.json --module stock_models:F --precision P --steps S --predict --json`,
     `--rounds` times, the cases in turn (A B A B ...) so that the machine's drift lands on both.

Per run: the plan's prediction (made by `train` from the plan's profile and cluster before the first step) against
the measured step (median of the steps after the warm-up: pipeline, all-reduce, optimizer); and `--predict`'s
re-profiled pipeline time (every stage profiled where it ran, after training) against the measured pipeline time
(reported, no target). A case's figure is the median over its rounds of measured / predicted.

Cases: gpt2 in fp32 (GPT2LMHeadModel, 4 blocks, n_embd 256, vocabulary 1000, 64 tokens, tied lm_head; global batch
32, profiled up to 16) and vit in bf16 autocast (ViTForImageClassification, 32x32 images in 4x4 patches, hidden
192, 4 blocks, 10 labels; global batch 32, profiled up to 16).

Target (with --check the script exits 1 when one fails): |median measured / predicted - 1| <= 15 % per case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proc_timing import PIPEPLAN, load_line

HERE = Path(__file__).resolve().parent
TARGET = 0.15


@dataclass(frozen=True)
class Case:
    """One model: its MODULE_SPEC, the precision it trains in, the profile's largest batch and the global batch."""

    module: str
    precision: str
    profile_batch: int
    global_batch: int
    what: str


CASES = {
    "gpt2": Case("stock_models:gpt2", "full", 16, 32, "GPT2LMHeadModel 4 x 256, vocab 1000, 64 tokens, tied"),
    "vit": Case("stock_models:vit", "bf16", 16, 32, "ViTForImageClassification 4 x 192, 32x32 images, 64 patches"),
}


def pipeplan(args: list[str], timeout: float = 1800) -> str:
    """Run a pipeplan command with benchmarks/ on the import path (stock_models); its stdout (raises on failure)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    print("  $ pipeplan " + " ".join(args), flush=True)
    done = subprocess.run([*PIPEPLAN, *args], capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"pipeplan {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def prepare(name: str, case: Case, work: Path, replication: str) -> Path:
    """Profile, probe and plan one case; the plan file."""
    profile, cluster, plan = work / f"{name}-profile.json", work / f"{name}-cluster.json", work / f"{name}-plan.json"
    pipeplan(["profile", case.module, "-b", str(case.profile_batch), "--precision", case.precision, "-q", "-o", str(profile)])
    pipeplan(["probe", "--local", "2", "--profile", str(profile), "--module", case.module, "-o", str(cluster)])
    pipeplan(["plan", "--profile", str(profile), "--cluster", str(cluster), "--global-batch", str(case.global_batch),
              "--replication", replication, "--out", str(plan)])  # fmt: skip
    return plan


def describe(plan_path: Path) -> str:
    """The plan in one line: stages (layers, processes), replicas, microbatches x size, schedule."""
    plan = json.loads(plan_path.read_text())
    stages = " | ".join(f"{s['first_layer']}-{s['last_layer']} on {s['devices']}" for s in plan["stages"])
    return (
        f"{plan['schedule']}, {plan['microbatches']} microbatches of {plan['microbatch_size']}, "
        f"{plan['pipeline_replicas']} pipeline(s), stages {stages}"
    )


def train(case: Case, plan: Path, steps: int) -> dict[str, Any]:
    """One `train --local 2 --plan ... --predict --json` run: its report."""
    out = pipeplan(["train", "--local", "2", "--plan", str(plan), "--module", case.module, "--precision", case.precision,
                    "--steps", str(steps), "--predict", "--json", "-q"])  # fmt: skip
    return json.loads(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--rounds", type=int, default=3, help="train runs per case, the cases in turn")
    parser.add_argument("--steps", type=int, default=12, help="steps per train run (the first 2 are warm-up)")
    parser.add_argument("--replication", default="any", help="plan --replication: any, pipelines or none")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    args = parser.parse_args()
    names = args.cases.split(",")
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"--cases: no case {unknown[0]} (cases: {', '.join(CASES)})")
    if args.rounds < 1 or args.steps < 3:
        parser.error(f"--rounds must be >= 1 and --steps >= 3, got {args.rounds} and {args.steps}")
    work = Path(tempfile.mkdtemp(prefix="bring-your-model-"))
    print(f"before: {load_line()}")
    plans = {}
    for name in names:
        print(f"{name}: profile, probe, plan", flush=True)
        plans[name] = prepare(name, CASES[name], work, args.replication)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names:
            print(f"{name}: round {r + 1}/{args.rounds}", flush=True)
            runs[name].append(train(CASES[name], plans[name], args.steps))
    print(f"after:  {load_line()}")
    print()
    header = f"{'case':<5} {'precision':<9} {'predicted ms':>12} {'measured ms':>12} {'meas/pred':>9}  {'per round':<24}"
    print(header + f" {'re-profiled':>11}  plan")
    failures = []
    for name in names:
        case, reports = CASES[name], runs[name]
        ratios = [r["measured_step_ms"] / r["predicted_step_ms"] for r in reports]
        again = [r["measured_ms"] / r["predicted_ms"] for r in reports if r.get("predicted_ms")]
        fit = statistics.median(ratios)
        print(
            f"{name:<5} {case.precision:<9} {statistics.median(r['predicted_step_ms'] for r in reports):>12.2f}"
            f" {statistics.median(r['measured_step_ms'] for r in reports):>12.2f} {fit:>9.3f}"
            f"  {', '.join(f'{x:.3f}' for x in ratios):<24}"
            f" {statistics.median(again) if again else float('nan'):>11.3f}  {describe(plans[name])}"
        )
        if abs(fit - 1) > TARGET:
            failures.append(f"{name}: measured/predicted {fit:.3f} is off by more than {TARGET:.0%}")
    print()
    for name in names:
        print(f"{name}: {CASES[name].what}; files in {work}")
    print("targets: " + ("all met" if not failures else "; ".join(failures)))
    return 1 if failures and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
