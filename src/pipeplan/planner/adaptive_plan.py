"""A plan's adaptive setting (`plan --adaptive`): its schedule as kFkB, the k that fit the memory budget, the start k."""

from __future__ import annotations

import dataclasses

from pipeplan.adapt.budget import resolve_budget
from pipeplan.adapt.pipeline import PipelineModel
from pipeplan.adapt.predict import Predictor, fitting_ks
from pipeplan.core.errors import PlanError
from pipeplan.core.plan import AdaptiveSetting, Plan
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.plan_sim import simulate_plan

AS_KFKB = {"1f1b": lambda plan: 1, "kfkb": lambda plan: plan.k, "gpipe": lambda plan: plan.microbatches}
"""The schedules that are kFkB at some k: 1F1B is k = 1, GPipe k = m (the k a plan of each starts from)."""
START_SLACK = 0.001
"""The start k is the smallest k within this share of the fastest at nominal bandwidth: several k often tie (to float
noise) once the warm-up covers the pipeline, and the smaller holds fewer microbatches."""


def as_kfkb(plan: Plan) -> Plan | None:
    """`plan` as kfkb at the k its schedule is (AS_KFKB), or None when its schedule is no kFkB (an explicit order,
    interleaved chunks, zero bubble's split backward)."""
    start = AS_KFKB.get(plan.schedule)
    if start is None or plan.chunks != 1 or plan.order is not None:
        return None
    return dataclasses.replace(plan, schedule="kfkb", k=start(plan), order=None, adaptive=None)


def adaptive_plan(result: PlanResult, request: PlanRequest, budget: float | None, flag: str = "--memory-budget") -> PlanResult:
    """`result` made adaptive: kfkb, every k whose per-device peak fits min(device memory, budget) as its
    k_choices, the fastest of them at nominal bandwidth as its k (the smallest within START_SLACK of the fastest),
    re-simulated at that k.

    Args:
        budget: the most any device may hold (None: adapt.budget.resolve_budget's default, the smallest device's
            memory less core.plan.MEMORY_MARGIN, never below 1F1B's peak); `flag` names it in an error.

    Raises:
        PlanError: the plan's schedule is no kFkB (list, zb-h1, interleaved-1f1b).
        AdaptError: a budget below the plan's 1F1B peak, naming `flag`, the peak, the stage and by how much.
    """
    plan = as_kfkb(result.plan)
    if plan is None:
        raise PlanError(
            f"the plan found runs {result.plan.schedule!r}, which is no kFkB, so it cannot carry an adaptive setting; "
            "plan with --schedule kfkb (what --adaptive does)"
        )
    pipeline = PipelineModel.from_plan(plan, request.model)
    budget = resolve_budget(pipeline, budget, flag)
    schedules, _ = fitting_ks(pipeline, budget)
    times = Predictor(pipeline, schedules).times({})
    fastest = min(times.values())
    start = min(k for k, t in times.items() if t <= fastest * (1 + START_SLACK))
    plan = dataclasses.replace(plan, k=start, adaptive=AdaptiveSetting(tuple(schedules), budget))
    sim = simulate_plan(plan, request.model)
    memory = check_fits(plan, request.model, sim)
    return dataclasses.replace(result, plan=plan, sim=sim, costs=plan_costs(plan, request.model), memory_per_device=memory)
