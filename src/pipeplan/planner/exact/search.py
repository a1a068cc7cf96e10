"""exact's branch and bound over one request: shapes best-bound first, stages placed left to right.

A shape (rp, m) is searched only while planner.bound.shape_bounds's proven bound for it (compute, path,
all-reduce) and the suffix table's (planner.bound.suffix_table: the best split into stages) are below the
incumbent; it is seeded first with the split that table found and with even pipelines of each stage width, on the
devices in ring_order, and every new best plan is polished (its cuts moved while faster; exact.first_plans makes
these plans). Before the full searches, each shape gets a cut-short one (at most PROBED nodes, FAN stage ends per
node, each on its first device tuple) for a better incumbent: it only finds plans sooner, the full searches still
cover every plan. Stages are placed left to right, depth first. A stage end is tried only when the table says the
stage and the layers after it can still beat the incumbent and the look-ahead (exact.lookahead: the stage on no
devices in particular, every cost from below, and LOOK stages after it, spans of their ends ruled out at once)
does not rule it out, both before any device tuple is costed; a device tuple is retired for every longer stage of
the same first layer once its stage alone passes the incumbent; a partial plan is dropped when a bound on any
completion (planner.bound.placed_bounds, the table from the stage's actual forward end, and exact.filled:
placed_bounds.fill_bound over every stage count and schedule its memory allows, with the table's way up and back
and Tables.hop) reaches the incumbent; a complete plan is simulated only when its per-schedule bounds
(schedule_bound, fill_bound) are below the incumbent and it fits. What the search reads besides its incumbent is
its Tables (exact.search_tables), which filled and lookahead take as an argument with the best time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field

from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.bound.placed_bounds import (
    MARGIN,
    Placed,
    compute_bound,
    placed_bound,
)
from pipeplan.planner.bound.suffix_table import SLACK
from pipeplan.planner.exact.filled import filled, open_schedules
from pipeplan.planner.exact.first_plans import even_splits, moves, place_split, ring_order, straight_split
from pipeplan.planner.exact.lookahead import hopeless
from pipeplan.planner.exact.search_tables import Tables, tables_for
from pipeplan.planner.exact.space import canonical_list
from pipeplan.planner.exact.stages import holds_one
from pipeplan.planner.exact.symmetry import least_in_orbit
from pipeplan.planner.plan_space import shapes_with_counts as shapes
from pipeplan.planner.request import PlanRequest
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.cost.types import Costs
from pipeplan.sim.engine.simulator import simulate

SEEDED = 4
"""Shapes (lowest bounds first) whose suffix table's split is simulated before any search, for a first incumbent."""
PROBED = 60
"""Nodes a first, cut-short search of each shape may visit (lowest bounds first) before the full searches."""

FAN = 3
"""Stage ends each node of a cut-short search may search (the lowest bounds first), each on its first device tuple."""


class Spent(Exception):
    """A cut-short search has used its nodes."""


def sim_key(costs: Costs) -> tuple[object, ...]:
    """All a one-stage-per-rank simulation without trace reads of its costs: the stages' costs, each transfer's
    flows, their resources renamed in order of first use (sim.engine.transfers.TransferTable numbers them so), and
    the shared parameters' exchanges.

    Two plans of equal keys simulate to the same iteration time under a schedule (same name, k and m), whichever
    devices they name: exact simulates each key once.
    """
    names: dict[str, int] = {}
    flows = tuple(
        tuple((tuple(names.setdefault(r, len(names)) for r in f.resources), f.latency_ms, f.work_ms) for f in boundary)
        for boundary in costs.forward + costs.backward
    )
    exchanges = tuple((x.stages, x.exchange_ms) for x in costs.shared)  # a shared parameter's ring: its devices' links
    # an all-reduce's ring names devices, and only a trace reads it: left out, as the flows' device names
    stages = tuple(dataclasses.replace(c, allreduce_ring=()) if c.allreduce_ring else c for c in costs.stages)
    return stages, flows, exchanges


