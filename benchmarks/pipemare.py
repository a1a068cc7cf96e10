"""PipeMare: convergence, utilization, throughput and weight memory of asynchronous pipelining.

Convergence (C1 digits, C2 pysource), 4 stages on 4 local processes, seeds 0, 1, 2, final held-out accuracy
(and loss) per epoch for: synchronous 1F1B, naive asynchronous (pipemare), + learning-rate rescheduling,
+ discrepancy correction, + both, + both with one epoch of synchronous warm-up, and weight prediction (not
PipeMare's: forwards on w + tau * the last step's change); one microbatch per minibatch,
so the stages' delays are [3, 2, 1, 0] steps, Adam, the base rate annealed (--lr-schedule cosine) and
rescheduling spread over the whole run (K = its steps); C3 the other learning rates of SWEEPS for 1F1B, naive
and both (where naive asynchronous training falls short). PNGs of accuracy against epoch and against
wall-clock go to --png-dir.

C4 and C6 (the cost of staleness alone, on one process) are benchmarks/pipemare_staleness.py, C5 (what the
discrepancy correction does to the weights) benchmarks/pipemare_discrepancy.py. Then three tables:
  U1 simulated utilization at equal microbatch size, p in {4, 8}, m in {p/2, p, 2p}: pipemare over its steady
     window (`simulate pipemare --json`), gpipe and 1f1b as 1 - bubble fraction of their flushed iteration;
     forward 1 ms, backward 2 ms per microbatch per stage, no transfer time;
  U2 measured samples/s of `train --local p` (p in {2, 4}) for the built-in mlp on digits: pipemare (one
     asynchronous walk of all steps) against gpipe and 1f1b (median step after warm-up), equal microbatch size;
  U3 weight memory per stage for the same model split over p stages: PipeMare's two weight-sized buffers
     (weights and the discrepancy-correction velocity) against the copies weight stashing (PipeDream) keeps,
     counted from the same schedule's order (sim.delays), in bytes of the stage's parameters.

Usage: python benchmarks/pipemare.py [--steps 24] [--quick] [--png-dir docs/images] [--out pipemare.json]
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


SEEDS = (0, 1, 2)
# m = 1: the delays are [3, 2, 1, 0] (at m = 4 they are [1, 1, 1, 0], where rescheduling is the identity); the
# base rate anneals (cosine, PipeMare's α_k) and rescheduling spans the whole run (K = its steps); warm-up one epoch
DIGITS = {"args": ["--opt", "hidden=128", "--opt", "blocks=3", "--batch-size", "32", "-m", "1", "--lr-schedule", "cosine"],
          "epochs": 12, "lr": 1e-2, "k": 540, "d": 0.5, "warmup": 45}  # fmt: skip
PYSOURCE = {"args": ["--module", "charlm", "--opt", "layers=2", "--opt", "d_model=64", "--batch-size", "128", "-m", "1",
                     "--lr-schedule", "cosine"], "epochs": 4, "lr": 3e-3, "k": 256, "d": 0.5, "warmup": 64}  # fmt: skip
SWEEPS = {"digits": (3e-3,), "pysource": (1e-3, 1e-2)}
"""C3: the other learning rates each dataset's 1F1B, naive and both techniques run at."""
VARIANTS = ("1f1b", "naive", "lr", "dc", "lr+dc", "lr+dc+warm-up", "pred")
"""pred: --weight-prediction (forwards on predicted weights; beyond PipeMare's techniques, see C6)."""


def variant_args(variant: str, setting: dict[str, Any]) -> list[str]:
    """train flags of one variant: the schedule and PipeMare's switches."""
    if variant == "1f1b":
        return ["--schedule", "1f1b"]
    out = ["--schedule", "pipemare"]
    if "lr" in variant.split("+"):
        out += ["--lr-reschedule", str(setting["k"])]
    if "dc" in variant.split("+"):
        out += ["--discrepancy-decay", str(setting["d"])]
    if "pred" in variant.split("+"):
        out += ["--weight-prediction"]
    if variant.endswith("warm-up"):
        out += ["--sync-warmup", str(setting["warmup"])]
    return out


def converge(setting: dict[str, Any], variant: str, seed: int, lr: float | None = None) -> dict[str, Any]:
    """One run of `variant` on 4 local processes: its evaluations per epoch, losses and delays."""
    args = ["--local", "4", "-p", "4", *setting["args"], "--epochs", str(setting["epochs"]), "--lr", str(lr or setting["lr"]),
            "--seed", str(seed), "--eval", "--json", "-q", *variant_args(variant, setting)]  # fmt: skip
    got = json.loads(run(["train", *args]))
    return {"variant": variant, "seed": seed, "lr": lr or setting["lr"], "eval": got["eval"], "losses": got["losses"],
            "delays": got.get("delays")}  # fmt: skip


def study(name: str, setting: dict[str, Any], seeds: tuple[int, ...]) -> list[dict[str, Any]]:
    """Every variant x seed of one dataset (runs interleaved by seed, so drift spreads over the variants)."""
    runs = []
    for seed in seeds:
        for variant in VARIANTS:
            runs.append(converge(setting, variant, seed))
            print(f"  [{name}] {variant} seed {seed}: final test accuracy {runs[-1]['eval'][-1]['test_accuracy']:.3f}",
                  file=sys.stderr, flush=True)  # fmt: skip
    return runs


def mean_curve(runs: list[dict[str, Any]], key: str) -> list[float]:
    """The mean over runs of `key` at each evaluation."""
    return [statistics.mean(r["eval"][i][key] for r in runs) for i in range(len(runs[0]["eval"]))]


