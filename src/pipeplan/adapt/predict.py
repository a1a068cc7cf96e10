"""T(k) by simulation: the next iteration of kFkB under estimated link rates and stage compute, memoized."""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import sub

from pipeplan.adapt.observation import Link
from pipeplan.adapt.pipeline import PipelineModel
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.schedule import Schedule
from pipeplan.schedules.kfkb import kfkb
from pipeplan.sim.cost.memory import order_peak_activation
from pipeplan.sim.cost.types import Costs, Flow, SharedExchange, StageCost
from pipeplan.sim.engine.program import Program, compile_schedule
from pipeplan.sim.engine.simulator import iteration_time, simulate

Compute = tuple[Sequence[float], Sequence[float]]
"""Per-stage forward and backward ms of one microbatch."""
Key = tuple[tuple[int, ...], tuple[int | None, ...] | None]
"""A prediction's rounded state: link factors and stage times as indices on the rounding grid."""

SCALED_SIZE = 1 << 16
"""Flows at a link factor remembered by _costs_for (most links keep their factor from one state to the next)."""
MEMO_SIZE = 4096
RECALL_SIZE = 256
"""States whose best k a search remembers (to try first in a nearby state)."""
"""Predictions remembered (one per k and rounded rates), least recently used dropped first."""


def stage_peak_bytes(pipeline: PipelineModel, schedule: Schedule) -> tuple[float, ...]:
    """Peak bytes per stage under `schedule`: static bytes plus its in-flight microbatches' saved bytes (sim.cost.memory)."""
    saved = tuple(c.saved_bytes for c in pipeline.costs.stages)
    activation = order_peak_activation(schedule, saved)
    return tuple(c.static_bytes + a for c, a in zip(pipeline.costs.stages, activation, strict=True))


def fitting_ks(
    pipeline: PipelineModel, budget_bytes: float | None = None
) -> tuple[dict[int, Schedule], dict[int, tuple[float, ...]]]:
    """The kFkB schedules that fit every stage's memory limit and the budget, k = 1..m, and the peak bytes per stage
    of each k tried.

    Stage s may hold min(its device's memory, `budget_bytes`) (None: its device's memory). Stage r holds
    min(k (p - r), m) microbatches, so memory grows with k: the search stops at the first k that does not fit
    (its peaks are returned too, so a caller can say by how much it misses).
    """
    p, m = pipeline.num_stages, pipeline.microbatches
    limits = pipeline.memory_limit_bytes
    if budget_bytes is not None:
        limits = tuple(min(limit, budget_bytes) for limit in limits)
    schedules: dict[int, Schedule] = {}
    peaks: dict[int, tuple[float, ...]] = {}
    for k in range(1, m + 1):
        schedule = kfkb(p, m, k)
        peaks[k] = stage_peak_bytes(pipeline, schedule)
        if any(need > limit for need, limit in zip(peaks[k], limits, strict=True)):
            break
        schedules[k] = schedule
    return schedules, peaks


def ladder(ks: Sequence[int]) -> list[int]:
    """Rungs 1, 2, 3, 5, 8, 12, ... (each about 1.5 x the last) that are in `ks`, plus the largest k."""
    present = set(ks)
    rungs: list[int] = []
    rung = 1
    while rung <= max(ks):
        if rung in present:
            rungs.append(rung)
        rung = max(rung + 1, round(rung * 1.5))
    return [*rungs, max(ks)]


