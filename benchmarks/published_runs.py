"""Published large training runs, and pipeplan's prediction of each one it can express.

Usage: .venv/bin/python benchmarks/published_runs.py [--json] [--matmul-fraction F]

Each row is a published configuration (model, tensor x pipeline x data parallel degrees, batch, GPUs) with the
throughput its authors reported and where. The harness prices each model with an analytic profile
(pipeplan.presets.gpt_profile: the linear layers' FLOPs at the GPU's measured matmul rate, the attention scores'
matmuls at the roofline, memory-bound operators' bytes at its measured HBM bandwidth, the work tensor parallelism
leaves whole on every rank) on the calibrated preset of its GPUs
(pipeplan.presets.calibrated), simulates the run's plan and reports the predicted TFLOP/s per GPU, counted as the
paper counts it: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs per iteration (Narayanan et al., SC'21, with
recomputation) over the iteration time and the GPUs. Each reported t x p x d grid is laid out as the Megatron-style baseline
lays it out (pipeplan.planner.baselines.megatron.megatron_plan: uniform stages, Megatron-LM's rank order, 1F1B or
interleaved 1F1B with the run's v model chunks per stage, no ZeRO, no sequence parallelism) at the run's own
microbatch size where its source gives one, else at the fastest fitting power of two (stated per row). The geomean
error is exp(mean |log(predicted / reported)|) - 1, over all rows and per source, with the worst row. Nothing is
fitted to the table; `--matmul-fraction F` is a what-if that prices the matmuls at F x peak instead of the GPU's
measured fraction (presets.calibrated).

Note:
    The Megatron-LM rows are Table 1 of Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
    Clusters Using Megatron-LM" (SC'21, arXiv 2104.04473): GPT models with s = 2048 and V = 51,200 on Selene
    (DGX A100 80GB, 8 HDR InfiniBand NICs per node). The table gives no microbatch size; each row's microbatch
    size, schedule and precision are those of the script NVIDIA published to reproduce the table,
    NVIDIA/Megatron-LM examples/sc21/run_table_1.sh (--micro-batch-size; --num-layers-per-virtual-pipeline-stage
    for the interleaved rows 76.1B, 145.6B, 310.1B and 529.6B; full recomputation, `--activations-checkpoint-method
    uniform`; fp16, examples/sc21/CONFIG.sh), whose t, p, GPUs, global batch, layers, hidden size and heads equal
    the table's. The reported TFLOP/s were typed from the paper (they check against its 502 PFLOP/s aggregate for
    the 1T: 163 x 3072 = 500.7). The stored copies of the paper's text found in this session give the abstract
    (502 PFLOP/s, 52 % of peak for the 1T on 3072 GPUs), which the 1T row matches; the other rows' TFLOP/s could
    not be checked against a stored copy of the table.

    Megatron-Turing NLG 530B (Smith et al., arXiv 2201.11990, section 2.4): t 8, p 35 on 280, 350 and 420 DGX A100
    80GB of Selene, global batch 1920, s 2048, 60.1 / 50.2 / 44.4 s per iteration = 126 / 121 / 113 TFLOP/s per
    GPU (as quoted with the configuration by cli99/llm-analysis, examples/megatron-turing-nlg/README.md; the paper's
    count is the 96 B s l h^2 formula: 126 at 2240 GPUs to 0.3 %). Its vocabulary is GPT-2's 50,257 padded by
    Megatron-LM to a multiple of 128 x t, 51,200; its microbatch size is not given here, so the fastest fitting
    power of two is used; DeepSpeed's pipeline runs 1F1B, not interleaved.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass

A100_PEAK_TFLOPS = 312.0
MEGATRON = "Narayanan et al., SC'21 (arXiv 2104.04473), Table 1"
SC21_SCRIPT = "https://github.com/NVIDIA/Megatron-LM/blob/main/examples/sc21/run_table_1.sh"
MT_NLG = "Smith et al., Megatron-Turing NLG 530B (arXiv 2201.11990), section 2.4"


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
    chunks: int = 1
    precision: str = "bf16"

    @property
    def gpus(self) -> int:
        """t x p x d."""
        return self.tp * self.pp * self.dp


def _megatron(
    name: str,
    heads: int,
    hidden: int,
    layers: int,
    tp: int,
    pp: int,
    gpus: int,
    batch: int,
    tflops: float,
    pct: float,
    micro: int,
    chunks: int,
) -> PublishedRun:
    """A row of Megatron-LM's Table 1 (s 2048, V 51,200, A100 80GB) with the microbatch size and model chunks per stage
    of NVIDIA's reproduction script (module note)."""
    return PublishedRun(
        name, MEGATRON, layers, hidden, heads, 2048, 51200, tp, pp, gpus // (tp * pp), batch, "A100-80GB", tflops, pct,
        micro, f"microbatch and chunks: {SC21_SCRIPT}", chunks, "fp16",
    )  # fmt: skip


