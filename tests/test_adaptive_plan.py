"""Tests of planner.adaptive_plan: a plan as kFkB with its adaptive setting (plan --adaptive's last step)."""

from __future__ import annotations

import dataclasses

import pytest

from adapt_cases import bert_plan
from pipeplan.core.errors import AdaptError, PlanError
from pipeplan.core.plan import Plan
from pipeplan.planner.adaptive_plan import adaptive_plan, as_kfkb
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.sim.cost.memory import memory_per_device
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.plan_sim import simulate_plan

PLAN, MODEL = bert_plan(microbatches=16)  # 1f1b, 4 stages on devices 6, 7 | 8, 9 of v100-8x2-25g


def result_of(plan: Plan) -> PlanResult:
    """A PlanResult of `plan` as a planner returns it."""
    sim = simulate_plan(plan, MODEL)
    return PlanResult(plan, "test", sim, plan_costs(plan, MODEL), memory_per_device(plan, MODEL, sim), 0.0, {})


def request() -> PlanRequest:
    """The request the plans answer: bert-48, global batch 32 at microbatch size 2."""
    return PlanRequest(MODEL.profile, MODEL.cluster, 32, 2, "kfkb")


def test_1f1b_and_gpipe_are_kfkb_at_1_and_m_and_other_schedules_have_no_k() -> None:
    """as_kfkb: 1f1b -> k 1, gpipe -> k m, kfkb keeps its k; zb-h1, list and interleaved chunks give None."""
    assert as_kfkb(PLAN) == dataclasses.replace(PLAN, schedule="kfkb", k=1)
    assert as_kfkb(dataclasses.replace(PLAN, schedule="gpipe")).k == 16  # type: ignore[union-attr]
    assert as_kfkb(dataclasses.replace(PLAN, schedule="kfkb", k=5)).k == 5  # type: ignore[union-attr]
    assert as_kfkb(dataclasses.replace(PLAN, schedule="zb-h1")) is None


def test_the_setting_holds_the_k_within_the_budget_and_starts_at_the_fastest() -> None:
    """Under a budget between k=3's and k=4's peak: k_choices 1..3, the start k the fastest of them (brute force:
    a full simulation of each), the plan re-simulated at that k."""
    peak = {k: max(memory_per_device(dataclasses.replace(PLAN, schedule="kfkb", k=k), MODEL)) for k in (3, 4)}
    budget = (peak[3] + peak[4]) / 2
    made = adaptive_plan(result_of(PLAN), request(), budget)
    assert made.plan.adaptive is not None and made.plan.adaptive.k_choices == (1, 2, 3)
    times = {k: simulate_plan(dataclasses.replace(PLAN, schedule="kfkb", k=k), MODEL).iteration_time for k in (1, 2, 3)}
    assert made.plan.k == min(k for k in times if times[k] <= min(times.values()) * 1.001)
    assert made.iteration_time == pytest.approx(times[made.plan.k], rel=1e-12)


def test_a_plan_with_no_k_or_a_budget_below_1f1b_is_refused() -> None:
    """zb-h1 cannot carry the setting (PlanError); a budget below 1F1B's peak names the flag (AdaptError)."""
    with pytest.raises(PlanError, match="runs 'zb-h1', which is no kFkB"):
        adaptive_plan(result_of(dataclasses.replace(PLAN, schedule="zb-h1")), request(), None)
    with pytest.raises(AdaptError, match=r"^--memory-budget 1 MiB is below 1F1B's peak"):
        adaptive_plan(result_of(PLAN), request(), 2.0**20)