class Predictor:
    """Simulates one iteration of kFkB for every candidate k under given link factors and stage compute.

    Factors and compute times are rounded to a logarithmic grid of ratio
    1 + `step` before simulating, and the prediction is memoized on the
    rounded values: a controller that sees the same network twice pays once.
    The rounding changes a prediction by at most a factor 1 + step/2.
    """

    def __init__(self, pipeline: PipelineModel, schedules: Mapping[int, Schedule], step: float = 0.01) -> None:
        self.pipeline = pipeline
        self.schedules = dict(schedules)
        self.programs: dict[int, Program] = {k: compile_schedule(s) for k, s in self.schedules.items()}
        self.step = step
        self._log_grid = math.log1p(step)
        self.simulations = 0
        self._ladder = ladder(list(self.schedules))
        self._best_at: OrderedDict[Key, int] = OrderedDict()  # the best k a search found in each state
        self._memo: OrderedDict[tuple[int, Key], float] = OrderedDict()
        self._costs: OrderedDict[Key, Costs] = OrderedDict()
        self._with_compute: dict[tuple[int | None, ...], Costs] = {}  # stage times' index -> the costs with them
        self._scaled: dict[tuple[int, int, int, int], Flow] = {}  # a flow at a link factor's index (_costs_for)
        self._guide: list[tuple[float, dict[int, float]]] = []  # (log factor, T(k)) with every link at that factor

    def key(self, factors: Mapping[Link, float], compute: Compute | None = None) -> Key:
        """The rounded state a prediction depends on: the factors of every link its traffic uses (transfers and
        all-reduce rings, PipelineModel.traffic_links; absent: nominal) and stage times (None: the model's), each as
        its index on a logarithmic grid of ratio 1 + step, round(log(x) / log1p(step)) (0 for 1; None for a stage
        time of 0)."""
        log, grid = math.log, self._log_grid
        links = self.pipeline.traffic_links
        rates = tuple(round(log(f) / grid) for f in map(factors.get, links, repeat(1.0)))
        if compute is None:
            return (rates, None)
        return (rates, tuple(None if x <= 0 else round(log(x) / grid) for part in compute for x in part))

    def times(self, factors: Mapping[Link, float], compute: Compute | None = None) -> dict[int, float]:
        """Predicted iteration ms of every candidate k (links absent from `factors` run at nominal rate)."""
        key = self.key(factors, compute)
        return {k: self.time_at(k, key) for k in self.schedules}

    def time(self, k: int, factors: Mapping[Link, float], compute: Compute | None = None) -> float:
        """Predicted iteration ms of kFkB with this k."""
        return self.time_at(k, self.key(factors, compute))

    def time_at(self, k: int, key: Key) -> float:
        """Predicted iteration ms of kFkB with this k in the rounded state `key` (memoized)."""
        memo_key = (k, key)
        cached = self._memo.get(memo_key)
        if cached is not None:
            self._memo.move_to_end(memo_key)
            return cached
        self.simulations += 1
        value = iteration_time(self.schedules[k], self._costs_for(key), self.programs[k])  # simulate's, time only
        self._memo[memo_key] = value
        if len(self._memo) > MEMO_SIZE:
            self._memo.popitem(last=False)
        return value

    def known(self, key: Key) -> dict[int, float]:
        """The memoized predictions of the candidates in the rounded state `key` (no simulation, no search)."""
        memo = self._memo
        found = {}
        for k in self.schedules:
            value = memo.get((k, key))
            if value is not None:
                memo.move_to_end((k, key))
                found[k] = value
        return found

    def replayed_run(
        self, k: int, trace: BandwidthTrace, start_ms: float, length_ms: float, compute: Compute | None = None
    ) -> float:
        """The mean iteration ms of kFkB with this k run back to back under `trace` over [start_ms, start_ms +
        length_ms]: length_ms over the iterations done in it, the last one counted by the share of it inside (so
        the end of the span cuts no iteration short); not memoized."""
        costs = self.pipeline.costs if compute is None else self.pipeline.with_compute(*compute)
        t = start_ms
        end = start_ms + length_ms
        done = 0.0
        while t < end:
            self.simulations += 1
            took = simulate(self.schedules[k], costs, trace, record=False, offset_ms=t, program=self.programs[k]).iteration_time
            done += min(1.0, (end - t) / took)
            t += took
        return length_ms / done

    def seed_guide(self, factors: Sequence[float]) -> None:
        """Simulate every candidate with all links at each of `factors` (and nominal): the landscape `ranked` reads."""
        grid = sorted({1.0, *factors}, reverse=True)
        links = self.pipeline.traffic_links
        self._guide = [(math.log(f), {k: self.time(k, dict.fromkeys(links, f)) for k in self.schedules}) for f in grid]

    def ranked(self, factors: Mapping[Link, float]) -> list[int]:
        """Candidates ordered by the guide's T(k) at the slowest link's factor (interpolated in log factor)."""
        values = self.guided(factors)
        return sorted(values, key=lambda k: (values[k], k))

    def guided(self, factors: Mapping[Link, float]) -> dict[int, float]:
        """The guide's T(k) of every candidate at the slowest link's factor, interpolated in log factor (no
        simulation: a rough T(k) with every link at that factor and the model's compute; empty before seed_guide)."""
        if not self._guide:
            return {}
        x = math.log(min(factors.values(), default=1.0))
        guide = self._guide
        if x >= guide[0][0]:
            values = guide[0][1]
        elif x <= guide[-1][0]:
            values = guide[-1][1]
        else:
            i = next(j for j in range(1, len(guide)) if guide[j][0] <= x)
            (x0, a), (x1, b) = guide[i - 1], guide[i]
            w = (x - x0) / (x1 - x0)
            values = {k: (1 - w) * a[k] + w * b[k] for k in a}
        return dict(values)

    def search(self, key: Key, first: Sequence[int], budget: int, guide: Sequence[int] = ()) -> dict[int, float]:
        """Predictions of the candidates in the rounded state `key`, simulating at most `budget` (memoized ones are free).

        Order: the current k (`first[0]`), the first two of `guide` (the k
        the precomputed landscape ranks fastest, Predictor.ranked), the rest
        of `first` (the last best), the best k of the nearest state searched before (a burst that comes back finds its k at
        once), the ladder of k about 1.5x apart, the neighbours (+-1, +-2) of
        the best found while it improves, then every other k ascending. A
        later search in the same state finds the earlier answers in the memo
        and goes on where that one stopped, so on a steady network every k
        that fits is simulated within a few decisions.
        """
        found: dict[int, float] = {}
        spent = 0

        def visit(k: int) -> bool:
            nonlocal spent
            if k in found or k not in self.schedules:
                return True
            value = self._memo.get((k, key))
            if value is None:
                if spent >= budget:
                    return False
                spent += 1
                value = self.time_at(k, key)
            found[k] = value
            return True

        order = [*first]
        if guide:
            order = [first[0], *guide[:2], *first[1:]]
        for k in [*order, *self._recalled(key), *self._ladder]:
            visit(k)
        if not found:  # no budget and nothing memoized in this state
            return found
        best = None
        while best != (best := min(found, key=lambda k: (found[k], k))):
            for k in (best - 1, best + 1, best - 2, best + 2):
                visit(k)
        for k in self.schedules:
            if not visit(k):
                break
        self._best_at[key] = best
        self._best_at.move_to_end(key)
        if len(self._best_at) > RECALL_SIZE:
            self._best_at.popitem(last=False)
        return found

    def _recalled(self, key: Key) -> list[int]:
        """The best k found in the searched state nearest to `key` (rounded rates and times, summed distance)."""
        if not self._best_at:
            return []
        rates, times = key
        mine = None if times is None else _zeroed(times)

        def distance(other: Key) -> int:  # sums of ints: exact in any order
            far = sum(map(abs, map(sub, rates, other[0])))
            if mine is not None and other[1] is not None:
                far += sum(map(abs, map(sub, mine, _zeroed(other[1]))))
            return far

        nearest = min(self._best_at, key=distance)
        return [self._best_at[nearest]]

    def _costs_for(self, key: Key) -> Costs:
        cached = self._costs.get(key)
        if cached is not None:
            return cached
        rates, times = key
        grid = 1.0 + self.step
        links = self.pipeline.traffic_links
        factor = dict(zip(links, (grid**q for q in rates), strict=True))  # type: ignore[attr-defined]
        index = dict(zip(links, rates, strict=True))
        base = self._computed(times)
        made = self._scaled  # (direction, boundary, flow, its link's grid index) -> the flow at that factor

        def scaled(direction: int, boundary: int, flows: tuple[Flow, ...]) -> tuple[Flow, ...]:
            out = []
            for i, f in enumerate(flows):
                at = (direction, boundary, i, index[f.link])
                flow = made.get(at)
                if flow is None:
                    flow = made[at] = Flow(f.resources, f.link, f.latency_ms, f.work_ms / factor[f.link])
                out.append(flow)
            return tuple(out)

        if len(made) > SCALED_SIZE:
            made.clear()
        stages = tuple(_ring_scaled(c, factor) for c in base.stages)
        shared = tuple(_exchange_scaled(x, factor) for x in base.shared)
        forward = tuple(scaled(0, b, flows) for b, flows in enumerate(base.forward))
        backward = tuple(scaled(1, b, flows) for b, flows in enumerate(base.backward))
        costs = Costs(stages, forward, backward, shared)
        self._costs[key] = costs
        if len(self._costs) > 64:
            self._costs.popitem(last=False)
        return costs

    def _computed(self, times: tuple[int | None, ...] | None) -> Costs:
        """The pipeline's costs with the stage times of a key (None: the model's), the last few remembered."""
        if times is None:
            return self.pipeline.costs
        cached = self._with_compute.get(times)
        if cached is not None:
            return cached
        grid = 1.0 + self.step
        values = [0.0 if q is None else grid**q for q in times]
        p = self.pipeline.num_stages
        base = self._with_compute[times] = self.pipeline.with_compute(values[:p], values[p:])
        if len(self._with_compute) > 8:
            self._with_compute.pop(next(iter(self._with_compute)))
        return base


