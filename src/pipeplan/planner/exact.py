"""`exact`: the best plan under pipeplan's simulator for small instances, by branch and bound.

The search space is every plan the cost model can score without interleaving:

- every pipeline-replica count rp that divides the global batch and the
  device count, and every microbatch count m dividing the per-replica batch
  (or the one the request's microbatch size gives);
- every contiguous partition of the layers, and for each stage an ordered
  tuple of unused devices of length r * rp (replica-major, r data-parallel
  replicas; order matters: it fixes which replicas pair up for transfers and
  the all-reduce ring); devices may stay unused;
- every schedule among gpipe, 1f1b, kfkb (k = 2..4, k < m) and zb-h1 (or
  the request's schedule).

Stages are placed left to right in a depth-first search. A partial plan is
dropped when a lower bound on any completion (placed stages: first arrival +
m (F + B) + all-reduce; the layers left: their compute spread over every
free device at the fastest speed) reaches the best simulated time so far;
complete plans are simulated only when their per-schedule lower bound
(busiest stage plus the gradient's way down, one microbatch's critical path)
is below it, and when they fit in memory. The incumbent starts from
straight pipelines over all devices in device order.

What keeps it fast without giving up exactness:
- twins (planner.search.refine.twin_classes: same node, speed, memory and links) are interchangeable, so each
  stage takes of every twin class only its lowest unused device next (canonical_tuples): every plan of the
  space is a twin relabelling of exactly one plan searched, with the same simulated time; 4 identical GPUs
  give 24 times fewer device tuples;
- a shape (rp, m) is searched only when planner.bound's proven bound for it (compute, path, all-reduce, and the
  best split into stages of one rank each) is below the incumbent;
- a device tuple whose stage alone (first input + m (F + B) + all-reduce, which only grows with the stage's
  last layer) passes the incumbent is retired for every longer stage of the same first layer;
- a stage's own costs and its links to the stage before are cached; one plan's costs serve all its schedules.
Tie rule: among plans of equal simulated time the first found wins (shapes by rp ascending, then m descending;
stages by last layer, width, device tuple); on clusters with twins the plan may name other (twin) devices than
before this search skipped twins, and may be another plan of the same time.

Reach (random instances of planner.instances, global batch 32, one core of
a shared 2-core machine, before twins were skipped): 8 layers on 4 devices (search space 3,844) in
under 0.2 s; 8 on 6 (856k) in 1-5 s; 10 on 6 (2.0M) in 2-25 s; 12 on 6
(4.3M) in 10-17 s; 8 on 7 (13.6M) in 11-15 s; 8 on 8 (226M) in 1-2 minutes.
Instances where slow links dominate prune as well (the link bounds), but
time varies with how tight the bounds are. Requests whose search space
exceeds MAX_SPACE (8 on 8 does) are refused with a PlanError. The shared profiles on 2, 3 and 4 identical
V100s: BENCHMARKS.md, "How far `exact` reaches" (benchmarks/exact_speed.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from copy import copy
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.partition import prefix_sums
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.bound import ShapeBounds
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.search.refine import twin_classes
from pipeplan.planner.simulated import evaluate
from pipeplan.schedules import make_schedule
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.schedules.registry import PLANNABLE, TABLE, names_text
from pipeplan.sim.cost.layers import StageWork, static_bytes
from pipeplan.sim.cost.link_model import pair_ms, ring_allreduce_ms
from pipeplan.sim.cost.memory import order_peak_activation
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.cost.types import Costs
from pipeplan.sim.engine.simulator import simulate

COVERED = tuple(n for n in PLANNABLE if TABLE[n].generator is not None and not TABLE[n].takes_chunks)
"""The schedules exact searches: every generated one of p stages (interleaving re-cuts a plan into chunk-stages)."""
SCHEDULES = (("1f1b", 1), ("zb-h1", 1), ("kfkb", 2), ("kfkb", 3), ("kfkb", 4), ("gpipe", 1))
"""(schedule, k) in the order exact tries them (a tie keeps the first)."""
MARGIN = 1e-9
"""Relative slack before a bound that grows with the stage's last layer retires a device tuple (sums in floating
point need not grow by every term they gain)."""
MAX_SPACE = 20_000_000
"""Most (partition, ordered device groups) pairs accepted: 8 layers on 7 devices (13.6M) pass, on 8 (226M) do not."""


def canonical_tuples(free: tuple[int, ...], length: int, classes: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Ordered tuples of `length` distinct devices of `free` (ascending), up to swapping twins.

    `classes[d]` names d's twin class (refine.twin_classes: a permutation inside a class maps every plan onto
    one with the same simulated time). Of each class only its smallest device not yet taken may come next, so
    every tuple of `permutations(free, length)` is a twin-relabelling of exactly one tuple given here, and a
    cluster without twins gives all of them, in the same order.
    """
    if length == 0:
        yield ()
        return
    seen: set[int] = set()
    for i, d in enumerate(free):
        twin = classes[d] if classes else d
        if twin in seen:
            continue
        seen.add(twin)
        for rest in canonical_tuples(free[:i] + free[i + 1 :], length - 1, classes):
            yield (d, *rest)