def _mt_nlg(nodes: int, tflops: float) -> PublishedRun:
    """Megatron-Turing NLG 530B on `nodes` DGX A100 (module note)."""
    return PublishedRun(
        f"mt-nlg-530B-{nodes * 8}", MT_NLG, 105, 20480, 128, 2048, 51200, 8, 35, nodes * 8 // 280, 1920, "A100-80GB",
        tflops, tflops / A100_PEAK_TFLOPS * 100, None, "DeepSpeed 1F1B pipeline; microbatch: fastest fitting power of two",
    )  # fmt: skip


RUNS: tuple[PublishedRun, ...] = (
    _megatron("megatron-1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, 44, 16, 1),
    _megatron("megatron-3.6B", 32, 3072, 30, 2, 1, 64, 512, 138, 44, 16, 1),
    _megatron("megatron-7.5B", 32, 4096, 36, 4, 1, 128, 512, 142, 46, 16, 1),
    _megatron("megatron-18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 8, 1),
    _megatron("megatron-39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 4, 1),
    _megatron("megatron-76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 2, 3),
    _megatron("megatron-145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 2, 2),
    _megatron("megatron-310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 1, 2),
    _megatron("megatron-529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 1, 3),
    _megatron("megatron-1T", 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 1, 1),
    _mt_nlg(280, 126),
    _mt_nlg(350, 121),
    _mt_nlg(420, 113),
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


def _spec(run: PublishedRun, micro: int, matmul_fraction: float | None = None) -> str:
    """The analytic profile of `run` at microbatch size `micro` (presets.gpt_profile), at the GPU's measured matmul
    fraction or the one given."""
    fraction = "" if matmul_fraction is None else f",matmul_fraction={matmul_fraction:g}"
    return (
        f"gpt:layers={run.layers},hidden={run.hidden},heads={run.heads},seq={run.seq},vocab={run.vocab},micro={micro},"
        f"gpu={run.gpu},precision={run.precision}{fraction}"
    )


def _cluster_name(run: PublishedRun) -> str:
    """The calibrated preset of the run's GPUs: DGX servers of 8."""
    family = "a100" if run.gpu.startswith("A100") else "h100"
    return f"dgx-{family}-8x{max(1, run.gpus // 8)}"


def _micro_candidates(run: PublishedRun) -> list[int]:
    """The microbatch sizes to try: the paper's, else the powers of two dividing one copy's batch."""
    assert run.global_batch is not None
    if run.micro is not None:
        return [run.micro]
    replica = run.global_batch // run.dp
    return [b for b in (1 << i for i in range(replica.bit_length())) if replica % b == 0]


def predict(run: PublishedRun, matmul_fraction: float | None = None) -> dict[str, object]:
    """The run's row: reported numbers, and pipeplan's simulation of the reported t x p x d grid as the Megatron-style
    baseline lays it out (planner.baselines.megatron.megatron_plan: uniform stages, 1F1B or interleaved with the
    run's chunks, no ZeRO, no sequence parallelism) at the source's microbatch size, else at the fastest fitting
    power of two (the grid search's choice at the reported grid, stated in `micro_source`). `matmul_fraction`: a
    what-if in place of the GPU's measured one (presets.calibrated)."""
    row: dict[str, object] = {**asdict(run), "gpus": run.gpus, "predicted_tflops_per_gpu": None, "error": None}
    if run.global_batch is None or run.vocab is None:
        row["status"] = "incomplete: the source gives no batch or vocabulary"
        return row
    from pipeplan.core.errors import PipeplanError
    from pipeplan.planner.baselines.megatron import GridPoint, megatron_plan
    from pipeplan.planner.request import PlanRequest
    from pipeplan.planner.simulated import evaluate
    from pipeplan.presets.resolve import load_cluster, load_profile

    cluster = load_cluster(_cluster_name(run))
    best: tuple[float, int, object] | None = None
    refusal = ""
    for micro in _micro_candidates(run):
        request = PlanRequest(load_profile(_spec(run, micro, matmul_fraction)), cluster, run.global_batch, microbatch_size=micro)
        try:
            plan = megatron_plan(request, GridPoint(run.tp, run.pp, run.dp, micro, run.chunks))
            result, memory = evaluate(request, plan)
        except PipeplanError as exc:
            refusal = refusal or str(exc).splitlines()[0]
            continue
        if best is None or result.iteration_time < best[0]:
            best = (result.iteration_time, micro, max(memory))
    if best is None:
        row.update(status=f"no plan: {refusal}", cluster=cluster.name)
        return row
    iteration_ms, micro, peak = best
    predicted = megatron_flops(run) / (iteration_ms / 1e3) / run.gpus / 1e12
    row.update(
        status="simulated",
        cluster=cluster.name,
        micro=micro,
        micro_source="source" if run.micro is not None else "fastest fitting power of two at the reported grid",
        iteration_ms=iteration_ms,
        peak_memory_gib=peak / 2**30,
        predicted_tflops_per_gpu=predicted,
        error=predicted / run.tflops_per_gpu - 1 if run.tflops_per_gpu else None,
    )
    return row


def geomean_error(rows: list[dict[str, object]]) -> float | None:
    """The geometric mean of |predicted / reported - 1| ... as exp(mean |log(predicted / reported)|) - 1: the typical
    factor off, symmetric in over- and under-prediction; None when no row has both numbers."""
    logs = [abs(math.log(1 + float(row["error"]))) for row in rows if row["error"] is not None]  # type: ignore[arg-type]
    return math.exp(sum(logs) / len(logs)) - 1 if logs else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--matmul-fraction", type=float, default=None, metavar="F",
        help="what-if: price the matmuls at F x peak instead of the GPU's measured fraction (presets.calibrated)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    rows = [predict(run, args.matmul_fraction) for run in RUNS]
    geomean = geomean_error(rows)
    if args.json:
        print(json.dumps({"rows": rows, "geomean_error": geomean}, indent=2))
        return 0
    header = f"{'run':<24} {'t x p x d':>12} {'GPUs':>6} {'batch':>6} {'b':>3} {'reported':>9} {'predicted':>10} {'error':>7}"
    print(f"{header} {'GiB':>6}  status")
    for row in rows:
        grid = f"{row['tp']}x{row['pp']}x{row['dp']}"
        reported = "-" if row["tflops_per_gpu"] is None else f"{row['tflops_per_gpu']:.0f}"
        predicted = "-" if row["predicted_tflops_per_gpu"] is None else f"{row['predicted_tflops_per_gpu']:.1f}"
        error = "-" if row["error"] is None else f"{row['error']:+.0%}"
        batch = "-" if row["global_batch"] is None else str(row["global_batch"])
        micro = "-" if row["micro"] is None else str(row["micro"])
        memory = f"{row['peak_memory_gib']:.1f}" if "peak_memory_gib" in row else "-"
        print(
            f"{row['name']:<24} {grid:>12} {row['gpus']:>6} {batch:>6} {micro:>3} {reported:>9} {predicted:>10} {error:>7} "
            f"{memory:>6}  {row['status']}"
        )
    if geomean is not None:
        print(f"geomean error (exp(mean |log(predicted / reported)|) - 1): {geomean:.1%}")
        for source in dict.fromkeys(str(row["source"]) for row in rows):
            part = geomean_error([row for row in rows if row["source"] == source])
            if part is not None:
                print(f"  {source}: {part:.1%}")
        worst = max((row for row in rows if row["error"] is not None), key=lambda row: abs(math.log(1 + row["error"])))  # type: ignore[arg-type]
        print(f"worst: {worst['name']} ({worst['error']:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
