"""Candidate generation for the `pipeplan` planner: the pool of plans that selection (search.py) starts from.

The pool holds the baseline planners' plans (seeds), straight pipelines, and
the partition DP's solutions for every (pipeline replicas, microbatch size)
the lower bound allows, each scored by the simulator under 1F1B and 2F2B.
The search space is described in search.py's module docstring.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from pipeplan.core.errors import PipeplanError
from pipeplan.core.partition import solve_scaled
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.plan_space import allows_order, divisors, microbatch_sizes, replica_counts
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.search.blocks import MAX_BLOCKS, make_blocks
from pipeplan.planner.search.mapping import Layout, device_orders
from pipeplan.planner.search.partition_dp import BlockSums, DpCache, DpInputs, block_sums, partition_dp_each
from pipeplan.planner.search.refine import twin_classes
from pipeplan.planner.search.replicated.seeds import SEED_NAME, plan_replicated
from pipeplan.planner.search.scoring import FLOOR_MARGIN, Evaluator
from pipeplan.planner.search.time_floor import PassFloor
from pipeplan.schedules.registry import INTERLEAVED, PLAIN
from pipeplan.sim.cost.layers import static_bytes
from pipeplan.sim.cost.link_model import link_matrices

Progress = Callable[[str, float], None]

MAX_STAGES = 32
MAX_UNITS = 64
LARGE_CLUSTER = 64
"""Above this many devices the search narrows: fewer blocks, one device order, one DP estimate, half the
candidates refined, shorter local searches, only the fast baselines as seeds (LARGE_SEED_PLANNERS)."""
MAX_BLOCKS_LARGE = 32
SEED_PLANNERS = ("dapple", "pipedream", "balanced")
LARGE_SEED_PLANNERS = ("pipedream", "balanced")
"""Seeds above LARGE_CLUSTER: dapple takes seconds on 1024 devices, these two well under one."""
SEED_PIPEDREAM_STATES = 2_048
"""PipeDream seeds only a model of at most this many planning states: its DP and tables grow with their square (a
5,000-layer chain took 34 s and 1 GB as a seed, more than the whole search); the built-in profiles it plans have at
most 1,495 (gnmt_large), and a deep chain's blocks are searched by pipeplan's own DP."""
POOL_GROUPS = (2,)
BaselineRuns = Mapping[str, PlanResult | None]
"""Baseline planners already run on the very request being planned, by name: the result, or None where the
planner found no plan (a PipeplanError). `compare` hands its rows over so the search does not plan them again."""


class Candidates:
    """The candidate pool of one planning run (search.py's docstring has the search space)."""

    def __init__(self, request: PlanRequest, progress: Progress | None = None, baselines: BaselineRuns | None = None) -> None:
        self.request = request
        self.profile = request.profile
        self.cluster = request.cluster
        self.progress = progress or (lambda message, fraction: None)
        self.evaluator = Evaluator(request)
        self.bandwidth, self.latency = link_matrices(self.cluster)
        self.twins = twin_classes(self.cluster)
        self.orders = device_orders(self.cluster, self.bandwidth, self.twins)
        self.large = self.cluster.num_devices > LARGE_CLUSTER
        self.blocks = make_blocks(self.profile, MAX_BLOCKS_LARGE if self.large else MAX_BLOCKS)
        self.layer_costs = request.model.layers
        self._sums: dict[tuple[float, int], BlockSums] = {}
        self._dp_cache = DpCache()  # the DP's placement arrays and solutions, for every (rp, b) and layout
        self.pool: list[Plan] = []
        self.seeds: dict[str, Plan] = {}
        self.seed_times: dict[str, float] = {}
        self.baselines = dict(baselines or {})
        self.reused: list[str] = []
        self.best_time = float("inf")
        self.with_seeds = True
        self.max_speed = max(d.speed for d in self.cluster.devices)
        self._pass_floor: PassFloor | None = None
        self.unbeatable = False

    def block_sums(self, microbatch_size: int, replicas: int) -> BlockSums:
        """Block range sums of a stage on `replicas` devices at microbatch size b (b / replicas samples each), cached."""
        key = (microbatch_size / replicas, microbatch_size)
        sums = self._sums.get(key)
        if sums is None:
            sums = self._sums[key] = block_sums(self.layer_costs, self.blocks, *key)
        return sums

    # ---- candidate generation -------------------------------------------------------------
    def replica_counts(self) -> list[int]:
        """Pipeline replica counts rp: divisors of the device count that divide the global batch."""
        return [rp for rp in replica_counts(self.request) if self.cluster.num_devices % rp == 0]

    def microbatch_sizes(self, rp: int) -> list[int]:
        """Microbatch sizes b for rp pipeline replicas: the request's or every divisor of the per-replica batch."""
        return microbatch_sizes(self.request, self.request.global_batch // rp)

    def lower_bound(self, rp: int, b: int) -> float:
        """A bound no plan with rp pipeline replicas and microbatch size b beats (ms).

        A stage on r devices gives each b / r samples, r dividing b. Per layer,
        the least compute per sample over those splits, c_i = min_{x | b}
        (F_i(x) + B_i(x)) / x, bounds the work of one microbatch over all its
        devices below by b * sum_i c_i; the busiest of the at most `usable`
        devices of a pipeline does at least 1/usable of it per microbatch, m
        times. One microbatch also passes every layer once, at no fewer than
        min_{x | b} (F_i(x) + B_i(x)) each. Both at the fastest device's speed.
        """
        n = self.cluster.num_devices // rp
        m = self.request.global_batch // (rp * b)
        usable = min(n, min(MAX_STAGES, len(self.blocks)) * b)
        # samples per device: r = b / x replicas, at most n (one without stage replication)
        splits = [x for x in divisors(b) if b // x <= (n if self.request.stage_replicas_allowed else 1)]
        per_layer = np.array([self.layer_costs.per_layer_ms(x) for x in splits])
        per_sample = (per_layer / np.array(splits, dtype=float)[:, None]).min(axis=0)
        busiest = m * b * float(per_sample.sum()) / (usable * self.max_speed)
        return max(busiest, float(per_layer.min(axis=0).sum()) / self.max_speed)

    def add(self, plan: Plan, score: bool = True) -> float:
        """Score a 1F1B candidate and its kFkB forms (POOL_GROUPS: they hide transfers), keep those that fit.

        With `score` off (a plan known not to beat best_time) each form that fits in memory joins unscored: ranking
        the pool (Search.fastest_first) scores it only if its floor ever comes up, so it is simulated only when
        needed (a form whose time cannot be estimated is then dropped there, as here)."""
        best = float("inf")
        variants = [plan] + [dataclasses.replace(plan, schedule="kfkb", k=k) for k in POOL_GROUPS if k < plan.microbatches]
        for variant in variants:
            if not score:
                with contextlib.suppress(PipeplanError):
                    if self.evaluator.memory_excess(variant)[0] <= 0:  # Evaluator.score's test of fitting
                        self.pool.append(variant)
                continue
            scored = self.evaluator.score(variant)
            if scored.fits:
                self.pool.append(variant)
                best = min(best, scored.time_ms)
        self.best_time = min(self.best_time, best)
        return best

    def units(self, rp: int, b: int) -> tuple[int, int, tuple[int, ...]]:
        """(devices per unit, units per pipeline, allowed stage widths in units: r = width * unit divides b).

        Without stage replication a unit is one device and a pipeline has no more of them than it can have stages.
        """
        n = self.cluster.num_devices // rp
        if not self.request.stage_replicas_allowed:
            return 1, min(n, MAX_STAGES, len(self.blocks)), (1,)
        unit = 1
        while n // unit > MAX_UNITS:
            unit *= 2
        k_units = n // unit
        return unit, k_units, tuple(rho for rho in range(1, k_units + 1) if b % (rho * unit) == 0)

    def dp_candidates(self, rp: int, b: int) -> float:
        """Run the DP for every layout at (rp, b); return the best time found."""
        unit, k_units, choices = self.units(rp, b)
        if not choices:
            return float("inf")
        # a pipeline's positions: its share of the devices, or (without stage replication) one per possible stage
        n = self.cluster.num_devices // rp if self.request.stage_replicas_allowed else k_units
        m = self.request.global_batch // (rp * b)
        sums = {rho * unit: self.block_sums(b, rho * unit) for rho in choices}
        inputs = DpInputs(
            sums, self.cluster, self.bandwidth, self.latency, m, self.request.model.optimizer_factor, choices, MAX_STAGES,
            holding=self.request.model.holding,
        )  # fmt: skip
        orders = self.orders[:1] if self.large else self.orders
        # two estimates of the all-reduce: fully exposed, and hidden behind the earlier stages' backwards
        hides = (False,) if self.large else (False, True)
        best = float("inf")
        for order in orders:
            for replica_major in (True, False) if rp > 1 else (True,):
                layout = Layout(order, rp, n, unit, replica_major)
                each = partition_dp_each(inputs, layout, hides, keep=3, cache=self._dp_cache)
                solutions = [sol for variant in each for sol in variant]
                for solution in solutions:
                    stages = tuple(
                        Stage(st.first_layer, st.last_layer, layout.devices(st.first_unit, st.units)) for st in solution.stages
                    )
                    best = min(best, self.add(Plan(stages, rp, m, b, "1f1b")))
        return best

    def straight(self, order: tuple[int, ...], b: int, by_memory: bool = False, stages: int | None = None) -> Plan | None:
        """One device per stage along `order`, all devices (or layers, or `stages`), balanced by time (or by memory)."""
        layers = self.profile.layers
        count = min(len(layers), len(order), stages or len(order))
        arrays = self.layer_costs.arrays(b)
        if by_memory:
            factor, held = self.request.model.optimizer_factor, self.request.model.holding
            work = [
                static_bytes(x.param_bytes, factor, held) + saved * count
                for x, saved in zip(layers, arrays.saved.tolist(), strict=True)
            ]
            factors = [self.cluster.devices[d].memory_bytes for d in order[:count]]
        else:
            work = (arrays.fwd + arrays.bwd).tolist()
            factors = [self.cluster.devices[d].speed for d in order[:count]]
        bounds = solve_scaled(work, factors)
        if bounds is None:
            return None
        chain = tuple(Stage(a, z, (order[i],)) for i, (a, z) in enumerate(bounds))
        return Plan(chain, 1, self.request.global_batch // b, b, "1f1b")

    def seed_from_baselines(self) -> None:
        """Add the plans of the baseline planners to the pool (above LARGE_CLUSTER, the fast ones), and up to
        LARGE_CLUSTER pipeplan's own replicated-pipeline seeds (search.replicated, extra["seeds"]["replicated"]).

        Note:
            A portfolio safety net: refinement then starts from the baselines'
            plans too, so pipeplan never returns a slower plan than they do. The
            replicated seeds keep the DAPPLE-inspired allocation search the
            `dapple` baseline ran before it became a faithful port of DAPPLE.
            `extra["seeds"]` reports their times and `extra["won_by_seed"]`
            names the baseline whose plan pipeplan returned unchanged, if any.
            With a schedule asked for, the baselines plan as for 1f1b (for `list`,
            as they would by default): their stages seed the search, and their
            plans compete unchanged when their schedule is the one asked for.
            A baseline already run on this request (`baselines`) is taken as it is, not planned again; `reused`
            names those. PipeDream does not seed a model of more than SEED_PIPEDREAM_STATES planning states.
        """
        from pipeplan.planner.baselines import BASELINES
        from pipeplan.planner.baselines.pipedream_graph import graph_of_profile
        from pipeplan.planner.baselines.pipedream_planner import within_states

        wanted = self.request.schedule
        request = self.request if allows_order(wanted) else dataclasses.replace(self.request, schedule=PLAIN)
        shared = self.baselines if request is self.request else {}
        for name in LARGE_SEED_PLANNERS if self.large else SEED_PLANNERS:
            self.progress(f"seeding from planner {name}", 0.0)
            if name == "pipedream" and not within_states(graph_of_profile(self.profile), SEED_PIPEDREAM_STATES):
                continue  # also when `compare` ran it: plan and compare's pipeplan row start from the same seeds
            if name in shared:
                self.reused.append(name)
                found = shared[name]
                if found is None:
                    continue
                result = found
            else:
                try:
                    result = BASELINES[name](request)
                except PipeplanError:
                    continue
            self.take_seed(name, result)
        if not self.large:
            self.progress(f"seeding from pipeplan's {SEED_NAME} pipelines", 0.0)
            with contextlib.suppress(PipeplanError):
                self.take_seed(SEED_NAME, plan_replicated(request))

    def take_seed(self, name: str, result: PlanResult) -> None:
        """Record a seed's plan and time under `name` and add it (and its plain 1F1B form) to the pool."""
        self.seeds[name] = result.plan
        self.seed_times[name] = result.iteration_time
        if self.evaluator.score(result.plan).fits:
            self.pool.append(result.plan)
            self.best_time = min(self.best_time, self.evaluator.score(result.plan).time_ms)
        if result.plan.schedule != PLAIN and result.plan.chunks == 1:
            self.add(dataclasses.replace(result.plan, schedule=PLAIN, k=1, order=None))

    def straight_plans(self) -> list[Plan]:
        """The straight pipelines the pool starts from: for the first three microbatch sizes, one device per stage
        over all devices in device order and along the first device order; with an interleaved schedule asked for,
        also the three deepest p dividing m (interleaving needs p | m and two layers per rank)."""
        plans = []
        for b in self.microbatch_sizes(1)[:3]:
            plans += [self.straight(order, b) for order in (tuple(range(self.cluster.num_devices)), self.orders[0])]
            if self.request.schedule in INTERLEAVED:
                m, n = self.request.global_batch // b, min(self.cluster.num_devices, self.profile.num_layers // 2)
                plans += [self.straight(self.orders[0], b, stages=p) for p in [p for p in divisors(m) if 2 <= p <= n][-3:]]
        return [plan for plan in plans if plan is not None]

    def cannot_beat(self, plans: list[Plan]) -> bool:
        """Whether nothing the search derives from straight `plans` can beat `best_time`: each one's PassFloor
        (one device per stage, any microbatch size, p - 1 crossings) is at least best_time."""
        if not plans or self.best_time == float("inf"):
            return False
        if self._pass_floor is None:
            self._pass_floor = PassFloor(self.request.model, divisors(self.request.global_batch))
        return all(self._pass_floor.at(plan.num_ranks - 1) * FLOOR_MARGIN >= self.best_time for plan in plans)

    def generate(self) -> None:
        """Fill the pool: baselines' plans (unless `with_seeds` is off), straight pipelines, then the DP over every
        (rp, b) its bound allows (below `best_time`, which a caller may start lower than infinity).

        Straight pipelines that cannot beat best_time (cannot_beat) join unscored (add): their scores, at least
        best_time, would change neither best_time nor the DP's bounds nor the pool's ranking. When they are all the
        pool holds, `unbeatable` says so: nothing this search could return beats best_time.
        """
        if self.with_seeds:
            self.seed_from_baselines()
        straight = self.straight_plans()
        hopeless = self.cannot_beat(straight)
        before = len(self.pool)
        for plan in straight:
            self.add(plan, score=not hopeless)
        joined = len(self.pool) - before
        self.dp_pool()
        self.unbeatable = hopeless and len(self.pool) == joined

    def dp_pool(self) -> None:
        """The partition DP's candidates for every (rp, b) whose lower bound is below best_time."""
        counts = self.replica_counts()[::-1]
        seen: set[tuple[int, tuple[int, ...]]] = set()
        for index, rp in enumerate(counts):
            self.progress(f"partition DP: {rp} pipeline replica(s)", index / max(1, len(counts)))
            # every microbatch size that divides the batch: times follow the size (sim.cost.layers), so a
            # larger microbatch can be faster per sample; only sizes no plan of which can win are skipped
            for b in self.microbatch_sizes(rp):
                unit, _, choices = self.units(rp, b)
                # Skip the same microbatch count and devices per stage over all replicas as a larger rp: the same
                # samples per device, so the same compute and all-reduce, in a layout close to the larger rp's
                # stage-major one (tried already).
                key = (self.request.global_batch // (rp * b), tuple(rho * unit * rp for rho in choices))
                if not choices or key in seen:
                    continue
                seen.add(key)
                if self.lower_bound(rp, b) < self.best_time:
                    self.dp_candidates(rp, b)
