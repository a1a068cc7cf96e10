"""Invariants every planner answer must satisfy, checked on any request (fuzzing, tests, benchmarks).

For each planner asked: it either returns a plan or raises a PipeplanError
(anything else is a crash); a returned plan fits in memory, simulates to the
iteration time it reports, and keeps the request's schedule and microbatch
size when they are set. Across planners: `pipeplan` finds a plan whenever a
baseline does, and is never slower than one.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeplan.core.errors import PipeplanError
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.plan_sim import simulate_plan

BASELINES = ("dapple", "pipedream", "balanced")
TOLERANCE = 1e-9
"""Relative slack for "never slower" (the same simulator scores every plan)."""


@dataclass(slots=True)
class Audit:
    """What each planner answered (ms, or the error text), its planning seconds, and every broken invariant."""

    times: dict[str, float | str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no invariant is broken."""
        return not self.problems


def check_answer(request: PlanRequest, name: str, result: PlanResult) -> list[str]:
    """The broken invariants of one planner's answer (empty when it is sound)."""
    problems = []
    plan = result.plan
    simulated = simulate_plan(plan, request.model, record=False)
    if abs(simulated.iteration_time - result.iteration_time) > 1e-6 * max(1.0, result.iteration_time):
        problems.append(
            f"{name} reports {result.iteration_time:.6f} ms but its plan simulates to {simulated.iteration_time:.6f} ms"
        )
    try:
        check_fits(plan, request.model, simulated)
    except PipeplanError as exc:
        problems.append(f"{name} returned a plan that does not fit: {exc}")
    if request.schedule != "auto" and plan.schedule != request.schedule:
        problems.append(f"{name} returned schedule {plan.schedule!r} for --schedule {request.schedule!r}")
    if request.microbatch_size is not None and plan.microbatch_size != request.microbatch_size:
        problems.append(f"{name} returned microbatch size {plan.microbatch_size} for {request.microbatch_size}")
    return problems


def audit(request: PlanRequest, planners: Mapping[str, object]) -> Audit:
    """Run every planner in `planners` (name -> planner function) on `request` and check the invariants."""
    out = Audit()
    for name, planner in planners.items():
        started = time.perf_counter()
        try:
            result = planner(request)  # type: ignore[operator]
        except PipeplanError as exc:
            out.times[name] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a crash is what the audit reports
            out.times[name] = f"crash: {type(exc).__name__}: {exc}"
            out.problems.append(f"{name} crashed: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}")
        else:
            out.times[name] = result.iteration_time
            out.problems += check_answer(request, name, result)
        out.seconds[name] = time.perf_counter() - started
    mine = out.times.get("pipeplan")
    for name in BASELINES:
        theirs = out.times.get(name)
        if "pipeplan" not in out.times or not isinstance(theirs, float):
            continue
        if not isinstance(mine, float):
            out.problems.append(f"pipeplan found no plan ({mine}) but {name} did ({theirs:.4f} ms)")
        elif mine > theirs * (1 + TOLERANCE):
            out.problems.append(f"pipeplan {mine:.4f} ms is slower than {name} {theirs:.4f} ms ({mine / theirs:.4f}x)")
    return out
