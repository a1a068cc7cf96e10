"""Tests of sim.steady: the steady window of an asynchronous schedule's simulation."""

from __future__ import annotations

import pytest

from pipeplan.core.errors import ScheduleError
from pipeplan.schedules import make_schedule
from pipeplan.schedules.pipemare import pipemare
from pipeplan.sim import simulate, uniform_costs
from pipeplan.sim.steady import steady_state


@pytest.mark.parametrize(("p", "m"), [(4, 4), (4, 1), (8, 2), (8, 8)])
def test_balanced_pipemare_keeps_every_rank_busy_in_steady_state(p: int, m: int) -> None:
    """Equal stages, no transfer time: between fill and drain every rank alternates F and B without a gap,
    while a flushed 1F1B idles (p - 1)/(m + p - 1) of each iteration."""
    schedule = make_schedule("pipemare", p, m)
    result = simulate(schedule, uniform_costs(schedule, fwd=1.0, bwd=2.0))
    steady = steady_state(schedule, result, m)
    assert steady.utilization == pytest.approx(1.0)
    assert 0 < steady.start_ms < steady.end_ms < result.iteration_time
    sync = make_schedule("1f1b", p, m)
    flushed = simulate(sync, uniform_costs(sync, fwd=1.0, bwd=2.0))
    assert 1 - flushed.bubble_fraction == pytest.approx(m / (m + p - 1))


def test_an_uneven_pipeline_is_bounded_by_its_slowest_stage() -> None:
    """Stage 1 twice as slow: in steady state the others wait for it, utilization (1 + 2 + 1 + 1) / (4 x 2)."""
    schedule = pipemare(4, 4, 12)
    result = simulate(schedule, uniform_costs(schedule, fwd=[1.0, 2.0, 1.0, 1.0], bwd=[2.0, 4.0, 2.0, 2.0]))
    assert steady_state(schedule, result, 4).utilization == pytest.approx(5 / 8, rel=1e-6)


def test_too_few_minibatches_for_a_window_name_the_need() -> None:
    """p = 4, m = 2 fill two minibatches and drain two: five are too few."""
    schedule = pipemare(4, 2, 5)
    result = simulate(schedule, uniform_costs(schedule, fwd=1.0, bwd=2.0))
    with pytest.raises(
        ScheduleError, match=r"has 5 minibatches; a steady window needs at least 6 \(fill and drain take 2 each\)"
    ):
        steady_state(schedule, result, 2)
