"""A planning run's time budget: the search stops at its first checkpoint past the budget with a plan to fall back on.

A budget never reorders the search: the search visits its candidates in a fixed order, and a budget only cuts that
order short. The checkpoints are the phase changes of the run's clock (planner.phase_clock: every simulation, every
stage pricing, every step of the search enters one); at each one the budget reads its clock, and once more seconds
have passed than the budget allows and the search has a plan to fall back on (`fallback`), it raises BudgetSpent.
The search catches it and returns the best plan it has scored. A budget that is never exceeded changes nothing: the
same phases are entered in the same order and the plan is the same, byte for byte. Tests and benchmarks replace the
clock (`clock_source`): a clock that advances one second per read makes the budget a count of checkpoints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TIME_BUDGET_S = 50.0
"""`plan` and `compare`'s default budget per planner run (seconds of wall time): with start-up, reading the inputs,
the final simulation of the plan and printing, a whole process stays within a minute. 0 or None: no limit."""

Clock = Callable[[], float]

_CLOCK: ContextVar[Clock] = ContextVar("pipeplan_budget_clock", default=time.perf_counter)
_CURRENT: ContextVar[Deadline | None] = ContextVar("pipeplan_deadline", default=None)


class BudgetSpent(Exception):
    """Raised at a checkpoint past the budget, for the search that set the fallback to catch (control flow, like
    StopIteration: no error a user sees)."""


@dataclass(slots=True)
class Deadline:
    """One planning run's budget: `seconds` from `start` on `clock`; `ready` (set by `fallback`) says whether the
    search has a plan to return; `stopped` is the phases open when it stopped (None while it has not), `covered` what
    the stopped search had done (`record_coverage`)."""

    seconds: float
    clock: Clock
    start: float
    ready: Callable[[], bool] | None = None
    stopped: tuple[str, ...] | None = None
    stopped_after_s: float = 0.0
    covered: dict[str, int] = field(default_factory=dict)
    later_stops: list[str] = field(default_factory=list)

    def check(self, phases: list[str]) -> None:
        """A checkpoint: raise BudgetSpent, recording the open `phases`, when the budget is exceeded and the search
        has a plan to fall back on (once per run: the search then finishes its plan unchecked)."""
        if self.ready is None or self.stopped is not None:
            return
        elapsed = self.clock() - self.start
        if elapsed > self.seconds and self.ready():
            self.stopped, self.stopped_after_s = tuple(phases), elapsed
            raise BudgetSpent(f"the time budget of {self.seconds:g} s ran out in phase {phases[-1] if phases else '-'}")

    def to_json(self) -> dict[str, Any]:
        """{"time_budget_s", "stopped_early"} and, when it stopped, "stopped_after_s" (on its clock), "phase_reached"
        (the outermost phase open but the run's own "other": the search's step, e.g. "candidates" or "refine") and
        "phases_open" (innermost last), with what the search had covered (e.g. "simulations", "candidates"); and
        "later_stops", the searches a re-armed budget stopped after the first (`budget_rearmed`)."""
        obj: dict[str, Any] = {"time_budget_s": self.seconds, "stopped_early": self.stopped is not None}
        if self.stopped is not None:
            obj["stopped_after_s"] = self.stopped_after_s
            obj["phase_reached"] = next((name for name in self.stopped if name != "other"), "other")
            obj["phases_open"] = list(self.stopped)
            obj.update(self.covered)
        if self.later_stops:
            obj["later_stops"] = list(self.later_stops)
        return obj


def limit_of(seconds: float | None) -> float | None:
    """A budget in seconds as a limit: None for no limit (None or 0), else the seconds."""
    return None if seconds is None or seconds == 0 else float(seconds)


@contextmanager
def budget_run(seconds: float | None) -> Iterator[Deadline | None]:
    """Open the deadline of a planning run of `seconds` (None or 0: no limit, and None is yielded) on the current
    clock (`clock_source`); a run inside one already open keeps the outer one."""
    limit = limit_of(seconds)
    if limit is None or _CURRENT.get() is not None:
        yield _CURRENT.get()
        return
    clock = _CLOCK.get()
    deadline = Deadline(limit, clock, clock())
    token = _CURRENT.set(deadline)
    try:
        yield deadline
    finally:
        _CURRENT.reset(token)


@contextmanager
def fallback(ready: Callable[[], bool]) -> Iterator[None]:
    """Arm the open deadline for a search that can return a plan once `ready()` says so (it catches BudgetSpent);
    without an open deadline, nothing."""
    deadline = _CURRENT.get()
    if deadline is None:
        yield
        return
    outer, deadline.ready = deadline.ready, ready
    try:
        yield
    finally:
        deadline.ready = outer


@contextmanager
def budget_share(fraction: float) -> Iterator[None]:
    """Inside, the open deadline allows only `fraction` of the seconds it has left (a search that another follows in
    the same run leaves the rest to it); without an open deadline, or once it has stopped, nothing."""
    deadline = _CURRENT.get()
    if deadline is None or deadline.stopped is not None:
        yield
        return
    full = deadline.seconds
    elapsed = deadline.clock() - deadline.start
    deadline.seconds = min(full, elapsed + fraction * max(full - elapsed, 0.0))
    try:
        yield
    finally:
        deadline.seconds = full


@contextmanager
def budget_rearmed(name: str) -> Iterator[None]:
    """Inside, a deadline that stopped an earlier search of the run checks again, so the search `name` that follows
    it stops at its first checkpoint with a fallback rather than running unchecked; the first stop stays the one
    to_json reports, a later one is listed by `name` in "later_stops"."""
    deadline = _CURRENT.get()
    if deadline is None or deadline.stopped is None:
        yield
        return
    first = (deadline.stopped, deadline.stopped_after_s, dict(deadline.covered))
    deadline.stopped = None
    try:
        yield
    finally:
        if deadline.stopped is not None:
            deadline.later_stops.append(name)
        deadline.stopped, deadline.stopped_after_s, deadline.covered = first


def record_coverage(**counts: int) -> None:
    """Record on the open deadline how far its stopped search got (counts of work done: simulations, candidates)."""
    deadline = _CURRENT.get()
    if deadline is not None:
        deadline.covered.update(counts)


def budget_spent() -> bool:
    """Whether the open deadline has stopped its search (a caller then starts no further search)."""
    deadline = _CURRENT.get()
    return deadline is not None and deadline.stopped is not None


@contextmanager
def clock_source(clock: Clock) -> Iterator[None]:
    """Read budgets on `clock` inside (tests: a clock that counts checkpoints; default time.perf_counter)."""
    token = _CLOCK.set(clock)
    try:
        yield
    finally:
        _CLOCK.reset(token)
