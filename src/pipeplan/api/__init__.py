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

from typing import Any

_HOME = {
    "LocalRun": "local",
    "PlanDoesNotFit": "simulation",
    "PlannerComparison": "planning",
    "compare": "planning",
    "distribute": "distributed",
    "load_cluster": "arguments",
    "load_plan": "distributed",
    "load_profile": "arguments",
    "pipeline": "modules",
    "plan": "planning",
    "plan_request": "planning",
    "probe_local": "local",
    "profile_model": "modules",
    "run_planner": "planning",
    "save_plan": "saving",
    "save_profile": "saving",
    "simulate": "simulation",
    "stage_modules": "modules",
    "train_local": "local",
}
"""Each public name's module: imported when the name is first reached, so that `import pipeplan.api.scheduling`
(the CLI's help texts) loads no more than that module."""

__all__ = [
    "LocalRun", "PlanDoesNotFit", "PlannerComparison", "compare", "distribute", "load_cluster", "load_plan", "load_profile",
    "pipeline", "plan", "plan_request", "probe_local", "profile_model", "run_planner", "save_plan", "save_profile",
    "simulate", "stage_modules", "train_local",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    """A public name of the API: import its module on first use (importlib caches it)."""
    if name in _HOME:
        from importlib import import_module

        value = getattr(import_module(f"pipeplan.api.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pipeplan.api' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
