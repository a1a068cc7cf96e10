"""Planning for the network you will have: re-score the idle-network search's finalists under a bandwidth trace.

Beyond the Ada-Grouper paper: a plan is scored by its expected iteration time
under the trace with the adaptive controller running (adapt: kFkB's k chosen
at every iteration boundary), or with its own schedule where that is faster
or where k cannot change (interleaved chunks). Re-scoring runs whole
iterations under the trace, so only the few best plans of the idle-network
search are re-scored (RESCORED), not every candidate the search saw.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from pipeplan.adapt.controller import AdaptiveController, ControllerConfig
from pipeplan.adapt.pipeline import PipelineModel
from pipeplan.adapt.runs import run_controller
from pipeplan.core.errors import AdaptError
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.plan import Plan
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.engine.iterations import simulate_iterations
from pipeplan.sim.plan_sim import simulate_plan

RESCORED = 4
"""Finalists of the idle-network search re-scored under the trace (each costs a few hundred simulations)."""
MIN_ITERATIONS = 10
MAX_ITERATIONS = 200
"""A run covers the trace (until an iteration starts after its last step), within these bounds."""


@dataclass(frozen=True, slots=True)
class TraceScore:
    """One candidate plan under the trace: its idle rank and time, and its expected time under the trace and how."""

    plan: Plan
    idle_rank: int
    idle_ms: float
    expected_ms: float
    how: str
    iterations: int

    def to_json(self) -> dict[str, Any]:
        """{"idle_rank", "idle_ms", "expected_ms", "how", "iterations", "schedule", "stages", "pipeline_replicas", ...}."""
        p = self.plan
        return {
            "idle_rank": self.idle_rank,
            "idle_ms": self.idle_ms,
            "expected_ms": self.expected_ms,
            "how": self.how,
            "iterations": self.iterations,
            "schedule": p.schedule,
            "k": p.k,
            "chunks": p.chunks,
            "ranks": p.num_ranks,
            "pipeline_replicas": p.pipeline_replicas,
            "microbatches": p.microbatches,
            "microbatch_size": p.microbatch_size,
        }


def iterations_to_cover(trace: BandwidthTrace, idle_ms: float) -> int:
    """Iterations of about idle_ms that reach past the trace's last step, within MIN_ITERATIONS..MAX_ITERATIONS."""
    needed = math.ceil(trace.end_ms / idle_ms) + 1 if idle_ms > 0 else MIN_ITERATIONS
    return max(MIN_ITERATIONS, min(MAX_ITERATIONS, needed))


def score_under_trace(
    plan: Plan,
    model: CostModel,
    trace: BandwidthTrace,
    idle_rank: int,
    iterations: int | None = None,
    budget: float | None = None,
) -> TraceScore:
    """Expected iteration ms of `plan` under `trace`: the better of the controller's run and the plan's own schedule.

    Slowed iterations take longer, so a run of a fixed count of iterations
    would see less of the trace for a slower plan; instead each plan runs
    until it has passed the trace's last step (`iterations_to_cover` of its
    idle time, or `iterations` when given) and is scored by its mean. The controller keeps every k within `budget`
    (None: the devices' memory); a plan whose 1F1B exceeds the budget runs its own schedule.
    """
    idle = simulate_plan(plan, model, record=False).iteration_time
    count = iterations or iterations_to_cover(trace, idle)
    own = simulate_iterations(plan_schedule(plan), plan_costs(plan, model, trace), trace, count)
    best_ms, how = own.total_ms / count, f"its own {plan.schedule} schedule"
    try:
        config = ControllerConfig(memory_budget_bytes=budget)
        controller = AdaptiveController(PipelineModel.from_plan(plan, model, trace), config)
    except AdaptError:
        controller = None  # interleaved, asynchronous or over the budget: k cannot change, it runs its own schedule
    if controller is not None:
        adaptive = run_controller(controller, trace, count).run
        if adaptive.total_ms / count < best_ms:
            best_ms, how = adaptive.total_ms / count, f"adaptive kFkB (k {min(adaptive.k)}..{max(adaptive.k)})"
    return TraceScore(plan, idle_rank, idle, best_ms, how, count)


def rescore(
    finalists: list[Plan],
    model: CostModel,
    trace: BandwidthTrace,
    iterations: int | None = None,
    budget: float | None = None,
) -> list[TraceScore]:
    """Score the first RESCORED distinct finalists (idle-network order) under the trace, fastest expected first."""
    chosen = list(dict.fromkeys(finalists))[:RESCORED]
    scores = [score_under_trace(plan, model, trace, rank, iterations, budget) for rank, plan in enumerate(chosen)]
    return sorted(scores, key=lambda s: (s.expected_ms, s.idle_rank))


def check_rescoring(plans: list[Plan] | None, trace: BandwidthTrace, iterations: int | None, flag: str) -> None:
    """Refuse re-scoring `plans` (None: the smallest RESCORED plans, before planning) for `iterations` each (None:
    up to MAX_ITERATIONS) when it would cost more than core.limits allows (core.work.rescore_runs), naming `flag`.

    Raises:
        PlanError: the estimate, the limit and the most iterations that fit.
    """
    from pipeplan.core.errors import PlanError
    from pipeplan.core.work import check_work, plan_events, rescore_runs
    from pipeplan.schedules.registry import TABLE
    from pipeplan.sim.engine.iterations import trace_changes

    sizes: list[tuple[int, int, int, bool]] = []
    for plan in plans if plans is not None else []:
        facts = TABLE.get(plan.schedule)
        per = 3 if facts is not None and facts.split_backward else 2
        events = plan_events([len(s.devices) for s in plan.stages], plan.microbatches, per)
        sizes.append((len(plan.stages), plan.microbatches, events, plan.chunks == 1))
    if plans is None:
        sizes = [(1, 1, 2, True)] * RESCORED
    changes = trace_changes(trace)
    what = f"re-scoring {len(sizes)} finalists under the trace"
    check_work(what, flag, iterations or MAX_ITERATIONS, lambda n: rescore_runs(n, sizes, changes), PlanError)


def choose_under_trace(
    result: PlanResult, request: PlanRequest, trace: BandwidthTrace, iterations: int | None, budget: float | None = None
) -> tuple[PlanResult, list[TraceScore]]:
    """The plan with the least expected time under the trace among the search's finalists (the idle choice first),
    as a PlanResult with its idle-network simulation, costs and memory, and every score (the controller within
    `budget`: score_under_trace)."""
    from pipeplan.sim.cost.memory import check_fits

    finalists = [result.plan, *result.extra.get("finalists", [])]
    check_rescoring(list(dict.fromkeys(finalists))[:RESCORED], trace, iterations, "--trace-iterations")
    scores = rescore(finalists, request.model, trace, iterations, budget)
    best = scores[0].plan
    if best == result.plan:
        return result, scores
    sim = simulate_plan(best, request.model)
    memory = check_fits(best, request.model, sim)
    costs = plan_costs(best, request.model)
    return dataclasses.replace(result, plan=best, sim=sim, costs=costs, memory_per_device=memory), scores


def trace_json(scores: list[TraceScore], idle: PlanResult) -> dict[str, Any]:
    """plan --json's "bandwidth_trace": every re-scored candidate, whether the choice changed, and by how much."""
    chosen = scores[0]
    before = next(s for s in scores if s.plan == idle.plan)
    return {
        "candidates": [s.to_json() for s in scores],
        "changed": chosen.plan != idle.plan,
        "idle_choice_expected_ms": before.expected_ms,
        "expected_ms": chosen.expected_ms,
        "expected_gain": before.expected_ms / chosen.expected_ms - 1.0,
    }