def ordered_groups(devices: int, stages: int) -> int:
    """How many sequences of `stages` disjoint non-empty ordered device tuples `devices` devices allow."""
    return sum(math.perm(devices, k) * math.comb(k - 1, stages - 1) for k in range(stages, devices + 1))


def search_space(layers: int, devices: int, limit: int | None = None) -> int:
    """(contiguous partition, ordered device groups) pairs: what the exact planner enumerates at most.

    With `limit`, the count stops as soon as it passes the limit (every term is positive) and returns that partial
    count: on 1024 devices the full count has thousands of digits and takes seconds to add up.
    """
    total = 0
    for s in range(1, min(layers, devices) + 1):
        partitions = math.comb(layers - 1, s - 1)
        for k in range(s, devices + 1):
            total += partitions * math.perm(devices, k) * math.comb(k - 1, s - 1)
            if limit is not None and total > limit:
                return total
    return total


@cache
def peak_inflight(name: str, stages: int, microbatches: int, k: int) -> tuple[int, ...]:
    """Per stage, the most microbatches a schedule holds at once (F opens one, B or W closes it)."""
    schedule = make_schedule(name, stages, microbatches, k=k)
    return tuple(int(peak) for peak in order_peak_activation(schedule, (1.0,) * stages))


@dataclass(slots=True)
class _Placed:
    """One placed stage at a fixed (rp, m): its layers, devices and times for a microbatch."""

    first: int
    last: int
    devices: tuple[int, ...]
    fwd: float
    bwd: float
    inp: float  # I of the zero-bubble split (at most B)
    wgt: float  # W of the zero-bubble split
    allreduce: float  # all-reduce, then the optimizer step
    static: float
    act: float
    memory: float
    arrive: float  # earliest start of its first forward: the forward path up to it
    fwd_in: float = 0.0  # transfer from the previous stage, unqueued
    bwd_out: float = 0.0  # gradient transfer back to the previous stage, unqueued
    chain: float = 0.0  # from the start of a backward here to the end of stage 0's backward and all-reduce
    chain_split: float = 0.0  # the same when stages above 0 run only I (zero-bubble)


