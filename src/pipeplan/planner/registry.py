"""The planners by name, from plain imports: a planner that cannot be imported is an ImportError, never skipped."""

from __future__ import annotations

from pipeplan.planner.baselines import BASELINES
from pipeplan.planner.exact import plan_exact
from pipeplan.planner.request import Planner, guarded
from pipeplan.planner.search.selection import plan_pipeplan

PLANNERS: dict[str, Planner] = {
    "pipeplan": guarded("pipeplan", plan_pipeplan),
    **BASELINES,
    "exact": guarded("exact", lambda request, progress: plan_exact(request)),
}
"""name -> planner(request, progress=None); pipeplan's search reports progress, the others take none."""
