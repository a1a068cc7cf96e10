"""Tests of the one-stage-per-rank term: transfers into stages, nodes crossed, layer orders; never above a plan."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bound_exact import exact_ms
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.bound.over_orders import search_orders, stage_bound_over_orders
from pipeplan.planner.bound.shape_bounds import ShapeBounds, lower_bound
from pipeplan.planner.request import PlanRequest
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.plan_sim import simulate_plan
from planner_instances import random_cluster, random_profile

GIB = float(1 << 30)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), layers=st.integers(2, 5), batch=st.sampled_from([2, 4, 8]))
def test_stage_bound_never_exceeds_exact_on_two_node_clusters(seed: int, layers: int, batch: int) -> None:
    """Four devices in two nodes of two (the crossing DP runs): the one-stage-per-rank bound is at most exact's optimum."""
    request = PlanRequest(random_profile(seed, layers), random_cluster(seed, 4), batch)
    assert lower_bound(request, stages=True).ms <= exact_ms(request) * (1 + 1e-12)


def two_layers(cut_bytes: float, rate: float) -> PlanRequest:
    """Two layers that fit a device only one at a time, on two devices of one node joined at `rate` bytes/s."""
    big = LayerProfile("big", fwd_ms=1.0, bwd_ms=2.0, activation_bytes=cut_bytes, param_bytes=3 * GIB)
    profile = ModelProfile("two", 1, (big, big), "random")
    devices = tuple(Device(i, "gpu", 16 * GIB, 1.0, 0) for i in range(2))
    cluster = Cluster("pair", devices, ((0.0, rate), (rate, 0.0)), ((0.0, 1e-3), (1e-3, 0.0)))
    return PlanRequest(profile, cluster, 1, replication="none")


def test_stage_bound_counts_the_transfer_into_a_stage_both_ways() -> None:
    """Weights that force two stages and a 1 GB cut at 1 GB/s: the stage bound holds the activation and the
    gradient (2 s) and stays at most the simulated plan."""
    request = two_layers(1e9, 1e9)
    bound = lower_bound(request, stages=True)
    assert bound.term == "stages" and bound.ms >= 2 * 1000.0
    plan = Plan((Stage(0, 0, (0,)), Stage(1, 1, (1,))), 1, 1, 1, "1f1b")
    assert bound.ms <= simulate_plan(plan, request.model, record=False).iteration_time * (1 + 1e-12)


def test_crossing_nodes_raises_the_stage_bound() -> None:
    """Two nodes of two devices with a slow link between them and large cuts: using all four devices costs a
    crossing, so the stage term is above the same DP with the nodes ignored, and at most exact's optimum."""
    layer = LayerProfile("l", fwd_ms=4.0, bwd_ms=8.0, activation_bytes=256e6, param_bytes=64e6)
    profile = ModelProfile("four", 8, (layer,) * 4, "random")
    devices = tuple(Device(i, "gpu", 16 * GIB, 1.0, i // 2) for i in range(4))
    rate = tuple(tuple(0.0 if a == c else (100e9 if a // 2 == c // 2 else 1e9) for c in range(4)) for a in range(4))
    latency = tuple(tuple(0.0 if a == c else 1e-2 for c in range(4)) for a in range(4))
    request = PlanRequest(profile, Cluster("two-nodes", devices, rate, latency), 8, replication="none")
    bounds = ShapeBounds(request)
    crossing = bounds.stages(1, 1)
    bounds.node_size = 4  # as if the four devices were one node
    assert crossing > bounds.stages(1, 1) * 1.05
    assert lower_bound(request, stages=True).ms <= exact_ms(request) * (1 + 1e-12)


def test_stage_bound_holds_on_every_layer_order_pipeplan_searches() -> None:
    """A DAG profile whose search has further layer orders: a plan over each order simulates to no less than the
    stage bound over the orders (which is at most the bound on the profile's own order)."""
    request = PlanRequest(load_profile("dapple/amoeba-6-complicated"), load_cluster("v100-8x1"), 256)
    orders = search_orders(request)
    assert orders[0] is None and len(orders) > 1
    bound = stage_bound_over_orders(request)
    assert bound.ms <= lower_bound(request, stages=True).ms
    layers = request.profile.num_layers
    cuts = [0, layers // 4, layers // 2, 3 * layers // 4, layers]
    stages = tuple(Stage(cuts[i], cuts[i + 1] - 1, (2 * i, 2 * i + 1)) for i in range(4))
    for order in orders:
        plan = Plan(stages, 1, 16, 16, "1f1b", layer_order=order)
        assert bound.ms <= simulate_plan(plan, request.model, record=False).iteration_time * (1 + 1e-12)


def test_stage_bound_knows_a_stage_runs_at_its_slowest_device() -> None:
    """One device twice as fast as the other three: the stage term places at most one stage at speed 2 and comes
    within 10 % of exact's optimum (here it equals it; every stage at the fastest speed gave 19 % below)."""
    layer = LayerProfile("l", fwd_ms=2.0, bwd_ms=4.0, activation_bytes=1e3, param_bytes=1e3)
    devices = tuple(Device(i, "gpu", 16 * GIB, 2.0 if i == 0 else 1.0, 0) for i in range(4))
    links = tuple(tuple(0.0 if a == c else 1e12 for c in range(4)) for a in range(4))
    cluster = Cluster("mixed", devices, links, tuple(tuple(0.0 for _ in range(4)) for _ in range(4)))
    request = PlanRequest(ModelProfile("six", 8, (layer,) * 6, "random"), cluster, 16, replication="none")
    bound, best = lower_bound(request, stages=True).ms, exact_ms(request)
    assert 0.9 * best <= bound <= best * (1 + 1e-12)
