"""What the baseline planners share: the microbatch sizes they try, the schedule they run, stages from bounds, the layer
order of their stages."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipeplan.core.dag import order_from_stages
from pipeplan.core.errors import PlanError
from pipeplan.core.profile import ModelProfile
from pipeplan.planner.plan_space import microbatch_sizes as microbatch_sizes_of
from pipeplan.planner.plan_space import power_of_two
from pipeplan.planner.request import PlanRequest


def microbatch_sizes(request: PlanRequest, replica_batch: int, max_microbatches: int = 512) -> list[int]:
    """Microbatch sizes a baseline tries for one pipeline replica's batch, largest first.

    A filter on planner.plan_space: the request's size when it sets one (if it divides the batch); else the
    powers of two dividing the batch, plus the profile's own batch size, that
    give at most `max_microbatches` microbatches.
    """
    batch = request.profile.batch_size
    return microbatch_sizes_of(
        request, replica_batch, lambda b: (power_of_two(b) or b == batch) and replica_batch // b <= max_microbatches
    )[::-1]


def require_schedule(request: PlanRequest, planner: str, schedule: str) -> None:
    """Raise PlanError unless the request lets `planner` run its own `schedule`."""
    if request.schedule not in ("auto", schedule):
        raise PlanError(
            f"planner {planner!r} runs {schedule} only, got schedule {request.schedule!r}; "
            "use --planner pipeplan or exact to choose among schedules"
        )


def finite(value: float) -> bool:
    """True for a finite float."""
    return not (math.isinf(value) or math.isnan(value))


def layer_order(profile: ModelProfile, stage_sets: Sequence[Sequence[int]]) -> tuple[int, ...] | None:
    """The plan layer order of stages given as sets of layer indices (core.dag.order_from_stages), or None where that
    is the index order: stages that are consecutive index ranges from layer 0 over every layer (a Plan stores that
    order as None).

    Note:
        The index order is valid for any profile (its layers are stored in a topological order), so the check of
        every layer's inputs is skipped there: the baselines' plans of a 5,000-layer chain spent seconds in it.
    """
    first = 0
    for members in stage_sets:
        if not members or min(members) != first or max(members) != first + len(members) - 1 or len(set(members)) != len(members):
            return order_from_stages(profile, stage_sets)
        first += len(members)
    return None if first == profile.num_layers else order_from_stages(profile, stage_sets)
