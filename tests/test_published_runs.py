"""Tests of benchmarks/published_runs.py: its table's grids, its FLOP count, and no number where TP is needed."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

from pipeplan.presets.calibrated import A100_MATMUL_FRACTION
from pipeplan.presets.gpt_profile import GptConfig, iteration_flops

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "published_runs.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("published_runs", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["published_runs"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


runs = load()


def test_grids_multiply_to_the_published_gpu_counts() -> None:
    """Megatron's t x p x d give its GPU column; BLOOM's 4 x 12 x 8 is 384; MLPerf's 4 x 8 x 336 is 10,752."""
    gpus = {run.name: run.gpus for run in runs.RUNS}
    megatron = [gpus[f"megatron-{n}"] for n in ("1.7B", "3.6B", "7.5B", "18.4B", "39.1B", "76.1B", "145.6B", "310.1B")]
    assert megatron == [32, 64, 128, 256, 512, 1024, 1536, 1920]
    assert gpus["megatron-529.6B"] == 2520 and gpus["megatron-1T"] == 3072
    assert gpus["bloom-176B"] == 384 and gpus["mlperf-gpt3-175B-h100"] == 10752
    assert [gpus[f"mt-nlg-530B-{n}"] for n in (2240, 2800, 3360)] == [2240, 2800, 3360]
    assert all(run.source for run in runs.RUNS)


def test_megatron_rows_take_the_reproduction_scripts_microbatch_and_chunks() -> None:
    """NVIDIA's examples/sc21/run_table_1.sh: microbatch 16, 16, 16, 8, 4, 2, 2, 1, 1, 1 and, from
    --num-layers-per-virtual-pipeline-stage (5, 5, 3, 1 layers), v = 60/(4 x 5) = 3, 80/(8 x 5) = 2, 96/(16 x 3) = 2,
    105/(35 x 1) = 3 chunks; the others 1F1B. Each interleaved row has m a multiple of p."""
    megatron = [run for run in runs.RUNS if run.name.startswith("megatron-")]
    assert [run.micro for run in megatron] == [16, 16, 16, 8, 4, 2, 2, 1, 1, 1]
    assert [run.chunks for run in megatron] == [1, 1, 1, 1, 1, 3, 2, 2, 3, 1]
    for run in megatron:
        assert run.layers % (run.pp * run.chunks) == 0 and run.precision == "fp16"
        if run.chunks > 1:
            assert (run.global_batch // (run.dp * run.micro)) % run.pp == 0


def test_the_mt_nlg_rows_reported_rate_is_the_papers_iteration_time_under_the_96_formula() -> None:
    """126 / 121 / 113 TFLOP/s are 96 B s l h^2 (1 + s/6h + V/16lh) over 60.1 / 50.2 / 44.4 s per iteration: to 1 %."""
    for run, seconds in zip([r for r in runs.RUNS if r.name.startswith("mt-nlg")], (60.1, 50.2, 44.4), strict=True):
        assert math.isclose(runs.megatron_flops(run) / seconds / run.gpus / 1e12, run.tflops_per_gpu, rel_tol=0.01)


def test_the_paper_count_is_the_analytic_profile_summed_over_the_batch() -> None:
    """96 B s l h^2 (1 + s/6h + V/16lh) equals gpt_profile's per-microbatch FLOPs times the microbatches."""
    run = runs.RUNS[0]
    config = GptConfig(run.layers, run.hidden, run.heads, run.seq, run.vocab, micro=16)
    assert math.isclose(runs.megatron_flops(run), iteration_flops(config) * run.global_batch / 16, rel_tol=1e-12)


def test_every_row_with_a_batch_and_vocabulary_is_simulated_on_its_dgx_preset() -> None:
    """Each Megatron, MT-NLG and the BLOOM row is simulated on dgx-<gpu>-8x(GPUs/8) at its reported grid; MLPerf's (no batch,
    no vocabulary) is not. No plan beats every FLOP at the measured matmul rate, 312 x 0.737 TFLOP/s; BLOOM keeps its
    paper's microbatch 2 and Megatron's rows their script's, MT-NLG's say theirs was searched."""
    rows = {row["name"]: row for row in (runs.predict(run) for run in runs.RUNS)}
    for run in runs.RUNS:
        row = rows[run.name]
        if run.vocab is None:
            assert row["status"].startswith("incomplete") and row["predicted_tflops_per_gpu"] is None
            continue
        assert row["status"] == "simulated" and row["cluster"] == f"dgx-a100-8x{run.gpus // 8}"
        assert 0 < row["predicted_tflops_per_gpu"] <= 312 * A100_MATMUL_FRACTION
        assert math.isclose(row["error"], row["predicted_tflops_per_gpu"] / run.tflops_per_gpu - 1, rel_tol=1e-12)
    assert rows["bloom-176B"]["micro"] == 2 and rows["bloom-176B"]["micro_source"] == "source"
    assert rows["megatron-1T"]["micro_source"] == "source"
    assert rows["mt-nlg-530B-2240"]["micro_source"].startswith("fastest fitting")


def test_the_reported_grid_is_laid_out_by_the_megatron_baseline() -> None:
    """The 1.7B row's iteration is the megatron baseline's plan of 1 x 1 x 32 at the row's microbatch, simulated (on
    the row's fp16 profile: its gradients all-reduced in 16 bits)."""
    from pipeplan.planner.baselines.megatron import GridPoint, megatron_plan
    from pipeplan.planner.request import PlanRequest
    from pipeplan.presets.resolve import load_cluster, load_profile
    from pipeplan.sim.plan_sim import simulate_plan

    run = runs.RUNS[0]
    row = runs.predict(run)
    assert run.precision == "fp16"
    spec = f"gpt:layers=24,hidden=2304,heads=24,seq=2048,vocab=51200,micro={row['micro']},gpu=A100-80GB,precision=fp16"
    request = PlanRequest(load_profile(spec), load_cluster("dgx-a100-8x4"), 512)
    plan = megatron_plan(request, GridPoint(1, 1, 32, row["micro"]))
    assert simulate_plan(plan, request.model).iteration_time == row["iteration_ms"]


def test_the_geomean_error_is_the_typical_factor_off() -> None:
    """Errors +100 % and -50 % are both a factor 2 off: the geomean is 100 %; rows without an error are skipped."""
    rows = [{"error": 1.0}, {"error": -0.5}, {"error": None}]
    assert math.isclose(runs.geomean_error(rows), 1.0, rel_tol=1e-12)
    assert runs.geomean_error([{"error": None}]) is None


def test_a_what_if_matmul_fraction_prices_the_profile_at_that_rate() -> None:
    """--matmul-fraction F names the profile with matmul_fraction=F (the GPU's measured one otherwise): the 1.7B's
    iteration (one data-parallel step of 16 samples, no pipeline) is longer at 0.5 than at the measured 0.737."""
    run = runs.RUNS[0]
    assert runs._spec(run, 16).endswith("precision=fp16")
    assert runs._spec(run, 16, 0.5).endswith("precision=fp16,matmul_fraction=0.5")
    assert runs.predict(run, 0.5)["iteration_ms"] > runs.predict(run)["iteration_ms"]