@dataclass(slots=True)
class _Search:
    """The branch and bound over one request."""

    request: PlanRequest
    schedules: tuple[tuple[str, int], ...]
    classes: tuple[int, ...] = ()
    best_time: float = math.inf
    best_plan: Plan | None = None
    simulated: int = 0
    nodes: int = 0
    works: dict[tuple[int, int, int, int, float], StageWork] = field(default_factory=dict)
    rest_work: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    bases: dict[tuple[int, int, tuple[int, ...], int, int], _Placed] = field(default_factory=dict)
    links: dict[tuple[int, tuple[int, ...], tuple[int, ...], int, int], tuple[float, float]] = field(default_factory=dict)

    # -- costs, from sim's cost model -------------------------------------------------------------------
    def work(self, first: int, last: int, size: int, r: int, speed: float) -> StageWork:
        """sim.layer_costs' costs of layers first..last on r replicas of `speed` at microbatch size `size`, cached."""
        key = (first, last, size, r, speed)
        got = self.works.get(key)
        if got is None:
            got = self.works[key] = self.request.model.layers.stage(range(first, last + 1), size, r, speed)
        return got

    def rest(self, size: int, devices: int) -> list[float]:
        """Suffix sums over layers of the least compute per sample at microbatch size `size` on at most `devices`
        replicas: size * rest[i] bounds the device-time of layers i.. per microbatch from below (see lower_bound)."""
        key = (size, devices)
        got = self.rest_work.get(key)
        if got is None:
            costs = self.request.model.layers
            splits = [x for x in range(1, size + 1) if size % x == 0 and size // x <= devices]
            per_sample = np.min([costs.per_layer_ms(x) / x for x in splits], axis=0).tolist()
            got = self.rest_work[key] = prefix_sums(reversed(per_sample))[::-1]
        return got

    def transfer(self, before: _Placed, after: _Placed, rp: int, nbytes: float, forward: bool) -> float:
        """Slowest pair over all pipeline replicas (each pair carries 1/q of the bytes)."""
        r1, r2 = len(before.devices) // rp, len(after.devices) // rp
        q = min(r1, r2)
        worst = 0.0
        for t in range(rp):
            for i in range(q):
                a, b = before.devices[t * r1 + i], after.devices[t * r2 + i]
                pair = (
                    pair_ms(self.request.cluster, a, b, nbytes / q)
                    if forward
                    else pair_ms(self.request.cluster, b, a, nbytes / q)
                )
                worst = max(worst, pair)
        return worst

    def base(self, first: int, last: int, devices: tuple[int, ...], rp: int, size: int) -> _Placed:
        """What a stage costs on its own (compute, all-reduce, memory), before any stage is put before it; cached."""
        key = (first, last, devices, rp, size)
        got = self.bases.get(key)
        if got is not None:
            return got
        cluster = self.request.cluster
        r = len(devices) // rp
        speed = min(cluster.devices[d].speed for d in devices)
        work = self.work(first, last, size, r, speed)
        inp = work.bwd_ms / 2 if work.bwd_input_ms is None else min(work.bwd_input_ms, work.bwd_ms)
        wgt = work.bwd_ms / 2 if work.bwd_weight_ms is None else work.bwd_weight_ms
        got = self.bases[key] = _Placed(
            first,
            last,
            devices,
            fwd=work.fwd_ms,
            bwd=work.bwd_ms,
            inp=inp,
            wgt=wgt,
            allreduce=ring_allreduce_ms(cluster, devices, work.param_bytes) + work.optimizer_ms,
            static=static_bytes(work.param_bytes, self.request.model.optimizer_factor),
            act=work.saved_bytes,
            memory=min(cluster.devices[d].memory_bytes for d in devices),
            arrive=0.0,
        )
        return got

    def place(self, first: int, last: int, devices: tuple[int, ...], rp: int, size: int, prev: _Placed | None) -> _Placed:
        """Costs of layers first..last on `devices` after `prev`, at microbatch size `size`."""
        stage = copy(self.base(first, last, devices, rp, size))
        if prev is None:
            stage.chain = stage.chain_split = stage.bwd + stage.allreduce
        else:
            key = (prev.last, prev.devices, devices, rp, size)
            links = self.links.get(key)
            if links is None:
                nbytes = self.request.model.layers.cut_bytes(prev.last, size)
                links = self.links[key] = (
                    self.transfer(prev, stage, rp, nbytes, True),
                    self.transfer(prev, stage, rp, nbytes, False),
                )
            stage.fwd_in, stage.bwd_out = links
            stage.arrive = prev.arrive + prev.fwd + stage.fwd_in
            stage.chain = stage.bwd + stage.bwd_out + prev.chain
            stage.chain_split = stage.inp + stage.bwd_out + prev.chain_split
        return stage

    @staticmethod
    def compute_bound(stage: _Placed, m: int) -> float:
        """The stage's first input, its m forwards and backwards, its all-reduce: nondecreasing in its last layer."""
        return stage.arrive + m * (stage.fwd + min(stage.bwd, stage.inp + stage.wgt)) + stage.allreduce

    def placed_bound(self, stage: _Placed, prev: _Placed | None, m: int) -> float:
        """A bound every completion and schedule obeys, from a stage and the ones before it.

        Its compute after its first input, then its all-reduce; and the m
        transfers on its slowest link in each direction, each followed by the
        last microbatch's way down to stage 0 and stage 0's all-reduce.
        """
        bound = stage.arrive + m * (stage.fwd + min(stage.bwd, stage.inp + stage.wgt)) + stage.allreduce
        if prev is not None:
            down = stage.inp + prev.chain_split
            bound = max(
                bound,
                prev.arrive + prev.fwd + m * stage.fwd_in + stage.fwd + down,
                stage.arrive + stage.fwd + stage.inp + m * stage.bwd_out + prev.chain_split,
            )
        return bound

    # -- bounds ----------------------------------------------------------------------------------------
    def schedule_bound(self, stages: list[_Placed], m: int, split: bool) -> float:
        """Lower bound on the iteration of these stages under a schedule (split: backward as I and W).

        The largest of: per stage, first input + m (F + B) + the longer of its
        all-reduce and (unsplit only) the gradient's way down from it; one
        microbatch's path forward and back; per boundary and direction, the m
        transfers on its slowest pair plus the way before and after them.
        """
        last = stages[-1]
        chain = [st.chain_split if split else st.chain for st in stages]
        part = [st.inp if split else st.bwd for st in stages]
        part[0] = min(stages[0].bwd, stages[0].inp + stages[0].wgt)  # stage 0 runs I and W of the last microbatch itself
        forward_end = last.arrive + last.fwd
        bound = forward_end + chain[-1]
        first_backward = forward_end  # earliest start of the first backward on stage s (scanned downwards)
        for s in range(len(stages) - 1, -1, -1):
            st = stages[s]
            tail = st.allreduce if split or s == 0 else max(st.allreduce, st.bwd_out + chain[s - 1])
            bound = max(bound, st.arrive + m * (st.fwd + (st.inp + st.wgt if split else st.bwd)) + tail)
            if s:
                rest_forward = forward_end - st.arrive  # F on s and every stage after it, with transfers
                prev = stages[s - 1]
                bound = max(bound, prev.arrive + prev.fwd + m * st.fwd_in + rest_forward + chain[-1])
                bound = max(bound, first_backward + part[s] + m * st.bwd_out + chain[s - 1])
                first_backward += part[s] + st.bwd_out
        return bound

    # -- search ---------------------------------------------------------------------------------------
    def finish(self, stages: list[_Placed], rp: int, m: int, size: int) -> None:
        """Simulate every schedule of a complete plan that could beat the best and fits."""
        bounds = {False: self.schedule_bound(stages, m, False), True: self.schedule_bound(stages, m, True)}
        plan_stages = tuple(Stage(st.first, st.last, st.devices) for st in stages)
        costs: Costs | None = None  # one plan's costs serve every schedule (plan_costs reads no schedule)
        for name, k in self.schedules:
            if (name == "kfkb" and k >= m) or bounds[name == "zb-h1"] >= self.best_time:
                continue
            peaks = peak_inflight(name, len(stages), m, k)
            if any(st.static + peaks[s] * st.act > st.memory for s, st in enumerate(stages)):
                continue
            plan = Plan(plan_stages, rp, m, size, name, k=k)
            if costs is None:
                costs = plan_costs(plan, self.request.model)
            result = simulate(plan_schedule(plan), costs, record=False)  # simulate_plan's own steps
            self.simulated += 1
            if result.iteration_time < self.best_time:
                self.best_time, self.best_plan = result.iteration_time, plan

    def too_short(self, prev: _Placed | None, last: int, left: int, fastest: float, m: int, size: int) -> bool:
        """Whether every stage ending at `last` leaves more than the incumbent for the layers after it: the rest
        check of grow with its parts that depend on the stage's devices dropped (no transfer in, the stage's own
        forward left out, the fastest free device)."""
        arrive = prev.arrive + prev.fwd if prev is not None else 0.0
        return arrive + m * size * self.rest(size, left)[last + 1] / (left * fastest) >= self.best_time

    def grow(self, stages: list[_Placed], free: tuple[int, ...], rp: int, m: int, size: int) -> None:
        """Place the next stage in every way, pruning by the bound, recursing until all layers are placed."""
        self.nodes += 1
        layers = self.request.profile.num_layers
        start = stages[-1].last + 1 if stages else 0
        prev = stages[-1] if stages else None
        speeds = [self.request.cluster.devices[d].speed for d in free]
        # device tuples whose stage alone already costs more than the best plan: adding layers only adds to it
        dead: set[tuple[int, ...]] = set()
        for last in range(start, layers):
            rest_layers = layers - 1 - last
            for group in range(rp, (len(free) if self.request.stage_replicas_allowed else rp) + 1, rp):
                r = group // rp
                if size % r or (rest_layers and len(free) - group < rp):
                    continue
                if rest_layers and self.too_short(prev, last, (len(free) - group) // rp, max(speeds), m, size):
                    continue  # the check below, before any device tuple is costed
                for devices in canonical_tuples(free, group, self.classes):
                    if devices in dead:
                        continue
                    stage = self.place(start, last, devices, rp, size, prev)
                    if self.compute_bound(stage, m) > self.best_time * (1 + MARGIN):
                        dead.add(devices)
                        continue
                    if stage.static + stage.act > stage.memory:
                        continue
                    if self.placed_bound(stage, prev, m) >= self.best_time:
                        continue
                    left = tuple(d for d in free if d not in devices)
                    if rest_layers:
                        # the layers left, on the devices left: at least their least compute per sample, each sample
                        work = size * self.rest(size, len(left) // rp)[last + 1]
                        fastest = max(speeds[i] for i, d in enumerate(free) if d not in devices)
                        rest = stage.arrive + stage.fwd + m * work / ((len(left) // rp) * fastest)
                        if rest >= self.best_time:
                            continue
                        self.grow([*stages, stage], left, rp, m, size)
                    else:
                        self.finish([*stages, stage], rp, m, size)

    def run(self) -> None:
        """Seed with straight pipelines, then search every (rp, m) from many microbatches down."""
        request = self.request
        devices = request.cluster.num_devices
        layers = request.profile.num_layers
        shapes = []
        for rp in range(1, (devices if request.pipelines_allowed else 1) + 1):
            if request.global_batch % rp:
                continue
            replica_batch = request.global_batch // rp
            for m in range(replica_batch, 0, -1):
                size = replica_batch // m
                if replica_batch % m or (request.microbatch_size and size != request.microbatch_size):
                    continue
                shapes.append((rp, m, size))
        for rp, m, size in shapes:
            depth = min(layers, devices // rp)
            bounds = [round(i * layers / depth) for i in range(depth + 1)]
            seed = [(bounds[i], bounds[i + 1] - 1, tuple(t * depth + i for t in range(rp))) for i in range(depth)]
            stages: list[_Placed] = []
            for first, last, group in seed:
                stages.append(self.place(first, last, group, rp, size, stages[-1] if stages else None))
            if all(st.static + st.act <= st.memory for st in stages):
                self.finish(stages, rp, m, size)
        # a shape whose proven bound (planner.bound: compute, path, all-reduce, and the best split into stages)
        # cannot beat the incumbent is skipped
        bounds = ShapeBounds(request)
        least = {}
        for rp, m, size in shapes:
            if bounds.fits(rp):
                least[rp, m, size] = max(*bounds.terms(rp, size), bounds.stages(rp, size))
        for shape in least:
            if least[shape] <= self.best_time * (1 + MARGIN):
                self.grow([], tuple(range(devices)), *shape)


def plan_exact(request: PlanRequest) -> PlanResult:
    """The plan with the smallest simulated iteration time, for small instances (see the module docstring).

    Raises:
        PlanError: the instance is too large, the schedule is not one the
            exact search covers, or no plan fits in memory.
    """
    started = time.perf_counter()
    layers, devices = request.profile.num_layers, request.cluster.num_devices
    space = search_space(layers, devices, limit=MAX_SPACE)
    if space > MAX_SPACE:
        raise PlanError(
            f"planner 'exact' handles at most {MAX_SPACE:,} (partition, device groups) pairs; "
            f"{layers} layers on {devices} devices give more; use --planner pipeplan"
        )
    if request.schedule == "auto":
        schedules = SCHEDULES
    elif request.schedule in COVERED:
        schedules = tuple(s for s in SCHEDULES if s[0] == request.schedule)
    else:
        raise PlanError(f"planner 'exact' covers {names_text(COVERED, 'and')}, got schedule {request.schedule!r}")
    search = _Search(request, schedules, twin_classes(request.cluster))
    search.run()
    if search.best_plan is None:
        raise PlanError(
            f"planner 'exact' found no plan that fits in memory for {request.profile.name} on "
            f"{request.cluster.name} (global batch {request.global_batch}); try more devices or a smaller batch"
        )
    try:
        result, memory = evaluate(request, search.best_plan, record=True)
    except PipeplanError as exc:  # the search checked memory the same way; this would be a bug
        raise PlanError(f"planner 'exact' chose a plan that does not fit: {exc}") from exc
    extra = {"simulated": search.simulated, "search_nodes": search.nodes, "search_space": space}
    costs = plan_costs(search.best_plan, request.model)
    return PlanResult(search.best_plan, "exact", result, costs, memory, time.perf_counter() - started, extra)
