"""The planners by name, from plain imports: a planner that cannot be imported is an ImportError, never skipped."""

from __future__ import annotations

from pipeplan.core.errors import PlanError
from pipeplan.planner.baselines import BASELINES
from pipeplan.planner.exact import plan_exact
from pipeplan.planner.request import Planner, PlanRequest, PlanResult, Progress, guarded
from pipeplan.planner.search.selection import plan_pipeplan

PLANNERS: dict[str, Planner] = {
    "pipeplan": guarded("pipeplan", plan_pipeplan),
    **BASELINES,
    "exact": guarded("exact", lambda request, progress: plan_exact(request)),
}
"""name -> planner(request, progress=None); pipeplan's search reports progress, the others take none."""
TENSOR_PLANNERS = ("pipeplan", "megatron")
"""The planners that search tensor parallelism and sharding, so honour a request's forced tensor_parallel / zero."""
SEQUENCE_PLANNERS = ("pipeplan", "exact")
"""The planners that plan sequence parallelism, so honour a request's sequence_parallel "on" (every other plans none,
so "off" holds for it; the Megatron-style grid has none, as its paper)."""


def run_planner(name: str, request: PlanRequest, progress: Progress | None = None) -> PlanResult:
    """Run the planner registered as `name` on `request`, handing it the progress callback.

    Raises:
        PlanError: an unknown planner name (listing the registered ones), or the planner's own refusal.
    """
    planner = PLANNERS.get(name)
    if planner is None:
        raise PlanError(f"unknown planner {name!r}; choose one of {', '.join(sorted(PLANNERS))}")
    forced = [f"{k} {v}" for k, v in (("tensor_parallel", request.tensor_parallel), ("zero", request.zero)) if v]
    if forced and name not in TENSOR_PLANNERS:
        raise PlanError(
            f"planner {name!r} plans tp 1 and zero 0 only, got {' and '.join(forced)}; use --planner "
            f"{' or '.join(TENSOR_PLANNERS)}, or drop them"
        )
    if request.sequence_parallel == "on" and name not in SEQUENCE_PLANNERS:
        raise PlanError(
            f"planner {name!r} plans no sequence parallelism, got sequence_parallel on; use --planner "
            f"{' or '.join(SEQUENCE_PLANNERS)}, or drop it"
        )
    return planner(request, progress)
