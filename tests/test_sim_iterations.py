"""sim.iterations and simulate's offset: many iterations on one trace clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.schedules import make_schedule
from pipeplan.sim import simulate, uniform_costs
from pipeplan.sim.engine.iterations import simulate_iterations
from pipeplan.sim.trace import bandwidth_trace_from_json


def test_under_factor_one_n_iterations_take_n_times_one() -> None:
    """A trace that keeps every link at nominal: N iterations end at N x the single-iteration time."""
    schedule = make_schedule("1f1b", 4, 8)
    costs = uniform_costs(schedule, 1.0, 2.0, comm=0.5)
    single = simulate(schedule, costs).iteration_time
    trace = bandwidth_trace_from_json([{"t_ms": 0, "link": "all", "factor": 1.0}, {"t_ms": 500, "link": "all", "factor": 1.0}])
    run = simulate_iterations(schedule, costs, trace, 7)
    assert run.total_ms == pytest.approx(7 * single)
    assert run.iteration_ms == pytest.approx((single,) * 7)
    assert run.start_ms == pytest.approx(tuple(i * single for i in range(7)))
    assert simulate_iterations(schedule, costs, None, 7).total_ms == 7 * single


def test_a_later_slowdown_hits_only_the_iterations_that_run_into_it() -> None:
    """Links slowed from t = 100 ms on: iterations ending before are nominal, later ones slower, peaks unchanged."""
    schedule = make_schedule("gpipe", 2, 4)
    costs = uniform_costs(schedule, 1.0, 1.0, comm=2.0, act_bytes=10.0)
    single = simulate(schedule, costs).iteration_time
    trace = bandwidth_trace_from_json([{"t_ms": 100, "link": "all", "factor": 0.5}])
    run = simulate_iterations(schedule, costs, trace, 12)
    slow = simulate(schedule, costs, bandwidth_trace_from_json([{"t_ms": 0, "link": "all", "factor": 0.5}])).iteration_time
    for start, time in zip(run.start_ms, run.iteration_ms, strict=True):
        if start + time <= 100:
            assert time == single
        if start >= 100:
            assert time == pytest.approx(slow)
    assert set(run.peak_bytes) == {40.0}


@given(
    offset=st.floats(0.0, 60.0),
    steps=st.lists(
        st.tuples(
            st.sampled_from([0.0, 3.0, 11.0, 20.0, 37.0]),
            st.sampled_from(["all", (0, 1), (1, 0), (1, 2)]),
            st.sampled_from([0.25, 0.5, 2.0]),
        ),
        max_size=4,
    ),
)
def test_offset_equals_simulating_the_shifted_trace(offset: float, steps: list[tuple[float, object, float]]) -> None:
    """simulate(offset_ms=t) gives the times of the trace shifted so that t is 0 (one clock, two ways to read it)."""
    schedule = make_schedule("kfkb", 3, 6, k=2)
    costs = uniform_costs(schedule, 1.0, 2.0, comm=1.5)
    entries = [
        {"t_ms": t, "link": link if link == "all" else list(link), "factor": f}
        for t, link, f in sorted(steps, key=lambda s: s[0])
    ]
    trace = bandwidth_trace_from_json(entries)
    moved = simulate(schedule, costs, trace, offset_ms=offset)
    shifted = simulate(schedule, costs, trace.shifted(offset))
    assert moved.iteration_time == pytest.approx(shifted.iteration_time, rel=1e-9, abs=1e-9)
    assert [t.end_ms for t in moved.transfers] == pytest.approx([t.end_ms for t in shifted.transfers], rel=1e-9, abs=1e-9)
