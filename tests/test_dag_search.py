"""Tests of planner.search.dag_search: pipeplan's search over the default order and the DAG orders."""

from __future__ import annotations

from pipeplan.core.dag import stage_layers
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.planners import PLANNERS
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.selection import search_order
from pipeplan.sim.plan_sim import simulate_plan

GB = 1e9


def branchy() -> ModelProfile:
    """in -> x (a 4 GB output read only by the last layer) and in -> y1 -> y2 (heavy, big weights) -> z(x, y2): every
    cut of the default order carries x's output; the antichain cut {in, y1} | {x, y2, z} carries a few bytes."""
    spec = [("in", 1.0, 1e3, 1e6, ()), ("x", 0.5, 4e9, 1e6, (0,)), ("y1", 10.0, 1e3, 3e9, (0,)),
            ("y2", 10.0, 1e3, 3e9, (2,)), ("z", 0.5, 1e3, 1e6, (1, 3))]  # fmt: skip
    layers = tuple(LayerProfile(name, ms, ms, act, params) for name, ms, act, params, _ in spec)
    return ModelProfile("branchy", 8, layers, layer_inputs=tuple(inputs for *_, inputs in spec))


def two_nodes() -> Cluster:
    """Two 80 GiB devices on two nodes joined by 1 GB/s."""
    devices = tuple(Device(i, "gpu", 80 * 2**30, 1.0, i) for i in range(2))
    return Cluster("two", devices, ((0.0, 1 * GB), (1 * GB, 0.0)), ((0.0, 1e-2), (1e-2, 0.0)))


def test_an_antichain_cut_wins_where_every_default_cut_carries_a_big_tensor() -> None:
    """On the branchy model over two nodes pipeplan's plan cuts at {in, y1} | {x, y2, z}, far faster than the best plan
    along the default order (exact's optimum, which only cuts prefixes); its time is the simulation of the plan it
    returns, and the record keeps the default search's time (that search already finds the cut: the faithful
    PipeDream baseline it is seeded with plans on the graph)."""
    request = PlanRequest(branchy(), two_nodes(), 8)
    before = search_order(request)
    after = PLANNERS["pipeplan"](request)
    prefix_best = PLANNERS["exact"](request)
    orders = after.extra["layer_orders"]
    assert orders["states"] == "all" and orders["ms"][0] == before.iteration_time
    assert prefix_best.plan.layer_order is None
    assert after.iteration_time < 0.75 * prefix_best.iteration_time
    assert [set(s) for s in stage_layers(after.plan)] == [{0, 2}, {1, 3, 4}]
    assert simulate_plan(after.plan, request.model).iteration_time == after.iteration_time


def test_without_a_dag_the_search_is_the_default_one() -> None:
    """A chain profile is planned by the default search alone: same plan and time, one order."""
    chain = ModelProfile("chain", 8, tuple(LayerProfile(f"l{i}", 1.0 + i, 2.0, 1e6, 1e6) for i in range(4)))
    request = PlanRequest(chain, two_nodes(), 8)
    after = PLANNERS["pipeplan"](request)
    assert after.plan == search_order(request).plan and after.extra["layer_orders"]["orders"] == 1
