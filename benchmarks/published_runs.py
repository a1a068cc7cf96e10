"""Published large training runs, and pipeplan's prediction of each one it can express.

Usage: .venv/bin/python benchmarks/published_runs.py [--json]

Each row is a published configuration (model, tensor x pipeline x data parallel degrees, batch, GPUs) with the
throughput its authors reported and where. The harness prices each model with an analytic profile
(pipeplan.presets.gpt_profile: FLOPs at the GPU's measured matmul rate) on the calibrated preset of its GPUs
(pipeplan.presets.calibrated), simulates the run's plan and reports the predicted TFLOP/s per GPU, counted as the
paper counts it: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs per iteration (Narayanan et al., SC'21, with
recomputation) over the iteration time and the GPUs. A plan pipeplan cannot express yet (tensor parallelism,
t > 1) is reported as "needs TP", with no number.

Note:
    The Megatron-LM rows are Table 1 of Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
    Clusters Using Megatron-LM" (SC'21, arXiv 2104.04473): GPT models with s = 2048 and V = 51,200 on Selene
    (DGX A100 80GB, 8 HDR InfiniBand NICs per node). The table gives no microbatch size; where a row needs one
    here it is said in the row's note. Numbers were entered from the paper; check them against it before
    quoting them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

A100_PEAK_TFLOPS = 312.0
MEGATRON = "Narayanan et al., SC'21 (arXiv 2104.04473), Table 1"


@dataclass(frozen=True)
class PublishedRun:
    """One published run: its model, its t x p x d grid, its global batch, GPU kind and what its authors reported
    (TFLOP/s per GPU and share of peak; None where the source gives none)."""

    name: str
    source: str
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int | None
    tp: int
    pp: int
    dp: int
    global_batch: int | None
    gpu: str
    tflops_per_gpu: float | None
    percent_of_peak: float | None
    micro: int | None = None
    note: str = ""

    @property
    def gpus(self) -> int:
        """t x p x d."""
        return self.tp * self.pp * self.dp


def _megatron(
    name: str, heads: int, hidden: int, layers: int, tp: int, pp: int, gpus: int, batch: int, tflops: float, pct: float
) -> PublishedRun:
    """A row of Megatron-LM's Table 1 (s 2048, V 51,200, A100 80GB)."""
    micro = batch // (gpus // (tp * pp)) if tp * pp == 1 else None
    note = f"microbatch {micro} assumed: the table gives none (one microbatch per replica)" if micro else ""
    return PublishedRun(
        name, MEGATRON, layers, hidden, heads, 2048, 51200, tp, pp, gpus // (tp * pp), batch, "A100-80GB", tflops, pct,
        micro, note,
    )  # fmt: skip


