"""PipeMare: utilization, throughput and weight memory of asynchronous pipelining against GPipe and 1F1B.

Three tables:
  U1 simulated utilization at equal microbatch size, p in {4, 8}, m in {p/2, p, 2p}: pipemare over its steady
     window (`simulate pipemare --json`), gpipe and 1f1b as 1 - bubble fraction of their flushed iteration;
     forward 1 ms, backward 2 ms per microbatch per stage, no transfer time;
  U2 measured samples/s of `train --local p` (p in {2, 4}) for the built-in mlp on digits: pipemare (one
     asynchronous walk of all steps) against gpipe and 1f1b (median step after warm-up), equal microbatch size;
  U3 weight memory per stage for the same model split over p stages: PipeMare's two weight-sized buffers
     (weights and the discrepancy-correction velocity) against the copies weight stashing (PipeDream) keeps,
     counted from the same schedule's order (sim.delays), in bytes of the stage's parameters.

Usage: python benchmarks/pipemare.py [--steps 24] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PIPEPLAN = [sys.executable, "-c", "from pipeplan.cli import main; main()"]
MODEL = ["--opt", "hidden=256", "--opt", "blocks=7"]


def run(args: list[str], timeout: float = 900) -> str:
    """A pipeplan command's stdout (raises with its stderr on failure)."""
    done = subprocess.run([*PIPEPLAN, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"pipeplan {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def simulated(p: int, m: int) -> dict[str, float]:
    """U1: utilization of pipemare (steady window), gpipe and 1f1b (1 - bubble) at p stages and m microbatches."""
    out = {}
    for name in ("gpipe", "1f1b", "pipemare"):
        got = json.loads(run(["simulate", name, "-p", str(p), "-m", str(m), "--fwd", "1", "--bwd", "2", "--json"]))
        out[name] = got["pipemare"]["utilization"] if name == "pipemare" else 1.0 - got["bubble_fraction"]
    return out


def measured(p: int, m: int, steps: int) -> dict[str, float]:
    """U2: samples/s of each schedule on p local processes (batch 16 m: microbatches of 16 samples)."""
    batch = 16 * m
    common = ["--local", str(p), "-p", str(p), "-m", str(m), *MODEL, "--steps", str(steps), "--batch-size", str(batch),
              "--lr", "0.01", "--json", "-q"]  # fmt: skip
    out = {}
    for name in ("gpipe", "1f1b", "pipemare"):
        got = json.loads(run([*common, "--schedule", name]))
        out[name] = got["samples_per_s"] if name == "pipemare" else batch / (statistics.median(got["step_ms"][2:]) / 1000)
    return out


def weight_memory(p: int, m: int) -> dict[str, Any]:
    """U3: per stage, PipeMare's weight-sized buffers and weight stashing's copies, in bytes of the stage's params."""
    from pipeplan.profiler.model import build_model
    from pipeplan.runtime.job import even_split
    from pipeplan.schedules.pipemare import default_minibatches, pipemare
    from pipeplan.sim.delays import stage_delays
    from pipeplan.sim.steady import WEIGHT_COPIES

    model = build_model("mlp", {"hidden": 256, "blocks": 7}, "digits")
    sizes = [sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in model.layers]
    params = [sum(sizes[a : b + 1]) for a, b in even_split(len(sizes), p)]
    copies = stage_delays(pipemare(p, m, default_minibatches(p, m))).stashed_versions
    return {
        "params": params,
        "pipemare": [WEIGHT_COPIES * b for b in params],
        "stashing": [c * b for c, b in zip(copies, params, strict=True)],
        "copies": list(copies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="training steps per measured run")
    parser.add_argument("--quick", action="store_true", help="p = 4 only, two processes only")
    args = parser.parse_args()
    print("U1 simulated utilization (fwd 1 ms, bwd 2 ms per microbatch and stage)\n")
    print("| p | m | gpipe | 1f1b | pipemare |")
    print("|---|---|---|---|---|")
    for p in (4,) if args.quick else (4, 8):
        for m in (p // 2, p, 2 * p):
            u = simulated(p, m)
            print(f"| {p} | {m} | {u['gpipe']:.1%} | {u['1f1b']:.1%} | {u['pipemare']:.1%} |")
    print("\nU2 measured samples/s, mlp hidden 256 x 7 blocks on digits, 16 samples per microbatch\n")
    print("| processes | m | gpipe | 1f1b | pipemare | pipemare / 1f1b |")
    print("|---|---|---|---|---|---|")
    for p in (2,) if args.quick else (2, 4):
        m = 2 * p
        s = measured(p, m, args.steps)
        print(f"| {p} | {m} | {s['gpipe']:.0f} | {s['1f1b']:.0f} | {s['pipemare']:.0f} | {s['pipemare'] / s['1f1b']:.2f} |")
    print("\nU3 weight memory per stage (MiB), same model, m = 1 (PipeDream's update per microbatch) and m = p\n")
    print("| p | m | stage params | pipemare (weights + velocity) | weight stashing (copies) |")
    print("|---|---|---|---|---|")
    for p in (4,) if args.quick else (4, 8):
        for m in (1, p):
            w = weight_memory(p, m)
            mib = [f"{b / 2**20:.2f}" for b in w["params"]]
            mare = [f"{b / 2**20:.2f}" for b in w["pipemare"]]
            stash = [f"{b / 2**20:.2f} ({c})" for b, c in zip(w["stashing"], w["copies"], strict=True)]
            print(f"| {p} | {m} | {', '.join(mib)} | {', '.join(mare)} | {', '.join(stash)} |")


if __name__ == "__main__":
    main()
