"""Candidate plans simulated in full and checked against memory; the fastest of several as a PlanResult."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.plan import Plan
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.plan_sim import simulate_plan
from pipeplan.sim.result import SimResult


def evaluate(request: PlanRequest, plan: Plan, record: bool = False) -> tuple[SimResult, tuple[float, ...]]:
    """Simulate `plan` and check it fits; return the result and memory per device.

    Raises:
        PlanError: the plan does not fit in memory (naming stage, device and excess).
    """
    memory = check_fits(plan, request.model)
    result = simulate_plan(plan, request.model, record=record)
    return result, memory


def best_of(
    request: PlanRequest,
    planner: str,
    plans: Iterable[Plan],
    started: float,
    extra: dict[str, Any] | None = None,
) -> PlanResult:
    """Simulate each plan that fits and return the fastest (first on ties) as a PlanResult.

    Raises:
        PlanError: no plan was given, or none fits (the error of the last one tried).
    """
    best: tuple[float, Plan] | None = None
    last_error: PipeplanError | None = None
    tried = 0
    for plan in plans:
        tried += 1
        try:
            result, _ = evaluate(request, plan)
        except PipeplanError as exc:
            last_error = exc
            continue
        if best is None or result.iteration_time < best[0]:
            best = (result.iteration_time, plan)
    if best is None:
        if last_error is not None:
            raise PlanError(f"planner {planner!r} found no plan that fits: {last_error}")
        raise PlanError(f"planner {planner!r} found no candidate plan for global batch {request.global_batch}")
    result, memory = evaluate(request, best[1], record=True)
    info = {"candidates_simulated": tried, **(extra or {})}
    costs = plan_costs(best[1], request.model)
    return PlanResult(best[1], planner, result, costs, memory, time.perf_counter() - started, info)