@dataclass(slots=True)
class BranchAndBound:
    """The branch and bound over one request."""

    request: PlanRequest
    schedules: tuple[tuple[str, int], ...]
    classes: tuple[int, ...] = ()
    group: tuple[tuple[int, ...], ...] = ()  # the cluster's automorphisms (exact.symmetry), () with twins
    best_time: float = math.inf
    best_plan: Plan | None = None
    simulated: int = 0
    nodes: int = 0
    shapes_searched: int = 0
    tables: Tables = field(init=False)  # what the search reads besides its incumbent (tables_for)
    seen: dict[tuple[object, ...], float] = field(default_factory=dict)  # (schedule, k, m, rp, sim_key) -> time
    limit: float = math.inf  # most nodes before Spent (a cut-short search)
    fan: float = math.inf  # most children a node searches (a cut-short search)
    order: tuple[int, ...] = field(init=False)  # the seeds' device order (first_plans.ring_order)
    polishing: bool = False  # inside BranchAndBound.polish (which finishes plans itself)

    def __post_init__(self) -> None:
        self.tables = tables_for(self.request, self.schedules, self.classes)
        self.order = ring_order(self.request)

    def finish(self, stages: list[Placed], rp: int, m: int, size: int, cap: float | None = None) -> float:
        """Simulate every schedule of a complete plan that could beat `cap` (the best) and fits; the least time
        simulated (inf when none was). A faster plan than the best becomes the best."""
        cap = self.best_time if cap is None else cap
        least = math.inf
        plan_stages = tuple(Stage(st.first, st.last, st.devices) for st in stages)
        costs: Costs | None = None  # one plan's costs serve every schedule (plan_costs reads no schedule)
        key: tuple[object, ...] = ()
        for name, k in open_schedules(self.schedules, stages, m, cap):
            plan = Plan(plan_stages, rp, m, size, name, k=k)
            if costs is None:
                costs = plan_costs(plan, self.request.model)
                key = sim_key(costs)
            seen = self.seen.get((name, k, m, rp, key))
            if seen is None:
                seen = simulate(plan_schedule(plan), costs, record=False).iteration_time  # simulate_plan's own steps
                self.seen[name, k, m, rp, key] = seen
                self.simulated += 1
            if seen < self.best_time:
                self.best_time, self.best_plan = seen, plan
            least = min(least, seen)
        if least < cap and not self.polishing:  # a new best: its neighbours first (BranchAndBound.polish)
            self.polishing = True
            self.polish(stages, rp, m, size, least)
            self.polishing = False
        return least

    def seed(self, split: list[tuple[int, int, int]], rp: int, m: int, size: int, always_polish: bool = False) -> None:
        """Simulate a split ((first, last, devices per pipeline) per stage), each stage on the next devices of
        ring_order; finish polishes it when it is the best plan so far, and with `always_polish` in any case."""
        stages = place_split(self.tables.costs, self.order, split, rp, size)
        if stages and all(holds_one(st) for st in stages):
            self.finish(stages, rp, m, size, cap=math.inf if always_polish else None)

    def polish(self, stages: list[Placed], rp: int, m: int, size: int, time: float) -> None:
        """Move the cuts of a plan, its stages on the same devices, while a move makes it faster (first_plans.moves,
        the first faster plan taken): a better incumbent before the searches."""
        while True:
            for trial in moves(self.tables.costs, stages, rp, size):
                got = self.finish(trial, rp, m, size, cap=time)
                if got < time:
                    stages, time = trial, got
                    break
            else:
                return

    def beaten(self, bound: float) -> bool:
        """Whether a bound from the suffix table (prefix sums) cannot beat the incumbent."""
        return bound >= self.best_time * (1 + SLACK)

    def grow(self, stages: list[Placed], free: tuple[int, ...], rp: int, m: int, size: int, used: tuple[int, ...]) -> None:
        """Place the next stage in every way, pruning by the bounds, recursing until all layers are placed."""
        self.nodes += 1
        if self.nodes > self.limit:
            raise Spent
        tables = self.tables
        table = tables.table((rp, m, size), free)
        layers = tables.layers
        prev = stages[-1] if stages else None
        start = prev.last + 1 if prev is not None else 0
        ready = prev.arrive + prev.fwd if prev is not None else 0.0  # no stage of layer start begins before
        k = len(free) // rp
        cap = self.best_time * (1 + SLACK)
        tries = []  # (bound, last layer, width) of every stage end the table leaves, the lowest bound first
        for r in table.widths:
            if r <= k:
                row = ready + table.stage_row(start, k, r)
                tries += [(float(row[e]), int(e), r) for e in (row < cap).nonzero()[0]]
        tries.sort()
        speeds = {d: self.request.cluster.devices[d].speed for d in free}
        # device tuple -> the shortest stage end at which the stage alone passed the best plan (more layers add)
        dead: dict[tuple[int, ...], int] = {}
        children = 0
        for bound, last, r in tries:
            if self.beaten(bound):
                break
            rest_layers = layers - 1 - last
            if rest_layers and k > r and hopeless(tables, self.best_time, stages, start, last, r, free, k, (rp, m, size)):
                continue
            for devices in canonical_list(free, r * rp, self.classes):
                if dead.get(devices, layers) <= last or not least_in_orbit(used + devices, self.group):
                    continue
                stage = tables.costs.place(start, last, devices, rp, size, prev)
                if compute_bound(stage, m) > self.best_time * (1 + MARGIN):
                    dead[devices] = last
                    continue
                if not holds_one(stage) or placed_bound(stage, prev, m) >= self.best_time:
                    continue
                if not rest_layers:
                    self.finish([*stages, stage], rp, m, size)
                    continue
                left = tuple(d for d in free if d not in devices)
                after = tables.table((rp, m, size), left) if tables.narrow else table
                if self.beaten(stage.arrive + stage.fwd + after.rest[len(left) // rp][last + 1]):
                    continue
                # the layers left, on the devices left: at least their least compute per sample, each sample
                per_sample = table.least_work(len(left) // rp, last + 1)
                fastest = max(speeds[d] for d in left)
                if self.beaten(stage.arrive + stage.fwd + m * size * per_sample / ((len(left) // rp) * fastest)):
                    continue
                placed = [*stages, stage]
                if filled(tables, self.best_time, placed, m, after, left, rp, size):
                    continue
                self.grow(placed, left, rp, m, size, used + devices)
                if self.fan < math.inf:  # a cut-short search: one device tuple per stage end, `fan` stage ends
                    children += 1
                    if children >= self.fan:
                        return
                    break

    def run(self) -> None:
        """Seed, then search every shape whose bound is below the incumbent, the lowest bound first."""
        request = self.request
        devices = request.cluster.num_devices
        bounds, tables = self.tables.bounds, self.tables
        candidates = [shape for shape in shapes(request) if bounds.fits(shape[0])]
        cheap = {shape: max(bounds.terms(shape[0], shape[2])) for shape in candidates}
        order = sorted(candidates, key=lambda shape: cheap[shape])  # stable: equal bounds keep rp up, m down
        for shape in order:  # straight pipelines over all devices, as many stages as devices allow
            self.seed(straight_split(tables.layers, devices, shape[0]), *shape)
        for shape in order[:SEEDED]:  # even pipelines of every stage width, cut where their compute is even
            for split in even_splits(bounds, devices, shape[0], shape[2]):
                self.seed(split, *shape, always_polish=True)
        everything = tuple(range(devices))
        seeded = set()
        for shape in order[:SEEDED]:  # the best splits of the shapes with the lowest bounds
            if not self.beaten(cheap[shape]):
                seeded.add(shape)
                self.seed(tables.table(shape, everything).split(), *shape, always_polish=True)
        for shape in order:  # a cut-short search of each shape: its first plans, for a better incumbent
            if self.beaten(cheap[shape]):
                break
            if not self.beaten(tables.table(shape, everything).rest[-1][0]):
                self.limit, self.fan = self.nodes + PROBED, FAN
                with contextlib.suppress(Spent):
                    self.grow([], everything, *shape, ())
                self.limit = self.fan = math.inf
        for shape in order:
            if self.beaten(cheap[shape]):
                break
            table = tables.table(shape, everything)
            if self.beaten(table.rest[table.n][0]):
                continue
            if shape not in seeded:
                self.seed(table.split(), *shape)
            self.shapes_searched += 1
            self.grow([], everything, *shape, ())
