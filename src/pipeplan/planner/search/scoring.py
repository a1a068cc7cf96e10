"""Scoring plans by simulation: memoized, fast ranking for huge microbatch counts, exact memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from pipeplan.core.errors import PipeplanError
from pipeplan.core.plan import Plan
from pipeplan.core.schedule import Schedule
from pipeplan.planner.phase_clock import phase
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.time_floor import chain_floor, resource_floor
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.schedules.registry import INTERLEAVED, TABLE, WARMUP_FAMILY, splits_backward, warmup_forwards
from pipeplan.sim.cost.flow_sets import FlowMemo
from pipeplan.sim.cost.memory import memory_excess, rank_memory
from pipeplan.sim.cost.plan_costs import StageKey, plan_costs
from pipeplan.sim.cost.types import Costs, StageCost
from pipeplan.sim.engine.simulator import iteration_time
from pipeplan.sim.engine.timing_key import TimingKey, TimingKeys
from pipeplan.sim.plan_sim import simulate_plan
from pipeplan.sim.result import SimResult

RANK_MICROBATCHES = 48
"""Above this many microbatches, rank by simulating fewer and extrapolating the steady state."""


@dataclass(frozen=True, slots=True)
class Score:
    """A plan's (estimated) iteration time in ms and its memory margin.

    `excess_bytes` is the largest amount by which a device's peak memory
    exceeds its capacity (<= 0: the plan fits); `excess_rank` names that rank.
    """

    time_ms: float
    excess_bytes: float
    excess_rank: int

    @property
    def fits(self) -> bool:
        """True when every device has room."""
        return self.excess_bytes <= 0


INVALID = Score(float("inf"), float("inf"), -1)

FLOOR_MARGIN = 1 - 1e-9
"""Evaluator.floor's slack: the floor and the simulation add the same terms in other orders (rounding apart)."""


