"""The emulated data-parallel all-reduces a run measured, per stage: every process's spans gathered to process 0 and
summed up for train's report (the mean over steps beside the ring's time at the nominal rates)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from pipeplan.core.plan import Plan
from pipeplan.runtime.execution.replicas import AllReduceSpan
from pipeplan.runtime.transport.exchange import gather_json


def span_row(span: AllReduceSpan) -> list[float]:
    """One span as the JSON row `gather_allreduces` exchanges: [stage, start ms, end ms, bytes, nominal ms]."""
    return [span.stage, span.start_ms, span.end_ms, span.nbytes, span.nominal_ms]


def gather_allreduces(rows: list[list[float]], plan: Plan) -> list[dict[str, Any]] | None:
    """Every process's span rows (span_row, over the run's steps) on process 0, summed up per stage (stage_allreduces);
    None elsewhere. A collective call."""
    everyone = gather_json(rows)
    return None if everyone is None else stage_allreduces(everyone, plan)


def stage_allreduces(everyone: Sequence[Sequence[Sequence[float]]], plan: Plan) -> list[dict[str, Any]]:
    """Per stage with an all-reduce, in stage order: its ring's devices (the plan's), its bucket's bytes, its mean
    emulated time over the steps, the ring's time at the nominal rates and every step's [start, end] (trace ms).

    Every participant of an all-reduce recorded the same span, so each stage's are read from the first process that
    has them."""
    by_stage: dict[int, list[Sequence[float]]] = {}
    for rows in everyone:
        mine: dict[int, list[Sequence[float]]] = {}
        for row in rows:
            mine.setdefault(int(row[0]), []).append(row)
        for stage, found in mine.items():
            by_stage.setdefault(stage, found)
    out = []
    for stage in sorted(by_stage):
        rows = by_stage[stage]
        out.append(
            {
                "stage": stage,
                "devices": list(plan.stages[stage].devices),
                "bytes": int(rows[-1][3]),
                "mean_ms": statistics.fmean(end - start for _, start, end, *_ in rows),
                "nominal_ms": rows[-1][4],
                "spans_ms": [[start, end] for _, start, end, *_ in rows],
            }
        )
    return out
