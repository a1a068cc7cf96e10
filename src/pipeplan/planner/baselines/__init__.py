"""The published planners pipeplan is measured against (DAPPLE, PipeDream, a balanced partition) and seeds from."""

from __future__ import annotations

from pipeplan.planner.baselines.balanced import plan_balanced
from pipeplan.planner.baselines.dapple.baseline import plan_dapple
from pipeplan.planner.baselines.pipedream import plan_pipedream
from pipeplan.planner.request import Planner, guarded

BASELINES: dict[str, Planner] = {
    "dapple": guarded("dapple", lambda request, progress: plan_dapple(request)),
    "pipedream": guarded("pipedream", lambda request, progress: plan_pipedream(request)),
    "balanced": guarded("balanced", lambda request, progress: plan_balanced(request)),
}
"""name -> planner, each guarded as planner.planners's (the search seeds from them, never the reverse)."""
