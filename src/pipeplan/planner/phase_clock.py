"""Where planning time and memory go: wall and CPU seconds and peak-memory growth per planning phase.

A planner run opens one `PhaseClock` (request.guarded does, for every registered planner); code anywhere below it
marks a phase with `with phase("simulation"):`. Phases nest and their time is exclusive: entering a phase pauses
the one around it, so the phases' seconds add up to the run's (the run's own code outside any marked phase counts
as "other"). CPU time and peak memory (the process's maximum resident set) come from one getrusage call per phase
change, cheap next to the work marked; a phase is charged with the growth of that peak while it runs. Without an open clock
`phase` does nothing. Nothing recorded steers the search (plans do not depend on it); a run with a time budget
(planner.time_budget) checks it at every phase change, the one way time can cut a search short.
"""

from __future__ import annotations

import functools
import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from pipeplan.planner.time_budget import Deadline, budget_run

PHASES = (
    "seeds",
    "candidates",
    "partition_dp",
    "stage_costs",
    "rank_memory",
    "simulation",
    "schedules",
    "refine",
    "list_schedules",
    "final_simulation",
    "dag_orders",
    "other",
)
"""Every phase name, in the order `plan --json`'s "planning" lists them: seeds (the baseline planners the search
starts from), candidates (straight pipelines and the pool's bookkeeping), partition_dp (the DP over stage cuts and
widths), stage_costs (pricing stages on their devices), rank_memory (peak memory per rank), simulation (simulated
iterations that rank candidates), schedules (schedule variants of the top candidates), refine (placement and
boundary local search), list_schedules (list scheduling under memory budgets), final_simulation (full simulations
of the finalists and the plan), dag_orders (a DAG's further layer orders), other (the rest of the run)."""

P = ParamSpec("P")
R = TypeVar("R")

_RSS_UNIT = 1 if sys.platform == "darwin" else 1024
"""ru_maxrss is in bytes on macOS, in KiB on Linux."""


def _peak_rss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * _RSS_UNIT


def _now() -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak RSS bytes): the CPU time (user + system, as time.process_time counts it) and
    the peak from one getrusage call, the one system call a phase change makes besides the wall clock."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), usage.ru_utime + usage.ru_stime, int(usage.ru_maxrss) * _RSS_UNIT


@dataclass(slots=True)
class _Totals:
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    rss_growth: int = 0
    entries: int = 0


@dataclass(slots=True)
class PhaseClock:
    """The phases of one planning run: per name, exclusive wall and CPU seconds, entries and peak-RSS growth."""

    totals: dict[str, _Totals] = field(default_factory=lambda: {name: _Totals() for name in PHASES})
    stack: list[str] = field(default_factory=list)
    mark: tuple[float, float, int] = (0.0, 0.0, 0)
    started: tuple[float, float, int] = (0.0, 0.0, 0)
    deadline: Deadline | None = None

    def _switch(self) -> None:
        """Charge the time and peak growth since the last switch to the phase on top of the stack."""
        now = _now()
        if self.stack:
            totals = self.totals[self.stack[-1]]
            totals.seconds += now[0] - self.mark[0]
            totals.cpu_seconds += now[1] - self.mark[1]
            totals.rss_growth += now[2] - self.mark[2]
        self.mark = now

    def enter(self, name: str) -> None:
        """Start phase `name` (one of PHASES), pausing the one running."""
        if name not in self.totals:
            raise ValueError(f"unknown planning phase {name!r}; one of {', '.join(PHASES)}")
        if self.deadline is not None:  # the time budget's checkpoint: it may stop the search here, nothing entered
            self.deadline.check([*self.stack, name])
        self._switch()
        self.stack.append(name)
        self.totals[name].entries += 1

    def leave(self) -> None:
        """End the innermost phase, resuming the one around it."""
        self._switch()
        self.stack.pop()

    def to_json(self) -> dict[str, Any]:
        """{"seconds", "cpu_seconds", "peak_rss_bytes", "phases": [{"name", "seconds", "cpu_seconds",
        "peak_rss_growth_bytes", "entries"}, ...], "time_budget_s", "stopped_early"}: the run's totals and each phase
        entered at least once, in PHASES order; the phases' seconds add up to the run's; the budget (None: no limit)
        and, when it stopped the search, where (time_budget.Deadline.to_json)."""
        phases = [
            {
                "name": name,
                "seconds": t.seconds,
                "cpu_seconds": t.cpu_seconds,
                "peak_rss_growth_bytes": t.rss_growth,
                "entries": t.entries,
            }
            for name, t in self.totals.items()
            if t.entries
        ]
        return {
            "seconds": sum(t.seconds for t in self.totals.values()),
            "cpu_seconds": sum(t.cpu_seconds for t in self.totals.values()),
            "peak_rss_bytes": _peak_rss(),
            "phases": phases,
            **(self.deadline.to_json() if self.deadline else {"time_budget_s": None, "stopped_early": False}),
        }


_CURRENT: ContextVar[PhaseClock | None] = ContextVar("pipeplan_phase_clock", default=None)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Charge the work inside to phase `name` of the open clock (nothing without one)."""
    clock = _CURRENT.get()
    if clock is None:
        yield
        return
    clock.enter(name)
    try:
        yield
    finally:
        clock.leave()


def timed_phase(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A decorator: every call of the function is charged to phase `name`."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def timed(*args: P.args, **kwargs: P.kwargs) -> R:
            with phase(name):
                return fn(*args, **kwargs)

        return timed

    return decorate


@contextmanager
def planning_run(nested: str = "seeds", time_budget_s: float | None = None) -> Iterator[PhaseClock | None]:
    """Open a clock for a planner run, with its time budget (planner.time_budget; None or 0: no limit), and yield
    it; inside a run already timed (a seed planner called by the search), charge the whole call to phase `nested`
    under the outer run's budget and yield None."""
    clock = _CURRENT.get()
    if clock is not None:
        with phase(nested):
            yield None
        return
    with budget_run(time_budget_s) as deadline:
        clock = PhaseClock(deadline=deadline)
        token = _CURRENT.set(clock)
        clock.enter("other")
        try:
            yield clock
        finally:
            clock.leave()
            _CURRENT.reset(token)
