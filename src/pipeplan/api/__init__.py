"""pipeplan's Python API: every CLI command is a thin layer over these functions (docs/api.md has the example).

Planning and simulation need no torch (`import pipeplan` stays torch-free); `profile_model`, `stage_modules`,
`pipeline`, `probe_local`, `train_local` and `distribute` import it when called. A bad argument raises the typed
error the CLI prints (core.errors), in one line naming the argument and the value. Times are ms, sizes bytes.

Modules: arguments (a profile or cluster as a value, path or name; shared checks), planning (plan_request,
run_planner, plan, compare; plan_outcome, compare_outcome: what `plan` and `compare` print), simulation (simulate;
simulate_plan_file, adapt_policies, adapt_plan), scheduling (schedule_of, simulate_schedule: `schedule`, `simulate NAME`),
catalog (the built-in profiles and clusters), saving (save_plan, save_profile), modules (a torch model:
profile_model, stage_modules, pipeline), local (local processes: probe_local, train_local), distributed (your own
training script on N processes: load_plan, distribute), training (the `train` command wired once: train, with
train_setup's checks before any process starts).
"""

from __future__ import annotations

from pipeplan.api.arguments import load_cluster, load_profile
from pipeplan.api.distributed import distribute, load_plan
from pipeplan.api.local import LocalRun, probe_local, train_local
from pipeplan.api.modules import pipeline, profile_model, stage_modules
from pipeplan.api.planning import PlannerComparison, compare, plan, plan_request, run_planner
from pipeplan.api.saving import save_plan, save_profile
from pipeplan.api.simulation import PlanDoesNotFit, simulate

__all__ = [
    "LocalRun", "PlanDoesNotFit", "PlannerComparison", "compare", "distribute", "load_cluster", "load_plan", "load_profile",
    "pipeline", "plan", "plan_request", "probe_local", "profile_model", "run_planner", "save_plan", "save_profile",
    "simulate", "stage_modules", "train_local",
]  # fmt: skip