RUNS: tuple[PublishedRun, ...] = (
    _megatron("megatron-1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, 44),
    _megatron("megatron-3.6B", 32, 3072, 30, 2, 1, 64, 512, 138, 44),
    _megatron("megatron-7.5B", 32, 4096, 36, 4, 1, 128, 512, 142, 46),
    _megatron("megatron-18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135, 43),
    _megatron("megatron-39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138, 44),
    _megatron("megatron-76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140, 45),
    _megatron("megatron-145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148, 47),
    _megatron("megatron-310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155, 50),
    _megatron("megatron-529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163, 52),
    _megatron("megatron-1T", 160, 25600, 128, 8, 64, 3072, 3072, 163, 52),
    PublishedRun(
        name="bloom-176B",
        source="Le Scao et al., BLOOM (arXiv 2211.05100), sections 3.4-3.5: 156 TFLOP/s in the fastest configuration",
        layers=70,
        hidden=14336,
        heads=112,
        seq=2048,
        vocab=250880,
        tp=4,
        pp=12,
        dp=8,
        global_batch=2048,
        gpu="A100-80GB",
        tflops_per_gpu=156,
        percent_of_peak=156 / A100_PEAK_TFLOPS * 100,
        micro=2,
        note="Jean Zay: 48 nodes x 8 A100 80GB, 4 x 100 Gb/s Omni-Path per node: a slower network than dgx-a100-8x48's",
    ),
    PublishedRun(
        name="mlperf-gpt3-175B-h100",
        source="NVIDIA, MLPerf Training v3.1 GPT-3 175B on 10,752 H100 (Eos), as issue 34 states the grid",
        layers=96,
        hidden=12288,
        heads=96,
        seq=2048,
        vocab=None,
        tp=4,
        pp=8,
        dp=336,
        global_batch=None,
        gpu="H100",
        tflops_per_gpu=None,
        percent_of_peak=None,
        note="MLPerf reports time to train, not TFLOP/s per GPU; the vocabulary and batch are not recorded here",
    ),
)


def megatron_flops(run: PublishedRun) -> float:
    """FLOPs of one iteration as Narayanan et al. count them (with recomputation): 96 B s l h^2 (1 + s/6h + V/16lh)."""
    assert run.global_batch is not None and run.vocab is not None
    b, s, n, h, v = run.global_batch, run.seq, run.layers, run.hidden, run.vocab
    return 96.0 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))


def predict(run: PublishedRun) -> dict[str, object]:
    """The run's row: reported numbers, and pipeplan's simulated TFLOP/s per GPU where a plan can express it."""
    row: dict[str, object] = {**asdict(run), "gpus": run.gpus, "predicted_tflops_per_gpu": None, "error": None}
    if run.tp > 1:
        row["status"] = "needs TP"
        return row
    if run.global_batch is None or run.vocab is None or run.micro is None:
        row["status"] = "incomplete: the source gives no batch, vocabulary or microbatch"
        return row
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.presets.resolve import load_cluster, load_profile
    from pipeplan.sim.cost.model import CostModel
    from pipeplan.sim.plan_sim import simulate_plan

    spec = f"gpt:layers={run.layers},hidden={run.hidden},heads={run.heads},seq={run.seq},vocab={run.vocab},micro={run.micro},gpu={run.gpu}"  # noqa: E501
    profile = load_profile(spec)
    family = "a100" if run.gpu.startswith("A100") else "h100"
    cluster = load_cluster(f"dgx-{family}-8x{max(1, run.gpus // 8)}")
    per_stage = -(-profile.num_layers // run.pp)
    bounds = [(i * per_stage, min(profile.num_layers, (i + 1) * per_stage) - 1) for i in range(run.pp)]
    stages = tuple(Stage(first, last, tuple(t * run.pp + s for t in range(run.dp))) for s, (first, last) in enumerate(bounds))
    microbatches = run.global_batch // (run.dp * run.micro)
    plan = Plan(stages, run.dp, microbatches, run.micro, "1f1b")
    result = simulate_plan(plan, CostModel.build(profile, cluster), record=False)
    predicted = megatron_flops(run) / (result.iteration_time / 1e3) / run.gpus / 1e12
    row.update(
        status="simulated",
        cluster=cluster.name,
        iteration_ms=result.iteration_time,
        predicted_tflops_per_gpu=predicted,
        error=predicted / run.tflops_per_gpu - 1 if run.tflops_per_gpu else None,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    rows = [predict(run) for run in RUNS]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'run':<24} {'t x p x d':>12} {'GPUs':>6} {'batch':>6} {'reported':>9} {'predicted':>10} {'error':>7}  status")
    for row in rows:
        grid = f"{row['tp']}x{row['pp']}x{row['dp']}"
        reported = "-" if row["tflops_per_gpu"] is None else f"{row['tflops_per_gpu']:.0f}"
        predicted = "-" if row["predicted_tflops_per_gpu"] is None else f"{row['predicted_tflops_per_gpu']:.1f}"
        error = "-" if row["error"] is None else f"{row['error']:+.0%}"
        batch = "-" if row["global_batch"] is None else str(row["global_batch"])
        print(
            f"{row['name']:<24} {grid:>12} {row['gpus']:>6} {batch:>6} {reported:>9} {predicted:>10} {error:>7}  {row['status']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
