"""runtime.measurement.allreduces: every process's emulated all-reduce spans summed up per stage for train's report."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from pipeplan.core.plan import Plan, Stage
from pipeplan.runtime.execution.replicas import AllReduceSpan
from pipeplan.runtime.measurement.allreduces import span_row, stage_allreduces

pytestmark = pytest.mark.torch

PLAN = Plan((Stage(0, 0, (0, 1)), Stage(1, 1, (2,)), Stage(2, 3, (4, 3))), 1, 2, 2, "1f1b")


def test_each_stage_is_summed_up_once_from_its_first_participant() -> None:
    """Stage 2 (devices [4, 3]) recorded by two processes and stage 0 by two: per stage in order, its devices, bytes,
    mean span over the steps, nominal ms and spans; a process with none (stage 1, alone) adds nothing."""
    stage0 = [span_row(AllReduceSpan(0, 1.0, 3.0, 100, 2.0)), span_row(AllReduceSpan(0, 10.0, 16.0, 100, 2.0))]
    stage2 = [span_row(AllReduceSpan(2, 5.0, 6.5, 64, 1.5))]
    summary = stage_allreduces([stage0, stage0, [], stage2, stage2], PLAN)
    assert summary == [
        {"stage": 0, "devices": [0, 1], "bytes": 100, "mean_ms": 4.0, "nominal_ms": 2.0, "spans_ms": [[1.0, 3.0], [10.0, 16.0]]},
        {"stage": 2, "devices": [4, 3], "bytes": 64, "mean_ms": 1.5, "nominal_ms": 1.5, "spans_ms": [[5.0, 6.5]]},
    ]
    assert stage_allreduces([[], [], []], PLAN) == []