def _zeroed(times: tuple[int | None, ...]) -> tuple[int, ...]:
    """A key's stage times with None (a stage time of 0) as index 0, for distances (the same tuple when none is)."""
    return times if None not in times else tuple(x or 0 for x in times)  # type: ignore[return-value]


def _ring_factor(links: tuple[Link, ...], factor: Mapping[Link, float]) -> float:
    """A ring's factor: its slowest link's (a ring runs at its slowest link: BandwidthTrace.ring_segments)."""
    return min((factor[link] for link in links), default=1.0)


def _ring_scaled(cost: StageCost, factor: Mapping[Link, float]) -> StageCost:
    """The stage's cost with its all-reduce's work at its ring's factor (the same object when that is 1)."""
    f = _ring_factor(cost.allreduce_links, factor)
    if f == 1.0 or cost.allreduce_work_ms <= 0:
        return cost
    return dataclasses.replace(cost, allreduce_ms=cost.allreduce_latency_ms + cost.allreduce_work_ms / f)


def _exchange_scaled(exchange: SharedExchange, factor: Mapping[Link, float]) -> SharedExchange:
    """A shared parameter's exchange with its work at its ring's factor (the same object when that is 1)."""
    f = _ring_factor(exchange.links, factor)
    if f == 1.0 or exchange.work_ms <= 0:
        return exchange
    return dataclasses.replace(exchange, exchange_ms=exchange.latency_ms + exchange.work_ms / f)
