"""Tests of adapt.budget: the memory budget bounds the controller's k, its default, and its refusal below 1F1B."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapt_cases import bert_plan, numbers
from pipeplan.adapt import AdaptiveController, ControllerConfig, PipelineModel
from pipeplan.adapt.budget import check_budget, default_budget, resolve_budget
from pipeplan.adapt.fixed_baselines import compare_policies
from pipeplan.adapt.predict import fitting_ks
from pipeplan.core.errors import AdaptError
from pipeplan.core.plan import MEMORY_MARGIN
from pipeplan.sim.cost.memory import memory_per_device

PLAN, MODEL = bert_plan(microbatches=16)
PIPELINE = PipelineModel.from_plan(PLAN, MODEL)
PEAK = {  # brute force, independent of adapt: the simulator's memory of the plan run as kFkB at each k
    k: max(memory_per_device(dataclasses.replace(PLAN, schedule="kfkb", k=k), MODEL)) for k in range(1, 17)
}


@settings(max_examples=40, deadline=None)
@given(share=st.floats(0.0, 1.0))
def test_the_budget_keeps_exactly_the_k_whose_peak_fits_it(share: float) -> None:
    """For any budget between 1F1B's and GPipe's peak, the candidates are every k whose simulated peak fits it."""
    budget = PEAK[1] + share * (PEAK[16] - PEAK[1])
    schedules, _ = fitting_ks(PIPELINE, budget)
    assert sorted(schedules) == [k for k in range(1, 17) if PEAK[k] <= budget]
    controller = AdaptiveController(PIPELINE, ControllerConfig(memory_budget_bytes=budget))
    assert controller.k_choices == tuple(sorted(schedules))
    assert all(controller.peak_bytes[k] == pytest.approx(PEAK[k], rel=1e-12) for k in controller.k_choices)


def test_the_device_still_bounds_k_under_a_larger_budget() -> None:
    """Stage s may hold min(its device, budget): a budget above the devices changes nothing."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=16, activation_bytes=1e9, limit=8.5e9))
    assert sorted(fitting_ks(pipeline, 1e12)[0]) == sorted(fitting_ks(pipeline)[0]) == [1, 2]
    assert sorted(fitting_ks(pipeline, 6.5e9)[0]) == [1]


def test_a_budget_below_1f1b_is_refused_naming_the_budget_the_peak_the_stage_and_the_excess() -> None:
    """4 GiB held by stage 0 under 1F1B (4 microbatches of 1 GiB): a 3 GiB budget misses by 1 GiB."""
    gib = float(1 << 30)
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=16, activation_bytes=gib, limit=64 * gib))
    with pytest.raises(AdaptError, match=r"^--memory-budget 3 GiB is below 1F1B's peak: k=1 holds 4 GiB on stage 0 "
                                         r"\(1 GiB over the budget\); give at least 4096MiB"):  # fmt: skip
        check_budget(pipeline, 3 * gib, "--memory-budget")
    with pytest.raises(AdaptError, match=r"^memory_budget_bytes 3 GiB is below 1F1B's peak"):
        AdaptiveController(pipeline, ControllerConfig(memory_budget_bytes=3 * gib))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(AdaptError, match="must be a finite number of bytes > 0"):
            check_budget(pipeline, bad)
    assert check_budget(pipeline, 4 * gib) == 4 * gib  # exactly 1F1B's peak fits


def test_the_default_budget_is_the_smallest_device_less_the_margin_never_below_1f1b() -> None:
    """None: (1 - MEMORY_MARGIN) x the smallest device; where 1F1B alone needs more, its peak (the device holds it)."""
    assert default_budget([16e9, 8e9]) == pytest.approx((1 - MEMORY_MARGIN) * 8e9)
    roomy = PipelineModel.from_measurements(**numbers(p=4, m=16, activation_bytes=1e9, limit=40e9))
    assert resolve_budget(roomy, None) == pytest.approx(36e9)
    tight = PipelineModel.from_measurements(**numbers(p=4, m=16, activation_bytes=1e9, limit=4.2e9))
    assert resolve_budget(tight, None) == pytest.approx(4e9)  # 1F1B's 4 GB is above 0.9 x 4.2 GB
    assert resolve_budget(roomy, 5e9) == 5e9


def test_adapt_reports_the_budget_and_every_candidate_s_peak_and_no_run_exceeds_it() -> None:
    """compare_policies under a budget: fixed k and every policy's peaks stay within it; JSON has both new fields."""
    budget = (PEAK[3] + PEAK[4]) / 2
    comparison = compare_policies(PIPELINE, None, 3, ControllerConfig(memory_budget_bytes=budget))
    assert sorted(comparison.fixed) == [1, 2, 3]
    for name in ("adaptive", "best_static", "oracle"):
        assert max(comparison.policies[name].peak_bytes) <= budget
    obj = comparison.to_json(timing=False)
    assert obj["memory_budget_bytes"] == budget
    assert obj["peak_bytes_per_k"] == {str(k): pytest.approx(PEAK[k], rel=1e-12) for k in (1, 2, 3)}
    assert "over the memory budget's" in obj["not_run"]["gpipe"]
