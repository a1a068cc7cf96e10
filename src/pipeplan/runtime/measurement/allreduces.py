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
    """One span as the JSON row `gather_allreduces` exchanges: [stage, start ms, end ms, bytes, nominal ms, bucket]."""
    return [span.stage, span.start_ms, span.end_ms, span.nbytes, span.nominal_ms, span.bucket]


def gather_allreduces(rows: list[list[float]], plan: Plan) -> list[dict[str, Any]] | None:
    """Every process's span rows (span_row, over the run's steps) on process 0, summed up per stage (stage_allreduces);
    None elsewhere. A collective call."""
    everyone = gather_json(rows)
    return None if everyone is None else stage_allreduces(everyone, plan)


def stage_allreduces(everyone: Sequence[Sequence[Sequence[float]]], plan: Plan) -> list[dict[str, Any]]:
    """Per stage with an all-reduce, in stage order: its ring's devices (the plan's), its bytes, its mean emulated time
    over the steps, the ring's time at the nominal rates, every step's [start, end] (trace ms) and its buckets.

    Every participant of an all-reduce recorded the same span, so each stage's are read from the first process that
    has them. A bucketed all-reduce's buckets (bucket 0 opens a step) make one step's span: from the first's start
    to the last's end, their bytes and nominal times summed (the buckets go over the ring one after another)."""
    by_stage: dict[int, list[Sequence[float]]] = {}
    for rows in everyone:
        mine: dict[int, list[Sequence[float]]] = {}
        for row in rows:
            mine.setdefault(int(row[0]), []).append(row)
        for stage, found in mine.items():
            by_stage.setdefault(stage, found)
    out = []
    for stage in sorted(by_stage):
        rows = _steps(by_stage[stage])
        out.append(
            {
                "stage": stage,
                "devices": list(plan.stages[stage].devices),
                "bytes": int(rows[-1][3]),
                "mean_ms": statistics.fmean(end - start for _, start, end, *_ in rows),
                "nominal_ms": rows[-1][4],
                "spans_ms": [[start, end] for _, start, end, *_ in rows],
                "buckets": int(rows[-1][5]),
            }
        )
    return out


def _steps(rows: Sequence[Sequence[float]]) -> list[list[float]]:
    """A stage's span rows with each step's buckets merged into one row [stage, first start, last end, bytes summed,
    nominal ms summed, buckets] (a row without a bucket index is a step of its own)."""
    steps: list[list[float]] = []
    for row in rows:
        bucket = int(row[5]) if len(row) > 5 else 0
        if bucket == 0 or not steps:
            steps.append([row[0], row[1], row[2], row[3], row[4], 1])
        else:
            last = steps[-1]
            last[2], last[3], last[4], last[5] = row[2], last[3] + row[3], last[4] + row[4], last[5] + 1
    return steps
