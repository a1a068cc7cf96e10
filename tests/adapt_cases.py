"""Shared inputs of the adapt tests: a pipeline as plain numbers, and a real plan across a slow inter-node link."""

from __future__ import annotations

from typing import Any

from pipeplan.core.plan import Plan, Stage
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.model import CostModel


def numbers(p: int, m: int, gb_per_s: float = 1.0, activation_bytes: float = 0.0, limit: float = 16e9) -> dict[str, Any]:
    """from_measurements arguments: F = 1 ms, B = 2 ms, 1 MB per microbatch over 1 GB/s (1 ms) on devices 0..p-1."""
    return {
        "fwd_ms": [1.0] * p,
        "bwd_ms": [2.0] * p,
        "boundary_bytes": [1e6] * (p - 1),
        "boundary_links": [(s, s + 1) for s in range(p - 1)],
        "bandwidth_gb_per_s": [gb_per_s] * (p - 1),
        "static_bytes": [0.0] * p,
        "activation_bytes": [activation_bytes] * p,
        "memory_limit_bytes": [limit] * p,
        "microbatches": m,
    }


def bert_plan(microbatches: int = 16) -> tuple[Plan, CostModel]:
    """dapple/bert-48 in 4 stages on devices 6, 7 | 8, 9 of v100-8x2-25g: boundary 1 crosses the 25 Gb/s NICs."""
    model = CostModel.build(load_profile("dapple/bert-48"), load_cluster("v100-8x2-25g"))
    stages = (Stage(0, 13, (6,)), Stage(14, 26, (7,)), Stage(27, 39, (8,)), Stage(40, 52, (9,)))
    return Plan(stages, 1, microbatches, 2, "1f1b"), model


RING_FACTOR = 1.01**-100
"""A factor on the predictor's 1 % grid (0.3697...): a prediction under its estimate rounds to this very float."""


def replicated_plan(microbatches: int = 16) -> tuple[Plan, CostModel]:
    """dapple/bert-48 in 4 stages of 2 devices each (4,5 | 6,7 | 8,9 | 10,11) of v100-8x2-25g: each stage's all-reduce
    rings its pair, links no transfer uses (transfers pair replica with replica: 4->6, 5->7, ...)."""
    model = CostModel.build(load_profile("dapple/bert-48"), load_cluster("v100-8x2-25g"))
    stages = (Stage(0, 13, (4, 5)), Stage(14, 26, (6, 7)), Stage(27, 39, (8, 9)), Stage(40, 52, (10, 11)))
    return Plan(stages, 1, microbatches, 2, "1f1b"), model
