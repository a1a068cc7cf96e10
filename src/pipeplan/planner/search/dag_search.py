"""pipeplan's search over several layer orders of a DAG profile: the default order and the DP's (dag_orders)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

from pipeplan.core.dag import order_from_stages, reorder, stage_layers
from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan
from pipeplan.planner.phase_clock import phase
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.search.candidates import Progress
from pipeplan.planner.search.dag_orders import dag_orders
from pipeplan.planner.search.scoring import SharedMemos
from pipeplan.planner.time_budget import budget_spent
from pipeplan.sim.cost.link_model import link_arrays
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.plan_sim import simulate_plan

Search = Callable[..., PlanResult]
"""search(request, progress, beat_ms, seeds, memos=...): selection.search_order."""


def slowest_rate_bytes_per_ms(request: PlanRequest) -> float:
    """The slowest link between two devices of the request's cluster, in bytes per ms (0 with one device)."""
    if request.cluster.num_devices < 2:
        return 0.0
    rate = link_arrays(request.cluster)[0]
    slowest = rate.off_diagonal_min()
    return float(slowest if slowest > 0 else rate.off_diagonal_max()) / 1000.0


def placed(plan: Plan, order: tuple[int, ...], request: PlanRequest) -> Plan:
    """A chain plan found on `reorder(profile, order)` as a plan of the profile: its stages' layer sets, in the
    canonical order (core.dag.order_from_stages, as a plan file reads back)."""
    chain_sets = stage_layers(plan)
    sets = [[order[p] for p in layers] for layers in chain_sets]
    return dataclasses.replace(plan, layer_order=order_from_stages(request.profile, sets))


def plan_over_orders(request: PlanRequest, search: Search, progress: Progress | None = None) -> PlanResult:
    """The fastest of `search` on the profile's own order and on each DAG order, by simulated iteration time; the
    default order first, a later order only when strictly faster. A search on a DAG order skips the baselines'
    plans (the default search had them) and every (pipeline replicas, microbatch size) whose lower bound cannot
    beat the best plan so far.

    Once a time budget (planner.time_budget) has stopped a search, no further order is searched.

    The result's extra["layer_orders"] says which states the DP ran over, how many orders were searched, which
    won (None: the default), each order's iteration ms (None where its search found no plan, or proved that none
    of its candidates could beat the best so far: Candidates.unbeatable) and the seconds of: the default search,
    the DP, each further search.

    Raises:
        PlanError: no order gives a plan that fits (the default order's reason).
    """
    started = time.perf_counter()
    failure: PlanError | None = None
    best: PlanResult | None = None
    memos = SharedMemos()  # every order's search prices transfers and simulates timing classes alike
    try:
        best = search(request, progress, memos=memos)
    except PlanError as exc:
        failure = exc
    seconds = [time.perf_counter() - started]
    orders: list[tuple[int, ...]] = []
    states = "skipped: the time budget ran out"
    if not budget_spent():  # a search its time budget stopped is the last: no further order
        with phase("dag_orders"):
            orders, states = dag_orders(request.profile, slowest_rate_bytes_per_ms(request), request.cluster.num_devices)
    seconds.append(time.perf_counter() - started - seconds[0])
    times: list[float | None] = [None if best is None else best.iteration_time]
    won = None
    for i, order in enumerate(orders):
        if budget_spent():
            break
        lap = time.perf_counter()
        try:
            beat = math.inf if best is None else best.iteration_time
            reordered = dataclasses.replace(request, profile=reorder(request.profile, order))
            found = search(reordered, progress, beat, False, memos=memos)
        except PlanError:
            times.append(None)
            seconds.append(time.perf_counter() - lap)
            continue
        seconds.append(time.perf_counter() - lap)
        plan = placed(found.plan, order, request)
        with phase("final_simulation"):
            sim = simulate_plan(plan, request.model)
        times.append(sim.iteration_time)
        if best is None or sim.iteration_time < best.iteration_time:
            finalists = [placed(f, order, request) for f in found.extra.get("finalists", [])]
            memory = check_fits(plan, request.model, sim)
            costs = plan_costs(plan, request.model)
            best = PlanResult(plan, "pipeplan", sim, costs, memory, 0.0, {**found.extra, "finalists": finalists})
            won = i + 1
    if best is None:
        assert failure is not None
        raise failure
    extra = {
        **best.extra,
        "layer_orders": {"states": states, "orders": len(orders) + 1, "won": won, "ms": times, "seconds": seconds},
    }
    return dataclasses.replace(best, planning_seconds=time.perf_counter() - started, extra=extra)