def ranking_counts(plan: Plan) -> tuple[int, int]:
    """The microbatch counts (m1, m2) of the two short runs estimate_time extrapolates from (above m1)."""
    step = plan.num_ranks if plan.schedule in INTERLEAVED else 1
    m1 = max(step, (RANK_MICROBATCHES // step) * step)
    m2 = max(step, ((m1 // 2) // step) * step)
    if m2 >= m1:  # interleaved with more than RANK_MICROBATCHES / 2 ranks: two runs one step apart
        m1 = m2 + step
    return m1, m2


class Evaluator:
    """Simulates plans for one request, caching costs and scores.

    With m > RANK_MICROBATCHES microbatches, the time is ranked from two
    shorter simulations (m1 and m2 microbatches) by linear extrapolation of the
    steady state, T(m) = T(m1) + (m - m1) * slope with slope the larger of
    (T(m1) - T(m2)) / (m1 - m2) and the busiest rank's compute per microbatch;
    `exact` always simulates the full iteration. Memory uses the full schedule's peak
    in-flight counts (a microbatch count where they have saturated).
    """

    def __init__(self, request: PlanRequest) -> None:
        self.request = request
        self.model = request.model
        self.profile = request.profile
        self.cluster = request.cluster
        self._costs: dict[tuple[object, ...], Costs] = {}
        self._stage_costs: dict[StageKey, StageCost] = {}
        self._flows = FlowMemo(request.cluster)
        self._scores: dict[Plan, Score] = {}
        self._schedules: dict[tuple[object, ...], Schedule] = {}
        self._classes: dict[int, tuple[Costs, int]] = {}
        self._timing_ids: dict[TimingKey, int] = {}
        self._timing_keys = TimingKeys()
        self._times: dict[tuple[tuple[object, ...], int], float] = {}
        self._memories: dict[tuple[object, ...], tuple[float, ...]] = {}
        self.simulations = 0

    def costs(self, plan: Plan) -> Costs:
        """plan_costs, cached by what they depend on (stages, replicas, microbatch size, ZeRO stage)."""
        key = (plan.stages, plan.pipeline_replicas, plan.microbatch_size, plan.zero)
        costs = self._costs.get(key)
        if costs is None:
            with phase("stage_costs"):
                costs = plan_costs(plan, self.model, stage_memo=self._stage_costs, flow_memo=self._flows)
            self._costs[key] = costs
        return costs

    def schedule(self, plan: Plan) -> Schedule:
        """plan_schedule, cached by what it depends on."""
        if plan.order is not None:
            return plan_schedule(plan)
        key = (plan.schedule, plan.num_ranks, plan.microbatches, plan.k, plan.chunks)
        schedule = self._schedules.get(key)
        if schedule is None:
            schedule = plan_schedule(plan)
            self._schedules[key] = schedule
        return schedule

    def _time(self, plan: Plan) -> float:
        """The simulated iteration time of `plan`; one simulation per schedule and costs' timing_key (placements that
        only rename devices and resources, e.g. swaps of devices that are not twins, simulate to the same time)."""
        with phase("simulation"):
            costs = self.costs(plan)
            if plan.order is not None:
                self.simulations += 1
                return iteration_time(self.schedule(plan), costs)
            key = ((plan.schedule, plan.num_ranks, plan.microbatches, plan.k, plan.chunks), self._timing_class(costs))
            time = self._times.get(key)
            if time is None:
                self.simulations += 1
                time = iteration_time(self.schedule(plan), costs)
                self._times[key] = time
            return time

    def _timing_class(self, costs: Costs) -> int:
        """The timing class of `costs` (numbered as first seen): costs with one timing_key simulate to one time under
        a schedule. Computed once per costs, when it is first simulated."""
        known = self._classes.get(id(costs))
        if known is None or known[0] is not costs:
            key = self._timing_keys.key(costs)
            known = (costs, self._timing_ids.setdefault(key, len(self._timing_ids)))  # held: its id stays
            self._classes[id(costs)] = known
        return known[1]

    def estimate_time(self, plan: Plan) -> float:
        """Iteration time in ms; extrapolated from shorter runs when m is large (not for explicit orders).

        Raises:
            ScheduleError: a run's schedule is refused (kfkb with k above m2 or m1), before either run is simulated.
        """
        m = plan.microbatches
        m1, m2 = ranking_counts(plan)
        if plan.order is not None or m <= m1:
            return self._time(plan)
        short, shorter = dataclasses.replace(plan, microbatches=m1), dataclasses.replace(plan, microbatches=m2)
        self.schedule(shorter)  # refused (kfkb's k above m2) before the run at m1 is spent on a plan that cannot rank
        t1 = self._time(short)
        t2 = self._time(shorter)
        # Each extra microbatch costs at least the busiest rank's compute for it: a slope measured while a
        # constant part (an all-reduce tail) still dominates would underestimate the full iteration.
        slope = max((t1 - t2) / (m1 - m2), self.busiest_rank_ms(plan))
        return t1 + (m - m1) * slope

    def floor(self, plan: Plan) -> float:
        """A time `score(plan).time_ms` cannot be below: the score when known, else time_floor.chain_floor under
        estimate_time's runs (0.0 where it does not apply: chunk-stages, or costs the model rejects), less
        FLOOR_MARGIN for rounding. Cheap next to a simulation: what screens a candidate before one."""
        known = self._scores.get(plan)
        if known is not None:
            return known.time_ms
        facts = TABLE.get(plan.schedule)
        if plan.chunks != 1 or facts is None or facts.asynchronous:
            return 0.0
        try:
            costs = self.costs(plan)
            m, (m1, _) = plan.microbatches, ranking_counts(plan)
            run = m if plan.order is not None or m <= m1 else m1
            floor = max(chain_floor(costs, run, facts.split_backward), resource_floor(costs, run, facts.split_backward))
            if run < m:  # estimate_time: t1 + (m - m1) * slope with t1 above the floor at m1 and slope >= the busiest rank
                floor += (m - m1) * self.busiest_rank_ms(plan)
        except PipeplanError:
            return 0.0
        return floor * FLOOR_MARGIN

    def busiest_rank_ms(self, plan: Plan) -> float:
        """The largest compute time one microbatch puts on a rank (F + B, or F + I + W, of all its chunk-stages)."""
        per_rank = [0.0] * plan.num_ranks
        split = splits_backward(plan.schedule)
        for s, cost in enumerate(self.costs(plan).stages):
            backward = cost.bwd_input_ms + cost.bwd_weight_ms if split else cost.bwd_ms  # type: ignore[operator]
            per_rank[s % plan.num_ranks] += cost.fwd_ms + backward
        return max(per_rank)

    def rank_memory(self, plan: Plan) -> tuple[float, ...]:
        """Peak bytes per rank at the full microbatch count (sim.cost.memory.rank_memory on a short schedule where it can)."""
        if plan.order is None and plan.chunks == 1 and plan.schedule in WARMUP_FAMILY:
            # closed forms: GPipe holds all m; 1F1B and kFkB hold their warm-up, min(k (p - r), m), on rank r (the
            # steady state frees k before it opens k), as the generated orders give (tests/test_scoring.py)
            costs = self.costs(plan)
            p, m = plan.num_ranks, plan.microbatches
            held = warmup_forwards(plan.schedule, p, m, plan.k)
            return tuple(costs.stages[r].static_bytes + held[r] * costs.stages[r].saved_bytes for r in range(p))
        # in-flight peaks of the generated schedules saturate by this count (a multiple of p)
        saturate = 2 * plan.num_ranks * (plan.k * plan.chunks + 1)
        m = plan.microbatches if plan.order is not None or plan.microbatches <= saturate else saturate
        costs = self.costs(plan)
        with phase("rank_memory"):
            if plan.order is not None:
                return rank_memory(plan, costs, self.schedule(plan))
            # the bytes per rank read only the schedule (so p and its stages' ranks) and each stage's bytes
            stage_bytes = ((c.static_bytes, c.saved_bytes) for c in costs.stages)
            key = (plan.schedule, plan.num_ranks, m, plan.k, plan.chunks, *stage_bytes)
            held = self._memories.get(key)
            if held is None:
                held = rank_memory(plan, costs, self.schedule(dataclasses.replace(plan, microbatches=m)))
                self._memories[key] = held
            return held

    def memory_excess(self, plan: Plan) -> tuple[float, int]:
        """(largest bytes over capacity on any device, its rank)."""
        excess, rank, _ = memory_excess(plan, self.cluster, self.rank_memory(plan))
        return excess, rank

    def score(self, plan: Plan) -> Score:
        """Cached Score of `plan`; INVALID when the cost model rejects it (e.g. a missing link)."""
        cached = self._scores.get(plan)
        if cached is not None:
            return cached
        try:
            excess, rank = self.memory_excess(plan)
            time = self.estimate_time(plan) if excess <= 0 else float("inf")
            score = Score(time, excess, rank)
        except PipeplanError:
            score = INVALID
        self._scores[plan] = score
        return score

    def fastest_fitting(self, accept: Callable[[Plan], bool]) -> list[Plan]:
        """Every plan scored so far that fits and that `accept` takes, fastest first (the first scored on ties):
        what a search stopped by its time budget (planner.time_budget) chooses from."""
        found = [(s.time_ms, i, p) for i, (p, s) in enumerate(self._scores.items()) if s.fits and accept(p)]
        return [p for _, _, p in sorted(found, key=lambda x: (x[0], x[1]))]

    def exact(self, plan: Plan, record: bool = True) -> SimResult:
        """The full simulation of `plan`."""
        with phase("final_simulation"):
            return simulate_plan(plan, self.model, record=record)

    def share_memos(self, other: Evaluator) -> None:
        """Use `other`'s memos of what does not depend on the model, from now on, together with it: a search of
        another layer order of the same profile on the same cluster (dag_search) meets many of the same transfers,
        schedules and timing classes. Each memo is keyed by what it reads: transfers by their devices and bytes,
        schedules by (schedule, p, m, k, chunks), memory by the schedule and the stages' bytes, simulated times by
        the schedule and the costs' timing class (timing_key: all a simulation reads of its costs), so a value
        found by either search is the value the other would compute. Every attribute but the model's own (MODEL_OWN:
        costs, stage costs, scores, which read the model's layer order) is shared, so a memo added later is too.

        Raises:
            ValueError: `other` plans on another cluster.
        """
        if other.cluster is not self.cluster:
            raise ValueError("share_memos: the evaluators plan on different clusters")
        for name, value in vars(other).items():
            if name not in MODEL_OWN:
                setattr(self, name, value)


MODEL_OWN = frozenset({"request", "model", "profile", "cluster", "_costs", "_stage_costs", "_scores", "_classes", "simulations"})
"""The Evaluator attributes that depend on the request's model (or count its own work): never shared (share_memos)."""


class SharedMemos:
    """The model-free memos of one planning run's searches over several layer orders: the first search's evaluator
    keeps them, every later one shares them (Evaluator.share_memos)."""

    def __init__(self) -> None:
        self._first: Evaluator | None = None

    def join(self, evaluator: Evaluator) -> None:
        """Keep `evaluator`'s memos (the first to join) or share the first's with it."""
        if self._first is None:
            self._first = evaluator
        else:
            evaluator.share_memos(self._first)
