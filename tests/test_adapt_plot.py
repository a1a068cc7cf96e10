"""viz.adapt_plot: the bandwidth panel of `adapt --png` draws every traced link of the pipeline's traffic."""

from __future__ import annotations

import pytest

from adapt_cases import replicated_plan
from pipeplan.adapt import PipelineModel
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
from pipeplan.viz.adapt_plot import _bandwidth_steps


def test_a_traced_all_reduce_ring_link_is_drawn_at_its_factor_times_its_nominal_rate() -> None:
    """A trace on a transfer's link and on a ring link only an all-reduce uses: both lines, each at factor x nominal."""
    plan, model = replicated_plan()
    pipeline = PipelineModel.from_plan(plan, model)
    trace = BandwidthTrace((TraceStep(0.0, (4, 5), 0.25), TraceStep(0.0, (4, 6), 0.5)))
    lines = _bandwidth_steps(trace, pipeline, 1000.0)
    assert set(lines) == {"4->6", "4->5"}
    assert lines["4->5"] == ([0.0, 1.0], [pytest.approx(0.25 * pipeline.nominal_gb_per_s((4, 5)))] * 2)
    assert lines["4->6"][1][0] == pytest.approx(0.5 * pipeline.nominal_gb_per_s((4, 6)))
