"""Tests of benchmarks/published_runs.py: its table's grids, its FLOP count, and no number where TP is needed."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

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
    assert all(run.source for run in runs.RUNS)


def test_the_paper_count_is_the_analytic_profile_summed_over_the_batch() -> None:
    """96 B s l h^2 (1 + s/6h + V/16lh) equals gpt_profile's per-microbatch FLOPs times the microbatches."""
    run = runs.RUNS[0]
    config = GptConfig(run.layers, run.hidden, run.heads, run.seq, run.vocab, micro=16)
    assert math.isclose(runs.megatron_flops(run), iteration_flops(config) * run.global_batch / 16, rel_tol=1e-12)


def test_runs_needing_tensor_parallelism_get_no_number_and_the_rest_a_simulation() -> None:
    """Every t > 1 row says "needs TP" with no prediction; the 1 x 1 x 32 row is simulated on dgx-a100-8x4."""
    rows = {row["name"]: row for row in (runs.predict(run) for run in runs.RUNS)}
    for run in runs.RUNS:
        if run.tp > 1:
            assert rows[run.name]["status"] == "needs TP" and rows[run.name]["predicted_tflops_per_gpu"] is None
    first = rows["megatron-1.7B"]
    assert first["status"] == "simulated" and first["cluster"] == "dgx-a100-8x4"
    # No plan beats every FLOP at the measured matmul rate: 312 x 0.859 TFLOP/s.
    assert 0 < first["predicted_tflops_per_gpu"] <= 312 * 0.859
