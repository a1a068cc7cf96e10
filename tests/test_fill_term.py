"""Tests of the fill-and-drain term and the all-reduce rate of the all-plan bound: never above a chunked plan."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from bound_exact import exact_ms
from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.bound.fill_term import fill_term
from pipeplan.planner.bound.shape_bounds import ShapeBounds, lower_bound
from pipeplan.planner.request import PlanRequest
from pipeplan.sim.cost.link_model import ring_allreduce_ms
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.plan_sim import simulate_plan
from planner_instances import random_cluster, random_profile

GIB = float(1 << 30)


def chunked_plan(seed: int, layers: int, widths: list[int], chunks: int, rp: int, m: int, b: int) -> Plan:
    """An interleaved plan: len(widths) ranks of widths[k] devices per pipeline, `chunks` chunk-stages each, the
    layers cut at random points (chunk-stages of one layer allowed)."""
    rng = random.Random(seed)
    p = len(widths)
    cuts = sorted(rng.sample(range(1, layers), p * chunks - 1))
    bounds = [0, *cuts, layers]
    per_pipeline = sum(widths)
    groups, start = [], 0
    for w in widths:
        groups.append(tuple(t * per_pipeline + start + j for t in range(rp) for j in range(w)))
        start += w
    stages = tuple(Stage(bounds[i], bounds[i + 1] - 1, groups[i % p]) for i in range(p * chunks))
    return Plan(stages, rp, m, b, "interleaved-1f1b", chunks=chunks)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    layers=st.integers(6, 12),
    widths=st.sampled_from([[1, 1], [2, 1], [1, 1, 1], [1, 2], [2, 2], [1, 1, 1, 1]]),
    chunks=st.integers(2, 3),
    rp=st.integers(1, 2),
    rounds=st.integers(1, 3),
)
def test_all_plan_bound_holds_for_random_chunked_plans(
    seed: int, layers: int, widths: list[int], chunks: int, rp: int, rounds: int
) -> None:
    """Random interleaved plans (chunk-stages of one layer, wide ranks, two pipelines) on random profiles and
    clusters: every one that fits simulates to no less than the all-plan bound, whose fill term is included."""
    p = len(widths)
    if p * chunks > layers:
        return
    m, b = p * rounds, 2 * max(widths)
    devices = sum(widths) * rp
    request = PlanRequest(random_profile(seed, layers), random_cluster(seed, devices), rp * m * b)
    plan = chunked_plan(seed, layers, widths, chunks, rp, m, b)
    result = simulate_plan(plan, request.model, record=False)
    try:
        check_fits(plan, request.model, result)
    except PlanError:
        return  # the bound covers plans that fit
    assert lower_bound(request).ms <= result.iteration_time * (1 + 1e-12)


def test_fill_term_binds_when_few_microbatches_meet_many_devices() -> None:
    """Eight equal layers on eight devices, batch 8 of one-sample microbatches at most: the fill term is above the
    compute-and-path terms at the shapes that spread the work, and the bound stays below exact's optimum."""
    layer = LayerProfile("same", fwd_ms=4.0, bwd_ms=8.0, activation_bytes=1e3, param_bytes=1e3)
    profile = ModelProfile("eight", 8, (layer,) * 8, "random")
    devices = tuple(Device(i, "gpu", 16 * GIB, 1.0, 0) for i in range(8))
    links = tuple(tuple(0.0 if a == c else 1e12 for c in range(8)) for a in range(8))
    cluster = Cluster("eight", devices, links, tuple(tuple(0.0 for _ in range(8)) for _ in range(8)))
    request = PlanRequest(profile, cluster, 8, replication="none")
    bounds = ShapeBounds(request)
    assert fill_term(bounds, 1, 1) > max(bounds.terms(1, 1)) * 1.1
    assert lower_bound(request).term == "fill"


def test_fill_term_is_below_exact_on_random_instances() -> None:
    """On 6-layer instances over 4 devices the bound with the fill term stays below exact's optimum."""
    for seed in (1, 2, 7):
        request = PlanRequest(random_profile(seed, 6), random_cluster(seed, 4), 8)
        assert lower_bound(request).ms <= exact_ms(request) * (1 + 1e-12)


def test_allreduce_over_more_devices_than_a_node_pays_the_link_between_nodes() -> None:
    """Two nodes of two devices, 100 GB/s inside and 1 GB/s between: an all-reduce over three or four devices is
    bounded at the 1 GB/s link, the simulator's ring over both nodes takes exactly that, and over two at 100 GB/s."""
    devices = tuple(Device(i, "gpu", 16 * GIB, 1.0, i // 2) for i in range(4))
    rate = tuple(tuple(0.0 if a == c else (100e9 if a // 2 == c // 2 else 1e9) for c in range(4)) for a in range(4))
    latency = tuple(tuple(0.0 if a == c else 1e-2 for c in range(4)) for a in range(4))
    cluster = Cluster("two-nodes", devices, rate, latency)
    layer = LayerProfile("big", fwd_ms=1.0, bwd_ms=2.0, activation_bytes=1e3, param_bytes=1e9)
    request = PlanRequest(ModelProfile("big", 8, (layer,), "random"), cluster, 8)
    bounds = ShapeBounds(request)
    nbytes = bounds.params.copy()
    assert math.isclose(float(bounds.allreduce_ms(nbytes, 4)[0]), ring_allreduce_ms(cluster, (0, 1, 2, 3), 1e9), rel_tol=1e-12)
    assert float(bounds.allreduce_ms(nbytes, 2)[0]) < ring_allreduce_ms(cluster, (0, 1), 1e9) * (1 + 1e-12)
    plan = Plan((Stage(0, 0, (0, 1, 2, 3)),), 4, 1, 2, "1f1b")
    assert lower_bound(request).ms <= simulate_plan(plan, request.model, record=False).iteration_time * (1 + 1e-12)
