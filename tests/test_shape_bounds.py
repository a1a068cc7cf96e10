"""Tests of the proven lower bound: never above exact's optimum, never above any simulated plan, tight where it must be."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from bound_exact import exact_ms
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.bound.shape_bounds import lower_bound
from pipeplan.planner.plan_space import shapes
from pipeplan.planner.planners import PLANNERS
from pipeplan.planner.request import PlanRequest
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.plan_sim import simulate_plan
from planner_instances import random_cluster, random_profile

GIB = float(1 << 30)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    layers=st.integers(1, 5),
    devices=st.integers(1, 3),
    batch=st.sampled_from([1, 2, 4, 6, 8]),
)
def test_bound_never_exceeds_the_exact_optimum(seed: int, layers: int, devices: int, batch: int) -> None:
    """On random small instances both bounds (all plans; one stage per rank) are at most exact's optimum."""
    request = PlanRequest(random_profile(seed, layers), random_cluster(seed, devices), batch)
    best = exact_ms(request)
    assert lower_bound(request).ms <= best * (1 + 1e-12)
    assert lower_bound(request, stages=True).ms <= best * (1 + 1e-12)


def test_stage_bound_is_close_to_exact_on_random_instances() -> None:
    """8 layers on 4 devices, batch 16: the one-stage-per-rank bound is within 1.3x of exact (it is not a toy)."""
    for seed in (3, 4, 5):
        request = PlanRequest(random_profile(seed, 8), random_cluster(seed, 4), 16)
        best = exact_ms(request)
        bound = lower_bound(request, stages=True).ms
        assert bound <= best * (1 + 1e-12)
        assert best / bound < 1.3, (seed, best, bound)


def test_bound_holds_for_interleaved_and_pipeplan_plans() -> None:
    """An interleaved plan and pipeplan's own plans on shared profiles simulate to no less than the all-plan bound."""
    request = PlanRequest(load_profile("pipedream/alexnet"), load_cluster("pcie-4x4-10g"), 256)
    bound = lower_bound(request).ms
    stages = (*(Stage(2 * c, 2 * c + 1, (c % 4,)) for c in range(7)), Stage(14, 22, (3,)))
    chunked = Plan(stages, 1, 16, 16, "interleaved-1f1b", chunks=2)
    assert bound <= simulate_plan(chunked, request.model, record=False).iteration_time
    for profile, cluster in (("dapple/bert-24", "v100-8x2-25g"), ("pipedream/gnmt", "hetero-a100-v100")):
        request = PlanRequest(load_profile(profile), load_cluster(cluster), 256)
        assert lower_bound(request).ms <= PLANNERS["pipeplan"](request).iteration_time * (1 + 1e-12)


def test_bound_is_tight_on_one_device() -> None:
    """One layer on one device, one sample: the plan's time is forward + backward + optimizer step, as the bound says."""
    layer = LayerProfile("only", fwd_ms=2.0, bwd_ms=3.0, activation_bytes=1e6, param_bytes=1e6)
    request = PlanRequest(
        ModelProfile("one", 1, (layer,), "random"), Cluster("one", (Device(0, "gpu", 16 * GIB, 1.0, 0),), ((0.0,),), ((0.0,),)), 1
    )
    found = lower_bound(request)
    assert (found.pipelines, found.microbatch_size) == (1, 1)
    assert math.isclose(found.ms, exact_ms(request), rel_tol=1e-12)


def test_bound_is_infinite_when_no_plan_holds_the_weights() -> None:
    """Weights beyond every device's memory: no shape counts and the bound is inf (no plan exists)."""
    layer = LayerProfile("huge", fwd_ms=1.0, bwd_ms=1.0, activation_bytes=1.0, param_bytes=8 * GIB)
    devices = (Device(0, "gpu", 16 * GIB, 1.0, 0), Device(1, "gpu", 16 * GIB, 1.0, 0))
    cluster = Cluster("small", devices, ((0.0, 1e10), (1e10, 0.0)), ((0.0, 1e-3), (1e-3, 0.0)))
    request = PlanRequest(ModelProfile("huge", 1, (layer,), "random"), cluster, 2)
    assert lower_bound(request).ms == math.inf


def test_shapes_follow_the_replication_rule_and_the_microbatch_size() -> None:
    """Shapes are (pipeline replicas, microbatch size) with rp * b | G; `none` keeps one pipeline; a size is kept."""
    request = PlanRequest(random_profile(0, 3), random_cluster(0, 4), 8)
    assert (4, 2) in shapes(request) and (8, 1) not in shapes(request)  # at most one pipeline per device
    assert {rp for rp, _ in shapes(PlanRequest(request.profile, request.cluster, 8, replication="none"))} == {1}
    assert {b for _, b in shapes(PlanRequest(request.profile, request.cluster, 8, microbatch_size=2))} == {2}
