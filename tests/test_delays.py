"""Tests of sim.delays: PipeMare's τ per stage and the weight versions in use, derived from a schedule's order."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from pipeplan.core.schedule import Schedule
from pipeplan.schedules import make_schedule
from pipeplan.schedules.pipemare import default_minibatches, pipemare
from pipeplan.sim.delays import stage_delays


@given(st.integers(1, 8), st.integers(1, 8))
def test_pipemare_delay_of_stage_s_is_ceil_of_p_minus_s_minus_1_over_m(p: int, m: int) -> None:
    """Stage s keeps p - s forwards in flight: a microbatch's backward comes p - s - 1 backwards after its forward,
    and a step falls every m backwards, so at most ceil((p - s - 1) / m) steps lie between them (the steady state of
    enough minibatches reaches it)."""
    delays = stage_delays(pipemare(p, m, default_minibatches(p, m)))
    assert delays.delays == tuple(math.ceil((p - s - 1) / m) for s in range(p))
    assert all(0 <= mean <= tau for mean, tau in zip(delays.mean_delays, delays.delays, strict=True))


def test_pipemare_delays_by_hand() -> None:
    """p = 2, m = 2, two minibatches: stage 0's microbatch 2 is forwarded before the first step and backwarded after
    it (τ = 1, the only one of four); stage 1 steps right after each backward it needs (τ = 0). Weight stashing
    would keep two versions on stage 0 (microbatch 2's and the new one), one on stage 1."""
    delays = stage_delays(pipemare(2, 2, 2))
    assert delays.delays == (1, 0) and delays.mean_delays == (0.25, 0.0)
    assert delays.stashed_versions == (2, 1)


def test_synchronous_schedules_and_warm_up_have_no_delay() -> None:
    """Without U actions, or with every minibatch flushed (all synchronous warm-up), nothing is delayed."""
    for name in ("gpipe", "1f1b", "zb-h1"):
        assert stage_delays(make_schedule(name, 4, 8)).delays == (0, 0, 0, 0)
    flushed = stage_delays(pipemare(4, 2, 5, 5))
    assert flushed.delays == (0, 0, 0, 0) and flushed.stashed_versions == (1, 1, 1, 1)
    assert stage_delays(pipemare(4, 2, 6, 2)).delays == stage_delays(pipemare(4, 2, 6)).delays


def test_one_microbatch_per_minibatch_stashes_p_minus_s_versions() -> None:
    """m = 1 (PipeDream's update per microbatch): stage s keeps p - s weight versions under stashing (the
    in-flight microbatches' and the current one, as PipeDream counts them); τ = p - s - 1."""
    delays = stage_delays(pipemare(4, 1, 12))
    assert delays.delays == (3, 2, 1, 0)
    assert delays.stashed_versions == (4, 3, 2, 1)


def test_a_split_backward_is_delayed_at_its_input_gradient() -> None:
    """A hand-made zero-bubble order with a step between F and I: the delay is counted at I, released at W."""
    schedule = Schedule.from_text([["0F0", "0U0", "0I0", "0W0"]], name="x")
    delays = stage_delays(schedule)
    assert delays.delays == (1,) and delays.stashed_versions == (2,)
