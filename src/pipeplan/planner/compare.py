"""Run several planners on one request and line their plans up: all are scored by the same simulator (`compare`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.planner.planners import PLANNERS
from pipeplan.planner.request import Planner, PlanRequest, PlanResult

BASELINES = ("dapple", "pipedream", "balanced")
"""The published planners pipeplan is measured against (exact is a reference, not a baseline)."""

ORDER = ("pipeplan", "dapple", "pipedream", "balanced", "exact")
"""Row order of a comparison; planners registered under other names follow, sorted."""
OPT_IN = ("megatron",)
"""Registered planners a comparison runs only when named (`--planners megatron`): the Megatron-style grid search
(planner.baselines.megatron) is not yet one of the BASELINES speed-ups are measured against."""


@dataclass(frozen=True, slots=True)
class PlannerFailure:
    """A planner that returned no plan: its name, its one-line error and how long it tried."""

    planner: str
    error: str
    planning_seconds: float


Row = PlanResult | PlannerFailure


def planner_names(planners: Sequence[str] | None = None) -> list[str]:
    """The planners to compare, in ORDER; all registered ones but OPT_IN when `planners` is None.

    Raises:
        PlanError: a name that is not registered or named twice, or no name at all.
    """
    registered = PLANNERS
    if planners is None:
        return [n for n in ORDER if n in registered] + sorted(n for n in registered if n not in (*ORDER, *OPT_IN))
    if not planners:
        raise PlanError(f"no planner named; choose among {', '.join(sorted(registered))}")
    unknown = [n for n in planners if n not in registered]
    if unknown:
        raise PlanError(f"unknown planner {unknown[0]!r}; choose among {', '.join(sorted(registered))}")
    twice = [n for i, n in enumerate(planners) if n in planners[:i]]
    if twice:
        raise PlanError(f"planner {twice[0]!r} is named twice (each planner runs once); name it once")
    return list(planners)


SEEDED = ("pipeplan",)
"""Planners that seed from the baselines' plans: compare runs the baselines first and hands them its results."""


def compare(
    request: PlanRequest,
    planners: Sequence[str] | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> list[Row]:
    """Run each planner on `request`; a planner that fails gives a PlannerFailure row with its message.

    The baselines run first and each runs once: pipeplan's search takes their results as its seeds
    (candidates.seed_from_baselines) instead of planning them again, and its planning_seconds then counts the
    seconds of the baselines it took, as `plan` would have spent them.

    Args:
        request: the planning problem.
        planners: names to run (default: every registered planner, pipeplan first).
        progress: called with (message, fraction done) before each planner.

    Returns:
        One row per planner, in the order of `planners`.

    Raises:
        PlanError: an unknown planner name.
    """
    names = planner_names(planners)
    registered = PLANNERS
    done: dict[str, Row] = {}
    ordered = [n for n in names if n in BASELINES] + [n for n in names if n not in BASELINES]
    for i, name in enumerate(ordered):
        if progress is not None:
            progress(f"planner {name}", i / len(names))
        planner = registered[name]
        started = time.perf_counter()
        try:
            if name in SEEDED:
                done[name] = _seeded(planner, request, done)
            else:
                done[name] = planner(request)
        except PipeplanError as exc:
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            done[name] = PlannerFailure(name, message, time.perf_counter() - started)
    if progress is not None:
        progress("done", 1.0)
    return [done[name] for name in names]


def _seeded(planner: Planner, request: PlanRequest, done: dict[str, Row]) -> PlanResult:
    """`planner` run with the baselines' rows so far as its seeds; their seconds added to its planning_seconds."""
    runs = {name: row if isinstance(row, PlanResult) else None for name, row in done.items() if name in BASELINES}
    result = planner(request, baselines=runs)
    taken = sum(done[name].planning_seconds for name in result.extra.get("seeds_reused", ()))
    return dataclasses.replace(result, planning_seconds=result.planning_seconds + taken)


def best_baseline(rows: Sequence[Row]) -> PlanResult | None:
    """The fastest row among the baselines (dapple, pipedream, balanced) that found a plan."""
    found = [r for r in rows if isinstance(r, PlanResult) and r.planner in BASELINES]
    return min(found, key=lambda r: r.iteration_time, default=None)


def best_row(rows: Sequence[Row]) -> PlanResult | None:
    """The fastest row that found a plan (first on ties)."""
    found = [r for r in rows if isinstance(r, PlanResult)]
    return min(found, key=lambda r: r.iteration_time, default=None)


def speedup(row: Row, baseline: PlanResult | None) -> float | None:
    """Best baseline's iteration time over this row's (> 1: the row is faster); None without both."""
    if not isinstance(row, PlanResult) or baseline is None or row.iteration_time <= 0:
        return None
    return baseline.iteration_time / row.iteration_time


@dataclass
class Comparison:
    """Every planner's result on one problem (`compare`, and `demo`'s second step), with the names it was given."""

    profile: str
    cluster: str
    name: str
    request: PlanRequest
    rows: list[Row]

    def to_json(self) -> dict[str, Any]:
        """`compare --json`: one `plan --json` object per planner, or its error."""
        return {
            "results": [
                r.to_json(self.profile, self.cluster, self.request.profile)
                if isinstance(r, PlanResult)
                else {"planner": r.planner, "error": r.error, "planning_seconds": r.planning_seconds}
                for r in self.rows
            ]
        }
