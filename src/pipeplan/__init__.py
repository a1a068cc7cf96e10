"""pipeplan: plan, simulate and run pipeline-parallel training of large DNNs.

The public API (pipeplan.api: plan, compare, simulate, profile_model, stage_modules, pipeline, probe_local,
train_local, load_plan, distribute, ...) is reachable from here too, loaded on first use: `import pipeplan` imports
neither torch nor the planners.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_API = (
    "LocalRun", "PlanDoesNotFit", "PlannerComparison", "compare", "distribute", "load_cluster", "load_plan", "load_profile",
    "pipeline", "plan", "plan_request", "probe_local", "profile_model", "run_planner", "save_plan", "save_profile",
    "simulate", "stage_modules", "train_local",
)  # fmt: skip
"""pipeplan.api.__all__, named here so that reaching one loads the API (tests/test_api.py checks the two agree)."""


def __getattr__(name: str) -> Any:
    """A name of the API reached from pipeplan (pipeplan.plan, ...): import pipeplan.api on first use."""
    if name in _API:
        from pipeplan import api

        return getattr(api, name)
    raise AttributeError(f"module 'pipeplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
