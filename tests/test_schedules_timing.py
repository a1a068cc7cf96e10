"""Closed forms of the schedule generators, checked in the simulator (uniform costs, no transfer time)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.core.schedule import Schedule
from pipeplan.schedules import gpipe, interleaved_one_f_one_b, kfkb, one_f_one_b, zero_bubble_h1
from pipeplan.sim import simulate, uniform_costs

# Costs in ms that are exact in binary floating point, so sums compare tightly.
COSTS = st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0])


@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 4), COSTS, COSTS)
def test_interleaved_iteration_time(stages: int, chunks: int, groups: int, fwd: float, bwd: float) -> None:
    """interleaved-1f1b with chunk costs f/v, b/v and m a multiple of p takes (m + (p-1)/v)(f+b)."""
    microbatches = stages * groups
    schedule = interleaved_one_f_one_b(stages, microbatches, chunks)
    result = simulate(schedule, uniform_costs(schedule, fwd / chunks, bwd / chunks), record=False)
    assert result.iteration_time == pytest.approx((microbatches + (stages - 1) / chunks) * (fwd + bwd))


def test_interleaved_beats_1f1b_by_the_chunk_factor() -> None:
    """For p=4, m=8, f=1, b=2 the bubble shrinks from 3·3 ms (1F1B) to 3·3/v ms with v=3."""
    plain = one_f_one_b(4, 8)
    chunked = interleaved_one_f_one_b(4, 8, 3)
    assert simulate(plain, uniform_costs(plain, 1.0, 2.0)).iteration_time == pytest.approx(33.0)
    assert simulate(chunked, uniform_costs(chunked, 1 / 3, 2 / 3)).iteration_time == pytest.approx(27.0)


@given(st.integers(1, 10), st.integers(0, 12), COSTS)
def test_zb_h1_idle_is_p_minus_1_times_f(stages: int, extra: int, unit: float) -> None:
    """With F = I = W and m >= p, every zb-h1 rank idles (p-1)(F+I-W) and every 1f1b rank (p-1)(F+I+W)."""
    microbatches = stages + extra
    zb = zero_bubble_h1(stages, microbatches)
    zb_result = simulate(zb, uniform_costs(zb, unit, 2 * unit, bwd_input=unit, bwd_weight=unit), record=False)
    ref = one_f_one_b(stages, microbatches)
    ref_result = simulate(ref, uniform_costs(ref, unit, 2 * unit), record=False)
    for rank in range(stages):
        assert zb_result.per_rank[rank].idle == pytest.approx((stages - 1) * (unit + unit - unit))
        assert ref_result.per_rank[rank].idle == pytest.approx((stages - 1) * (unit + 2 * unit))
    assert zb_result.iteration_time == pytest.approx(3 * unit * microbatches + (stages - 1) * unit)


@given(st.integers(1, 10), st.integers(0, 12))
def test_zb_h1_peak_inflight_not_above_1f1b(stages: int, extra: int) -> None:
    """zb-h1's peak in-flight, max over ranks, is p, the same as 1f1b's (an F starts to its W ends)."""
    microbatches = stages + extra
    zb = zero_bubble_h1(stages, microbatches)
    ref = one_f_one_b(stages, microbatches)
    zb_peak = max(r.peak_inflight for r in simulate(zb, uniform_costs(zb, 1.0, 2.0), record=False).per_rank)
    ref_peak = max(r.peak_inflight for r in simulate(ref, uniform_costs(ref, 1.0, 2.0), record=False).per_rank)
    assert zb_peak == ref_peak == stages


@given(st.integers(1, 8), st.integers(0, 12), COSTS, COSTS, COSTS)
def test_zb_h1_idle_with_unequal_costs(stages: int, extra: int, fwd: float, bwd_input: float, bwd_weight: float) -> None:
    """Also with W <= min(F, I), each zb-h1 rank idles exactly (p-1)(F+I-W) when m >= p."""
    bwd_weight = min(bwd_weight, fwd, bwd_input)
    microbatches = stages + extra
    zb = zero_bubble_h1(stages, microbatches)
    costs = uniform_costs(zb, fwd, bwd_input + bwd_weight, bwd_input=bwd_input, bwd_weight=bwd_weight)
    result = simulate(zb, costs, record=False)
    for stats in result.per_rank:
        assert stats.idle == pytest.approx((stages - 1) * (fwd + bwd_input - bwd_weight))


@given(st.integers(2, 8), st.integers(1, 7))
def test_zb_h1_with_fewer_microbatches_than_stages(stages: int, microbatches: int) -> None:
    """For m < p zb-h1 still finishes, holds at most m microbatches per rank, and is no slower than 1f1b."""
    microbatches = min(microbatches, stages - 1)
    zb = zero_bubble_h1(stages, microbatches)
    ref = one_f_one_b(stages, microbatches)
    zb_result = simulate(zb, uniform_costs(zb, 1.0, 2.0, bwd_input=1.0, bwd_weight=1.0), record=False)
    ref_result = simulate(ref, uniform_costs(ref, 1.0, 2.0), record=False)
    assert zb_result.iteration_time <= ref_result.iteration_time
    assert max(r.peak_inflight for r in zb_result.per_rank) == microbatches


@given(st.integers(1, 8), st.integers(1, 24), COSTS, COSTS)
def test_gpipe_and_1f1b_iteration_time(stages: int, microbatches: int, fwd: float, bwd: float) -> None:
    """gpipe and 1f1b take (m+p-1)(f+b) with uniform costs and no transfer time."""
    for schedule in (gpipe(stages, microbatches), one_f_one_b(stages, microbatches)):
        result = simulate(schedule, uniform_costs(schedule, fwd, bwd), record=False)
        assert result.iteration_time == pytest.approx((microbatches + stages - 1) * (fwd + bwd))


@given(st.integers(1, 8), st.integers(1, 24), st.integers(1, 8))
def test_peak_inflight_closed_forms(stages: int, microbatches: int, k: int) -> None:
    """Peak in-flight on stage r: gpipe m, 1f1b min(p-r, m), kfkb min(k(p-r), m)."""

    def peaks(schedule: Schedule) -> list[int]:
        return [r.peak_inflight for r in simulate(schedule, uniform_costs(schedule, 1.0, 2.0), record=False).per_rank]

    ranks = range(stages)
    assert peaks(gpipe(stages, microbatches)) == [microbatches] * stages
    assert peaks(one_f_one_b(stages, microbatches)) == [min(stages - r, microbatches) for r in ranks]
    assert peaks(kfkb(stages, microbatches, k)) == [min(k * (stages - r), microbatches) for r in ranks]
