"""Tests of benchmarks/adaptive.py's measure over a replayed log's span (work_rate, log_span_ms)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
from pipeplan.sim.engine.iterations import IterationRun

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "adaptive.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("adaptive_benchmark", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["adaptive_benchmark"] = module
    spec.loader.exec_module(module)
    return module


bench = load()


def _run(*durations: float, gap: float = 0.0) -> IterationRun:
    """Iterations back to back (each start `gap` ms after the last one's end), no memory."""
    starts, t = [], 0.0
    for d in durations:
        starts.append(t)
        t += d + gap
    return IterationRun(tuple(starts), tuple(durations), (0.0,) * len(durations))


def test_a_run_inside_the_span_or_without_one_is_its_iterations_over_its_total_time() -> None:
    """Ending before the log does, or with no log, a run's rate is n / total: the whole-run ratio is unchanged."""
    run = _run(10.0, 20.0, 30.0)
    assert bench.work_rate(run, None) == 3 / 60.0
    assert bench.work_rate(run, 60.0) == 3 / 60.0 and bench.work_rate(run, 1e9) == 3 / 60.0


def test_a_run_past_the_span_counts_the_iteration_in_progress_by_its_elapsed_share() -> None:
    """Span 45 ms over iterations [0, 10), [10, 30), [30, 60): 1 + 1 + 15/30 iterations in 45 ms; a switch's gap
    between iterations counts no work."""
    assert bench.work_rate(_run(10.0, 20.0, 30.0), 45.0) == pytest.approx(2.5 / 45.0, abs=1e-15)
    assert bench.work_rate(_run(10.0, 10.0, 10.0, gap=5.0), 12.0) == pytest.approx(1.0 / 12.0, abs=1e-15)


def test_only_the_replayed_logs_have_a_span() -> None:
    """The log families end at their last sample; the generated ones (defined at every time) have none."""
    trace = BandwidthTrace((TraceStep(0.0, None, 1.0), TraceStep(250.0, None, 0.5)))
    assert [bench.log_span_ms(name, trace) for name in ("replay", "ferry-250ms", "bus-1s")] == [250.0] * 3
    assert [bench.log_span_ms(name, trace) for name in ("periodic", "markov", "oscillating", "flip", "drift")] == [None] * 5
