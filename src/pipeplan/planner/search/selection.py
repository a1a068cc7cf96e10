"""The `pipeplan` planner: DP partition and replication, topology-aware mapping, schedule choice, refinement.

Steps (all scored by pipeplan's simulator; the final choice is a full simulation):
1. Candidates (candidates.py): the plans of the baseline planners dapple, pipedream and
   balanced (above 64 devices only pipedream and balanced, which plan in well
   under a second there; a portfolio safety net, reported
   in the result's `extra`); straight pipelines (one device per stage,
   balanced by time); then, for every (rp, b) below, a DP over (layer suffix, devices used,
   stages after) per device order and layout (partition_dp.py): each
   stage's F+B, outgoing transfer and all-reduce on its actual devices,
   memory under 1F1B in-flight counts. Each DP solution is simulated under
   1F1B and 2F2B (extrapolated from short runs when m is large).
2. Schedules: the best distinct candidates under gpipe, 1f1b, kfkb,
   interleaved-1f1b and zb-h1 (schedule_choice.py).
3. Refinement of the best (and of the fastest baseline plan): device swaps/moves (refine.py), stage boundaries
   +-delta layers, other microbatch sizes; then the `list` schedule under
   memory budgets (list_schedule.py); the finalists are simulated in full.

Search space (restricted to stay fast):
- pipeline replicas rp: divisors of the device count that divide the global
  batch, largest first;
- microbatch size b: the request's, else every divisor of global_batch / rp
  (layer times follow b: sim.cost.layers); a size whose (m, devices per
  stage over all replicas) a larger rp already covered is skipped, and so is
  one whose lower bound (Candidates.lower_bound) cannot beat the best
  candidate found so far;
- per-stage replicas r: divisors of b (a microbatch is split evenly over a
  stage's replicas), in multiples of a unit that keeps at most 64 units per
  pipeline (unit 1 up to 64 devices per pipeline);
- device orders: the greedy fastest-link chain, speed groups chained, node
  order; every order (up to twin devices) on clusters of at most 5 devices;
  layouts replica-major and stage-major (mapping);
- at most 32 stages; DP cuts between blocks of layers (at most 64, 32 on
  clusters above 64 devices, cut where few bytes cross), refined later to
  any layer;
- kfkb at every k up to 32, then k about 1.25x apart (schedule_choice.kfkb_groups); interleaved-1f1b v in 2, 3, 4;
  list when 2pm <= 200,000.
Everything is deterministic: no clocks or random numbers steer the search.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import time
from collections.abc import Callable, Iterator

from pipeplan.core.errors import PlanError, ScheduleTooLargeError
from pipeplan.core.plan import Plan
from pipeplan.planner.phase_clock import phase
from pipeplan.planner.plan_space import allows_order, divisors
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.search.candidates import BaselineRuns, Candidates, Progress
from pipeplan.planner.search.list_schedule import list_plan, memory_budgets
from pipeplan.planner.search.refine import improve_placement, refine_boundaries
from pipeplan.planner.search.replicated.seeds import SEED_NAME
from pipeplan.planner.search.schedule_choice import schedule_variants
from pipeplan.planner.search.scoring import RANK_MICROBATCHES, SharedMemos
from pipeplan.planner.search.tensor_grid import has_tensor_layers, plan_tensor
from pipeplan.planner.time_budget import BudgetSpent, budget_rearmed, budget_share, fallback, record_coverage
from pipeplan.schedules.one_f_one_b import one_f_one_b
from pipeplan.schedules.registry import MAX_ACTIONS, PLAIN
from pipeplan.sim.cost.memory import GIB, check_fits, memory_per_device

TOP_CANDIDATES = 6
REFINED = 2
FINALISTS = 4
LIST_MAX_ACTIONS = 200_000
REFINE_ACTIONS = 400_000
SEED_REFINE_MARGIN = 1.2
PLAIN_SHARE = 0.5
"""On a profile with split layers, the share of the time budget left that the plain (t = 1) search may take; the 3D
search that follows gets the rest (with_tensor_parallelism)."""
SCHEDULE_NEEDS = {
    "interleaved-1f1b": "p >= 2 ranks of 2 or more layers each, with m a multiple of p per pipeline",
}
"""What a schedule needs beyond memory, for the error when no candidate can run it."""


class Search:
    """One planning run: it has its candidate pool (`candidates`), then chooses schedules, refines and picks the plan."""

    def __init__(self, request: PlanRequest, progress: Progress | None = None, baselines: BaselineRuns | None = None) -> None:
        self.request = request
        self.candidates = Candidates(request, progress, baselines)
        self.evaluator = self.candidates.evaluator
        self.progress = self.candidates.progress
        self.finalists: list[Plan] = []

    def ranked(self, plans: list[Plan], count: int, by_structure: bool = False, ceiling: float = math.inf) -> list[Plan]:
        """The `count` fastest fitting plans, one per equivalence class (stable: earlier candidates win ties), those
        not above `ceiling` (fastest_first: plans beyond the count are not simulated).

        Plans with the same microbatch count, layers and device sets per stage
        (e.g. 16 pipeline replicas of one device, or one stage on 16 devices)
        compute and all-reduce alike; keeping one leaves room for real
        alternatives. With `by_structure`, plans differing only in schedule
        are alike too (the schedule is chosen later).
        """
        chosen: dict[tuple[object, ...], Plan] = {}
        for plan in self.fastest_first(plans, ceiling):
            stages = tuple((s.first_layer, s.last_layer, frozenset(s.devices)) for s in plan.stages)
            schedule = () if by_structure else (plan.schedule, plan.k, plan.chunks, plan.order is None)
            chosen.setdefault((plan.microbatches, stages, schedule), plan)
            if len(chosen) == count:
                break
        return list(chosen.values())

    def fastest_first(self, plans: list[Plan], ceiling: float = math.inf) -> Iterator[Plan]:
        """The fitting plans (duplicates once) by score, earlier ones first on ties, each simulated only when it is
        needed: a plan waits in a heap under its floor (Evaluator.floor, never above its score) and is scored when
        the floor comes up, so plans a consumer never reaches are never simulated. The same sequence as sorting
        every fitting plan by its score; stops before the first plan whose floor or score is above `ceiling`."""
        heap: list[tuple[float, int, bool]] = []
        unique = list(dict.fromkeys(plans))
        for i, plan in enumerate(unique):
            heap.append((self.evaluator.floor(plan), i, False))
        heapq.heapify(heap)
        while heap:
            value, i, scored = heapq.heappop(heap)
            if value > ceiling:
                return
            if scored:
                yield unique[i]
                continue
            score = self.evaluator.score(unique[i])
            if score.fits:
                heapq.heappush(heap, (score.time_ms, i, True))

    def with_list(self, plan: Plan) -> list[Plan]:
        """Explicit-order versions of `plan`: list scheduling under memory budgets (also capped at DAPPLE's
        2(p-s)-1 warm-up), and DAPPLE's early backward with that warm-up (1F1B's extra_warmup order)."""
        if plan.chunks != 1 or not allows_order(self.request.schedule):
            return []
        if 2 * plan.num_ranks * plan.microbatches > LIST_MAX_ACTIONS:
            return []
        base = dataclasses.replace(plan, schedule="1f1b", k=1, chunks=1, order=None)
        costs = self.evaluator.costs(base)
        capacity = tuple(min(self.request.cluster.devices[d].memory_bytes for d in s.devices) for s in base.stages)
        try:
            budgets = memory_budgets(base, costs, capacity)
        except PlanError:
            return []
        p = plan.num_ranks
        options = [budgets, tuple(min(x, max(1, 2 * (p - s) - 1)) for s, x in enumerate(budgets))]
        early = one_f_one_b(p, plan.microbatches, extra_warmup=True).ranks
        return [list_plan(base, costs, b) for b in dict.fromkeys(options)] + [
            dataclasses.replace(base, schedule="list", order=early)
        ]

    def resized(self, plan: Plan) -> list[Plan]:
        """`plan` with every other microbatch size its replicas allow (a multiple of each stage's replica count)."""
        if self.request.microbatch_size is not None:
            return []
        per_replica = self.request.global_batch // plan.pipeline_replicas
        step = math.lcm(*(plan.replicas_of(s) for s in range(plan.num_ranks)))
        return [
            dataclasses.replace(plan, microbatch_size=b, microbatches=per_replica // b)
            for b in divisors(per_replica)
            if b % step == 0 and b != plan.microbatch_size
        ]

    def refine_budget(self, plan: Plan) -> int:
        """Simulations allowed per local search: REFINE_ACTIONS simulated actions, between 40 and 400."""
        per_evaluation = 3 * len(plan.stages) * min(plan.microbatches, RANK_MICROBATCHES)  # two runs: m1 + m1/2
        return max(40, min(400, REFINE_ACTIONS // per_evaluation))

    def choose(self) -> Plan:
        """Best plan: schedules for the top candidates, placement and boundary refinement, list, exact check."""
        only = self.request.schedule
        generated_only = "auto" if allows_order(only) else only
        widen = 1 if self.candidates.large else 2
        # the fastest candidates that can run the schedule(s) allowed: with --schedule kfkb or interleaved-1f1b
        # the fastest ones may not (too few microbatches, m not a multiple of p), so read down the ranking
        want = TOP_CANDIDATES * widen
        contenders: list[Plan] = []
        taken = 0
        for plan in self.ranked(self.candidates.pool, len(self.candidates.pool), by_structure=True):
            self.progress("choosing schedules", taken / want)
            with phase("schedules"):
                chosen = self.ranked(schedule_variants(plan, self.request.model, generated_only), 1)
            contenders += chosen
            taken += bool(chosen)
            if taken == want:
                break
        best = self.ranked(contenders, REFINED * widen)
        # the fastest baseline plan is refined too, even when DP candidates outrank it before refinement (a deep
        # straight pipeline from `balanced` can end fastest once its boundaries move); above LARGE_CLUSTER only
        # when it is within SEED_REFINE_MARGIN of the best, as refining a 1024-device plan costs seconds
        # (the best baseline seed and pipeplan's own replicated seed each: one displacing the other lost plans)
        times = [self.evaluator.score(p).time_ms for p in best]
        limit = min(times, default=math.inf) * SEED_REFINE_MARGIN if self.candidates.large else math.inf
        for own in (False, True):
            seeds = [p for name, p in self.candidates.seeds.items() if (name == SEED_NAME) == own]
            variants = [v for p in seeds for v in schedule_variants(p, self.request.model, generated_only)]
            seed = self.ranked(variants, 1, ceiling=limit)  # one above the limit is not refined: not simulated
            # an equal time marks the same plan in another form (one pipeline of r-way stages = r pipelines)
            if seed and (t := self.evaluator.score(seed[0]).time_ms) <= limit and not any(math.isclose(t, x) for x in times):
                best.append(seed[0])
                times.append(t)
        refined = []
        for i, plan in enumerate(best):
            self.progress("refining placement and stage boundaries", i / max(1, len(best)))
            budget = self.refine_budget(plan)
            with phase("refine"):
                plan = improve_placement(
                    plan, self.evaluator, budget // 2 if self.candidates.large else budget, self.candidates.twins
                )
                plan = refine_boundaries(plan, self.evaluator, budget)
            refined.append(plan)
            with phase("schedules"):
                refined += self.ranked(schedule_variants(plan, self.request.model, generated_only), 1)
            with phase("refine"):
                for other in self.ranked(self.resized(plan), 1):
                    refined += self.ranked([other, *schedule_variants(other, self.request.model, generated_only)], 1)
        finalists = self.ranked(refined + contenders, FINALISTS)
        if allows_order(only):
            for plan in list(finalists):
                with phase("list_schedules"):
                    finalists += self.ranked(self.with_list(plan), 1)
        # the baselines' own plans compete in the final round as they are (seed_from_baselines)
        finalists += [p for p in self.candidates.seeds.values() if self.evaluator.score(p).fits]
        if only != "auto":
            finalists = [p for p in finalists if p.schedule == only]
        if not finalists:
            raise self.nothing_fits()
        self.progress("confirming with full simulations", 1.0)
        exact = []
        for i, plan in enumerate(finalists):
            try:
                exact.append((self.evaluator.exact(plan, record=False).iteration_time, i, plan))
            except ScheduleTooLargeError:
                continue  # too many microbatches to simulate in full: not a plan anyone can check
        if not exact:
            raise PlanError(
                f"global batch {self.request.global_batch}: every plan found needs more microbatches than can be "
                f"simulated (at most {MAX_ACTIONS:,} actions); give a larger --microbatch-size"
            )
        ranked = sorted(exact, key=lambda x: (x[0], x[1]))
        self.finalists = [plan for _, _, plan in ranked]  # the full simulation's ranking (plan --bandwidth-trace)
        return ranked[0][2]

    def accepts(self, plan: Plan) -> bool:
        """Whether `plan` may be the answer: its schedule is the one asked for (any with "auto")."""
        return self.request.schedule == "auto" or plan.schedule == self.request.schedule

    def has_fallback(self) -> bool:
        """Whether a plan to return has been scored: the time budget stops the search only then."""
        if not self.candidates.pool:  # fitting plans only
            return False
        return self.request.schedule == "auto" or bool(self.evaluator.fastest_fitting(self.accepts))

    def stopped_choice(self, beat_ms: float = math.inf) -> Plan:
        """The answer of a search its time budget stopped: the fastest fitting plan scored.

        Raises:
            PlanError: none scored is faster than `beat_ms` (a further layer order's search, stopped before it found
                one: the caller's plan stands, and no plan of this search is simulated in full).
        """
        found = self.evaluator.fastest_fitting(self.accepts)
        if not found or self.evaluator.score(found[0]).time_ms >= beat_ms:
            raise PlanError(f"the time budget ran out before a plan faster than {beat_ms:g} ms was found")
        self.finalists = found[:FINALISTS]
        return found[0]

    def nothing_fits(self) -> PlanError:
        """The error for an instance where no candidate fits: the most memory-friendly plan's shortfall."""
        sizes = self.candidates.microbatch_sizes(1) or [1]
        b = sizes[0]
        plan = self.candidates.straight(self.candidates.orders[0], b, by_memory=True)
        if self.request.schedule not in ("auto", PLAIN) and plan is not None:
            plan = dataclasses.replace(plan, schedule=self.request.schedule)
        remedy = "try more devices or devices with more memory"
        if b > 1:  # at microbatch size 1 a smaller one is no remedy
            remedy = "try a smaller --microbatch-size, more devices or devices with more memory"
        if plan is None:
            return PlanError(f"no plan fits: {self.request.profile.name} has fewer layers than needed; {remedy}")
        schedule = self.request.schedule
        if schedule in SCHEDULE_NEEDS:
            plan = dataclasses.replace(plan, schedule="1f1b")  # memory first; the schedule's own needs below
        try:
            check_fits(plan, self.request.model)
        except PlanError as exc:
            return PlanError(f"no plan fits in memory: {exc}; {remedy}")
        if schedule in SCHEDULE_NEEDS:
            return PlanError(
                f"no plan can run schedule {schedule!r} for {self.request.profile.name} on {self.request.cluster.name} "
                f"with global batch {self.request.global_batch}: it needs {SCHEDULE_NEEDS[schedule]}; try a larger "
                "--global-batch, a smaller --microbatch-size or --schedule auto"
            )
        need = max(memory_per_device(plan, self.request.model))
        return PlanError(
            f"no plan fits with schedule {self.request.schedule!r} (the best straight pipeline needs {need / GIB:.2f} GiB "
            f"per device); {remedy}, or --schedule auto"
        )


def search_order(
    request: PlanRequest,
    progress: Progress | None = None,
    beat_ms: float = math.inf,
    seeds: bool = True,
    baselines: BaselineRuns | None = None,
    memos: SharedMemos | None = None,
) -> PlanResult:
    """pipeplan's search (module docstring) over the request's profile as the chain it is stored in.

    `beat_ms` (a plan already found elsewhere) lets the partition DP skip every (rp, b) whose lower bound cannot
    beat it; `seeds` off leaves out the baselines' plans (the search on the default order had them); `baselines`
    are baseline runs on `request` already done (compare's), taken as seeds instead of planning them again; `memos`
    are the model-free memos of the run's searches over other layer orders (dag_search), which this one joins.

    Raises:
        PlanError: no plan fits in memory (naming the stage, device and shortfall, with a remedy); with `beat_ms`,
            also when nothing could beat it.
    """
    started = time.perf_counter()
    search = Search(request, progress, baselines)
    if memos is not None:
        memos.join(search.evaluator)
    search.candidates.best_time = beat_ms
    search.candidates.with_seeds = seeds
    # a time budget (planner.time_budget) may stop the search once it has a plan to return, or at once when the
    # caller has one (`beat_ms`: a further layer order's search, whose plan only counts when faster)
    ready = search.has_fallback if beat_ms == math.inf else lambda: True
    try:
        with fallback(ready):
            with phase("candidates"):
                search.candidates.generate()
            if search.candidates.unbeatable:  # only straight pipelines, none of which (nor what it leads to) can beat beat_ms
                raise PlanError(f"no plan along this layer order can beat {beat_ms} ms (the straight pipelines' pass floor)")
            if not search.candidates.pool:
                raise search.nothing_fits()
            plan = search.choose()
    except BudgetSpent:
        record_coverage(simulations=search.evaluator.simulations, candidates=len(search.candidates.pool))
        plan = search.stopped_choice(beat_ms)
    result = search.evaluator.exact(plan)
    memory = check_fits(plan, request.model, result)
    return PlanResult(
        plan,
        "pipeplan",
        result,
        search.evaluator.costs(plan),
        memory,
        time.perf_counter() - started,
        {
            "simulations": search.evaluator.simulations,
            "candidates": len(search.candidates.pool),
            "seeds": dict(search.candidates.seed_times),
            "won_by_seed": next((name for name, seed in search.candidates.seeds.items() if seed == plan), None),
            "seeds_reused": list(search.candidates.reused),
            "finalists": search.finalists,
        },
    )


def plan_pipeplan(request: PlanRequest, progress: Progress | None = None, baselines: BaselineRuns | None = None) -> PlanResult:
    """Plan with pipeplan's search: the fastest simulated plan that fits, over the profile's own layer order and, for
    a DAG, the orders in which the best antichain cuts are contiguous (dag_orders; the default order wins ties).

    Args:
        request: profile, cluster, global batch and optional microbatch size / schedule.
        progress: called with (message, fraction of the current phase) during the search.
        baselines: baseline planners already run on `request` (compare's rows): the search seeds from these
            results rather than planning them again (`extra["seeds_reused"]` names the ones it took).

    Raises:
        PlanError: no plan fits in memory (naming the stage, device and shortfall, with a remedy).
    """
    from pipeplan.planner.search.dag_search import plan_over_orders

    search = search_order if baselines is None else functools.partial(search_order, baselines=baselines)
    if not has_tensor_layers(request):
        return plan_over_orders(request, search, progress)
    return with_tensor_parallelism(request, lambda: plan_over_orders(request, search, progress))


def with_tensor_parallelism(request: PlanRequest, plain: Callable[[], PlanResult]) -> PlanResult:
    """On a profile with split layers: the faster of the plain search's plan (tp 1, zero 0; run unless the request
    forces t > 1 or sharding) and the 3D search's (search.tensor_grid), the plain one on ties; extra["tensor"] says
    what the 3D search chose, extra["notes"] what a user must read (tensor-parallel groups across servers). Under a
    time budget the plain search may take PLAIN_SHARE of it and the 3D search the rest, each stopping at its first
    checkpoint past its share once it has a plan to return.

    Raises:
        PlanError: neither search found a plan that fits (the 3D search's reason).
    """
    started = time.perf_counter()
    flat: PlanResult | None = None
    if (request.tensor_parallel or 1) == 1 and not request.zero:
        try:
            with budget_share(PLAIN_SHARE):
                flat = plain()
        except PlanError:
            flat = None  # no plan fits at t = 1 without sharding: the 3D space decides
    try:
        with budget_rearmed("tensor_search"):
            grid = plan_tensor(request, has_fallback=flat is not None)
    except PlanError:
        if flat is None:
            raise
        return flat
    best = grid if flat is None or grid.iteration_time < flat.iteration_time else flat
    info = grid.extra["tensor"]
    notes = list(info["notes"]) if best is grid else []
    searched = (request.tensor_parallel or 1) == 1 and not request.zero
    flat_ms = None if flat is None else flat.iteration_time
    extra = {**best.extra, "tensor": info, "flat_ms": flat_ms, "flat_searched": searched, "notes": notes}
    return dataclasses.replace(best, extra=extra, planning_seconds=time.perf_counter() - started)
