"""A plan's schedule: generated from its fields, or its stored order for `list`."""

from __future__ import annotations

from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan
from pipeplan.core.schedule import Schedule
from pipeplan.schedules.registry import check_schedule_options, make_schedule


def plan_schedule(plan: Plan) -> Schedule:
    """The plan's schedule: generated from its fields, or its stored order for `list`.

    Raises:
        PlanError: a `list` plan without an order, or a generated one with an order.
        ScheduleError: the generator rejects the plan's sizes, or a k or chunks the schedule does not take.
    """
    if plan.schedule == "list":
        check_schedule_options("list", plan.microbatches, plan.k, plan.chunks)
        if plan.order is None:
            raise PlanError("plan schedule 'list' needs an explicit order, got none")
        stage_to_rank = tuple(s % plan.num_ranks for s in range(len(plan.stages)))
        return Schedule(plan.order, stage_to_rank, "list")
    if plan.order is not None:
        raise PlanError(f"plan schedule {plan.schedule!r} is generated; only 'list' plans carry an order")
    return make_schedule(plan.schedule, plan.num_ranks, plan.microbatches, k=plan.k, chunks=plan.chunks)
