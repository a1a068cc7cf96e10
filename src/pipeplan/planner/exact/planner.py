"""`exact`: the best plan under pipeplan's simulator over the space exact.space defines, by branch and bound.

Tie rule: among plans of equal simulated time the first found wins: shapes (rp, m) in increasing order of their
bound (rp ascending, then m descending on equal bounds), each seeded with its suffix table's split before its
search; stages by last layer, width, device tuple. On clusters with twins the plan may name other (twin) devices
than a search without the twin rule would, and on ties it may be another plan of the same time.
"""

from __future__ import annotations

import time

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.planner.exact.search import Search
from pipeplan.planner.exact.space import COVERED, SCHEDULES, search_space
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.search.refine import twin_classes
from pipeplan.planner.simulated import evaluate
from pipeplan.schedules.registry import names_text
from pipeplan.sim.cost.plan_costs import plan_costs

MAX_SPACE = 20_000_000
"""Most (partition, ordered device groups) pairs accepted: 8 layers on 7 devices (13.6M) pass, on 8 (226M) do not."""


def plan_exact(request: PlanRequest) -> PlanResult:
    """The plan with the smallest simulated iteration time over exact's space (exact.space's docstring).

    Raises:
        PlanError: the instance is too large, the schedule is not one the
            exact search covers, or no plan fits in memory.
    """
    started = time.perf_counter()
    layers, devices = request.profile.num_layers, request.cluster.num_devices
    space = search_space(layers, devices, limit=MAX_SPACE)
    if space > MAX_SPACE:
        raise PlanError(
            f"planner 'exact' handles at most {MAX_SPACE:,} (partition, device groups) pairs; "
            f"{layers} layers on {devices} devices give more; use --planner pipeplan"
        )
    if request.schedule == "auto":
        schedules = SCHEDULES
    elif request.schedule in COVERED:
        schedules = tuple(s for s in SCHEDULES if s[0] == request.schedule)
    else:
        raise PlanError(f"planner 'exact' covers {names_text(COVERED, 'and')}, got schedule {request.schedule!r}")
    search = Search(request, schedules, twin_classes(request.cluster))
    search.run()
    if search.best_plan is None:
        raise PlanError(
            f"planner 'exact' found no plan that fits in memory for {request.profile.name} on "
            f"{request.cluster.name} (global batch {request.global_batch}); try more devices or a smaller batch"
        )
    try:
        result, memory = evaluate(request, search.best_plan, record=True)
    except PipeplanError as exc:  # the search checked memory the same way; this would be a bug
        raise PlanError(f"planner 'exact' chose a plan that does not fit: {exc}") from exc
    extra = {"simulated": search.simulated, "search_nodes": search.nodes, "search_space": space}
    costs = plan_costs(search.best_plan, request.model)
    return PlanResult(search.best_plan, "exact", result, costs, memory, time.perf_counter() - started, extra)
