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
        {"stage": 0, "devices": [0, 1], "bytes": 100, "mean_ms": 4.0, "nominal_ms": 2.0, "spans_ms": [[1.0, 3.0], [10.0, 16.0]],
         "buckets": 1},
        {"stage": 2, "devices": [4, 3], "bytes": 64, "mean_ms": 1.5, "nominal_ms": 1.5, "spans_ms": [[5.0, 6.5]], "buckets": 1},
    ]  # fmt: skip
    assert stage_allreduces([[], [], []], PLAN) == []


def test_a_steps_buckets_make_one_span_from_the_first_start_to_the_last_end() -> None:
    """Stage 0's all-reduce in 3 buckets over 2 steps (bucket 0 opens a step): per step one span from bucket 0's
    start to bucket 2's end, the bytes and nominal times summed, and 3 buckets."""
    rows = []
    for offset in (0.0, 100.0):
        rows += [span_row(AllReduceSpan(0, offset + 1.0, offset + 2.0, 10, 0.5, 0)),
                 span_row(AllReduceSpan(0, offset + 2.5, offset + 4.0, 20, 1.0, 1)),
                 span_row(AllReduceSpan(0, offset + 4.0, offset + 7.0, 30, 2.0, 2))]  # fmt: skip
    (summary,) = stage_allreduces([rows, rows], PLAN)
    assert summary == {"stage": 0, "devices": [0, 1], "bytes": 60, "mean_ms": 6.0, "nominal_ms": 3.5,
                       "spans_ms": [[1.0, 7.0], [101.0, 107.0]], "buckets": 3}  # fmt: skip
