"""sim.iterations and simulate's offset: many iterations on one trace clock."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.schedule import Schedule
from pipeplan.io.bandwidth_trace_json import bandwidth_trace_from_json
from pipeplan.schedules import make_schedule
from pipeplan.sim import simulate, uniform_costs
from pipeplan.sim.cost.types import Costs
from pipeplan.sim.engine.iterations import Reuse, simulate_iterations, trace_changes


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


def brute_run(schedule: Schedule, costs: Costs, trace: BandwidthTrace | None, iterations: int) -> list[float]:
    """Every iteration simulated at its own offset, none reused: the reference for Reuse."""
    t, times = 0.0, []
    for _ in range(iterations):
        times.append(simulate(schedule, costs, trace, record=False, offset_ms=t).iteration_time)
        t += times[-1]
    return times


def counting(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the offset of every full simulation simulate_iterations runs."""
    import pipeplan.sim.engine.iterations as iterations_module

    calls: list[float] = []
    real = iterations_module.simulate

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(float(kwargs["offset_ms"]))  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(iterations_module, "simulate", spy)
    return calls


@pytest.mark.parametrize("far", [1e300, 1e18, 5e6])
def test_a_step_past_the_runs_end_changes_nothing_and_costs_no_simulation(far: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step at t = 1e300 (or anywhere past the run's end): the same run as without it, each set of factors simulated
    once (two here: before and after the slowdown at 100 ms), not every iteration."""
    schedule = make_schedule("1f1b", 3, 6)
    costs = uniform_costs(schedule, 1.0, 2.0, comm=1.5)
    base = [{"t_ms": 100.0, "link": "all", "factor": 0.5}]
    with_far = bandwidth_trace_from_json([*base, {"t_ms": far, "link": "all", "factor": 0.25}])
    calls = counting(monkeypatch)
    far_run = simulate_iterations(schedule, costs, with_far, 300)
    far_calls = len(calls)
    assert simulate_iterations(schedule, costs, bandwidth_trace_from_json(base), 300) == far_run
    assert far_calls == len(calls) - far_calls <= 3
    assert far_run.total_ms < far
    assert list(far_run.iteration_ms) == pytest.approx(brute_run(schedule, costs, with_far, 300), rel=1e-12)


@given(
    st.lists(
        st.tuples(st.floats(0.0, 400.0), st.sampled_from(["all", (0, 1), (1, 2), (2, 1)]), st.sampled_from([0.25, 0.5, 1.0])),
        max_size=6,
    ),
    st.integers(1, 40),
)
@settings(max_examples=40, deadline=None)
def test_reuse_equals_simulating_every_iteration_within_2_changes_plus_1(
    steps: list[tuple[float, object, float]], iterations: int
) -> None:
    """Any trace: the run equals simulating each iteration at its offset, with at most 2 x changes + 1 simulations."""
    schedule = make_schedule("kfkb", 3, 4, k=2)
    costs = uniform_costs(schedule, 1.0, 2.0, comm=1.0)
    entries = [
        {"t_ms": t, "link": link if link == "all" else list(link), "factor": f}
        for t, link, f in sorted(steps, key=lambda s: s[0])
    ]  # type: ignore[call-overload]
    trace = bandwidth_trace_from_json(entries)
    reuse = Reuse(costs, trace)
    t, times = 0.0, []
    for _ in range(iterations):
        known = reuse.known(t)
        if known is None:
            known = reuse.keep(t, simulate(schedule, costs, trace, record=False, offset_ms=t))
        times.append(known[0])
        t += known[0]
    assert times == pytest.approx(brute_run(schedule, costs, trace, iterations), rel=1e-9)
    assert reuse.simulated <= min(iterations, 2 * trace_changes(trace) + 1)
    assert list(simulate_iterations(schedule, costs, trace, iterations).iteration_ms) == times


def test_a_change_on_a_ring_link_alone_is_not_reused_past() -> None:
    """A trace that slows only a stage's all-reduce ring: Reuse counts the ring's links as used, so the iterations
    after the step run slower, as simulating each one at its offset gives; they record each stage's all-reduce."""
    schedule = make_schedule("1f1b", 2, 4)
    costs = uniform_costs(schedule, 1.0, 2.0, comm=0.5)
    ring = dataclasses.replace(costs.stages[0], allreduce_ms=5.0, allreduce_latency_ms=1.0, allreduce_ring=(7, 8))
    costs = dataclasses.replace(costs, stages=(ring, costs.stages[1]))
    trace = bandwidth_trace_from_json([{"t_ms": 60, "link": [8, 7], "factor": 0.25}])
    run = simulate_iterations(schedule, costs, trace, 6)
    assert list(run.iteration_ms) == brute_run(schedule, costs, trace, 6)
    assert run.iteration_ms[0] < run.iteration_ms[-1] == run.iteration_ms[0] + 4.0 * 3
    assert run.allreduce_ms[0] == (5.0, 0.0) and run.allreduce_ms[-1] == (1.0 + 4.0 / 0.25, 0.0)
