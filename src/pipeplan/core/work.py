"""The price of a request that simulates many iterations, from the product of its sizes, checked before any work.

`simulate --iterations`, `adapt --iterations` and `plan --trace-iterations`
run iterations back to back. What they cost is the product of their sizes:
runs (policies, finalists) x iterations x events per simulated iteration
(the schedule's actions and transfers), where an iteration that a trace
leaves unchanged reuses an earlier one (sim.engine.iterations.Reuse: at most
2 x changes + 1 per run are simulated in full), plus what each iteration
keeps in memory until the run ends. `check_work` prices the request, and
refuses it when either figure is over its limit (core.limits.SIMULATED_EVENTS,
RUN_BYTES), naming the flag, the estimate, the limit and the largest count
of iterations that fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from pipeplan.core.errors import PipeplanError
from pipeplan.core.limits import RUN_BYTES, SIMULATED_EVENTS, show

ITERATION_EVENTS = 10.0
"""An iteration that reuses a simulated one costs 0.3 us of CPU, and printing its figures with --json about 2.6 us
(22 us of wall time on a loaded machine): priced as 10 simulated events (docs/troubleshooting.md, "Limits on many
iterations")."""
ITERATION_BYTES = 120.0
"""Bytes an iteration keeps until its run ends: start, time and peak memory (3 floats, in lists then tuples)."""
EVENT_BYTES = 400.0
"""Bytes a simulation holds per event while it runs (its program and, recorded, its timeline)."""
DECISION_EVENTS = 50.0
"""What one of the adaptive controller's decisions costs beyond its iteration's simulation (observing it, the
estimators, a memoized search), in events."""
DECISION_BYTES = 600.0
"""Bytes a controller's decision keeps per candidate k (its predictions, peaks and reason), two more for the rest."""
ORACLE_BYTES = 400.0
"""Bytes the oracle keeps per iteration and k (start, duration, peak and choice in dicts keyed by (iteration, k))."""
GUIDE_FACTORS = 5
"""Simulations of every candidate k when a controller is built (its landscape: nominal and 4 factors)."""


@dataclass(frozen=True, slots=True)
class Run:
    """A run of `iterations` back-to-back iterations of one schedule of `events` actions and transfers each.

    `changes`: the trace's changes of factor, so at most 2 x changes + 1
    iterations are simulated in full (None: every one is, as a controller's
    run must, to observe it). `extra_events`: events each iteration adds (a
    controller's decision); `kept_bytes`: bytes each iteration keeps until
    the end (its figures; a controller's decision record too).
    """

    iterations: int
    events: int
    changes: int | None
    extra_events: float = 0.0
    kept_bytes: float = ITERATION_BYTES

    @property
    def simulated(self) -> int:
        """Iterations simulated in full, at most."""
        return self.iterations if self.changes is None else min(self.iterations, 2 * self.changes + 1)


def events_of(runs: Sequence[Run], fixed_events: float = 0.0) -> float:
    """Events the runs simulate (with `fixed_events` done once, e.g. building a controller)."""
    return fixed_events + sum(r.simulated * r.events + r.iterations * (ITERATION_EVENTS + r.extra_events) for r in runs)


def bytes_of(runs: Sequence[Run]) -> float:
    """Peak bytes: every run's kept iterations, plus the largest simulation's working memory."""
    return sum(r.iterations * r.kept_bytes for r in runs) + max((r.events for r in runs), default=0) * EVENT_BYTES


def check_work(
    what: str,
    flag: str,
    iterations: int,
    runs_for: Callable[[int], tuple[Sequence[Run], float]],
    error: type[PipeplanError],
) -> None:
    """Raise `error` when `runs_for(iterations)` (the runs and the events done once) is over SIMULATED_EVENTS or
    RUN_BYTES: `<what> too large: about N events (...), the limit is M ...; use <flag> K or fewer`.

    `runs_for` must grow with the count of iterations; the largest count that fits is found by bisection on it.
    """
    runs, once = runs_for(iterations)
    events, memory = events_of(runs, once), bytes_of(runs)
    if SIMULATED_EVENTS.allows(events) and RUN_BYTES.allows(memory):
        return
    over = SIMULATED_EVENTS.message(f"{what} ({flag} {show(iterations)})", events)
    if SIMULATED_EVENTS.allows(events):
        over = RUN_BYTES.message(f"{what} ({flag} {show(iterations)})", memory)
    low, high = 0, iterations
    while low < high:  # the largest count in [0, iterations) that fits
        mid = (low + high + 1) // 2
        runs, once = runs_for(mid)
        if SIMULATED_EVENTS.allows(events_of(runs, once)) and RUN_BYTES.allows(bytes_of(runs)):
            low = mid
        else:
            high = mid - 1
    way = f"use {flag} {show(low)} or fewer" if low >= 1 else "even one iteration is over: use a smaller plan or schedule"
    raise error(f"{over}; {way}")


def check_iterations(what: str, flag: str, iterations: int, events: int, changes: int | None, error: type[PipeplanError]) -> None:
    """check_work for one run of `iterations` of `events` each under a trace of `changes` changes (simulate)."""
    check_work(what, flag, iterations, lambda n: ([Run(n, events, changes)], 0.0), error)


def kfkb_events(stages: int, microbatches: int, flows_per_boundary: int = 1) -> int:
    """Events of one iteration of kFkB (any k): F and B per stage and microbatch, each boundary's flows both ways."""
    return 2 * stages * microbatches + 2 * (stages - 1) * microbatches * flows_per_boundary


def controller_runs(iterations: int, stages: int, microbatches: int, events: int) -> tuple[list[Run], float]:
    """The adaptive controller's run: every iteration simulated and observed, and a decision after each; with what
    building it costs once (kFkB generated for each k up to m, each candidate simulated GUIDE_FACTORS times).
    Every k up to m is counted a candidate (those that fit memory are known only once the schedules are made)."""
    candidates = microbatches
    once = candidates * 2 * stages * microbatches + GUIDE_FACTORS * candidates * events
    run = Run(iterations, events, None, DECISION_EVENTS, ITERATION_BYTES + DECISION_BYTES * (candidates + 2))
    return [run], once


def adapt_runs(iterations: int, stages: int, microbatches: int, events: int, changes: int) -> tuple[list[Run], float]:
    """`adapt`'s runs (adapt.fixed_baselines.compare_policies): the controller's, every fixed k and the oracle's k, each reused
    where the trace holds still.

    Note: the oracle's k start where the best one ended, so its iterations of one k may overlap and a change fall
    into several of them: 2 x changes + 1 per k is an estimate there, not a bound (measured on the demo's bert-48
    plan, 32 k, 96 changes, 300 iterations: at most 84 simulations of one k, with and without a switch cost).
    """
    runs, once = controller_runs(iterations, stages, microbatches, events)
    runs += [Run(iterations, events, changes)] * microbatches
    runs += [Run(iterations, events, changes, 0.0, ORACLE_BYTES)] * microbatches
    return runs, once


def plan_events(stage_devices: Sequence[int], microbatches: int, per_microbatch: int = 2) -> int:
    """An upper bound on the events of one iteration of a plan whose stages run on `stage_devices` devices each:
    `per_microbatch` actions (2: F, B; 3: F, I, W) per stage and microbatch, and per boundary and microbatch a flow
    both ways for every device on either side."""
    flows = sum(2 * (a + b) for a, b in pairwise(stage_devices))
    return (per_microbatch * len(stage_devices) + flows) * microbatches


def rescore_runs(iterations: int, plans: Sequence[tuple[int, int, int, bool]], changes: int) -> tuple[list[Run], float]:
    """`plan --bandwidth-trace`'s re-scoring: per finalist (stages, microbatches, events per iteration, adaptable)
    its own schedule's run (reused where the trace holds still) and, when k can change, the controller's."""
    runs: list[Run] = []
    once = 0.0
    for stages, microbatches, events, adaptable in plans:
        runs.append(Run(iterations, events, changes))
        if adaptable:
            more, cost = controller_runs(iterations, stages, microbatches, events)
            runs += more
            once += cost + events  # and the idle iteration each finalist is simulated for first
    return runs, once
