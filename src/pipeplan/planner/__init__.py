"""Planners: from a profile, a cluster and a global batch to the fastest plan that fits (registered by name)."""

from __future__ import annotations

import importlib

from pipeplan.planner.base import PLANNERS, PlanRequest, PlanResult, register_planner

PLANNER_MODULES = ("search", "dapple", "pipedream", "balanced", "exact")
"""Modules that register planners when imported; those not (yet) present are skipped."""


def load_planners() -> dict[str, object]:
    """Import every planner module that exists so it registers itself; return PLANNERS."""
    for name in PLANNER_MODULES:
        module = f"pipeplan.planner.{name}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    return PLANNERS


__all__ = ["PLANNERS", "PlanRequest", "PlanResult", "load_planners", "register_planner"]