def convergence_table(name: str, runs: list[dict[str, Any]]) -> None:
    """Final accuracy and loss per variant (mean and spread over seeds), and the gap to 1F1B in points."""
    sync = statistics.mean(r["eval"][-1]["test_accuracy"] for r in runs if r["variant"] == "1f1b")
    print(f"\n{name}: held-out accuracy after the last epoch (mean over seeds {', '.join(str(s) for s in SEEDS)})\n")
    print("| variant | accuracy per epoch (mean) | final | min-max over seeds | final loss | gap to 1f1b (pp) | delays |")
    print("|---|---|---|---|---|---|---|")
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        finals = [r["eval"][-1]["test_accuracy"] for r in mine]
        curve = ", ".join(f"{a:.3f}" for a in mean_curve(mine, "test_accuracy"))
        loss = statistics.mean(r["eval"][-1]["test_loss"] for r in mine)
        gap = 100 * (statistics.mean(finals) - sync)
        print(
            f"| {variant} | {curve} | {statistics.mean(finals):.3f} | {min(finals):.3f}-{max(finals):.3f} | {loss:.3f} | "
            f"{gap:+.1f} | {mine[0]['delays'] or '-'} |"
        )


def plot(name: str, runs: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Accuracy against epoch and against wall-clock seconds, the mean over seeds per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for axis, label in (("epoch", "epoch"), ("elapsed_s", "wall-clock seconds")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for variant in VARIANTS:
            mine = [r for r in runs if r["variant"] == variant]
            ax.plot(mean_curve(mine, axis), mean_curve(mine, "test_accuracy"), marker="o", label=variant)
        ax.set_xlabel(label)
        ax.set_ylabel("held-out accuracy (mean of 3 seeds)")
        ax.set_title(f"PipeMare on {name}, 4 stages")
        ax.legend()
        path = folder / f"pipemare-{name}-{'epoch' if axis == 'epoch' else 'wallclock'}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


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
        got = json.loads(run(["train", *common, "--schedule", name]))
        out[name] = got["samples_per_s"] if name == "pipemare" else batch / (statistics.median(got["step_ms"][2:]) / 1000)
    return out


def weight_memory(p: int, m: int) -> dict[str, Any]:
    """U3: per stage, PipeMare's weight-sized buffers and weight stashing's copies, in bytes of the stage's params."""
    from pipeplan.core.partition import split_evenly
    from pipeplan.models.build import build_model
    from pipeplan.schedules.pipemare import default_minibatches, pipemare
    from pipeplan.sim.delays import stage_delays
    from pipeplan.sim.steady import WEIGHT_COPIES

    model = build_model("mlp", {"hidden": 256, "blocks": 7}, "digits")
    sizes = [sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in model.layers]
    params = [sum(sizes[a:b]) for a, b in split_evenly(len(sizes), p)]
    copies = stage_delays(pipemare(p, m, default_minibatches(p, m))).stashed_versions
    return {
        "params": params,
        "pipemare": [WEIGHT_COPIES * b for b in params],
        "stashing": [c * b for c, b in zip(copies, params, strict=True)],
        "copies": list(copies),
    }


def lr_sweep(name: str, setting: dict[str, Any], rates: tuple[float, ...], seeds: tuple[int, ...]) -> list[dict[str, Any]]:
    """C3: 1F1B, naive and both techniques at other learning rates; a table of final accuracies (mean over seeds)."""
    print(f"\nC3 learning-rate sweep on {name}: final held-out accuracy (mean over seeds)\n")
    print("| lr | 1f1b | naive | lr+dc |")
    print("|---|---|---|---|")
    sweep = []
    for lr in rates:
        cells = []
        for variant in ("1f1b", "naive", "lr+dc"):
            finals = [converge(setting, variant, seed, lr)["eval"][-1]["test_accuracy"] for seed in seeds]
            sweep.append({"lr": lr, "variant": variant, "finals": finals})
            cells.append(f"{statistics.mean(finals):.3f}")
        print(f"| {lr:g} | {' | '.join(cells)} |")
    return sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="training steps per measured run")
    parser.add_argument("--quick", action="store_true", help="p = 4 only, two processes only, one seed, no text study")
    parser.add_argument("--png-dir", default="docs/images", help="where the convergence PNGs go")
    parser.add_argument("--out", default=None, help="write every convergence run as JSON here")
    parser.add_argument("--skip-convergence", action="store_true", help="only the utilization, throughput and memory tables")
    args = parser.parse_args()
    if not args.skip_convergence:
        seeds = SEEDS[:1] if args.quick else SEEDS
        folder = ROOT / args.png_dir
        folder.mkdir(parents=True, exist_ok=True)
        everything: dict[str, Any] = {}
        for name, setting in (("digits", DIGITS),) if args.quick else (("digits", DIGITS), ("pysource", PYSOURCE)):
            runs = study(name, setting, seeds)
            everything[name] = runs
            convergence_table(name, runs)
            print("\nPNGs: " + ", ".join(str(p.relative_to(ROOT)) for p in plot(name, runs, folder)))
        everything["sweep"] = lr_sweep("digits", DIGITS, SWEEPS["digits"], seeds)
        if not args.quick:
            everything["sweep_pysource"] = lr_sweep("pysource", PYSOURCE, SWEEPS["pysource"], seeds)
        if args.out:
            Path(args.out).write_text(json.dumps(everything, indent=1))
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
