"""The published planners pipeplan is measured against (DAPPLE, PipeDream, a balanced partition, Megatron-LM's grid) and
seeds from (all but megatron: planner.search.candidates.SEED_PLANNERS)."""

from __future__ import annotations

from pipeplan.planner.baselines.balanced import plan_balanced
from pipeplan.planner.baselines.dapple.baseline import plan_dapple
from pipeplan.planner.baselines.megatron import plan_megatron
from pipeplan.planner.baselines.pipedream import plan_pipedream
from pipeplan.planner.request import Planner, guarded

BASELINES: dict[str, Planner] = {
    "dapple": guarded("dapple", lambda request, progress: plan_dapple(request)),
    "pipedream": guarded("pipedream", lambda request, progress: plan_pipedream(request)),
    "balanced": guarded("balanced", lambda request, progress: plan_balanced(request)),
    "megatron": guarded("megatron", lambda request, progress: plan_megatron(request, request.zero or 0)),
}
"""name -> planner, each guarded as planner.planners's (the search seeds from them, never the reverse)."""
